"""A one-worker service of known speed for ``tune``'s tests: ``POST /predict {"input": text}`` answers
``{"embedding": [...]}`` after ``--service-ms`` of exclusive work (an asyncio lock: one request at a time),
so its capacity falls as the service time grows. ``--crash`` exits at once (a configuration that fails)."""

import argparse
import asyncio
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--service-ms", type=float, default=5.0)
p.add_argument("--crash", default="no")
args = p.parse_args()
if args.crash == "yes":
    print("configuration refused: --crash yes", file=sys.stderr)
    sys.exit(2)
LOCK = asyncio.Lock()


async def predict(request):
    body = await request.json()
    async with LOCK:
        await asyncio.sleep(args.service_ms / 1000)
    return JSONResponse({"embedding": [float(len(body["input"])), 1.0]})


uvicorn.run(Starlette(routes=[Route("/predict", predict, methods=["POST"])]), host="127.0.0.1", port=args.port,
            log_level="error")
