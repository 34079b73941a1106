"""The load client's own ceiling: requests per second and CPU per request against a bare ASGI echo.

A server that does nothing (uvicorn with httptools and uvloop, a Starlette-free ASGI callable answering every
POST with a fixed TEI-shaped body of one 384-float embedding) runs in its own process, pinned to one core;
the client under test runs pinned to another, closed loop at ``--concurrency`` for ``--duration`` measured
seconds. Arms, interleaved ABBA over ``--rounds``:

- ``tuning``: ``loadtest --url`` as shipped (the HTTP/1.1 client of ``tuning.load.http1`` on uvloop, answers
  checked for one embedding per text);
- ``tuning-no-validate``: the same with ``--no-validate`` (the answer's JSON parse and check skipped), which
  says how much of the cost is the check;
- ``tuning-aiohttp``: the client before issue 24's item 8, aiohttp (``TUNING_HTTP_CLIENT=aiohttp``, the path
  ``https://`` still takes): the before/after ratio, paired by round, in the same run;
- ``tuning-stdlib-loop``: the shipped client on the standard library's event loop (``TUNING_EVENT_LOOP=asyncio``),
  for a machine without uvloop;
- ``tuning-procs2-shared``: ``--client-procs 2``, the two processes free to run on both cores. On this 2-core
  machine they share the echo's core, so it measures the pair against a server they slow down: its req/s is
  what one 2-core machine reaches with client and server together, not the ceiling of two client cores (no
  CPU per request for it: the children's CPU is not the parent's);
- ``hey`` (when ``hey`` is on the PATH): the reference client.

Figures per arm: req/s (median and spread), the client's CPU per request in microseconds (its process's CPU
time over every request it sent, warm-up and cool-down included), the echo's busy share of its core over the
run (its CPU per request times the rate: near 1.0, the echo and not the client set the rate), and the
client's CPU ratio to hey's where hey ran. History: with aiohttp and the stdlib's ``json`` the client spent
520 us of CPU per request, 300 us with orjson; the HTTP/1.1 client's figures are in
``bench/results/client_ceiling.json``. Results: ``bench/results/client_ceiling.json``.

    python bench/client_ceiling.py            # 5 rounds of 10 s per arm
    python bench/client_ceiling.py --quick    # 2 rounds of 2 s (a check)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import fmt_spread, interleave, machine, spread, write

ANSWER = json.dumps([[0.01] * 384]).encode()  # TEI: one embedding per text sent

ECHO = r"""
import os, sys
os.sched_setaffinity(0, {%(core)d})
import uvicorn
ANSWER = %(answer)r
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]})
    await send({"type": "http.response.body", "body": ANSWER})
uvicorn.run(app, host="127.0.0.1", port=%(port)d, log_level="error", loop="uvloop", http="httptools", access_log=False)
"""

# the client's own ceiling: an echo that costs far less per request than any client (uvloop + httptools' parser,
# one fixed answer, no ASGI), so the client and not the server is what runs out of core
RAW_ECHO = r"""
import asyncio, os
os.sched_setaffinity(0, {%(core)d})
import httptools, uvloop
ANSWER = %(answer)r
REPLY = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: " + str(len(ANSWER)).encode() \
    + b"\r\n\r\n" + ANSWER
class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.parser = transport, httptools.HttpRequestParser(self)
    def data_received(self, data):
        self.parser.feed_data(data)
    def on_message_complete(self):
        self.transport.write(REPLY)
async def main():
    server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", %(port)d, backlog=1024)
    await server.serve_forever()
uvloop.run(main())
"""

CLIENT = r"""
import json, os, resource, sys, time, warnings
os.sched_setaffinity(0, %(cores)r)
from tuning.load.apis import Api
from tuning.load.generator import run_load
from tuning.load.procs import run_load_procs

def server_cpu():  # the echo server's CPU seconds (utime + stime from /proc)
    with open("/proc/%(server_pid)d/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

api = Api("tei", validate=%(validate)r)
bodies = api.encode(["a short sentence to embed, %%d" %% i for i in range(256)])
warnings.simplefilter("ignore")
r0, s0, t0 = resource.getrusage(resource.RUSAGE_SELF), server_cpu(), time.perf_counter()
if %(procs)d > 1:
    result, _ = run_load_procs(%(url)r, bodies, %(procs)d, concurrency=%(concurrency)d, duration_s=%(duration)r,
                               warmup_requests=200, api=api)
else:
    result = run_load(%(url)r, bodies, concurrency=%(concurrency)d, duration_s=%(duration)r, warmup_requests=200,
                      api=api)
r1, s1, t1 = resource.getrusage(resource.RUSAGE_SELF), server_cpu(), time.perf_counter()
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
s = result.summary()
print(json.dumps({"qps": s["qps"], "ok": s["ok"], "errors": s["errors"], "process_cpu_s": cpu,
                  "requests_total": s["ok"] + s["warmup_requests"] + result.cooldown_requests,
                  "loop_cpu": s["client_cpu"], "wall_s": t1 - t0, "server_cpu_s": s1 - s0}))
"""


def start_echo(core: int, raw: bool = False) -> tuple[subprocess.Popen, str]:
    from tuning.base.net import free_port

    port = free_port()
    code = (RAW_ECHO if raw else ECHO) % {"core": core, "answer": ANSWER, "port": port}
    proc = subprocess.Popen([sys.executable, "-c", code],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/embed"
    import urllib.request

    for _ in range(200):
        try:
            req = urllib.request.Request(url, data=b'{"inputs": ["x"]}', headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"the echo server did not come up: {proc.stderr.read().decode()[-1000:]}")


def tuning_arm(url: str, server_pid: int, cores: set[int], concurrency: int, duration: float, validate: bool,
               env: dict[str, str] | None = None, procs: int = 1) -> dict[str, Any]:
    code = CLIENT % {"cores": cores, "validate": validate, "url": url, "concurrency": concurrency,
                     "duration": duration, "server_pid": server_pid, "procs": procs}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=duration * 10 + 120,
                         cwd=Path(__file__).resolve().parent.parent, env={**os.environ, **(env or {})})
    if out.returncode != 0:
        raise SystemExit(f"the tuning client failed: {out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    n = max(r["requests_total"], 1)
    # CPU per request over every request the process sent (warm-up and cool-down too: the CPU clock ran for them);
    # several processes: RUSAGE_SELF is the parent's alone, so no client figure (their loops' shares are summed)
    r["cpu_us_per_request"] = r["process_cpu_s"] / n * 1e6 if procs == 1 else None
    r["server_cpu_us_per_request"] = r["server_cpu_s"] / n * 1e6
    # the echo's CPU per request times the rate: its core's busy share in the window (~1.0: the echo is the limit)
    r["server_busy"] = r["server_cpu_us_per_request"] * r["qps"] / 1e6
    return r


def hey_arm(url: str, core: int, concurrency: int, duration: float) -> dict[str, Any]:
    body = json.dumps({"inputs": ["a short sentence to embed"]})
    cmd = ["taskset", "-c", str(core), "hey", "-z", f"{duration:g}s", "-c", str(concurrency), "-m", "POST",
           "-T", "application/json", "-d", body, url]
    t0 = os.times()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration * 10 + 60)
    t1 = os.times()
    cpu = (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out.stdout).group(1))
    total = sum(int(n) for _, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out.stdout))
    return {"qps": rps, "ok": total, "process_cpu_s": cpu, "cpu_us_per_request": cpu / max(total, 1) * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 s (a check)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--server", choices=("uvicorn", "raw"), default="uvicorn",
                        help="uvicorn: the bare ASGI echo of the issue (default); raw: a uvloop protocol echo far "
                             "cheaper than any client, so the client's own ceiling shows (client_ceiling_raw.json)")
    parser.add_argument("--arms", default=None, help="comma-separated arms to run (default: all)")
    args = parser.parse_args()
    rounds, duration = (2, 2.0) if args.quick else (args.rounds, args.duration)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs 2 cores: one for the echo server, one for the client")
    server_core, client_core = cores[0], cores[1]
    echo, url = start_echo(server_core, raw=args.server == "raw")
    pid, one, both = echo.pid, {client_core}, {server_core, client_core}
    c = args.concurrency
    arms = {
        "tuning": lambda: tuning_arm(url, pid, one, c, duration, True),
        "tuning-no-validate": lambda: tuning_arm(url, pid, one, c, duration, False),
        "tuning-aiohttp": lambda: tuning_arm(url, pid, one, c, duration, True, {"TUNING_HTTP_CLIENT": "aiohttp"}),
        "tuning-stdlib-loop": lambda: tuning_arm(url, pid, one, c, duration, True, {"TUNING_EVENT_LOOP": "asyncio"}),
        # two client processes, free to run on both cores: they share the echo's core (on this 2-core machine
        # that measures the pair of them against a server they slow down, not a client with cores of its own)
        "tuning-procs2-shared": lambda: tuning_arm(url, pid, both, c, duration, True, procs=2),
    }
    if shutil.which("hey") and shutil.which("taskset"):
        arms["hey"] = lambda: hey_arm(url, client_core, args.concurrency, duration)
    if args.arms:
        wanted = [a.strip() for a in args.arms.split(",") if a.strip()]
        unknown = sorted(set(wanted) - set(arms))
        if unknown:
            raise SystemExit(f"--arms: unknown {unknown}; known: {sorted(arms)}")
        arms = {name: arms[name] for name in wanted}
    try:
        runs = interleave(arms, rounds)
    finally:
        echo.terminate()
        echo.wait(10)
    what = "a bare ASGI echo (uvicorn)" if args.server == "uvicorn" else "a raw uvloop protocol echo"
    out: dict[str, Any] = {"what": f"the load client's ceiling against {what} (server and client on one core each)",
                           "server": args.server, "concurrency": args.concurrency, "duration_s": duration, "rounds": rounds,
                           "hey_installed": "hey" in arms, "arms": {}}
    print(f"{'arm':<22} {'req/s':>28} {'client CPU us/request':>28} {'echo busy':>22}")
    for name, results in runs.items():
        qps = spread([r["qps"] for r in results])
        cpu = spread([r["cpu_us_per_request"] for r in results if r["cpu_us_per_request"] is not None])
        busy = spread([r["server_busy"] for r in results])
        out["arms"][name] = {"qps": qps, "cpu_us_per_request": cpu, "server_busy": busy, "runs": results}
        print(f"{name:<22} {fmt_spread(qps, 0):>28} {fmt_spread(cpu, 0) if cpu['n'] else '-':>28} "
              f"{fmt_spread(busy, 2):>22}")
    if "tuning-aiohttp" in runs and "tuning" in runs:  # before/after in the same run, paired by round
        pairs = [a["cpu_us_per_request"] / t["cpu_us_per_request"] for a, t in zip(runs["tuning-aiohttp"],
                                                                                   runs["tuning"])]
        out["aiohttp_cpu_over_tuning"] = spread(pairs)
        print(f"aiohttp's CPU per request over this client's (paired by round): "
              f"{fmt_spread(out['aiohttp_cpu_over_tuning'], 2)}")
    if "tuning-procs2-shared" in runs and "tuning" in runs:
        out["procs2_qps_over_tuning"] = spread([p["qps"] / t["qps"] for p, t in zip(runs["tuning-procs2-shared"],
                                                                                     runs["tuning"])])
    if "hey" in runs:
        ratio = out["arms"]["tuning"]["cpu_us_per_request"]["median"] / out["arms"]["hey"]["cpu_us_per_request"]["median"]
        out["tuning_cpu_over_hey"] = ratio
        print(f"tuning's CPU per request over hey's: {ratio:.2f} (target <= 2)")
    else:
        print("hey is not installed here: no reference client measured (the issue measured hey at 13,200-15,900 "
              "req/s, 0.95 core, about 65 us of CPU per request, on this kind of machine)")
    write("client_ceiling" if args.server == "uvicorn" else "client_ceiling_raw", {**out, "machine": machine()},
          quick=args.quick)


if __name__ == "__main__":
    main()
