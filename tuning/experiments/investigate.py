"""``python -m tuning investigate``: symptom to shipped configuration in one command.

Phases (a progress bar each, a line per finished ladder step):

1. **baseline**: the ``baseline`` preset under fixed-concurrency load with the recorder (trends,
   per-thread CPU, stage ledger, diagnosis);
2. **ladder**: :func:`tuning.experiments.ladder.run_ladder`, one variable at a time, each judged in interleaved
   pairs against the step before and kept only if it helps beyond the noise (the files are rewritten after
   every step);
3. **confirm**: the recommended configuration at its capacity as a capacity probe, recorder off (the headline:
   capacity, and the probe's verdict and p99 with its interval, against the baseline's; when it fails, fresh
   probes a capacity-bracket step lower each, at most :data:`CONFIRM_DESCENT`, until one holds:
   :attr:`Investigation.held`), then once more under the recorder for its profile (the recorder's own cost
   shows as the difference);
4. **what-if** (unless on a GPU): baseline and recommended on the simulated accelerator
   (``--what-if PROFILE``): would this host pipeline feed that device, and what starves it first;
5. **report**: ``report.html`` (self-contained, offline), ``experiments.csv`` (one row per measured
   configuration), ``summary.json`` (steps, recommended knobs, environment), ``environment.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tuning.base.contract import with_schema
from tuning.base.format import fixed, pct, rounded
from tuning.base.machine import MachineWatch, busy_elsewhere, cpu_name
from tuning.base.progress import progress_bar
from tuning.experiments.capacity import Probe, fresh_probe, pooled_figures
from tuning.experiments.ladder import (
    DEFAULT_TARGET_P99_MS,
    LadderError,
    LadderResult,
    LadderSettings,
    device_block,
    input_texts,
    load_inputs,
    measure_for,
    run_ladder,
)
from tuning.experiments.trial import Trial
from tuning.knobs import preset
from tuning.sim.device import device_for

DEFAULT_OUT = "investigation"
CONFIRM_SALT = 7_777  # the confirm probe's arrivals: apart from the capacity search's and the replication's
# below a confirm that failed, at most this many fresh probes, each one capacity-bracket step (tolerance) lower:
# quick investigate here passed 79.0 req/s in one 4 s window of its search (model busy 99.5%, the queue still
# building) and the confirm there failed by the knee (61 of 81 req/s answered); 3 of 4 quick runs ended so
CONFIRM_DESCENT = 2
FED_DEVICE_BUSY = 0.70  # the what-if calls a device "fed" at or above this busy share (diagnose.SATURATED_BUSY)
WORK_STAGES = ("read", "preprocess", "postprocess")  # host stages that do work (queue waits are their symptom)


@dataclass
class Investigation:
    """Everything one ``investigate`` run measured, and where its files are."""

    out: Path
    quick: bool
    device: dict[str, Any]
    environment: dict[str, Any]
    data: dict[str, Any]
    before: Trial  # baseline under the recorder (trial.profile)
    ladder: LadderResult | None
    after: Trial | None = None  # recommended under the recorder (open loop at its capacity: its profile)
    confirm: Probe | None = None  # recommended at its capacity as a probe, recorder off (the headline)
    descent: list[Probe] = field(default_factory=list)  # below a failed confirm, a bracket step down each
    what_if: dict[str, Any] = field(default_factory=dict)
    wall_s: float = math.nan
    files: dict[str, str] = field(default_factory=dict)
    confirm_rate: float | None = None  # the confirm probe's rate (the capacity found)
    recorder_rate: float | None = None  # the run under the recorder's (``after``): the rate that held, if one did
    interrupted: bool = False
    partial: bool = False  # the files of a run still going (or cut short): what was done so far

    @property
    def target_met(self) -> bool:
        return bool(self.ladder is not None and self.ladder.target_met)

    @property
    def held(self) -> Probe | None:
        """The highest rate at which the recommended configuration met the target on fresh arrivals, recorder
        off: the confirm when it passed, else the first passing probe of the descent below it (None: neither)."""
        if self.confirm is not None and self.confirm.passed:
            return self.confirm
        return next((p for p in self.descent if p.passed), None)

    def descent_sentence(self) -> str:
        """What the probes below a failed confirm found, said once for the headline and the report ("" when the
        confirm passed or did not run). One probe at each rate brackets the capacity; it does not pin it: with
        a rate that held, the capacity now lies between it and the lowest rate that failed."""
        c = self.confirm
        if c is None or c.passed:
            return ""
        held = self.held
        # a probe that did not pass is not always a failure ("undecided": the windows disagreed, a busy machine)
        failed = [p.rate for p in [c, *self.descent] if p.verdict == "fail"]
        if held is None:
            lowest = f", nor at {self.descent[-1].rate:.1f} req/s" if self.descent else ""
            tried = ("; a capacity-bracket step down at a time, on fresh arrivals: " + _probes_text(self.descent)
                     + "; none held") if self.descent else ""
            bound = (f"this machine's capacity now lies below {min(failed):.1f} req/s" if failed else
                     "read the capacity found as an upper bound on this machine now")
            return f"the confirm did not hold at the capacity found ({c.rate:.1f} req/s){lowest}{tried}: {bound}"
        where = (f"this machine's capacity now lies between {held.rate:.1f} and {min(failed):.1f} req/s (one probe "
                 f"each way; plan on {held.rate:.1f})" if failed else
                 f"this machine's capacity now is at least {held.rate:.1f} req/s (no probe above it failed)")
        return (f"the confirm did not hold at the capacity found ({c.rate:.1f} req/s); a capacity-bracket step down at "
                f"a time, on fresh arrivals: {_probes_text(self.descent)}; {held.rate:.1f} req/s held: {where}")

    def summary(self) -> dict[str, Any]:
        ladder = self.ladder.summary()
        ladder.pop("data", None)  # self.data says the same, with the path
        return {
            "command": "investigate", "quick": self.quick, "wall_s": rounded(self.wall_s, 2), "out": str(self.out),
            "files": self.files, "device": self.device, "data": self.data,
            # environment.json without its machine block, which is said once, beside it
            "environment": {k: v for k, v in self.environment.items() if k != "machine"},
            "machine": self.environment.get("machine"),
            "target_p99_ms": ladder.pop("target_p99_ms"),
            "headline": headline(self), "interrupted": self.interrupted, "partial": self.partial,
            "diagnosis": _diagnosis(self.before),
            "before": _trial_summary(self.before), "after": _trial_summary(self.after),
            "confirm_rate": rounded(self.confirm_rate), "recorder_rate": rounded(self.recorder_rate),
            "confirm": self.confirm.row() if self.confirm is not None else None,
            "confirm_descent": [p.row() for p in self.descent],
            "held_rate": rounded(self.held.rate) if self.held is not None else None,
            **ladder,
            "what_if": {k: (v if k != "runs" else {n: _trial_summary(t) for n, t in v.items()})
                        for k, v in self.what_if.items()},
        }


def _probes_text(probes: list[Probe]) -> str:
    """'39.4 req/s fail by knee (40 of 310 over); ...' ('?': a probe whose outcomes were not counted)."""
    return "; ".join(f"{p.rate:.1f} req/s {p.verdict} by {p.by} ({p.exceed if p.exceed >= 0 else '?'} of {p.n} over)"
                     for p in probes)


def _diagnosis(trial: Trial | None) -> dict[str, Any] | None:
    profile = getattr(trial, "profile", None)
    return profile.diagnosis.as_dict() if profile is not None else None


def _trial_summary(trial: Trial | None) -> dict[str, Any] | None:
    if trial is None:
        return None
    out = {k: rounded(getattr(trial, k)) for k in ("qps", "p50_ms", "p95_ms", "p99_ms", "model_busy", "device_busy",
                                                    "mean_batch")}
    out.update(ok=trial.ok, errors=trial.errors, timeouts=trial.timeouts, rejected=trial.rejected,
               submitted=trial.submitted, rate=trial.rate)
    if trial.latencies_ms is not None and len(trial.latencies_ms):
        from tuning.base.decide import quantile_interval

        lo, hi = quantile_interval(trial.latencies_ms, 0.99)
        out["p99_interval_ms"] = [rounded(lo), rounded(hi)]
    if trial.load is not None:
        s = trial.load.summary()
        out.update(stages=s.get("stages"), device=s.get("device"), error_reasons=s.get("error_reasons"))
    if trial.profile is not None:
        out["diagnosis"] = trial.profile.diagnosis.as_dict()
        out["threads"] = trial.profile.top_threads(5)
    return out


def environment(device: Any, what_if: str | None) -> dict[str, Any]:
    """Torch version, device, CPU model, thread counts, the simulated profile used, the machine's load."""
    import psutil
    import torch

    from tuning import __version__

    cpu_model = cpu_name()
    env = {
        "python": platform.python_version(), "torch": torch.__version__, "tuning": __version__,
        "platform": platform.platform(), "cpu_model": cpu_model, "cpus_logical": psutil.cpu_count(),
        "cpus_physical": psutil.cpu_count(logical=False), "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "cuda_available": torch.cuda.is_available(), "cuda_version": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "device": device.as_dict(), "simulated": bool(device.simulated),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }
    load = env["load_average_at_start"]
    busy = busy_elsewhere(load[0]) if load else None  # the one contention rule (tuning.base.machine)
    if busy:
        env["contended"] = f"{busy}; expect a wide run-to-run spread and fewer steps told from noise"
    profile = what_if if (device.knob != "cuda" and what_if) else None
    if profile:
        from tuning.sim import load_profile

        p = load_profile(profile)
        env["sim_profile"] = {"name": p.name, "source": p.source, "label": p.label(),
                              "used_for": "the whole run" if device.knob == "sim" else "the what-if section"}
    return env


def _host_starver(trial: Trial) -> tuple[str, float, float] | None:
    """The working host stage with the largest share of a request's p50 time: (stage, p50 ms, share)."""
    if trial.load is None:
        return None
    ledger = trial.load.ledger()
    host = ledger.loc[[s for s in WORK_STAGES if s in ledger.index]]
    host = host[host.p50_ms.notna()]
    if host.empty:
        return None
    stage = str(host.p50_ms.idxmax())
    return stage, float(host.loc[stage, "p50_ms"]), float(host.loc[stage, "share"])


def what_if_verdict(name: str, trial: Trial, label: str) -> str:
    """One sentence: is the simulated device fed, and what on the host starves it first."""
    busy = trial.device_busy
    queued = _stage_share(trial, "queue_wait")
    head = f"{name} on the {label}: device busy {pct(busy)} (model busy {pct(trial.model_busy)}), QPS {trial.qps:.1f}"
    if math.isfinite(busy) and busy >= FED_DEVICE_BUSY:
        return f"{head}: fed (>= {FED_DEVICE_BUSY:.0%}); the device is now the bottleneck."
    starver = _host_starver(trial)
    threads = trial.profile.top_threads(1) if trial.profile is not None else []
    where = (f"; first to starve it: {starver[0]} ({starver[1]:.1f} ms p50, {starver[2]:.0%} of a request's p50 time"
             + (f", while requests spend {queued:.0%} of it queued for a worker or a model slot" if math.isfinite(queued) else "")
             + ")" if starver else "")
    thread = (f"; busiest thread '{threads[0]['name']}' at {threads[0]['cpu_mean']:.0f}% of a core" if threads else "")
    host = trial.profile.host.summary() if trial.profile is not None else {}
    if host.get("samples"):
        thread += f", the process at {host['cpu_percent_mean']:.0f}% of one core (of {host['cpu_count']})"
    diag = _diagnosis(trial)
    verdict = f"; diagnosis {diag['kind']}: {diag['next_step']}" if diag else ""
    return f"{head}: starved (< {FED_DEVICE_BUSY:.0%}){where}{thread}{verdict}"


def what_if_cores(runs: dict[str, Trial], label: str,
                  target_busy: float = FED_DEVICE_BUSY) -> dict[str, dict[str, Any]]:
    """Per what-if run with a host thread table: the host cores (and server processes) that would keep the
    simulated device ``target_busy`` busy (:func:`tuning.profile.hostcores.host_cores`), as a dict whose
    ``sentence`` says it. The device's busy share is SIMULATED; the CPU per request is measured on this host."""
    from tuning.profile.hostcores import host_cores

    out = {}
    for name, trial in runs.items():
        if trial.profile is None or not trial.profile.top_threads(1):
            continue
        hc = host_cores(trial, target_busy=target_busy, device=label)
        out[name] = {**hc.to_dict(), "sentence": f"{name}: {hc.say()}"}
    return out


def _stage_share(trial: Trial, stage: str) -> float:
    if trial.load is None:
        return math.nan
    ledger = trial.load.ledger()
    return float(ledger.loc[stage, "share"]) if stage in ledger.index else math.nan


def _writer(progress: bool | Callable[[str], None]) -> Callable[[str], None]:
    if progress is True:
        from tqdm.auto import tqdm

        return tqdm.write
    return progress if callable(progress) else (lambda line: None)


def _line(name: str, trial: Trial) -> str:
    d = _diagnosis(trial)
    diag = f"  diagnosis: {d['kind'].upper()} ({'; '.join(d['reasons'])})" if d else ""
    return (f"{name}: QPS {trial.qps:.1f}  p99 {trial.p99_ms:.0f} ms  model busy {pct(trial.model_busy)}  "
            f"device busy {pct(trial.device_busy)}  errors {trial.errors}/{trial.submitted}{diag}")


def _write_files(inv: "Investigation", env: dict[str, Any], render: Callable[["Investigation"], str] | None,
                 partial: bool) -> None:
    """experiments.csv, environment.json, summary.json (and report.html with a renderer) under ``inv.out``."""
    out = inv.out
    names = (("report.html",) if render else ()) + ("experiments.csv", "summary.json", "environment.json")
    inv.files = {name: str(out / name) for name in names}
    inv.ladder.experiments_frame().to_csv(out / "experiments.csv", index=False)
    (out / "environment.json").write_text(json.dumps(with_schema(env), indent=2, default=str))
    if render is not None:
        (out / "report.html").write_text(render(inv), encoding="utf-8")
    inv.partial = partial
    summary = inv.summary()
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(with_schema(summary), indent=2, default=str))
    tmp.replace(out / "summary.json")  # never half a file, even on Ctrl-C


def run_investigation(data: Any = None, device: str = "auto", quick: bool = False,
                      what_if: str | None = "h200-sxm-estimate", out: str | Path = DEFAULT_OUT,
                      target_p99_ms: float = DEFAULT_TARGET_P99_MS, progress: bool | Callable[[str], None] = True,
                      settings: LadderSettings | None = None, limit: int | None = None,
                      render: Callable[[Investigation], str] | None = None, objective: str | None = None,
                      error_budget: float | None = None, seed: int | None = None, concurrency: int | None = None,
                      model: Any = None, tokenizer: Any = None, formatter: Any = None,
                      resume: str | Path | None = None, measure: Any = None) -> Investigation:
    """Run the whole investigation and write its files under ``out``; returns the :class:`Investigation`.

    ``render``: the report renderer (``report.html`` is written only with one); :func:`tuning.investigate`
    passes the HTML report's, so that measuring here imports no presentation.

    ``device``: ``auto`` (CUDA, else the real CPU), ``cpu``, ``cuda`` or ``sim`` (the whole run on the
    simulated ``what_if`` profile). ``what_if``: the simulated profile of the what-if section (None: no
    what-if); the section is left out on a GPU, where the device itself answers. ``objective``,
    ``error_budget``, ``seed`` and ``concurrency`` override the settings'. ``model``/``tokenizer``/``formatter``:
    the user's own. ``resume``: a directory of an earlier, unfinished run (its ``summary.json``) to go on from.

    The files are written after the baseline and after every ladder step (``summary.json`` with
    ``"partial": true``), so a crash or Ctrl-C leaves a valid report of what was done. Raises
    :class:`tuning.experiments.ladder.LadderError` when the baseline gets no ok answer.
    """
    t_start = time.perf_counter()
    watch = MachineWatch()
    settings = settings or (LadderSettings.quick() if quick else LadderSettings.full())
    overrides = {k: v for k, v in (("limit", limit), ("objective", objective), ("error_budget", error_budget),
                                   ("seed", seed), ("concurrency", concurrency)) if v is not None}
    if error_budget is not None:
        overrides["capacity"] = dataclasses.replace(settings.capacity, error_budget=error_budget)
    settings = dataclasses.replace(settings, **overrides)
    dev = device_for(device, what_if if device == "sim" else None, fallback="cpu")
    env = environment(dev, what_if)  # checks the what-if profile before anything is written
    previous = None
    if resume is not None:
        path = Path(resume) / "summary.json"
        if not path.exists():
            raise FileNotFoundError(f"--resume {resume}: no summary.json there (give the --out of an earlier run)")
        previous = json.loads(path.read_text())
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    say = _writer(progress)
    say(dev.banner)
    if env.get("contended"):
        say(f"note: {env['contended']}")

    bar, _, status = progress_bar(progress, total=2, desc="baseline")
    status("reading the data")
    inputs = load_inputs(data, settings.limit)
    texts, bad = input_texts(inputs, formatter)
    data_info = {"path": str(data) if data is None or isinstance(data, (str, os.PathLike)) else "(given inputs)",
                 "lines": len(inputs), "valid": len(texts), "invalid": sum(bad.values()), "invalid_reasons": bad}
    if data is None:
        from tuning.base.assets import DEFAULT_DATA

        data_info["path"] = str(DEFAULT_DATA)
    bar.update(1)
    own = measure is None
    measure = measure or measure_for(inputs, settings, model, tokenizer, formatter)
    base = preset("baseline", device=dev.knob)
    if dev.knob == "sim" and what_if:
        base = base.replace(sim_profile=what_if)
    try:
        status("load test under the recorder")
        before = measure(base, record=True)
        bar.update(1)
        bar.close()
        say(_line("baseline", before))
        if bad:
            say(f"input: {data_info['invalid']} of {len(inputs)} lines are invalid ({bad}); each becomes an error outcome")
        if before.ok == 0:
            raise LadderError(f"the baseline got no ok answer ({before.submitted} sent); first error: "
                              f"{before.first_error or 'none recorded'}. Fix the service, the model or the data, "
                              "then run again")
        inv = Investigation(out, quick, device_block(dev, base.sim_profile), env, data_info, before, None)

        def checkpoint(partial: LadderResult) -> None:
            inv.ladder = partial
            inv.wall_s = time.perf_counter() - t_start
            env["machine"] = watch.info()
            _write_files(inv, env, render, partial=True)  # the report of what was done so far, too

        ladder = run_ladder(inputs, dev, settings=settings, target_p99_ms=target_p99_ms, measure=measure,
                            progress=progress, first=before, sim_profile=what_if if dev.knob == "sim" else None,
                            model=model, tokenizer=tokenizer, formatter=formatter, on_step=checkpoint, resume=previous)
        inv.ladder = ladder
        interrupted = ladder.interrupted
        if not interrupted:
            try:
                _confirm_and_what_if(inv, measure, base, ladder, dev, what_if, progress, say)
            except KeyboardInterrupt:
                interrupted = True
        bar, _, status = progress_bar(progress, total=1, desc="report")
        status("report")
        env["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
        env["machine"] = watch.info()
        inv.interrupted = interrupted
        inv.wall_s = time.perf_counter() - t_start
        _write_files(inv, env, render, partial=interrupted)
        bar.update(1)
        bar.close()
        say(headline(inv))
        return inv
    finally:
        if own:
            measure.close()


def _confirm_and_what_if(inv: Investigation, measure: Any, base: Any, ladder: LadderResult, dev: Any,
                         what_if: str | None, progress: Any, say: Callable[[str], None]) -> None:
    """The recommended configuration at its capacity: a capacity probe with the recorder off (the headline;
    the recorder costs CPU that the served path then lacks: on this 2-core CPU a single window under it read
    p99 925 ms at the 63.1 req/s its own search had passed below 800), then one run under the recorder for its
    profile; and the what-if."""
    target = ladder.objective == "target" and ladder.capacity is not None and ladder.capacity.met
    rate = ladder.capacity.capacity if target else None
    bar, _, status = progress_bar(progress, total=2 if rate else 1, desc="confirm")
    inv.confirm, inv.descent = None, []
    if rate:
        status(f"recommended configuration at {rate:.1f} req/s (recorder off)")
        inv.confirm = fresh_probe(measure, ladder.recommended, rate, ladder.target_p99_ms, ladder.settings.capacity,
                                  salt=CONFIRM_SALT)
        bar.update(1)
        say(f"confirm (recorder off): {inv.confirm.sentence()}")
        down = rate
        while not inv.confirm.passed and len(inv.descent) < CONFIRM_DESCENT and inv.held is None:
            # the search passed a rate at the knee (a short window can, while the queue still builds): step down
            # the bracket until one holds, so that the headline carries a rate this machine met on new arrivals
            down /= 1 + ladder.settings.capacity.tolerance
            status(f"recommended configuration one bracket step lower, at {down:.1f} req/s (recorder off)")
            inv.descent.append(fresh_probe(measure, ladder.recommended, down, ladder.target_p99_ms,
                                           ladder.settings.capacity, salt=CONFIRM_SALT))
            say(f"confirm, a step down (recorder off): {inv.descent[-1].sentence()}")
    # the recorder's run where the configuration held (its profile then describes a machine that copes), else
    # at the capacity found
    on = inv.held.rate if rate and inv.held is not None else rate
    status("recommended configuration under the recorder" + (f" at {on:.1f} req/s" if on else ""))
    inv.after = measure(ladder.recommended, rate=on, record=True)
    inv.confirm_rate, inv.recorder_rate = rate, on
    bar.update(1)
    bar.close()
    say(_line("recommended", inv.after) + (" (under the recorder)" if rate else ""))
    if dev.knob == "cpu" and what_if:
        bar, _, status = progress_bar(progress, total=2, desc="what-if")
        from tuning.sim import load_profile

        profile = load_profile(what_if)
        label = f"simulated {profile.name}"
        runs = {}
        for name, knobs in (("baseline", base), ("recommended", ladder.recommended)):
            status(f"{name} on the simulated {what_if}")
            runs[name] = measure(knobs.replace(device="sim", sim_profile=what_if), record=True)
            bar.update(1)
        bar.close()
        verdicts = [what_if_verdict(n, t, label) for n, t in runs.items()]
        cores = what_if_cores(runs, label)
        for v in verdicts + [c["sentence"] for c in cores.values()]:
            say(f"what-if: {v}")
        inv.what_if = {"profile": what_if, "label": label, "source": profile.source, "runs": runs,
                       "verdicts": verdicts, "host_cores": cores, "simulated": True}
    elif dev.knob == "cuda":
        inv.what_if = {"skipped": "run on a real GPU: the device itself answers whether it is fed"}
    elif dev.knob == "sim":
        inv.what_if = {"skipped": "the whole run is on the simulated device"}
    else:
        inv.what_if = {"skipped": "no what-if profile given"}


def drift_clause(drift: dict[str, Any]) -> str:
    """What changed under the ladder, by the drift's kind (``Ladder.drifts``): the machine slowed, it recovered,
    or a reference passed past the capacity its search had found (the search, not the machine, may have been
    low: its figure and the baseline's were searched before that)."""
    step = drift.get("step")
    if drift.get("kind") == "slowed":
        return f"then the machine slowed, at the {step} step"
    if drift.get("kind") == "recovered":
        return f"then the machine recovered, at the {step} step"
    before, after = drift.get("capacity_before"), drift.get("capacity_after")
    if drift.get("kind") == "passed past its capacity":
        return (f"then, at the {step} step, the reference passed past the capacity its search had found "
                f"({fixed(before, '.1f')} req/s; searched again: {fixed(after, '.1f')})")
    return (f"then the reference's capacity was searched again at the {step} step ({drift.get('kind')}: "
            f"{fixed(before, '.1f')} -> {fixed(after, '.1f')} req/s)")


def headline(inv: Investigation) -> str:
    """The last line: capacity at the target before and after (the confirm run's p99 with its interval), or
    that no configuration met the target, or that the run was cut short."""
    lad = inv.ladder
    t = lad.target_p99_ms
    if inv.partial and not inv.interrupted:
        return (f"IN PROGRESS: {len([s for s in lad.steps if s.status != 'baseline'])} steps done so far; "
                f"nothing to ship yet (best so far: {lad.set_line()})")
    if inv.interrupted:
        return (f"INTERRUPTED after {len([s for s in lad.steps if s.status != 'baseline'])} steps: the files hold what "
                f"was done; go on with --resume {inv.out}")
    after = inv.after
    p99 = ""
    if inv.confirm is not None:
        c = inv.confirm
        span = f" [{fixed(c.p99_low_ms, '.0f')}-{fixed(c.p99_high_ms, '.0f')}]" if c.p99_low_ms is not None else ""
        over = c.exceed if c.exceed >= 0 else "?"  # -1: not counted (a summary-only trial)
        p99 = (f"; confirm at {c.rate:.1f} req/s: {c.verdict} by {c.by} ({over} of {c.n} over {t:.0f} ms "
               f"or failed), p99 {fixed(c.p99_ms, '.0f')}{span} ms")
        if not c.passed:  # the search's passing probe and this one disagree: at the knee
            held = inv.held
            at_held = f"; p99 {fixed(held.p99_ms, '.0f')} ms at {held.rate:.1f} req/s" if held is not None else ""
            p99 += f" ({inv.descent_sentence()}{at_held})"
    elif after is not None:
        f = pooled_figures([after], t)
        lo, hi = f.get("p99_low_ms"), f.get("p99_high_ms")
        span = f" [{fixed(lo, '.0f')}-{fixed(hi, '.0f')}]" if lo is not None else ""
        at = f" at {inv.confirm_rate:.1f} req/s" if inv.confirm_rate else " (closed loop)"
        p99 = f"; confirm run{at}: p99 {fixed(f['p99_ms'], '.0f')}{span} ms, {after.failed} of {after.submitted} failed"
    if lad.objective == "target":
        b, r = lad.baseline_capacity, lad.capacity
        if r is None or not r.met:
            best = r.best if r is not None else None
            closest = (f"; closest: {lad.set_line()} with p99 {fixed(best.p99_ms, '.0f')} ms at {best.rate:.1f} req/s"
                       if best else "")
            return f"TARGET NOT MET: no configuration kept p99 <= {t:.0f} ms at any rate tried{closest}{p99}"
        was = (f"{b.capacity:.1f} [{fixed(b.low, '.1f')}-{fixed(b.high, '.1f')}]" if b is not None and b.met
               else "none (the baseline missed the target)")
        changed = [d for d in lad.state.get("drifts") or [] if not d["baseline_searched_again"]]
        if changed:  # the capacities before and after were not searched on one footing
            was += f" ({drift_clause(changed[0])}: not comparable)"
        why = lad.why_unchanged()
        return (f"capacity at p99 <= {t:.0f} ms: {was} -> {r.capacity:.1f} [{fixed(r.low, '.1f')}-{fixed(r.high, '.1f')}]"
                f" req/s{p99}; ship: {lad.set_line()}" + (f" ({why})" if why else ""))
    bq, rq = lad.baseline_figures.get("qps"), lad.final_figures.get("qps")
    met = "" if lad.target_met else f" (TARGET NOT MET: closed-loop p99 over {t:.0f} ms)"
    return f"QPS (closed loop): {fixed(bq, '.1f')} -> {fixed(rq, '.1f')}{met}{p99}; ship: {lad.set_line()}"

