"""Any service: the request builder and the answer check of each API on its documented example bodies, and
``loadtest``/``watch`` against stand-ins of TEI, an OpenAI endpoint, KServe v2 and a LitServe-style app."""

import contextlib
import io
import json
import os

import pytest

from tests.standin_services import StandIn
from tuning import cli
from tuning.load.apis import Api, ApiError, error_text, parse_headers


def test_request_bodies_follow_each_documented_schema():
    texts = ["a", "bb"]
    assert json.loads(Api("tei", client_batch=2).body(texts)) == {"inputs": texts, "truncate": True}
    assert json.loads(Api("openai", model_name="m", client_batch=2).body(texts)) == {"input": texts, "model": "m"}
    assert json.loads(Api("kserve", model_name="minilm", client_batch=2).body(texts)) == {
        "inputs": [{"name": "TEXT", "shape": [2, 1], "datatype": "BYTES", "data": texts}]}
    assert json.loads(Api("tuning").body(["a"])) == {"text": "a"}
    custom = Api("custom", template={"input": "{text}", "params": {"norm": True, "note": "{text} x"}})
    assert json.loads(custom.body(["a"])) == {"input": "a", "params": {"norm": True, "note": "{text} x"}}
    many = Api("custom", template={"batch": "{texts}"}, client_batch=2)
    assert json.loads(many.body(texts)) == {"batch": texts}


def test_openai_sends_one_text_as_a_string_and_a_batch_as_a_list():
    """OpenAI clients send a bare string for one text; LitServe's OpenAI spec under dynamic batching rejects a
    list (its 400 "does not support dynamic batching when client-side batching is used")."""
    assert json.loads(Api("openai", model_name="m").body(["a"])) == {"input": "a", "model": "m"}
    assert json.loads(Api("openai").encode(["a", "b"])[1]) == {"input": "b"}
    assert json.loads(Api("openai", client_batch=2).encode(["a", "b", "c"])[1]) == {"input": ["c", "a"]}


def test_each_api_is_one_schema_and_triton_is_another_name_for_kserve():
    from tuning.load.apis import API_NAMES, SCHEMAS

    assert tuple(SCHEMAS) == API_NAMES and all(SCHEMAS[n].name == n for n in API_NAMES)
    triton = Api("triton", model_name="minilm", output_name="embedding", client_batch=2)
    kserve = Api("kserve", model_name="minilm", output_name="embedding", client_batch=2)
    assert triton == kserve and triton.describe()["api"] == "kserve"  # the protocol on the wire, said as such
    assert triton.body(["a", "b"]) == kserve.body(["a", "b"])
    assert triton.url("http://h:8000") == "http://h:8000/v2/models/minilm/infer"
    with pytest.raises(ApiError, match="--api triton needs --model-name"):
        Api("triton")
    with pytest.raises(ApiError, match=r"--api 'teii' is not known; use one of tuning, tei, openai, kserve, custom or "
                                       r"triton \(= kserve\)"):
        Api("teii")


def test_routes_from_the_api_the_url_or_route():
    assert Api("tei").url("http://h:8080") == "http://h:8080/embed"
    assert Api("openai").url("https://h/") == "https://h/v1/embeddings"
    assert Api("kserve", model_name="minilm").url("http://h:8000") == "http://h:8000/v2/models/minilm/infer"
    assert Api("openai").url("http://h/api/v1/embeddings") == "http://h/api/v1/embeddings"
    assert Api("custom", template={"input": "{text}"}, route="/predict").url("http://h:8200/x") == "http://h:8200/predict"


def test_answers_are_checked_for_one_embedding_per_text():
    tei = Api("tei", client_batch=2)
    assert tei.check(200, b"[[0.1, 0.2], [0.3, 0.4]]")[0] == "ok"
    outcome, reason, _ = tei.check(200, b"[[0.1, 0.2]]")
    assert outcome == "error" and "1 embeddings for 2" in reason
    assert tei.check(200, b"[[0.1, 0.2], [0.3]]")[0] == "error"  # dimensions differ
    openai = Api("openai", client_batch=2)
    ok = {"data": [{"embedding": [1, 2], "index": 1}, {"embedding": [3, 4], "index": 0}]}
    assert openai.check(200, json.dumps(ok).encode())[0] == "ok"
    ks = Api("kserve", model_name="m", client_batch=2)
    answer = {"outputs": [{"name": "emb", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]}]}
    assert ks.check(200, json.dumps(answer).encode())[0] == "ok"
    assert "no output named 'x'" in Api("kserve", model_name="m", output_name="x").check(200, json.dumps(answer).encode())[1]
    assert Api("custom", template={"input": "{text}"}).check(200, b'{"output": [0.1, 0.2]}')[0] == "ok"
    assert Api("custom", template={"input": "{text}"}, validate=False).check(200, b"not json")[0] == "ok"
    assert Api("custom", template={"input": "{text}"}).check(200, b"not json")[0] == "error"


def test_error_reasons_come_from_the_body():
    assert error_text({"detail": [{"msg": "Field required"}]}, b"") == '[{"msg": "Field required"}]'
    assert error_text({"error": {"message": "Incorrect API key"}}, b"") == "Incorrect API key"
    assert error_text(None, b"Internal Server Error") == "Internal Server Error"
    outcome, reason, _ = Api("tei").check(503, b'{"error": "Model is overloaded"}')
    assert outcome == "rejected" and reason == "HTTP 503: Model is overloaded"


def test_bad_settings_name_the_value_and_the_fix():
    with pytest.raises(ApiError, match="--model-name"):
        Api("kserve")
    with pytest.raises(ApiError, match="no string value is exactly"):
        Api("custom", template={"input": "text"})
    with pytest.raises(ApiError, match="one text per request"):
        Api("tuning", client_batch=4)
    with pytest.raises(ApiError, match="'Name: value'"):
        parse_headers(["Authorization Bearer x"])
    with pytest.raises(ApiError, match="http:// or https://"):
        Api("tei").url("localhost:8080")
    assert Api("openai", headers=parse_headers(["Authorization: Bearer s3cret"])).describe()["headers"] == {
        "Authorization": "***"}


def _run(*argv):
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(list(argv))
    return code, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def standin():
    with StandIn() as url:
        yield url


@pytest.mark.parametrize("flags", [
    ["--api", "tei", "--client-batch", "4"],
    ["--api", "openai", "--model-name", "minilm", "--header", "Authorization: Bearer s3cret", "--client-batch", "2"],
    ["--api", "kserve", "--model-name", "minilm", "--output-name", "embedding", "--client-batch", "3"],
    ["--body", '{"input": "{text}"}', "--route", "/predict"],
])
def test_loadtest_speaks_each_api_with_no_errors(standin, flags):
    code, out, err = _run("loadtest", "--url", standin, "--requests", "40", "--concurrency", "4", "--limit", "30",
                          "--json", *flags)
    assert code == 0, err
    s = json.loads(out)
    assert s["errors"] == 0 and s["ok"] == 40 and s["texts_per_s"] == pytest.approx(s["qps"] * s["texts_per_request"])
    assert "s3cret" not in out  # a bearer token is never echoed
    if "tei" in flags:
        assert s["stages"]["inference"]["p50_ms"] == pytest.approx(3.0)  # TEI's own x-inference-time header


def test_the_wrong_schema_fails_with_the_services_reason(standin):
    code, out, err = _run("loadtest", "--url", standin + "/predict", "--requests", "10", "--limit", "10")
    assert code == 1 and "Internal Server Error" in err  # LitServe's KeyError on {"text": ...}
    code, out, err = _run("loadtest", "--url", standin, "--api", "openai", "--requests", "10", "--limit", "10")
    assert code == 1 and "Incorrect API key" in err
    code, out, err = _run("loadtest", "--url", standin + "/wrong", "--body", '{"input": "{text}"}', "--requests", "10",
                          "--limit", "10")
    assert code == 1 and "not 1 embedding" in err
    code, out, err = _run("loadtest", "--url", standin + "/wrong", "--body", '{"input": "{text}"}', "--requests", "10",
                          "--limit", "10", "--no-validate", "--json")
    assert code == 0 and json.loads(out)["ok"] == 10


def test_watch_gets_no_diagnosis_without_an_ok_answer(standin):
    code, out, err = _run("watch", "--pid", str(os.getpid()), "--url", standin + "/predict", "--duration", "1",
                          "--limit", "10")
    assert code == 1 and "Internal Server Error" in err
    code, out, err = _run("watch", "--pid", str(os.getpid()), "--url", standin + "/predict", "--duration", "1",
                          "--limit", "10", "--body", '{"input": "{text}"}', "--json")
    assert code == 0, err


@pytest.mark.slow
@pytest.mark.thirdparty
def test_locust_sends_the_same_bodies_to_the_same_route(standin):
    code, out, err = _run("loadtest", "--engine", "locust", "--url", standin, "--api", "tei", "--client-batch", "2",
                          "--duration", "1.5", "--concurrency", "2", "--limit", "20", "--warmup-s", "0.5", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["errors"] == 0 and s["ok"] > 0 and s["texts_per_request"] == 2
    code, out, err = _run("loadtest", "--engine", "locust", "--url", standin + "/wrong", "--body", '{"input": "{text}"}',
                          "--duration", "1", "--concurrency", "2", "--limit", "10", "--warmup-s", "0.5")
    assert code == 1 and "not 1 embedding" in err  # the worker ran the same answer check


def test_teis_own_metrics_are_read_over_the_window(standin):
    code, out, err = _run("loadtest", "--url", standin, "--api", "tei", "--client-batch", "4", "--requests", "30",
                          "--concurrency", "2", "--limit", "40", "--json")
    assert code == 0, err
    m = json.loads(out)["server_metrics"]
    assert m["exporter"] == "tei" and m["url"] == standin + "/metrics"
    assert m["values"]["mean_batch"] == pytest.approx(4.0)  # te_batch_next_size: 4 texts per request
    assert m["values"]["queue_ms"] == pytest.approx(1.5) and m["values"]["inference_ms"] == pytest.approx(3.0)
    code, out, err = _run("loadtest", "--url", standin, "--api", "tei", "--requests", "5", "--limit", "5",
                          "--metrics-url", "http://127.0.0.1:9/metrics", "--json")
    assert code == 0 and json.loads(out)["server_metrics"]["exporter"] is None  # unreachable: said, not fatal


def test_sweep_concurrency_drives_a_running_service(standin):
    code, out, err = _run("sweep", "concurrency", "--url", standin, "--api", "tei", "--values", "1,4", "--requests",
                          "20", "--limit", "20", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert [p["concurrency"] for p in s["points"]] == [1, 4]
    assert all(p["errors"] == 0 and p["ok"] == 20 and p["mean_batch"] == pytest.approx(1.0) for p in s["points"])
    code, out, err = _run("sweep", "concurrency", "--url", standin, "--api", "tei", "--values", "1,4", "--requests",
                          "20", "--limit", "20")
    assert code == 0 and "concurrency" in out
    assert [line for line in out.splitlines() if len(line) > 100] == []  # issue 58: output fits 100 columns
    code, _, err = _run("sweep", "wait", "--url", standin, "--values", "0,5")
    assert code == 2 and "tune --cmd" in err


def test_client_processes_split_the_load_and_merge_every_outcome(standin):
    code, out, err = _run("loadtest", "--url", standin, "--api", "tei", "--client-procs", "2", "--requests", "41",
                          "--concurrency", "4", "--limit", "30", "--warmup", "3", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["ok"] == 41 and s["submitted"] == 41 and s["concurrency"] == 4  # 21 + 20, every one counted once
    assert s["server_metrics"]["exporter"] == "tei"  # the first process read the metrics at its window's edges
    code, _, err = _run("loadtest", "--url", standin, "--client-procs", "5", "--concurrency", "4", "--requests", "8")
    assert code == 2 and "--client-procs 5 > --concurrency 4" in err
    code, _, err = _run("loadtest", "--client-procs", "2", "--requests", "8")
    assert code == 2 and "--client-procs" in err


def test_merged_percentiles_are_over_the_union_not_averaged():
    from tuning.load.generator import LoadResult
    from tuning.load.procs import merge
    from tuning.online.response import Response

    def result(latencies_ms, start):
        responses = [Response(i, "ok", None, t_submit=start, t_done=start + ms / 1000) for i, ms in
                     enumerate(latencies_ms)]
        r = LoadResult("closed", 2, None, responses, start, start + 1.0)
        r.timings = [(start, start, start + ms / 1000) for ms in latencies_ms]
        r.ok_in_window = len(responses)
        return r
    fast, slow = result([1.0] * 99, 10.0), result([100.0], 10.0)
    m = merge([fast, slow])
    assert m.submitted == 100 and m.concurrency == 4
    assert m.latency()["p50"] == pytest.approx(1.0, abs=0.01)  # averaging the two p50s would say 50.5 ms
    assert m.qps == pytest.approx(100.0)


def test_merged_in_flight_is_the_sum_of_each_process_count():
    """Two processes with 3 and 5 in flight: 8 at once, not a saw between 3 and 5 (the series interleaved)."""
    from tuning.load.procs import summed_inflight

    a = [(1.0, 1), (2.0, 3), (5.0, 2)]
    b = [(1.5, 5), (4.0, 0)]
    assert summed_inflight([a, b]) == [(1.0, 1), (1.5, 6), (2.0, 8), (4.0, 3), (5.0, 2)]
    assert summed_inflight([]) == [] and summed_inflight([a]) == a


def test_a_kserve_url_naming_another_model_than_model_name_is_refused():
    """#60: with --url .../v2/models/minilm/infer, a wrong --model-name foo was silently ignored (the URL's route
    was used, and the name went into the metrics' filter and the ready route)."""
    from tuning.load.apis import Api, ApiError

    api = Api("kserve", model_name="foo")
    with pytest.raises(ApiError, match=r"--url .*/v2/models/minilm/infer names the model 'minilm' but "
                                       r"--model-name is 'foo'"):
        api.url("http://127.0.0.1:8000/v2/models/minilm/infer")
    assert Api("kserve", model_name="minilm").url("http://h:1/v2/models/minilm/versions/2/infer") == \
        "http://h:1/v2/models/minilm/versions/2/infer"
    assert api.url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v2/models/foo/infer"


def test_a_full_kserve_url_carries_its_model_name():
    """Issue 60: `--api kserve --url http://h:8000/v2/models/minilm/infer` asked for --model-name, though the
    URL names the model; a URL without it still asks, and a contradicting --model-name is still an error."""
    from tuning.cli.commands import api_from_args, build_parser

    def api(*argv):
        return api_from_args(build_parser().parse_args(["loadtest", "--requests", "2", *argv]))

    assert api("--api", "kserve", "--url", "http://h:8000/v2/models/minilm/infer").model_name == "minilm"
    assert api("--api", "triton", "--url", "http://h:8000/v2/models/m2/versions/1/infer").model_name == "m2"
    with pytest.raises(ApiError, match="--model-name"):
        api("--api", "kserve", "--url", "http://h:8000/")
    mismatch = api("--api", "kserve", "--model-name", "other", "--url", "http://h:8000/v2/models/minilm/infer")
    with pytest.raises(ApiError, match="names the model 'minilm' but --model-name is 'other'"):
        mismatch.url("http://h:8000/v2/models/minilm/infer")


def test_an_open_loop_is_not_capped_by_the_closed_loop_s_clients(standin):
    """``loadtest --rate R`` without --concurrency keeps the engine's open-loop cap: a server that overlaps 100 ms
    answers needs 15 in flight at 150/s, and a cap of 8 would measure the client (80/s, seconds of send lag)."""
    rate = 150.0
    code, out, err = _run("loadtest", "--url", standin + "/slow", "--body", '{"input": "{text}"}', "--rate", str(rate),
                          "--duration", "2", "--warmup", "8", "--limit", "50", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["concurrency"] >= 64, s["concurrency"]
    assert s["qps"] >= 0.85 * rate, (s["qps"], err)
    assert "clients was busy" not in err, err
