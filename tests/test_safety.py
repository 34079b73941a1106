"""Safety (issue 13 item 5): loopback by default (a warning elsewhere), a body size limit, safetensors
only, nothing fetched from the network at run time, user paths never executed or unpickled."""

import json
import pickle
import socket
import warnings

import pytest

from tests.helpers import TinyModel
from tuning.knobs import Knobs
from tuning.online.httpfront import MAX_BODY_BYTES, HttpFront
from tuning.online.serve import Server
from tuning.runtime.engine import Engine

KNOBS = Knobs(num_workers=1, batch_size=4, tokenizer="fast", padding="bucket", max_wait_ms=2.0)


class _Bomb:
    """Unpickling this writes a marker file: proof that something unpickled a user's file."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_cli_serve_binds_loopback_by_default():
    from tuning.cli.commands import build_parser

    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1"


def test_binding_elsewhere_warns():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        front = HttpFront(Server(KNOBS, engine=Engine(KNOBS, TinyModel())), host="0.0.0.0", port=0)
        front.sock.close()
    assert any("reachable from other machines" in str(w.message) for w in caught)


def test_body_size_limit_is_one_mebibyte_and_enforced():
    assert MAX_BODY_BYTES == 1 << 20
    with HttpFront(Server(KNOBS, engine=Engine(KNOBS, TinyModel())), port=0) as front:
        host, port = front.url.split("//")[1].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1))
            assert sock.recv(100).split(b" ")[1] == b"413"


def test_pickled_weights_are_refused_and_never_unpickled(tmp_path):
    from tuning.runtime.model import load_bert_dir

    marker = tmp_path / "unpickled"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    for name in ("pytorch_model.bin", "model.pt"):
        (tmp_path / name).write_bytes(pickle.dumps(_Bomb(marker)))
    with pytest.raises((FileNotFoundError, ValueError)) as info:
        load_bert_dir(tmp_path)
    assert not marker.exists()
    assert "safetensors" in str(info.value) or "lacks" in str(info.value)


def test_a_pickle_given_as_data_is_read_as_text_never_unpickled(tmp_path):
    from tuning.offline.pipeline import Pipeline

    marker = tmp_path / "unpickled"
    data = tmp_path / "data.jsonl"
    data.write_bytes(pickle.dumps(_Bomb(marker)))
    result = Pipeline(Knobs(num_workers=0, batch_size=4, tokenizer="fast"), model=TinyModel()).run(
        data, warmup_batches=0)
    assert not marker.exists() and result.ok == 0 and result.errors >= 1


def test_nothing_is_fetched_from_the_network(monkeypatch):
    """Load the embedded model and tokenizer and serve a request with every non-loopback connection refused."""
    real_connect = socket.socket.connect
    tried = []

    def loopback_only(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in ("127.0.0.1", "::1", "localhost"):
            tried.append(address)
            raise OSError(f"test: network access to {address} refused")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: (_ for _ in ()).throw(
        OSError(f"test: DNS lookup of {host} refused")) if host not in ("127.0.0.1", "::1", "localhost") else
        socket._real_getaddrinfo(host, *a, **k) if hasattr(socket, "_real_getaddrinfo") else [])
    from tuning.runtime.model import load_minilm

    model = load_minilm()
    with Server(KNOBS, engine=Engine(KNOBS, model)) as server:
        answer = server.submit("is anything fetched?").result(timeout=60)
    assert answer.outcome == "ok" and not tried
