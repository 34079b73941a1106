"""A PyTriton server (NVIDIA's ``nvidia-pytriton``, which ships a Triton Inference Server) serving the shipped
all-MiniLM-L6-v2 weights on the CPU behind Triton's dynamic batcher, with the batcher's knobs as flags:

    python examples/pytriton_server.py --port 8000 --metrics-port 8002 \\
        --max-batch-size 8 --max-queue-delay-us 2000 --instances 1

Model ``minilm``: input ``TEXT`` (BYTES, one text per row, a request of B texts has shape ``[B, 1]``), output
``embedding`` (FP32 ``[B, 384]``, mean-pooled and L2-normalised). Load it with this package's client:

    python -m tuning loadtest --url http://127.0.0.1:8000 --api kserve --model-name minilm \\
        --output-name embedding --metrics-url http://127.0.0.1:8002/metrics

PyTriton pins ``numpy<2``, so it runs in its own virtual environment (``tests/triton_env.py`` builds one:
``python -m venv --system-site-packages`` plus ``pip install nvidia-pytriton 'numpy<2'``). The model is plain
torch with safetensors and ``tokenizers`` (this package's BERT encoder): sentence-transformers would work too,
but its import alone takes seconds at every start, and a tuner starts the server once per configuration.

Four things PyTriton leaves to the caller, handled here:

- Its Python-backend stub is linked against ``libpython3.X.so`` and finds the system's copy first, which is
  not the interpreter running this script (pyenv, conda, a venv on another Python). The running
  interpreter's library folder goes first on ``LD_LIBRARY_PATH`` before Triton starts (Triton's process
  and the stubs it starts inherit the environment PyTriton copies from ``os.environ``).
- Stopped by a plain SIGTERM, the process dies without ``triton.stop()`` and leaves its workspace (the Triton
  binaries it copies there at every start). SIGTERM and SIGINT both stop Triton and remove the workspace
  (under ``$PYTRITON_HOME``, default ``~/.cache/pytriton``), also when the whole process group receives
  the signal and Triton exits first.
- Triton starts a model's instances in parallel, and PyTriton's second instance reads its configuration from
  a socket the first one opens: on a busy machine it connected between the first one's bind and listen and
  the model failed to load ("Connection refused" in ``get_config_from_handshake_server``). Instances load one
  after another here (``TRITON_PARALLEL_INSTANCE_LOADING=0`` unless set); it costs the start a fraction of a
  second per instance.
- PyTriton's Unix sockets live in the workspace, so ``$PYTRITON_HOME`` must be a short path (a socket's path
  has at most 107 bytes); a longer one is refused at start instead of a model load that times out.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import sysconfig
from pathlib import Path

MODEL_NAME = "minilm"
INPUT_NAME = "TEXT"
OUTPUT_NAME = "embedding"
MAX_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length (its sentence_bert_config.json); longer texts are cut
UNIX_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes on Linux, with its terminating NUL

LOG = logging.getLogger("pytriton_server")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The server's ports and the dynamic batcher's knobs, the names a tuner's ``--space`` fills in."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=8000, help="HTTP port (KServe v2) (default: 8000)")
    p.add_argument("--metrics-port", type=int, default=8002, help="Prometheus metrics port (default: 8002)")
    p.add_argument("--max-batch-size", type=int, default=8, help="the dynamic batcher's largest batch (default: 8)")
    p.add_argument("--max-queue-delay-us", type=int, default=0,
                   help="how long the batcher holds a request for others to join it, microseconds (default: 0)")
    p.add_argument("--instances", type=int, default=1, help="model instances (each its own thread here) (default: 1)")
    args = p.parse_args(argv)
    if args.max_batch_size < 1 or args.instances < 1 or args.max_queue_delay_us < 0:
        p.error("--max-batch-size and --instances must be >= 1, --max-queue-delay-us >= 0")
    return args


def free_port() -> int:
    """A free TCP port for the gRPC endpoint, which nobody here uses but Triton opens anyway."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def put_running_libpython_first() -> None:
    """The stub Triton starts must load this interpreter's ``libpython``, not the system's (see the module doc)."""
    libdir = sysconfig.get_config_var("LIBDIR")
    if not libdir:
        return
    rest = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and p != libdir]
    os.environ["LD_LIBRARY_PATH"] = ":".join([libdir, *rest])


def load_instances_one_at_a_time() -> None:
    """Triton loads the instances of a model one after another (see the module doc), unless the caller chose."""
    if not os.environ.get("TRITON_PARALLEL_INSTANCE_LOADING"):  # Triton reads an empty value as unset
        os.environ["TRITON_PARALLEL_INSTANCE_LOADING"] = "0"


def load_model():
    """The shipped MiniLM (torch, safetensors) and its fast tokenizer, padded to the longest text of a batch."""
    import torch
    from tokenizers import Tokenizer

    from tuning.base.assets import embedded_model_dir
    from tuning.runtime.model import load_minilm

    model_dir = embedded_model_dir()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_LENGTH)
    tokenizer.enable_padding()
    torch.set_grad_enabled(False)
    return load_minilm(model_dir), tokenizer


def make_infer(model, tokenizer):
    """The batched inference callable: Triton's dynamic batcher hands it the rows of several requests at once."""
    import numpy as np
    import torch
    from pytriton.decorators import batch

    @batch
    def infer(**inputs):
        texts = [row[0].decode("utf-8", errors="replace") for row in inputs[INPUT_NAME]]
        encoded = tokenizer.encode_batch(texts)
        ids = torch.tensor([e.ids for e in encoded], dtype=torch.long)
        mask = torch.tensor([e.attention_mask for e in encoded], dtype=torch.long)
        with torch.inference_mode():
            vectors = model(ids, mask)
        return {OUTPUT_NAME: vectors.numpy().astype(np.float32, copy=False)}

    return infer


def stop_on_signals() -> None:
    """SIGTERM behaves as Ctrl-C: PyTriton's ``serve()`` turns it into ``triton.stop()``, and a signal before or
    after that unwinds through the ``with Triton(...)`` block, which stops it too. A second signal is ignored so
    that it cannot cut the clean-up short."""

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def new_workspace(instances: int) -> Path:
    """A path for PyTriton's workspace under ``$PYTRITON_HOME`` like PyTriton's own default, named here so that it
    is removed here whichever of PyTriton's threads ran its own clean-up (Triton exiting first starts one).
    PyTriton puts its Unix sockets in it, whose paths may not be longer than the kernel's limit: a clear error
    here instead of a model that times out loading."""
    from pytriton.constants import PYTRITON_HOME

    PYTRITON_HOME.mkdir(parents=True, exist_ok=True)
    workspace = PYTRITON_HOME / f"workspace_{secrets.token_hex(4)}"
    longest = workspace / f"{MODEL_NAME}_0_{instances - 1}-server.sock"
    if len(str(longest).encode()) > UNIX_SOCKET_PATH_MAX:
        raise SystemExit(f"PYTRITON_HOME={PYTRITON_HOME} is too long a path for the Unix sockets PyTriton makes in it "
                         f"({longest}: over {UNIX_SOCKET_PATH_MAX} bytes); set a shorter one")
    return workspace


def serve(args: argparse.Namespace, workspace: Path) -> None:
    """Bind the model with the batcher's knobs and serve until a signal or Triton's own exit."""
    import numpy as np
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    model, tokenizer = load_model()
    config = TritonConfig(http_port=args.port, grpc_port=free_port(), metrics_port=args.metrics_port,
                          allow_metrics=True, allow_gpu_metrics=False)
    with Triton(config=config, workspace=workspace) as triton:
        triton.bind(
            model_name=MODEL_NAME,
            infer_func=[make_infer(model, tokenizer) for _ in range(args.instances)],
            inputs=[Tensor(name=INPUT_NAME, dtype=bytes, shape=(1,))],
            outputs=[Tensor(name=OUTPUT_NAME, dtype=np.float32, shape=(model.config.hidden_size,))],
            config=ModelConfig(max_batch_size=args.max_batch_size,
                               batcher=DynamicBatcher(max_queue_delay_microseconds=args.max_queue_delay_us)),
            strict=True,
        )
        LOG.info("serving %s on http://127.0.0.1:%d (metrics :%d), workspace %s", MODEL_NAME, args.port,
                 args.metrics_port, workspace)
        triton.serve()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    stop_on_signals()
    put_running_libpython_first()
    load_instances_one_at_a_time()
    workspace = new_workspace(args.instances)
    try:
        serve(args, workspace)
    except KeyboardInterrupt as exc:
        LOG.info("stopped by %s", exc or "SIGINT")
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
