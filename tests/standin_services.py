"""Small stand-ins for other projects' embedding servers, written from their documented schemas (TEI, an
OpenAI-style endpoint, KServe v2 / Triton, a LitServe-style ``/predict``), served by uvicorn on a thread."""

from __future__ import annotations

import socket
import threading
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

DIM = 4

# TEI's own Prometheus metrics (names from its docs), in a registry of the stand-in's own
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest  # noqa: E402

TEI_METRICS = CollectorRegistry()
_te_queue = Gauge("te_queue_size", "Queue size", registry=TEI_METRICS)
_te_batch = Histogram("te_batch_next_size", "Batch size", buckets=(1, 2, 4, 8, 16, 32), registry=TEI_METRICS)
_te_queue_s = Histogram("te_request_queue_duration", "Queue time (s)", registry=TEI_METRICS)
_te_infer_s = Histogram("te_request_inference_duration", "Inference time (s)", registry=TEI_METRICS)


def _vec(text: str) -> list[float]:
    return [float(len(text)), 1.0, 0.5, -0.25]


async def tei_embed(request: Request):
    body = await request.json()
    inputs = body.get("inputs")
    if inputs is None:
        return JSONResponse({"error": "Input validation error: `inputs` cannot be empty", "error_type": "Validation"},
                            status_code=422)
    texts = inputs if isinstance(inputs, list) else [inputs]
    _te_batch.observe(len(texts))  # one request, one batch of its texts
    _te_queue_s.observe(0.0015)
    _te_infer_s.observe(0.003)
    _te_queue.set(0)
    return JSONResponse([_vec(t) for t in texts], headers={"x-tokenization-time": "0.4", "x-queue-time": "1.5",
                                                            "x-inference-time": "3.0"})


async def openai_embeddings(request: Request):
    body = await request.json()
    if "input" not in body:
        return JSONResponse({"detail": [{"loc": ["body", "input"], "msg": "Field required", "type": "missing"}]},
                            status_code=422)
    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    if request.headers.get("authorization") != "Bearer s3cret":
        return JSONResponse({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}},
                            status_code=401)
    return JSONResponse({"object": "list", "model": body.get("model"),
                         "data": [{"object": "embedding", "index": i, "embedding": _vec(t)} for i, t in enumerate(texts)]})


async def kserve_infer(request: Request):
    body = await request.json()
    tensor = body["inputs"][0]
    texts = tensor["data"]
    flat = [x for t in texts for x in _vec(t)]
    return JSONResponse({"model_name": request.path_params["model"], "outputs": [
        {"name": "token_count", "shape": [len(texts), 1], "datatype": "INT64", "data": [len(t) for t in texts]},
        {"name": "embedding", "shape": [len(texts), DIM], "datatype": "FP32", "data": flat}]})


async def litserve_predict(request: Request):
    body = await request.json()
    try:
        return JSONResponse({"output": _vec(body["input"])})
    except KeyError:
        return PlainTextResponse("Internal Server Error", status_code=500)


async def tei_metrics(request: Request):
    return PlainTextResponse(generate_latest(TEI_METRICS).decode(), media_type="text/plain; version=0.0.4")


async def wrong_answer(request: Request):
    return JSONResponse({"status": "fine"})


SLOW_S = 0.1  # /slow answers after this, overlapping any number of requests (a server that batches or awaits I/O)


async def slow_predict(request: Request):
    import asyncio

    await request.json()
    await asyncio.sleep(SLOW_S)
    return JSONResponse({"output": [_vec("slow")]})


APP = Starlette(routes=[Route("/embed", tei_embed, methods=["POST"]),
                        Route("/v1/embeddings", openai_embeddings, methods=["POST"]),
                        Route("/v2/models/{model}/infer", kserve_infer, methods=["POST"]),
                        Route("/predict", litserve_predict, methods=["POST"]),
                        Route("/wrong", wrong_answer, methods=["POST"]),
                        Route("/slow", slow_predict, methods=["POST"]),
                        Route("/metrics", tei_metrics, methods=["GET"])])


class StandIn:
    """``with StandIn() as url:`` the app above on a free loopback port."""

    def __enter__(self) -> str:
        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(APP, host="127.0.0.1", port=port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        for _ in range(200):
            if self.server.started:
                break
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
