"""The server's metrics on ``prometheus_client``, named by Prometheus convention (``..._seconds``
histograms, ``..._total`` counters) and, where the concept matches, with the meaning Hugging Face
text-embeddings-inference (TEI) gives its own, so dashboards carry over:

=============================================== ================================= ==========================================
ours                                            TEI                               meaning
=============================================== ================================= ==========================================
``tuning_requests_total{outcome}``              ``te_request_count/success/...``  requests answered, by outcome
``tuning_request_duration_seconds{outcome}``    ``te_request_duration``           submit to answer (every outcome here)
``tuning_request_tokenization_duration_seconds`` ``te_request_tokenization_duration`` read, format, tokenize
``tuning_request_queue_duration_seconds``       ``te_request_queue_duration``     waiting for a batch and for the model
``tuning_request_inference_duration_seconds``   ``te_request_inference_duration`` copy, forward, postprocess of its batch
``tuning_batch_size``                           ``te_batch_next_size``            requests per model call
``tuning_batch_tokens``                         ``te_batch_next_tokens``          padded tokens per model call
``tuning_queue_size``                           ``te_queue_size``                 tokenized requests waiting for a batch
=============================================== ================================= ==========================================

Ours alone: ``tuning_stage_duration_seconds{stage}`` (the stage ledger of ok requests),
``tuning_model_busy_seconds_total`` (time inside the model call; a load test reads it at the edges of
its window), ``tuning_queue_depth`` (admitted and not yet answered: what ``max_queue`` bounds) and
``tuning_max_queue``. Each server has its own registry, so several servers live in one process.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Protocol

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tuning.online.response import Response


class MeteredServer(Protocol):
    """What the metrics read of a server, when scraped (:class:`tuning.online.serve.Server` has it)."""

    counts: Mapping[str, int]  # answered requests by outcome
    busy_total_s: float  # time inside the model call so far
    waiting_for_batch: int  # tokenized requests waiting for a batch
    queue_depth: int  # admitted and not yet answered
    knobs: Any  # the server's knobs (max_queue is read)
    metrics: "ServerMetrics"

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class _Live(Collector):
    """Values the server owns (counts, depths, the busy total), read when scraped: nothing to keep in step."""

    def __init__(self, server: MeteredServer):
        self.server = server

    def collect(self) -> Iterator:
        s = self.server
        requests = CounterMetricFamily("tuning_requests", "Requests answered, by outcome (TEI te_request_count, "
                                       "te_request_success, te_request_failure)", labels=["outcome"])
        for outcome, n in dict(s.counts).items():
            requests.add_metric([outcome], n)
        yield requests
        yield CounterMetricFamily("tuning_model_busy_seconds", "Time inside the model call (host launch included)",
                                  value=s.busy_total_s)
        yield GaugeMetricFamily("tuning_queue_size", "Tokenized requests waiting for a batch (TEI te_queue_size)",
                                value=s.waiting_for_batch)
        yield GaugeMetricFamily("tuning_queue_depth", "Requests admitted and not yet answered (bounded by max_queue)",
                                value=s.queue_depth)
        yield GaugeMetricFamily("tuning_max_queue", "Admission limit (max_queue)", value=s.knobs.max_queue)


class ServerMetrics:
    """A server's histograms in its own registry; :meth:`observe` records one answered request."""

    def __init__(self, server: MeteredServer, stages: tuple[str, ...], outcomes: tuple[str, ...]):
        self.registry = r = CollectorRegistry()
        r.register(_Live(server))
        self.request_duration = Histogram(
            "tuning_request_duration_seconds", "Submit-to-answer time of every request, by outcome (sum over "
            "outcome for the whole tail; TEI te_request_duration counts successes only)", ["outcome"],
            buckets=SECONDS_BUCKETS, registry=r)
        self._by_outcome = {o: self.request_duration.labels(o) for o in outcomes}
        self.tokenization = Histogram(
            "tuning_request_tokenization_duration_seconds", "Read, format and tokenize, per ok request "
            "(TEI te_request_tokenization_duration)", buckets=SECONDS_BUCKETS, registry=r)
        self.queue = Histogram(
            "tuning_request_queue_duration_seconds", "Waiting for a batch and for the model, per ok request "
            "(TEI te_request_queue_duration)", buckets=SECONDS_BUCKETS, registry=r)
        self.inference = Histogram(
            "tuning_request_inference_duration_seconds", "Copy, forward and postprocess of the request's batch, "
            "per ok request (TEI te_request_inference_duration)", buckets=SECONDS_BUCKETS, registry=r)
        stage = Histogram("tuning_stage_duration_seconds", "Per-request time in each stage of the ledger (ok requests)",
                          ["stage"], buckets=SECONDS_BUCKETS, registry=r)
        self._stages = [(s, stage.labels(s)) for s in stages]
        self.batch_size = Histogram("tuning_batch_size", "Requests per model call (TEI te_batch_next_size)",
                                    buckets=BATCH_BUCKETS, registry=r)
        self.batch_tokens = Histogram("tuning_batch_tokens", "Padded tokens per model call, batch x padded length "
                                      "(TEI te_batch_next_tokens)", buckets=TOKEN_BUCKETS, registry=r)

    def observe(self, response: Response) -> None:
        self._by_outcome[response.outcome].observe(response.latency_ms / 1000)
        if response.outcome != "ok":
            return
        self.tokenization.observe((response.read_ms + response.preprocess_ms) / 1000)
        self.queue.observe((response.queue_wait_ms + response.wait_for_model_ms) / 1000)
        self.inference.observe((response.copy_ms + response.inference_ms + response.postprocess_ms) / 1000)
        for name, hist in self._stages:
            hist.observe(getattr(response, f"{name}_ms") / 1000)

    def observe_batch(self, size: int, padded_length: int) -> None:
        self.batch_size.observe(size)
        self.batch_tokens.observe(size * padded_length)

    def count(self, outcome: str | None = None) -> int:
        """Requests observed in ``tuning_request_duration_seconds`` (of one outcome, or all)."""
        outcomes = [outcome] if outcome else list(self._by_outcome)
        return int(sum(self.registry.get_sample_value("tuning_request_duration_seconds_count", {"outcome": o}) or 0
                       for o in outcomes))


def prometheus_text(server: MeteredServer) -> str:
    """The server's metrics in the Prometheus text format (version 0.0.4)."""
    return generate_latest(server.metrics.registry).decode()
