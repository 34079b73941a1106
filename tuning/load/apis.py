"""The request schemas of the common embedding servers: one builder of request bodies and one check of
answers, used by the asyncio client (:mod:`tuning.load.generator`) and the locust engine alike, so both
send the same bodies to the same route and judge the answers the same way.

=========  ==========================================  ===============================================
``--api``  request (``POST``)                          answer
=========  ==========================================  ===============================================
tuning     ``/embed {"text": ...}`` (or a record)      ``{"id": ..., "embedding": [...], ...}``
tei        ``/embed {"inputs": [...], "truncate":      ``[[float, ...], ...]``
           true}`` (text-embeddings-inference)
openai     ``/v1/embeddings {"input": "..." or [...],  ``{"data": [{"embedding": [...], "index": i}]}``
           "model": M}`` (vLLM, Infinity, LitServe;
           one text as a string, a batch as a list)
kserve     ``/v2/models/NAME/infer {"inputs": [{"name":  ``{"outputs": [{"name": ..., "shape": [B, D],
           N, "shape": [B, 1], "datatype": "BYTES",    "data": [...]}]}``
           "data": [...]}]}`` (KServe v2, Triton;
           ``triton`` is another name for it)
custom     ``--body`` template with ``--route``        one embedding per text (a list of vectors, one
                                                       vector, or a dict holding them), or anything
                                                       with ``--no-validate``
=========  ==========================================  ===============================================

A custom template is parsed as JSON; a string value exactly ``"{text}"`` becomes the text and one exactly
``"{texts}"`` the list of texts; nothing else is substituted. An answer is ok only when its status is 2xx
and its body parses, for its API, to one embedding per text sent, all of one dimension; otherwise it is an
error whose reason comes from the body (``error``, ``detail``, ``message``, or its first 200 bytes).
Each API is one :class:`Schema` subclass in :data:`SCHEMAS`; :class:`Api` holds the settings and hands every
request and answer to its schema. Pure Python and JSON: the locust workers import it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Sequence
from urllib.parse import urlsplit, urlunsplit

import orjson

KSERVE_ROUTE = re.compile(r"/v2/models/([^/]+)(?:/versions/[^/]+)?/infer")  # KServe v2: the model it names
API_NAMES = ("tuning", "tei", "openai", "kserve", "custom")
API_ALIASES = {"triton": "kserve"}  # Triton speaks the KServe v2 protocol: one schema, two names a user may know
DEFAULT_ROUTES = {"tuning": "/embed", "tei": "/embed", "openai": "/v1/embeddings"}
SECRET_HEADERS = ("authorization", "x-api-key", "api-key", "proxy-authorization", "cookie")
# TEI's response headers (milliseconds) -> this package's server-side stages
TEI_TIMING_HEADERS = {"x-tokenization-time": "preprocess", "x-queue-time": "queue_wait", "x-inference-time": "inference"}


class ApiError(ValueError):
    """A bad ``--api`` setting: the message names the value and the fix."""


# --- one class per schema: stateless, the Api's settings passed in, so one instance serves every Api ---


class Schema:
    """How one API's requests are built and its answers read. The base reads TEI's timing headers for every
    schema, since a proxy or a server of another API may forward them; a schema adds only what differs."""

    name = ""

    def check_settings(self, api: "Api", given: str) -> None:
        """Raise ApiError naming the flag when ``api``'s settings cannot speak this schema (``given``: the
        name the user wrote, an alias included)."""

    def default_route(self, api: "Api") -> str:
        return DEFAULT_ROUTES.get(self.name, "/")

    def check_route(self, api: "Api", url: str, path: str) -> None:
        """Raise ApiError when the route ``path`` of ``url`` contradicts ``api``'s settings."""

    def body(self, api: "Api", texts: list[str]) -> bytes:
        raise NotImplementedError

    def embeddings(self, api: "Api", payload: Any, n: int, exact: bool) -> list[list[float]]:
        raise NotImplementedError

    def server_stages(self, headers: Any) -> dict[str, float]:
        """Server-side stage times (ms) from the answer's headers: TEI's ``x-*-time`` headers."""
        out: dict[str, float] = {}
        if headers is None:
            return out
        for header, stage in TEI_TIMING_HEADERS.items():
            value = headers.get(header)
            if value is not None:
                try:
                    out[stage] = float(value)
                except ValueError:
                    pass
        return out


class TuningSchema(Schema):
    """This package's own ``/embed``: one text per request; the answer carries an embedding only when asked."""

    name = "tuning"

    def check_settings(self, api: "Api", given: str) -> None:
        if api.client_batch != 1:
            raise ApiError("--client-batch: this package's /embed takes one text per request; use --api tei, openai, "
                           "kserve or a --body with \"{texts}\" for batches")

    def body(self, api: "Api", texts: list[str]) -> bytes:
        return json.dumps({"text": texts[0]}).encode()

    def embeddings(self, api: "Api", payload: Any, n: int, exact: bool) -> list[list[float]]:
        if isinstance(payload, dict) and "error" not in payload:
            emb = payload.get("embedding")
            return [_vector(emb)] if emb is not None else [[0.0]]  # the server sends embeddings only when asked
        raise ValueError("expected a JSON object without an 'error'")


class TeiSchema(Schema):
    """text-embeddings-inference's ``/embed``: a list of texts in, a bare matrix out."""

    name = "tei"

    def body(self, api: "Api", texts: list[str]) -> bytes:
        return json.dumps({"inputs": texts, "truncate": True}).encode()

    def embeddings(self, api: "Api", payload: Any, n: int, exact: bool) -> list[list[float]]:
        return _matrix(payload, "a list of vectors", exact)


class OpenAISchema(Schema):
    """OpenAI's ``/v1/embeddings`` (vLLM, Infinity, LitServe): one text goes as a string, as OpenAI clients
    send it (LitServe's spec under dynamic batching refuses a list), a batch as a list."""

    name = "openai"

    def body(self, api: "Api", texts: list[str]) -> bytes:
        obj: dict[str, Any] = {"input": texts[0] if api.client_batch == 1 else texts}
        if api.model_name:
            obj["model"] = api.model_name
        return json.dumps(obj).encode()

    def embeddings(self, api: "Api", payload: Any, n: int, exact: bool) -> list[list[float]]:
        if not isinstance(payload, dict) or not isinstance(payload.get("data"), list):
            raise ValueError("expected {\"data\": [{\"embedding\": [...], \"index\": i}, ...]}")
        rows = sorted(payload["data"], key=lambda d: d.get("index", 0) if isinstance(d, dict) else 0)
        return [_vector(d.get("embedding") if isinstance(d, dict) else None) for d in rows]


class KServeSchema(Schema):
    """KServe's v2 inference protocol (Triton): a BYTES tensor of shape [B, 1] in, a flat [B, D] tensor out."""

    name = "kserve"

    def check_settings(self, api: "Api", given: str) -> None:
        if not api.model_name and not api.route:
            raise ApiError(f"--api {given} needs --model-name NAME (the route is /v2/models/NAME/infer) or --route")

    def default_route(self, api: "Api") -> str:
        return f"/v2/models/{api.model_name}/infer"

    def check_route(self, api: "Api", url: str, path: str) -> None:
        named = KSERVE_ROUTE.fullmatch(path)
        if named and api.model_name and named.group(1) != api.model_name:
            raise ApiError(f"--url {url} names the model {named.group(1)!r} but --model-name is {api.model_name!r}: "
                           "give one of them, or make them agree")

    def body(self, api: "Api", texts: list[str]) -> bytes:
        return json.dumps({"inputs": [{"name": api.input_name, "shape": [len(texts), 1], "datatype": "BYTES",
                                       "data": texts}]}).encode()

    def embeddings(self, api: "Api", payload: Any, n: int, exact: bool) -> list[list[float]]:
        outputs = payload.get("outputs") if isinstance(payload, dict) else None
        if not isinstance(outputs, list) or not outputs:
            raise ValueError("expected {\"outputs\": [{\"name\": ..., \"shape\": [B, D], \"data\": [...]}]}")
        out = self._output(api, outputs)
        shape, flat = out.get("shape"), out.get("data")
        if not (isinstance(shape, list) and len(shape) == 2 and isinstance(flat, list)):
            raise ValueError(f"output {out.get('name')!r} has shape {shape!r}: expected [B, D] with flat data")
        b, d = int(shape[0]), int(shape[1])
        if len(flat) != b * d:
            raise ValueError(f"output {out.get('name')!r}: {len(flat)} values for shape {shape}")
        return [_vector(flat[i * d:(i + 1) * d]) for i in range(b)]

    @staticmethod
    def _output(api: "Api", outputs: list[Any]) -> dict[str, Any]:
        """The output named ``--output-name``, else the first."""
        if not api.output_name:
            return outputs[0]
        out = next((o for o in outputs if isinstance(o, dict) and o.get("name") == api.output_name), None)
        if out is None:
            raise ValueError(f"no output named {api.output_name!r} (outputs: "
                             f"{[o.get('name') for o in outputs if isinstance(o, dict)]}); set --output-name")
        return out


class CustomSchema(Schema):
    """A ``--body`` template with ``"{text}"`` / ``"{texts}"``; the answer is found under the usual keys."""

    name = "custom"
    KEYS = ("embeddings", "embedding", "data", "output", "outputs", "vectors", "predictions")

    def check_settings(self, api: "Api", given: str) -> None:
        if api.template is None:
            raise ApiError("--api custom needs --body, e.g. --body '{\"input\": \"{text}\"}'")
        has_text, has_texts = _placeholders(api.template)
        if not (has_text or has_texts):
            raise ApiError(f"--body {json.dumps(api.template)}: no string value is exactly \"{{text}}\" or "
                           "\"{texts}\", so no text would be sent; e.g. --body '{\"input\": \"{text}\"}'")
        if api.client_batch > 1 and not has_texts:
            raise ApiError(f"--client-batch {api.client_batch} needs a \"{{texts}}\" list in --body; "
                           "\"{text}\" holds one text")
        object.__setattr__(api, "_has_texts", has_texts)

    def body(self, api: "Api", texts: list[str]) -> bytes:
        return json.dumps(_fill(api.template, texts)).encode()

    def embeddings(self, api: "Api", payload: Any, n: int, exact: bool) -> list[list[float]]:
        """A list of vectors, one vector (one text), or a dict holding either under a usual key."""
        if isinstance(payload, dict):
            for key in self.KEYS:
                if key in payload:
                    return self.embeddings(api, payload[key], n, exact)
            raise ValueError(f"no embeddings under the usual keys (found {sorted(payload)[:8]}); use --no-validate")
        if isinstance(payload, list) and payload and isinstance(payload[0], dict) and "embedding" in payload[0]:
            return [_vector(d["embedding"]) for d in payload]
        if isinstance(payload, list) and payload and all(isinstance(x, (int, float)) for x in payload):
            return [_vector(payload)]
        return _matrix(payload, "one embedding per text", exact)


SCHEMAS: dict[str, Schema] = {s.name: s for s in (TuningSchema(), TeiSchema(), OpenAISchema(), KServeSchema(),
                                                   CustomSchema())}


def schema_name(name: str) -> str:
    """The schema an ``--api`` name speaks (an alias resolved), or ApiError listing the names."""
    canonical = API_ALIASES.get(name, name)
    if canonical not in SCHEMAS:
        aliases = ", ".join(f"{a} (= {c})" for a, c in API_ALIASES.items())
        raise ApiError(f"--api {name!r} is not known; use one of {', '.join(API_NAMES)} or {aliases} "
                       "(custom: give --body and --route)")
    return canonical


@dataclass(frozen=True)
class Api:
    """How to talk to one service: its schema, route, headers, texts per request and whether answers are checked.
    ``name`` is the schema spoken: an alias (``triton``) becomes the schema's own name (``kserve``), so every
    output names the protocol on the wire."""

    name: str = "tuning"
    route: str | None = None
    template: Any = None  # the parsed --body template (custom)
    model_name: str | None = None
    input_name: str = "TEXT"
    output_name: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    client_batch: int = 1
    validate: bool = True
    timeout_s: float = 60.0
    metrics_map: str | None = None  # --metrics-map: how its own Prometheus metrics read (tuning.load.scrape)
    _has_texts: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        given = self.name
        canonical = schema_name(given)
        object.__setattr__(self, "name", canonical)
        # the schema held as a plain attribute, not a field: the hot path pays no lookup, and vars()/asdict()
        # consumers (the locust spec skips names starting with "_") never see it
        object.__setattr__(self, "_schema", SCHEMAS[canonical])
        if not isinstance(self.client_batch, int) or self.client_batch < 1:
            raise ApiError(f"--client-batch {self.client_batch!r}: give an integer >= 1 (texts per request)")
        self._schema.check_settings(self, given)
        if not self.timeout_s > 0:
            raise ApiError(f"--timeout {self.timeout_s!r}: give seconds > 0")

    # --- where and how ---

    def url(self, url: str) -> str:
        """``url`` with the API's route: ``--route`` if given, else the URL's own path, else the default."""
        parts = urlsplit(str(url))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ApiError(f"--url {url!r}: give an http:// or https:// URL, e.g. http://127.0.0.1:8000")
        path = self.route or (parts.path if parts.path not in ("", "/") else self.default_route())
        if not path.startswith("/"):
            path = "/" + path
        self._schema.check_route(self, url, path)
        return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))

    def default_route(self) -> str:
        return self._schema.default_route(self)

    def header_dict(self) -> dict[str, str]:
        return {"Content-Type": "application/json", **dict(self.headers)}

    def describe(self) -> dict[str, Any]:
        """For outputs: the API, route and header names, secrets never echoed."""
        return {"api": self.name, "route": self.route, "model_name": self.model_name, "client_batch": self.client_batch,
                "validate": self.validate, "headers": {k: ("***" if k.lower() in SECRET_HEADERS else v)
                                                       for k, v in self.headers}}

    # --- requests ---

    def body(self, texts: Sequence[str]) -> bytes:
        """The request body for ``texts`` (exactly ``client_batch`` of them)."""
        return self._schema.body(self, list(texts))

    def encode(self, items: Sequence[Any]) -> list[Any]:
        """Request bodies, encoded once, from model texts (a :class:`tuning.inputs.records.RecordError` stays
        itself: the client makes it that request's error outcome without sending it). With ``client_batch``
        N, consecutive texts go N to a request, wrapping around so every request holds N."""
        good = [x for x in items if isinstance(x, str)]
        bad = [x for x in items if not isinstance(x, str)]
        if self.client_batch == 1:
            return [self.body([x]) if isinstance(x, str) else x for x in items]
        if not good:
            return bad
        n = self.client_batch
        groups = max(1, math.ceil(len(good) / n))
        bodies = [self.body([good[(g * n + j) % len(good)] for j in range(n)]) for g in range(groups)]
        return bodies + bad

    # --- answers ---

    def check(self, status: int | None, data: bytes, texts: int | None = None) -> tuple[str, str | None, Any]:
        """``(outcome, reason, payload)`` of one answer: ok only for 2xx whose body carries one embedding per
        text sent (``texts``, default ``client_batch``), all of one dimension (unless ``validate`` is off)."""
        payload = _json(data)
        if status is None or not 200 <= status < 300:
            outcome = {503: "rejected", 504: "timeout", 429: "rejected"}.get(status, "error")
            return outcome, f"HTTP {status}: {error_text(payload, data)}", payload
        if not self.validate:
            return "ok", None, payload
        n = texts or self.client_batch
        try:
            vectors = self.embeddings(payload, n, exact=not _no_bools(data))
        except ValueError as exc:
            return "error", f"HTTP {status} but the answer is not {n} embedding(s): {exc}", payload
        if len(vectors) != n:
            return "error", f"HTTP {status} but the answer holds {len(vectors)} embeddings for {n} text(s)", payload
        dims = {len(v) for v in vectors}
        if len(dims) != 1 or 0 in dims:
            return "error", f"HTTP {status} but the embeddings' dimensions differ or are empty: {sorted(dims)}", payload
        return "ok", None, payload

    def embeddings(self, payload: Any, n: int, exact: bool = True) -> list[list[float]]:
        """The embeddings an answer carries, for this API (raises ValueError naming what is missing).
        ``exact=False`` only where the answer's bytes hold no ``true``/``false`` (see ``_no_bools``)."""
        if payload is _NOT_JSON:
            raise ValueError("the body is not JSON")
        return self._schema.embeddings(self, payload, n, exact)

    def server_stages(self, headers: Any) -> dict[str, float]:
        """Server-side stage times (ms) from the answer's headers (see :meth:`Schema.server_stages`)."""
        return self._schema.server_stages(headers)


_NOT_JSON = object()


def _json(data: bytes) -> Any:
    # orjson: parsing the answer was a large share of the client's CPU per request with the json module, and a
    # client that keeps up is what lets a window measure the server (bench/client_ceiling.py and its results)
    try:
        return orjson.loads(data) if data else _NOT_JSON
    except (ValueError, TypeError):
        return _NOT_JSON


def error_text(payload: Any, data: bytes) -> str:
    """The reason an answer gives: its ``error``, ``detail`` or ``message`` (FastAPI, OpenAI, TEI), or its first
    200 bytes."""
    if isinstance(payload, dict):
        for key in ("error", "detail", "message"):
            value = payload.get(key)
            if value:
                if isinstance(value, dict):
                    value = value.get("message") or value.get("msg") or json.dumps(value)
                if isinstance(value, list):
                    value = json.dumps(value)
                return str(value)[:300]
    text = (data or b"")[:200].decode("utf-8", errors="replace").strip()
    return text or "no error message"


_NUMBERS = {float, int}


def _no_bools(data: bytes) -> bool:
    """True when the answer's bytes cannot hold a JSON ``true`` or ``false`` (no ``u``, no ``a``: two memchr
    scans, a microsecond): then its vectors need no per-element type check, ``sum`` alone rejects a string,
    null, list or object inside one. TEI's bare matrix always qualifies; a keyed answer (OpenAI's) does not."""
    return b"u" not in data and b"a" not in data


def _vector(x: Any, exact: bool = True) -> list[float]:
    if not isinstance(x, list):
        raise ValueError(f"expected a list of numbers, got {type(x).__name__}")
    if exact:
        if not set(map(type, x)) <= _NUMBERS:  # exact types: a bool is not a number here
            raise ValueError("expected a list of numbers")
        return x
    try:  # cheaper per element than the set of types (bench/client_ceiling.py); bools were ruled out by _no_bools
        sum(x)
    except TypeError:
        raise ValueError("expected a list of numbers") from None
    return x


def _matrix(x: Any, what: str, exact: bool = True) -> list[list[float]]:
    if not isinstance(x, list):
        raise ValueError(f"expected {what}, got {type(x).__name__}")
    return [_vector(v, exact) for v in x]


def _placeholders(obj: Any) -> tuple[bool, bool]:
    if isinstance(obj, str):
        return obj == "{text}", obj == "{texts}"
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, list) else []
    found = [_placeholders(v) for v in items]
    return any(a for a, _ in found), any(b for _, b in found)


def _fill(obj: Any, texts: list[str]) -> Any:
    if obj == "{text}":
        return texts[0]
    if obj == "{texts}":
        return list(texts)
    if isinstance(obj, dict):
        return {k: _fill(v, texts) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_fill(v, texts) for v in obj]
    return obj


def parse_headers(values: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    """``--header 'K: V'`` values as pairs (the message names a malformed one)."""
    out = []
    for value in values or ():
        name, sep, rest = value.partition(":")
        if not sep or not name.strip():
            raise ApiError(f"--header {value!r}: give 'Name: value', e.g. --header 'Authorization: Bearer TOKEN'")
        out.append((name.strip(), rest.strip()))
    return tuple(out)


def parse_template(text: str | None) -> Any:
    """``--body`` as JSON (the message names the value and the fix)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ApiError(f"--body {text!r} is not JSON ({exc}); e.g. --body '{{\"input\": \"{{text}}\"}}'") from None


def request_bodies(api: Api, inputs: Sequence[Any], formatter: Any = None) -> list[Any]:
    """Request bodies for ``api``: this package's own inputs as read; any other API's encoded once from the
    model texts (``formatter``: a ``module:function`` or callable turning a record into its text, as
    ``--formatter``); a bad row stays its own error outcome, never sent."""
    if api.name == "tuning":
        return list(inputs)
    from tuning.inputs.records import RecordError
    from tuning.knobs import preset
    from tuning.runtime.custom import resolve_formatter
    from tuning.runtime.engine import Preparer

    fmt = resolve_formatter(formatter) if formatter is None or isinstance(formatter, str) else formatter
    prep = Preparer(preset("baseline"), None, *([fmt] if fmt else []))
    items: list[Any] = []
    for i, raw in enumerate(inputs, start=1):
        item, text = prep.to_text(i, raw)
        items.append(text if text is not None else RecordError(i, item.error or "invalid", item.id))
    return api.encode(items)
