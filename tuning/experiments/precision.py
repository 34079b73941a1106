"""Half-precision accuracy: cosine similarity of bf16/fp16 embeddings against fp32 on the same texts."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from tuning.base.assets import tokenizer_files
from tuning.base.contract import device_object
from tuning.base.machine import cpu_name
from tuning.inputs.tokenize import FastTokenizer, group_by_length
from tuning.runtime.model import check_dtype, load_minilm


@dataclass
class PrecisionReport:
    device: str
    texts: int
    cosines: dict[str, np.ndarray]  # dtype -> per-text cosine vs fp32
    refused: dict[str, str]  # dtype -> why this device cannot run it

    def to_frame(self) -> pd.DataFrame:
        rows = [{"dtype": d, "texts": len(c), "min_cosine": float(c.min()), "mean_cosine": float(c.mean()),
                 "p01_cosine": float(np.percentile(c, 1)), "status": "ok"} for d, c in self.cosines.items()]
        rows += [{"dtype": d, "texts": 0, "status": f"refused: {why}"} for d, why in self.refused.items()]
        return pd.DataFrame(rows)

    def summary(self) -> dict:
        frame = self.to_frame().astype(object).where(lambda f: f.notna(), None)
        device = device_object(self.device, cpu_name() if self.device == "cpu" else torch.cuda.get_device_name(),
                               source="measured")  # accuracy is never simulated
        return {"device": device, "texts": self.texts, "dtypes": frame.to_dict(orient="records")}


def embed(model: torch.nn.Module, tokenizer: FastTokenizer, texts: Sequence[str], device: torch.device,
          batch_size: int = 32) -> np.ndarray:
    """Embeddings of ``texts`` in input order (length-grouped batches, padded to the batch's longest)."""
    encoded = tokenizer.encode_batch(texts)
    out = np.zeros((len(texts), 0), dtype=np.float32)
    rows: dict[int, np.ndarray] = {}
    with torch.inference_mode():
        for batch in group_by_length([len(e.ids) for e in encoded], batch_size, len(encoded)):
            items = [encoded[i] for i in batch]
            ids, mask = tokenizer.build_batch(items, max(len(e.ids) for e in items))
            emb = model(ids.to(device), mask.to(device)).float().cpu().numpy()
            rows.update(zip(batch, emb))
    if rows:
        out = np.stack([rows[i] for i in range(len(texts))])
    return out


def precision_report(texts: Sequence[str], dtypes: Sequence[str] = ("bf16", "fp16"), device: str | None = None,
                     model: torch.nn.Module | None = None, batch_size: int = 32) -> PrecisionReport:
    """Min and mean cosine of each half-precision dtype against fp32 over ``texts``."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    base = (model or load_minilm()).to(dev).float().eval()
    tokenizer = FastTokenizer(tokenizer_files()[1])
    reference = embed(base, tokenizer, texts, dev, batch_size)
    cosines, refused = {}, {}
    for name in dtypes:
        try:
            dtype = check_dtype(name, dev)
        except ValueError as exc:
            refused[name] = str(exc)
            continue
        half = copy.deepcopy(base).to(dtype)
        emb = embed(half, tokenizer, texts, dev, batch_size)
        cosines[name] = (emb * reference).sum(axis=1) / (
            np.linalg.norm(emb, axis=1) * np.linalg.norm(reference, axis=1))
    return PrecisionReport(dev.type, len(texts), cosines, refused)


def compare_outputs(reference, candidate) -> dict:
    """Agreement of two offline runs' embeddings, record by record (e.g. a graph mode against eager):
    ``compared`` records, ``min_cosine`` and ``max_abs_diff``. Both runs must keep their embeddings
    and run a real model: simulated embeddings are stand-ins and are never compared."""
    for name, run in (("reference", reference), ("candidate", candidate)):
        device = getattr(run, "device", None)
        if isinstance(device, dict) and device.get("kind") == "simulated":
            raise ValueError(f"the {name} ran on the simulated device: its embeddings are stand-ins; "
                             "compare runs of the real model (device='cpu' or 'cuda')")
    common = sorted(set(reference.embeddings) & set(candidate.embeddings))
    if not common:
        raise ValueError("no record has an embedding in both runs; run both with keep_embeddings=True on the same data")
    a = np.stack([reference.embeddings[i] for i in common]).astype(np.float64)
    b = np.stack([candidate.embeddings[i] for i in common]).astype(np.float64)
    cos = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"compared": len(common), "min_cosine": float(cos.min()), "max_abs_diff": float(np.abs(a - b).max())}
