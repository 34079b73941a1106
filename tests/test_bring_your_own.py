"""Bring your own model and preprocessing: ``--model DIR`` (a sentence-transformers style folder with a
BERT-family encoder, safetensors only), ``--model module:factory``, ``--formatter module:function``.
The folder tests use a tiny randomly initialised BERT saved by transformers to a temporary folder."""

import json
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.cli_run import run_cli
from tests.helpers import installed_by_test_extra
from tuning import preset
from tuning.base.assets import tokenizer_files
from tuning.offline.pipeline import Pipeline
from tuning.runtime.custom import load_callable, resolve_model

TEXTS = ["a red kettle that whistles", "refund for order 1234, please", "café crème", "router drops wifi at night"]


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    transformers = installed_by_test_extra("transformers")
    folder = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=128)
    transformers.BertModel(config).eval().save_pretrained(folder, safe_serialization=True)
    vocab, tokenizer_json = tokenizer_files()
    shutil.copy(vocab, folder / "vocab.txt")
    shutil.copy(tokenizer_json, folder / "tokenizer.json")
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                 "pooling_mode_mean_tokens": True}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    return folder


def _reference(folder: Path, texts: list[str]) -> np.ndarray:
    """transformers' own BERT on the same token ids, mean-pooled over real tokens and normalised."""
    import transformers

    from tuning.inputs.tokenize import FastTokenizer

    model = transformers.BertModel.from_pretrained(folder).eval()
    tok = FastTokenizer(folder / "tokenizer.json", 128)
    enc = tok.encode_batch(texts)
    ids, mask = tok.build_batch(enc, max(len(e.ids) for e in enc))
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return torch.nn.functional.normalize(pooled, dim=1).numpy()


@pytest.mark.thirdparty
def test_model_folder_gives_the_same_embeddings_as_transformers(tiny_bert):
    knobs = preset("tuned", dtype="fp32", max_length=128, buckets=(32, 64, 128))
    model, tokenizer, label = resolve_model(str(tiny_bert), knobs)
    assert "BERT" in label and tiny_bert.name in label
    result = Pipeline(knobs, model=model, tokenizer=tokenizer).run(TEXTS)
    assert result.ok == len(TEXTS)
    ours = np.stack([result.embeddings[i] for i in range(1, len(TEXTS) + 1)])
    assert ours.shape == (len(TEXTS), 32)
    cosine = (ours * _reference(tiny_bert, TEXTS)).sum(1)
    assert cosine.min() > 0.9999, cosine


def _copy_without(folder: Path, tmp_path: Path, *names: str) -> Path:
    out = tmp_path / "model"
    shutil.copytree(folder, out)
    for name in names:
        (out / name).unlink()
    return out


@pytest.mark.parametrize("remove,add,needle", [
    (("model.safetensors",), "pytorch_model.bin", "safetensors only"),
    (("model.safetensors",), None, "no *.safetensors"),
    (("config.json",), None, "config.json"),
    (("tokenizer.json",), None, "tokenizer.json"),
])
def test_model_folder_missing_parts_are_named(tiny_bert, tmp_path, remove, add, needle):
    folder = _copy_without(tiny_bert, tmp_path, *remove)
    if add:
        (folder / add).write_bytes(b"not loaded")
    with pytest.raises((FileNotFoundError, ValueError), match=needle.replace("*", r"\*")):
        resolve_model(str(folder), preset("tuned", max_length=128, buckets=(128,)))


def test_model_folder_of_another_family_is_refused(tiny_bert, tmp_path):
    folder = _copy_without(tiny_bert, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    with pytest.raises(ValueError, match="model_type 'roberta'.*module:factory"):
        resolve_model(str(folder), preset("tuned", max_length=128, buckets=(128,)))


def test_max_length_beyond_the_models_positions_says_what_to_set(tiny_bert):
    with pytest.raises(ValueError, match="max_length=256.*--set max_length=128"):
        resolve_model(str(tiny_bert), preset("tuned"))


def test_cli_runs_a_model_folder(tiny_bert):
    out = run_cli("run", "--preset", "tuned", "--model", str(tiny_bert), "--set", "max_length=128",
                  "--set", "buckets=32,64,128", "--set", "dtype=fp32", "--limit", "40", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)
    assert summary["ok"] == 40 and summary["model"].endswith(f"{tiny_bert.name} (BERT, 2 layers, hidden 32)")


MODULE = '''
import torch

class Counter(torch.nn.Module):
    """Embeds the token count: fast, any vocabulary."""
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(1, 4)

    def forward(self, ids, mask):
        return torch.nn.functional.normalize(self.proj(mask.float().sum(1, keepdim=True)), dim=1)

def build():
    return Counter()

def build_with_tokenizer():
    from tuning.base.assets import tokenizer_files
    from tuning.inputs.tokenize import FastTokenizer
    return Counter(), FastTokenizer(tokenizer_files()[1], 64)

def title_only(record):
    if record.category == "router":
        raise ValueError("no routers")
    return record.title

not_callable = 42

def returns_nothing():
    return None
'''


@pytest.fixture
def user_module(tmp_path) -> Path:
    (tmp_path / "my_models.py").write_text(textwrap.dedent(MODULE))
    return tmp_path


@pytest.mark.parametrize("spec", ["my_models:build", "my_models:build_with_tokenizer", "./my_models.py:build"])
def test_cli_model_factory_and_formatter(user_module, spec):
    out = run_cli("run", "--preset", "tuned", "--set", "dtype=fp32", "--model", spec, "--formatter",
                  "my_models:title_only", "--limit", "60", "--json", cwd=user_module)
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads(out.stdout)
    assert s["requests"] == 60 and s["ok"] + s["errors"] == 60 and s["ok"] > 0
    assert any("format failed: ValueError: no routers" in r["reason"] for r in s["error_reasons"])
    assert s["stages"]["preprocess"]["p50_ms"] is not None


def test_the_formatter_shapes_what_the_model_sees(user_module, monkeypatch, request):
    monkeypatch.syspath_prepend(str(user_module))
    request.addfinalizer(lambda: sys.modules.pop("my_models", None))  # the CLI tests import their own copy
    fmt = load_callable("my_models:title_only", "--formatter")
    model, _, _ = resolve_model("my_models:build", preset("tuned"))
    full = Pipeline(preset("tuned", dtype="fp32"), model=model).run(limit=40)
    short = Pipeline(preset("tuned", dtype="fp32"), model=model, formatter=fmt).run(limit=40)
    assert sum(r.n_tokens for r in short.requests) < sum(r.n_tokens for r in full.requests) / 2


@pytest.mark.parametrize("spec,needle", [
    ("no_such_module:build", "cannot import module 'no_such_module'"),
    ("my_models:missing", "module 'my_models' has no attribute 'missing'"),
    ("my_models:not_callable", "is not callable"),
    ("my_models:returns_nothing", "returned NoneType"),
    ("my_models", "module:factory"),
    ("./nowhere.py:build", "no such file"),
    ("/no/such/folder", "no such folder"),
])
def test_bad_model_specs_exit_2_with_one_line_naming_the_fix(user_module, spec, needle, capfd):
    out = run_cli("run", "--model", spec, "--limit", "5", cwd=user_module, capfd=capfd)
    assert out.returncode == 2, (out.returncode, out.stderr[-1500:])
    assert needle in out.stderr and "--model" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_tiny_stand_in_is_a_model_folder_transformers_reads_alike(tmp_path):
    from tuning.runtime.custom import save_tiny_bert

    folder = save_tiny_bert(tmp_path / "tiny")
    installed_by_test_extra("transformers")
    knobs = preset("tuned", dtype="fp32")
    model, tokenizer, _ = resolve_model(str(folder), knobs)
    result = Pipeline(knobs, model=model, tokenizer=tokenizer).run(TEXTS)
    ours = np.stack([result.embeddings[i] for i in range(1, len(TEXTS) + 1)])
    assert (ours * _reference(folder, TEXTS)).sum(1).min() > 0.9999
