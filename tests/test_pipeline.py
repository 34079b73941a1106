import json

import numpy as np
import pytest
import torch

from tests.cli_run import run_cli
from tuning.knobs import Knobs, preset
from tuning.offline.pipeline import STAGES, Pipeline, run_pipeline


@pytest.mark.parametrize("knobs", [
    preset("baseline"),
    preset("tuned"),
    Knobs(num_workers=1, prefetch_factor=4, batch_size=4, tokenizer="fast", padding="fixed", max_length=128),
], ids=["baseline", "tuned", "fixed-1worker"])
def test_every_line_one_outcome_and_counts_add_up(messy_file, knobs):
    result = run_pipeline(knobs, messy_file)
    n_lines = len(messy_file.read_bytes().splitlines())
    assert len(result.requests) == n_lines
    assert sorted(r.index for r in result.requests) == list(range(1, n_lines + 1))
    assert result.ok + result.errors == n_lines and result.errors == 7
    assert sorted(r.index for r in result.requests if r.outcome == "error") == [6, 7, 8, 9, 17, 18, 19]
    assert all(r.reason for r in result.requests if r.outcome == "error")
    assert len(result.embeddings) == result.ok
    assert sum(b.size for b in result.batches) == n_lines
    summary = result.summary()
    assert summary["requests"] == summary["ok"] + summary["errors"]
    assert set(summary["stages"]) == set(STAGES)
    assert 0 < summary["model_busy"] <= 1 and summary["throughput_rps"] > 0


def test_outputs_do_not_depend_on_the_knobs(messy_file):
    a = run_pipeline(preset("baseline"), messy_file)
    b = run_pipeline(Knobs(num_workers=0, batch_size=8, tokenizer="fast", padding="bucket"), messy_file)
    assert a.embeddings.keys() == b.embeddings.keys()
    for key in a.embeddings:
        assert float(np.dot(a.embeddings[key], b.embeddings[key])) > 0.99999


def test_ledger_and_frames(messy_file):
    result = run_pipeline(Knobs(num_workers=1, batch_size=4, tokenizer="fast"), messy_file, warmup_batches=1)
    ledger = result.ledger()
    assert list(ledger.index) == list(STAGES)
    assert ledger["share"].sum() == pytest.approx(1.0)
    assert ledger.loc["inference", "p50_ms"] > 0
    frame = result.to_frame()
    assert len(frame) == len(result.requests) and {"outcome", "inference_ms", "wait_for_input_ms"} <= set(frame)
    assert len(result.batches_frame()) == len(result.batches)
    # the warm-up batch ran on a sample of the inputs and was discarded; every input is measured once
    assert len(result.warmup_batches) == 1 and len(result.measured) == len(result.requests)


def test_a_failing_batch_fails_only_its_requests(messy_file):
    class Flaky(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0
            self.proj = torch.nn.Linear(1, 4)

        def forward(self, ids, mask):
            self.calls += 1
            if self.calls == 6:  # two engine warm-up calls, two warm-up batches, batch 0
                raise RuntimeError("boom")
            return self.proj(mask.float().sum(1, keepdim=True))

    result = Pipeline(Knobs(num_workers=0, batch_size=4, tokenizer="fast"), model=Flaky()).run(messy_file)
    failed = [r for r in result.requests if r.reason and "boom" in r.reason]
    assert len(failed) == result.batches[1].size - sum(
        1 for r in result.requests if r.batch == 1 and r.reason and "boom" not in r.reason)
    assert all(r.batch == 1 for r in failed) and result.ok + result.errors == len(result.requests)


def test_custom_formatter_and_texts():
    seen = []

    def formatter(record):
        seen.append(record.id)
        return record.title

    result = Pipeline(Knobs(num_workers=0, batch_size=2, tokenizer="fast"), formatter=formatter).run(limit=6)
    assert result.ok == 6 and len(set(seen)) == 6  # warm-up formats a sample of them once more
    texts = Pipeline(Knobs(num_workers=0, batch_size=2, tokenizer="fast")).run(["hello world", "", "second"])
    assert [r.outcome for r in texts.requests] == ["ok", "error", "ok"]


def test_cli_run_json(messy_file):
    out = run_cli("run", "--preset", "tuned", "--data", str(messy_file), "--json", "--set", "batch_size=4")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {"throughput_rps", "model_busy", "requests", "ok", "errors", "stages", "knobs"} <= set(data)
    assert data["requests"] == 27 and data["errors"] == 7 and data["knobs"]["batch_size"] == 4
    assert all({"p50_ms", "p99_ms", "share"} <= set(v) for v in data["stages"].values())


def test_cli_table(messy_file):
    out = run_cli("run", "--data", str(messy_file))
    assert out.returncode == 0 and "stage ledger" in out.stdout and "missing field 'body'" in out.stdout


@pytest.mark.parametrize("args,needle", [
    (["run", "--set", "batch_size=0"], "batch_size=0"),
    (["run", "--set", "dtype=fp64"], "fp32 | bf16 | fp16"),
    (["run", "--set", "nonsense"], "knob=value"),
    (["run", "--bogus"], "python -m tuning run: unrecognized argument --bogus"),
    (["run", "--preset", "nope"], "invalid choice"),
    (["run", "--data", "/nonexistent.jsonl"], "no such file"),
    (["run", "--limit", "0"], "must be >= 1"),
    ([], "choose a command"),
])
def test_cli_bad_input_exits_2_with_one_line(args, needle, capfd):
    out = run_cli(*args, capfd=capfd)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out.stderr


@pytest.mark.slow
def test_grouping_by_tokens_pads_less_and_counts_its_pass():
    base = Knobs(num_workers=0, batch_size=16, tokenizer="fast", padding="bucket", buckets=tuple(range(8, 257, 8)),
                 bucket_window=300)
    by_bytes = run_pipeline(base, limit=300, keep_embeddings=False)
    by_tokens = run_pipeline(base.replace(group_by="tokens"), limit=300, keep_embeddings=False)
    assert by_tokens.padding_waste < by_bytes.padding_waste
    assert by_tokens.plan_spans and by_tokens.plan_spans[0][0] >= by_tokens.t_window_start  # inside the window
    assert by_tokens.ok == by_bytes.ok == 300


def test_a_model_with_the_wrong_output_shape_fails_its_batches_clearly(messy_file):
    result = Pipeline(Knobs(num_workers=0, batch_size=4, tokenizer="fast"),
                      model=lambda ids, mask: torch.zeros(ids.shape[0] + 1, 3)).run(messy_file)
    assert result.ok == 0 and result.errors == len(result.requests)
    assert any("one row per input" in (r.reason or "") for r in result.requests)


def test_token_grouping_tokenizes_each_text_once_with_identical_batches():
    """Offline grouping by token length (group_by='tokens') used to tokenize every text twice: once for the
    lengths, once to build its batch. In the main process the pass's encodings are reused."""
    from tuning import preset
    from tuning.offline.pipeline import Pipeline

    def counted(pipeline):
        tok = pipeline.preparer.tokenizer
        original, seen = tok.encode_batch, []

        def encode_batch(texts):
            seen.extend(texts)
            return original(texts)

        tok.encode_batch = encode_batch
        return seen

    shared = Pipeline(preset("tuned", device="sim"))
    texts = counted(shared)
    a = shared.run(limit=120)
    # each text once in the grouping pass, plus the warm-up's own batches (2 x 16, run first and discarded);
    # tokenizing twice read 120 + 120 + 32
    assert len(set(texts)) == 120 and len(texts) <= 120 + 32
    assert not shared.preparer.encoded_ahead  # every encoding made ahead was used
    apart = Pipeline(preset("tuned", device="sim"))
    apart._length_tokenizer = lambda: __import__("copy").copy(apart.preparer.tokenizer)  # a different object: no sharing
    b = apart.run(limit=120)
    key = lambda r: (r.index, r.n_tokens, r.padded_length, r.outcome)  # noqa: E731
    assert sorted(map(key, a.requests)) == sorted(map(key, b.requests))
