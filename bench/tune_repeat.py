"""``tune`` run twice over the same real service: does it ship the same configuration both times?

The LitServe app of the tests (``tests/apps/litserve_minilm.py``: MiniLM behind LitServe's dynamic batcher),
``max_batch_size`` 1/8 x ``batch_timeout`` 0.002/0.02 s, p99 <= 1,000 ms, ``--quick``, run ``--runs`` times
one after the other on this machine. Per run: the configuration shipped, its capacity, the confirmation, and
whether the engine called the two best indeterminate. The verdict: the same best every time, or
"indeterminate" said only where the two best are within the minimum effect; capacities within 15%.

    python bench/tune_repeat.py [--runs 2] [--quick-check]

Writes ``bench/results/tune_repeat.json``. Measured, not simulated: the service runs on this CPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import write

APP = Path(__file__).resolve().parents[1] / "tests" / "apps" / "litserve_minilm.py"


def one_run(limit: int) -> dict:
    cmd = [sys.executable, "-m", "tuning", "tune", "--cmd",
           f"{sys.executable} {APP} --port {{port}} --max-batch-size {{batch}} --batch-timeout {{timeout}}",
           "--space", "batch=1,8", "--space", "timeout=0.002,0.02", "--url", "http://127.0.0.1:{port}/predict",
           "--body", '{"input": "{text}"}', "--target-p99-ms", "1000", "--quick", "--limit", str(limit),
           "--startup-timeout", "240", "--json"]
    t0 = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    s = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    best = s.get("best") or {}
    return {"exit": done.returncode, "seconds": round(time.time() - t0, 1),
            "best": {k: best.get(k) for k in ("batch", "timeout")} if best else None,
            "capacity": best.get("capacity"), "indeterminate": s.get("indeterminate"),
            "confirmations": s.get("confirmations"),
            "rows": [{k: r.get(k) for k in ("batch", "timeout", "qps", "throughput_ratio", "low", "high", "capacity")}
                     for r in s.get("rows") or []],
            "stderr_tail": done.stderr[-600:] if done.returncode not in (0, 3) else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--limit", type=int, default=200, help="records sent (the data's first lines)")
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        runs.append(one_run(args.limit))
        r = runs[-1]
        print(f"run {i + 1}: best {r['best']} at {r['capacity']} req/s in {r['seconds']} s; indeterminate: "
              f"{r['indeterminate']}", flush=True)
    bests = [json.dumps(r["best"], sort_keys=True) for r in runs]
    caps = [r["capacity"] for r in runs if r["capacity"]]
    same = len(set(bests)) == 1 and runs[0]["best"] is not None
    told = all(r["indeterminate"] for r in runs)
    spread = max(caps) / min(caps) if len(caps) == len(runs) and caps else None
    out = {"what": "tune twice over the LitServe MiniLM app (measured on this machine)", "simulated": False,
           "runs": runs, "same_best": same, "indeterminate_said": told,
           "capacity_max_over_min": round(spread, 3) if spread else None,
           "verdict": bool((same or told) and spread is not None and spread <= 1.15)}
    print(f"same best: {same}; indeterminate said in every run: {told}; capacities max/min {out['capacity_max_over_min']}"
          f"; verdict {out['verdict']}")
    write("tune_repeat", out)


if __name__ == "__main__":
    main()
