"""Server recipes (``--server NAME``): the command line each builds for its default space, the messages for an
unknown server or knob, a user's --cmd that already places a flag, and the API each recipe speaks. TEI,
Infinity and vLLM cannot run here, so their command lines are checked string for string against their
documented flags."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import installed_by_test_extra
from tuning.knobs import preset
from tuning.load.apis import API_ALIASES, API_NAMES, Api
from tuning.load.servers import EXAMPLE_COMMANDS, RECIPES, ServerKnob, recipe

ROOT = Path(__file__).resolve().parents[1]


def _default_line(name, base=None):
    r = recipe(name)
    return r.command_line(base, list(r.default_space()))


def test_flag_servers_get_their_documented_flags_for_the_default_space():
    assert _default_line("tei", "text-embeddings-router --model-id BAAI/bge-small-en-v1.5") == (
        "text-embeddings-router --model-id BAAI/bge-small-en-v1.5 --hostname 127.0.0.1 --port {port} "
        "--prometheus-port {metrics_port} "
        "--max-batch-tokens {max_batch_tokens} --max-concurrent-requests {max_concurrent_requests} "
        "--tokenization-workers {tokenization_workers} --max-client-batch-size {max_client_batch_size}")
    assert _default_line("infinity", "infinity_emb v2 --model-id BAAI/bge-small-en-v1.5") == (
        "infinity_emb v2 --model-id BAAI/bge-small-en-v1.5 --host 127.0.0.1 --port {port} --batch-size {batch_size}")
    assert _default_line("vllm", "vllm serve BAAI/bge-small-en-v1.5 --runner pooling") == (
        "vllm serve BAAI/bge-small-en-v1.5 --runner pooling --host 127.0.0.1 --port {port} --max-num-seqs {max_num_seqs} "
        "--max-num-batched-tokens {max_num_batched_tokens}")


def test_example_servers_start_from_their_own_command():
    assert _default_line("litserve") == ("python examples/litserve_server.py --port {port} "
                                         "--max-batch-size {max_batch_size} --batch-timeout {batch_timeout}")
    assert _default_line("triton") == (
        "python examples/pytriton_server.py --port {port} --metrics-port {metrics_port} "
        "--max-batch-size {max_batch_size} --max-queue-delay-us {max_queue_delay_us} --instances {instances}")
    assert _default_line("tuning") == ("python -m tuning serve --port {port} --set batch_size={batch_size} "
                                       "--set max_wait_ms={max_wait_ms}")


def test_a_server_under_test_listens_on_loopback_only():
    """#60: the Infinity recipe left Infinity on its default 0.0.0.0 (as TEI's and vLLM's defaults are): a server
    under test listened on every interface."""
    for name in RECIPES:
        line = recipe(name).command_line(EXAMPLE_COMMANDS.get(name), [])
        # this package's server and the LitServe example bind loopback by default; the PyTriton example's Triton
        # takes no address flag
        assert "127.0.0.1" in line or name in ("litserve", "triton", "tuning"), (name, line)
    assert recipe("infinity").command_line("infinity_emb v2 --model-id m --host=10.0.0.2", []).count("--host") == 1


def test_infinity_s_default_space_holds_only_what_starts_on_a_cpu():
    """#60: engine=optimum needs ONNX files the model did not have, and failed half the default grid."""
    assert set(recipe("infinity").default_space()) == {"batch_size"}
    assert "optimum" in recipe("infinity").doc and "ONNX" in recipe("infinity").doc


def test_the_default_space_starts_at_the_servers_own_default():
    assert recipe("tei").default_space()["max_batch_tokens"][0] == "16384"  # TEI's documented default
    assert recipe("triton").default_space() == {"max_batch_size": ["1", "8"], "max_queue_delay_us": ["0", "5000"],
                                                "instances": ["1", "2"]}
    tuned = preset("tuned")  # `tuning serve` runs the tuned preset unless told otherwise
    space = recipe("tuning").default_space()
    assert float(space["batch_size"][0]) == tuned.batch_size and float(space["max_wait_ms"][0]) == tuned.max_wait_ms


def test_a_placeholder_already_in_the_users_command_gets_no_second_flag():
    tei = recipe("tei")
    line = tei.command_line("text-embeddings-router --model-id m --port {port} --max-batch-tokens {max_batch_tokens}",
                            ["max_batch_tokens"])
    assert line == ("text-embeddings-router --model-id m --port {port} --max-batch-tokens {max_batch_tokens} "
                    "--hostname 127.0.0.1 --prometheus-port {metrics_port}")
    line = tei.command_line("router --prometheus-port {metrics_port} --port {port}", [])
    assert line.count("{port}") == 1 and line.count("{metrics_port}") == 1
    # a name the recipe does not know is fine where the user's --cmd places it
    line = recipe("litserve").command_line("python app.py --port {port} --workers {workers}",
                                           ["workers", "max_batch_size"])
    assert line == "python app.py --port {port} --workers {workers} --max-batch-size {max_batch_size}"


def test_unknown_server_knob_and_missing_command_name_the_value_and_the_fix():
    with pytest.raises(ValueError, match=r"--server 'teii' is not known; use one of tei, infinity, vllm, litserve"):
        recipe("teii")
    with pytest.raises(ValueError, match=r"no knob 'batch'.*max_batch_size, batch_timeout.*put \{batch\} in --cmd"):
        recipe("litserve").command_line(None, ["batch"])
    with pytest.raises(ValueError, match=r"has no knob 'x'; its knobs: batch_size"):
        recipe("infinity").knob("x")
    with pytest.raises(ValueError, match=r"--server tei needs --cmd.*--cmd 'text-embeddings-router --model-id"):
        recipe("tei").command_line(None, [])
    with pytest.raises(ValueError, match=r"--server vllm needs --cmd"):
        recipe("vllm").command_line("  ", [])
    with pytest.raises(ValueError, match=r"has no \{\}"):
        ServerKnob("bad", "--bad", ("1",), "no placeholder for the value")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_speaks_a_valid_api(name):
    r = RECIPES[name]
    assert r.api in API_NAMES or r.api in API_ALIASES
    api = Api(name=r.api, **r.api_options)
    assert api.url(r.url.replace("{port}", "8000")).startswith("http://127.0.0.1:8000/")
    assert r.knobs and all(k.values and k.help for k in r.knobs)
    assert "http" in r.doc or name == "tuning"  # every outside server links its documentation


def test_triton_speaks_kserve_to_the_minilm_model():
    api = recipe("triton").make_api()
    assert api.name == "kserve" and api.output_name == "embedding"
    assert api.url(recipe("triton").url.replace("{port}", "8000")) == "http://127.0.0.1:8000/v2/models/minilm/infer"
    assert recipe("litserve").make_api().body(["hi"]) == b'{"input": "hi", "model": "minilm"}'


def test_the_litserve_example_parses_its_flags():
    installed_by_test_extra("litserve")
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "litserve_server.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for flag in ("--port", "--max-batch-size", "--batch-timeout", "--workers-per-device"):
        assert flag in done.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "examples" / "litserve_server.py"), "--max-batch-size", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "give an integer >= 1" in bad.stderr


def test_a_flag_the_user_s_command_already_sets_is_named_instead_of_sent_twice():
    tei = recipe("tei")
    with pytest.raises(ValueError, match="--cmd already sets --port, which --server tei sets per configuration"):
        tei.command_line("text-embeddings-router --model-id m --port 8080", ["max_batch_tokens"])
    with pytest.raises(ValueError, match="already sets --max-batch-tokens"):
        tei.command_line("text-embeddings-router --model-id m --max-batch-tokens=4096", ["max_batch_tokens"])
    placed = tei.command_line("text-embeddings-router --model-id m --port {port}", ["max_batch_tokens"])
    assert placed.count("--port") == 1
    # the tuning recipe's knobs share one flag name (--set): several of them are not a repeat
    assert recipe("tuning").command_line(None, ["batch_size", "max_wait_ms"]).count("--set") == 2
