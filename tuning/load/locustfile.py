"""The locust user that ``python -m tuning loadtest --engine locust`` runs (see :mod:`tuning.load.locust_engine`).

Loaded by locust's own processes (master and workers, gevent-patched); nothing in ``tuning`` imports it.
Each user posts the replayed request bodies to the API's route (``TUNING_LOCUST_ROUTE``, default ``/embed``)
back to back on one keep-alive connection
(``FastHttpUser``, no wait: a closed loop at the user count). Every request's start time (epoch),
response time, status and failure are sent to the master with the workers' own stats reports, and the
master appends them to ``TUNING_LOCUST_OUT`` (JSON lines), so the result is computed from every request
exactly as our own client's is. Payloads come from ``TUNING_LOCUST_PAYLOADS`` (JSON lines) on local
workers; a worker on another machine without that file gets them from the master when the test starts.
"""

from __future__ import annotations

import json
import os
import random

from locust import FastHttpUser, constant, events, task

from tuning.load.apis import Api

PAYLOADS: list[bytes] = []
_records: list[list] = []
ROUTE = os.environ.get("TUNING_LOCUST_ROUTE", "/embed")
_spec = json.loads(os.environ.get("TUNING_LOCUST_API") or "{}")
API = Api(**{**_spec, "headers": tuple(tuple(h) for h in _spec.get("headers", ()))}) if _spec else Api(validate=False)
HEADERS = API.header_dict()


def _load(path: str | None) -> None:
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            PAYLOADS[:] = [line.rstrip(b"\n") for line in f if line.strip()]


_load(os.environ.get("TUNING_LOCUST_PAYLOADS"))


@events.request.add_listener
def _record(request_type, name, response_time, response_length, response=None, exception=None, start_time=None,
            **kwargs):
    status = (getattr(response, "status_code", 0) or 0) if response is not None else 0
    reason = None
    if exception is not None:
        reason = f"{type(exception).__name__}: {exception}"[:300]
    _records.append([start_time, response_time, status, reason])


@events.report_to_master.add_listener
def _ship(client_id, data):
    global _records
    data["tuning_records"], _records = _records, []


@events.worker_report.add_listener
def _collect(client_id, data):
    records = data.get("tuning_records")
    out = os.environ.get("TUNING_LOCUST_OUT")
    if records and out:
        with open(out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


@events.init.add_listener
def _init(environment, **kwargs):
    runner = environment.runner
    if runner is None:
        return
    if type(runner).__name__ == "WorkerRunner":
        runner.register_message("tuning_payloads", lambda environment, msg, **kw: PAYLOADS[:] or PAYLOADS.extend(
            p.encode() for p in msg.data))
    elif type(runner).__name__ == "MasterRunner":
        @events.test_start.add_listener
        def _send_payloads(environment, **kw):
            environment.runner.send_message("tuning_payloads", [p.decode() for p in PAYLOADS])


class EmbedUser(FastHttpUser):
    wait_time = constant(0)
    connection_timeout = 60.0
    network_timeout = 60.0

    def on_start(self) -> None:
        self.next = random.randrange(max(len(PAYLOADS), 1))

    @task
    def embed(self) -> None:
        body = PAYLOADS[self.next % len(PAYLOADS)]
        self.next += 1
        with self.client.post(ROUTE, data=body, headers=HEADERS, catch_response=True) as resp:
            status = resp.status_code or 0
            if 200 <= status < 300:
                outcome, reason, _ = API.check(status, resp.content or b"")
                if outcome != "ok":
                    resp.failure(reason)  # recorded with its reason: the same check as our own client's
