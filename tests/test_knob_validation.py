"""Every knob's validation, driven by ``knob_names()`` (issue 17 item 3).

Rule (DESIGN.md, "Errors and bad input"): a wrong knob raises ``ValueError``/``TypeError`` naming the field,
the value and what is allowed. ``BAD`` holds at least one bad value per knob with the exact message, and
``EDGE`` the allowed value at each bound; a knob added without a case here fails
``test_every_knob_has_a_bad_value_case``.
"""

from __future__ import annotations

import math
import warnings

import pytest

import tuning.knobs as knobs_module
from tuning.knobs import Knobs, knob_names, parse_knob_value, preset

BAD: dict[str, list[tuple[dict, type, str]]] = {
    "num_workers": [
        (dict(num_workers=-1), ValueError, "knob num_workers=-1 is out of range; allowed: an integer >= 0"),
        (dict(num_workers=1.0), TypeError, "knob num_workers=1.0 has type float; allowed: an integer"),
    ],
    "prefetch_factor": [
        (dict(num_workers=1, prefetch_factor=0), ValueError,
         "knob prefetch_factor=0 is out of range; allowed: an integer >= 1"),
        (dict(num_workers=1, prefetch_factor="2"), TypeError,
         "knob prefetch_factor='2' has type str; allowed: an integer"),
        (dict(num_workers=0, prefetch_factor=2), ValueError,
         "prefetch_factor=2 needs num_workers > 0 (got num_workers=0); set num_workers>=1 or leave prefetch_factor "
         "unset"),
    ],
    "pin_memory": [(dict(pin_memory=1), TypeError, "knob pin_memory=1 has type int; allowed: True or False")],
    "batch_size": [
        (dict(batch_size=0), ValueError, "knob batch_size=0 is out of range; allowed: an integer >= 1"),
        (dict(batch_size=True), TypeError, "knob batch_size=True has type bool; allowed: an integer"),
    ],
    "tokenizer": [
        (dict(tokenizer="slow"), ValueError, "knob tokenizer='slow' is not allowed; allowed: naive | fast"),
        (dict(tokenizer=3), TypeError, "knob tokenizer=3 has type int; allowed: naive | fast"),
    ],
    "padding": [(dict(padding="ragged"), ValueError,
                 "knob padding='ragged' is not allowed; allowed: dynamic | fixed | bucket")],
    "max_length": [
        (dict(max_length=513), ValueError, "knob max_length=513 is out of range; allowed: an integer between 3 and 512"),
        (dict(max_length=2), ValueError, "knob max_length=2 is out of range; allowed: an integer between 3 and 512"),
    ],
    "buckets": [
        (dict(buckets=[32, 64]), TypeError, "knob buckets=[32, 64] has type list; allowed: a non-empty tuple of "
         "integers, e.g. (32, 64, 128, 256)"),
        (dict(buckets=()), TypeError, "knob buckets=() has type tuple; allowed: a non-empty tuple of integers, e.g. "
         "(32, 64, 128, 256)"),
        (dict(buckets=(32, True)), TypeError, "knob buckets=(32, True) has type tuple; allowed: a non-empty tuple of "
         "integers, e.g. (32, 64, 128, 256)"),
        (dict(buckets=(64, 32)), ValueError,
         "knob buckets=(64, 32) must be strictly ascending integers >= 3, e.g. (32, 64, 128, 256)"),
        (dict(buckets=(32, 32)), ValueError,
         "knob buckets=(32, 32) must be strictly ascending integers >= 3, e.g. (32, 64, 128, 256)"),
        (dict(buckets=(2, 32)), ValueError,
         "knob buckets=(2, 32) must be strictly ascending integers >= 3, e.g. (32, 64, 128, 256)"),
    ],
    "bucket_window": [(dict(bucket_window=0), ValueError,
                       "knob bucket_window=0 is out of range; allowed: an integer >= 1")],
    "group_by": [(dict(group_by="chars"), ValueError, "knob group_by='chars' is not allowed; allowed: bytes | tokens")],
    "dtype": [(dict(dtype="int8"), ValueError, "knob dtype='int8' is not allowed; allowed: fp32 | bf16 | fp16")],
    "graph": [(dict(graph="jit"), ValueError, "knob graph='jit' is not allowed; allowed: eager | compile | cuda_graph")],
    "compile_mode": [
        (dict(compile_mode="fast"), ValueError,
         "knob compile_mode='fast' is not allowed; allowed: default | reduce-overhead | max-autotune"),
        (dict(compile_mode="max-autotune"), ValueError,
         "compile_mode='max-autotune' only applies with graph='compile' (got graph='eager'); set graph='compile' or "
         "leave compile_mode='default'"),
    ],
    "tf32": [(dict(tf32="yes"), TypeError, "knob tf32='yes' has type str; allowed: True or False")],
    "device": [(dict(device="tpu"), ValueError, "knob device='tpu' is not allowed; allowed: auto | cpu | cuda | sim")],
    "sim_profile": [
        (dict(sim_profile=""), TypeError,
         "knob sim_profile='' has type str; allowed: a shipped profile name or a JSON path"),
        (dict(sim_profile=3), TypeError, "knob sim_profile=3 has type int; allowed: a shipped profile name or a JSON path"),
    ],
    "torch_threads": [(dict(torch_threads=0), ValueError,
                       "knob torch_threads=0 is out of range; allowed: an integer >= 1")],
    "max_wait_ms": [
        (dict(max_wait_ms=-0.5), ValueError, "knob max_wait_ms=-0.5 is out of range; allowed: a number >= 0.0"),
        (dict(max_wait_ms=math.nan), ValueError, "knob max_wait_ms=nan is out of range; allowed: a number >= 0.0"),
        (dict(max_wait_ms=False), TypeError, "knob max_wait_ms=False has type bool; allowed: a number"),
        (dict(max_wait_ms="2"), TypeError, "knob max_wait_ms='2' has type str; allowed: a number"),
    ],
    "max_batch_tokens": [
        (dict(max_batch_tokens=0), ValueError, "knob max_batch_tokens=0 is out of range; allowed: an integer >= 1"),
        (dict(max_batch_tokens=255), ValueError,
         "knob max_batch_tokens=255 is below max_length=256: a request of max_length tokens could never fit a batch; "
         "set max_batch_tokens >= 256 (e.g. batch_size x a typical padded length) or None"),
    ],
    "max_queue": [(dict(max_queue=0), ValueError, "knob max_queue=0 is out of range; allowed: an integer >= 1")],
    "concurrency": [(dict(concurrency=0), ValueError, "knob concurrency=0 is out of range; allowed: an integer >= 1")],
    "deadline_ms": [
        (dict(deadline_ms=0.0), ValueError, "knob deadline_ms=0.0 is out of range; allowed: a number > 0.0"),
        (dict(deadline_ms=-1), ValueError, "knob deadline_ms=-1 is out of range; allowed: a number > 0.0"),
    ],
}

# the allowed value at each bound (one step inside what BAD refuses)
EDGE: dict[str, list[dict]] = {
    "num_workers": [dict(num_workers=0)],
    "prefetch_factor": [dict(num_workers=1, prefetch_factor=1), dict(prefetch_factor=None, num_workers=0)],
    "pin_memory": [dict(pin_memory=True)],
    "batch_size": [dict(batch_size=1)],
    "tokenizer": [dict(tokenizer="fast")],
    "padding": [dict(padding="bucket")],
    "max_length": [dict(max_length=3, buckets=(3,)), dict(max_length=512)],
    "buckets": [dict(buckets=(3,)), dict(buckets=(3, 4))],
    "bucket_window": [dict(bucket_window=1)],
    "group_by": [dict(group_by="tokens")],
    "dtype": [dict(dtype="fp16")],
    "graph": [dict(graph="cuda_graph", padding="fixed")],
    "compile_mode": [dict(graph="compile", compile_mode="reduce-overhead")],
    "tf32": [dict(tf32=True)],
    "device": [dict(device="sim")],
    "sim_profile": [dict(sim_profile="x")],
    "torch_threads": [dict(torch_threads=1)],
    "max_wait_ms": [dict(max_wait_ms=0), dict(max_wait_ms=0.0)],
    "max_batch_tokens": [dict(max_batch_tokens=256), dict(max_length=3, buckets=(3,), max_batch_tokens=3)],
    "max_queue": [dict(max_queue=1)],
    "concurrency": [dict(concurrency=1)],
    "deadline_ms": [dict(deadline_ms=1e-9), dict(deadline_ms=5)],
}


def test_every_knob_has_a_bad_value_case():
    """A knob added to Knobs without a bad-value case (and an allowed edge) here fails this test."""
    assert list(BAD) == knob_names() and list(EDGE) == knob_names()


CASES = [(name, kw, exc, msg) for name in knob_names() for kw, exc, msg in BAD.get(name, [])]


@pytest.mark.parametrize("name,kwargs,exc,message", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_value_raises_naming_field_value_and_allowed(name, kwargs, exc, message):
    with pytest.raises(exc) as info:
        Knobs(**kwargs)
    assert type(info.value) is exc and str(info.value) == message
    assert f"{name}=" in message


@pytest.mark.parametrize("name", knob_names())
def test_the_value_at_each_bound_is_allowed(name):
    """The comparisons are inclusive where documented (``>= minimum``, ``between 3 and 512``)."""
    for kwargs in EDGE[name]:
        knobs = Knobs(**kwargs)
        assert all(getattr(knobs, k) == v for k, v in kwargs.items())


@pytest.mark.parametrize("changes,message", [
    (dict(graph="cuda_graph", padding="dynamic"), "graph='cuda_graph' needs fixed shapes but padding='dynamic' makes a "
     "new shape per batch; set padding='bucket' (or 'fixed')"),
    (dict(graph="cuda_graph", padding="bucket", device="cpu"),
     "graph='cuda_graph' needs CUDA but device='cpu'; on a CPU use graph='compile' or graph='eager'"),
    (dict(dtype="fp16", device="cpu"), "dtype='fp16' is not supported on the CPU here; use dtype='bf16' (or 'fp32')"),
    (dict(pin_memory=True, device="cpu"),
     "pin_memory=True only helps copies to CUDA but device='cpu'; set pin_memory=False"),
])
def test_contradictory_knobs_raise_with_the_fix(changes, message):
    with pytest.raises(ValueError) as info:
        Knobs(**changes)
    assert str(info.value) == message


def test_resolve_on_a_cpu_falls_back_with_warnings_or_raises_with_the_fix():
    """Rule: contradictory knobs raise, or fall back with a warning that names the fix; never silently."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k = Knobs(pin_memory=True, tf32=True).resolve(cuda_available=False)
    assert (k.device, k.pin_memory, k.tf32) == ("cpu", False, False)
    assert [str(w.message) for w in caught] == [
        "pin_memory=True has no effect without CUDA; running with pin_memory=False",
        "tf32=True has no effect without CUDA; running with tf32=False"]
    # the warning points at the caller's line, not at knobs.py (mutmut's trampolines add a frame in between,
    # so this says "not knobs.py" rather than "this file")
    assert not any(w.filename == knobs_module.__file__ for w in caught)
    for knobs, message in [
        (Knobs(graph="cuda_graph", padding="bucket"), "graph='cuda_graph' needs a CUDA device and none is available "
         "here; use graph='compile' (torch.compile) or graph='eager' on a CPU"),
        (Knobs(dtype="fp16"), "dtype='fp16' needs a CUDA device and none is available here; use dtype='bf16' on a CPU"),
        (Knobs(device="cuda"), "device='cuda' but no CUDA device is available here; set device='cpu' or 'auto'"),
        (Knobs(graph="compile", compile_mode="reduce-overhead"), "compile_mode='reduce-overhead' captures CUDA graphs "
         "and needs CUDA; on a CPU use compile_mode='default'"),
    ]:
        with pytest.raises(ValueError) as info:
            knobs.resolve(cuda_available=False)
        assert str(info.value) == message
    quiet = Knobs(graph="compile", compile_mode="max-autotune")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert quiet.resolve(cuda_available=False) == quiet.replace(device="cpu")


def test_resolve_with_cuda_keeps_the_cuda_knobs():
    k = Knobs(pin_memory=True, tf32=True, dtype="fp16", graph="cuda_graph", padding="bucket")
    assert k.resolve(cuda_available=True) == k.replace(device="cuda")
    assert Knobs(device="cpu").resolve(cuda_available=True).device == "cpu"


def test_resolve_sim_checks_the_profile_and_keeps_the_knobs():
    sim = Knobs(device="sim", pin_memory=True)
    assert sim.resolve(cuda_available=False) is sim
    with pytest.raises(Exception, match="nope"):
        Knobs(device="sim", sim_profile="nope").resolve(cuda_available=False)


def test_replace_validates_again_and_names_unknown_knobs():
    assert Knobs().replace(batch_size=4).batch_size == 4
    with pytest.raises(ValueError) as info:
        Knobs().replace(batch_size=0)
    assert str(info.value) == "knob batch_size=0 is out of range; allowed: an integer >= 1"
    with pytest.raises(ValueError) as info:
        Knobs().replace(zeta=1, alpha=2)
    assert str(info.value) == f"unknown knob(s) ['alpha', 'zeta']; known knobs: {', '.join(knob_names())}"


def test_as_dict_lists_tuples_and_help_covers_every_knob():
    d = Knobs(buckets=(8, 16)).as_dict()
    assert list(d) == knob_names() and d["buckets"] == [8, 16] and d["batch_size"] == 1 and d["prefetch_factor"] is None
    assert list(Knobs().help()) == knob_names()


@pytest.mark.parametrize("name,text,expected", [
    ("pin_memory", "TRUE", True), ("pin_memory", "1", True), ("pin_memory", "yes", True), ("pin_memory", "on", True),
    ("tf32", "false", False), ("tf32", "0", False), ("tf32", "No", False), ("tf32", "off", False),
    ("buckets", " 8, 16 ,", (8, 16)), ("max_length", "128", 128), ("torch_threads", "3", 3),
    ("prefetch_factor", "2", 2), ("max_batch_tokens", "512", 512), ("deadline_ms", "7", 7.0),
    ("max_wait_ms", "0.5", 0.5), ("graph", "compile", "compile"),
    ("torch_threads", "None", None), ("deadline_ms", "null", None), ("max_batch_tokens", "none", None),
])
def test_parse_knob_value_reads_each_type(name, text, expected):
    value = parse_knob_value(name, text)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("name,text,message", [
    ("pin_memory", "maybe", "knob pin_memory='maybe' cannot be read as true/false"),
    ("batch_size", "2.5", "knob batch_size='2.5' cannot be read as int"),
    ("max_wait_ms", "soon", "knob max_wait_ms='soon' cannot be read as float"),
    ("buckets", "8,x", "knob buckets='8,x' cannot be read as tuple"),
    ("prefetch_factor", "two", "knob prefetch_factor='two' cannot be read as a number"),
    ("deadline_ms", "late", "knob deadline_ms='late' cannot be read as a number"),
    ("batch_size", "none", "knob batch_size='none' cannot be read as int"),  # not a nullable knob
])
def test_parse_knob_value_errors_name_the_knob_and_the_type(name, text, message):
    with pytest.raises(ValueError) as info:
        parse_knob_value(name, text)
    assert str(info.value) == message


def test_parse_unknown_knob_and_presets():
    with pytest.raises(ValueError) as info:
        parse_knob_value("nope", "1")
    assert str(info.value) == f"unknown knob 'nope'; known knobs: {', '.join(knob_names())}"
    with pytest.raises(ValueError) as info:
        preset("fastest")
    assert str(info.value) == "unknown preset 'fastest'; allowed: baseline | tuned"
    assert preset("tuned", batch_size=4).batch_size == 4 and preset("tuned").batch_size == 16


def test_bucket_lengths_keep_buckets_below_max_length_then_max_length():
    assert Knobs(max_length=64, buckets=(16, 32, 64, 128)).bucket_lengths == (16, 32, 64)
    assert Knobs(max_length=65, buckets=(16, 64, 128)).bucket_lengths == (16, 64, 65)
