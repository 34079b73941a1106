"""One request's single outcome (:class:`Response`), the outcome names and the served path's stage names."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

OUTCOMES = ("ok", "error", "timeout", "rejected")


SERVE_STAGES = ("queue_wait", "read", "preprocess", "wait_for_model", "copy", "inference", "postprocess")


@dataclass
class Response:
    """One request's single outcome, its timings (ms) and, if ok and asked for, its embedding."""

    request: int
    outcome: str
    reason: str | None = None
    id: str | None = None
    embedding: np.ndarray | None = None
    n_tokens: int = 0
    truncated: bool = False
    batch_size: int = 0
    t_submit: float = 0.0
    t_done: float = 0.0
    queue_wait_ms: float = 0.0
    read_ms: float = 0.0
    preprocess_ms: float = 0.0
    wait_for_model_ms: float = 0.0
    copy_ms: float = 0.0
    inference_ms: float = 0.0
    postprocess_ms: float = 0.0
    input_error: bool = False  # the request itself was unusable (a client error), not the server or its model

    @property
    def latency_ms(self) -> float:
        return (self.t_done - self.t_submit) * 1000

    def as_dict(self, with_embedding: bool = False) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}  # shallow: never copies the embedding
        d["latency_ms"] = self.latency_ms
        emb = d.pop("embedding")
        if with_embedding and emb is not None:
            d["embedding"] = [float(x) for x in emb]
        return d
