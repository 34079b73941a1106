"""The workload a run decides on: its inputs, their texts and token lengths, the planned buckets, and
the device block of a result."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import numpy as np

from tuning.knobs import preset

BUCKET_WASTE_TARGET = 0.15  # planned buckets: the fewest (up to MAX_BUCKETS) whose padding waste is at most 15%
MAX_BUCKETS = 8  # shapes to compile or capture at most


def load_inputs(data: Any = None, limit: int | None = None) -> list[Any]:
    """Raw request bodies: the lines of a JSONL file or the rows of any supported data file (bad ones
    included: they become error outcomes), or a given sequence of lines, records or texts."""
    from tuning.base.assets import DEFAULT_DATA
    from tuning.inputs.readers import read_inputs

    if data is None or isinstance(data, (str, os.PathLike)):
        return [raw for _, raw in read_inputs(data or DEFAULT_DATA, limit)]
    inputs = list(data)
    return inputs[:limit] if limit else inputs


def input_texts(inputs: Sequence[Any], formatter: Any = None) -> tuple[list[str], dict[str, int]]:
    """The model texts of the valid inputs (formatted with ``formatter``, the knob), and the count of invalid
    ones by reason."""
    from tuning.runtime.engine import Preparer

    prep = Preparer(preset("baseline"), None, *([formatter] if formatter is not None else []))  # read + format only
    texts, bad = [], {}
    for i, raw in enumerate(inputs, start=1):
        item, text = prep.to_text(i, raw)
        if text is None:
            reason = (item.error or "invalid").split(":")[0]
            bad[reason] = bad.get(reason, 0) + 1
        else:
            texts.append(text)
    return texts, bad


def token_lengths(texts: Sequence[str], max_length: int = 256) -> list[int]:
    from tuning.base.assets import tokenizer_files
    from tuning.inputs.tokenize import FastTokenizer

    return [len(e.ids) for e in FastTokenizer(tokenizer_files()[1], max_length).encode_batch(list(texts))]


def plan_for(lengths: Sequence[int], max_length: int = 256) -> dict[str, Any]:
    """The fewest planned buckets (up to MAX_BUCKETS) with padding waste <= BUCKET_WASTE_TARGET."""
    from tuning.inputs.buckets import padded_to_buckets, plan_buckets

    arr = np.minimum(np.asarray(lengths, dtype=np.int64), max_length)
    real = float(arr.sum())
    tried = []
    for k in range(1, MAX_BUCKETS + 1):
        planned = plan_buckets(arr, k, multiple_of=8)
        planned = tuple(min(b, max_length) for b in planned)
        waste = float(padded_to_buckets(arr, planned).sum()) / real - 1 if real else 0.0
        tried.append({"k": k, "buckets": list(planned), "waste": round(waste, 4)})
        if waste <= BUCKET_WASTE_TARGET:
            break
    best = tried[-1]
    return {"buckets": best["buckets"], "k": best["k"], "waste": best["waste"], "tried": tried,
            "waste_target": BUCKET_WASTE_TARGET, "lengths": {"count": int(arr.size), "p50": float(np.median(arr)),
                                                             "p90": float(np.percentile(arr, 90)), "max": int(arr.max())}}


def device_block(choice: Any, sim_profile: str | None = None) -> dict[str, Any]:
    """The ``device`` block of a result's summary: the contract's object (:mod:`tuning.base.contract`)."""
    if choice.knob == "sim" and sim_profile:
        choice = dataclasses.replace(choice, profile=sim_profile)
    return choice.as_dict()
