"""A batching service with a known cost, tuned as a new user would (issue #57): the example service of
``docs/your-service.md`` (requests that arrive together share one model call, 20 ms + 2 ms a text, the event
loop blocked while it runs), its knobs ``MAX_BATCH`` and ``WAIT_MS``, measured on this machine.

1. ``investigate --cmd ... --space max_batch=... --space wait_ms=... --target-p99-ms T --quick``: what ships,
   the capacity it claims, and its wall time;
2. every configuration's capacity by holds: ``loadtest --rate R --duration S --target-p99-ms T`` at rising
   rates (each rate 1.15 x the last), from 40% of the pace its cost allows, until a hold's p99 is over the
   target; the highest hold whose p99 met it is that configuration's measured capacity (within the 15% step;
   a point estimate, the hold's verdict is kept beside it);
3. the claimed rate held again, ``--holds`` times.

Reports shipped / best (measured capacities), claimed / the shipped configuration's measured capacity, and the
holds at the claim. A hold is judged by ``capacity.hold_check`` (the batches verdict): pass, fail or not decided.

    python bench/batching_service.py [--hold-s 20] [--holds 2] [--target-p99-ms 250]

Writes ``bench/results/batching_service.json``. One benchmark at a time: the two cores are the measurement.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

from common import write  # puts the repository on sys.path
from holds import ROOT, Served, cli

SPACE = {"max_batch": (8, 32), "wait_ms": (0, 5)}  # the first values are investigate's baseline
CALL_MS, TEXT_MS = 20.0, 2.0  # the example's stand-in cost (docs/your-service.md)
BODY = ("--body", '{"input": "{text}"}')
STEP = 1.15
START = 0.4  # of the cost's pace: the first hold (HTTP handling on the same cores caps the service below that pace)


def example_service(folder: Path) -> Path:
    """The example service's code, as docs/your-service.md gives it."""
    doc = (ROOT / "docs" / "your-service.md").read_text()
    section = doc.split("\n## Your own server\n", 1)[1].split("\n## ", 1)[0]
    path = folder / "mysvc.py"
    path.write_text(section.split("```python\n", 1)[1].split("```", 1)[0])
    return path


def pace(max_batch: int) -> float:
    """Texts a second the example's cost allows with full batches (the event loop does nothing else)."""
    return max_batch / ((CALL_MS + TEXT_MS * max_batch) / 1000)


def investigate(folder: Path, target: float) -> dict:
    space = [arg for name, values in SPACE.items() for arg in ("--space", f"{name}={','.join(map(str, values))}")]
    code, s, seconds = cli("investigate", "--cmd", f"env MAX_BATCH={{max_batch}} WAIT_MS={{wait_ms}} {sys.executable} "
                           "mysvc.py {port}", *space, "--url", "http://127.0.0.1:{port}/predict", "--body",
                           '{"input": "{text}"}', "--target-p99-ms", str(target), "--quick", "--out",
                           str(folder / "out"), cwd=folder, timeout=1800)
    best = s.get("best") or {}
    return {"exit": code, "seconds": seconds, "shipped": {k: best.get(k) for k in SPACE} if best else None,
            "capacity": best.get("capacity"), "target_met": s.get("target_met"),
            "indeterminate": s.get("indeterminate"), "stderr": s.get("stderr"),
            "checks": {json.dumps({k: r.get(k) for k in SPACE}): r.get("capacity") for r in s.get("rows") or []}}


def served(script: Path, max_batch: int, wait_ms: int) -> Served:
    """One configuration of the example service, started for its holds."""
    return Served(f"python {script} {{port}}", script.parent, env={"MAX_BATCH": str(max_batch), "WAIT_MS": str(wait_ms)})


def measured_capacity(script: Path, max_batch: int, wait_ms: int, target: float, hold_s: float) -> dict:
    """Holds at rising rates from :data:`START` of the cost's pace while each one's p99 meets the target: the
    highest."""
    server = served(script, max_batch, wait_ms)
    try:
        holds, rate = [], START * pace(max_batch)
        while True:
            h = server.hold("/predict", BODY, rate, hold_s, target)
            holds.append(h)
            print(f"  max_batch={max_batch} wait_ms={wait_ms} hold at {rate:.1f}/s: {h['verdict']} (p99 {h['p99_ms']} "
                  f"ms, {h['qps']} ok/s)", flush=True)
            if not (h["p99_ms"] is not None and h["p99_ms"] <= target) or len(holds) >= 12:
                break
            rate *= STEP
    finally:
        server.close()
    passed = [h["rate"] for h in holds if h["p99_ms"] is not None and h["p99_ms"] <= target]
    return {"max_batch": max_batch, "wait_ms": wait_ms, "capacity": max(passed) if passed else None, "holds": holds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hold-s", type=float, default=20.0)
    ap.add_argument("--holds", type=int, default=2, help="holds at the claimed rate")
    ap.add_argument("--target-p99-ms", type=float, default=250.0)
    args = ap.parse_args()
    t0 = time.time()
    target = args.target_p99_ms
    folder = Path(tempfile.mkdtemp(prefix="batching-"))
    script = example_service(folder)
    run = investigate(folder, target)
    print(f"investigate: shipped {run['shipped']} at {run['capacity']} texts/s in {run['seconds']} s", flush=True)
    capacities = [measured_capacity(script, b, w, target, args.hold_s) for b, w in itertools.product(*SPACE.values())]
    best = max((c["capacity"] or 0.0) for c in capacities)
    shipped = next((c for c in capacities if run["shipped"] and all(str(c[k]) == str(run["shipped"][k]) for k in SPACE)),
                   None)
    at_claim = []
    if shipped is not None and run["capacity"]:
        server = served(script, shipped["max_batch"], shipped["wait_ms"])
        try:
            at_claim = [server.hold("/predict", BODY, run["capacity"], args.hold_s, target) for _ in range(args.holds)]
        finally:
            server.close()
    out = {"what": "the example batching service of docs/your-service.md on this machine: investigate --cmd's "
                   "claim against holds (loadtest --target-p99-ms) at rising rates; MEASURED, not simulated",
           "simulated": False, "target_p99_ms": target, "hold_s": args.hold_s, "step": STEP, "space": SPACE,
           "investigate": run, "capacities": capacities, "best_measured": best,
           "shipped_over_best": round((shipped["capacity"] or 0) / best, 3) if shipped and best else None,
           "claimed_over_shipped_measured": (round(run["capacity"] / shipped["capacity"], 3)
                                             if shipped and shipped["capacity"] and run["capacity"] else None),
           "holds_at_claim": at_claim, "wall_s": round(time.time() - t0, 1)}
    print(json.dumps({k: out[k] for k in ("best_measured", "shipped_over_best", "claimed_over_shipped_measured")}))
    write("batching_service", out)


if __name__ == "__main__":
    main()
