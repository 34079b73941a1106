"""The claim held on a real server (issue #57, item 7): ``investigate --server NAME --quick`` as a user runs it
(its own holds of the claim included: ``--verify``, 60 s in quick mode), then its shipped configuration's server
held open-loop at the capacity it shipped, ``--holds`` times for
``--hold-s`` seconds each (``loadtest --target-p99-ms``, the batches verdict of ``capacity.hold_check``), then
held for ``--probe-s`` at multiples of the claim, up (``ABOVE``) while the holds at the claim met the target,
down (``BELOW``) while they did not, until the verdict changes: how far the claim is from the rate where the
target breaks. ``--ladder-only`` runs that ladder again from a written result.

    python bench/hold_claims.py [--server litserve] [--holds 5] [--hold-s 180] [--target-p99-ms 800]

Writes ``bench/results/hold_claims_<server>.json`` (MEASURED). The client and the server share this machine's
cores; one benchmark at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from common import RESULTS, write  # puts the repository on sys.path
from holds import ROOT, Served, cli

from tuning.experiments.defaults import DEFAULT_TARGET_P99_MS
from tuning.load.servers import RECIPES

ABOVE = (1.1, 1.2, 1.35, 1.5, 1.75, 2.0)  # multiples of the claim held after the holds at it, while they meet it...
BELOW = (0.9, 0.8, 0.7, 0.6, 0.5)  # ...or, where most holds at the claim missed it, below it until one meets it


def server_command(server: str) -> str | None:
    """The base command where the recipe's ``python`` is not the one that can run it: PyTriton lives in its own
    environment (it pins numpy<2), whose workspaces go in a short folder (socket paths are short)."""
    if server != "triton":
        return None
    from tests.triton_env import ensure_env

    os.environ.setdefault("PYTRITON_HOME", tempfile.mkdtemp(prefix="pyt-"))
    os.environ["PYTHONPATH"] = str(ROOT)
    return f"{ensure_env()} examples/pytriton_server.py"  # the environment's interpreter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", default="litserve", choices=["litserve", "triton"],
                    help="triton: PyTriton from the tests' own cached environment (tests/triton_env.py)")
    ap.add_argument("--holds", type=int, default=5)
    ap.add_argument("--hold-s", type=float, default=180.0)
    ap.add_argument("--probe-s", type=float, default=60.0)
    ap.add_argument("--target-p99-ms", type=float, default=DEFAULT_TARGET_P99_MS)
    ap.add_argument("--ladder-only", action="store_true",
                    help="keep the investigation and the holds at the claim of bench/results/hold_claims_<server>.json "
                         "and run the ladder from them again (its server started afresh)")
    args = ap.parse_args()
    t0 = time.time()
    recipe = RECIPES[args.server]
    previous = json.loads((RESULTS / f"hold_claims_{args.server}.json").read_text()) if args.ladder_only else None
    if previous is not None:
        run = previous["investigate"]
        code, seconds, claim, ship, unit = run["exit"], run["seconds"], run["capacity"], run["ship"], run["unit"]
        stderr, verified, checked = run.get("stderr"), run.get("verified"), run.get("target_check_capacity")
    else:
        out_dir = Path(tempfile.mkdtemp(prefix=f"hold-claims-{args.server}-"))
        own = server_command(args.server)
        code, s, seconds = cli("investigate", "--server", args.server, *(("--cmd", own) if own else ()), "--quick",
                               "--target-p99-ms", str(args.target_p99_ms), "--out", str(out_dir), cwd=ROOT,
                               timeout=3600)
        best = s.get("best") or {}
        # what ships is the rate the run held (--verify, stage 5), else its target check's claim
        verified, checked = s.get("verified"), best.get("capacity")
        claim = s.get("capacity") if "capacity" in s else checked
        ship, stderr = s.get("ship"), s.get("stderr") or s.get("error")
        unit = "texts/s" if (s.get("service") or {}).get("texts_per_s") else "req/s"
        bursts = next((c.get("bursts") for c in s.get("target_checks") or []
                       if isinstance(c, dict) and c.get("capacity") == checked), None)
    print(f"investigate --server {args.server}: exit {code} in {seconds} s; ship {ship!r} claiming {claim}", flush=True)
    api_flags = ["--api", recipe.api, *[f for k, v in recipe.api_options.items()
                                        for f in (f"--{k.replace('_', '-')}", str(v))]]
    path = urlsplit(recipe.url.replace("{port}", "1")).path or "/"
    ready = (urlsplit(recipe.ready_url.replace("{port}", "1")).path.replace(
        "{model_name}", str(recipe.api_options.get("model_name", ""))) if recipe.ready_url else None)
    at_claim = previous["holds_at_claim"] if previous is not None else []
    bursts = previous.get("bursts") if previous is not None else bursts
    ladder: list[dict] = []
    if claim and ship:
        server = Served(ship, ROOT, ready_path=ready)
        try:
            while previous is None and len(at_claim) < args.holds:
                h = server.hold(path, api_flags, claim, args.hold_s, args.target_p99_ms)
                at_claim.append(h)
                print(f"  hold {len(at_claim)} at the claim {claim:.1f}/s: {h['verdict']}, p99 {h['p99_ms']} ms, "
                      f"{h['qps']} ok/s", flush=True)
            held = 2 * sum(h["met"] for h in at_claim) > len(at_claim)
            for m in ABOVE if held else BELOW:
                h = {"multiple": m, **server.hold(path, api_flags, m * claim, args.probe_s, args.target_p99_ms)}
                ladder.append(h)
                print(f"  {m} x the claim, {m * claim:.1f}/s: {h['verdict']}, p99 {h['p99_ms']} ms, {h['qps']} ok/s",
                      flush=True)
                if h["met"] != held:
                    break
        finally:
            server.close()
    met = [h["multiple"] for h in ladder if h["met"]] + ([1.0] if at_claim and 2 * sum(h["met"] for h in at_claim)
                                                           > len(at_claim) else [])
    out = {"what": f"investigate --server {args.server} --quick's shipped capacity (the rate its own --verify holds "
                   "held, from its target check's claim) held open-loop on the real server: "
                   f"{args.holds} holds of {args.hold_s:.0f} s at the claim, then {args.probe_s:.0f}-s holds at "
                   "multiples of it, up while the holds at the claim met the p99 target (down while they did not), "
                   "until the verdict changed; MEASURED, not simulated",
           "simulated": False, "server": args.server, "target_p99_ms": args.target_p99_ms,
           "investigate": {"exit": code, "seconds": seconds, "ship": ship, "capacity": claim, "unit": unit,
                           "target_check_capacity": checked, "verified": verified, "stderr": stderr},
           "bursts": bursts, "holds_at_claim": at_claim, "met_at_claim": sum(h["met"] for h in at_claim),
           "ladder": ladder, "highest_met_multiple": max(met, default=None),
           "wall_s": round(time.time() - t0 + (previous["wall_s"] if previous is not None else 0.0), 1)}
    print({k: out[k] for k in ("met_at_claim", "highest_met_multiple")})
    write(f"hold_claims_{args.server}", out)


if __name__ == "__main__":
    main()
