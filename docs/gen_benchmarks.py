"""Write ``docs/benchmarks.md`` from ``bench/results``: every figure on that page is read from a result file.

    python docs/gen_benchmarks.py            # rewrite docs/benchmarks.md
    python docs/gen_benchmarks.py --check    # exit 1 when docs/benchmarks.md is not what the results give

One section per result file (``bench/results/*.json`` and ``bench/results/*/gpu_check.json``), grouped by
topic: what the file measures (its own ``what`` where it has one), whether its figures are measured or
SIMULATED, the machine that made it, and its headline figures. A file this script has no reader for still
gets a section with its top-level figures, so a new bench appears without a change here.

The machine block is read in each form the benches have written: ``machine`` (``tuning.base.machine``'s
block, or the older ``cpus``/``torch_threads`` one), ``host`` (``bench/standin_gil.py``) and ``env``
(``bench/gpu_check.py``: the card and torch, no CPU). A file with none says "machine: not recorded"; no
machine is guessed for it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "benchmarks.md"

SIM = "**SIMULATED**"
SIM_DEVICE = "**SIMULATED** device, host measured"


# --- reading -------------------------------------------------------------------------------------------------

def result_files(results: Path = RESULTS) -> list[Path]:
    return sorted(results.glob("*.json")) + sorted(results.glob("*/gpu_check.json"))


def name_of(path: Path) -> str:
    """The result's name: the file's stem, or for a folder of outputs (``gpu_check_h200/``) the folder's name."""
    return path.stem if path.name != "gpu_check.json" else path.parent.name


def rel(path: Path, results: Path = RESULTS) -> str:
    """The path as the page names it: ``bench/results/...`` (also for a copy of the results elsewhere)."""
    try:
        return "bench/results/" + path.relative_to(results).as_posix()
    except ValueError:
        return path.relative_to(ROOT).as_posix()


def load(path: Path) -> Any:
    # allow NaN: fitted device profiles write NaN for power figures they could not fit
    return json.loads(path.read_text())


def machine_of(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The machine block in one form (``tuning.base.machine.machine_info``'s keys), from whichever form the file
    has; None when it records no machine."""
    block = doc.get("machine")
    if isinstance(block, Mapping):
        m = dict(block)
        if "cpus" in m and "cores_logical" not in m:  # the older block: python, torch, cpus, torch_threads, cuda
            m["cores_logical"] = m.pop("cpus")
        if "torch_threads" in m and "torch_intra_op_threads" not in m:
            m["torch_intra_op_threads"] = m.pop("torch_threads")
        if "cuda" in m and "gpu" not in m:
            cuda = m.pop("cuda")
            m["gpu"] = {"cuda": cuda} if cuda else None
        return m
    host = doc.get("host")
    if isinstance(host, Mapping):  # bench/standin_gil.py
        return {"cpu": {"arch": host.get("machine")}, "cores_logical": host.get("cpus"),
                "torch_intra_op_threads": host.get("torch_threads"), "python": host.get("python"),
                "torch": host.get("torch")}
    env = doc.get("env")
    if isinstance(env, Mapping) and env.get("device") == "cuda":  # bench/gpu_check.py: the card, no CPU
        return {"gpu": {"name": env.get("name"), "cuda": env.get("cuda")}, "torch": env.get("torch")}
    return None


def machine_text(m: Mapping[str, Any] | None) -> str:
    if not m:
        return "machine: not recorded"
    parts = []
    cpu = m.get("cpu") or {}
    if cpu.get("model"):
        flags = [f for f, on in (cpu.get("flags") or {}).items() if on]
        bf16 = cpu.get("native_bf16")
        parts.append(f"{cpu['model']} ({' '.join(flags) or 'no avx2'}; "
                     f"{'native bf16' if bf16 else 'no native bf16' if bf16 is False else 'bf16 not recorded'})")
    elif m.get("gpu") and not m.get("cores_logical"):
        parts.append("CPU not recorded")
    else:
        parts.append("CPU model not recorded" + (f" ({cpu['arch']})" if cpu.get("arch") else ""))
    if m.get("cores_logical"):
        parts.append(f"{m['cores_logical']} cores")
    if m.get("torch_intra_op_threads"):
        parts.append(f"torch threads: {m['torch_intra_op_threads']}")
    gpu = m.get("gpu") or {}
    if gpu.get("name"):
        parts.append(f"GPU {gpu['name']}" + (f" (CUDA {gpu['cuda']})" if gpu.get("cuda") else ""))
    elif "gpu" in m and not gpu:
        parts.append("no GPU")
    if m.get("torch"):
        parts.append(f"torch {m['torch']}")
    if m.get("python"):
        parts.append(f"Python {m['python']}")
    return "machine: " + "; ".join(parts)


# --- formatting ----------------------------------------------------------------------------------------------

def machine_short(m: Mapping[str, Any] | None) -> str:
    """The index table's machine: the CPU model (or the GPU), the cores."""
    if not m:
        return "not recorded"
    cpu = (m.get("cpu") or {}).get("model")
    gpu = (m.get("gpu") or {}).get("name")
    parts = [cpu or ("CPU not recorded" if gpu and not m.get("cores_logical") else "CPU model not recorded")]
    if m.get("cores_logical"):
        parts.append(f"{m['cores_logical']} cores")
    if gpu:
        parts.append(gpu)
    return ", ".join(parts)


def num(x: Any) -> str:
    """A figure as the page prints it: thousands separated above 100, 2 decimals from 0.1, 3 significant below."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if not isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, float) and not math.isfinite(x):
        return "-"
    if isinstance(x, int):
        return f"{x:,}"
    a = abs(x)
    if a >= 100:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 0.1 or a == 0:
        return f"{x:.2f}"
    return f"{x:.3g}"


def pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def spread(s: Any) -> str:
    """A bench spread (median, min, max, n) as ``median [min-max], n=N``; a bare number as itself."""
    if isinstance(s, Mapping) and "median" in s:
        if not s.get("n"):
            return "-"
        return f"{num(s['median'])} [{num(s['min'])}-{num(s['max'])}], n={s['n']}"
    return num(s)


def cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> list[str]:
    header = list(header)
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out + [""]


def figures(pairs: Iterable[tuple[str, Any]]) -> list[str]:
    return table(("figure", "value"), ((k, v) for k, v in pairs if v is not None))


def get(doc: Any, *path: Any) -> Any:
    for key in path:
        if isinstance(doc, Mapping):
            doc = doc.get(key)
        elif isinstance(doc, list) and isinstance(key, int) and -len(doc) <= key < len(doc):
            doc = doc[key]
        else:
            return None
    return doc


# --- readers: one per bench, each returns the section's markdown lines --------------------------------------

def read_pipeline(d):
    qps = d.get("qps", {})
    sp = d.get("spreads", {})
    return figures([*((f"{arm} throughput, req/s", spread(v)) for arm, v in qps.items()),
                    ("tuned / baseline", spread(sp.get("tuned_over_baseline", d.get("tuned_over_baseline")))),
                    ("tuned / bare forward (pipeline efficiency)",
                     spread(sp.get("tuned_over_bare", d.get("tuned_over_bare")))),
                    ("targets", ", ".join(f"{k} >= {num(v)}" for k, v in d.get("targets", {}).items()) or None)])


def read_presets(d):
    rows = [(p["variant"], spread(p.get("over_tuned")), num(p.get("padding_waste"))) for p in d.get("points", [])]
    return ([f"Each variant changes one knob of `{d.get('preset')}`; throughput over `{d.get('preset')}`'s "
             f"in the same round ({d.get('rounds')} rounds, {d.get('records_per_run')} records a run).", ""]
            + table(("variant", f"throughput / {d.get('preset')}", "padding waste"), rows))


def read_peers(d):
    out = []
    for dtype in ("fp32", "bf16"):
        block = d.get(dtype)
        if isinstance(block, Mapping):
            out.append((f"{dtype}: tuned pipeline / SentenceTransformer.encode", spread(block.get("ratio"))))
            out.append((f"{dtype}: our model call / theirs", spread(block.get("model_ratio"))))
    return figures(out + [("target", num(d.get("target")))])


def read_threads(d):
    out = []
    fw = d.get("forward_16x64") or []
    if fw:
        out += ["MiniLM forward at 16x64, ms (1 thread / all cores):", ""]
        out += table(("state", "fp32 1 thread", "fp32 2 threads", "bf16 1 thread", "bf16 2 threads"),
                     ((r.get("state"), num(r.get("fp32_1t_ms")), num(r.get("fp32_2t_ms")), num(r.get("bf16_1t_ms")),
                       num(r.get("bf16_2t_ms"))) for r in fw))
    p = d.get("pipeline") or {}
    if p:
        out += figures([("pipeline", f"{p.get('preset')}, loader workers: {p.get('num_workers')}"),
                        (f"throughput at {p.get('threads_sized')} torch threads / at {p.get('threads_default')}",
                         spread(p.get("sized_over_default")))])
    return out


def read_profiler_overhead(d):
    med = d.get("median_rps", {})
    return figures([("without the recorder, req/s (median)", num(med.get("without"))),
                    ("with the recorder, req/s (median)", num(med.get("with"))),
                    ("overhead", pct(d.get("overhead"))), ("target", f"< {pct(d.get('target'))}"),
                    ("GPU sampler", d.get("gpu_sampler"))])


def read_serving(d):
    p99 = d.get("p99_ms", {})
    ci = d.get("p99_ratio_ci95")
    return figures([("closed loop: tuned / baseline QPS", num(d.get("qps_ratio"))),
                    (f"open loop at {num(d.get('rate'))} req/s: tuned / baseline p99",
                     num(d.get("p99_ratio")) + (f" (95% CI {num(ci[0])}-{num(ci[1])})" if ci else "")),
                    *((f"{arm} p99 at that rate, ms", num(v)) for arm, v in p99.items()),
                    ("rounds", num(d.get("rounds"))),
                    ("targets", ", ".join(f"{k} {num(v)}" for k, v in d.get("targets", {}).items()) or None)])


def read_loadgen_agreement(d):
    return figures([("QPS ours / locust", spread(d.get("qps_ratio_spread", d.get("qps_ratio")))),
                    ("p99 ours / locust", spread(d.get("p99_ratio_spread", d.get("p99_ratio")))),
                    ("target", "-".join(num(x) for x in d.get("target", [])) or None), ("met", num(d.get("met")))])


def read_client_ceiling(d):
    arms = d.get("arms", {})
    out = table(("client", "req/s", "client CPU per request, us"),
                ((arm, spread(v.get("qps")), spread(v.get("cpu_us_per_request"))) for arm, v in arms.items()))
    extra = [("aiohttp's CPU per request / ours", spread(d.get("aiohttp_cpu_over_tuning")))]
    if "procs2_qps_over_tuning" in d:
        extra.append(("2 client processes / 1, req/s", spread(d.get("procs2_qps_over_tuning"))))
    return out + figures(extra)


def read_host_ceiling(d):
    t = d.get("targets", {})
    return figures([("offline tuned / tokenizer alone",
                     spread(d.get("offline_over_tokenizer_spread", d.get("offline_over_tokenizer")))
                     + (f" (target >= {num(t['offline_over_tokenizer'])})" if "offline_over_tokenizer" in t else "")),
                    ("HTTP front, req/s at concurrency " + num(d.get("concurrency")), num(d.get("http_qps"))),
                    ("HTTP front p99.9, ms", num(d.get("http_p999_ms"))
                     + (f" (target < {num(t['http_p999_ms'])})" if "http_p999_ms" in t else "")),
                    ("HTTP front / bare echo", spread(d.get("http_over_echo_spread", d.get("http_over_echo")))
                     + (f" (target >= {num(t['http_over_echo'])})" if "http_over_echo" in t else "")),
                    ("client-bound arms", ", ".join(d.get("client_bound_arms") or []) or None)])


def read_overload(d):
    b = d.get("burst", {})
    failed = [k for k, ok in (d.get("checks") or {}).items() if not ok]
    return figures([("case", d.get("case")), ("model", d.get("model")),
                    ("capacity / offered, req/s", f"{num(d.get('capacity_rps'))} / {num(d.get('offered_rps'))}"),
                    ("burst: submitted, ok, rejected, lost",
                     ", ".join(num(b.get(k)) for k in ("submitted", "ok", "rejected", "lost"))),
                    ("accepted p50 / p99, ms", f"{num(b.get('ok_p50_ms'))} / {num(b.get('ok_p99_ms'))}"),
                    ("rejected p50 / p99, ms", f"{num(b.get('rejected_p50_ms'))} / {num(b.get('rejected_p99_ms'))}"),
                    ("shed by the HTTP front", num(d.get("shed_by_front_server_count"))),
                    ("back to normal after, s", num(d.get("recovery_s"))),
                    ("checks not met", ", ".join(failed) or "none")])


def read_soak(d):
    failed = [k for k, ok in (d.get("checks") or {}).items() if not ok]
    return figures([("duration, s / concurrency", f"{num(d.get('duration_s'))} / {num(d.get('concurrency'))}"),
                    ("malformed share sent", pct(d.get("malformed_share"))),
                    ("submitted, ok, errors", ", ".join(num(d.get(k)) for k in ("submitted", "ok", "errors"))),
                    ("lost, duplicated", f"{num(d.get('lost'))}, {num(d.get('duplicates'))}"),
                    ("p50 / p99, ms", f"{num(d.get('p50_ms'))} / {num(d.get('p99_ms'))}"),
                    ("memory warm -> end, MB", f"{num(d.get('memory_warm_mb'))} -> {num(d.get('memory_end_mb'))} "
                                               f"({pct(d.get('memory_drift'))})"),
                    ("checks not met", ", ".join(failed) or "none")])


def read_keep_rule(d):
    rows = []
    for case in (d.get("cases") or {}).get("quick", []):
        rows.append((case.get("world"), pct(case.get("noise")), f"{case.get('right')} of {case.get('runs')}",
                     f"{pct(case.get('low'))}-{pct(case.get('high'))}"))
    return (["Every world and the full settings, with capacity accuracy: [the engine's error rates]"
             "(deciding-results.md) (written by the same bench).", ""]
            + table(("world (quick settings)", "noise", "right", "95% interval"), rows))


def read_tuner(d):
    lad = d.get("ladder") or {}
    return figures([("title", d.get("title")), ("grid best", _changes(get(d, "grid_best", "changes"))),
                    ("grid best capacity, req/s", num(get(d, "grid_best", "capacity"))),
                    ("grid best / worst", num(d.get("grid_best_over_worst"))),
                    ("the engine shipped", lad.get("set_line")),
                    ("shipped / grid best", num(d.get("ladder_over_grid_best"))),
                    ("target ratio", num(d.get("target_ratio"))),
                    ("met", num(d.get("ladder_meets_target_ratio")))])


def read_tuner_quick(d):
    return figures([("grid best", d.get("grid_best")), ("grid best capacity, req/s", num(d.get("grid_best_capacity"))),
                    ("grid best / worst", num(d.get("grid_best_over_worst"))),
                    ("the engine shipped", d.get("engine_shipped")),
                    ("shipped / grid best", num(d.get("engine_over_grid_best"))),
                    ("met the target ratio", num(d.get("engine_meets_target_ratio"))),
                    ("windows: grid / engine", f"{num(d.get('grid_windows'))} / {num(d.get('engine_windows'))}")])


def read_tune_repeat(d):
    rows = [(i + 1, _changes(r.get("best")), num(r.get("capacity")), num(r.get("seconds")), r.get("indeterminate") or "")
            for i, r in enumerate(d.get("runs", []))]
    return table(("run", "best", "capacity, req/s", "seconds", "indeterminate"), rows) + figures(
        [("same best both times", num(d.get("same_best"))), ("a tie said as such", num(d.get("indeterminate_said"))),
         ("capacity max / min", num(d.get("capacity_max_over_min")))])


def read_sim_ladder(d):
    rows = [(r.get("step"), r.get("change") or "", r.get("status"), num(r.get("ratio")),
             f"{num(r.get('low'))}-{num(r.get('high'))}" if r.get("low") is not None else "")
            for r in d.get("rungs", [])]
    return figures([("device", get(d, "device", "name")), ("target p99, ms", num(d.get("target_p99_ms"))),
                    ("target met", num(d.get("target_met"))),
                    ("recommended", get(d, "recommended", "set_line")),
                    ("offline tuned / baseline", num(d.get("offline_tuned_over_baseline")))]) + table(
        ("step", "change", "status", "ratio", "interval"), rows)


def read_sim_fidelity(d):
    iv = d.get("ratio_intervals", {})
    rows = [(k, num(v), f"{num(get(iv, k, 'low'))}-{num(get(iv, k, 'high'))}",
             num(get(d, "within_target", k))) for k, v in (d.get("ratios") or {}).items()]
    t = d.get("target", {})
    return (table(("measure", "sim / real (median)", "geometric mean's 95% interval", "within target"), rows)
            + figures([("target", f"{'-'.join(num(x) for x in t.get('ratio', []))}; held-out error < "
                                  f"{pct(t.get('holdout_error'))}" if t else None),
                       ("rounds", f"{num(d.get('rounds'))} ({d.get('stopped_by')})"),
                       ("fit error, worst sweep point", pct(d.get("fit_error"))),
                       ("held-out error, worst shape", pct(d.get("holdout_error"))),
                       ("seconds", num(d.get("seconds")))]))


def read_device_profile(d):
    pf = d.get("peak_flops") or {}
    return figures([("description", d.get("description")),
                    *((f"achieved {k}, TFLOP/s", num(v / 1e12)) for k, v in pf.items() if isinstance(v, (int, float))),
                    ("bandwidth, GB/s", num((d.get("mem_bandwidth") or 0) / 1e9)),
                    ("launch, us", num((d.get("launch_s") or 0) * 1e6)),
                    ("host dispatch kind", d.get("host_dispatch"))])


def read_sim_published(d):
    s = d.get("summary", {})
    fitted = get(s, "fitted_on_calibration_rows", "gemm_efficiency") or {}
    return figures([("device profile", s.get("device_profile")),
                    ("validation rows judged", num(s.get("validation_rows_judged"))),
                    ("within 0.67-1.5", num(s.get("within_0.67_1.5"))),
                    ("median predicted / published", num(s.get("median_ratio_pred_over_meas"))),
                    ("GEMM efficiency fitted on calibration rows",
                     ", ".join(f"{k} {num(v)}" for k, v in fitted.items()) or None),
                    ("rows in the table", num(len(d.get("rows", []))))])


def read_host_launch(d):
    s = d.get("summary", {})
    band = s.get("band") or []
    return figures([("CUDA-path launch constant, us", num(s.get("launch_s_us"))),
                    ("rows (runs)", f"{num(s.get('rows'))} ({', '.join(s.get('runs') or [])})"),
                    ("median predicted / measured", num(s.get("median_ratio"))),
                    ("at batch 1", num(s.get("median_ratio_batch_1"))),
                    (f"within {'-'.join(num(b) for b in band)}", f"{num(s.get('within_band'))} of {num(s.get('rows'))}"),
                    ("with the rule before (tiny op + raw launch)", num(s.get("median_ratio_before")))])


def read_host_cores(d):
    rows = []
    for name, c in (d.get("configs") or {}).items():
        rows.append((name, spread(c.get("ratio_measured")), spread(c.get("ratio_predicted_from_1core")),
                     pct(c.get("error_from_1core")), num(c.get("within_target"))))
    return (["Throughput on 2 cores / on 1 core (`taskset`), measured and predicted from the 1-core run:", ""]
            + table(("configuration", "measured", "predicted from 1 core", "error", "within target"), rows)
            + figures([("tolerance", pct(d.get("tolerance"))), ("pairs", num(d.get("pairs"))),
                       ("note", d.get("resummarized"))]))


def read_standin_gil(d):
    rows = [(k, r.get("what"), num(r.get("stretch")), num(r.get("other_thread_share_median")),
             num(r.get("handoffs_per_ms"))) for k, r in (d.get("rows") or {}).items()]
    return table(("row", "what", "stretch beside a busy thread", "other thread's pace", "hand-offs per ms"),
                 rows) + figures([("SEGMENT_S the run used, ms", num((d.get("segment_s_used") or 0) * 1e3)),
                                  ("segment derived from the real forward, ms", num(d.get("derived_segment_ms")))])


def read_standin_gil_pipeline(d):
    rows = []
    for preset, p in (d.get("presets") or {}).items():
        rows.append((preset, *(num(get(p, arm, "qps")) for arm in ("spin", "per_launch", "segment"))))
    return ([f"Offline throughput, req/s (median of {d.get('rounds')} rounds), by the stand-in's host part:", ""]
            + table(("preset", "GIL-holding spin", "per launch", "segments (now)"), rows))


def read_gpu_check(d):
    rows = [(r.get("mode"), r.get("batch"), r.get("length"), r.get("dtype"), num(r.get("median_ms")),
             num(r.get("speedup_vs_eager")), num(r.get("min_cosine_vs_fp32")))
            for r in d.get("rows", []) if r.get("status", "ok") == "ok"]
    steps = ", ".join(f"{k} ({v.get('status', 'ok')})" for k, v in (d.get("steps") or {}).items()
                      if isinstance(v, Mapping))
    out = figures([("complete", num(d.get("complete"))), ("seconds", num(d.get("elapsed_s"))), ("steps", steps)])
    if rows:
        out += table(("mode", "batch", "length", "dtype", "ms per call", "speedup over eager", "min cosine vs fp32"),
                     rows)
    fid = get(d, "steps", "sim_fidelity", "sim_over_real")
    if isinstance(fid, Mapping):
        out += ["**SIMULATED** / measured on this card (a profile fitted in the same run):", ""]
        out += table(("preset", "sim / real"), ((k, num(v if not isinstance(v, Mapping) else v.get("qps")))
                                                 for k, v in fid.items()))
    return out


def read_aiperf_compare(d):
    r = d.get("ratios_ours_over_aiperf") or {}
    rows = [(f"ours / AIPerf {k}", spread(v)) for k, v in r.items()]
    for key, what in (("overhead_ms", "client and network overhead over the server's duration, ms"),
                      ("server_mean_batch", "the server's mean batch"),
                      ("server_held_concurrency", "requests the server held on average")):
        for tool, v in (d.get(key) or {}).items():
            rows.append((f"{tool}: {what}", spread(v)))
    rows += [("smaller overhead", d.get("smaller_overhead")), ("steadier overhead", d.get("steadier_overhead")),
             ("the client to believe", d.get("believe"))]
    return figures(rows)


def read_whatif_holdout(d):
    def band(v):
        return f"{num(v.get('median'))} [{num(v.get('low'))}-{num(v.get('high'))}], n={v.get('n')}" if v else "-"

    rows = [(side, mode, band(v.get("before")), band(v.get("after")))
            for side, modes in (d.get("summary") or {}).items() for mode, v in (modes or {}).items()]
    done = d.get("done_when") or {}
    return (["Predicted / measured per shape: median [low-high] as the file gives them, n=shapes.", ""]
            + table(("runs", "mode", "profile before", "profile after"), rows)
            + figures([("fitted on", ", ".join(get(d, "fitted", "fit_runs") or []) or None),
                       ("target: graph median / every graph shape",
                        f"{'-'.join(num(x) for x in done.get('graph_median', []))} / "
                        f"{'-'.join(num(x) for x in done.get('graph_band', []))}" if done else None),
                       ("met", num(done.get("met")) if done else None)]))


def _changes(c: Any) -> str:
    if isinstance(c, Mapping):
        return ", ".join(f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in c.items()) or "-"
    return "-" if c is None else str(c)


def read_generic(d):
    pairs = [(k, num(v)) for k, v in d.items() if k not in ("machine", "quick", "what", "host", "env")
             and (isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) <= 120))]
    return figures(pairs) if pairs else ["(no top-level figures)", ""]


# --- what each file is -------------------------------------------------------------------------------------

# family: (topic, the bench that writes it, what it measures, the kind of its figures, its reader)
FAMILIES: dict[str, tuple[str, str, str, str, Callable[[Any], list[str]]]] = {
    "pipeline": ("pipeline", "bench/pipeline.py", "`baseline` against `tuned` against the bare model forward at "
                 "the tuned shapes, offline, interleaved rounds", "measured", read_pipeline),
    "presets": ("pipeline", "bench/presets.py", "each of `tuned`'s choices undone one at a time", "measured",
                read_presets),
    "peers": ("pipeline", "bench/peers.py", "the tuned pipeline against `SentenceTransformer.encode` on the same "
              "texts", "measured", read_peers),
    "threads": ("pipeline", "bench/threads.py", "the forward at 1 thread and every core, quiet and beside a busy "
                "process; the pipeline with loader workers at torch's default threads against one core less per "
                "worker", "measured", read_threads),
    "profiler_overhead": ("pipeline", "bench/profiler_overhead.py", "throughput with and without the recorder, "
                          "interleaved", "measured", read_profiler_overhead),
    "serving": ("serving", "bench/serving.py", "`baseline` against `tuned` served over HTTP, load from another "
                "process: closed loop for QPS, open loop at one rate below both capacities for p99", "measured",
                read_serving),
    "loadgen_agreement": ("serving", "bench/loadgen_agreement.py", "our load client and locust against the same "
                          "server at the same concurrency, interleaved", "measured", read_loadgen_agreement),
    "client_ceiling": ("serving", "bench/client_ceiling.py", "the load client's own CPU per request against a bare "
                       "echo server", "measured", read_client_ceiling),
    "host_ceiling": ("serving", "bench/host_ceiling.py", "the host side with a zero-cost model: offline pipeline "
                     "against the tokenizer alone; the HTTP front against a bare uvicorn + starlette echo", "measured",
                     read_host_ceiling),
    "overload": ("serving", "bench/overload.py", "30 s of Poisson arrivals at twice the closed-loop capacity: "
                 "admission, shedding and recovery", "measured", read_overload),
    "soak": ("serving", "bench/soak.py", "a soak at high concurrency with malformed requests mixed in: every "
             "request answered once, memory drift", SIM_DEVICE, read_soak),
    "keep_rule": ("engine", "bench/keep_rule.py", "the engine's error rates through its seam on simulated worlds "
                  "(no timing)", SIM, read_keep_rule),
    "tuner": ("engine", "bench/tuner.py", "the engine's shipped configuration against an exhaustive grid on a "
              "simulated device slowed so that the device limits", SIM_DEVICE, read_tuner),
    "tune_repeat": ("engine", "bench/tune_repeat.py", "`tune` twice over the LitServe app of the tests: the same "
                    "best both times?", "measured", read_tune_repeat),
    "sim_ladder": ("engine", "bench/sim_ladder.py", "the investigation's decision replayed on the simulated H200",
                   SIM_DEVICE, read_sim_ladder),
    "sim_fidelity": ("whatif", "bench/sim_fidelity.py", "a profile fitted to this CPU, then simulated against "
                     "real runs in interleaved pairs", "**SIMULATED** against measured (this CPU)", read_sim_fidelity),
    "this-cpu-fitted": ("whatif", "bench/sim_fidelity.py", "the device profile that run fitted to this CPU "
                        "(an input of its SIMULATED arm)", "fitted from measured sweeps", read_device_profile),
    "sim_published": ("whatif", "bench/sim_published.py", "the cost model's predictions of published measurements "
                      "(`bench/published.csv`)", "**SIMULATED** against published", read_sim_published),
    "host_launch": ("whatif", "bench/host_launch.py", "the cost model's eager forward on the lent H200 runs, each "
                    "with its own host's miniature", "**SIMULATED** against measured (GPU runs)", read_host_launch),
    "host_cores": ("whatif", "bench/host_cores.py", "host cores needed: the same configuration pinned to 1 and 2 "
                   "cores, the 2-core throughput predicted from the 1-core run", "measured host, **SIMULATED** "
                   "device busy", read_host_cores),
    "standin_gil": ("whatif", "bench/standin_gil.py", "the stand-in's host part and the real CPU forward beside a "
                    "busy pure-Python thread: stretch, hand-offs, the other thread's pace", "measured",
                    read_standin_gil),
    "standin_gil_pipeline": ("whatif", "bench/standin_gil_pipeline.py", "offline throughput on the simulated H200 "
                             "with each form of the stand-in's host part", SIM_DEVICE, read_standin_gil_pipeline),
    "aiperf_compare": ("serving", "bench/aiperf_compare.py", "our load client and NVIDIA's AIPerf on one PyTriton "
                       "server, each set against Triton's own request duration: which client to believe", "measured",
                       read_aiperf_compare),
    "whatif_holdout": ("whatif", "bench/whatif_holdout.py", "the H200 profile fitted on one card's runs and judged "
                       "on the other cards' runs", "**SIMULATED** against measured (GPU runs)", read_whatif_holdout),
    "gpu_check": ("gpu", "bench/gpu_check.py", "on a lent GPU: eager against cuda_graph checked against fp32, the "
                  "launch budget, TF32, batch sweeps, compile, and a fitted profile's fidelity", "measured on a GPU",
                  read_gpu_check),
}

# result name -> family, where the name is not the family's own
ALIASES = {"client_ceiling_raw": "client_ceiling", "overload_host_bound": "overload", "host_cores_run2": "host_cores",
           "host_cores_run3": "host_cores", "sim_fidelity_run2": "sim_fidelity", "this-cpu-fitted_run2": "this-cpu-fitted",
           "sim_ladder_quick": "sim_ladder", "standin_gil_one_thread": "standin_gil", "threads_baseline": "threads",
           "tuner_grid": "tuner", "tuner_quick": "tuner"}

TOPICS = {
    "pipeline": "The offline pipeline and its presets",
    "serving": "Serving and load",
    "engine": "The experiment engine",
    "whatif": "The simulated device and its validation",
    "gpu": "Runs on a lent GPU",
    "other": "Other results",
}


def family_of(name: str) -> str | None:
    if name in FAMILIES:
        return name
    if name in ALIASES:
        return ALIASES[name]
    if name.startswith("gpu_check"):
        return "gpu_check"
    return None


def kind_of(family: str | None, doc: Mapping[str, Any]) -> str:
    """Measured or SIMULATED: the file's own word first (``simulated``, a simulated device), then its family's."""
    what = str(doc.get("what") or get(doc, "summary", "what") or "")
    if family is not None:
        kind = FAMILIES[family][3]
        if family == "overload" and any("device=sim" in str(k) for k in doc.get("server_knobs", [])):
            kind = SIM_DEVICE
        return kind
    if doc.get("simulated") is True or "SIMULATED" in what or get(doc, "device", "kind") == "simulated":
        return SIM
    return "measured"


def section(path: Path, results: Path = RESULTS) -> tuple[str, str, list[str], tuple[str, str, str]]:
    doc = load(path)
    name = name_of(path)
    family = family_of(name)
    topic, script, what, _, reader = FAMILIES[family] if family else ("other", None, None, None, read_generic)
    if name == "tuner_quick":
        reader = read_tuner_quick
    kind = kind_of(family, doc)
    block = machine_of(doc)
    machine = machine_text(block)
    lines = [f"### {name}", ""]
    own = doc.get("what") or get(doc, "summary", "what")
    lines.append(f"`{rel(path, results)}`" + (f", written by `{script}`" if script else "") + f". Figures: {kind}.")
    lines.append("")
    if what:
        lines += [what[0].upper() + what[1:] + ".", ""]
    if own and own != what:
        lines += [f"The file says: {own}", ""]
    lines += [machine + ".", ""]
    notes = []
    if doc.get("quick"):
        notes.append("a `--quick` run: smaller and shorter than the bench's default")
    if doc.get("previous_result_machine"):
        notes.append(f"it replaced a result from another machine ({doc['previous_result_machine']})")
    if notes:
        lines += ["Note: " + "; ".join(notes) + ".", ""]
    try:
        lines += reader(doc)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        lines += [f"(this file does not have the fields the page's reader expects: {type(exc).__name__}; its "
                  "top-level figures follow)", ""] + read_generic(doc)
    summary = (name, kind, machine_short(block))
    return topic, name, lines, summary


def render(results: Path = RESULTS) -> str:
    sections = [section(p, results) for p in result_files(results)]
    out = ["# Benchmarks", "",
           "<!-- Generated by docs/gen_benchmarks.py from bench/results; do not edit by hand: run "
           "`python docs/gen_benchmarks.py`. -->", "",
           "Every figure on this page is read from a result file under `bench/results/` by `docs/gen_benchmarks.py`; "
           "none is typed by hand. Each result says which bench wrote it, whether its figures are measured or "
           "**SIMULATED** (made on the simulated device, or predicted by its cost model), and the machine that made "
           "it as the file records it (\"machine: not recorded\" for older files that kept none). Spreads read "
           "`median [min-max], n=rounds`.", "",
           "Run a bench with `python bench/NAME.py` (`--quick` checks that it works and writes to a temporary "
           "folder, never here); then `python docs/gen_benchmarks.py` rewrites this page, and the docs test fails "
           "until it has.", ""]
    out += table(("result", "figures", "machine"),
                 ((f"[{name}](#{name.lower()})", kind, machine) for _, name, _, (_, kind, machine) in sections))
    for topic, title in TOPICS.items():
        chosen = [s for s in sections if s[0] == topic]
        if not chosen:
            continue
        out += [f"## {title}", ""]
        for _, _, lines, _ in chosen:
            out += lines
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs from a fresh generation")
    parser.add_argument("--results", type=Path, default=RESULTS, help="a results folder (default: bench/results)")
    args = parser.parse_args(argv)
    text = render(args.results.resolve())
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print("docs/benchmarks.md is out of date: run python docs/gen_benchmarks.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print("wrote docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
