"""The bad-input catalogue (issue 13 item 2): every bad request becomes one clear outcome with a reason.

The HTTP front and the data files here; on the command line only unknown knob names and out-of-range knob
values, on every command that takes ``--set`` (the rest of the CLI's bad-input table is issue 18's).
Loopback only; bounded request counts.
"""

import json
import socket

import pytest

from tests.helpers import TinyModel
from tuning.cli.commands import build_parser, main
from tuning.knobs import Knobs
from tuning.offline.pipeline import Pipeline
from tuning.online.httpfront import HttpFront
from tuning.online.serve import Server
from tuning.runtime.engine import Engine

KNOBS = Knobs(num_workers=1, batch_size=4, tokenizer="fast", padding="bucket", max_wait_ms=2.0, max_length=64)


@pytest.fixture(scope="module")
def front():
    with HttpFront(Server(KNOBS, engine=Engine(KNOBS, TinyModel())), port=0) as f:
        yield f


def _post(url: str, body: bytes, timeout: float = 20.0) -> tuple[int, dict]:
    """One POST on a raw socket (the body exactly as given, Content-Length its byte count)."""
    host, port = url.split("//")[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % len(body))
        try:
            sock.sendall(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered before reading it all (an oversized body)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    head, _, payload = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(payload) if payload.strip() else {}


RECORD = {"id": "r1", "title": "t", "category": "c", "attributes": {}, "body": "b"}

BAD_BODIES = [
    ("invalid-json", b'{"text": "unterminated', 400, "malformed JSON"),
    ("not-an-object", b'["text"]', 400, "expected a JSON object"),
    ("text-is-a-number", b'{"text": 42}', 400, "must be a string"),
    ("text-is-null", b'{"text": null}', 400, "must be a string"),
    ("text-is-a-list", b'{"text": ["a", "b"]}', 400, "must be a string"),
    ("missing-text", b'{"txt": "typo"}', 400, "send {\"text\""),
    ("record-wrong-type", json.dumps({**RECORD, "attributes": "x"}).encode(), 400, "attributes"),
    ("record-missing-field", json.dumps({k: v for k, v in RECORD.items() if k != "body"}).encode(), 400, "body"),
    ("empty-text", b'{"text": ""}', 400, "empty"),
    ("whitespace-text", b'{"text": " \\t\\n  "}', 400, "empty"),
    ("control-characters-only", b'{"text": "\\u0000\\u0001\\u001b"}', 400, "no visible characters"),
    ("invalid-utf8", b'{"text": "caf\xe9"}', 400, "not valid UTF-8"),
    ("lone-surrogate", b'{"text": "\\ud800"}', None, None),  # valid JSON; the tokenizer drops it: 200 or a 4xx
    ("empty-body", b"", 400, "malformed JSON"),
    ("ten-megabytes", b'{"text": "' + b"a" * (10 << 20) + b'"}', 413, "limit"),
]


@pytest.mark.parametrize("body,status,needle", [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES])
def test_bad_request_bodies_get_a_clear_4xx(front, body, status, needle):
    got, answer = _post(front.url, body)
    if status is None:
        assert got == 200 or 400 <= got < 500, (got, answer)
    else:
        assert got == status, (got, answer)
        assert needle.lower() in answer["error"].lower(), answer
    healthy, _ = front.backend.health()
    assert healthy  # and the server is still fine


def test_control_characters_inside_text_are_accepted_and_ignored(front):
    status, with_controls = _post(front.url, json.dumps({"text": "hello\x00 wor\x07ld\x1b"}).encode())
    _, plain = _post(front.url, json.dumps({"text": "hello world"}).encode())
    assert status == 200 and with_controls["n_tokens"] == plain["n_tokens"]


def test_text_far_beyond_the_token_limit_is_truncated_and_says_so(front):
    status, answer = _post(front.url, json.dumps({"text": "word " * 50_000}).encode())  # ~250 kB, 50k tokens
    assert status == 200 and answer["truncated"] is True and answer["n_tokens"] > KNOBS.max_length


def test_the_front_keeps_serving_after_the_catalogue(front):
    status, _ = _post(front.url, json.dumps({"text": "still fine"}).encode())
    counts = front.backend.counts
    assert status == 200 and sum(counts.values()) == counts["ok"] + counts["error"] + counts["timeout"] + counts["rejected"]


# --- the same catalogue in a data file: one error outcome per bad line, with its line number ----------

BAD_LINES = [b'{"text": "unterminated', b"[1, 2]", b'{"id": "x"}', b'{"text": " \\t "}',
             b'{"id": "u", "title": "caf\xe9", "category": "c", "attributes": {}, "body": "b"}', b"",
             json.dumps({**RECORD, "attributes": "x"}).encode()]


def test_bad_lines_in_a_data_file_fail_alone_with_their_line_numbers(tmp_path, shipped_lines):
    good = shipped_lines[:5]
    data = tmp_path / "mixed.jsonl"
    data.write_bytes(b"\n".join(good + BAD_LINES + good) + b"\n")
    result = Pipeline(Knobs(num_workers=0, batch_size=4, tokenizer="fast"), model=TinyModel()).run(
        data, warmup_batches=0)
    assert result.ok == 10 and result.errors == len(BAD_LINES)
    bad = [r for r in result.requests if r.outcome == "error"]
    assert [r.index for r in bad] == list(range(6, 6 + len(BAD_LINES)))
    assert all(r.reason for r in bad)


# --- knob names and values on every command that takes --set ----------------------------------------

def _commands_with_set() -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return [name for name, p in sub.choices.items() if any("--set" in a.option_strings for a in p._actions)]


COMMANDS = _commands_with_set()
BAD_KNOBS = [("bogus_knob=1", "unknown knob"), ("batch_size=0", "batch_size"), ("batch_size=many", "batch_size"),
             ("max_length=100000", "max_length"), ("dtype=fp7", "dtype"), ("max_queue=-5", "max_queue"),
             ("deadline_ms=-1", "deadline_ms"), ("padding=sideways", "padding")]


def test_every_knob_command_is_covered():
    assert {"run", "serve", "loadtest", "sweep"} <= set(COMMANDS), COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("assignment,needle", BAD_KNOBS, ids=[a for a, _ in BAD_KNOBS])
def test_bad_knobs_exit_2_naming_the_knob(command, assignment, needle, capsys):
    extra = {"sweep": ["batch"], "loadtest": ["--requests", "5"]}.get(command, [])  # otherwise valid
    code = main([command, *extra, "--set", assignment])
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and "Traceback" not in err
