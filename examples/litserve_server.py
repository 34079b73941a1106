"""A LitServe app serving the shipped all-MiniLM-L6-v2 (sentence-transformers) behind LitServe's OpenAI
embedding spec (``POST /v1/embeddings``, ``GET /health``), with LitServe's batching knobs, which live in code,
exposed as flags so that ``investigate --cmd`` / ``tune`` can set them per configuration::

    python examples/litserve_server.py --port 8000 --max-batch-size 8 --batch-timeout 0.005

The recipe ``--server litserve`` (:mod:`tuning.load.servers`) starts it this way. Under dynamic batching
(``--max-batch-size`` > 1) LitServe's spec takes one text per request, sent as a string; a list of several
answers 400. The LitAPI is a module-level class because LitServe pickles it into its worker processes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import litserve as ls

# run from a checkout (python examples/litserve_server.py): the package is the folder above this one
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class MiniLM(ls.LitAPI):
    """LitServe's OpenAIEmbeddingSpec decodes the requests and encodes the answers; ``predict`` gets one text
    (no batching) or a list (a client's list, or a dynamic batch) and returns one vector per text."""

    def setup(self, device: str) -> None:
        from sentence_transformers import SentenceTransformer

        from tuning.base.assets import embedded_model_dir

        self.model = SentenceTransformer(str(embedded_model_dir()), device="cpu")

    def predict(self, texts: str | list[str]) -> list[list[float]]:
        batch = [texts] if isinstance(texts, str) else list(texts)
        return self.model.encode(batch, normalize_embeddings=True).tolist()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="LitServe + all-MiniLM-L6-v2 with the OpenAI embedding spec")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    p.add_argument("--max-batch-size", type=_positive_int, default=1,
                   help="LitAPI max_batch_size: requests per model call (1: no dynamic batching; default: 1)")
    p.add_argument("--batch-timeout", type=_non_negative_float, default=0.0,
                   help="LitAPI batch_timeout: seconds a batch waits to fill (default: 0.0)")
    p.add_argument("--workers-per-device", type=_positive_int, default=1,
                   help="LitServer workers_per_device: model copies, each in its own process (default: 1)")
    return p.parse_args(argv)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give an integer >= 1")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds >= 0")
    return value


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    api = MiniLM(max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout, spec=ls.OpenAIEmbeddingSpec())
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=args.workers_per_device)
    server.run(host=args.host, port=args.port, generate_client_file=False)


if __name__ == "__main__":
    main()
