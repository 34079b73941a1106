"""``python -m tuning investigate``: symptom to shipped configuration in one command.

Phases (a progress bar each, a line per finished ladder step):

1. **baseline**: the ``baseline`` preset under fixed-concurrency load with the recorder (trends,
   per-thread CPU, stage ledger, diagnosis);
2. **decide**: :func:`tuning.experiments.ladder.run_ladder`, the engine of ``docs/deciding.md``: a factorial
   screen of the knobs on throughput, confirmations against the baseline, a target check of each confirmed
   candidate and the baseline on a warm server (the files are rewritten as it goes);
3. **profile**: the recommended configuration once more under the recorder, at its capacity (the recorder's
   own cost shows as the difference from the target check's window there), and in the baseline's closed loop
   (its stage ledger beside the baseline's, like for like);
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
from tuning.base.format import fit, fixed, pct, rounded
from tuning.base.machine import MachineWatch, busy_elsewhere, cpu_name
from tuning.base.progress import progress_bar
from tuning.experiments.defaults import DEFAULT_OUT
from tuning.experiments.ladder import (
    DEFAULT_TARGET_P99_MS,
    LadderError,
    LadderResult,
    LadderSettings,
    measure_for,
    run_ladder,
)
from tuning.experiments.trial import Trial
from tuning.experiments.workload import device_block, input_texts, load_inputs
from tuning.knobs import preset
from tuning.sim.device import device_for

FED_DEVICE_BUSY = 0.70  # the what-if calls a device "fed" at or above this busy share (diagnose.SATURATED_BUSY)
WORK_STAGES = ("read", "preprocess", "postprocess")  # host stages that do work (queue waits are their symptom)
CHECKPOINT_REPORT_S = 30.0  # a partial report.html is rewritten at most this often (summary.json every window)
RUNNING, CUT_SHORT, MET, MISSED = "running", "interrupted before a verdict", "target met", "target not met"


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
    after_same_load: Trial | None = None  # recommended under the recorder in the baseline's closed loop (the ledger)
    what_if: dict[str, Any] = field(default_factory=dict)
    wall_s: float = math.nan
    files: dict[str, str] = field(default_factory=dict)
    recorder_rate: float | None = None  # the rate of the run under the recorder (the capacity found)
    interrupted: bool = False
    partial: bool = False  # the files of a run still going (or cut short): what was done so far

    @property
    def target_met(self) -> bool:
        return bool(self.ladder is not None and self.ladder.target_met)

    @property
    def outcome(self) -> str:
        """Where the run stands, the one thing its report and headline open with: :data:`RUNNING` (the files
        of a run still going), :data:`CUT_SHORT` (interrupted before the engine reached a verdict: nothing was
        decided, nothing missed), :data:`MET` or :data:`MISSED` (the target checked and met, or not). A run
        interrupted after its verdict (in the profile or the what-if) keeps that verdict."""
        d = self.ladder.decision if self.ladder is not None else None
        if d is None or d.stage != "done":
            return CUT_SHORT if self.interrupted else RUNNING
        return MET if self.target_met else MISSED

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
            "headline": headline(self), "not_stable": not_stable(self), "outcome": self.outcome,
            "interrupted": self.interrupted,
            "partial": self.partial,
            "diagnosis": _diagnosis(self.before),
            "before": _trial_summary(self.before), "after": _trial_summary(self.after),
            "after_same_load": _trial_summary(self.after_same_load),
            "recorder_rate": rounded(self.recorder_rate),
            **ladder,
            "what_if": {k: (v if k != "runs" else {n: _trial_summary(t) for n, t in v.items()})
                        for k, v in self.what_if.items()},
        }


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
        env["contended"] = f"{busy}; fewer steps are told from noise"
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
    verdict = f"; diagnosis with the simulated device: {diag['kind']}: {diag['next_step']}" if diag else ""
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

        return lambda line: tqdm.write(fit(line))
    return progress if callable(progress) else (lambda line: None)


def _line(name: str, trial: Trial) -> str:
    """One run under the recorder: its throughput, named with the load that gave it (an offered rate is not a
    capacity: the capacity is the target check's, at the p99 target)."""
    d = _diagnosis(trial)
    diag = f"; diagnosis: {d['kind'].upper()} ({'; '.join(d['reasons'])})" if d else ""
    load = f"offered {trial.rate:.1f} req/s" if trial.rate else "closed loop"
    return (f"{name} ({load}): throughput {trial.qps:.1f} ok/s, p99 {trial.p99_ms:.0f} ms, model busy "
            f"{pct(trial.model_busy)}, device busy {pct(trial.device_busy)}, errors {trial.errors}/{trial.submitted}"
            f"{diag}")


def _write_files(inv: "Investigation", env: dict[str, Any], render: Callable[["Investigation"], str] | None,
                 partial: bool) -> None:
    """experiments.csv, environment.json, summary.json (and report.html with a renderer) under ``inv.out``."""
    out = inv.out
    names = (("report.html",) if render else ()) + ("experiments.csv", "summary.json", "environment.json")
    inv.files = {name: str(out / name) for name in names}
    inv.partial = partial  # before anything is rendered: the report's head says where the run stands
    inv.ladder.experiments_frame().to_csv(out / "experiments.csv", index=False)
    (out / "environment.json").write_text(json.dumps(with_schema(env), indent=2, default=str))
    if render is not None:
        (out / "report.html").write_text(render(inv), encoding="utf-8")
    summary = inv.summary()
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(with_schema(summary), indent=2, default=str))
    tmp.replace(out / "summary.json")  # never half a file, even on Ctrl-C


def _settings(settings: LadderSettings | None, quick: bool, **overrides: Any) -> LadderSettings:
    """The run's settings with the command's overrides (the engine's own go to the engine)."""
    settings = settings or (LadderSettings.quick() if quick else LadderSettings.full())
    own = {k: overrides[k] for k in ("limit", "concurrency", "compile_on_cpu") if overrides.get(k) is not None}
    engine = {k: overrides[k] for k in ("objective", "error_budget", "seed") if overrides.get(k) is not None}
    return dataclasses.replace(settings, engine=dataclasses.replace(settings.engine, **engine), **own)


def _previous(resume: str | Path | None) -> dict[str, Any] | None:
    if resume is None:
        return None
    path = Path(resume) / "summary.json"
    if not path.exists():
        raise FileNotFoundError(f"--resume {resume}: no summary.json there (give the --out of an earlier run)")
    return json.loads(path.read_text())


def _data_info(data: Any, inputs: list[Any], formatter: Any) -> tuple[dict[str, Any], dict[str, int]]:
    texts, bad = input_texts(inputs, formatter)
    info = {"path": str(data) if data is None or isinstance(data, (str, os.PathLike)) else "(given inputs)",
            "lines": len(inputs), "valid": len(texts), "invalid": sum(bad.values()), "invalid_reasons": bad}
    if data is None:
        from tuning.base.assets import DEFAULT_DATA

        info["path"] = str(DEFAULT_DATA)
    return info, bad


def _answered(before: Trial) -> None:
    if before.ok == 0:
        raise LadderError(f"the baseline got no ok answer ({before.submitted} sent); first error: "
                          f"{before.first_error or 'none recorded'}. Fix the service, the model or the data, "
                          "then run again")


def _checkpointer(inv: Investigation, env: dict[str, Any], render: Any, watch: MachineWatch,
                  t_start: float) -> Callable[[LadderResult], None]:
    """``on_step``: summary.json (the state a resume replays) after every window, the report at most every
    :data:`CHECKPOINT_REPORT_S`."""
    written = [0.0]

    def checkpoint(partial: LadderResult) -> None:
        inv.ladder = partial
        inv.wall_s = time.perf_counter() - t_start
        env["machine"] = watch.info()
        full = time.perf_counter() - written[0] >= CHECKPOINT_REPORT_S
        _write_files(inv, env, render if full else None, partial=True)
        if full:
            written[0] = time.perf_counter()
    return checkpoint


def run_investigation(data: Any = None, device: str = "auto", quick: bool = False,
                      what_if: str | None = "h200-sxm-estimate", out: str | Path = DEFAULT_OUT,
                      target_p99_ms: float = DEFAULT_TARGET_P99_MS, progress: bool | Callable[[str], None] = True,
                      settings: LadderSettings | None = None, limit: int | None = None,
                      render: Callable[[Investigation], str] | None = None, objective: str | None = None,
                      error_budget: float | None = None, seed: int | None = None, concurrency: int | None = None,
                      compile_on_cpu: bool | None = None, model: Any = None, tokenizer: Any = None, formatter: Any = None,
                      resume: str | Path | None = None, measure: Any = None) -> Investigation:
    """Run the whole investigation and write its files under ``out``; returns the :class:`Investigation`.

    ``render``: the report renderer (``report.html`` only with one; :func:`tuning.investigate` passes the HTML
    one, so that measuring imports no presentation). ``device``: ``auto`` (CUDA, else the real CPU), ``cpu``,
    ``cuda`` or ``sim`` (the whole run on the simulated ``what_if`` profile; ``what_if`` None: no what-if,
    which is left out on a GPU). ``objective``, ``error_budget``, ``seed``, ``concurrency`` and ``compile_on_cpu``
    override the settings'; ``model``/``tokenizer``/``formatter``: the user's own; ``resume``: the folder of an unfinished
    run. The files are rewritten after every window (``"partial": true``): a crash or Ctrl-C leaves a valid
    report of what was measured. Raises :class:`~tuning.experiments.ladder.LadderError` when the baseline gets
    no ok answer.
    """
    t_start = time.perf_counter()
    watch = MachineWatch()
    settings = _settings(settings, quick, limit=limit, concurrency=concurrency, objective=objective,
                         error_budget=error_budget, seed=seed, compile_on_cpu=compile_on_cpu)
    dev = device_for(device, what_if if device == "sim" else None, fallback="cpu")
    env = environment(dev, what_if)  # checks the what-if profile before anything is written
    previous = _previous(resume)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    say = _writer(progress)
    say(dev.banner)
    if env.get("contended"):
        say(f"note: {env['contended']}")

    bar, _, status = progress_bar(progress, total=2, desc="baseline")
    status("reading the data")
    inputs = load_inputs(data, settings.limit)
    data_info, bad = _data_info(data, inputs, formatter)
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
        _answered(before)
        inv = Investigation(out, quick, device_block(dev, base.sim_profile), env, data_info, before, None)

        checkpoint = _checkpointer(inv, env, render, watch, t_start)
        ladder = run_ladder(inputs, dev, settings=settings, target_p99_ms=target_p99_ms, measure=measure,
                            progress=progress, first=before, sim_profile=what_if if dev.knob == "sim" else None,
                            model=model, tokenizer=tokenizer, formatter=formatter, on_step=checkpoint, resume=previous)
        inv.ladder = ladder
        interrupted = ladder.interrupted
        if not interrupted:
            try:
                _profile_and_what_if(inv, measure, base, ladder, dev, what_if, progress, say)
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
        return inv
    finally:
        if own:
            measure.close()


def _profile_and_what_if(inv: Investigation, measure: Any, base: Any, ladder: LadderResult, dev: Any,
                         what_if: str | None, progress: Any, say: Callable[[str], None]) -> None:
    """The recommended configuration once more under the recorder, at its capacity (a closed loop when no
    rate met the target), for its profile; and the what-if."""
    cap = ladder.capacity
    rate = cap.capacity if ladder.objective == "target" and cap is not None and cap.met else None
    bar, _, status = progress_bar(progress, total=1, desc="profile")
    status("recommended configuration under the recorder" + (f" at {rate:.1f} req/s" if rate else ""))
    inv.after = measure(ladder.recommended, rate=rate, record=True)
    inv.recorder_rate = rate
    if ladder.recommended != base:  # the ledger compares like for like: the same closed loop as the baseline's run
        status("recommended configuration under the recorder in the baseline's closed loop")
        inv.after_same_load = measure(ladder.recommended, record=True)
    bar.update(1)
    bar.close()
    say(_line("recommended, under the recorder", inv.after))
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
        cores = what_if_cores(runs, label)  # said once, in the run's ending and its report
        inv.what_if = {"profile": what_if, "label": label, "source": profile.source, "runs": runs,
                       "verdicts": verdicts, "host_cores": cores, "simulated": True}
    elif dev.knob == "cuda":
        inv.what_if = {"skipped": "run on a real GPU: the device itself answers whether it is fed"}
    elif dev.knob == "sim":
        inv.what_if = {"skipped": "the whole run is on the simulated device"}
    else:
        inv.what_if = {"skipped": "no what-if profile given"}


def not_stable(inv: Investigation) -> str | None:
    """Why another run of the same command may ship a different line, in one line (the terminal's first and
    the report's top), or None: the machine was busy with other work when the run began, or the engine could
    not tell two candidates apart (at the target or in throughput)."""
    d = inv.ladder.decision if inv.ladder is not None else None
    if d is None or d.stage != "done":
        return None
    why = (["the machine was busy with other work"] if inv.environment.get("contended") else []) + (
        ["two candidates could not be told apart"] if d.indeterminate else [])
    if not why:
        return None
    return (f"ANSWER NOT STABLE: {' and '.join(why)}; another run may ship a different line (a quiet machine, or "
            "--full, decides more)")


def headline(inv: Investigation) -> str:
    """The last line, from :attr:`Investigation.outcome`: capacity at the target before and after, or that no
    configuration met the target after its check, or that the run is still going or was cut short before a
    verdict (then nothing is claimed: no verdict, no ship line)."""
    lad = inv.ladder
    outcome = inv.outcome
    if outcome == RUNNING:
        stage = lad.decision.stage if lad.decision is not None else "explore"
        return f"IN PROGRESS ({stage}, {len(lad.windows)} windows so far): nothing decided yet"
    if outcome == CUT_SHORT:
        return (f"INTERRUPTED before a verdict, after {len(lad.windows)} windows: nothing decided; go on with "
                f"--resume {inv.out}")
    text = _verdict_line(lad)
    if inv.interrupted:  # the verdict stands; what came after it (the profile, the what-if) is missing
        text += f" (interrupted after the verdict: --resume {inv.out} adds the profile)"
    return text


def _verdict_line(lad: LadderResult) -> str:
    """The verdict in one short line (the ship line and why the baseline stays are said beside it, once)."""
    t = lad.target_p99_ms
    if lad.objective == "target":
        b, r = lad.baseline_capacity, lad.capacity
        if r is None or not r.met:
            best = r.best if r is not None else None
            closest = (f"; closest: p99 {fixed(best.p99_ms, '.0f')} ms at {best.rate:.1f} req/s" if best else "")
            return f"TARGET NOT MET: no configuration kept p99 <= {t:.0f} ms{closest}"
        was = f"{b.capacity:.1f}" if b is not None and b.met else "none (the baseline missed it)"
        best = r.best
        at = f" (p99 {fixed(best.p99_ms, '.0f')} ms there)" if best is not None else ""
        return f"capacity at p99 <= {t:.0f} ms: {was} -> {r.capacity:.1f} req/s{at}"
    bq, rq = lad.baseline_figures.get("qps"), lad.final_figures.get("qps")
    met = "" if lad.target_met else f" (TARGET NOT MET: closed-loop p99 over {t:.0f} ms)"
    return f"throughput (closed loop): {fixed(bq, '.1f')} -> {fixed(rq, '.1f')} ok/s{met}"
