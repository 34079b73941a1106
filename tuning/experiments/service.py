"""``investigate`` on the user's own service: ``--url`` (running) or ``--cmd`` (started per configuration).

Both run the experiment engine of ``docs/deciding.md`` through :func:`tuning.experiments.tune.run_tune`, then
watch the baseline and the recommended configuration under load (:func:`tuning.experiments.watch.watch`:
per-thread CPU and memory when the process is on this machine, the server's own metrics, NVML) and split
their latency into stages. What differs is what a configuration is:

- ``--url``: the service runs and cannot be restarted, so the only levers are the client's. Texts per request
  (``client_batch``) is one for the APIs that carry several (TEI, OpenAI, KServe, a ``{texts}`` body): the
  engine compares configurations in **texts per second**, and the target check offers texts per second too.
  The client's concurrency is not a factor: in an open loop a client pool smaller than rate x latency only
  queues requests on the client, which the engine (rightly) reads as the client's lag, not the server's
  capacity. The capacity at the target is then the service's own, as it runs.
- ``--cmd``: each configuration's server is started from the command line (``--space`` names its knobs, or a
  ``--server`` recipe maps them to flags), as ``tune`` does.

The files are those of the embedded investigation: ``summary.json`` (rewritten after every window; ``--resume``
replays its windows) and ``report.html``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tuning.base.format import rounded
from tuning.experiments.engine import ConfigError
from tuning.experiments.trial import Trial
from tuning.experiments.tune import HttpMeasure, SwitchingMeasure, TuneResult, TuneSettings, fill, label, run_tune

SUMMARY = "summary.json"
REPORT = "report.html"
CLIENT_BATCHES = ("1", "4", "16")  # texts per request tried on a running service, after the client's own (the baseline)
DIAGNOSE_S = 5.0  # measured seconds of load under the watch, per configuration diagnosed
BATCHABLE = ("tei", "openai", "kserve")  # APIs whose requests carry a list of texts (Api names triton kserve)


class ServiceError(ValueError):
    """A bad setting of ``investigate --url`` / ``--cmd``: the message names the value and the fix."""


def client_space(api: Any, given: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """The levers a client controls on a running service: ``--space client_batch=...`` when given (the only
    name allowed), else, for an API that carries several texts, the client's texts per request today
    (``--client-batch``, the baseline) and then :data:`CLIENT_BATCHES`; else none (the target check alone)."""
    given = dict(given or {})
    unknown = [name for name in given if name != "client_batch"]
    if unknown:
        raise ServiceError(f"--space {unknown[0]}=...: a running service (--url) has one client lever, "
                           "client_batch (texts per request); its own knobs need --cmd to restart it per value")
    if "client_batch" in given:
        values = given["client_batch"]
        bad = [v for v in values if not (v.isdigit() and int(v) >= 1)]
        if bad:
            raise ServiceError(f"--space client_batch={','.join(values)}: {bad[0]!r} is not a whole number >= 1")
        if not batchable(api) and values != ["1"]:
            raise ServiceError(f"--space client_batch: --api {api.name} sends one text per request; use --api tei, "
                               "openai, kserve or a --body with \"{texts}\"")
        return {"client_batch": values}
    if not batchable(api):
        return {}
    today = str(api.client_batch)
    return {"client_batch": [today, *(v for v in CLIENT_BATCHES if v != today)]}


def batchable(api: Any) -> bool:
    return api.name in BATCHABLE or (api.name == "custom" and getattr(api, "_has_texts", False))


def per_text(trial: Trial, texts: int) -> Trial:
    """``trial`` with its rates in texts per second (``texts`` per request): configurations that send
    different numbers of texts per request compare on the work done, not on requests."""
    if texts == 1:
        return trial
    scale = lambda x: x * texts if x is not None else None  # noqa: E731
    return dataclasses.replace(trial, qps=trial.qps * texts, rate=scale(trial.rate),
                               offered_rate=trial.offered_rate * texts)


class ClientMeasure:
    """``measure(values, *, rate=None, seed=None, window_s=None, warmup_s=None) -> Trial`` on a running service,
    where ``values`` holds the client's levers (``client_batch``): the API with that many texts per request, its
    bodies encoded once; ``rate`` and the result in texts per second."""

    def __init__(self, url: str, encode: Callable[[Any], list[Any]], api: Any, settings: TuneSettings,
                 metrics_url: str | None = None):
        self.url, self.encode, self.api, self.settings, self.metrics_url = url, encode, api, settings, metrics_url
        self._measures: dict[int, HttpMeasure] = {}

    def texts(self, values: dict[str, str]) -> int:
        return int(values.get("client_batch", self.api.client_batch))

    def http(self, values: dict[str, str]) -> HttpMeasure:
        n = self.texts(values)
        if n not in self._measures:
            api = dataclasses.replace(self.api, client_batch=n)
            self._measures[n] = HttpMeasure(self.url, self.encode(api), api, self.settings, self.metrics_url)
        return self._measures[n]

    def __call__(self, values: dict[str, str], *, rate: float | None = None, record: bool = False,
                 seed: int | None = None, window_s: float | None = None, warmup_s: float | None = None) -> Trial:
        n = self.texts(values)
        if rate is not None:
            rate = rate / n
        if rate is not None and warmup_s is None:  # a target window (a hold's length is as asked) holds the
            # engine's number of outcomes: requests, not texts
            first = self.settings.engine.target_window_s(rate)
            # a window shorter than a first look (the ceiling's) holds as many requests as the engine asked texts
            window_s = first if window_s is None or window_s >= first else min(window_s * n, first)
        trial = self.http(values)(values, rate=rate, seed=seed, window_s=window_s, warmup_s=warmup_s)
        if trial.ok == 0 and rate is None:
            raise ConfigError(f"no ok answer with {n} text(s) per request (first reason: {trial.first_error})")
        return per_text(trial, n)


def stage_split(load: Any, server_metrics: Any = None) -> dict[str, Any]:
    """Where an ok request's time went, in mean milliseconds: ``client`` (waiting in the client before it was
    sent), ``server`` (the server's own queue wait and compute: from its answers' timing headers, or its
    metrics), and ``network`` (the rest: connection, HTTP framing, the server's front), with ``source``
    saying where the server's part came from (None: the server exposes no timings, so network holds it too)."""
    ok = [(r, t) for r, t in zip(load.responses, load.timings or [None] * len(load.responses)) if r.outcome == "ok"]
    if not ok:
        return {"total_ms": None, "client_ms": None, "network_ms": None, "server_ms": None, "source": None}
    total = sum((t[2] - t[0]) * 1000 if t else r.latency_ms for r, t in ok) / len(ok)
    client = sum((t[1] - t[0]) * 1000 for _, t in ok if t) / len(ok)
    queue, compute, whole, source = _server_parts(ok, server_metrics)
    server = whole if whole is not None else None if queue is None and compute is None else (queue or 0) + (compute or 0)
    network = total - client - (server or 0.0)
    return {"total_ms": rounded(total), "client_ms": rounded(client), "network_ms": rounded(max(network, 0.0)),
            "server_ms": rounded(server), "server_queue_ms": rounded(queue), "server_compute_ms": rounded(compute),
            "source": source}


def _server_parts(ok: Sequence[Any], metrics: Any) -> tuple[float | None, float | None, float | None, str | None]:
    """(queue, compute, the server's whole time where it reports one, source): the answers' own timings when
    they carry them (TEI headers, this package's server: a ready batch's wait for the model is a queue too),
    else the server's metrics over the window (Triton's request duration holds its input and output copies
    beside its queue and compute)."""
    queue = [r.queue_wait_ms + r.wait_for_model_ms for r, _ in ok]
    work = [sum(getattr(r, f"{s}_ms") for s in ("read", "preprocess", "copy", "inference", "postprocess"))
            for r, _ in ok]
    if any(q > 0 for q in queue) or any(w > 0 for w in work):
        return sum(queue) / len(queue), sum(work) / len(work), None, "answers"
    values = getattr(metrics, "values", None) or {}
    if "queue_ms" in values or "inference_ms" in values:
        return values.get("queue_ms"), values.get("inference_ms"), values.get("request_ms"), f"metrics ({metrics.exporter})"
    return None, None, None, None


@dataclass
class ServiceInvestigation:
    """One ``investigate --url`` or ``--cmd`` run: the engine's decision (``tune``), the watch of the baseline
    and of the recommended configuration, and where the files are."""

    mode: str  # url | cmd
    out: Path | None
    tune: TuneResult
    server: str | None = None  # the --server recipe's name
    diagnosed: dict[str, dict[str, Any]] = field(default_factory=dict)  # role -> watch summary + stages
    wall_s: float = math.nan
    metrics_url: str | None = None

    @property
    def interrupted(self) -> bool:
        return self.tune.interrupted

    @property
    def target_met(self) -> bool:
        return self.tune.target_met

    @property
    def capacity(self) -> float | None:
        return self.tune.capacity

    def summary(self) -> dict[str, Any]:
        s = self.tune.summary()
        best = self.tune.best
        return {**s, "command": "investigate",
                "service": {"mode": self.mode, "server": self.server, "metrics_url": self.metrics_url,
                            "texts_per_s": self.tune.settings.engine.unit == "texts/s"},
                "wall_s": rounded(self.wall_s, 2), "out": str(self.out) if self.out else None,
                "ship": _ship(self, best) if self.target_met else None, "diagnosis": self.diagnosed}


def _ship(inv: ServiceInvestigation, best: Any) -> str | None:
    if best is None:
        return None
    if inv.mode == "cmd" and inv.tune.cmd:  # the winner's values in your command line; the ports stay yours
        return fill(inv.tune.cmd, best.values, "{port}", "{metrics_port}")
    return " ".join(f"{k}={v}" for k, v in best.values.items()) or "the service as it runs"


def investigate_service(url: str, encode: Callable[[Any], list[Any]], api: Any, target_p99_ms: float,
                        settings: TuneSettings, *, cmd: str | None = None, space: dict[str, list[str]] | None = None,
                        ready_url: str | None = None, metrics_url: str | None = None, pid: int | None = None,
                        out: Path | None = None, resume: dict[str, Any] | None = None, server: str | None = None,
                        say: Callable[[str], None] | None = None, diagnose_s: float = DIAGNOSE_S,
                        watch_fn: Callable[..., Any] | None = None, measure: Callable[..., Trial] | None = None,
                        on_save: Callable[[ServiceInvestigation], None] | None = None,
                        verify_s: float = 0.0) -> ServiceInvestigation:
    """Decide with the engine, then diagnose the baseline and the winner (see the module docstring).

    ``encode(api) -> bodies``: the requests for that API (its ``client_batch`` texts each). ``cmd``: start each
    configuration from it (``space`` its knobs); without it ``url`` is a running service and ``space`` may name
    ``client_batch`` only. ``on_save(inv)`` runs after every window and every diagnosis (the CLI writes
    ``summary.json`` and ``report.html`` to ``out`` there: :func:`tuning.present.service.write_service_files`).
    ``resume``: an earlier run's summary.json (same settings). ``watch_fn`` and ``measure``: replace the watch
    and the load (tests). ``verify_s``: hold the claimed capacity open-loop this long before it is shipped
    (:func:`~tuning.experiments.tune.hold_shipped`; 0: no hold)."""
    say = say or (lambda line: None)
    write_files = on_save or (lambda inv: None)
    t0 = time.perf_counter()
    mode = "cmd" if cmd else "url"
    if mode == "url":
        space = client_space(api, space)
        if "client_batch" in space:  # configurations compare on work done: every rate counts texts
            settings = dataclasses.replace(settings, engine=dataclasses.replace(settings.engine, unit="texts/s"))
        measure = measure or ClientMeasure(api.url(url), encode, api, settings, metrics_url)
    else:
        if not space:
            raise ServiceError("--cmd needs at least one --space NAME=V1,V2 (or a --server recipe's default space)")
        measure = measure or SwitchingMeasure(cmd, url, encode(api), api, settings, ready_url, say, metrics_url)
    inv = ServiceInvestigation(mode, out, TuneResult(space, "grid", target_p99_ms, settings), server,
                               metrics_url=metrics_url)

    def save(result: TuneResult) -> None:
        inv.tune = result
        inv.wall_s = time.perf_counter() - t0
        write_files(inv)

    try:
        inv.tune = run_tune(cmd, space, url, encode(api), api, target_p99_ms, settings, ready_url, say, save, resume,
                            measure, metrics_url, verify_s)
        if not inv.tune.interrupted and not inv.tune.error and inv.tune.decision is not None:
            diagnose_roles(inv, measure, (url, encode, api, metrics_url), settings, diagnose_s, pid, say,
                           watch_fn, write_files)
    except KeyboardInterrupt:
        inv.tune.interrupted = True
        say("interrupted: what was measured is kept")
    finally:
        if isinstance(measure, SwitchingMeasure):
            measure.close()
    inv.wall_s = time.perf_counter() - t0
    write_files(inv)
    return inv


def roles(result: TuneResult) -> list[tuple[str, dict[str, str]]]:
    """The configurations to diagnose: the baseline, and the recommended one when it differs."""
    d = result.decision
    out = [("baseline", dict(d.baseline))]
    best = result.best
    if best is not None and best.values != d.baseline:
        out.append(("recommended", dict(best.values)))
    return out


def diagnose_roles(inv: ServiceInvestigation, measure: Any, plain: tuple[str, Callable, Any, str | None],
                   settings: TuneSettings, duration_s: float, pid: int | None, say: Callable[[str], None],
                   watch_fn: Callable[..., Any] | None, saved: Callable[[ServiceInvestigation], None]) -> None:
    """Watch each role's configuration under a closed loop at the engine's concurrency: per-thread CPU and
    memory (a local process), the server's metrics, NVML, a diagnosis, and the latency's stages. A role that
    cannot be watched keeps its error."""
    from tuning.experiments.watch import watch

    watch_fn = watch_fn or watch
    for role, values in roles(inv.tune):
        say(f"diagnosing the {role} ({label(values) or 'as it runs'}) under load for {duration_s:.0f} s")
        try:
            process, endpoint, bodies, role_api, metrics = _watched(measure, values, plain, pid)
            watched = watch_fn(process, endpoint, bodies, concurrency=settings.concurrency, duration_s=duration_s,
                               api=role_api, metrics_url=metrics)
        except (ConfigError, ValueError, OSError) as exc:
            inv.diagnosed[role] = {"configuration": values, "error": str(exc)}
            continue
        summary = watched.summary()
        summary.pop("frames", None)  # the report draws from the tables below, not every sample
        inv.diagnosed[role] = {"configuration": values, **summary,
                               "stages": stage_split(watched.load, watched.server_metrics)
                               if watched.load is not None else None}
        saved(inv)


def _watched(measure: Any, values: dict[str, str], plain: tuple[str, Callable, Any, str | None],
             pid: int | None) -> tuple[int | None, str, list, Any, Any]:
    """(process, URL, bodies, API, metrics URL) of one configuration. ``--cmd``: its running server (started if
    need be), sampled as the leader of its process group with every process it forked, since the process
    listening on the port may be a child that is not the model's, as PyTriton's tritonserver is. ``--url``: the
    running service with that many texts per request, and ``pid`` (None: found from the listening port). Else
    ``plain``'s URL with that configuration's texts per request (a test's measure)."""
    if isinstance(measure, SwitchingMeasure):
        group, http = measure.running_server(values)
        return group.proc.pid, http.url, http.bodies, http.api, http.metrics_url
    if isinstance(measure, ClientMeasure):
        http = measure.http(values)
        return pid, http.url, http.bodies, http.api, http.metrics_url
    url, encode, api, metrics_url = plain
    if "client_batch" in values:
        api = dataclasses.replace(api, client_batch=int(values["client_batch"]))
    return pid, url, encode(api), api, metrics_url
