"""A started server is waited for until it is ready, in its protocol's words (KServe v2's ready route) and in its
own (tuning/load/ready.py, tune's start): an answer that says the model is loading is waited through, a wrong
request is an error at once, and a timeout names --ready-url."""

from types import SimpleNamespace

import pytest

from tuning.load.apis import Api
from tuning.load.ready import protocol_ready_url, still_loading

MLSERVER_LOADING = "HTTP 400: Model minilm is not ready yet."


@pytest.mark.parametrize("reason, loading", [
    (MLSERVER_LOADING, True),
    ("HTTP 400: Request for unknown model: 'minilm'", True),
    ("HTTP 400: model 'minilm' is loading", True),
    ("HTTP 404: Request for unknown model: 'minilm' is not found", True),
    ("HTTP 503: Service Unavailable", True),
    ("HTTP 400: the body has no 'inputs'", False),
    ("HTTP 422: field required", False),
    ("HTTP 200 but the answer is not 1 embedding(s): no 'outputs'", False),
])
def test_an_answer_that_says_the_model_is_loading_is_told_from_a_wrong_request(reason, loading):
    assert still_loading(reason) is loading


def test_kserve_s_ready_route_is_beside_its_infer_route_and_other_protocols_have_none():
    kserve = Api(name="kserve", model_name="minilm")
    assert protocol_ready_url(kserve, kserve.url("http://127.0.0.1:8000")) == \
        "http://127.0.0.1:8000/v2/models/minilm/ready"
    assert protocol_ready_url(kserve, "http://h:1/v2/models/m/versions/2/infer") == "http://h:1/v2/models/m/versions/2/ready"
    assert protocol_ready_url(Api(name="tuning"), "http://127.0.0.1:8000/predict") is None


class _Answers:
    """http_target's stand-in: the answers of ``script`` in turn, the last one for ever after."""

    def __init__(self, script):
        self.script, self.sent = list(script), 0

    def __call__(self, body):
        from tuning.online.response import Response

        got = self.script[min(self.sent, len(self.script) - 1)]
        self.sent += 1
        return Response(0, "ok") if got == "ok" else Response(0, "error", got)

    def close(self):
        pass


def _wait(monkeypatch, answers: _Answers, api=None, timeout_s=30.0, ready_url=None):
    import tuning.load.generator as generator
    from tuning.experiments import tune

    monkeypatch.setattr(generator, "http_target", lambda *a, **k: answers)
    group = SimpleNamespace(alive=lambda: True, tail=lambda: "(its log)")
    url = api.url("http://127.0.0.1:1") if api else "http://127.0.0.1:1/predict"
    measure = SimpleNamespace(url=url, api=api, bodies=[b"{}"])
    return tune._wait_ready(group, measure, ready_url, timeout_s=timeout_s, poll_s=0.0)


def test_mlserver_s_400_while_it_loads_is_waited_through(monkeypatch):
    answers = _Answers([MLSERVER_LOADING, MLSERVER_LOADING, "ok"])
    assert _wait(monkeypatch, answers) is None and answers.sent == 3


def test_a_wrong_request_is_an_error_at_once(monkeypatch):
    answers = _Answers(["HTTP 400: the body has no 'inputs'"])
    assert _wait(monkeypatch, answers).startswith("the server answers, but not ok: HTTP 400") and answers.sent == 1


def test_a_timeout_names_ready_url(monkeypatch):
    error = _wait(monkeypatch, _Answers(["HTTP 503: loading"]), timeout_s=0.2)
    assert error.startswith("not ready within 0 s (HTTP 503: loading)") and "--ready-url" in error, error


def test_for_kserve_the_protocol_s_ready_route_is_asked_without_ready_url(monkeypatch):
    import urllib.error
    import urllib.request

    asked = []

    class Ready:
        status = 200

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def urlopen(url, timeout=None):
        asked.append(url)
        if len(asked) < 3:
            raise urllib.error.HTTPError(url, 400, "Model minilm is not ready yet.", {}, None)
        return Ready()
    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    answers = _Answers([MLSERVER_LOADING])  # its requests never turn ok here: only the ready route says ready
    assert _wait(monkeypatch, answers, api=Api(name="kserve", model_name="minilm"), timeout_s=5.0) is None
    assert asked == ["http://127.0.0.1:1/v2/models/minilm/ready"] * 3
