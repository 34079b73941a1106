"""Bring your own model and preprocessing, named on the command line.

* ``--model DIR``: a sentence-transformers style folder with a BERT-family encoder (``config.json``,
  safetensors weights, ``tokenizer.json``; ``vocab.txt`` too for ``tokenizer=naive``), loaded by
  :func:`tuning.runtime.model.load_bert_dir` with the folder's own tokenizer;
* ``--model module:factory`` (or ``path/to/file.py:factory``): a Python callable that returns the model
  (any ``(input_ids [B,T], attention_mask [B,T]) -> [B, D]`` callable) or ``(model, tokenizer)``, the
  tokenizer implementing :class:`tuning.inputs.tokenize.Tokenizer`; without one, the embedded model's;
* ``--formatter module:function``: the record -> text step (a :class:`tuning.inputs.records.Record` in, a ``str``
  out); texts from other formats go to the tokenizer as they are.

A module is imported from the current folder (as ``python -m`` does) or from its file path.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from tuning.knobs import Knobs

EMBEDDED = "all-MiniLM-L6-v2 (embedded)"


def load_callable(spec: str, flag: str) -> Callable:
    """The callable ``module:name`` (or ``file.py:name``) names; errors name the flag, the value and the fix."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{flag} {spec!r}: expected module:function, e.g. {flag} my_models:build "
                         f"(or {flag} ./my_models.py:build)" + (" or a model folder" if flag == "--model" else ""))
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise FileNotFoundError(f"{flag} {spec!r}: no such file {module_name!r}")
        loader_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules.setdefault(path.stem, module)
        loader_spec.loader.exec_module(module)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))  # as `python -m` does, for the `tuning` console script too
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                raise ValueError(f"{flag} {spec!r}: cannot import module {module_name!r}; run from the folder that holds "
                                 f"it, or give its file: {flag} ./path/to/{module_name.replace('.', '/')}.py:{attr}") from None
            raise
    if not hasattr(module, attr):
        raise ValueError(f"{flag} {spec!r}: module {module_name!r} has no attribute {attr!r}")
    value = getattr(module, attr)
    if not callable(value):
        raise TypeError(f"{flag} {spec!r}: {module_name}.{attr} is not callable (a {type(value).__name__})")
    return value


def _check_tokenizer(tokenizer: Any, spec: str) -> None:
    lacking = [name for name in ("encode_batch", "build_batch", "pad_id") if not hasattr(tokenizer, name)]
    if lacking:
        raise TypeError(f"--model {spec!r}: the tokenizer it returned ({type(tokenizer).__name__}) lacks "
                        f"{', '.join(lacking)}; implement tuning.inputs.tokenize.Tokenizer (encode_batch, build_batch, pad_id)")


def resolve_model(spec: str | None, knobs: Knobs) -> tuple[Any, Any, str]:
    """``(model, tokenizer, label)`` for ``--model SPEC``; ``(None, None, ...)`` for the embedded model.

    A ``None`` tokenizer means the embedded model's (chosen by the ``tokenizer`` knob)."""
    if spec is None:
        return None, None, EMBEDDED
    path = Path(spec)
    if path.is_dir() or (":" not in spec and not spec.endswith(".py")):
        return _from_folder(path, knobs)
    factory = load_callable(spec, "--model")
    made = factory()
    model, tokenizer = (made[0], made[1] if len(made) > 1 else None) if isinstance(made, tuple) else (made, None)
    if not callable(model):
        raise TypeError(f"--model {spec!r}: the factory returned {type(model).__name__}, not a model; return a "
                        "callable (input_ids, attention_mask) -> [B, D] embeddings, or (model, tokenizer)")
    if tokenizer is not None:
        _check_tokenizer(tokenizer, spec)
    return model, tokenizer, f"{spec} ({type(model).__name__})"


def _from_folder(path: Path, knobs: Knobs) -> tuple[Any, Any, str]:
    from tuning.runtime.engine import make_tokenizer
    from tuning.runtime.model import load_bert_dir

    if not path.is_dir():
        raise FileNotFoundError(f"--model {str(path)!r}: no such folder; give a sentence-transformers style folder "
                                "(config.json, model.safetensors, tokenizer.json) or module:factory")
    model = load_bert_dir(path)
    positions = model.config.max_position_embeddings
    if knobs.max_length > positions:
        raise ValueError(f"max_length={knobs.max_length} exceeds the model's max_position_embeddings={positions}; "
                         f"--set max_length={positions} (and buckets no longer than it)")
    if knobs.tokenizer == "naive" and not (path / "vocab.txt").is_file():
        raise FileNotFoundError(f"--model {str(path)!r}: vocab.txt is missing, which tokenizer='naive' needs; add it "
                                "or --set tokenizer=fast")
    tokenizer = make_tokenizer(knobs, str(path))
    missing = [t for t, i in (("[CLS]", getattr(tokenizer, "cls_id", 0)), ("[SEP]", getattr(tokenizer, "sep_id", 0)),
                              ("[PAD]", tokenizer.pad_id)) if i is None]
    if missing:
        raise ValueError(f"--model {str(path)!r}: tokenizer.json has no {', '.join(missing)} token; a BERT-family "
                         "tokenizer is needed (or give --model module:factory with your own tokenizer)")
    return model, tokenizer, model.source


def resolve_formatter(spec: str | None) -> Callable | None:
    """The record -> text callable ``--formatter SPEC`` names (None: the default formatter)."""
    return None if spec is None else load_callable(spec, "--formatter")


# --- a stand-in for your model, and your device's profile ------------------------------------------

def save_tiny_bert(folder: str | Path | None = None, layers: int = 2, hidden: int = 64, heads: int = 4, seed: int = 0) -> Path:
    """Write a tiny randomly initialised BERT as a sentence-transformers style folder (``config.json``,
    ``model.safetensors`` in transformers' names, the embedded model's ``tokenizer.json`` and ``vocab.txt``,
    mean pooling): a stand-in that takes the ``--model DIR`` path where no model of your own is at hand.
    Its embeddings mean nothing; its timings are those of a small encoder. ``folder=None``: a new
    temporary folder."""
    import json
    import shutil
    import tempfile

    import torch
    from safetensors.torch import save_file

    from tuning.base.assets import tokenizer_files
    from tuning.runtime.model import BertConfig, MiniLM

    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="tiny-bert-"))
    folder.mkdir(parents=True, exist_ok=True)
    vocab, tokenizer_json = tokenizer_files()
    config = {"model_type": "bert", "architectures": ["BertModel"], "vocab_size": 30522, "hidden_size": hidden,
              "num_hidden_layers": layers, "num_attention_heads": heads, "intermediate_size": 4 * hidden,
              "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}
    torch.manual_seed(seed)
    model = MiniLM(BertConfig(**{k: config[k] for k in BertConfig.__dataclass_fields__}))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    save_file(_to_hf_state(model), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(vocab, folder / "vocab.txt")
    shutil.copy(tokenizer_json, folder / "tokenizer.json")
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": hidden,
                                                                 "pooling_mode_mean_tokens": True}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    return folder


def _to_hf_state(model: Any) -> dict[str, Any]:
    """:class:`tuning.runtime.model.MiniLM`'s weights under transformers' ``BertModel`` names
    (the inverse of the loader's map)."""
    s = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    out = {"embeddings.word_embeddings.weight": s["word.weight"],
           "embeddings.position_embeddings.weight": s["position.weight"],
           "embeddings.token_type_embeddings.weight": s["token_type.weight"],
           "embeddings.LayerNorm.weight": s["emb_norm.weight"], "embeddings.LayerNorm.bias": s["emb_norm.bias"]}
    for i in range(len(model.layers)):
        p, q = f"encoder.layer.{i}.", f"layers.{i}."
        for suffix in ("weight", "bias"):
            for name, part in zip(("query", "key", "value"), s[f"{q}qkv.{suffix}"].chunk(3)):
                out[f"{p}attention.self.{name}.{suffix}"] = part.contiguous()
            out[f"{p}attention.output.dense.{suffix}"] = s[f"{q}attn_out.{suffix}"]
            out[f"{p}attention.output.LayerNorm.{suffix}"] = s[f"{q}attn_norm.{suffix}"]
            out[f"{p}intermediate.dense.{suffix}"] = s[f"{q}up.{suffix}"]
            out[f"{p}output.dense.{suffix}"] = s[f"{q}down.{suffix}"]
            out[f"{p}output.LayerNorm.{suffix}"] = s[f"{q}out_norm.{suffix}"]
    return out


