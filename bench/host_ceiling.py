"""Host ceiling: how fast the host side goes when the model costs nothing (issue 11 item 6).

On a real accelerator MiniLM is fast enough that the host (reading, tokenizing, batching, HTTP), not the
model, decides the service's throughput. With a zero-cost model (a callable that returns zeros at once):

* ``offline_over_tokenizer``: the offline ``tuned`` pipeline's throughput (requests / measured window)
  over the Rust tokenizer alone (``encode_batch`` over the same formatted texts, in the same windows of
  ``bucket_window`` texts); target >= 0.8.
* ``http_qps``, ``http_p999_ms``, ``http_over_echo``: our HTTP server (``tuned`` preset, zero-cost model)
  at concurrency 64, against a bare uvicorn + starlette app that answers the same JSON (a fixed
  384-float vector) on the same machine, driven by the same client; target ``http_over_echo`` >= 0.5 and
  p99.9 under 100 ms. Each server runs in its own process; the client runs in this one (our asyncio
  keep-alive client, or ``--engine locust --workers N``), sharing the machine's cores with the server as
  any client on the same host does. The client's CPU is reported beside each arm: a client busier than
  0.8 of a core caps what it can measure, so the echo's QPS (and the ratio) is then a floor.

Arms run interleaved ABBA; figures are medians of the per-round ratios with their spread.

    python bench/host_ceiling.py            # writes bench/results/host_ceiling.json
    python bench/host_ceiling.py --quick    # a short smoke run; writes to a temporary folder
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

import numpy as np
from common import check_rounds, fmt_spread, interleave, paired_ratio, spread, write

TARGETS = {"offline_over_tokenizer": 0.8, "http_over_echo": 0.5, "http_p999_ms": 100.0}
DIM = 384


class ZeroModel:
    """A model that costs nothing: zeros of the right shape."""

    def __call__(self, input_ids, attention_mask):
        import torch

        return torch.zeros((input_ids.shape[0], DIM))


def _echo_body() -> bytes:
    stages = ("queue_wait", "read", "preprocess", "wait_for_model", "copy", "inference", "postprocess")
    return json.dumps({"id": "rec-00000", "embedding": [round(0.0123456789 * ((i * 37) % 97 - 48), 7)
                                                         for i in range(DIM)],
                       "n_tokens": 85, "truncated": False, "batch_size": 16, "latency_ms": 1.234,
                       "timings_ms": {s: 0.1 for s in stages}}).encode()


def _serve(kind: str, conn) -> None:
    """A server process: ours (tuned, zero-cost model) or the bare echo; sends its URL, stops on a message."""
    import threading

    import uvicorn

    if kind == "ours":
        from tuning.knobs import preset
        from tuning.online.httpfront import HttpFront
        from tuning.online.serve import Server
        from tuning.runtime.engine import Engine

        knobs = preset("tuned", device="cpu")
        front = HttpFront(Server(knobs, engine=Engine(knobs, ZeroModel()))).start()
        conn.send(front.url + "/embed")
        conn.recv()
        front.close()
        return
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from tuning.online.httpfront import listen_socket

    body = _echo_body()

    async def embed(request):
        await request.body()
        return Response(body, media_type="application/json")

    sock = listen_socket("127.0.0.1", 0, 4096)
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/embed", embed, methods=["POST"])]),
                                           backlog=4096, log_config=None, log_level="warning", access_log=False,
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    conn.send(f"http://127.0.0.1:{sock.getsockname()[1]}/embed")
    conn.recv()
    server.should_exit = True
    thread.join(timeout=30)


def offline_arms(limit: int | None):
    """The two offline arms (each returns requests or texts per second) sharing one pipeline."""
    from tuning.inputs.readers import read_lines
    from tuning.knobs import preset
    from tuning.offline.pipeline import Pipeline

    knobs = preset("tuned", device="cpu")
    pipeline = Pipeline(knobs, model=ZeroModel())
    preparer = pipeline.preparer
    texts = [text for text in (preparer.to_text(i, raw)[1] for i, raw in read_lines(limit=limit)) if text]
    window = knobs.bucket_window

    def tokenizer() -> float:
        t0 = time.perf_counter()
        for start in range(0, len(texts), window):
            preparer.tokenizer.encode_batch(texts[start:start + window])
        return len(texts) / (time.perf_counter() - t0)

    def offline() -> float:
        return pipeline.run(limit=limit, keep_embeddings=False).qps

    tokenizer()  # warm: the tokenizer's thread pool and caches, the loader and the model's first calls
    offline()
    return {"offline_tuned": offline, "tokenizer_alone": tokenizer}


def http_arm(url: str, inputs, args) -> dict:
    if args.engine == "locust":
        from tuning.load.locust_engine import run_locust

        result = run_locust(url, inputs, args.concurrency, args.duration, workers=args.workers, warmup_s=args.warmup)
    else:
        from tuning.load.generator import run_load

        result = run_load(url, inputs, concurrency=args.concurrency, duration_s=args.duration, warmup_s=args.warmup)
    s = result.summary()
    lat = np.asarray(result.latencies_ms())
    return {"qps": s["qps"], "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"],
            "p999_ms": float(np.percentile(lat, 99.9)) if lat.size else None, "submitted": s["submitted"],
            "ok": s["ok"], "errors": s["errors"], "client_cpu": s["client_cpu"], "error_reasons": s["error_reasons"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short smoke run (results not comparable)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per part")
    parser.add_argument("--limit", type=int, default=None, help="read only the first N records")
    parser.add_argument("--concurrency", type=int, default=64, help="HTTP clients (closed loop)")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per HTTP run")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per HTTP run")
    parser.add_argument("--engine", choices=["tuning", "locust"], default="tuning", help="the HTTP load client")
    parser.add_argument("--workers", type=int, default=1, help="--engine locust: worker processes")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 3.0, 1.0
        args.limit = args.limit or 600
    check_rounds(args.rounds, args.quick)
    t_start = time.perf_counter()

    from tuning.inputs.readers import read_lines

    # offline: the tuned pipeline against the tokenizer alone
    offline = interleave(offline_arms(args.limit), args.rounds,
                         lambda r, name, v: print(f"round {r} {name}: {v:.0f} /s", flush=True))
    ratio_offline = paired_ratio(offline["offline_tuned"], offline["tokenizer_alone"])

    # HTTP: our server against the bare echo, each in its own process
    ctx = mp.get_context("spawn")
    servers = {}
    for kind in ("ours", "echo"):
        here, there = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(kind, there), name=f"server-{kind}", daemon=True)
        proc.start()
        servers[kind] = (proc, here, here.recv())
    inputs = [raw for _, raw in read_lines(limit=args.limit)]
    http = interleave({kind: (lambda kind=kind: http_arm(servers[kind][2], inputs, args)) for kind in servers},
                      args.rounds, lambda r, name, v: print(
                          f"round {r} {name}: {v['qps']:.0f} QPS, p99 {v['p99_ms']:.1f} ms, p99.9 {v['p999_ms']:.1f} ms,"
                          f" {v['errors']} errors, client CPU {v['client_cpu']:.2f}", flush=True))
    for proc, conn, _ in servers.values():
        conn.send("stop")
        proc.join(timeout=60)
    ratio_http = paired_ratio([r["qps"] for r in http["ours"]], [r["qps"] for r in http["echo"]])
    p999 = spread([r["p999_ms"] for r in http["ours"]])
    client_bound = [kind for kind, runs in http.items() if max(r["client_cpu"] or 0 for r in runs) > 0.8]

    print(f"offline_over_tokenizer {fmt_spread(ratio_offline)} (target >= {TARGETS['offline_over_tokenizer']}): "
          f"tuned {fmt_spread(spread(offline['offline_tuned']), 0)} req/s, tokenizer alone "
          f"{fmt_spread(spread(offline['tokenizer_alone']), 0)} texts/s")
    print(f"http_over_echo {fmt_spread(ratio_http)} (target >= {TARGETS['http_over_echo']}): ours "
          f"{fmt_spread(spread([r['qps'] for r in http['ours']]), 0)} QPS, echo "
          f"{fmt_spread(spread([r['qps'] for r in http['echo']]), 0)} QPS at concurrency {args.concurrency}; "
          f"http_p999_ms {fmt_spread(p999, 1)} (target < {TARGETS['http_p999_ms']})   "
          f"{time.perf_counter() - t_start:.0f} s")
    if client_bound:
        print(f"warning: the client used more than 0.8 of a core against {client_bound}: that arm's QPS is a floor "
              "(try --engine locust --workers 2)")
    write("host_ceiling", {
        "method": "zero-cost model; offline: tuned pipeline throughput / tokenizer encode_batch alone over the same "
                  "texts; HTTP: our server (tuned) vs a bare uvicorn + starlette echo of the same JSON, each in its "
                  f"own process, the same {args.engine} client in this one, closed loop; ABBA rounds, paired ratios",
        "rounds": args.rounds, "concurrency": args.concurrency, "duration_s": args.duration, "engine": args.engine,
        "offline_over_tokenizer": ratio_offline["median"], "offline_over_tokenizer_spread": ratio_offline,
        "offline_rps": spread(offline["offline_tuned"]), "tokenizer_rps": spread(offline["tokenizer_alone"]),
        "http_qps": spread([r["qps"] for r in http["ours"]])["median"], "http_p999_ms": p999["median"],
        "http_p99_ms": spread([r["p99_ms"] for r in http["ours"]])["median"],
        "http_over_echo": ratio_http["median"], "http_over_echo_spread": ratio_http,
        "echo_qps": spread([r["qps"] for r in http["echo"]])["median"],
        "echo_p999_ms": spread([r["p999_ms"] for r in http["echo"]])["median"],
        "client_bound_arms": client_bound, "runs": http, "targets": TARGETS,
    }, quick=args.quick)


if __name__ == "__main__":
    main()
