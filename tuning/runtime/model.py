"""The embedded model (all-MiniLM-L6-v2), loaded offline from safetensors, and how to bring your own.

The encoder is a compact BERT written against ``torch`` only, so that it imports fast,
runs under ``torch.compile`` and CUDA-graph capture without dynamic control flow, and can
be built from ``config.json`` with random weights where the weights are not installed
(the GPU check does that). Pooling is the model's own: mean over real tokens, then L2
normalisation. Its outputs match ``SentenceTransformer.encode`` (see tests).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from tuning.base.assets import CONFIG_IN_REPO, INSTALL_HINT, embedded_model_dir

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_file(cls, path: str | Path) -> "BertConfig":
        raw = json.loads(Path(path).read_text())
        if raw.get("hidden_act", "gelu") != "gelu" or raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: only BERT with gelu and absolute positions is supported")
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__})


class _Layer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.heads = c.num_attention_heads
        self.qkv = nn.Linear(c.hidden_size, 3 * c.hidden_size)
        self.attn_out = nn.Linear(c.hidden_size, c.hidden_size)
        self.attn_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.up = nn.Linear(c.hidden_size, c.intermediate_size)
        self.down = nn.Linear(c.intermediate_size, c.hidden_size)
        self.out_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = self.attn_norm(x + self.attn_out(ctx.transpose(1, 2).reshape(b, t, h)))
        return self.out_norm(x + self.down(F.gelu(self.up(x))))


class MiniLM(nn.Module):
    """BERT encoder + mean pooling + L2 normalisation: ``(input_ids, attention_mask) -> [B, hidden]``."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.word = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.emb_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layers = nn.ModuleList(_Layer(config) for _ in range(config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.word(input_ids) + self.position.weight[:t] + self.token_type.weight[0]
        x = self.emb_norm(x)
        mask = attention_mask.to(x.dtype)
        bias = ((1.0 - mask) * torch.finfo(x.dtype).min)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, bias)
        summed = (x * mask[..., None]).sum(dim=1)
        pooled = summed / mask.sum(dim=1, keepdim=True).clamp(min=1e-9)
        return F.normalize(pooled.float(), p=2, dim=1)


def _convert_hf_state(state: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """Map a Hugging Face ``BertModel`` safetensors state dict onto :class:`MiniLM`."""
    state = {k.removeprefix("bert."): v for k, v in state.items()}
    out = {
        "word.weight": state["embeddings.word_embeddings.weight"],
        "position.weight": state["embeddings.position_embeddings.weight"],
        "token_type.weight": state["embeddings.token_type_embeddings.weight"],
        "emb_norm.weight": state["embeddings.LayerNorm.weight"],
        "emb_norm.bias": state["embeddings.LayerNorm.bias"],
    }
    for i in range(n_layers):
        p = f"encoder.layer.{i}."
        for suffix in ("weight", "bias"):
            out[f"layers.{i}.qkv.{suffix}"] = torch.cat(
                [state[f"{p}attention.self.{n}.{suffix}"] for n in ("query", "key", "value")]
            )
            out[f"layers.{i}.attn_out.{suffix}"] = state[f"{p}attention.output.dense.{suffix}"]
            out[f"layers.{i}.attn_norm.{suffix}"] = state[f"{p}attention.output.LayerNorm.{suffix}"]
            out[f"layers.{i}.up.{suffix}"] = state[f"{p}intermediate.dense.{suffix}"]
            out[f"layers.{i}.down.{suffix}"] = state[f"{p}output.dense.{suffix}"]
            out[f"layers.{i}.out_norm.{suffix}"] = state[f"{p}output.LayerNorm.{suffix}"]
    return out


def load_minilm(model_dir: str | Path | None = None) -> MiniLM:
    """all-MiniLM-L6-v2 from a directory with ``config.json`` and ``model.safetensors`` (default: the installed package)."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir) if model_dir is not None else embedded_model_dir()
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} not found; only safetensors weights are loaded (no pickles). {INSTALL_HINT}")
    config = BertConfig.from_file(model_dir / "config.json")
    model = MiniLM(config)
    model.load_state_dict(_convert_hf_state(load_file(str(weights)), config.num_hidden_layers))
    return model.eval()


BERT_TYPES = ("bert",)  # model_type values of config.json that the BERT encoder here loads


def load_bert_dir(model_dir: str | Path) -> MiniLM:
    """A BERT-family encoder from a sentence-transformers style folder (``config.json``, safetensors
    weights, ``tokenizer.json``), with mean pooling and L2 normalisation like the embedded model.

    Safetensors only: pickled weights (``pytorch_model.bin``) are never loaded. Every missing part is
    named in the error, with what to do.
    """
    from safetensors.torch import load_file

    folder = Path(model_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"--model {str(folder)!r}: no such folder; give a sentence-transformers style folder "
                                "(config.json, model.safetensors, tokenizer.json) or module:factory")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"--model {str(folder)!r}: config.json is missing (the encoder's transformers config)")
    raw = json.loads(config_path.read_text())
    kind = raw.get("model_type", "bert")
    if kind not in BERT_TYPES:
        raise ValueError(f"--model {str(folder)!r}: model_type {kind!r} in config.json; only BERT-family encoders "
                         f"(model_type {' | '.join(map(repr, BERT_TYPES))}) load from a folder; for any other model give "
                         "--model module:factory (a Python callable that returns it)")
    missing = [k for k in BertConfig.__dataclass_fields__ if k not in raw]
    if missing:
        raise ValueError(f"--model {str(folder)!r}: config.json lacks {', '.join(missing)}")
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        if pickled:
            raise FileNotFoundError(f"--model {str(folder)!r}: found {', '.join(pickled)} but safetensors only are loaded "
                                    "(pickles can run code); convert them, e.g. model.save_pretrained(folder, "
                                    "safe_serialization=True) in transformers")
        raise FileNotFoundError(f"--model {str(folder)!r}: no *.safetensors weights (model.safetensors)")
    for name in ("tokenizer.json",):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"--model {str(folder)!r}: {name} is missing (the fast tokenizer's file, saved by "
                                    "tokenizer.save_pretrained or shipped with sentence-transformers models)")
    _check_pooling(folder)
    config = BertConfig.from_file(config_path)
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(str(shard)))
    try:
        converted = _convert_hf_state(state, config.num_hidden_layers)
    except KeyError as exc:
        raise ValueError(f"--model {str(folder)!r}: tensor {exc.args[0]} is missing from the safetensors weights; "
                         "is this a BERT encoder saved by transformers?") from None
    model = MiniLM(config)
    model.load_state_dict(converted)
    model.source = f"{folder.resolve()} (BERT, {config.num_hidden_layers} layers, hidden {config.hidden_size})"
    return model.eval()


def _check_pooling(folder: Path) -> None:
    """Only mean pooling is implemented: refuse a folder whose pooling module says otherwise."""
    for pooling in folder.glob("*_Pooling/config.json"):
        conf = json.loads(pooling.read_text())
        modes = [k.removeprefix("pooling_mode_").removesuffix("_tokens") for k, v in conf.items()
                 if k.startswith("pooling_mode_") and v]
        if modes and modes != ["mean"]:
            raise ValueError(f"--model {str(folder)!r}: pooling {modes} in {pooling.relative_to(folder)}; only mean "
                             "pooling is implemented here; give --model module:factory for another pooling")


def random_minilm(seed: int = 0) -> MiniLM:
    """MiniLM's architecture from the config kept in this repo, with random weights (for timing only)."""
    torch.manual_seed(seed)
    model = MiniLM(BertConfig.from_file(CONFIG_IN_REPO))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.dim() > 1 else p.zero_()
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
    return model.eval()


class EmbeddingModel(Protocol):
    """Bring your own model: any callable ``(input_ids [B,T] long, attention_mask [B,T] long) -> [B, D]``."""

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor: ...


def check_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The torch dtype for a ``dtype`` knob on ``device``, or a clear error if the device cannot run it."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed; allowed: {' | '.join(DTYPES)}")
    if device.type == "cpu" and dtype == "fp16":
        raise ValueError("dtype='fp16' is not supported on the CPU here; use dtype='bf16' (or 'fp32')")
    if device.type == "cuda" and dtype == "bf16" and not torch.cuda.is_bf16_supported():
        raise ValueError("dtype='bf16' is not supported by this GPU; use dtype='fp16' (or 'fp32')")
    return DTYPES[dtype]


def prepare_model(model: nn.Module, device: torch.device, dtype: str) -> nn.Module:
    """Move a model to a device and precision, in inference mode."""
    return model.to(device=device, dtype=check_dtype(dtype, device)).eval()


def miniature(model: nn.Module | None = None) -> MiniLM | None:
    """The same module code as ``model`` at a size where no op computes anything worth timing: this package's
    BERT encoder (``tuning.runtime.model.MiniLM``, also what ``--model`` folders load; None: the embedded
    model's configuration) rebuilt with its layers kept and one attention head of 2 features, an FFN of 4,
    32 vocabulary and position rows, random weights. The op sequence does not depend on these sizes. None
    for any other module (its code cannot be resized from outside)."""
    if model is None:
        config = BertConfig.from_file(CONFIG_IN_REPO)
    elif isinstance(model, MiniLM) and dataclasses.is_dataclass(model.config):
        config = model.config
    else:
        return None
    small = dataclasses.replace(config, num_attention_heads=1, hidden_size=2, intermediate_size=4, vocab_size=32,
                                max_position_embeddings=32)
    with torch.random.fork_rng(devices=[]):  # no CUDA context: it would start one on every visible GPU
        torch.manual_seed(0)
        return MiniLM(small).eval()
