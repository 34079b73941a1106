"""The main job on a user's service, end to end, measured on this machine (issue #50's "done when"):

1. ``investigate --server triton --cmd <PyTriton's python> examples/pytriton_server.py``, ``--quick``, run
   twice without ``--ready-url`` (the recipe waits on the model's own ready route): the best configuration of
   both runs, or the reason the engine called them indeterminate; no process left;
2. ``investigate --server litserve --quick`` (examples/litserve_server.py): a report, the best command line,
   no process left;
3. ``investigate --url`` on a running PyTriton server: its capacity at the target and a diagnosis that uses
   Triton's metrics;
4. ``watch --url`` on that server without ``--pid``.

    python bench/your_service.py [--runs 2] [--skip-litserve]

PyTriton runs from its own environment (tests/triton_env.py builds and caches it: it pins numpy<2). Writes
``bench/results/your_service.json``. One benchmark at a time: the two cores are the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write  # puts the repository on sys.path

from tests.helpers import running_with

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SERVER = ROOT / "examples" / "pytriton_server.py"
LIMIT = "200"


def cli(*argv: str, env: dict | None = None, timeout: float = 1800) -> tuple[int, dict, float, str]:
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "tuning", *argv, "--json"], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT, check=False)
    try:
        out = json.loads(done.stdout)
    except ValueError:
        out = {}
    return done.returncode, out, round(time.time() - t0, 1), done.stderr[-800:]


def brief(s: dict) -> dict:
    best = s.get("best") or {}
    space = list(s.get("space") or {})
    return {"best": {k: best.get(k) for k in space} if best else None, "capacity": best.get("capacity"),
            "ship": s.get("ship"), "indeterminate": s.get("indeterminate"), "target_met": s.get("target_met"),
            "confirmations": [{k: c.get(k) for k in ("candidate", "verdict", "pairs", "ratio", "low", "high")}
                              for c in s.get("confirmations") or []],
            "rows": [{k: r.get(k) for k in [*space, "qps", "throughput_ratio", "capacity", "p99_ms", "starts",
                                            "startup_s", "server_queue_ms", "server_compute_ms", "server_mean_batch",
                                            "error"]} for r in s.get("rows") or []],
            "diagnosis": {role: {"kind": (d.get("diagnosis") or {}).get("kind"), "stages": d.get("stages"),
                                 "pid_from": d.get("pid_from"), "error": d.get("error"),
                                 "metrics": (d.get("server_metrics") or {}).get("exporter")}
                          for role, d in (s.get("diagnosis") or {}).items()}}


def triton_env(home: Path) -> dict:
    return {**os.environ, "PYTRITON_HOME": str(home),
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def investigate_triton(python: Path, out: Path) -> dict:
    home = Path(tempfile.mkdtemp(prefix="pyt-"))
    code, s, seconds, err = cli("investigate", "--server", "triton", "--cmd", f"{python} {SERVER}", "--quick",
                                "--limit", LIMIT, "--out", str(out), env=triton_env(home))
    return {"exit": code, "seconds": seconds, **brief(s), "left_running": running_with([str(home), str(SERVER)]),
            "workspaces_left": len(list(home.iterdir())), "stderr_tail": err if code not in (0, 3) else None}


def investigate_litserve(out: Path) -> dict:
    code, s, seconds, err = cli("investigate", "--server", "litserve", "--quick", "--limit", LIMIT, "--out", str(out))
    return {"exit": code, "seconds": seconds, **brief(s), "left_running": running_with(["litserve_server.py"]),
            "stderr_tail": err if code not in (0, 3) else None}


def running_triton(python: Path, out: Path) -> dict:
    """A PyTriton server started here (batches of 8, a 2 ms queue delay), investigated by URL and watched
    without its pid."""
    from tuning.base.net import free_port

    port, metrics_port = free_port(), free_port()
    home = Path(tempfile.mkdtemp(prefix="pyt-"))
    proc = subprocess.Popen([str(python), str(SERVER), "--port", str(port), "--metrics-port", str(metrics_port),
                             "--max-batch-size", "8", "--max-queue-delay-us", "2000"], env=triton_env(home),
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready(f"http://127.0.0.1:{port}/v2/models/minilm/ready")
        url, metrics = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
        code, s, seconds, err = cli("investigate", "--url", url, "--api", "triton", "--model-name", "minilm",
                                    "--output-name", "embedding", "--metrics-url", metrics, "--quick",
                                    "--limit", LIMIT, "--out", str(out))
        by_url = {"exit": code, "seconds": seconds, **brief(s), "capacities": {
            c["configuration"]: c.get("capacity") for c in s.get("target_checks") or []},
            "stderr_tail": err if code not in (0, 3) else None}
        code, w, seconds, err = cli("watch", "--url", url, "--api", "triton", "--model-name", "minilm",
                                    "--output-name", "embedding", "--metrics-url", metrics, "--duration", "10",
                                    "--limit", LIMIT)
        watched = {"exit": code, "pid": w.get("pid"), "server_pid": proc.pid, "pid_from": w.get("pid_from"),
                   "kind": (w.get("diagnosis") or {}).get("kind"),
                   "reasons": (w.get("diagnosis") or {}).get("reasons"),
                   "cannot_see": (w.get("diagnosis") or {}).get("cannot_see"),
                   "metrics": (w.get("server_metrics") or {}).get("values"),
                   "qps": (w.get("load") or {}).get("qps"), "p99_ms": (w.get("load") or {}).get("p99_ms")}
    finally:
        stop_group(proc, home)
    return {"investigate_url": by_url, "watch_url": watched, "left_running": running_with([str(home), str(SERVER)])}


def stop_group(proc: subprocess.Popen, home: Path) -> None:
    """SIGTERM to the server's whole process group, SIGKILL if it outlives a minute, its PyTriton home removed."""
    import shutil
    import signal

    for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    shutil.rmtree(home, ignore_errors=True)


def ready(url: str, timeout_s: float = 300) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} never answered ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2, help="investigate --server triton runs")
    ap.add_argument("--skip-litserve", action="store_true")
    args = ap.parse_args()
    from tests.triton_env import ensure_env

    python = ensure_env()
    work = Path(tempfile.mkdtemp(prefix="your-service-"))
    out: dict = {"what": "investigate and watch on real servers started from their command lines (measured on "
                         "this machine)", "simulated": False}
    out["triton_runs"] = []
    for i in range(args.runs):
        out["triton_runs"].append(investigate_triton(python, work / f"triton{i}"))
        r = out["triton_runs"][-1]
        print(f"triton run {i + 1}: exit {r['exit']} in {r['seconds']} s, best {r['best']} at {r['capacity']} req/s, "
              f"indeterminate: {r['indeterminate']}, left running {len(r['left_running'])}", flush=True)
    bests = {json.dumps(r["best"], sort_keys=True) for r in out["triton_runs"]}
    out["triton_same_best"] = len(bests) == 1 and out["triton_runs"][0]["best"] is not None
    out["triton_indeterminate_said"] = all(r["indeterminate"] for r in out["triton_runs"])
    if not args.skip_litserve:
        out["litserve"] = investigate_litserve(work / "litserve")
        r = out["litserve"]
        print(f"litserve: exit {r['exit']} in {r['seconds']} s, ship {r['ship']}, left running {len(r['left_running'])}",
              flush=True)
    out.update(running_triton(python, work / "url"))
    print(f"investigate --url: {out['investigate_url']['capacities']}; watch --url: pid {out['watch_url']['pid']} "
          f"({out['watch_url']['pid_from']}), {out['watch_url']['kind']}", flush=True)
    write("your_service", out)


if __name__ == "__main__":
    main()
