"""``examples/pytriton_server.py`` without PyTriton: what it sets up before Triton starts (the server itself
runs in ``tests/test_triton.py``)."""

import importlib.util
from pathlib import Path

import pytest

SERVER = Path(__file__).resolve().parents[1] / "examples" / "pytriton_server.py"


@pytest.fixture
def server_module():
    spec = importlib.util.spec_from_file_location("pytriton_server_example", SERVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its PyTriton imports are inside the functions that serve
    return module


def test_instances_load_one_at_a_time_unless_the_caller_chose(server_module, monkeypatch):
    """Two instances loaded in parallel raced PyTriton's configuration socket (a model that failed to load in
    CI); Triton reads this variable when it loads a model."""
    monkeypatch.setenv("TRITON_PARALLEL_INSTANCE_LOADING", "")  # recorded, so that the end of the test restores it
    monkeypatch.delenv("TRITON_PARALLEL_INSTANCE_LOADING")
    server_module.load_instances_one_at_a_time()
    assert server_module.os.environ["TRITON_PARALLEL_INSTANCE_LOADING"] == "0"
    monkeypatch.setenv("TRITON_PARALLEL_INSTANCE_LOADING", "")  # empty: unset, to Triton
    server_module.load_instances_one_at_a_time()
    assert server_module.os.environ["TRITON_PARALLEL_INSTANCE_LOADING"] == "0"
    monkeypatch.setenv("TRITON_PARALLEL_INSTANCE_LOADING", "1")
    server_module.load_instances_one_at_a_time()
    assert server_module.os.environ["TRITON_PARALLEL_INSTANCE_LOADING"] == "1"
