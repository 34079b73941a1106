"""The load client's own ceiling: requests per second and CPU per request against a bare ASGI echo.

A server that does nothing (uvicorn with httptools and uvloop, a Starlette-free ASGI callable answering every
POST with a fixed TEI-shaped body of one 384-float embedding) runs in its own process, pinned to one core;
the client under test runs pinned to another, closed loop at ``--concurrency`` for ``--duration`` measured
seconds. Arms, interleaved ABBA over ``--rounds``:

- ``tuning``: ``loadtest --url`` as shipped (the asyncio client, answers checked for one embedding per text);
- ``tuning-no-validate``: the same with ``--no-validate`` (the answer's JSON parse and check skipped), which
  says how much of the cost is the check;
- ``tuning+uvloop``: a candidate, the same client on uvloop's event loop (not adopted: within the noise, 496
  against 520 us per request in one run, 359 against 300 in the next).

Measured here (2 cores, 3 rounds of 6 s, one run each): with the stdlib's ``json`` parsing each answer the
client spent 520 us of CPU per request (2,051 req/s) and 383 us without the check; with orjson (in the same
run, an arm that patched it in) 411 us. orjson and a type check by ``set(map(type, ...))`` are now the
client's own: 300 us per request, 3,575 req/s in the next run.
- ``hey`` (when ``hey`` is on the PATH) and ``wrk`` (when installed): the reference clients.

Figures per arm: req/s (median and spread), the client's CPU per request in microseconds (its process's CPU
time over the requests answered) and its ratio to hey's where hey ran. On a 2-core machine the server and the
client each get one core; ``--client-procs`` (several client processes) needs cores of its own and is not
measured here. Results: ``bench/results/client_ceiling.json``.

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

CLIENT = r"""
import asyncio, json, os, resource, sys, time, warnings
os.sched_setaffinity(0, {%(core)d})
from tuning.load import apis
from tuning.load.apis import Api
from tuning.load.generator import run_load
if %(uvloop)r:  # a candidate: the event loop the client would run on
    import uvloop
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
if %(orjson)r:  # a candidate: the answer parsed with orjson
    import orjson
    def _json(data, _nj=apis._NOT_JSON):
        try:
            return orjson.loads(data) if data else _nj
        except (ValueError, TypeError):
            return _nj
    apis._json = _json
api = Api("tei", validate=%(validate)r)
bodies = api.encode(["a short sentence to embed, %%d" %% i for i in range(256)])
warnings.simplefilter("ignore")
r0 = resource.getrusage(resource.RUSAGE_SELF)
result = run_load(%(url)r, bodies, concurrency=%(concurrency)d, duration_s=%(duration)r, warmup_requests=200, api=api)
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
s = result.summary()
print(json.dumps({"qps": s["qps"], "ok": s["ok"], "errors": s["errors"], "process_cpu_s": cpu,
                  "requests_total": s["ok"] + s["warmup_requests"] + result.cooldown_requests,
                  "loop_cpu": s["client_cpu"]}))
"""


def start_echo(core: int) -> tuple[subprocess.Popen, str]:
    from tuning.base.net import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", ECHO % {"core": core, "answer": ANSWER, "port": port}],
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


def tuning_arm(url: str, core: int, concurrency: int, duration: float, validate: bool, uvloop: bool = False,
               orjson: bool = False) -> dict[str, Any]:
    code = CLIENT % {"core": core, "validate": validate, "url": url, "concurrency": concurrency, "duration": duration,
                     "uvloop": uvloop, "orjson": orjson}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=duration * 10 + 120,
                         cwd=Path(__file__).resolve().parent.parent)
    if out.returncode != 0:
        raise SystemExit(f"the tuning client failed: {out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    # CPU per request over every request the process sent (warm-up and cool-down too: the CPU clock ran for them)
    r["cpu_us_per_request"] = r["process_cpu_s"] / max(r["requests_total"], 1) * 1e6
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
    args = parser.parse_args()
    rounds, duration = (2, 2.0) if args.quick else (args.rounds, args.duration)
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs 2 cores: one for the echo server, one for the client")
    server_core, client_core = cores[0], cores[1]
    echo, url = start_echo(server_core)
    arms = {
        "tuning": lambda: tuning_arm(url, client_core, args.concurrency, duration, True),
        "tuning-no-validate": lambda: tuning_arm(url, client_core, args.concurrency, duration, False),
        "tuning+uvloop": lambda: tuning_arm(url, client_core, args.concurrency, duration, True, uvloop=True),
    }
    if shutil.which("hey") and shutil.which("taskset"):
        arms["hey"] = lambda: hey_arm(url, client_core, args.concurrency, duration)
    try:
        runs = interleave(arms, rounds)
    finally:
        echo.terminate()
        echo.wait(10)
    out: dict[str, Any] = {"what": "the load client's ceiling against a bare ASGI echo (server and client on one "
                           "core each)", "concurrency": args.concurrency, "duration_s": duration, "rounds": rounds,
                           "hey_installed": "hey" in arms, "arms": {}}
    print(f"{'arm':<20} {'req/s':>28} {'CPU us/request':>28}")
    for name, results in runs.items():
        qps = spread([r["qps"] for r in results])
        cpu = spread([r["cpu_us_per_request"] for r in results])
        out["arms"][name] = {"qps": qps, "cpu_us_per_request": cpu, "runs": results}
        print(f"{name:<20} {fmt_spread(qps, 0):>28} {fmt_spread(cpu, 0):>28}")
    if "hey" in runs:
        ratio = out["arms"]["tuning"]["cpu_us_per_request"]["median"] / out["arms"]["hey"]["cpu_us_per_request"]["median"]
        out["tuning_cpu_over_hey"] = ratio
        print(f"tuning's CPU per request over hey's: {ratio:.2f} (target <= 2)")
    else:
        print("hey is not installed here: no reference client measured (the issue measured hey at 13,200-15,900 "
              "req/s, 0.95 core, about 65 us of CPU per request, on this kind of machine)")
    write("client_ceiling", {**out, "machine": machine()}, quick=args.quick)


if __name__ == "__main__":
    main()
