"""Server recipes: what ``--server NAME`` fills in for a known embedding server, as data.

A recipe names the API schema the server speaks (:mod:`tuning.load.apis`), its endpoint, its ready check, where
its Prometheus metrics are, and its knobs: each knob is a command-line flag with a small default space whose
first value is the server's own default (the baseline a tuning run compares against). ``{port}`` and
``{metrics_port}`` are placeholders that the tuner fills with free ports; a knob's value goes in as
``{name}``, filled per configuration.

Servers whose knobs are flags (text-embeddings-inference, Infinity, vLLM) need the user's own command line
(``--cmd``, which names their model); servers whose knobs live in code or config (LitServe, Triton through
PyTriton) are started by an example script in ``examples/`` that exposes them as flags. The flags and defaults
here come from each project's documentation, linked in ``doc``; unit tests check the command lines, since
those servers cannot run here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from tuning.load.apis import Api


@dataclass(frozen=True)
class ServerKnob:
    """One server setting tuned through its command line."""

    name: str  # the --space name, e.g. "max_batch_tokens"
    flag: str  # appended to the command line, "{}" is the value, e.g. "--max-batch-tokens {}"
    values: tuple[str, ...]  # the default space's values; the FIRST is the server's own default (the baseline)
    help: str

    def __post_init__(self) -> None:
        if "{}" not in self.flag:
            raise ValueError(f"knob {self.name!r}: its flag {self.flag!r} has no {{}} for the value")
        if not self.values:
            raise ValueError(f"knob {self.name!r} has no values; give at least the server's own default")


@dataclass(frozen=True)
class Recipe:
    """How to start, reach and tune one kind of server."""

    name: str  # --server NAME
    api: str  # an apis.API_NAMES entry (or the "triton" alias)
    command: str | None  # base command line when no --cmd is given (None: --cmd is required)
    port_flag: str  # e.g. "--port {port}"
    metrics_flag: str | None  # e.g. "--metrics-port {metrics_port}" (None: metrics on the same port, or none)
    url: str  # endpoint template, e.g. "http://127.0.0.1:{port}/embed"
    ready_url: str | None  # e.g. "http://127.0.0.1:{port}/health"
    metrics_url: str | None  # e.g. "http://127.0.0.1:{metrics_port}/metrics"
    api_options: dict[str, Any] = field(hash=False)  # Api fields, e.g. {"model_name": "minilm"}
    knobs: tuple[ServerKnob, ...]
    doc: str  # one paragraph: what server, where its knobs live, link to its docs
    # the flag that binds the server to loopback where its own default is every interface (a server under test
    # listens on 127.0.0.1 only); left out when --cmd sets that flag itself
    host_flag: str | None = None

    def default_space(self) -> dict[str, list[str]]:
        """Every knob with its default values, the server's own default first."""
        return {k.name: list(k.values) for k in self.knobs}

    def knob(self, name: str) -> ServerKnob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise ValueError(f"--server {self.name} has no knob {name!r}; its knobs: {self.knob_names()}")

    def knob_names(self) -> str:
        return ", ".join(k.name for k in self.knobs) or "(none)"

    def command_line(self, base: str | None, names: Sequence[str]) -> str:
        """``base`` (or the recipe's own command) with the port flag, the metrics-port flag and one flag per
        knob in ``names`` (its value the placeholder ``{name}``) appended, each unless ``base`` already
        holds that placeholder: a user who placed it knows where the server takes it."""
        import shlex

        line = self._base(base)
        self._refuse_set_twice(line, names)
        extra = []
        if self.host_flag and self.host_flag.split()[0] not in {t.split("=", 1)[0] for t in shlex.split(line)}:
            extra.append(self.host_flag)
        if "{port}" not in line:
            extra.append(self.port_flag)
        if self.metrics_flag and "{metrics_port}" not in line:
            extra.append(self.metrics_flag)
        for name in names:
            placeholder = "{" + name + "}"
            if placeholder in line:
                continue
            if name not in {k.name for k in self.knobs}:
                raise ValueError(f"--space {name}: --server {self.name} has no knob {name!r} and --cmd holds no "
                                 f"{placeholder}; use one of its knobs ({self.knob_names()}) or put {placeholder} "
                                 "in --cmd where the server takes it")
            extra.append(self.knob(name).flag.replace("{}", placeholder))
        return " ".join([line, *extra])

    def _refuse_set_twice(self, line: str, names: Sequence[str]) -> None:
        """A flag the recipe appends that ``--cmd`` already sets would reach the server twice (TEI's parser,
        and most others, refuse a repeated flag, so every configuration would fail to start)."""
        import shlex

        tokens = {t.split("=", 1)[0] for t in shlex.split(line)}
        appended = [(self.port_flag, "{port}"), (self.metrics_flag, "{metrics_port}")]
        appended += [(self.knob(n).flag, "{" + n + "}") for n in names if n in {k.name for k in self.knobs}]
        for flag, placeholder in appended:
            name = flag.split()[0].split("=", 1)[0] if flag else None
            if name and name.startswith("--") and name in tokens and placeholder not in line:
                raise ValueError(f"--cmd already sets {name}, which --server {self.name} sets per configuration: "
                                 f"drop it from --cmd, or write {name} {placeholder} there")

    def _base(self, base: str | None) -> str:
        line = (base if base is not None else self.command or "").strip()
        if not line:
            example = EXAMPLE_COMMANDS.get(self.name, "your server's command line")
            raise ValueError(f"--server {self.name} needs --cmd: the server's own command line, which names your "
                             f"model (the port and knob flags are added), e.g. --cmd '{example}'")
        return line

    def make_api(self, **overrides: Any) -> Api:
        """The :class:`tuning.load.apis.Api` this server speaks (``overrides``: the user's own flags)."""
        return Api(name=self.api, **{**self.api_options, **overrides})


# what a user's --cmd looks like for the servers that need one (used in the message when it is missing)
EXAMPLE_COMMANDS = {
    "tei": "text-embeddings-router --model-id BAAI/bge-small-en-v1.5",
    "infinity": "infinity_emb v2 --model-id BAAI/bge-small-en-v1.5",
    "vllm": "vllm serve BAAI/bge-small-en-v1.5 --runner pooling",
}

LOCAL = "http://127.0.0.1:{port}"

TEI = Recipe(
    name="tei", api="tei", command=None,
    port_flag="--port {port}", metrics_flag="--prometheus-port {metrics_port}",
    url=LOCAL + "/embed", ready_url=LOCAL + "/health", metrics_url="http://127.0.0.1:{metrics_port}/metrics",
    api_options={},
    knobs=(
        ServerKnob("max_batch_tokens", "--max-batch-tokens {}", ("16384", "4096"),
                   "tokens per batch, all requests together (TEI's main batching lever; default 16384)"),
        ServerKnob("max_concurrent_requests", "--max-concurrent-requests {}", ("512", "64"),
                   "requests in flight before TEI refuses more (back-pressure; default 512)"),
        ServerKnob("tokenization_workers", "--tokenization-workers {}", ("8", "2"),
                   "tokenizer threads (TEI's default is about the number of CPU cores; 8 stands for it here)"),
        ServerKnob("max_client_batch_size", "--max-client-batch-size {}", ("32", "128"),
                   "texts one request may carry (default 32; matters with --client-batch)"),
    ),
    doc="Hugging Face text-embeddings-inference (`text-embeddings-router`): token-based dynamic batching in "
        "Rust, `POST /embed`, `GET /health`, Prometheus metrics on their own port (`--prometheus-port`, "
        "default 9000). Its knobs are command-line flags; give your own --cmd naming the model. "
        "https://huggingface.co/docs/text-embeddings-inference/cli_arguments",
    host_flag="--hostname 127.0.0.1",
)

INFINITY = Recipe(
    name="infinity", api="openai", command=None,
    port_flag="--port {port}", metrics_flag=None,
    url=LOCAL + "/embeddings", ready_url=LOCAL + "/health", metrics_url=LOCAL + "/metrics",
    api_options={},
    knobs=(
        ServerKnob("batch_size", "--batch-size {}", ("32", "8"), "texts per model call (default 32)"),
    ),
    doc="Infinity (`infinity_emb v2`): an OpenAI-compatible embedding server with dynamic batching, "
        "`POST /embeddings` (no /v1 unless --url-prefix), `GET /health`, Prometheus at `/metrics` on the same "
        "port. Its knobs are command-line flags; give your own --cmd naming the model. The default space tunes "
        "the batch size only: `--space engine=torch,optimum` tries ONNX Runtime, which starts only for a model "
        "with ONNX files (otherwise every optimum configuration fails to start). "
        "https://github.com/michaelfeil/infinity (CLI: `infinity_emb v2 --help`)",
    host_flag="--host 127.0.0.1",
)

VLLM = Recipe(
    name="vllm", api="openai", command=None,
    port_flag="--port {port}", metrics_flag=None,
    url=LOCAL + "/v1/embeddings", ready_url=LOCAL + "/health", metrics_url=LOCAL + "/metrics",
    api_options={},
    knobs=(
        ServerKnob("max_num_seqs", "--max-num-seqs {}", ("256", "1024"),
                   "sequences per engine step (vllm serve's default: 256, or 1024 on a card of 70 GiB or more)"),
        ServerKnob("max_num_batched_tokens", "--max-num-batched-tokens {}", ("2048", "8192"),
                   "tokens per engine step (vllm serve's default: 2048, or 8192 on a card of 70 GiB or more; "
                   "without chunked prefill, as for most pooling models, the model's max length and no less)"),
    ),
    doc="vLLM serving an embedding model (`vllm serve MODEL --runner pooling`; `--task embed` in older releases): "
        "OpenAI `POST /v1/embeddings`, `GET /health`, Prometheus at `/metrics` on the same port. Its knobs are "
        "engine arguments on the command line; give your own --cmd naming the model. "
        "https://docs.vllm.ai/en/latest/models/pooling_models/ and "
        "https://docs.vllm.ai/en/latest/configuration/serve_args.html",
    host_flag="--host 127.0.0.1",
)

LITSERVE = Recipe(
    name="litserve", api="openai", command="python examples/litserve_server.py",
    port_flag="--port {port}", metrics_flag=None,
    url=LOCAL + "/v1/embeddings", ready_url=LOCAL + "/health", metrics_url=None,
    api_options={"model_name": "minilm"},  # LitServe's OpenAI spec requires a "model" in every request
    knobs=(
        ServerKnob("max_batch_size", "--max-batch-size {}", ("1", "8"),
                   "LitAPI max_batch_size: requests per model call (default 1: no dynamic batching)"),
        ServerKnob("batch_timeout", "--batch-timeout {}", ("0.0", "0.005"),
                   "LitAPI batch_timeout: seconds a batch waits to fill (default 0.0)"),
    ),
    doc="LitServe: its batching knobs live in code (`LitAPI(max_batch_size=..., batch_timeout=...)`), so "
        "examples/litserve_server.py serves the shipped all-MiniLM-L6-v2 with LitServe's OpenAI embedding spec "
        "and takes them as flags (also --workers-per-device). `POST /v1/embeddings`, `GET /health`; no "
        "Prometheus metrics by default. https://lightning.ai/docs/litserve/features/batching",
)

TRITON = Recipe(
    name="triton", api="kserve", command="python examples/pytriton_server.py",
    port_flag="--port {port}", metrics_flag="--metrics-port {metrics_port}",
    url=LOCAL, ready_url=LOCAL + "/v2/models/{model_name}/ready",  # the route follows --model-name
    metrics_url="http://127.0.0.1:{metrics_port}/metrics",
    api_options={"model_name": "minilm", "output_name": "embedding"},
    knobs=(
        ServerKnob("max_batch_size", "--max-batch-size {}", ("1", "8"),
                   "the model's max_batch_size; the baseline is 1, no batching (the script's own default is 8)"),
        ServerKnob("max_queue_delay_us", "--max-queue-delay-us {}", ("0", "5000"),
                   "dynamic batcher: microseconds a request waits for its batch to fill (default 0)"),
        ServerKnob("instances", "--instances {}", ("1", "2"), "model instances (instance_group count)"),
    ),
    doc="NVIDIA Triton Inference Server through PyTriton: the dynamic batcher lives in the model configuration "
        "(`config.pbtxt`, or PyTriton's `ModelConfig`/`DynamicBatcher`), so examples/pytriton_server.py serves "
        "MiniLM (input TEXT as BYTES, output `embedding`) and takes them as flags. KServe v2 "
        "`POST /v2/models/minilm/infer`, ready at `/v2/models/minilm/ready` (the HTTP port opens before the "
        "model loads), Prometheus on its own port. https://triton-inference-server.github.io/pytriton/ and "
        "https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/user_guide/"
        "model_configuration.html#dynamic-batcher",
)

TUNING = Recipe(
    name="tuning", api="tuning", command="python -m tuning serve",
    port_flag="--port {port}", metrics_flag=None,
    url=LOCAL + "/embed", ready_url=LOCAL + "/healthz", metrics_url=LOCAL + "/metrics",
    api_options={},
    knobs=(
        ServerKnob("batch_size", "--set batch_size={}", ("16", "1"),
                   "the batcher's max batch size (the tuned preset's 16; 1: no batching)"),
        ServerKnob("max_wait_ms", "--set max_wait_ms={}", ("20", "5"),
                   "longest a request waits for its batch to fill (the tuned preset's 20 ms)"),
    ),
    doc="This package's own server (`python -m tuning serve`, the tuned preset by default): `POST /embed`, "
        "`GET /healthz`, Prometheus at `/metrics` on the same port; every knob of `python -m tuning knobs` is "
        "set with `--set KNOB=VALUE` (see `python -m tuning serve --help`).",
)

RECIPES: dict[str, Recipe] = {r.name: r for r in (TEI, INFINITY, VLLM, LITSERVE, TRITON, TUNING)}


def recipe(name: str) -> Recipe:
    """The recipe for ``--server NAME`` (the message lists the known ones)."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"--server {name!r} is not known; use one of {', '.join(RECIPES)}") from None
