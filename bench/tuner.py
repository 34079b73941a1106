"""The tuner checked against an exhaustive grid: does the ladder ship (close to) the best configuration?

On the simulated device, every cell of a grid (``batch_size`` x ``max_wait_ms`` x length buckets on/off,
from the ladder's likely end state: fast tokenizer, bf16, the ladder's loader workers, pinned copies,
eager) gets its capacity at a p99 target (:func:`tuning.experiments.capacity.capacity_at_target`: the
highest Poisson rate whose open-loop p99, every outcome counted, stays within the target), bracketed from
that cell's own closed-loop completion rate. Then the ladder (:func:`tuning.experiments.ladder.run_ladder`)
walks from ``baseline`` on the same device, and the configuration it ships is measured again with the
grid's capacity settings (the ladder's own figure comes from its own search, so it is reported beside, not
used). Everything shares one :class:`~tuning.experiments.measure.LoadMeasure`: the same requests in the
same order, the same arrival seed, the load from a separate process. The grid's cells and the
re-measurement run in a shuffled order (seeded), the re-measurement in the middle, so that a drift of this
shared machine falls on no one arm alone.

Figures (``bench/results/tuner.json``): each cell's capacity, bracket, probes and load tests; the grid's
best over its worst (``grid_best_over_worst``, at least 1.5: a grid that discriminates); the shipped
configuration's capacity over the grid's best (``ladder_over_grid_best``, target >= 0.95); the load tests
the grid used in all and the ladder's (its search's cost against the grid's).

**The head-to-head.** The grid's best is the highest of 24 single searches and is chosen on that figure, so
the figure is biased up (the winner's curse: the top cells sit within a search's noise of each other, and
the last full run's top five were 694-725 req/s). After the grid, the best cell and the shipped
configuration are searched again, alternately (ABBA then BAAB, the mirror for an odd seed; ``--head-to-head
N`` searches each, default 4: two blocks), and ``ladder_over_grid_best`` is the ratio of the means of those
searches, with the ratio of each pair beside it. The verdict (``ladder_meets_target_ratio``) is None,
undecided, with fewer than two blocks or when any of those searches' top was the client's (late sends) or
never probed (the closed loop's rate): each is then a lower bound. The biased figure (the shipped
configuration's search over the best cell's grid figure) is kept as ``ladder_over_grid_best_selected``.
If the ladder shipped the best cell itself the ratio is 1 and the searches show the noise.

**The device profile.** ``l4-estimate`` as shipped does not make the device the limit on this 2-core
host: closed loops of the grid's corners (batch 1/8/64, buckets on/off, 32 clients, 3 s windows) kept the
simulated device 11-21% busy; the host pipeline (tokenizing, batching, the load process) limits every
cell, and a grid would rank host noise, not the tuner's device-side choices. So the default profile is
``l4-estimate`` slowed 10x (``--slowdown 10``): its FLOP/s and memory bandwidth divided by 10, its host
costs (kernel launches, graph replay, copies) kept. There the same closed loops kept the device 68-86%
busy, and the grid's own closed loops (64 clients) 87-98%: the device limits, and dynamic padding (a batch
padded to its longest request, up to 256 tokens against a median of 85) costs it about twice the work of
the planned buckets, which is what the grid has to tell apart. That profile is synthetic (no card's
datasheet), written to a temporary JSON file per run and recorded in the result (``profile``);
``--slowdown 1`` measures ``l4-estimate`` itself, ``--profile`` takes another shipped profile or a JSON
path. ``graph`` stays ``eager`` in every cell: ``cuda_graph`` needs fixed shapes (no dynamic-padding cell
could have it) and pads each batch to the captured batch size, which on this device cut closed-loop QPS
1.4x (batch 8) to 10x (batch 64); the ladder's own graph step judges it again.

**A shared machine.** A probe whose load client fell behind its schedule (more than 1% of sends over 10 ms
late) fails by "late sends": it measured the client, not the server. On 2 cores that the server, the load
process and other work share (this script runs under ``nice``) that happens often, at rates the server
meets too, so a cell whose bracket's top failed that way has a capacity that is only a lower bound
(``client_limited``; ``top_failed_by`` says why each top failed: the count, the knee, errors, late sends, or
the closed loop's rate, never probed). Each such configuration (and each that met the target at no rate) is
searched once more after the first pass, in the same order: a server-decided retry replaces the first
search, else the higher of the two lower bounds stands; both are kept (``attempts``) and counted. The
discrimination verdict reads a lower bound: the best cell over the worst of the cells whose bracket the
server decided (``grid_best_over_worst_server_decided``); the raw best over worst is beside it. Each
search records the cores other processes kept busy meanwhile (``other_processes_cores``). Capacities move
with this machine's state (a configuration searched twice here differed by up to 2x): compare figures of
one run, and read a ratio far from the target (the ladder's shipped configuration at a third to a fifth of
the grid's best in the runs here) as a finding, one near it as noise until repeated.

Every figure is SIMULATED: the host side is measured here, the device time predicted by the cost model.

    python bench/tuner.py             # 4 x 3 x 2 = 24 cells, retries, the full ladder, the head-to-head: about 55 minutes
    python bench/tuner.py --quick     # 2 x 2 x 2 = 8 cells, shorter windows, the quick ladder: under 8 minutes
    python bench/tuner.py --grid-from bench/results/tuner_grid.json   # the ladder and the head-to-head: 26 minutes

``--grid-from`` reuses an earlier run's grid (refused unless its profile, slowdown, target, mode and cells
match): the ladder runs, then the head-to-head; the ratio is of this run's searches, never across runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from common import write

from tuning.base.assets import device_profile_path
from tuning.base.format import fixed, rounded
from tuning.experiments.capacity import Capacity, CapacitySettings, capacity_at_target
from tuning.experiments.ladder import (
    LadderSettings,
    change_text,
    input_texts,
    load_inputs,
    plan_for,
    run_ladder,
    token_lengths,
)
from tuning.experiments.measure import LoadMeasure
from tuning.knobs import Knobs, preset

TARGET_P99_MS = 200.0
MIN_DISCRIMINATION = 1.5  # the grid's best over its worst: below this the grid does not tell configurations apart
TARGET_RATIO = 0.95  # the ladder's shipped configuration over the grid's best
GRIDS = {  # (batch sizes, max waits in ms); buckets on and off for each
    "full": ((8, 16, 32, 64), (2.0, 5.0, 20.0)),
    "quick": ((8, 32), (2.0, 20.0)),
}


def slowed_profile(name: str, slowdown: float, folder: Path) -> tuple[str, dict[str, Any]]:
    """``name``'s profile with its device rates (FLOP/s, memory bandwidth) divided by ``slowdown`` and its host
    costs kept, written to ``folder``; returns the ``sim_profile`` knob (a name or that file) and the profile."""
    raw = json.loads(device_profile_path(name).read_text())
    if slowdown == 1:
        return name, raw
    raw = {**raw, "name": f"{raw['name']}-slowed-{slowdown:g}x",
           "peak_flops": {k: v / slowdown for k, v in raw["peak_flops"].items()},
           "mem_bandwidth": raw["mem_bandwidth"] / slowdown,
           "description": (f"SYNTHETIC: {raw['name']} with its FLOP/s and memory bandwidth divided by {slowdown:g} "
                           f"(host costs kept) so that the device, not the host, limits some configurations; from: "
                           f"{raw['description']}")}
    raw["sources"] = {**raw.get("sources", {}), "slowdown": f"bench/tuner.py --slowdown {slowdown:g}: not a datasheet"}
    path = folder / f"{raw['name']}.json"
    path.write_text(json.dumps(raw, indent=2))
    return str(path), raw


class OtherLoad:
    """Cores the machine's other processes kept busy while a cell ran (this shared machine's contention):
    all of /proc/stat's busy time less this process's and the load process's."""

    def __init__(self, measure: LoadMeasure):
        self.measure = measure
        self.start = self._snapshot()

    def _snapshot(self) -> tuple[float, float, float] | None:
        try:
            ticks = os.sysconf("SC_CLK_TCK")
            user, nice, system, _idle, _iowait, irq, softirq, steal = (
                int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
            busy = (user + nice + system + irq + softirq + steal) / ticks
            t = os.times()
            ours = t.user + t.system
            child = getattr(self.measure, "_process", None)  # the load generator's process, once started
            if child is not None and child.alive():
                fields = Path(f"/proc/{child.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
                ours += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
            return time.monotonic(), busy, ours
        except (OSError, ValueError, IndexError):
            return None

    def cores(self) -> float | None:
        end = self._snapshot()
        if self.start is None or end is None or end[0] <= self.start[0]:
            return None
        return max(0.0, ((end[1] - self.start[1]) - (end[2] - self.start[2])) / (end[0] - self.start[0]))


def grid_cells(base: Knobs, sizes: tuple[int, ...], waits: tuple[float, ...], buckets: tuple[int, ...]) -> list[dict]:
    """Every (batch size, max wait, padding) of the grid as validated Knobs and the changes from ``base``."""
    cells = []
    for padding in ("bucket", "dynamic"):
        for size in sizes:
            for wait in waits:
                changes: dict[str, Any] = {"batch_size": size, "max_wait_ms": float(wait), "padding": padding}
                if padding == "bucket":
                    changes["buckets"] = buckets
                cells.append({"changes": changes, "knobs": base.replace(**changes)})  # replace validates
    return cells


def measure_capacity(measure: LoadMeasure, knobs: Knobs, target: float, settings: CapacitySettings,
                     label: str) -> dict[str, Any]:
    """One configuration: a closed loop (its completion rate brackets the search), then its capacity."""
    t0 = time.time()
    others = OtherLoad(measure)
    closed = measure(knobs)
    cap: Capacity | None = None
    if closed.ok and closed.qps > 0:
        cap = capacity_at_target(measure, knobs, target, saturation=closed.qps, settings=settings,
                                 status=lambda text: print(f"  {label}: {text}", flush=True))
    best = cap.best if cap is not None else None
    top = cap.at(cap.high) if cap is not None else None  # the lowest failing rate's probe
    row = {"closed_loop": {"qps": rounded(closed.qps), "p99_ms": rounded(closed.p99_ms),
                           "device_busy": rounded(closed.device_busy), "model_busy": rounded(closed.model_busy),
                           "mean_batch": rounded(closed.mean_batch), "errors": closed.failed},
           "capacity": rounded(cap.capacity) if cap is not None else None,
           "bracket": [rounded(cap.low), rounded(cap.high)] if cap is not None else [None, None],
           "p99_at_capacity_ms": rounded(best.p99_ms) if best is not None and cap.met else None,
           "probes": len(cap.probes) if cap is not None else 0,
           "load_tests": 1 + (cap.trials if cap is not None else 0),
           "decided": cap.decided if cap is not None else None,
           # why the bracket's top failed; "late sends": the load client fell behind its schedule there (this shared
           # machine's other work), so the capacity is a lower bound on the server's own
           "top_failed_by": top.by if top is not None else ("closed loop" if cap is not None and cap.high else None),
           "client_limited": top is not None and top.by == "late sends",
           "note": (cap.note if cap is not None else f"the closed loop got no ok answer ({closed.first_error})"),
           "search": cap.summary() if cap is not None else None,
           "other_processes_cores": rounded(others.cores(), 3),
           "seconds": rounded(time.time() - t0)}
    print(f"  {label}: capacity {fixed(row['capacity'])} req/s (bracket {fixed(row['bracket'][0])}-"
          f"{fixed(row['bracket'][1])}, top failed by {row['top_failed_by']}), closed loop {closed.qps:.0f} QPS "
          f"device {_pct(closed.device_busy)}, {row['probes']} probes, {row['load_tests']} load tests, "
          f"{row['seconds']:.0f} s, other processes {fixed(row['other_processes_cores'], '.2f')} cores", flush=True)
    return row


def source_state() -> dict[str, Any]:
    """The commit this run measured and whether tuning/ had uncommitted changes (the verdict's code moves)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "tuning"], cwd=root, capture_output=True, text=True,
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "tuning_modified": None}
    return {"commit": head or None, "tuning_modified": bool(dirty)}


def reused_grid(args: argparse.Namespace, cells: list[dict]) -> dict[str, Any]:
    """The earlier run's result, refused unless its profile, slowdown, target, mode and cells are this run's."""
    try:
        prev = json.loads(Path(args.grid_from).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--grid-from {args.grid_from}: cannot read it ({e}); give a bench/results/tuner.json") from e
    mismatch = [name for name, ours, theirs in (
        ("profile", args.profile, (prev.get("profile") or {}).get("from")),
        ("slowdown", args.slowdown, (prev.get("profile") or {}).get("slowdown")),
        ("target", args.target, prev.get("target_p99_ms")),
        ("quick", args.quick, prev.get("quick")),
        ("cells", [c["changes"] for c in cells], [{k: (tuple(v) if isinstance(v, list) else v) for k, v in
                                                   r["changes"].items()} for r in prev.get("grid", [])]),
    ) if ours != theirs]
    if mismatch:
        raise SystemExit(f"--grid-from {args.grid_from}: its {', '.join(mismatch)} differ from this run's; run "
                         "without --grid-from to measure the grid")
    return prev


def _needs_retry(row: dict[str, Any]) -> bool:
    return bool(row["client_limited"] or not row["capacity"])


def _kept(first: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """The search that stands: a server-decided one over a client-limited one, else the higher capacity (two lower
    bounds: the higher is the tighter)."""
    if again["capacity"] and not again["client_limited"]:
        return again
    if first["capacity"] and not first["client_limited"]:
        return first
    return again if (again["capacity"] or 0) > (first["capacity"] or 0) else first


def _attempt(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("capacity", "bracket", "top_failed_by", "client_limited", "probes", "load_tests",
                                "closed_loop", "other_processes_cores", "seconds", "note", "search")}


def _pct(x: Any) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.0f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 cells, 2 s windows, the quick ladder (a check)")
    parser.add_argument("--profile", default="l4-estimate", help="simulated device profile (a shipped name or a JSON path)")
    parser.add_argument("--slowdown", type=float, default=10.0,
                        help="divide the profile's FLOP/s and memory bandwidth by this (1: the profile as shipped)")
    parser.add_argument("--target", type=float, default=TARGET_P99_MS, help="p99 target in ms")
    parser.add_argument("--concurrency", type=int, default=64, help="closed-loop clients (each cell's saturation rate)")
    parser.add_argument("--seed", type=int, default=0, help="the open loop's arrivals and the order of the cells")
    parser.add_argument("--grid-from", type=Path, default=None,
                        help="reuse the grid of an earlier tuner.json with the same profile, target and cells: only the "
                             "ladder runs, and its shipped configuration is re-measured beside the grid's best (both "
                             "searched again in this run, the ratio from this run)")
    parser.add_argument("--head-to-head", type=int, default=4,
                        help="searches each of the grid's best cell and the shipped configuration after the grid, "
                             "alternately (the ratio's figures)")
    args = parser.parse_args()
    if args.head_to_head < 1:
        raise SystemExit(f"--head-to-head {args.head_to_head}: give 1 or more searches each")
    if not args.slowdown > 0:
        raise SystemExit(f"--slowdown {args.slowdown}: give a number > 0")
    t_start = time.time()
    source = source_state()  # before anything runs: what the imports read
    folder = Path(tempfile.mkdtemp(prefix="tuning-tuner-"))
    sim_profile, profile = slowed_profile(args.profile, args.slowdown, folder)
    sizes, waits = GRIDS["quick" if args.quick else "full"]
    duration_s, warmup_s = (2.0, 0.5) if args.quick else (3.0, 1.0)
    cap_settings = (CapacitySettings(max_windows=2, min_windows=1, tolerance=0.10, max_probes=7, halvings=3, doublings=3)
                    if args.quick
                    else CapacitySettings(max_windows=3, tolerance=0.08, max_probes=8, halvings=4, doublings=4))
    inputs = load_inputs(None)
    texts, _ = input_texts(inputs)
    plan = plan_for(token_lengths(texts))
    buckets = tuple(plan["buckets"])
    workers = LadderSettings().workers  # what the ladder's workers step sets
    base = preset("baseline", device="sim", sim_profile=sim_profile).replace(
        tokenizer="fast", dtype="bf16", num_workers=workers, pin_memory=True, graph="eager")
    cells = grid_cells(base, sizes, waits, buckets)
    measure = LoadMeasure(inputs, args.concurrency, duration_s, warmup_s, seed=args.seed)
    print(f"SIMULATED device {profile['name']}; target p99 {args.target:.0f} ms; {len(cells)} cells; windows "
          f"{duration_s:g} s after {warmup_s:g} s; {args.concurrency} closed-loop clients", flush=True)

    # the ladder first, on the same measurement
    if args.quick:
        ladder_settings = LadderSettings.quick(concurrency=args.concurrency, duration_s=duration_s, warmup_s=warmup_s,
                                               capacity=cap_settings, seed=args.seed)
    else:
        ladder_settings = LadderSettings(concurrency=args.concurrency, duration_s=duration_s, warmup_s=warmup_s,
                                         min_effect=0.03, max_pairs=6, capacity=cap_settings,
                                         sweep_sizes=(1, 2, 4, 8, 16, 32, 64), sweep_repeats=2, sweep_rounds=3,
                                         waits_ms=(2.0, 5.0, 10.0, 20.0), joint_rounds=2, precision_texts=64,
                                         seed=args.seed)
    t0, runs0 = time.time(), measure.runs
    ladder = run_ladder(inputs, device="sim", sim_profile=sim_profile, target_p99_ms=args.target,
                        settings=ladder_settings, measure=measure, progress=lambda line: print(f"ladder: {line}", flush=True))
    ladder_s, ladder_runs = time.time() - t0, measure.runs - runs0
    shipped = ladder.recommended
    same_cell = next((i for i, c in enumerate(cells) if c["knobs"] == shipped), None)
    print(f"ladder: {ladder_runs} load tests, {ladder_s:.0f} s; ships {ladder.set_line()}"
          + (f" (grid cell {same_cell + 1})" if same_cell is not None else " (not a grid cell)"), flush=True)

    # the grid and the shipped configuration again, in a shuffled order with the re-measurement in the middle
    order: list[int | str] = list(range(len(cells)))
    random.Random(args.seed).shuffle(order)
    order.insert(len(order) // 2, "shipped")
    reused = None
    if args.grid_from is not None:
        reused = reused_grid(args, cells)
        order = []  # the head-to-head below searches its best cell and the shipped configuration
        print(f"grid reused from {args.grid_from} (commit {(reused.get('source') or {}).get('commit')}); searching "
              "its best cell and the shipped configuration again", flush=True)
    t0, runs0 = time.time(), measure.runs
    rows: dict[int, dict[str, Any]] = {}
    shipped_row: dict[str, Any] = {}
    for n, item in enumerate(order, start=1):
        if item == "shipped":
            label = f"[{n}/{len(order)}] shipped"
            shipped_row = measure_capacity(measure, shipped, args.target, cap_settings, label)
            continue
        cell = cells[item]
        label = f"[{n}/{len(order)}] cell {item + 1} {change_text({k: v for k, v in cell['changes'].items() if k != 'buckets'})}"
        rows[item] = {"cell": item + 1, "changes": {k: (list(v) if isinstance(v, tuple) else v)
                                                    for k, v in cell["changes"].items()},
                      **measure_capacity(measure, cell["knobs"], args.target, cap_settings, label)}
    # once more, in the same order: each configuration whose bracket's top the client decided (late sends) or that
    # met the target at no rate; a server-decided retry replaces the first search, else the higher of two lower
    # bounds stands; both searches are kept and counted
    retried = [item for item in order if _needs_retry(shipped_row if item == "shipped" else rows[item])]
    for n, item in enumerate(retried, start=1):
        first = shipped_row if item == "shipped" else rows[item]
        label = f"[retry {n}/{len(retried)}] " + ("shipped" if item == "shipped" else f"cell {item + 1}")
        again = measure_capacity(measure, shipped if item == "shipped" else cells[item]["knobs"], args.target,
                                 cap_settings, label)
        kept = _kept(first, again)
        merged = {**{k: v for k, v in first.items() if k in ("cell", "changes")}, **kept,
                  "load_tests": first["load_tests"] + again["load_tests"], "retried": True,
                  "attempts": [_attempt(first), _attempt(again)], "kept_attempt": 1 if kept is first else 2}
        if item == "shipped":
            shipped_row = merged
        else:
            rows[item] = merged
    grid_s = time.time() - t0
    if reused is not None:
        grid = [dict(r, reused=True) for r in reused["grid"]]
    else:
        grid = [rows[i] for i in range(len(cells))]
    best_cell = max(range(len(grid)), key=lambda i: grid[i]["capacity"] or 0.0)
    # the head-to-head: the grid's best is the highest of its single searches and was chosen on that figure, so the
    # figure is biased up (the winner's curse; the top cells sit within a search's noise of each other); the ratio
    # is of searches made after the choice, the best cell and the shipped configuration alternately (ABBA/BAAB)
    t0, runs0 = time.time(), measure.runs
    h2h: dict[str, list[dict[str, Any]]] = {"best": [], "shipped": []}
    abba = ["shipped", "best", "best", "shipped"] if args.seed % 2 else ["best", "shipped", "shipped", "best"]
    baab = abba[1:3] + [abba[0], abba[3]]  # ABBA then BAAB, so that a carry-over from one search falls on both
    h2h_order = ((abba + baab) * args.head_to_head)[:2 * args.head_to_head]
    print(f"head-to-head: the grid's best cell {best_cell + 1} and the shipped configuration"
          + (" (the same configuration: the ratio is 1, the searches show the noise)" if same_cell == best_cell else "")
          + f", {args.head_to_head} searches each in the order {', '.join(h2h_order)}", flush=True)
    for n, who in enumerate(h2h_order, start=1):
        knobs = cells[best_cell]["knobs"] if who == "best" else shipped
        h2h[who].append(measure_capacity(measure, knobs, args.target, cap_settings,
                                         f"[head-to-head {n}/{len(h2h_order)}] {who}"))
    h2h_s, h2h_runs = time.time() - t0, measure.runs - runs0
    measure.close()
    if reused is not None:
        shipped_row = h2h["shipped"][0]
    best_now = h2h["best"][0]
    grid_runs = sum(r["load_tests"] for r in grid)

    caps = [r["capacity"] or 0.0 for r in grid]
    best_i = max(range(len(grid)), key=lambda i: caps[i])
    worst_i = min(range(len(grid)), key=lambda i: caps[i])
    best, worst = caps[best_i], caps[worst_i]
    best_over_worst = best / worst if worst > 0 else None  # None: a cell met the target at no rate probed
    # the figure the verdict reads: the best cell (a client-limited capacity is a lower bound, so the best is at
    # least that) over the worst of the cells whose bracket the server decided (its top failed by the count, the
    # knee or errors; the true worst is at most that): a lower bound on the grid's true best over worst
    server = [i for i, r in enumerate(grid) if r["capacity"] and not r["client_limited"]]
    server_worst_i = min(server, key=lambda i: caps[i]) if server else None
    server_best_over_worst = best / caps[server_worst_i] if server else None
    shipped_cap = shipped_row.get("capacity")
    # the ratio: the means of the head-to-head's searches (each made after the best cell was chosen); the same
    # configuration: 1 by identity
    h2h_shipped = [r["capacity"] or 0.0 for r in h2h["shipped"]]
    h2h_best = [r["capacity"] or 0.0 for r in h2h["best"]]
    if same_cell == best_cell:
        ladder_over_best = 1.0
    elif h2h_best and sum(h2h_best) > 0:
        ladder_over_best = (sum(h2h_shipped) / len(h2h_shipped)) / (sum(h2h_best) / len(h2h_best))
    else:
        ladder_over_best = None
    # each pair of the alternation: the k-th search of each
    pair_ratios = [a / b for a, b in zip(h2h_shipped, h2h_best) if b > 0]
    # undecided (None) when a head-to-head search's top was the client's (late sends) or never probed (the closed
    # loop): each is then a lower bound; or with fewer than 2 blocks (ABBA, BAAB) there is no spread to decide on
    bound = [r for rs in h2h.values() for r in rs if r["client_limited"] or r["top_failed_by"] == "closed loop"]
    meets = (None if same_cell != best_cell and (bound or len(pair_ratios) < 4)
             else ladder_over_best is not None and ladder_over_best >= TARGET_RATIO)
    # the figure before this change, for comparison only: the shipped one's search over the best cell's own
    # (selection-biased) figure
    selected_ratio = shipped_cap / best if shipped_cap is not None and best and reused is None else None
    own = ladder.capacity
    own_cap = own.capacity if own is not None else None

    title = (f"SIMULATED capacity at p99 <= {args.target:.0f} ms on simulated {profile['name']} "
             f"(host measured, device time predicted)")
    print(f"\n{title}")
    head = (f"{'cell':>4} {'batch':>5} {'wait ms':>7} {'padding':<8} {'closed QPS':>10} {'device':>6} "
            f"{'capacity':>8} {'bracket':>13} {'top failed by':>13} {'probes':>6} {'tests':>5} {'others':>6}")
    print("(device: busy share in the closed loop; top failed by: why the bracket's lowest failing rate failed, late "
          "sends = the load client fell behind, the capacity a lower bound; tests: load tests, retries included; "
          "others: cores this machine's other processes kept busy meanwhile)")
    print(head)
    print("-" * len(head))
    for r in grid:
        c = r["changes"]
        flag = " ".join(f for f, on in (("best", r is grid[best_i]), ("worst", r is grid[worst_i]),
                                        ("server-decided worst", server_worst_i is not None and r is grid[server_worst_i]),
                                        ("retried", r.get("retried"))) if on)
        bracket = f"{fixed(r['bracket'][0], '.0f')}-{fixed(r['bracket'][1], '.0f')}"
        print(f"{r['cell']:>4} {c['batch_size']:>5} {c['max_wait_ms']:>7g} {c['padding']:<8} "
              f"{fixed(r['closed_loop']['qps'], '.0f'):>10} {_pct(r['closed_loop']['device_busy']):>6} "
              f"{fixed(r['capacity']):>8} {bracket:>13} {r['top_failed_by'] or '-':>13} {r['probes']:>6} "
              f"{r['load_tests']:>5} {fixed(r['other_processes_cores'], '.2f'):>6} {flag}")
    print("-" * len(head))
    discriminates = server_best_over_worst is not None and server_best_over_worst >= MIN_DISCRIMINATION
    none_met = [r["cell"] for r in grid if not r["capacity"]]
    print(f"grid best / worst (simulated): {fixed(best_over_worst, '.2f')}"
          + (f" (cells {', '.join(map(str, none_met))} met the target at no rate probed)" if none_met else ""))
    print(f"  best over the worst of the {len(server)} cells whose bracket the server decided (not the client's late "
          f"sends), a lower bound: {fixed(server_best_over_worst, '.2f')} (at least {MIN_DISCRIMINATION}: "
          f"{'discriminates' if discriminates else 'DOES NOT discriminate'})")
    print(f"ladder ships: {ladder.set_line()}" + (f" = grid cell {same_cell + 1}" if same_cell is not None else ""))
    print(f"  its capacity re-measured with the grid's settings (simulated): {fixed(shipped_cap)} req/s "
          f"(bracket {fixed(shipped_row['bracket'][0])}-{fixed(shipped_row['bracket'][1])}, top failed by "
          f"{shipped_row['top_failed_by']}); the ladder's own search: {fixed(own_cap)} req/s")
    print(f"  head-to-head ({len(h2h['best'])} searches each, after the grid chose its best): the best cell "
          f"{best_cell + 1} {', '.join(fixed(c) for c in h2h_best)} req/s (its grid figure {fixed(best)}), the shipped "
          f"configuration {', '.join(fixed(c) for c in h2h_shipped)} req/s; ratio per pair "
          f"{', '.join(f'{r:.3f}' for r in pair_ratios)}")
    if selected_ratio is not None:
        print(f"  the shipped configuration over the best cell's own grid figure (biased to the best: chosen on it): "
              f"{selected_ratio:.3f}")
    print(f"ladder / grid best (simulated): {fixed(ladder_over_best, '.3f')} (target >= {TARGET_RATIO}: "
          + ("UNDECIDED: " + (f"{len(bound)} of {len(h2h_order)} searches bounded by the client or the closed loop"
                                if bound else "fewer than 2 ABBA blocks") + ")" if meets is None
             else f"{'met' if meets else 'MISSED'})"))
    print(f"load tests: grid {grid_runs}" + (" (the earlier run's)" if reused is not None else
                                              f" ({grid_s:.0f} s), re-measurement {shipped_row.get('load_tests')}")
          + f", ladder {ladder_runs} ({ladder_s:.0f} s), head-to-head {h2h_runs} ({h2h_s:.0f} s); this run "
          f"{measure.runs}, total wall {time.time() - t_start:.0f} s")

    summary = ladder.summary()
    payload = {
        "what": ("SIMULATED: the ladder's shipped configuration against an exhaustive grid of capacity at a p99 target "
                 "on a simulated accelerator; host side measured, device time predicted"),
        "simulated": True, "title": title, "source": source,
        "profile": {"name": profile["name"], "from": args.profile, "slowdown": args.slowdown, "sim_profile": profile},
        "device": summary["device"], "target_p99_ms": args.target,
        "method": {"concurrency": args.concurrency, "duration_s": duration_s, "warmup_s": warmup_s, "seed": args.seed,
                   "capacity_settings": {k: getattr(cap_settings, k) for k in
                                         ("max_windows", "min_windows", "tolerance", "max_probes", "error_budget",
                                          "halvings", "doublings")},
                   "order": [o if o == "shipped" else o + 1 for o in order],
                   "grid_base": {k: v for k, v in base.as_dict().items() if k != "sim_profile"},
                   "buckets_plan": {k: v for k, v in plan.items() if k != "tried"}},
        "grid": grid,
        "grid_best": {"cell": grid[best_i]["cell"], "changes": grid[best_i]["changes"], "capacity": best},
        "grid_worst": {"cell": grid[worst_i]["cell"], "changes": grid[worst_i]["changes"], "capacity": worst},
        "grid_best_over_worst": rounded(best_over_worst), "cells_without_capacity": none_met,
        "grid_best_over_worst_server_decided": rounded(server_best_over_worst),
        "server_decided_cells": [grid[i]["cell"] for i in server],
        "server_decided_worst": ({"cell": grid[server_worst_i]["cell"], "changes": grid[server_worst_i]["changes"],
                                  "capacity": caps[server_worst_i]} if server else None),
        "retried": [o if o == "shipped" else o + 1 for o in retried],
        "client_limited_cells": [r["cell"] for r in grid if r["client_limited"]],
        "min_discrimination": MIN_DISCRIMINATION,
        "discriminates": discriminates,
        "ladder": {"set_line": ladder.set_line(), "changes": summary["recommended"]["changes"],
                   "grid_cell": same_cell + 1 if same_cell is not None else None,
                   "capacity_remeasured": shipped_cap, "remeasured": shipped_row,
                   "capacity_own_search": rounded(own_cap), "own_bracket": [rounded(own.low), rounded(own.high)] if own else None,
                   "load_tests": ladder_runs, "seconds": rounded(ladder_s), "target_met": ladder.target_met,
                   "interrupted": ladder.interrupted,
                   "steps": [{k: s.row()[k] for k in ("step", "change", "status", "capacity", "ratio", "low", "high",
                                                      "pairs", "reason")} for s in ladder.steps],
                   "settings": ladder_settings.as_dict()},
        "grid_reused": (None if reused is None else
                        {"from": str(args.grid_from), "source": reused.get("source"),
                         "best_cell_remeasured": best_now, "note": "the grid's cells are the earlier run's; the ratio "
                         "is the shipped configuration over the grid's best cell, both searched in this run"}),
        "ladder_over_grid_best": rounded(ladder_over_best), "target_ratio": TARGET_RATIO,
        "head_to_head": {"what": "the grid's best cell and the shipped configuration searched again after the grid "
                                 "chose its best, alternately; ladder_over_grid_best is the ratio of their means",
                         "best_cell": best_cell + 1, "best_cell_capacities": h2h_best, "order": h2h_order,
                         "seed": args.seed, "tops_failed_by": {k: [r["top_failed_by"] for r in v] for k, v in h2h.items()},
                         "shipped_capacities": h2h_shipped, "pair_ratios": [rounded(r) for r in pair_ratios],
                         "searches": h2h, "load_tests": h2h_runs, "seconds": rounded(h2h_s),
                         "same_configuration": same_cell == best_cell},
        "ladder_over_grid_best_selected": rounded(selected_ratio),
        "ladder_meets_target_ratio": meets,
        # each load test counted once: with --grid-from the grid's are the earlier run's, and the re-measurement and
        # the best cell's search again are the head-to-head's first searches (counted in head_to_head)
        "load_tests": {"grid": grid_runs, "grid_from_earlier_run": reused is not None, "ladder": ladder_runs,
                       "remeasurement": shipped_row.get("load_tests") if reused is None else None,
                       "head_to_head": h2h_runs, "this_run": measure.runs},
        "seconds": {"grid": rounded(grid_s), "ladder": rounded(ladder_s), "head_to_head": rounded(h2h_s),
                    "total": rounded(time.time() - t_start)},
    }
    write("tuner", payload, quick=args.quick)
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()


if __name__ == "__main__":
    main()
