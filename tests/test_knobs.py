import warnings

import pytest

from tuning.knobs import PRESETS, Knobs, knob_names, parse_knob_value, preset


@pytest.mark.parametrize("field,value,exc,needle", [
    ("batch_size", 0, ValueError, "batch_size=0"),
    ("batch_size", 2.5, TypeError, "batch_size=2.5"),
    ("batch_size", True, TypeError, "batch_size=True"),
    ("num_workers", -1, ValueError, "num_workers=-1"),
    ("tokenizer", "slow", ValueError, "naive | fast"),
    ("padding", "ragged", ValueError, "dynamic | fixed | bucket"),
    ("dtype", "int8", ValueError, "fp32 | bf16 | fp16"),
    ("graph", "jit", ValueError, "eager | compile | cuda_graph"),
    ("device", "tpu", ValueError, "auto | cpu | cuda"),
    ("max_length", 1000, ValueError, "between 3 and 512"),
    ("buckets", (64, 32), ValueError, "ascending"),
    ("buckets", [32, 64], TypeError, "tuple"),
    ("max_wait_ms", -1.0, ValueError, "max_wait_ms=-1.0"),
    ("max_queue", 0, ValueError, "max_queue=0"),
    ("pin_memory", "yes", TypeError, "True or False"),
    ("deadline_ms", 0.0, ValueError, "deadline_ms=0.0"),
])
def test_bad_knob_names_field_value_and_allowed(field, value, exc, needle):
    with pytest.raises(exc) as info:
        Knobs(**{field: value})
    assert field in str(info.value) and needle in str(info.value)


@pytest.mark.parametrize("changes,needle", [
    (dict(prefetch_factor=4, num_workers=0), "num_workers"),
    (dict(graph="cuda_graph", padding="dynamic"), "padding='bucket'"),
    (dict(graph="cuda_graph", padding="bucket", device="cpu"), "graph='compile'"),
    (dict(dtype="fp16", device="cpu"), "bf16"),
    (dict(pin_memory=True, device="cpu"), "pin_memory=False"),
])
def test_contradictions_raise_with_the_fix(changes, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        Knobs(**changes)


def test_resolve_without_cuda():
    assert Knobs().resolve(cuda_available=False).device == "cpu"
    with pytest.raises(ValueError, match="graph='compile'"):
        Knobs(graph="cuda_graph", padding="bucket").resolve(cuda_available=False)
    with pytest.raises(ValueError, match="bf16"):
        Knobs(dtype="fp16").resolve(cuda_available=False)
    with pytest.raises(ValueError, match="no CUDA"):
        Knobs(device="cuda").resolve(cuda_available=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k = Knobs(pin_memory=True).resolve(cuda_available=False)
    assert k.pin_memory is False and "pin_memory" in str(caught[0].message)
    assert Knobs(graph="cuda_graph", padding="bucket", pin_memory=True).resolve(cuda_available=True).pin_memory


def test_every_knob_has_help_and_presets_are_the_ladder():
    help_ = Knobs().help()
    assert set(help_) == set(knob_names()) and all(len(t) > 10 for t in help_.values())
    base = PRESETS["baseline"]
    assert (base.batch_size, base.num_workers, base.tokenizer, base.padding, base.dtype, base.graph) == (
        1, 2, "naive", "dynamic", "fp32", "eager")
    assert PRESETS["tuned"].batch_size > 1
    with pytest.raises(ValueError, match="baseline"):
        preset("fastest")


def test_bucket_lengths_end_at_max_length():
    assert Knobs(max_length=128, buckets=(32, 64, 128, 256)).bucket_lengths == (32, 64, 128)
    assert Knobs(max_length=100, buckets=(32, 64)).bucket_lengths == (32, 64, 100)


@pytest.mark.parametrize("name,text,expected", [
    ("batch_size", "8", 8), ("pin_memory", "true", True), ("max_wait_ms", "2.5", 2.5),
    ("buckets", "32,64,256", (32, 64, 256)), ("prefetch_factor", "none", None), ("dtype", "bf16", "bf16"),
])
def test_parse_knob_value(name, text, expected):
    assert parse_knob_value(name, text) == expected


def test_parse_knob_value_errors():
    with pytest.raises(ValueError, match="unknown knob 'nope'"):
        parse_knob_value("nope", "1")
    with pytest.raises(ValueError, match="batch_size='eight'"):
        parse_knob_value("batch_size", "eight")
    with pytest.raises(ValueError, match="unknown knob"):
        Knobs().replace(nope=1)


@pytest.mark.parametrize("value,exc,needle", [
    (0, ValueError, "max_batch_tokens=0"),
    (2.5, TypeError, "max_batch_tokens=2.5"),
    (100, ValueError, "max_length=256"),  # below max_length: a long request could never fit
])
def test_max_batch_tokens_is_validated(value, exc, needle):
    with pytest.raises(exc, match=needle):
        Knobs(max_batch_tokens=value)


def test_max_batch_tokens_parses_and_defaults_to_no_budget():
    assert Knobs().max_batch_tokens is None and "max-batch-tokens" in Knobs().help()["max_batch_tokens"]
    assert parse_knob_value("max_batch_tokens", "4096") == 4096
    assert parse_knob_value("max_batch_tokens", "none") is None
    assert Knobs(max_batch_tokens=4096).max_batch_tokens == 4096
