"""The service's own Prometheus metrics: parsed with prometheus-client's parser, read as differences over the
window, for this package's server, TEI and Triton (metric names from their documentation)."""

import pytest

from tuning.load.scrape import MetricsProbe, derive, exporter_of, metrics_url, parse

TEI = """# HELP te_queue_size Queue size
# TYPE te_queue_size gauge
te_queue_size {q}
# TYPE te_batch_next_size histogram
te_batch_next_size_bucket{{le="1"}} 0
te_batch_next_size_bucket{{le="+Inf"}} {batches}
te_batch_next_size_sum {batched}
te_batch_next_size_count {batches}
# TYPE te_request_queue_duration histogram
te_request_queue_duration_bucket{{le="+Inf"}} {requests}
te_request_queue_duration_sum {queue_s}
te_request_queue_duration_count {requests}
# TYPE te_request_inference_duration histogram
te_request_inference_duration_bucket{{le="+Inf"}} {requests}
te_request_inference_duration_sum {infer_s}
te_request_inference_duration_count {requests}
"""

TRITON = """# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="minilm",version="1"}} {requests}
# TYPE nv_inference_count counter
nv_inference_count{{model="minilm",version="1"}} {inferences}
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{{model="minilm",version="1"}} {executions}
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{{model="minilm",version="1"}} {queue_us}
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{{model="minilm",version="1"}} {compute_us}
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{{gpu_uuid="GPU-1"}} {gpu}
"""


def test_tei_signals_are_differences_over_the_window():
    before = parse(TEI.format(q=0, batches=10, batched=10, requests=10, queue_s=0.05, infer_s=0.03))
    after = parse(TEI.format(q=7, batches=110, batched=810, requests=810, queue_s=8.05, infer_s=4.03))
    m = derive(before, after, window_s=10.0)
    assert m.exporter == "tei" and not m.lacked
    assert m.values["mean_batch"] == pytest.approx(8.0)  # 800 requests in 100 batches
    assert m.values["queue_ms"] == pytest.approx(10.0) and m.values["inference_ms"] == pytest.approx(5.0)
    assert m.values["queue_depth"] == 7 and m.sources["mean_batch"] == "te_batch_next_size"


def test_triton_counters_read_with_or_without_their_total_suffix():
    before = parse(TRITON.format(requests=0, inferences=0, executions=0, queue_us=0, compute_us=0, gpu=0.1))
    after = parse(TRITON.format(requests=400, inferences=400, executions=25, queue_us=800_000, compute_us=2_000_000,
                                gpu=0.62))
    assert "nv_inference_count" in after  # the parser's nv_inference_count_total, suffix stripped
    m = derive(before, after, window_s=4.0)
    assert m.exporter == "triton"
    assert m.values["mean_batch"] == pytest.approx(16.0)  # nv_inference_count / nv_inference_exec_count
    assert m.values["queue_ms"] == pytest.approx(2.0) and m.values["inference_ms"] == pytest.approx(5.0)
    assert m.values["gpu_util"] == pytest.approx(0.62)


def test_what_an_exporter_lacks_is_listed_and_unknown_metrics_say_so():
    partial = parse("# TYPE te_queue_size gauge\nte_queue_size 3\n")
    m = derive({}, partial, window_s=1.0)
    assert m.values == {"queue_depth": 3.0}
    assert set(m.lacked) == {"mean_batch", "queue_ms", "inference_ms"}
    other = derive({}, parse("# TYPE http_requests counter\nhttp_requests_total 5\n"), window_s=1.0)
    assert other.exporter is None and "no metrics of a known exporter" in other.reason
    assert exporter_of(parse("tuning_queue_depth 0\n")) == "tuning"


def test_metrics_url_defaults_beside_the_endpoint():
    assert metrics_url("http://10.0.0.2:8080/embed") == "http://10.0.0.2:8080/metrics"
    assert metrics_url("http://h:8000/v2/models/m/infer", "http://h:8002/metrics") == "http://h:8002/metrics"


def test_the_probe_reads_this_packages_server(monkeypatch):
    from tuning.load import scrape as scrape_module

    texts = iter([
        "tuning_model_busy_seconds_total 10.0\ntuning_batch_size_sum 40\ntuning_batch_size_count 10\n",
        "tuning_model_busy_seconds_total 13.0\ntuning_batch_size_sum 440\ntuning_batch_size_count 60\n",
    ])
    clock = iter([100.0, 104.0])
    monkeypatch.setattr(scrape_module, "scrape", lambda url, timeout_s=5.0, model=None: (parse(next(texts), model), None))
    monkeypatch.setattr("time.monotonic", lambda: next(clock))
    probe = MetricsProbe("http://x/metrics")
    assert probe() == 10.0 and probe() == 13.0  # the busy total run_load reads at the window's edges
    m = probe.result()
    assert m.values["model_busy"] == pytest.approx(0.75)  # 3 busy seconds in 4
    assert m.values["mean_batch"] == pytest.approx(8.0)


def test_an_unreachable_metrics_url_is_a_reason_not_an_error():
    probe = MetricsProbe("http://127.0.0.1:9/metrics", timeout_s=0.5)
    assert probe() is None and probe() is None
    m = probe.result()
    assert m.exporter is None and m.reason and "127.0.0.1:9" in m.reason


def test_a_background_probe_never_scrapes_on_the_load_loop_s_thread(monkeypatch):
    """The engine's windows scrape the server's metrics as they open and close; a slow or dead endpoint must
    not hold the requests in flight, so each scrape runs on a thread of its own and the figures come after."""
    import threading

    from tuning.load import scrape as scrape_mod

    seen = []
    text = "nv_inference_request_success 10\nnv_inference_queue_duration_us 2000\n"

    def fake(url, timeout_s=5.0, model=None):
        seen.append(threading.current_thread().name)
        n = len(seen)
        return scrape_mod.parse(text.replace("10", str(10 * n)).replace("2000", str(2000 * n))), None

    monkeypatch.setattr(scrape_mod, "scrape", fake)
    probe = scrape_mod.MetricsProbe("http://127.0.0.1:1/metrics", background=True)
    assert probe() is None and probe() is None
    result = probe.result()
    assert seen == ["metrics-scrape", "metrics-scrape"]
    assert result.exporter == "triton" and result.values["queue_ms"] == 0.2  # 2000 us over 10 requests


def test_an_ensemble_s_other_models_are_not_summed_into_the_model_under_test():
    """Triton labels every sample with its model: an embedding ensemble (a tokenizer model, then the encoder)
    counts each request once per step, so the model under test's queue and compute come from its own samples."""
    from tuning.load.scrape import derive, parse

    def exposition(n):
        return "".join(f'nv_inference_request_success{{model="{m}",version="1"}} {10 * n}\n'
                       f'nv_inference_queue_duration_us{{model="{m}",version="1"}} {q * n}\n'
                       f'nv_inference_compute_infer_duration_us{{model="{m}",version="1"}} {c * n}\n'
                       for m, q, c in (("tokenizer", 100, 1000), ("minilm", 5000, 80000)))

    whole = derive(parse(exposition(1)), parse(exposition(2)), 1.0)
    mine = derive(parse(exposition(1), "minilm"), parse(exposition(2), "minilm"), 1.0)
    assert mine.values["inference_ms"] == 8.0 and mine.values["queue_ms"] == 0.5  # 80000 us / 10 requests
    assert whole.values["inference_ms"] == 4.05  # both models summed over twice the requests: about half


RAY = """# TYPE ray_serve_http_request_latency_ms histogram
ray_serve_http_request_latency_ms_bucket{{application="app",route="/",le="+Inf"}} {requests}
ray_serve_http_request_latency_ms_sum{{application="app",route="/"}} {request_ms}
ray_serve_http_request_latency_ms_count{{application="app",route="/"}} {requests}
# TYPE ray_serve_deployment_processing_latency_ms histogram
ray_serve_deployment_processing_latency_ms_bucket{{deployment="Embed",replica="r1",le="+Inf"}} {requests}
ray_serve_deployment_processing_latency_ms_sum{{deployment="Embed",replica="r1"}} {processing_ms}
ray_serve_deployment_processing_latency_ms_count{{deployment="Embed",replica="r1"}} {requests}
# TYPE ray_serve_actual_batch_size histogram
ray_serve_actual_batch_size_bucket{{deployment="Embed",le="+Inf"}} {batches}
ray_serve_actual_batch_size_sum{{deployment="Embed"}} {batched}
ray_serve_actual_batch_size_count{{deployment="Embed"}} {batches}
# TYPE ray_serve_deployment_queued_queries gauge
ray_serve_deployment_queued_queries{{deployment="Embed"}} {queued}
"""


def test_ray_serve_splits_the_time_before_the_replica_from_the_replica_s():
    """Issue 60: on a real Ray Serve app about 400 ms of a 759 ms mean was queueing before the model, and the
    report left it inside "network". The proxy's whole request less the replica's processing is that time;
    the batch the replica actually ran is its own histogram."""
    before = parse(RAY.format(requests=0, request_ms=0, processing_ms=0, batches=0, batched=0, queued=0))
    after = parse(RAY.format(requests=100, request_ms=75_900, processing_ms=35_900, batches=37, batched=100,
                             queued=12))
    m = derive(before, after, window_s=10.0)
    assert m.exporter == "ray" and not m.lacked
    assert m.values["request_ms"] == pytest.approx(759.0) and m.values["inference_ms"] == pytest.approx(359.0)
    assert m.values["queue_ms"] == pytest.approx(400.0) and m.values["mean_batch"] == pytest.approx(100 / 37)
    assert m.values["queue_depth"] == 12
    assert m.sources["queue_ms"] == "ray_serve_http_request_latency_ms - ray_serve_deployment_processing_latency_ms"
    composed = parse(RAY.format(requests=100, request_ms=75_900, processing_ms=95_000, batches=37, batched=100,
                                queued=0))  # several deployments' processing summed: more than the proxy's time
    assert "queue_ms" in derive(before, composed, window_s=10.0).lacked


def test_mlserver_reads_its_rest_time_and_its_batching_queue():
    text = """# TYPE model_infer_request_success counter
model_infer_request_success_total{{model="minilm"}} {n}
# TYPE rest_server_request_duration_seconds histogram
rest_server_request_duration_seconds_bucket{{le="+Inf"}} {n}
rest_server_request_duration_seconds_sum {s}
rest_server_request_duration_seconds_count {n}
# TYPE batch_request_queue histogram
batch_request_queue_bucket{{le="+Inf"}} {n}
batch_request_queue_sum {q}
batch_request_queue_count {n}
"""
    m = derive(parse(text.format(n=0, s=0, q=0)), parse(text.format(n=50, s=2.5, q=150)), window_s=5.0)
    assert m.exporter == "mlserver"
    assert m.values["request_ms"] == pytest.approx(50.0) and m.values["queue_depth"] == pytest.approx(3.0)


def test_any_exporter_reads_through_a_metrics_map():
    from tuning.load.scrape import parse_metrics_map

    text = """# TYPE svc_wait_seconds histogram
svc_wait_seconds_sum {w}
svc_wait_seconds_count {n}
# TYPE svc_model_ms histogram
svc_model_ms_sum {c}
svc_model_ms_count {n}
# TYPE svc_batch histogram
svc_batch_sum {b}
svc_batch_count {n}
"""
    mapping = parse_metrics_map("queue=svc_wait_seconds, compute=svc_model_ms,batch=svc_batch")
    before, after = parse(text.format(w=0, c=0, b=0, n=0)), parse(text.format(w=0.4, c=900, b=160, n=20))
    assert derive(before, after, 2.0).exporter is None  # unknown without the map
    m = derive(before, after, 2.0, mapping=mapping)
    assert m.exporter == "mapped" and m.values == pytest.approx({"queue_ms": 20.0, "inference_ms": 45.0,
                                                                "mean_batch": 8.0})
    assert parse_metrics_map("compute=svc_time:us")["inference_ms"].scale == pytest.approx(1e-3)
    assert parse_metrics_map("queue=job:wait_seconds")["queue_ms"].names == ("job:wait_seconds",)  # its own colon
    tei = parse(TEI.format(q=3, batches=10, batched=80, requests=80, queue_s=0.8, infer_s=0.4))
    merged = derive({}, tei, 1.0, mapping=parse_metrics_map("compute=te_request_queue_duration:s"))
    assert merged.exporter == "tei + mapped" and merged.values["queue_depth"] == 3  # the exporter's others stay
    assert merged.values["inference_ms"] == pytest.approx(10.0)
    for bad, says in (("queue", "KEY=NAME"), ("latency=x_seconds", "KEY=NAME"), ("queue=svc_wait", ":s"),
                      ("", "at least one")):
        with pytest.raises(ValueError, match=says):
            parse_metrics_map(bad)
