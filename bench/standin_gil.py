"""Another Python thread's progress during the stand-in's host part, against a real eager forward (issue 25, deliver 2).

``flock /tmp/bench.lock python bench/standin_gil.py`` prints a table and writes ``bench/results/standin_gil.json``.

A second Python thread counts in a pure-Python loop. Its progress during a call, as a share of its rate alone
(measured right beside it, over a sleep of the call's length), shows how much of the GIL the call leaves to
other threads. Three calls, each repeated enough times in a row to fill a window of about 40 ms:

* ``old_spin`` (simulated host time): the stand-in's host part before this change, ``spin_cpu`` of the predicted
  host time of one eager MiniLM forward at batch 1, length 16, bf16, on the simulated H200 (a pure-Python loop
  that holds the GIL throughout);
* ``standin_host`` (simulated host time): the stand-in's host part now, for the same predicted host time: one
  real tiny torch op per launch, the driver's launch constant burnt with the GIL released;
* ``real_eager_cpu`` (measured, real): an eager forward of the embedded MiniLM (``load_minilm``), fp32 on this
  CPU, batch 1, length 16, under ``torch.inference_mode`` (dispatch-bound: about 75 small kernels);
* ``real_eager_cuda`` (measured, real; only where CUDA is available): the same forward in bf16 on the GPU,
  synchronized: the launches the stand-in imitates.

Each reports the call's wall and CPU time (the calling thread's) alone and beside the counting thread (beside it,
the calls run until the window is over: a call that drops the GIL often waits up to the interpreter's switch
interval, 5 ms, to take it back from a busy Python thread, each time it drops it). Medians
over interleaved rounds (every round runs each call once, in a shuffled order).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from tuning.sim import embedded_model_profile, load_profile  # noqa: E402
from tuning.sim.dispatch import burn_rate_bps, host_dispatch_s  # noqa: E402
from tuning.sim.standin import SimulatedDevice, host_part, spin_cpu  # noqa: E402

OUT = ROOT / "bench" / "results" / "standin_gil.json"
WINDOW_S = 0.04
SHAPE = (1, 16)


class Counter:
    """A Python thread counting in a pure-Python loop while ``running`` is set."""

    def __init__(self) -> None:
        self.n = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._count, daemon=True)

    def _count(self) -> None:
        while not self.stop.is_set():
            self.n += 1

    def __enter__(self) -> "Counter":
        self.thread.start()
        time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def timed(fn, reps: int) -> tuple[float, float]:
    """(wall, calling thread's CPU) seconds per call of ``reps`` calls in a row."""
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - w0) / reps, (time.thread_time() - c0) / reps


def share_beside(fn, reps: int) -> dict[str, float]:
    """The counting thread's rate during calls (``reps`` of them, or fewer once the window is over: beside a
    Python thread a call can stretch a hundredfold) over its rate during a sleep as long, and the calls' times."""
    with Counter() as counter:
        n0, w0, c0 = counter.n, time.perf_counter(), time.thread_time()
        done = 0
        while done < reps and (done == 0 or time.perf_counter() - w0 < WINDOW_S):
            fn()
            done += 1
        reps = done
        wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
        busy_rate = (counter.n - n0) / wall
        n0, t0 = counter.n, time.perf_counter()
        time.sleep(wall)
        alone_rate = (counter.n - n0) / (time.perf_counter() - t0)
    return {"share": busy_rate / alone_rate if alone_rate > 0 else float("nan"),
            "wall_beside_s": wall / reps, "cpu_beside_s": cpu / reps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()

    from tuning.runtime.model import load_minilm

    dispatch = host_dispatch_s()
    profile, model_profile = load_profile("h200-sxm-estimate"), embedded_model_profile()
    device = SimulatedDevice(profile, model_profile)
    cost = device.cost(*SHAPE, "bf16", "eager")
    plan = host_part(cost)
    model = load_minilm().eval()
    ids = torch.full(SHAPE, 1000, dtype=torch.long)
    mask = torch.ones_like(ids)

    def real_forward() -> None:
        with torch.inference_mode():
            model(ids, mask)

    calls = {"old_spin": lambda: spin_cpu(cost.host_s), "standin_host": plan.run, "real_eager_cpu": real_forward}
    if torch.cuda.is_available():  # the reference the stand-in imitates: a real eager call's launches on a card
        cuda_model = load_minilm().to("cuda", torch.bfloat16).eval()
        cuda_ids, cuda_mask = ids.cuda(), mask.cuda()

        def real_forward_cuda() -> None:
            with torch.inference_mode():
                cuda_model(cuda_ids, cuda_mask)
            torch.cuda.synchronize()

        calls["real_eager_cuda"] = real_forward_cuda
    for fn in calls.values():  # warm: first-call set-up, the burner's calibration
        for _ in range(3):
            fn()
    reps = {name: max(1, int(round(WINDOW_S / timed(fn, 3)[0]))) for name, fn in calls.items()}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in calls}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(calls)
        rng.shuffle(order)
        for name in order:
            wall, cpu = timed(calls[name], reps[name])
            samples[name].append({"wall_alone_s": wall, "cpu_alone_s": cpu, **share_beside(calls[name], reps[name])})

    labels = {"old_spin": "simulated host time, old stand-in (GIL-holding spin)",
              "standin_host": "simulated host time, new stand-in (tiny torch op per launch + GIL-free launch constant)",
              "real_eager_cpu": "measured: real eager MiniLM forward on this CPU (fp32)",
              "real_eager_cuda": "measured: real eager MiniLM forward on this host's GPU (bf16, synchronized)"}
    rows = {}
    for name, runs in samples.items():
        med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
        q = np.percentile([r["share"] for r in runs], [25, 75])
        rows[name] = {"what": labels[name], "calls_per_window": reps[name], "rounds": len(runs),
                      "other_thread_share_median": round(med["share"], 3),
                      "other_thread_share_iqr": [round(float(q[0]), 3), round(float(q[1]), 3)],
                      "wall_alone_ms": round(med["wall_alone_s"] * 1e3, 4),
                      "cpu_alone_ms": round(med["cpu_alone_s"] * 1e3, 4),
                      "wall_beside_ms": round(med["wall_beside_s"] * 1e3, 4),
                      "cpu_beside_ms": round(med["cpu_beside_s"] * 1e3, 4)}
    summary = {
        "what": "another Python thread's progress (pure-Python loop, share of its rate alone) during each call; "
                "old_spin and standin_host burn the simulated H200's predicted host time of one eager call "
                f"(batch {SHAPE[0]}, length {SHAPE[1]}, bf16), real_eager_cpu is a measured real forward",
        "host": {"cpus": torch.get_num_threads(), "machine": platform.machine(), "python": platform.python_version(),
                 "torch": torch.__version__, "switch_interval_s": sys.getswitchinterval()},
        "host_dispatch_us_per_op_measured": round(dispatch * 1e6, 3),
        "gil_free_burn_bytes_per_us": round(burn_rate_bps() / 1e6, 1),
        "simulated_call": {"profile": profile.name, "launches": cost.launches,
                           "predicted_host_ms": round(cost.host_s * 1e3, 4),
                           "predicted_dispatch_ms": round(cost.dispatch_s * 1e3, 4),
                           "predicted_driver_ms": round(cost.driver_s * 1e3, 4),
                           "standin_tiny_ops": plan.ops, "standin_released_ms": round(plan.released_s * 1e3, 4)},
        "real_model_kernels": model_profile.kernels,
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"host dispatch {dispatch * 1e6:.2f} us/op (measured); simulated H200 eager {SHAPE}: {cost.launches} launches, "
          f"predicted host {cost.host_s * 1e3:.3f} ms (simulated)")
    print(f"{'call':<16} {'share':>6} {'IQR':>13} {'wall alone':>11} {'cpu alone':>10} {'wall beside':>12} {'cpu beside':>11}")
    for name, r in rows.items():
        lo, hi = r["other_thread_share_iqr"]
        print(f"{name:<16} {r['other_thread_share_median']:>6.2f} {lo:>6.2f}-{hi:<6.2f} {r['wall_alone_ms']:>9.3f}ms "
              f"{r['cpu_alone_ms']:>8.3f}ms {r['wall_beside_ms']:>10.3f}ms {r['cpu_beside_ms']:>9.3f}ms")


if __name__ == "__main__":
    main()
