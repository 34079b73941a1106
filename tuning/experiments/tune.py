"""``python -m tuning tune``: a service's own knobs, decided by the engine (``docs/deciding.md``).

    python -m tuning tune --cmd "python server.py --port {port} --max-batch-size {batch} --batch-timeout {timeout}" \\
        --space batch=1,4,8 --space timeout=0.002,0.05 --url "http://127.0.0.1:{port}/predict" \\
        --body '{"input": "{text}"}' --target-p99-ms 500

The first value of every ``--space`` is the baseline (your configuration today). Each configuration's command
starts in its own process group on a free port (``{port}`` and each ``--space`` name are filled in; nothing
else) and is waited for until it answers (``--ready-url``, or the first ok request, within
``startup_timeout_s``); the last two configurations asked for keep running (the confirmation's pairs
alternate between two), an older one is stopped (SIGTERM, then SIGKILL, the whole group: a LitServe parent
killed alone leaves its workers behind). The engine explores the space on throughput
(:mod:`tuning.experiments.search`: the grid, or coordinate descent beyond
:data:`~tuning.experiments.search.GRID_MAX` configurations), confirms the best against the baseline on
interleaved pairs, and checks the target of both on a warm server at descending fractions of their
open-loop ceiling. A configuration whose server never comes up, or dies, is that configuration's
error with the last lines of its output; the rest go on.

``--out DIR`` writes ``DIR/tune.json`` after every window (and Ctrl-C leaves what was measured there);
``--resume DIR`` replays its windows and goes on (:func:`run_tune`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tuning.base.format import fixed, rounded
from tuning.base.net import free_port
from tuning.experiments.defaults import OPEN_LOOP_IN_FLIGHT
from tuning.experiments.engine import (
    ConfigError,
    Decision,
    EngineSettings,
    Runner,
    Window,
    decide,
    same_as_recorded,
)
from tuning.experiments.search import SEARCHES, combos, strategy_for
from tuning.experiments.trial import Trial
from tuning.experiments.verify import Verified, hold_claim
from tuning.load.proctree import ServiceTree, StopGrace
from tuning.load.ready import READY_URL_HINT, protocol_ready_url, still_loading
from tuning.load.scrape import MetricsProbe, mapping_of

CHECKPOINT = "tune.json"  # what ``--out DIR`` writes after every window and ``--resume DIR`` reads
KEEP_WARM = 2  # servers kept running at once: the two arms of the confirmation's pairs


@dataclass(frozen=True)
class TuneSettings:
    """The engine's settings and the load's: the closed loop's concurrency, the warm-up before every window,
    how long a server may take to come up."""

    engine: EngineSettings = field(default_factory=EngineSettings.full)
    concurrency: int = 16  # the closed loop of the throughput windows
    warmup_s: float = 1.0
    startup_timeout_s: float = 180.0
    quick_mode: bool = False  # made by quick() (``--quick``): recorded in tune.json, so a resume keeps to it
    strategy: str | None = None  # grid | coordinate (None: by the space's size)

    @classmethod
    def quick(cls) -> "TuneSettings":
        return cls(engine=EngineSettings.quick(window_s=2.0),
                   concurrency=8, warmup_s=0.5, quick_mode=True)

    def windows(self) -> dict[str, Any]:
        """The settings that decide what a measured window means: windows measured under other ones are not
        comparable (a resume refuses them). Not the start-up timeout."""
        return {"concurrency": self.concurrency, "warmup_s": self.warmup_s,
                "engine": json.loads(json.dumps(dataclasses.asdict(self.engine)))}


def parse_space(items: Sequence[str]) -> dict[str, list[str]]:
    """``--space name=v1,v2`` values as {name: [values]} (the message names a malformed one)."""
    space: dict[str, list[str]] = {}
    for item in items or ():
        name, sep, values = item.partition("=")
        name = name.strip()
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not name.isidentifier() or not vals:
            raise ValueError(f"--space {item!r}: give name=v1,v2,... with a name usable in {{name}}, e.g. --space batch=1,4,8")
        if name == "port":
            raise ValueError("--space port=...: {port} is the free port tune chooses; name the knob otherwise")
        if name in space:
            raise ValueError(f"--space {name} given twice; put every value in one: --space {name}=a,b,c")
        space[name] = vals
    if not space:
        raise ValueError("give at least one --space NAME=V1,V2 (a knob of the service and its values, the first "
                         "being today's), or --server NAME for a recipe's")
    return space


def fill(template: str, values: dict[str, str], port: int | str, metrics_port: int | str | None = None) -> str:
    """``template`` with ``{port}``, ``{metrics_port}`` and each ``{name}`` replaced."""
    out = template.replace("{port}", str(port))
    if metrics_port is not None:
        out = out.replace("{metrics_port}", str(metrics_port))
    for name, value in values.items():
        out = out.replace("{" + name + "}", value)
    return out


@contextlib.contextmanager
def signals_deferred() -> Any:
    """Ctrl-C and SIGTERM wait until the block ends (then raise KeyboardInterrupt): stopping a server's process
    group must finish, or its processes outlive the run. Outside the main thread signals are not this
    thread's to take, and the block runs as is."""
    got: list[int] = []
    try:
        previous = {sig: signal.signal(sig, lambda signum, frame: got.append(signum))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if got:
            raise KeyboardInterrupt


class ServiceGroup:
    """A command in a session of its own: started, watched for memory over every process it made (its
    :class:`~tuning.load.proctree.ServiceTree`), stopped leader first and then whatever it left."""

    def __init__(self, command: str):
        self.command = command
        self.log = tempfile.NamedTemporaryFile(prefix="tuning-tune-", suffix=".log", delete=False)
        try:
            self.proc = subprocess.Popen(shlex.split(command), stdout=self.log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        except (OSError, ValueError) as exc:  # no such program, not executable, an unbalanced quote
            self.log.close()
            os.unlink(self.log.name)
            what = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.filename else str(exc)
            raise ConfigError(f"--cmd could not start ({what}); check the program and its path in {command!r} (--cmd "
                              "is not a shell: a VAR=value prefix is written env VAR=value cmd ...)") from None
        self.tree = ServiceTree(self.proc.pid)
        self.peak_rss = 0
        self.stopped_by: list[str] = []  # the signals its stop had to send, in order
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="tune-memory", daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self.peak_rss = max(self.peak_rss, self.tree.rss_bytes())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 12) -> str:
        self.log.flush()
        with open(self.log.name, "rb") as fh:
            text = fh.read()[-8000:].decode("utf-8", errors="replace")
        return "\n".join(text.strip().splitlines()[-lines:])

    def gone(self) -> bool:
        return self.tree.gone()

    def pause(self) -> None:
        self.tree.pause()

    def resume(self) -> None:
        self.tree.resume()

    def stop(self, grace: StopGrace | None = None) -> None:
        self._stop.set()
        self.stopped_by = self.tree.stop(self.proc, grace or StopGrace())
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)




@dataclass
class TuneRow:
    """One configuration: its values, the exact command of its last start, its throughput as explored, its
    capacity when the target check ran on it, or its error."""

    values: dict[str, str]
    command: str = ""
    qps: float = math.nan
    ratio: float | None = None  # throughput over the baseline's, with its 95% interval
    low: float | None = None
    high: float | None = None
    windows: int = 0
    capacity: Any = None  # tuning.experiments.capacity.Capacity, for the configurations checked at the target
    error: str | None = None
    peak_memory_mb: float = math.nan
    startup_s: float = math.nan
    starts: int = 0
    server: dict[str, float] = field(default_factory=dict)  # the server's own timings (--metrics-url), mean over windows

    def row(self) -> dict[str, Any]:
        cap = self.capacity
        best = cap.best if cap is not None else None
        return {**self.values, "qps": rounded(self.qps), "throughput_ratio": self.ratio, "low": self.low,
                "high": self.high, "windows": self.windows,
                "capacity": rounded(cap.capacity) if cap else None, "checked": cap is not None,
                "met": bool(cap and cap.met), "p50_ms": rounded(best.p50_ms) if best else None,
                "p99_ms": rounded(best.p99_ms) if best else None, "errors": best.errors if best else None,
                "peak_memory_mb": rounded(self.peak_memory_mb), "startup_s": rounded(self.startup_s),
                "starts": self.starts, "error": self.error, "command": self.command,
                **{f"server_{k}": rounded(v) for k, v in self.server.items()}}


def label(values: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items())


_label = label


@dataclass
class TuneResult:
    space: dict[str, list[str]]
    search: str
    target_p99_ms: float
    settings: TuneSettings
    rows: list[TuneRow] = field(default_factory=list)
    decision: Decision | None = None
    windows_log: list[Window] = field(default_factory=list)
    interrupted: bool = False
    error: str | None = None  # the run could not decide (the baseline never came up)
    # what identifies the run, so that ``resume`` goes on only from the same one (see :func:`check_resumable`)
    cmd: str | None = None
    url: str | None = None
    api: dict[str, Any] | None = None
    requests: dict[str, Any] | None = None  # requests_block(bodies): how many were sent and their digest
    resumed: int = 0  # windows replayed from the earlier run, not measured again
    verified: Verified | None = None  # the claim held open-loop (stage 5), when asked for

    @property
    def quick(self) -> bool:
        return self.settings.quick_mode

    def row_of(self, values: dict[str, str]) -> TuneRow | None:
        return next((r for r in self.rows if r.values == values), None)

    @property
    def best(self) -> TuneRow | None:
        """The configuration to ship: the engine's recommendation, when it met the target (``qps``: always)."""
        d = self.decision
        if d is None or d.stage != "done":
            return None
        if self.settings.engine.objective == "target" and not (d.capacity is not None and d.capacity.met):
            return None
        return self.row_of(d.recommended)

    @property
    def target_met(self) -> bool:
        """A configuration met the target, and where its claim was held, a hold held."""
        return self.best is not None and (self.verified is None or self.verified.held is not None)

    @property
    def capacity(self) -> float | None:
        """The capacity shipped: the highest rate held where the claim was held, else the target check's claim."""
        best = self.best
        if best is None or best.capacity is None or not best.capacity.met:
            return None
        return self.verified.held if self.verified is not None else best.capacity.capacity

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame([r.row() for r in self.rows])

    def summary(self) -> dict[str, Any]:
        best = self.best
        d = self.decision
        return {"command": "tune", "search": self.search, "space": self.space, "target_p99_ms": self.target_p99_ms,
                "cmd": self.cmd, "url": self.url, "api": self.api, "quick": self.quick,
                "windows": self.settings.windows(), "requests": self.requests, "configurations": len(self.rows),
                "resumed": self.resumed, "interrupted": self.interrupted, "error": self.error,
                "stage": d.stage if d is not None else "explore",
                "best": best.row() if best else None, "target_met": self.target_met,
                "capacity": rounded(self.capacity),
                "verified": self.verified.summary() if self.verified is not None else None,
                "indeterminate": d.indeterminate if d is not None else None,
                "confirmations": [c.row() for c in d.confirmations] if d is not None else [],
                "target_checks": [{"configuration": lab, **cap.summary()} for lab, cap in d.checks] if d else [],
                "errors": (d.explored.tables.get("errors") if d is not None and d.explored is not None else {}),
                "rows": [r.row() for r in self.rows],
                "capacities": {label(r.values): r.capacity.summary() for r in self.rows if r.capacity is not None},
                "state": {"log": [w.to_dict() for w in self.windows_log]}}


# --- going on from an earlier run (``--resume DIR``) ------------------------------------------------

def api_block(api: Any) -> dict[str, Any] | None:
    """What of ``api`` decides what is measured (schema, route, body, names, texts per request, the answer
    check), for the summary and the resume check; headers are left out (a renewed token is the same run)."""
    if api is None:
        return None
    keys = ("name", "route", "template", "model_name", "input_name", "output_name", "client_batch", "validate")
    return {k: getattr(api, k, None) for k in keys}


def read_checkpoint(directory: str | Path, name: str = CHECKPOINT, command: str = "tune") -> dict[str, Any]:
    """``DIR/tune.json`` of an earlier run (or ``name`` written by ``command``), loaded (the message says what
    to give instead)."""
    path = Path(directory) / name
    if not path.is_file():
        raise FileNotFoundError(f"--resume {directory}: no {name} there (give the --out of an earlier {command} run)")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"--resume {directory}: {path} is not JSON ({exc}); run without --resume") from None
    if not isinstance(summary, dict) or summary.get("command") != command:
        raise ValueError(f"--resume {directory}: {path} was not written by {command}; run without --resume")
    return summary


def _space_text(space: Any) -> str:
    if not isinstance(space, dict):
        return repr(space)
    return " ".join(f"--space {k}={','.join(map(str, v))}" for k, v in space.items())


def _quick_text(quick: Any) -> str:
    return "--quick" if quick else "no --quick"


def requests_block(bodies: Sequence[Any]) -> dict[str, Any]:
    """How many requests a run sends and a SHA-256 of them in order (``--data``, ``--limit`` and the text field
    decide them; another set of texts moves every capacity)."""
    digest = hashlib.sha256()
    for body in bodies:
        digest.update(body if isinstance(body, bytes) else json.dumps(body, sort_keys=True, default=str).encode())
        digest.update(b"\n")
    return {"count": len(bodies), "sha256": digest.hexdigest()[:16]}


def check_resumable(previous: dict[str, Any], cmd: str, space: dict[str, list[str]], url: str, api: Any,
                    target_p99_ms: float, settings: TuneSettings | None = None,
                    bodies: Sequence[Any] | None = None) -> None:
    """Raise ValueError naming every setting in which this run differs from ``previous`` (a loaded tune.json):
    a configuration measured under another command, space, URL, API, target, load windows (``--quick``, and
    ``settings.windows()``) or requests (``bodies``: ``--data``, ``--limit``, the text field) is not this run's.
    ``settings``: this run's (default ``TuneSettings()``)."""
    settings = settings if settings is not None else TuneSettings()
    if "cmd" not in previous:
        raise ValueError("cannot resume: that tune.json does not record its --cmd (written by an older version); "
                         "run without --resume")
    if "quick" not in previous or "windows" not in previous:
        raise ValueError("cannot resume: that tune.json does not record whether --quick was given (written by an "
                         "older version), so its capacities may come from other load windows; run without --resume")
    then_space = {str(k): [str(v) for v in vs] for k, vs in (previous.get("space") or {}).items()}
    checks = (("--cmd", previous.get("cmd"), cmd, repr),
              ("--space", list(then_space.items()), list(space.items()), lambda _: ""),
              ("--url", previous.get("url"), url, repr),
              ("--target-p99-ms", previous.get("target_p99_ms"), target_p99_ms, repr),
              ("the API", previous.get("api"), api_block(api), repr))
    differ = []
    for name, then, now, show in checks:
        if then != now:
            if name == "--space":
                differ.append(f"--space: that run had {_space_text(then_space)}, this one {_space_text(space)}")
            else:
                differ.append(f"{name}: that run had {show(then)}, this one {show(now)}")
    then_quick = bool(previous["quick"])
    if then_quick != settings.quick_mode:
        fix = "add --quick" if then_quick else "drop --quick"
        differ.append(f"--quick: that run had {_quick_text(then_quick)}, this one {_quick_text(settings.quick_mode)} "
                      f"(other load windows: the capacities are not comparable; {fix} to go on from it)")
    elif not same_as_recorded(previous["windows"], json.loads(json.dumps(settings.windows()))):
        differ.append(f"the load windows: that run had {previous['windows']}, this one {settings.windows()}")
    if bodies is not None:
        then, now = previous.get("requests"), requests_block(bodies)
        if then is None:
            differ.append("the requests: that tune.json does not record which it sent (written by an older version)")
        elif then != now:
            differ.append(f"the requests (--data, --limit, the text field): that run sent {then['count']} "
                          f"(digest {then['sha256']}), this one {now['count']} (digest {now['sha256']})")
    if differ:
        raise ValueError("cannot resume: this run's settings differ from that run's: " + "; ".join(differ)
                         + ". Give the same settings, or run without --resume (a new --out)")




class HttpMeasure:
    """``measure(config, *, rate=None, record=False, seed=None, window_s=None, warmup_s=None) -> Trial`` against a
    URL: a closed loop at ``concurrency`` or Poisson arrivals at ``rate``, through ``api``; ``warmup_s``: the
    unmeasured start (default the settings')."""

    def __init__(self, url: str, bodies: Sequence[Any], api: Any, settings: TuneSettings,
                 metrics_url: str | None = None):
        self.url, self.bodies, self.api, self.settings = url, list(bodies), api, settings
        self.metrics_url = metrics_url
        self.runs = 0

    def __call__(self, config: Any = None, *, rate: float | None = None, record: bool = False,
                 seed: int | None = None, window_s: float | None = None, warmup_s: float | None = None) -> Trial:
        import warnings

        from tuning.load.generator import run_load

        s = self.settings
        self.runs += 1
        probe = (MetricsProbe(self.metrics_url, background=True, model=getattr(self.api, "model_name", None),
                              mapping=mapping_of(self.api))
                 if self.metrics_url else None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            result = run_load(self.url, self.bodies, concurrency=s.concurrency if rate is None else OPEN_LOOP_IN_FLIGHT,
                              duration_s=window_s or s.engine.window_s, rate=rate,
                              warmup_s=s.warmup_s if warmup_s is None else warmup_s,
                              seed=seed or 0, api=self.api, busy_probe=probe)
        return with_server_metrics(Trial.from_load(result), probe.result() if probe is not None else None)


def with_server_metrics(trial: Trial, metrics: Any) -> Trial:
    """``trial`` with the server's own timings over its window (a :class:`~tuning.load.scrape.ServerMetrics`):
    its mean queue wait and inference per request, and its mean batch where the client could not see it."""
    if metrics is None:
        return trial
    values = metrics.values
    trial.server_queue_ms = values.get("queue_ms", math.nan)
    trial.server_compute_ms = values.get("inference_ms", math.nan)
    if not math.isfinite(trial.mean_batch) and "mean_batch" in values:
        trial.mean_batch = values["mean_batch"]
    if not math.isfinite(trial.model_busy) and "model_busy" in values:
        trial.model_busy = values["model_busy"]
    return trial


class SwitchingMeasure:
    """``measure(values, *, rate=None, seed=None, window_s=None, warmup_s=None) -> Trial`` with that configuration's
    server running: the last :data:`KEEP_WARM` configurations asked for keep their servers (each on its own free
    port), so that the confirmation's interleaved pairs find both arms warm, the one not measured paused (SIGSTOP:
    warm, and taking no CPU from the one measured); an older one is stopped (its whole process group). A server
    that does not come up, or dies, raises :class:`~tuning.experiments.engine.ConfigError` (that configuration's
    error). ``rows``: what each configuration's starts cost (command, start-up time, peak memory)."""

    def __init__(self, cmd: str, url: str, bodies: Sequence[Any], api: Any, settings: TuneSettings,
                 ready_url: str | None, say: Callable[[str], None], metrics_url: str | None = None):
        self.cmd, self.url, self.bodies, self.api, self.settings = cmd, url, bodies, api, settings
        self.ready_url, self.say, self.metrics_url = ready_url, say, metrics_url
        self.running: dict[str, tuple[ServiceGroup, HttpMeasure]] = {}  # in the order last used
        self.rows: dict[str, TuneRow] = {}
        self.starts = 0

    def row(self, values: dict[str, str]) -> TuneRow:
        return self.rows.setdefault(label(values), TuneRow(dict(values)))

    def _start(self, values: dict[str, str]) -> tuple[ServiceGroup, HttpMeasure]:
        key = label(values)
        self._stop(key)
        while len(self.running) >= KEEP_WARM:
            self._stop(next(iter(self.running)))
        port = free_port()
        metrics_port = free_port() if "{metrics_port}" in self.cmd + (self.metrics_url or "") else None
        row = self.row(values)
        row.command = fill(self.cmd, values, port, metrics_port)
        self.say(f"starting: {row.command}")
        t0 = time.perf_counter()
        group = ServiceGroup(row.command)
        metrics = fill(self.metrics_url, values, port, metrics_port) if self.metrics_url else None
        measure = HttpMeasure(self.api.url(fill(self.url, values, port, metrics_port)), self.bodies, self.api,
                              self.settings, metrics)
        self.starts += 1
        row.starts += 1
        self.running[key] = (group, measure)
        ready = fill(self.ready_url, values, port, metrics_port).replace("{model_name}", self.api.model_name or "") \
            if self.ready_url else None
        error = _wait_ready(group, measure, ready,
                            self.settings.startup_timeout_s)
        row.startup_s = time.perf_counter() - t0
        if error:
            self._stop(key)
            row.error = error
            raise ConfigError(error)
        return group, measure

    def running_server(self, values: dict[str, str]) -> tuple[ServiceGroup, HttpMeasure]:
        """That configuration's server, started if it is not running (the last used, last), and running alone:
        the others kept warm are paused (a server that polls while idle would take the CPU from this one)."""
        key = label(values)
        for other, (group, _) in self.running.items():
            if other != key:
                group.pause()
        entry = self.running.pop(key, None)
        if entry is None or not entry[0].alive():
            entry = self._start(values)
        else:
            entry[0].resume()
        self.running[key] = entry
        return entry

    def __call__(self, values: dict[str, str], *, rate: float | None = None, record: bool = False,
                 seed: int | None = None, window_s: float | None = None, warmup_s: float | None = None) -> Trial:
        key = label(values)
        group, measure = self.running_server(values)
        trial = measure(values, rate=rate, seed=seed, window_s=window_s, warmup_s=warmup_s)
        if not group.alive():
            row = self.row(values)
            row.error = f"the server exited with {group.proc.returncode} while measured; its output ends: {group.tail()}"
            self._stop(key)
            raise ConfigError(row.error)
        if trial.ok == 0 and rate is None:
            row = self.row(values)
            row.error = f"no ok answer under load (first reason: {trial.first_error}); its output ends: {group.tail()}"
            self._stop(key)
            raise ConfigError(row.error)
        return trial

    def _stop(self, key: str) -> None:
        entry = self.running.get(key)
        if entry is None:
            return
        group = entry[0]
        row = self.rows.get(key)
        if row is not None and group.peak_rss:
            row.peak_memory_mb = max(row.peak_memory_mb if math.isfinite(row.peak_memory_mb) else 0.0,
                                     group.peak_rss / 2**20)
        with signals_deferred():  # a Ctrl-C or SIGTERM now would abandon a group half stopped
            group.stop()
        self.running.pop(key, None)

    def close(self) -> None:
        for key in list(self.running):
            self._stop(key)


def run_tune(cmd: str, space: dict[str, list[str]], url: str, bodies: Sequence[Any], api: Any, target_p99_ms: float,
             settings: TuneSettings = TuneSettings(), ready_url: str | None = None,
             say: Callable[[str], None] | None = None, on_row: Callable[[TuneResult], None] | None = None,
             resume: dict[str, Any] | None = None, measure: Callable[..., Trial] | None = None,
             metrics_url: str | None = None, verify_s: float = 0.0) -> TuneResult:
    """Decide on ``space`` with the engine (see the module docstring); Ctrl-C keeps what was measured.

    ``resume``: an earlier run's tune.json, loaded (:func:`read_checkpoint`), with the same command, space, URL,
    API, target, ``--quick`` and requests (else ValueError naming the difference): its windows are replayed, the
    rest measured. ``on_row(result)`` runs after every window. ``measure``: replaces the servers (tests and
    ``investigate --url``); a :class:`SwitchingMeasure` given here is the caller's to close (its servers stay up
    for what comes after the decision). ``metrics_url``: the server's Prometheus metrics (with ``{port}`` or
    ``{metrics_port}``), scraped around every window and joined into each configuration's row. ``verify_s``:
    hold the shipped configuration's claim open-loop this long before it ships (:func:`hold_shipped`; 0: none)."""
    say = say or (lambda line: None)
    search = strategy_for(space, settings.strategy)
    result = TuneResult(space, search, target_p99_ms, settings, cmd=cmd, url=url, api=api_block(api),
                        requests=requests_block(bodies))
    replay: list[dict[str, Any]] = []
    if resume is not None:
        check_resumable(resume, cmd, space, url, api, target_p99_ms, settings, bodies)
        replay = list(((resume.get("state") or {}).get("log")) or [])
        result.resumed = len(replay)
        say(f"resumed: {len(replay)} windows from the earlier run are replayed, not measured again")
    owned = measure is None
    if owned:
        measure = SwitchingMeasure(cmd, url, bodies, api, settings, ready_url, say, metrics_url)
    switching = measure if isinstance(measure, SwitchingMeasure) else None
    measure_fn = measure
    baseline = combos(space)[0]

    def on_window(w: Window) -> None:
        _refresh_rows(result, switching)
        if on_row:
            on_row(result)

    runner = Runner(measure_fn, dict, settings.engine, target_p99_ms, on_window, replay, say)
    result.windows_log = runner.windows
    result.decision = Decision(baseline, baseline)
    try:
        decide(runner, baseline, SEARCHES[search](space, settings.engine, label), settings.engine, label,
               result.decision)
        if verify_s > 0:
            _refresh_rows(result, switching)  # the shipped configuration's row, whose claim is held
            if result.capacity is not None:
                hold_shipped(result, measure_fn, verify_s, say, lambda: on_row(result) if on_row else None)
    except KeyboardInterrupt:
        result.interrupted = True
        say("interrupted: what was measured is kept")
    except ConfigError as exc:
        result.error = str(exc)
        say(f"cannot decide: {exc}")
    finally:
        if owned and switching is not None:
            switching.close()
        _refresh_rows(result, switching)
    return result


HOLD_SALT = 5_000_011  # the holds' arrivals: apart from every window the engine measured


def hold_shipped(result: TuneResult, measure: Callable[..., Trial], seconds: float, say: Callable[[str], None],
                 saved: Callable[[], None]) -> None:
    """Hold the shipped configuration's claim for ``seconds``, lower where it does not hold (stage 5:
    :func:`~tuning.experiments.verify.hold_claim`), into ``result.verified``, saying each hold; ``saved()`` after
    each. Until a rate is held nothing ships: a Ctrl-C during the holds leaves them ``interrupted``, a server
    that fails during one leaves its ``error``."""
    best = result.best
    unit = result.settings.engine.unit
    seeds = iter(range(HOLD_SALT, HOLD_SALT + 1_000))
    result.verified = verified = Verified(best.capacity.capacity, seconds, result.target_p99_ms, unit)

    def hold(rate: float, settle_s: float, judged_s: float) -> Trial:
        say(f"holding {rate:.1f} {unit} for {settle_s + judged_s:.0f} s with {label(best.values) or 'the service'}")
        return measure(best.values, rate=rate, seed=next(seeds), window_s=judged_s, warmup_s=settle_s)

    def held(so_far: Verified) -> None:
        h = so_far.holds[-1]
        said = ("held once (its fresh hold next)" if h.held and h.look else "held" if h.held else "not held") + (
            " on its fresh hold" if h.fresh else "")
        why = f" ({h.why_not()})" if not h.held else ""
        say(f"  {said}: p99 {fixed(h.check['p99_ms'], '.0f')} ms, {h.qps:.1f} {unit} answered{why}")
        saved()

    try:
        hold_claim(hold, verified.claim, seconds, result.target_p99_ms, unit, on_hold=held, into=verified)
    except KeyboardInterrupt:
        verified.interrupted = True
        raise
    except ConfigError as exc:  # its server died or stopped answering: nothing is held
        verified.error = f"the server failed during a hold: {exc}"
    if verified.error:
        say(f"  could not hold: {verified.error}")


def _refresh_rows(result: TuneResult, switching: SwitchingMeasure | None) -> None:
    """The table: every configuration measured (its windows' throughput, its ratio over the baseline as
    explored, its capacity when checked), with what its starts cost."""
    d = result.decision
    ranked = {c.label: c for c in (d.explored.candidates if d is not None and d.explored is not None else [])}
    checks = {lab: cap for lab, cap in (d.checks if d is not None else [])}
    seen: dict[str, TuneRow] = {}
    logged: dict[str, list[Window]] = {}  # each configuration's windows, in order
    for w in result.windows_log:
        key = label(w.config)
        row = seen.get(key) or (switching.row(w.config) if switching is not None else TuneRow(dict(w.config)))
        seen[key] = row
        logged.setdefault(key, []).append(w)
    if switching is not None:
        for key, row in switching.rows.items():
            seen.setdefault(key, row)
    for key, row in seen.items():
        windows = logged.get(key, [])
        throughput = [w for w in windows if w.kind == "throughput"]
        ws = [w.qps for w in throughput if w.qps > 0]
        row.windows = len(ws)
        row.qps = float(sum(ws) / len(ws)) if ws else math.nan
        row.server = server_means(throughput)
        failed = [w.error for w in windows if w.error]
        if failed and not row.error:  # a measure that starts no server (a running service) says it only here
            row.error = failed[-1]
        c = ranked.get(key)
        if c is not None:
            row.ratio = rounded(math.exp(c.log_ratio))
            row.low = rounded(math.exp(c.low)) if math.isfinite(c.low) else None
            row.high = rounded(math.exp(c.high)) if math.isfinite(c.high) else None
        baseline_key = label(d.baseline) if d is not None else None
        row.capacity = checks.get("baseline" if key == baseline_key and "baseline" in checks else key, row.capacity)
    result.rows = list(seen.values())


SERVER_FIELDS = {"queue_ms": "server_queue_ms", "compute_ms": "server_compute_ms", "mean_batch": "mean_batch"}


def server_means(windows: Sequence[Window]) -> dict[str, float]:
    """The server's own timings (queue wait and inference per request, mean batch) over its throughput windows,
    where its metrics gave them."""
    out = {}
    for name, attr in SERVER_FIELDS.items():
        values = [getattr(w, attr) for w in windows if math.isfinite(getattr(w, attr))]
        if values:
            out[name] = float(sum(values) / len(values))
    return out


# answers of a server that is up but still loading its model (Triton opens HTTP first and says 404 for a model not
# loaded yet; TEI and others say 503): waited through until the start-up timeout
def _wait_ready(group: ServiceGroup, measure: HttpMeasure, ready_url: str | None, timeout_s: float,
                poll_s: float = 1.0) -> str | None:
    """None once the service answers (``ready_url`` with a 2xx; without it, the protocol's own ready route with a
    2xx where it has one, or a first ok request), else the error. An answer that says the server is still loading
    (:func:`tuning.load.ready.still_loading`: Triton's 404, MLServer's 400 "not ready yet", a 503), a timeout or
    a refused connection is waited through; any other answer that is not ok is the error at once (a wrong body).
    Without ``ready_url`` a wrong route that answers 404 waits out the timeout, and the error then names that
    last answer and ``--ready-url``."""
    import urllib.request

    protocol_url = None if ready_url else protocol_ready_url(measure.api, measure.url)
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not group.alive():
            return f"the server exited with {group.proc.returncode} before it answered; its output ends:\n{group.tail()}"
        try:
            if ready_url or protocol_url:
                try:
                    with urllib.request.urlopen(ready_url or protocol_url, timeout=5) as resp:
                        if 200 <= resp.status < 300:
                            return None
                except OSError as exc:  # an HTTPError too: not ready yet, or no such route
                    if ready_url:
                        raise
                    last = f"{protocol_url}: {exc}"
            if not ready_url:
                from tuning.load.generator import http_target

                send = http_target(measure.url, timeout_s=10.0, api=measure.api)
                first = next((b for b in measure.bodies if isinstance(b, (bytes, str, dict))), measure.bodies[0])
                try:
                    answer = send(first)
                finally:
                    send.close()
                if answer.outcome == "ok":
                    return None
                last = answer.reason or answer.outcome
                loading = answer.outcome == "timeout" or "connection failed" in last or still_loading(last)
                if not loading:
                    return f"the server answers, but not ok: {last}"
        except OSError as exc:
            last = str(exc)
        time.sleep(poll_s)
    waited_for = f"--ready-url {ready_url} answered no 2xx" if ready_url else READY_URL_HINT
    return f"not ready within {timeout_s:.0f} s ({last}); {waited_for}; its output ends:\n{group.tail()}"


def _error_head(error: str) -> str:
    """An error's first clause (before its output's tail), at most 120 characters."""
    return (error.strip().splitlines() or [""])[0].split(";")[0][:120]


def row_line(row: TuneRow) -> str:
    head = label(row.values)
    if row.error:
        return f"{head}: error: {row.error.splitlines()[0][:200]}"
    cap = f"; {row.capacity.sentence()}" if row.capacity is not None else ""
    return f"{head}: {row.qps:.1f} req/s sustained over {row.windows} windows{cap}"
