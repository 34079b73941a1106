"""The service's own Prometheus metrics, scraped before and after a load window and read as server-side signals.

Three exporters are understood, by the names their documentation gives:

- this package's server (``/metrics`` beside the endpoint, found by itself): ``tuning_model_busy_seconds_total``
  (model busy), ``tuning_batch_size`` (mean batch), ``tuning_request_queue_duration_seconds`` and
  ``tuning_request_inference_duration_seconds`` (mean queue wait and inference per request),
  ``tuning_queue_depth``;
- text-embeddings-inference: ``te_queue_size``, ``te_batch_next_size`` (mean batch),
  ``te_request_queue_duration`` and ``te_request_inference_duration`` (histograms in seconds: mean queue
  wait and inference time per request);
- Triton / KServe (its own port, 8002 by default: give ``--metrics-url``): ``nv_inference_queue_duration_us``
  and ``nv_inference_compute_infer_duration_us`` (cumulative microseconds over requests), the mean batch as
  ``nv_inference_count / nv_inference_exec_count``, ``nv_gpu_utilization`` (0-1).

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

# signal -> (how it is derived, the metrics it needs), per exporter
SIGNALS = {
    "tuning": {"model_busy": "tuning_model_busy_seconds", "mean_batch": "tuning_batch_size",
               "queue_ms": "tuning_request_queue_duration_seconds",
               "inference_ms": "tuning_request_inference_duration_seconds", "queue_depth": "tuning_queue_depth"},
    "tei": {"queue_depth": "te_queue_size", "mean_batch": "te_batch_next_size",
            "queue_ms": "te_request_queue_duration", "inference_ms": "te_request_inference_duration"},
    "triton": {"queue_ms": "nv_inference_queue_duration_us", "inference_ms": "nv_inference_compute_infer_duration_us",
               "request_ms": "nv_inference_request_duration_us",
               "mean_batch": "nv_inference_count / nv_inference_exec_count", "gpu_util": "nv_gpu_utilization"},
}
_PREFIX = {"tuning": "tuning_", "tei": "te_", "triton": "nv_"}


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
    for name, prefix in _PREFIX.items():
        if any(k.startswith(prefix) for k in samples):
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


def derive(before: Samples, after: Samples, window_s: float, url: str = "") -> ServerMetrics:
    """The signals of the window between two scrapes ``window_s`` apart."""
    exporter = exporter_of(after)
    out = ServerMetrics(url, exporter)
    if exporter is None:
        out.reason = "no metrics of a known exporter (tuning_*, te_*, nv_*)"
        return out
    got: dict[str, float | None] = {}
    if exporter == "tuning":
        busy = _delta(before, after, "tuning_model_busy_seconds")
        got["model_busy"] = busy / window_s if busy is not None and window_s > 0 else None
        got["mean_batch"] = _mean(before, after, "tuning_batch_size")
        got["queue_ms"] = _mean(before, after, "tuning_request_queue_duration_seconds", 1000.0)
        got["inference_ms"] = _mean(before, after, "tuning_request_inference_duration_seconds", 1000.0)
        got["queue_depth"] = after.get("tuning_queue_depth")
    elif exporter == "tei":
        got["queue_depth"] = after.get("te_queue_size")
        got["mean_batch"] = _mean(before, after, "te_batch_next_size")
        got["queue_ms"] = _mean(before, after, "te_request_queue_duration", 1000.0)
        got["inference_ms"] = _mean(before, after, "te_request_inference_duration", 1000.0)
    else:  # triton: cumulative microseconds over the requests that succeeded
        requests = _delta(before, after, "nv_inference_request_success")
        queue = _delta(before, after, "nv_inference_queue_duration_us")
        compute = _delta(before, after, "nv_inference_compute_infer_duration_us")
        got["queue_ms"] = queue / requests / 1000.0 if queue is not None and requests else None
        got["inference_ms"] = compute / requests / 1000.0 if compute is not None and requests else None
        whole = _delta(before, after, "nv_inference_request_duration_us")  # queue, input, compute, output
        got["request_ms"] = whole / requests / 1000.0 if whole is not None and requests else None
        inferences, executions = _delta(before, after, "nv_inference_count"), _delta(before, after, "nv_inference_exec_count")
        got["mean_batch"] = inferences / executions if inferences is not None and executions else None
        gpu = [v for k, v in after.items() if k == "nv_gpu_utilization"]
        got["gpu_util"] = gpu[0] if gpu else None
    for signal, value in got.items():
        if value is None or not math.isfinite(value):
            out.lacked.append(signal)
        else:
            out.values[signal] = float(value)
            out.sources[signal] = SIGNALS[exporter][signal]
    return out


class MetricsProbe:
    """A ``busy_probe`` for :func:`tuning.load.generator.run_load` that scrapes ``url`` whenever it is called
    (the load test calls it as its measured window opens and as it closes) and returns this package's model
    busy seconds (None for other exporters); :meth:`result` reads the window between the first and the last
    scrape."""

    def __init__(self, url: str, timeout_s: float = 5.0, background: bool = False, model: str | None = None):
        self.url, self.timeout_s, self.background, self.model = url, timeout_s, background, model
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
        return derive(before, after, t1 - t0, self.url)
