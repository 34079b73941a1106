"""HTTP front for the in-process server: ``POST /embed``, ``GET /healthz``, ``GET /metrics``.

``POST /embed`` takes one JSON object: ``{"text": "..."}`` or a record
(``{"id", "title", "category", "attributes", "body"}``). Bad input gets a 4xx with a JSON
``{"error": ...}`` naming the problem; overload is 503 (with Retry-After), a missed
deadline 504, a failed batch 500. The server stays up through all of them.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .data import RecordError, parse_line
from .metrics import prometheus_text
from .serve import SERVE_STAGES, Server

MAX_BODY_BYTES = 1 << 20
DRAIN_LIMIT_BYTES = 16 << 20  # larger bodies are cut off without reading
STATUS_BY_OUTCOME = {"ok": 200, "rejected": 503, "timeout": 504, "error": 500}


class _Handler(BaseHTTPRequestHandler):
    server_version = "tuning/0.1"
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet: /metrics is the log
        pass

    @property
    def backend(self) -> Server:
        return self.server.backend  # type: ignore[attr-defined]

    def _send(self, status: int, payload: Any, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        body = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, **extra: Any) -> None:
        self._send(status, {"error": message, **extra})

    def do_GET(self) -> None:
        if self.path == "/healthz":
            b = self.backend
            self._send(200, {"status": "ok" if b._accepting else "stopping", "queue_depth": b.queue_depth,
                             "max_queue": b.knobs.max_queue, "counts": b.counts})
        elif self.path == "/metrics":
            self._send(200, prometheus_text(self.backend), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._error(404, f"no route {self.path!r}; use POST /embed, GET /healthz or GET /metrics")

    def do_POST(self) -> None:
        if self.path != "/embed":
            self._error(404, f"no route {self.path!r}; use POST /embed")
            return
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self._error(411, "Content-Length header is required")
            return
        try:
            length = int(length_header)
        except ValueError:
            self._error(400, f"Content-Length {length_header!r} is not an integer")
            return
        if length > MAX_BODY_BYTES:
            if length <= DRAIN_LIMIT_BYTES:  # read it away so the client sees the 413, not a broken pipe
                for _ in range(0, length, 1 << 16):
                    self.rfile.read(min(1 << 16, length))
                    length -= 1 << 16
            self._error(413, f"body of {length_header} bytes is over the {MAX_BODY_BYTES}-byte limit; "
                             "send one request per POST")
            self.close_connection = True
            return
        raw = self.rfile.read(length)
        payload, problem = self._validate(raw)
        if problem:
            self._error(400, problem)
            return
        response = self.backend.submit(payload).result()
        status = STATUS_BY_OUTCOME[response.outcome]
        if response.outcome == "ok":
            body = {"id": response.id, "embedding": [round(float(x), 7) for x in response.embedding],
                    "n_tokens": response.n_tokens, "truncated": response.truncated,
                    "batch_size": response.batch_size, "latency_ms": response.latency_ms,
                    "timings_ms": {s: getattr(response, f"{s}_ms") for s in SERVE_STAGES}}
            self._send(200, body)
        else:
            headers = {"Retry-After": "1"} if status == 503 else None
            self._send(status, {"error": response.reason, "outcome": response.outcome}, headers=headers)

    @staticmethod
    def _validate(raw: bytes) -> tuple[Any, str | None]:
        """The request body to submit, or the reason it is bad."""
        try:
            obj = json.loads(raw.decode("utf-8"))  # decode first: json.loads would guess UTF-16/32 from bytes
        except UnicodeDecodeError as exc:
            return None, f"body is not valid UTF-8 (byte {exc.start}); send UTF-8 JSON"
        except json.JSONDecodeError as exc:
            return None, f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        if not isinstance(obj, dict):
            return None, f"expected a JSON object, got {type(obj).__name__}"
        if "text" in obj:
            if not isinstance(obj["text"], str):
                return None, f"field 'text' must be a string, got {type(obj['text']).__name__}"
            if not obj["text"].strip():
                return None, "field 'text' is empty"
            return obj["text"], None
        parsed = parse_line(raw, 0)
        if isinstance(parsed, RecordError):
            return None, f"{parsed.reason} (send {{\"text\": ...}} or a record with id, title, category, attributes, body)"
        return raw, None


class HttpFront:
    """A threaded HTTP server in front of a :class:`Server`; loopback by default."""

    def __init__(self, backend: Server, host: str = "127.0.0.1", port: int = 0):
        self.backend = backend
        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.backend = backend  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "HttpFront":
        self.backend.start()
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http-front", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.backend.close()
        if self._thread:
            self._thread.join(timeout=10)

    def __enter__(self) -> "HttpFront":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()
