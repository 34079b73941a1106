"""Which load client to believe: ours (``loadtest --api kserve``) and NVIDIA's AIPerf on one PyTriton server, set
against the server's own request duration from Triton's metrics (issue #50, item 8).

One server for the whole bench (``examples/pytriton_server.py``: the shipped MiniLM on the CPU behind Triton's
dynamic batcher) in PyTriton's own environment (``tests/triton_env.py``). Each round runs our client (the
engine behind ``python -m tuning loadtest``, in this process, as the command runs it) and AIPerf (its own
venv; ``--endpoint-type template`` with a KServe v2 body and ``response_field:outputs[0].data``, the shipped
tokenizer) as closed loops at the same concurrency over the same texts, same warm-up and window, interleaved
ABBA. Triton's ``/metrics`` gives the server's mean request duration (``nv_inference_request_duration_us /
nv_inference_request_success``) with its queue and compute parts, scraped before and after each run (the server
idle at both), so over every request the run sent; the client's mean over the same requests comes from
AIPerf's per-request records (its warm-up included) and from our run's in-flight series (a point at every
send and answer, warm-up and cool-down included). A client's mean
latency minus the server's duration is what the client and the network add (the overhead); the client whose
overhead is smaller and steadier over the rounds is the one to believe. The same server and machine serve
both, so a difference in overhead is the clients' own. The requests the server held on average (its summed
request time over the span, Little's law) show how much of the asked concurrency each client delivered.

Per round, ratios ours/AIPerf of QPS, p50 and p99 (each tool's own figures), and each tool's overhead; the
figures are medians with their spread over the rounds. AIPerf counts the requests still in flight when its
duration ends (its grace period) in its window, where ours stops its window at the duration: its QPS is also
recomputed from its per-request records over the requests that ended within the duration, to separate the
window definition from the client.

    python bench/aiperf_compare.py            # writes bench/results/aiperf_compare.json
    python bench/aiperf_compare.py --quick    # a short smoke run; writes to a temporary folder

The AIPerf venv is built once (several minutes: ``pip install aiperf``) under ``~/.cache/tuning-bench``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import check_rounds, fmt_spread, interleave, paired_ratio, spread, write

from tuning.base.net import free_port

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "examples" / "pytriton_server.py"
AIPERF_REQUIREMENTS = ("aiperf==0.13.0",)
AIPERF_CACHE = Path(os.environ.get("TUNING_BENCH_CACHE") or Path.home() / ".cache" / "tuning-bench")
MODEL = "minilm"
KSERVE_BODY = ('{"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", '
               '"data": [{{ text|tojson }}]}]}')  # AIPerf's Jinja2 template: one text per request, as ours sends
TRITON_COUNTERS = ("nv_inference_request_success", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                   "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                   "nv_inference_compute_output_duration_us", "nv_inference_count", "nv_inference_exec_count")


def main() -> None:
    args = parse_args()
    check_rounds(args.rounds, args.quick)
    aiperf = aiperf_python()
    from tests.triton_env import ensure_env

    work = Path(tempfile.mkdtemp(prefix="aiperf-compare-"))
    texts = write_texts(work / "texts.jsonl", args.limit)
    template = work / "kserve.json"
    template.write_text(KSERVE_BODY)
    started = time.perf_counter()
    try:
        with pytriton(ensure_env(), args) as (url, metrics):
            run_ours(url, metrics, texts, args, warm=True)  # the server's first batches (allocations) in no round
            arms = {"ours": lambda: run_ours(url, metrics, texts, args),
                    "aiperf": lambda: run_aiperf(aiperf, url, metrics, template, work, args)}
            runs = interleave(arms, args.rounds, report_run)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = compare(runs)
    print_table(result, args)
    write("aiperf_compare", {"method": __doc__.split("\n\n")[1].replace("\n", " "), "settings": vars(args),
                             "aiperf_requirements": list(AIPERF_REQUIREMENTS), "wall_s": round(time.perf_counter() - started),
                             **result, "runs": runs}, quick=args.quick)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run (results not comparable)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (each runs both clients)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight (both clients)")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per run (both clients)")
    p.add_argument("--max-batch-size", type=int, default=8, help="the server's dynamic batcher: largest batch")
    p.add_argument("--max-queue-delay-us", type=int, default=2000, help="the server's dynamic batcher: queue delay")
    p.add_argument("--limit", type=int, default=None, help="only the first N records' texts")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 4.0, 1.0
    return args


# --- AIPerf's environment ------------------------------------------------------------------------------------


def aiperf_python() -> Path:
    """The interpreter of AIPerf's own venv (its numpy, transformers and pydantic pins stay out of ours), built
    when missing or broken, like PyTriton's in ``tests/triton_env.py``."""
    key = json.dumps({"requirements": AIPERF_REQUIREMENTS, "python": sys.version})
    folder = AIPERF_CACHE / f"aiperf-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    python, marker = folder / "bin" / "python", folder / "built.json"
    if marker.is_file() and subprocess.run([str(python), "-c", "import aiperf"], capture_output=True).returncode == 0:
        return python
    shutil.rmtree(folder, ignore_errors=True)
    print(f"building AIPerf's venv in {folder} (pip install {' '.join(AIPERF_REQUIREMENTS)}) ...", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *AIPERF_REQUIREMENTS], check=True)
    marker.write_text(json.dumps({"requirements": list(AIPERF_REQUIREMENTS),
                                  "build_s": round(time.perf_counter() - t0, 1)}))
    return python


# --- the server and its metrics --------------------------------------------------------------------------------


@contextlib.contextmanager
def pytriton(python: Path, args: argparse.Namespace):
    """The example server on free ports in its own process group; ``(url, metrics_url)`` once ready; stopped
    with SIGTERM (its own clean-up) and its group killed if anything is left."""
    port, metrics_port = free_port(), free_port()
    home = Path(tempfile.mkdtemp(prefix="pyt-"))  # short: PyTriton's Unix sockets go in it
    env = {**os.environ, "PYTRITON_HOME": str(home), "PYTHONPATH": str(ROOT)}
    log = open(home.parent / f"{home.name}.log", "wb")
    proc = subprocess.Popen([str(python), str(SERVER), "--port", str(port), "--metrics-port", str(metrics_port),
                             "--max-batch-size", str(args.max_batch_size), "--max-queue-delay-us",
                             str(args.max_queue_delay_us)], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/v2/models/{MODEL}/ready", proc, Path(log.name))
        yield url, f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        os.unlink(log.name)
        shutil.rmtree(home, ignore_errors=True)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise SystemExit(f"the PyTriton server did not come up:\n{log.read_text(errors='replace')[-3000:]}")


def triton_counters(metrics_url: str) -> dict[str, float]:
    """Triton's cumulative counters for the model now."""
    from tuning.load.scrape import scrape

    samples, reason = scrape(metrics_url)
    if samples is None:
        raise SystemExit(f"cannot scrape Triton's metrics: {reason}")
    return counters(samples)


def counters(samples: dict[str, float]) -> dict[str, float]:
    """The counters read here, from a parsed scrape (summed over label sets)."""
    return {name: samples.get(name, 0.0) for name in TRITON_COUNTERS}


def server_side(before: dict[str, float], after: dict[str, float], span_s: float) -> dict[str, float | None]:
    """The server's own view of the requests between two scrapes: count, mean request duration and its queue and
    compute parts (ms), the mean batch of its model calls, and the requests it held on average over ``span_s``
    (its summed request time over the span, Little's law): a client that keeps C in flight shows C here less
    the time its requests spend outside the server."""
    d = {name: after[name] - before[name] for name in TRITON_COUNTERS}
    n = d["nv_inference_request_success"]
    if n <= 0:
        return {"requests": 0, "request_ms": None, "queue_ms": None, "compute_ms": None, "mean_batch": None,
                "held_concurrency": None}
    compute = sum(d[f"nv_inference_compute_{part}_duration_us"] for part in ("input", "infer", "output"))
    return {"requests": int(n), "request_ms": d["nv_inference_request_duration_us"] / n / 1000,
            "queue_ms": d["nv_inference_queue_duration_us"] / n / 1000, "compute_ms": compute / n / 1000,
            "mean_batch": d["nv_inference_count"] / d["nv_inference_exec_count"] if d["nv_inference_exec_count"] else None,
            "held_concurrency": d["nv_inference_request_duration_us"] / 1e6 / span_s if span_s > 0 else None}


# --- the two clients --------------------------------------------------------------------------------------------


def write_texts(path: Path, limit: int | None) -> list[str]:
    """The shipped records as the texts both clients send (our formatter), one JSON line each for AIPerf's
    ``single_turn`` dataset."""
    from tuning.inputs.readers import load_texts

    texts = load_texts(limit=limit)
    with open(path, "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    return texts


def run_ours(url: str, metrics_url: str, texts: list[str], args: argparse.Namespace, warm: bool = False) -> dict:
    """One closed-loop run of our engine, as ``loadtest --url URL --api kserve --model-name minilm
    --output-name embedding --concurrency C --duration D --warmup 0 --warmup-s W`` runs it; the scrapes around
    it (the server idle at both) count every request it sent, warm-up and cool-down included."""
    from tuning.load.apis import Api
    from tuning.load.generator import run_load

    api = Api("kserve", model_name=MODEL, output_name="embedding")
    before = triton_counters(metrics_url)
    result = run_load(api.url(url), api.encode(texts), concurrency=args.concurrency,
                      duration_s=2.0 if warm else args.duration, warmup_s=args.warmup, api=api)
    after = triton_counters(metrics_url)
    s = result.summary()
    latencies = result.latencies_ms()
    in_flight_s, sent, span_s = in_flight_integral(result.inflight)
    return {"qps": s["qps"], "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"], "mean_ms": statistics.fmean(latencies),
            "requests": len(latencies), "errors": s["errors"] + s["timeouts"], "window_s": s["window_s"],
            "client_cores": s["client_cpu"], "matched_mean_ms": in_flight_s / sent * 1000, "matched_requests": sent,
            "matched": "every request of the run (warm-up and cool-down included), from the in-flight series",
            "client_held_concurrency": in_flight_s / span_s, "server": server_side(before, after, span_s)}


def in_flight_integral(series: list[tuple[float, int]]) -> tuple[float, int, float]:
    """From the run's in-flight series (a point at every send and every answer, all phases): the summed time of
    every request in flight (seconds), the number of requests, and the span from the first send to the last
    answer."""
    area = sum(n * (t_next - t) for (t, n), (t_next, _) in zip(series, series[1:]))
    answers = sum(1 for (_, n), (_, n_prev) in zip(series[1:], series) if n < n_prev)
    return area, answers, series[-1][0] - series[0][0]


def run_aiperf(python: Path, url: str, metrics_url: str, template: Path, work: Path, args: argparse.Namespace) -> dict:
    """One AIPerf ``profile`` run at fixed concurrency; its own summary figures, its throughput recomputed over the
    requests that ended within the duration, and the CPU its processes used."""
    from tuning.base.assets import embedded_model_dir

    out = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    argv = [str(python), "-m", "aiperf", "profile", "--model", MODEL, "--url", url, "--endpoint-type", "template",
            "--endpoint", f"/v2/models/{MODEL}/infer", "--extra-inputs", f"payload_template:{template}",
            "--extra-inputs", "response_field:outputs[0].data", "--tokenizer", str(embedded_model_dir()),
            "--input-file", str(work / "texts.jsonl"), "--custom-dataset-type", "single_turn",
            "--concurrency", str(args.concurrency), "--benchmark-duration", str(args.duration),
            "--warmup-duration", str(args.warmup), "--random-seed", "0", "--ui-type", "none", "--no-server-metrics",
            "--no-gpu-telemetry", "--output-artifact-dir", str(out)]
    before, cpu0 = triton_counters(metrics_url), _children_cpu_s()
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=out)
    wall, cpu = time.perf_counter() - t0, _children_cpu_s() - cpu0
    after = triton_counters(metrics_url)
    if done.returncode != 0:
        raise SystemExit(f"aiperf failed ({done.returncode}):\n{(done.stderr or done.stdout)[-3000:]}")
    figures, span_s = aiperf_figures(out, args.duration)
    return {**figures, "server": server_side(before, after, span_s), "process_wall_s": round(wall, 1),
            "process_cpu_s": round(cpu, 1)}


def aiperf_figures(out: Path, duration_s: float) -> tuple[dict, float]:
    """AIPerf's own summary (its measured phase), and from its per-request records: the throughput over the requests
    that ended within the duration, and the mean latency over every request of the run (warm-up included), which
    are the requests the scrapes around the run count; with the span those requests took."""
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    lat = summary["request_latency"]
    records = [json.loads(line) for line in (out / "profile_export.jsonl").read_text().splitlines() if line.strip()]
    measured = [r for r in records if r["metadata"].get("benchmark_phase") == "profiling"]
    start = min(r["metadata"]["request_start_ns"] for r in measured)
    ended_in_window = sum(r["metadata"]["request_end_ns"] <= start + duration_s * 1e9 for r in measured)
    every = [r["metrics"]["request_latency"]["value"] for r in records if "request_latency" in r.get("metrics", {})]
    span_ns = max(r["metadata"]["request_end_ns"] for r in records) - min(r["metadata"]["request_start_ns"] for r in records)
    span_s = span_ns / 1e9
    return {"qps": summary["request_throughput"]["avg"], "p50_ms": lat["p50"], "p99_ms": lat["p99"],
            "mean_ms": lat["avg"], "requests": int(lat["count"]), "errors": sum(1 for r in measured if r.get("error")),
            "window_s": summary["benchmark_duration"]["avg"], "qps_within_duration": ended_in_window / duration_s,
            "effective_concurrency": (summary.get("effective_concurrency") or {}).get("avg"),
            "matched_mean_ms": statistics.fmean(every), "matched": "every request of the run (warm-up included)",
            "matched_requests": len(every), "client_held_concurrency": sum(every) / 1000 / span_s}, span_s


def _children_cpu_s() -> float:
    """CPU seconds of this process's reaped descendants (AIPerf's processes, once its run has ended)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def report_run(r: int, name: str, v: dict) -> None:
    server = v["server"]
    print(f"round {r} {name:6s}: {v['qps']:.1f} QPS, p50 {v['p50_ms']:.0f} ms, p99 {v['p99_ms']:.0f} ms, mean "
          f"{v['mean_ms']:.0f} ms; server {server['request_ms']:.0f} ms (queue {server['queue_ms']:.0f}, compute "
          f"{server['compute_ms']:.0f}, batch {server['mean_batch']:.2f}, held {server['held_concurrency']:.2f} of "
          f"the client's {v['client_held_concurrency']:.2f}); "
          f"overhead {v['matched_mean_ms'] - server['request_ms']:.1f} ms; {v['requests']} requests, {v['errors']} "
          "errors", flush=True)


# --- the comparison ---------------------------------------------------------------------------------------------


def compare(runs: dict[str, list[dict]]) -> dict:
    """Per-round ratios ours/AIPerf and each tool's overhead over the server's mean request duration."""
    ours, theirs = runs["ours"], runs["aiperf"]
    overhead = {name: spread([r["matched_mean_ms"] - r["server"]["request_ms"] for r in rs]) for name, rs in runs.items()}
    share = {name: spread([(r["matched_mean_ms"] - r["server"]["request_ms"]) / r["matched_mean_ms"] for r in rs])
             for name, rs in runs.items()}
    ratios = {key: paired_ratio([r[key] for r in ours], [r[key] for r in theirs])
              for key in ("qps", "p50_ms", "p99_ms", "mean_ms")}
    ratios["qps_vs_aiperf_within_duration"] = paired_ratio([r["qps"] for r in ours],
                                                           [r["qps_within_duration"] for r in theirs])
    ratios["server_request_ms"] = paired_ratio([r["server"]["request_ms"] for r in ours],
                                               [r["server"]["request_ms"] for r in theirs])
    steadier = min(overhead, key=lambda n: (overhead[n]["max"] - overhead[n]["min"]))
    smaller = min(overhead, key=lambda n: abs(overhead[n]["median"]))
    return {"ratios_ours_over_aiperf": ratios, "overhead_ms": overhead, "overhead_share_of_latency": share,
            "server_request_ms": {n: spread([r["server"]["request_ms"] for r in rs]) for n, rs in runs.items()},
            "server_held_concurrency": {n: spread([r["server"]["held_concurrency"] for r in rs]) for n, rs in runs.items()},
            "client_held_concurrency": {n: spread([r["client_held_concurrency"] for r in rs]) for n, rs in runs.items()},
            "server_mean_batch": {n: spread([r["server"]["mean_batch"] for r in rs]) for n, rs in runs.items()},
            "smaller_overhead": smaller, "steadier_overhead": steadier,
            "believe": smaller if smaller == steadier else None}


def print_table(result: dict, args: argparse.Namespace) -> None:
    print(f"\nours vs AIPerf at concurrency {args.concurrency}, {args.rounds} interleaved rounds of {args.duration:.0f} s "
          f"(median [min-max] over the rounds)")
    for key, s in result["ratios_ours_over_aiperf"].items():
        print(f"  ratio ours/AIPerf {key:32s} {fmt_spread(s)}")
    for name in ("ours", "aiperf"):
        print(f"  {name:6s} overhead over the server's request duration, ms  {fmt_spread(result['overhead_ms'][name], 1)}"
              f"   server {fmt_spread(result['server_request_ms'][name], 0)} ms")
        print(f"  {name:6s} in flight: client {fmt_spread(result['client_held_concurrency'][name])}, server "
              f"{fmt_spread(result['server_held_concurrency'][name])}; server batch "
              f"{fmt_spread(result['server_mean_batch'][name])}")
    verdict = result["believe"] or "neither clearly (the smaller overhead is not the steadier one)"
    print(f"  smaller overhead: {result['smaller_overhead']}; steadier: {result['steadier_overhead']}; believe: {verdict}")


if __name__ == "__main__":
    main()
