"""Fixed-bucket histograms and Prometheus text exposition for the server (no extra dependency)."""

from __future__ import annotations

import bisect
import math
import threading
from typing import Sequence

SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Histogram:
    """Cumulative-bucket histogram with sum and count, safe to observe from several threads."""

    def __init__(self, buckets: Sequence[float]):
        self.bounds = tuple(buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.bounds, value)] += 1
            self.sum += value
            self.count += 1

    def render(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        lines, running = [], 0
        with self._lock:
            for bound, n in zip(self.bounds, self.counts):
                running += n
                lines.append(f'{name}_bucket{{{labels}{sep}le="{_num(bound)}"}} {running}')
            lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
            wrap = f"{{{labels}}}" if labels else ""
            lines += [f"{name}_sum{wrap} {_num(self.sum)}", f"{name}_count{wrap} {self.count}"]
        return lines


def _num(x: float) -> str:
    if isinstance(x, float) and math.isinf(x):
        return "+Inf"
    return repr(float(x)) if isinstance(x, float) else str(x)


def prometheus_text(server) -> str:
    """The server's counters, gauges and histograms in the Prometheus text format (version 0.0.4)."""
    lines = ["# HELP tuning_requests_total Requests by outcome.", "# TYPE tuning_requests_total counter"]
    for outcome, n in server.counts.items():
        lines.append(f'tuning_requests_total{{outcome="{outcome}"}} {n}')
    lines += ["# HELP tuning_queue_depth Requests admitted and not yet answered.", "# TYPE tuning_queue_depth gauge",
              f"tuning_queue_depth {server.queue_depth}",
              "# HELP tuning_max_queue Admission limit (max_queue).", "# TYPE tuning_max_queue gauge",
              f"tuning_max_queue {server.knobs.max_queue}",
              "# HELP tuning_model_busy_seconds_total Time the model spent in inference.",
              "# TYPE tuning_model_busy_seconds_total counter",
              f"tuning_model_busy_seconds_total {_num(server.busy_total_s)}",
              "# HELP tuning_batch_size Requests per model call.", "# TYPE tuning_batch_size histogram"]
    lines += server.batch_hist.render("tuning_batch_size")
    lines += ["# HELP tuning_stage_seconds Per-request time in each stage (ok requests).",
              "# TYPE tuning_stage_seconds histogram"]
    for stage, hist in server.stage_hists.items():
        lines += hist.render("tuning_stage_seconds", f'stage="{stage}"')
    lines += ["# HELP tuning_latency_seconds Submit-to-answer time of every request, by outcome "
              "(sum over outcome for the whole tail).",
              "# TYPE tuning_latency_seconds histogram"]
    for outcome, hist in server.latency_hists.items():
        lines += hist.render("tuning_latency_seconds", f'outcome="{outcome}"')
    return "\n".join(lines) + "\n"
