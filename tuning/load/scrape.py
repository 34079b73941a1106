"""The service's own Prometheus metrics, scraped before and after a load window and read as server-side signals.

These exporters are understood (:data:`EXPORTERS`), by the names their documentation or source gives, and any
other by ``--metrics-map`` (:func:`parse_metrics_map`):

- this package's server (``/metrics`` beside the endpoint, found by itself): ``tuning_model_busy_seconds_total``
  (model busy), ``tuning_batch_size`` (mean batch), ``tuning_request_queue_duration_seconds`` and
  ``tuning_request_inference_duration_seconds`` (mean queue wait and inference per request),
  ``tuning_queue_depth``;
- text-embeddings-inference: ``te_queue_size``, ``te_batch_next_size`` (mean batch),
  ``te_request_queue_duration`` and ``te_request_inference_duration`` (histograms in seconds: mean queue
  wait and inference time per request);
- Triton / KServe (its own port, 8002 by default: give ``--metrics-url``): ``nv_inference_queue_duration_us``
  and ``nv_inference_compute_infer_duration_us`` (cumulative microseconds over requests), the mean batch as
  ``nv_inference_count / nv_inference_exec_count``, ``nv_gpu_utilization`` (0-1);
- Ray Serve: ``ray_serve_http_request_latency_ms`` (the proxy's whole request) less
  ``ray_serve_deployment_processing_latency_ms`` (the replica's) as the time before the replica,
  ``ray_serve_actual_batch_size``, ``ray_serve_deployment_queued_queries``;
- Seldon MLServer (its own metrics port, 8082 by default): ``rest_server_request_duration_seconds`` (its
  starlette exporter's name; its documentation's table says ``requests_duration_seconds``) and
  ``batch_request_queue``.

Counters and histograms are read as differences over the window (a scrape before, one after), gauges at the
end. Every derived signal names the metrics it came from; the ones an exporter lacks are listed, so that the
diagnosis can say what it could not see. Parsing is prometheus-client's own text parser.
"""

from __future__ import annotations

import math
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

Samples = dict[str, float]  # metric sample name (``_total`` stripped) -> the sum over its label sets


@dataclass(frozen=True)
class Read:
    """How one signal is read from an exporter's samples over a window: ``mean`` (a histogram's, or a
    sum/count pair's, mean: of ``names[0]``, then less the mean of ``names[1]`` where given), ``gauge``
    (its value at the end; a histogram's mean where the exporter made it one), ``per_request`` (a counter's
    growth per growth of ``names[1]``, the requests), ``ratio`` (the same, for a mean batch), ``busy``
    (seconds of a counter per second of the window); times ``scale``."""

    kind: str
    names: tuple[str, ...]
    scale: float = 1.0

    @property
    def source(self) -> str:
        sep = {"mean": " - ", "per_request": " / ", "ratio": " / "}.get(self.kind, ", ")
        return sep.join(self.names)


@dataclass(frozen=True)
class Exporter:
    """A server family's metrics: the name prefixes that identify it and how each signal is read."""

    markers: tuple[str, ...]
    reads: dict[str, Read]


# metric names from each server's documentation or source (docs/your-service.md says which were tried)
EXPORTERS = {
    "tuning": Exporter(("tuning_",), {
        "model_busy": Read("busy", ("tuning_model_busy_seconds",)),
        "mean_batch": Read("mean", ("tuning_batch_size",)),
        "queue_ms": Read("mean", ("tuning_request_queue_duration_seconds",), 1000.0),
        "inference_ms": Read("mean", ("tuning_request_inference_duration_seconds",), 1000.0),
        "queue_depth": Read("gauge", ("tuning_queue_depth",))}),
    "tei": Exporter(("te_",), {
        "queue_depth": Read("gauge", ("te_queue_size",)),
        "mean_batch": Read("mean", ("te_batch_next_size",)),
        "queue_ms": Read("mean", ("te_request_queue_duration",), 1000.0),
        "inference_ms": Read("mean", ("te_request_inference_duration",), 1000.0)}),
    "triton": Exporter(("nv_",), {  # cumulative microseconds over the requests that succeeded
        "queue_ms": Read("per_request", ("nv_inference_queue_duration_us", "nv_inference_request_success"), 1e-3),
        "inference_ms": Read("per_request", ("nv_inference_compute_infer_duration_us",
                                             "nv_inference_request_success"), 1e-3),
        "request_ms": Read("per_request", ("nv_inference_request_duration_us", "nv_inference_request_success"),
                           1e-3),  # queue, input, compute, output
        "mean_batch": Read("ratio", ("nv_inference_count", "nv_inference_exec_count")),
        "gpu_util": Read("gauge", ("nv_gpu_utilization",))}),
    # Ray Serve: the proxy's whole request less the replica's processing is the time before the replica (proxy,
    # router and the replica's queue); the replica's processing holds @serve.batch's wait
    "ray": Exporter(("ray_serve_",), {
        "request_ms": Read("mean", ("ray_serve_http_request_latency_ms",)),
        "inference_ms": Read("mean", ("ray_serve_deployment_processing_latency_ms",)),
        "queue_ms": Read("mean", ("ray_serve_http_request_latency_ms", "ray_serve_deployment_processing_latency_ms")),
        "mean_batch": Read("mean", ("ray_serve_actual_batch_size",)),
        "queue_depth": Read("gauge", ("ray_serve_deployment_queued_queries",))}),
    # Seldon MLServer: its REST server's request time and its adaptive batching queue (it exports no compute time)
    "mlserver": Exporter(("model_infer_request_", "batch_request_queue", "parallel_request_queue"), {
        "request_ms": Read("mean", ("rest_server_request_duration_seconds",), 1000.0),
        "queue_depth": Read("gauge", ("batch_request_queue",))}),
}
SIGNALS = {name: {signal: r.source for signal, r in e.reads.items()} for name, e in EXPORTERS.items()}
MAP_KEYS = {"queue": "queue_ms", "compute": "inference_ms", "request": "request_ms", "batch": "mean_batch"}
UNITS = {"s": 1000.0, "ms": 1.0, "us": 1e-3}
_SUFFIX_UNITS = (("_seconds", "s"), ("_ms", "ms"), ("_milliseconds", "ms"), ("_us", "us"), ("_microseconds", "us"))


def parse_metrics_map(text: str) -> dict[str, Read]:
    """``--metrics-map queue=NAME,compute=NAME,request=NAME,batch=NAME``: any Prometheus histogram (or sum/count
    pair) read as the server's mean queue wait, compute, whole request, or batch size per request. A time's
    unit comes from the name's suffix (``_seconds``, ``_ms``, ``_us``) or ``NAME:s|ms|us``."""
    reads: dict[str, Read] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        key, eq, name = part.partition("=")
        key, name = key.strip(), name.strip()
        if not eq or key not in MAP_KEYS or not name:
            raise ValueError(f"--metrics-map {text!r}: {part!r} is not KEY=NAME with KEY one of "
                             f"{', '.join(MAP_KEYS)} (e.g. queue=my_queue_seconds,compute=my_infer_seconds)")
        base, colon, unit = name.rpartition(":")
        if colon and unit in UNITS:  # NAME:unit; a metric name may hold colons of its own (job:wait_seconds)
            name = base
        else:
            unit = ""
        if key == "batch":
            reads[MAP_KEYS[key]] = Read("mean", (name,))
            continue
        unit = unit or next((u for suffix, u in _SUFFIX_UNITS if name.endswith(suffix)), "")
        if unit not in UNITS:
            raise ValueError(f"--metrics-map: the unit of {name!r} is not known from its name: give it as "
                             f"{key}={name}:s (or :ms, :us)")
        reads[MAP_KEYS[key]] = Read("mean", (name,), UNITS[unit])
    if not reads:
        raise ValueError(f"--metrics-map {text!r}: give at least one KEY=NAME ({', '.join(MAP_KEYS)})")
    return reads


def metrics_url(url: str, given: str | None = None) -> str:
    """``given``, or ``/metrics`` on the endpoint's host and port (where this package's server and TEI serve them)."""
    if given:
        return given
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/metrics"


def parse(text: str, model: str | None = None) -> Samples:
    """Prometheus text exposition as sample name -> value summed over label sets (``_total`` stripped, so a
    counter reads the same whether or not its exporter declared its type). ``model``: only the samples of that
    model where a sample names one (Triton labels each with ``model=``: an ensemble's steps, or the other models
    of the server, would otherwise be summed into the one under test)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue
            if model is not None and s.labels.get("model", model) != model:
                continue
            name = s.name[:-6] if s.name.endswith("_total") else s.name
            if isinstance(s.value, (int, float)) and math.isfinite(s.value):
                out[name] = out.get(name, 0.0) + float(s.value)
    return out


def scrape(url: str, timeout_s: float = 5.0, model: str | None = None) -> tuple[Samples | None, str | None]:
    """One scrape: the samples (of ``model`` only, where samples name theirs), or None and why not
    (unreachable, not Prometheus text)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            text = resp.read().decode(errors="replace")
    except (OSError, ValueError) as e:
        return None, f"{url}: {e}"
    try:
        return parse(text, model), None
    except (ValueError, TypeError, IndexError) as e:
        return None, f"{url}: not Prometheus text ({e})"


@dataclass
class ServerMetrics:
    """Server-side signals over one window: ``values`` (model_busy 0-1, mean_batch, queue_ms, inference_ms,
    queue_depth, gpu_util 0-1; only those found), ``sources`` (signal -> metrics), ``exporter`` (tuning, tei,
    triton or None), ``lacked`` (signals that exporter documents but this scrape did not have), ``reason``
    when nothing could be scraped."""

    url: str
    exporter: str | None = None
    values: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    lacked: list[str] = field(default_factory=list)
    reason: str | None = None

    def summary(self) -> dict[str, Any]:
        return {"url": self.url, "exporter": self.exporter, "values": {k: round(v, 4) for k, v in self.values.items()},
                "sources": self.sources, "lacked": self.lacked, "reason": self.reason}


def exporter_of(samples: Samples) -> str | None:
    for name, exporter in EXPORTERS.items():
        if any(k.startswith(exporter.markers) for k in samples):
            return name
    return None


def _delta(before: Samples, after: Samples, name: str) -> float | None:
    if name not in after:
        return None
    return after[name] - before.get(name, 0.0)


def _mean(before: Samples, after: Samples, name: str, scale: float = 1.0) -> float | None:
    """A histogram's (or a sum/count pair's) mean over the window."""
    total, count = _delta(before, after, f"{name}_sum"), _delta(before, after, f"{name}_count")
    if total is None or not count:
        return None
    return total / count * scale


def _read(r: Read, before: Samples, after: Samples, window_s: float) -> float | None:
    if r.kind == "mean":
        first = _mean(before, after, r.names[0], r.scale)
        if len(r.names) == 1 or first is None:
            return first
        less = _mean(before, after, r.names[1], r.scale)
        return None if less is None else first - less
    if r.kind == "gauge":
        mean = _mean(before, after, r.names[0], r.scale)
        return mean if mean is not None else (after[r.names[0]] * r.scale if r.names[0] in after else None)
    if r.kind in ("per_request", "ratio"):
        top, bottom = _delta(before, after, r.names[0]), _delta(before, after, r.names[1])
        return top / bottom * r.scale if top is not None and bottom else None
    if r.kind == "busy":
        busy = _delta(before, after, r.names[0])
        return busy / window_s * r.scale if busy is not None and window_s > 0 else None
    raise ValueError(f"Read.kind {r.kind!r}")


def derive(before: Samples, after: Samples, window_s: float, url: str = "",
           mapping: dict[str, Read] | None = None) -> ServerMetrics:
    """The signals of the window between two scrapes ``window_s`` apart: by the exporter the samples are
    from, and by ``mapping`` (:func:`parse_metrics_map`), which adds signals or replaces the exporter's."""
    known = exporter_of(after)
    out = ServerMetrics(url, f"{known} + mapped" if known and mapping else "mapped" if mapping else known)
    if out.exporter is None:
        out.reason = (f"no metrics of a known exporter ({', '.join(EXPORTERS)}): name yours with --metrics-map "
                      "queue=NAME,compute=NAME")
        return out
    reads = {**(EXPORTERS[known].reads if known else {}), **(mapping or {})}
    for signal, r in reads.items():
        value = _read(r, before, after, window_s)
        if signal.endswith("_ms") and value is not None and value < 0:
            value = None  # a time less another that came out negative: the two do not cover the same requests
        if value is None or not math.isfinite(value):
            out.lacked.append(signal)
        else:
            out.values[signal] = float(value)
            out.sources[signal] = r.source
    return out


def mapping_of(api: Any) -> dict[str, Read] | None:
    """The ``--metrics-map`` an :class:`~tuning.load.apis.Api` carries, parsed (None: by the exporter)."""
    text = getattr(api, "metrics_map", None)
    return parse_metrics_map(text) if text else None


class MetricsProbe:
    """A ``busy_probe`` for :func:`tuning.load.generator.run_load` that scrapes ``url`` whenever it is called
    (the load test calls it as its measured window opens and as it closes) and returns this package's model
    busy seconds (None for other exporters); :meth:`result` reads the window between the first and the last
    scrape."""

    def __init__(self, url: str, timeout_s: float = 5.0, background: bool = False, model: str | None = None,
                 mapping: dict[str, Read] | None = None):
        self.url, self.timeout_s, self.background, self.model = url, timeout_s, background, model
        self.mapping = mapping
        self.scrapes: list[tuple[float, Samples | None]] = []
        self.reason: str | None = None
        self._threads: list[Any] = []

    def __call__(self) -> float | None:
        """One scrape now; ``background``: on a thread of its own, returning None at once (the load loop calls
        this as its window opens and closes, and a slow or dead metrics endpoint must not stall the requests in
        flight: the server's busy share then comes from :meth:`result`)."""
        if not self.background:
            return self._scrape()
        import threading

        thread = threading.Thread(target=self._scrape, name="metrics-scrape", daemon=True)
        thread.start()
        self._threads.append(thread)
        return None

    def _scrape(self) -> float | None:
        import time

        samples, reason = scrape(self.url, self.timeout_s, self.model)
        self.scrapes.append((time.monotonic(), samples))
        if reason:
            self.reason = reason
        return samples.get("tuning_model_busy_seconds") if samples else None

    def result(self) -> ServerMetrics:
        for thread in self._threads:
            thread.join(self.timeout_s + 1.0)
        ok = sorted(((t, s) for t, s in self.scrapes if s is not None), key=lambda ts: ts[0])
        if len(ok) < 2:
            return ServerMetrics(self.url, reason=self.reason or "fewer than two scrapes (the window never opened)")
        (t0, before), (t1, after) = ok[0], ok[-1]
        return derive(before, after, t1 - t0, self.url, self.mapping)
