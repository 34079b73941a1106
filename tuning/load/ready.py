"""Whether a server just started is ready, in its protocol's words and in its own.

A server often listens before its model is loaded, and says so in its own way: Triton answers 404 for a model
not loaded yet, MLServer ``HTTP 400: Model minilm is not ready yet.``, others 503. :func:`still_loading` reads an
answer that is not ok as "wait" or as a real error (a wrong body gets its error at once). A protocol with a
readiness route of its own (KServe v2's ``GET /v2/models/NAME/ready``) is asked that first
(:func:`protocol_ready_url`).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

# statuses a server gives while it loads: 404 (Triton: the model is not loaded yet), 408, 425, 429 and 5xx
LOADING_STATUS = re.compile(r"^HTTP (404|408|425|429|5\d\d)\b")
# a 400 that says the model is not there yet (MLServer: "Model minilm is not ready yet.")
LOADING_WORDS = re.compile(r"not ready|loading|unknown model|not (yet )?loaded", re.I)

READY_URL_HINT = ("if it needs longer to load its model, raise --ready-timeout or give --ready-url URL, a route "
                  "that answers 2xx once the model is loaded (KServe v2: /v2/models/{model_name}/ready)")


def still_loading(reason: str) -> bool:
    """Whether a not-ok answer's ``reason`` (``HTTP 400: ...``) says the server is still loading its model."""
    if LOADING_STATUS.match(reason):
        return True
    return reason.startswith("HTTP 400") and LOADING_WORDS.search(reason) is not None


def protocol_ready_url(api: Any, infer_url: str) -> str | None:
    """The readiness route of the protocol ``api`` speaks, for the model ``infer_url`` asks, or None where the
    protocol has none: KServe v2's ``/v2/models/NAME[/versions/V]/ready`` beside its ``.../infer``."""
    if getattr(api, "name", None) != "kserve":
        return None
    parts = urlsplit(infer_url)
    if not parts.path.endswith("/infer"):
        return None
    return urlunsplit((parts.scheme, parts.netloc, parts.path[: -len("infer")] + "ready", "", ""))
