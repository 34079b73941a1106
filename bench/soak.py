"""Soak: the HTTP server as users run it (``python -m tuning serve`` in its own process, on 127.0.0.1)
under a keep-alive load at concurrency 64 for a bounded time, with 5% malformed requests mixed in.

Every request carries a unique ``X-Request-Id`` that the front echoes, so the client can tell an answer
to its own request from a duplicate or a stray one. Checked and written to bench/results/soak.json:

- ``submitted == ok + errors + timeouts + rejected`` exactly (each request one outcome, transport
  failures included as errors), ``lost`` (requests with no HTTP answer at all) and ``duplicates``
  (answers whose echoed id was already answered, or was not the id sent) both 0;
- the server's memory (RSS from /proc) at the end against its memory after the warm-up: ``memory_drift``;
- ``p99_ms`` over every request (``ok_p99_ms`` beside it).

The model is the simulated accelerator (``--set device=sim``: the real host pipeline, the model's time
from the cost model), so a long soak runs the real front, workers and batcher at a realistic pace.

    python bench/soak.py              # 2 minutes, >= 10,000 requests expected
    python bench/soak.py --quick      # 10 s check; results to the temporary folder
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from common import write  # noqa: E402  (bench/common.py puts the repository on sys.path)

ROOT = Path(__file__).resolve().parent.parent
MALFORMED = [b'{"text": "unterminated', b'{"text": 42}', b'{"txt": "typo"}', b'{"text": "   "}',
             b'{"text": "caf\xe9"}', b"[1, 2, 3]", b"", b'{"id": "x", "title": 1}']


def rss_mb(pid: int) -> float:
    """Resident memory of a process, MB (Linux /proc)."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024


def percentile(values, q: float) -> float | None:
    """The q-th percentile of ``values`` (ms), rounded to 0.01; None for no values."""
    return round(float(np.percentile(values, q)), 2) if len(values) else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m tuning serve`` on 127.0.0.1 in a process of its own; waits until /healthz answers."""

    def __init__(self, sets: list[str], preset: str = "tuned", start_timeout_s: float = 120.0):
        self.port = free_port()
        cmd = [sys.executable, "-m", "tuning", "serve", "--preset", preset, "--host", "127.0.0.1",
               "--port", str(self.port)]
        for s in sets:
            cmd += ["--set", s]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors="replace")
        # read the server's output as it comes: a server writing to a pipe nobody reads blocks once it is full
        self._output: collections.deque[str] = collections.deque(maxlen=500)
        self._reader = threading.Thread(target=lambda: self._output.extend(self.proc.stdout), daemon=True)
        self._reader.start()
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise RuntimeError(f"the server exited at start: {''.join(self._output)[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                time.sleep(0.2)
        else:
            self.close()
            raise RuntimeError("the server did not start listening in time")

    def health(self) -> dict[str, Any]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=5) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                return json.loads(body)
            except ValueError:  # the front's own 503 past max_connections: plain text, the probe was shed
                return {"status": "shed", "http_status": exc.code, "body": body[:100].decode(errors="replace")}

    def close(self, timeout_s: float = 60.0) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: the CLI stops gracefully
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)
        return "".join(self._output)


def classify(status: int | None) -> str:
    if status is None:
        return "error"  # no HTTP answer: an error outcome, and lost
    if status == 200:
        return "ok"
    if status == 503:
        return "rejected"
    if status in (504, 408):
        return "timeout"
    return "error"


class Ledger:
    """Every request's record: sent id, echoed id, status, latency, when sent."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str | None, int | None, float, float, str | None]] = []

    def frame(self) -> dict[str, Any]:
        seen: Counter = Counter()
        duplicates = lost = 0
        outcomes: Counter = Counter()
        for sent, echoed, status, _, _, _ in self.rows:
            outcomes[classify(status)] += 1
            if status is None:
                lost += 1
                continue
            if echoed is None and status == 503:
                continue  # shed by the front past max_connections: uvicorn's own 503, before any handler ran
            if echoed != sent or seen[echoed]:
                duplicates += 1
            seen[echoed] += 1
        return {"submitted": len(self.rows), "ok": outcomes["ok"], "errors": outcomes["error"],
                "timeouts": outcomes["timeout"], "rejected": outcomes["rejected"], "lost": lost,
                "duplicates": duplicates}


async def one(session: Any, url: str, rid: str, body: bytes, ledger: Ledger, timeout_s: float) -> None:
    import aiohttp

    t0 = time.perf_counter()
    status = echoed = failure = None
    try:
        async with session.post(url, data=body, headers={"X-Request-Id": rid},
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            await resp.read()
            status, echoed = resp.status, resp.headers.get("X-Request-Id")
    except Exception as exc:  # refused, reset, timed out: this request's one outcome (and lost)
        failure = f"{type(exc).__name__}: {exc}"
    ledger.rows.append((rid, echoed, status, (time.perf_counter() - t0) * 1000, t0, failure))


async def closed_loop(url: str, bodies: list[bytes], concurrency: int, seconds: float, ledger: Ledger,
                      bad_every: int = 20, timeout_s: float = 60.0, prefix: str = "r") -> None:
    """``concurrency`` clients, each sends its next request when the last one is answered; every
    ``bad_every``-th request is malformed."""
    import aiohttp

    counter = itertools.count()
    end = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector, headers={"Content-Type": "application/json"}) as session:
        async def client() -> None:
            while time.perf_counter() < end:
                n = next(counter)
                body = MALFORMED[(n // bad_every) % len(MALFORMED)] if bad_every and n % bad_every == bad_every - 1 \
                    else bodies[n % len(bodies)]
                await one(session, url + "/embed", f"{prefix}{n}", body, ledger, timeout_s)

        await asyncio.gather(*(client() for _ in range(concurrency)))


def request_bodies(n: int = 500) -> list[bytes]:
    from tuning.inputs.readers import read_lines

    return [raw for _, raw in read_lines(limit=n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 10 s check; results to the temporary folder")
    ap.add_argument("--duration", type=float, default=None, help="seconds of load (default 120; --quick 10)")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--warmup", type=float, default=None, help="warm-up seconds before the memory baseline")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", help="server knobs (repeatable)")
    args = ap.parse_args()
    duration = args.duration or (10.0 if args.quick else 120.0)
    warmup = args.warmup if args.warmup is not None else (2.0 if args.quick else 10.0)
    sets = ["device=sim", *args.set]
    bodies = request_bodies()
    server = ServerProcess(sets)
    try:
        warm = Ledger()
        asyncio.run(closed_loop(server.url, bodies, args.concurrency, warmup, warm, prefix="w"))
        mem_warm = rss_mb(server.proc.pid)
        ledger = Ledger()
        t0 = time.perf_counter()
        asyncio.run(closed_loop(server.url, bodies, args.concurrency, duration, ledger))
        wall = time.perf_counter() - t0
        mem_end = rss_mb(server.proc.pid)
        health = server.health()
    finally:
        log = server.close()
    figures = ledger.frame()
    lat = np.array([r[3] for r in ledger.rows])
    ok_lat = np.array([r[3] for r in ledger.rows if r[2] == 200])
    statuses = Counter(str(r[2]) for r in ledger.rows)
    failures = Counter((r[5] or "")[:100] for r in ledger.rows if r[5])
    figures.update({
        "memory_drift": round((mem_end - mem_warm) / mem_warm, 4),
        "p99_ms": percentile(lat, 99), "p50_ms": percentile(lat, 50), "ok_p99_ms": percentile(ok_lat, 99),
        "memory_warm_mb": round(mem_warm, 1), "memory_end_mb": round(mem_end, 1),
        "duration_s": round(wall, 2), "concurrency": args.concurrency, "malformed_share": 0.05,
        "rps": round(len(ledger.rows) / wall, 1), "statuses": dict(statuses), "transport_failures": dict(failures),
        "server_health_at_end": health, "server_knobs": sets, "model": "simulated accelerator (device=sim)",
    })
    f = figures
    checks = {
        "counts_add_up": f["submitted"] == f["ok"] + f["errors"] + f["timeouts"] + f["rejected"],
        "nothing_lost": f["lost"] == 0, "no_duplicates": f["duplicates"] == 0,
        "memory_within_10pct": abs(f["memory_drift"]) <= 0.10,
        "at_least_10000_requests": f["submitted"] >= 10_000,
        "malformed_are_4xx": all(r[2] is not None and 400 <= r[2] < 500 for r in ledger.rows
                                 if int(r[0][1:]) % 20 == 19),
        "healthy_at_end": health.get("status") == "ok",
    }
    f["checks"] = checks
    print(json.dumps({k: v for k, v in f.items() if k not in ("server_health_at_end",)}, indent=1))
    if args.quick:
        checks.pop("at_least_10000_requests")  # a 10 s check cannot reach it
    write("soak", f, quick=args.quick)
    bad = [k for k, v in checks.items() if not v]
    if bad:
        print(f"FAILED checks: {', '.join(bad)}\nserver log tail:\n{log[-1500:]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
