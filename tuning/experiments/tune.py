"""``python -m tuning tune``: a service's own knobs, each configuration measured by its capacity at the p99 target.

    python -m tuning tune --cmd "python server.py --port {port} --max-batch-size {batch} --batch-timeout {timeout}" \\
        --space batch=1,4,8 --space timeout=0.002,0.05 --url "http://127.0.0.1:{port}/predict" \\
        --body '{"input": "{text}"}' --target-p99-ms 500

For each configuration: the command starts in its own process group on a free port (``{port}`` and each
``--space`` name are filled in; nothing else), it is waited for until it answers (``--ready-url``, or the
first ok request, within ``startup_timeout_s``), warmed up by a short closed loop whose completion rate
brackets the search, measured by :func:`tuning.experiments.capacity.capacity_at_target` (open loop, latency
from the scheduled arrival), and the whole group is stopped (SIGTERM, then SIGKILL: a LitServe parent killed
alone leaves its workers behind). The peak memory of the group is sampled meanwhile. A configuration whose
server never comes up, or dies, is that configuration's error with the last lines of its output; the rest go
on. The search: every configuration up to :data:`EXHAUSTIVE_MAX`; beyond, coordinate descent from the first
value of each knob (each knob's values in turn, the others fixed, until a round changes nothing), then the
best's neighbours (the adjacent value of each knob). Then the best is raced against the runner-up in
interleaved pairs 20% past the rate where the runner-up failed (:func:`confirm_best`): two capacities searched one
after the other are unpaired, and the result says whether the best held where the runner-up did not, or
that the two are tied within the noise.

``--out DIR`` writes ``DIR/tune.json`` after every configuration (and Ctrl-C leaves what was measured there);
``--resume DIR`` goes on from it: the configurations it holds are kept, the rest measured (:func:`run_tune`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
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

from tuning.base.format import rounded
from tuning.base.net import free_port
from tuning.experiments.capacity import (
    Capacity,
    CapacitySettings,
    capacity_at_target,
    pooled_figures,
    race_at,
    saturation_rate,
)
from tuning.experiments.trial import Trial

EXHAUSTIVE_MAX = 16
CHECKPOINT = "tune.json"  # what ``--out DIR`` writes after every configuration and ``--resume DIR`` reads


@dataclass(frozen=True)
class TuneSettings:
    duration_s: float = 5.0  # one load window (open loop: stretched to min_outcomes arrivals, up to max_window_s)
    warmup_s: float = 1.0
    concurrency: int = 16  # the closed loop that warms the service and brackets its capacity
    min_outcomes: int = 300
    max_window_s: float = 10.0
    startup_timeout_s: float = 180.0
    capacity: CapacitySettings = field(default_factory=CapacitySettings.quick)
    # the best against the runner-up in interleaved pairs (see confirm_best); 0: not raced
    confirm_pairs: int = 6
    # ...at this multiple of the runner-up's failing rate, as the ladder's race (LadderSettings.race_at): at
    # the failing rate itself a runner-up whose one failing probe was unlucky still holds in most pairs
    confirm_at: float = 1.2
    quick_mode: bool = False  # made by quick() (``--quick``): recorded in tune.json, so a resume keeps to it

    @classmethod
    def quick(cls) -> "TuneSettings":
        return cls(duration_s=2.0, warmup_s=0.5, concurrency=8, min_outcomes=100, max_window_s=4.0, confirm_pairs=4,
                   quick_mode=True)

    def windows(self) -> dict[str, Any]:
        """The settings that decide what a measured capacity means (load windows, warm-up, the search's rules):
        capacities measured under other ones are not comparable. Not the race's pairs nor the start-up timeout."""
        keys = ("duration_s", "warmup_s", "concurrency", "min_outcomes", "max_window_s")
        return {**{k: getattr(self, k) for k in keys}, "capacity": dataclasses.asdict(self.capacity)}


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
        raise ValueError("tune needs at least one --space name=v1,v2")
    return space


def fill(template: str, values: dict[str, str], port: int) -> str:
    """``template`` with ``{port}`` and each ``{name}`` replaced (a placeholder without a value is named)."""
    out = template.replace("{port}", str(port))
    for name, value in values.items():
        out = out.replace("{" + name + "}", value)
    return out


class ServiceGroup:
    """A command in its own process group: started, watched for memory, stopped with every process it forked."""

    def __init__(self, command: str):
        self.command = command
        self.log = tempfile.NamedTemporaryFile(prefix="tuning-tune-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(shlex.split(command), stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="tune-memory", daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        import psutil

        while not self._stop.wait(0.5):
            total = 0
            for p in psutil.process_iter(["pid"]):
                with contextlib.suppress(psutil.Error, ProcessLookupError):  # gone between the listing and here
                    if os.getpgid(p.info["pid"]) == self.proc.pid:
                        total += p.memory_info().rss
            self.peak_rss = max(self.peak_rss, total)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 12) -> str:
        self.log.flush()
        with open(self.log.name, "rb") as fh:
            text = fh.read()[-8000:].decode("utf-8", errors="replace")
        return "\n".join(text.strip().splitlines()[-lines:])

    def gone(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(15)
        for _ in range(50):
            if self.gone():
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


@dataclass
class TuneRow:
    """One configuration: its values, the exact command, and its capacity or its error."""

    values: dict[str, str]
    command: str
    capacity: Capacity | None = None
    error: str | None = None
    peak_memory_mb: float = math.nan
    startup_s: float = math.nan
    wall_s: float = math.nan
    load_tests: int = 0
    resumed: bool = False  # measured by the earlier run that ``resume`` went on from

    def row(self) -> dict[str, Any]:
        cap = self.capacity
        best = cap.best if cap is not None else None
        return {**self.values, "capacity": rounded(cap.capacity) if cap else None,
                "bracket": [rounded(cap.low), rounded(cap.high)] if cap else None, "met": bool(cap and cap.met),
                "p50_ms": rounded(best.p50_ms) if best else None, "p99_ms": rounded(best.p99_ms) if best else None,
                "errors": best.errors if best else None, "peak_memory_mb": rounded(self.peak_memory_mb),
                "startup_s": rounded(self.startup_s), "load_tests": self.load_tests, "wall_s": rounded(self.wall_s),
                "error": self.error, "command": self.command, "resumed": self.resumed}


@dataclass
class Confirmation:
    """The best configuration against the runner-up in interleaved pairs at the runner-up's failing rate: two
    capacities searched one after the other are two unpaired measurements, and on a busy machine the order
    of the search alone can put one above the other. ``confirmed``: the best kept p99 within the target by
    the probe's rule in those pairs while the runner-up, in the same pairs, did not; or both failed there and the
    best was clearly faster (the paired latency ratio, runner-up over best, ``latency_ratio``: ratio, low, high)."""

    best: dict[str, str]
    runner_up: dict[str, str]
    rate: float | None
    verdict: str  # candidate | candidate faster (the best confirmed) | candidate fails | reference passed | undecided
    # | not raced | error
    pairs: int = 0
    best_exceed: str = ""
    runner_up_exceed: str = ""
    note: str = ""
    latency_ratio: tuple[float, float, float] | None = None

    @property
    def confirmed(self) -> bool:
        return self.verdict in ("candidate", "candidate faster")

    def sentence(self, target_p99_ms: float) -> str:
        b, r = _label(self.best), _label(self.runner_up)
        if self.verdict in ("not raced", "error"):
            return f"not confirmed against the runner-up {r}: {self.note}"
        at = (f"at {self.rate:.1f} req/s (past the rate where the runner-up failed its probe), {self.pairs} interleaved pairs: "
              f"best {self.best_exceed} over {target_p99_ms:.0f} ms, runner-up {self.runner_up_exceed}")
        if self.verdict == "candidate faster" and self.latency_ratio is not None:
            ratio, lo, hi = self.latency_ratio
            return (f"confirmed against the runner-up {r} {at}: both miss the target there, the best clearly "
                    f"faster (latency ratio, runner-up / best, {ratio:.2f} [{lo:.2f}-{hi:.2f}])")
        if self.confirmed:
            return f"confirmed against the runner-up {r} {at}"
        why = {"candidate fails": "the best failed there too", "reference passed": "the runner-up passed there",
               "undecided": "no decision within the pairs"}.get(self.verdict, self.verdict)
        return (f"NOT DISTINGUISHABLE from the runner-up {r} {at}: {why}; {b} and {r} are tied within this "
                "machine's noise, so choose between them on other grounds (memory, simplicity)")

    def to_dict(self, target_p99_ms: float) -> dict[str, Any]:
        return {"best": self.best, "runner_up": self.runner_up, "rate": rounded(self.rate), "verdict": self.verdict,
                "confirmed": self.confirmed, "pairs": self.pairs, "best_exceed": self.best_exceed,
                "runner_up_exceed": self.runner_up_exceed,
                "latency_ratio": None if self.latency_ratio is None else [rounded(x) for x in self.latency_ratio],
                "sentence": self.sentence(target_p99_ms)}


@dataclass
class TuneResult:
    space: dict[str, list[str]]
    rows: list[TuneRow]
    search: str
    target_p99_ms: float
    interrupted: bool = False
    confirmation: Confirmation | None = None
    # what identifies the run, so that ``resume`` goes on only from the same one (see :func:`check_resumable`)
    cmd: str | None = None
    url: str | None = None
    api: dict[str, Any] | None = None
    quick: bool | None = None  # ``--quick``'s short windows (TuneSettings.quick)
    windows: dict[str, Any] | None = None  # TuneSettings.windows(): what the capacities were measured with
    requests: dict[str, Any] | None = None  # requests_block(bodies): how many were sent and their digest
    resumed: int = 0  # configurations taken from the earlier run, not measured again
    retried: int = 0  # configurations that ended in an error in the earlier run, measured again

    @property
    def best(self) -> TuneRow | None:
        """The highest capacity that met the target, of the configurations without an error (a server that crashed
        while measured keeps its capacity in the table, but is not one to ship)."""
        return max(self.met(), key=lambda r: r.capacity.capacity, default=None)

    def met(self) -> list[TuneRow]:
        """The configurations that met the target and did not fail."""
        return [r for r in self.rows if r.capacity is not None and r.capacity.met and not r.error]

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame([r.row() for r in self.rows])

    def summary(self) -> dict[str, Any]:
        best = self.best
        return {"command": "tune", "search": self.search, "space": self.space, "target_p99_ms": self.target_p99_ms,
                "cmd": self.cmd, "url": self.url, "api": self.api, "quick": self.quick, "windows": self.windows,
                "requests": self.requests, "configurations": len(self.rows), "resumed": self.resumed, "retried": self.retried,
                "interrupted": self.interrupted,
                "best": best.row() if best else None, "target_met": best is not None,
                "confirmation": ({**self.confirmation.to_dict(self.target_p99_ms), "note": self.confirmation.note}
                                 if self.confirmation else None),
                "rows": [r.row() for r in self.rows],
                "capacities": {_label(r.values): r.capacity.summary() for r in self.rows if r.capacity is not None}}


def _label(values: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in values.items())


# --- going on from an earlier run (``--resume DIR``) ------------------------------------------------

def api_block(api: Any) -> dict[str, Any] | None:
    """What of ``api`` decides what is measured (schema, route, body, names, texts per request, the answer
    check), for the summary and the resume check; headers are left out (a renewed token is the same run)."""
    if api is None:
        return None
    keys = ("name", "route", "template", "model_name", "input_name", "output_name", "client_batch", "validate")
    return {k: getattr(api, k, None) for k in keys}


def read_checkpoint(directory: str | Path) -> dict[str, Any]:
    """``DIR/tune.json`` of an earlier run, loaded (the message says what to give instead)."""
    path = Path(directory) / CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"--resume {directory}: no {CHECKPOINT} there (give the --out of an earlier tune run)")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"--resume {directory}: {path} is not JSON ({exc}); run without --resume") from None
    if not isinstance(summary, dict) or summary.get("command") != "tune":
        raise ValueError(f"--resume {directory}: {path} was not written by tune; run without --resume")
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
    if previous.get("cmd") is None:
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
    elif json.loads(json.dumps(settings.windows())) != previous["windows"]:
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


def _nan(value: Any) -> float:
    return math.nan if value is None else float(value)


def restore_rows(previous: dict[str, Any], names: Sequence[str]) -> list[TuneRow]:
    """The configurations ``previous`` measured, as rows (capacities with their probes' figures, not their runs),
    marked ``resumed``."""
    capacities = previous.get("capacities") or {}
    rows = []
    for r in previous.get("rows") or []:
        values = {n: str(r[n]) for n in names}
        cap = capacities.get(_label(values))
        rows.append(TuneRow(values, r.get("command") or "", Capacity.from_summary(cap) if cap else None, r.get("error"),
                            _nan(r.get("peak_memory_mb")), _nan(r.get("startup_s")), _nan(r.get("wall_s")),
                            int(r.get("load_tests") or 0), resumed=True))
    return rows


def restore_confirmation(d: dict[str, Any] | None) -> Confirmation | None:
    """A :class:`Confirmation` back from the summary's ``confirmation``."""
    if not d:
        return None
    known = {f.name for f in dataclasses.fields(Confirmation)}
    return Confirmation(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in known})


class HttpMeasure:
    """``measure(config, *, rate=None, record=False, seed=None) -> Trial`` against a URL: closed loop at
    ``concurrency`` or Poisson arrivals at ``rate`` (windows sized by outcomes), through ``api``."""

    def __init__(self, url: str, bodies: Sequence[Any], api: Any, settings: TuneSettings):
        self.url, self.bodies, self.api, self.settings = url, list(bodies), api, settings
        self.runs = 0

    def __call__(self, config: Any = None, *, rate: float | None = None, record: bool = False,
                 seed: int | None = None) -> Trial:
        import warnings

        from tuning.load.generator import run_load

        s = self.settings
        duration = s.duration_s if rate is None else min(max(s.duration_s, s.min_outcomes / rate), s.max_window_s)
        self.runs += 1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            result = run_load(self.url, self.bodies, concurrency=s.concurrency if rate is None else 256,
                              duration_s=duration, rate=rate, warmup_s=s.warmup_s, seed=seed or 0, api=self.api)
        return Trial.from_load(result)


def run_tune(cmd: str, space: dict[str, list[str]], url: str, bodies: Sequence[Any], api: Any, target_p99_ms: float,
             settings: TuneSettings = TuneSettings(), ready_url: str | None = None,
             say: Callable[[str], None] | None = None, on_row: Callable[[TuneResult], None] | None = None,
             resume: dict[str, Any] | None = None) -> TuneResult:
    """Measure each configuration of ``space`` (see the module docstring); Ctrl-C keeps what was measured.

    ``resume``: an earlier run's tune.json, loaded (:func:`read_checkpoint`), with the same command, space, URL,
    API, target and ``--quick`` (else ValueError naming the difference): its configurations are kept as they were,
    not measured again, except those that ended in an error (the server never came up, or crashed), which are
    measured again with the rest. The earlier race of the best is kept when nothing new was measured."""
    say = say or (lambda line: None)
    names = list(space)
    combos = [dict(zip(names, vals)) for vals in itertools.product(*space.values())]
    search = "exhaustive" if len(combos) <= EXHAUSTIVE_MAX else "coordinate descent, then the best's neighbours"
    result = TuneResult(space, [], search, target_p99_ms, cmd=cmd, url=url, api=api_block(api), quick=settings.quick_mode,
                        windows=settings.windows(), requests=requests_block(bodies))
    done: dict[tuple, TuneRow] = {}
    if resume is not None:
        check_resumable(resume, cmd, space, url, api, target_p99_ms, settings, bodies)
        for row in restore_rows(resume, names):
            key = tuple(row.values[n] for n in names)
            if key in done:
                continue
            if row.error:  # a server that never came up or crashed: perhaps the machine's moment, so again
                result.retried += 1
                say(f"{_label(row.values)}: an error in the earlier run ({_error_head(row.error)}), measured again")
                continue
            done[key] = row
            result.rows.append(row)
            say(f"(resumed) {_row_line(row)}")
        result.resumed = len(result.rows)
        again = f"; {result.retried} that ended in an error there measured again" if result.retried else ""
        say(f"resumed: {result.resumed} configurations from the earlier run, not measured again{again}")
        if on_row and result.rows:
            on_row(result)

    def evaluate(values: dict[str, str]) -> TuneRow:
        key = tuple(values[n] for n in names)
        if key in done:
            return done[key]
        row = measure_config(cmd, values, url, bodies, api, target_p99_ms, settings, ready_url, say)
        done[key] = row
        result.rows.append(row)
        say(_row_line(row))
        if on_row:
            on_row(result)
        return row

    def score(row: TuneRow) -> float:
        return row.capacity.capacity if row.capacity is not None and row.capacity.met and not row.error else -1.0

    try:
        if search == "exhaustive":
            for values in combos:
                evaluate(values)
        else:
            current = {n: space[n][0] for n in names}
            best = evaluate(current)
            for _ in range(3):
                changed = False
                for n in names:
                    for v in space[n]:
                        row = evaluate({**current, n: v})
                        if score(row) > score(best):
                            best, current, changed = row, {**current, n: v}, True
                if not changed:
                    break
            for n in names:  # the best's neighbours: the adjacent value of each knob
                i = space[n].index(current[n])
                for j in (i - 1, i + 1):
                    if 0 <= j < len(space[n]):
                        evaluate({**current, n: space[n][j]})
        earlier = restore_confirmation((resume or {}).get("confirmation"))
        if earlier is not None and len(result.rows) == result.resumed:
            result.confirmation = earlier  # nothing new was measured: the earlier race stands
            say("(resumed) " + earlier.sentence(target_p99_ms))
        elif settings.confirm_pairs:
            result.confirmation = confirm_best(result, SwitchingMeasure(cmd, url, bodies, api, settings, ready_url, say),
                                               settings, say)
    except KeyboardInterrupt:
        result.interrupted = True
        say("interrupted: what was measured is kept")
    return result


def confirm_best(result: TuneResult, measure: Callable[..., Trial], settings: TuneSettings,
                 say: Callable[[str], None] | None = None) -> Confirmation | None:
    """Race the best configuration against the runner-up (the next capacity that met the target) in
    interleaved pairs (:func:`~tuning.experiments.capacity.race_at`, at most ``settings.confirm_pairs``) at a rate
    20% past the one where the runner-up failed its probe (``settings.confirm_at``). None with fewer than two
    configurations that met the target. ``measure(values, rate=..., seed=...)`` runs a configuration
    (:class:`SwitchingMeasure` starts its server)."""
    say = say or (lambda line: None)
    met = sorted(result.met(), key=lambda r: r.capacity.capacity, reverse=True)
    if len(met) < 2:
        return None
    best, runner = met[0], met[1]
    failing = runner.capacity.high
    if failing is None or not math.isfinite(failing):
        return Confirmation(best.values, runner.values, None, "not raced",
                            note=f"the runner-up passed every probe (capacity at least {runner.capacity.capacity:.1f} "
                                 "req/s): no failing rate to race at")
    rate = settings.confirm_at * failing
    say(f"confirming the best ({_label(best.values)}) against the runner-up ({_label(runner.values)}) at {rate:.1f} req/s")
    try:
        race = race_at(measure, runner.values, best.values, rate=rate, target_p99_ms=result.target_p99_ms,
                       settings=settings.capacity, max_pairs=max(settings.confirm_pairs, 2),
                       status=lambda t: say(f"confirm: {t}"))
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a server that does not come back: the table stands, unconfirmed
        return Confirmation(best.values, runner.values, rate, "error", note=f"{type(exc).__name__}: {exc}")
    finally:
        close = getattr(measure, "close", None)
        if close is not None:
            close()

    def told(trials: list[Trial], by: tuple[str, str]) -> str:
        f = pooled_figures(trials, result.target_p99_ms)
        return f"{f['exceed']} of {f['n']} ({by[0]} by {by[1]})"
    ratio = (race.ratio, race.low, race.high) if math.isfinite(race.ratio) else None
    return Confirmation(best.values, runner.values, rate, race.verdict, race.pairs,
                        told(race.candidate, race.candidate_by), told(race.reference, race.reference_by), latency_ratio=ratio)


class SwitchingMeasure:
    """``measure(values, *, rate=None, seed=None) -> Trial`` with that configuration's server running: when
    another configuration is asked for, the running one is stopped (its whole process group) and the asked one
    started on a free port and waited for, as :func:`measure_config` does. ``starts`` counts the starts."""

    def __init__(self, cmd: str, url: str, bodies: Sequence[Any], api: Any, settings: TuneSettings,
                 ready_url: str | None, say: Callable[[str], None]):
        self.cmd, self.url, self.bodies, self.api, self.settings = cmd, url, bodies, api, settings
        self.ready_url, self.say = ready_url, say
        self.values: dict[str, str] | None = None
        self.group: ServiceGroup | None = None
        self.measure: HttpMeasure | None = None
        self.starts = 0

    def __call__(self, values: dict[str, str], *, rate: float | None = None, record: bool = False,
                 seed: int | None = None) -> Trial:
        if values != self.values or self.group is None or not self.group.alive():
            self.close()
            port = free_port()
            self.group = ServiceGroup(fill(self.cmd, values, port))
            self.measure = HttpMeasure(self.api.url(fill(self.url, values, port)), self.bodies, self.api, self.settings)
            self.starts += 1
            error = _wait_ready(self.group, self.measure, fill(self.ready_url, values, port) if self.ready_url else None,
                                self.settings.startup_timeout_s)
            if error:
                self.close()
                raise RuntimeError(f"{_label(values)} did not come back: {error}")
            self.values = dict(values)
        return self.measure(values, rate=rate, seed=seed)

    def close(self) -> None:
        if self.group is not None:
            self.group.stop()
        self.group, self.values = None, None


def measure_config(cmd: str, values: dict[str, str], url: str, bodies: Sequence[Any], api: Any, target_p99_ms: float,
                   settings: TuneSettings, ready_url: str | None, say: Callable[[str], None]) -> TuneRow:
    """One configuration from start to stop (its error, not an exception, when the server fails)."""
    port = free_port()
    command = fill(cmd, values, port)
    target = api.url(fill(url, values, port))
    t0 = time.perf_counter()
    row = TuneRow(dict(values), command)
    say(f"starting: {command}")
    group = ServiceGroup(command)
    try:
        measure = HttpMeasure(target, bodies, api, settings)
        error = _wait_ready(group, measure, fill(ready_url, values, port) if ready_url else None,
                            settings.startup_timeout_s)
        row.startup_s = time.perf_counter() - t0
        if error:
            row.error = error
            return row
        closed = measure(values)
        if closed.ok == 0:
            row.error = f"no ok answer under load (first reason: {closed.first_error}); its output ends: {group.tail()}"
            return row
        say("open loop past saturation")
        saturation, _ = saturation_rate(measure, values, closed.qps)  # the closed loop reads low: the top is past it
        row.capacity = capacity_at_target(measure, values, target_p99_ms, saturation=saturation,
                                          settings=settings.capacity, status=say)
        if not group.alive():
            row.error = f"the server exited with {group.proc.returncode} while measured; its output ends: {group.tail()}"
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # this configuration's error; the rest go on
        row.error = f"{type(exc).__name__}: {exc}"
    finally:
        row.peak_memory_mb = group.peak_rss / 2**20 if group.peak_rss else math.nan
        group.stop()
        row.wall_s = time.perf_counter() - t0
        row.load_tests = measure.runs if "measure" in locals() else 0
    return row


def _wait_ready(group: ServiceGroup, measure: HttpMeasure, ready_url: str | None, timeout_s: float) -> str | None:
    """None once the service answers (``ready_url`` with a 2xx, or a first ok request), else the error."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not group.alive():
            return f"the server exited with {group.proc.returncode} before it answered; its output ends:\n{group.tail()}"
        try:
            if ready_url:
                with urllib.request.urlopen(ready_url, timeout=5) as resp:
                    if 200 <= resp.status < 300:
                        return None
            else:
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
                if "connection failed" not in last:
                    return f"the server answers, but not ok: {last}"
        except OSError as exc:
            last = str(exc)
        time.sleep(1.0)
    return f"not ready within {timeout_s:.0f} s ({last}); its output ends:\n{group.tail()}"


def _error_head(error: str) -> str:
    """An error's first clause (before its output's tail), at most 120 characters."""
    return (error.strip().splitlines() or [""])[0].split(";")[0][:120]


def _row_line(row: TuneRow) -> str:
    head = _label(row.values)
    if row.error:
        return f"{head}: error: {row.error.splitlines()[0][:200]}"
    return f"{head}: {row.capacity.sentence()}; peak memory {row.peak_memory_mb:.0f} MB"
