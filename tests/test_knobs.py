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


# The declarations are the one source (#51 item 6): role, choices or range, panel steps. These tests hold the
# checks, the listing, the panel and the knobs: line to them, and add a knob in one place to show it travels.

def test_every_knob_declares_a_role_and_what_it_allows():
    from dataclasses import fields

    from tuning.knobs import ROLES, knob_specs

    specs = knob_specs()
    assert list(specs) == knob_names()
    for f in fields(Knobs):
        s = specs[f.name]
        assert s.role in ROLES and len(s.help) > 10 and s.allowed(), f.name
        assert s.nullable == ("None" in str(f.type)), f.name  # the annotation decides, the spec says it
        if s.kind == "choice":
            assert s.choices and s.default in s.choices, f.name
        if s.steps:
            assert list(s.steps) == sorted(s.steps) and all(s.minimum is None or v >= s.minimum for v in s.steps)
            assert not (s.nullable and 0 in s.steps), f"{f.name}: the panel shows None at 0"


@pytest.mark.parametrize("name", [n for n in knob_names() if n not in ("buckets", "sim_profile", "pin_memory", "tf32")])
def test_an_error_names_the_values_the_listing_shows(name):
    from tuning.knobs import knob_specs

    s = knob_specs()[name]
    bad = "nope" if s.kind == "choice" else (s.maximum + 1 if s.maximum is not None else s.minimum - 1)
    kwargs = {name: bad, **({"num_workers": 1} if name == "prefetch_factor" else {})}
    with pytest.raises(ValueError) as built:
        Knobs(**kwargs)
    with pytest.raises(ValueError) as parsed:  # --set refuses it with the same words
        parse_knob_value(name, str(bad))
    assert str(built.value).endswith(f"allowed: {s.allowed()}") and str(parsed.value) == str(built.value)
    assert s.describe().startswith(s.allowed())


def test_roles_split_the_offline_and_served_knobs():
    from tuning.knobs import knob_specs, knobs_for

    offline, served = set(knobs_for("offline")), set(knobs_for("served"))
    assert offline | served == set(knob_names())
    assert {"prefetch_factor", "bucket_window", "group_by"} <= offline - served
    assert {"max_wait_ms", "max_batch_tokens", "max_queue", "concurrency", "deadline_ms"} <= served - offline
    assert offline & served == {n for n, s in knob_specs().items() if s.role == "both"}
    with pytest.raises(ValueError, match="mode='online'"):
        knobs_for("online")


def test_knobs_listing_names_each_knobs_role_and_allowed_values(capsys):
    import argparse
    import json

    from tuning.cli.commands import cmd_knobs
    from tuning.knobs import knob_specs

    assert cmd_knobs(argparse.Namespace(json=False)) == 0
    blocks = capsys.readouterr().out.split("\n")
    for s in knob_specs().values():
        at = next(i for i, line in enumerate(blocks) if line.startswith(f"{s.name} = "))
        assert blocks[at + 1].strip().startswith(f"applies: {s.role} (") and s.describe() in blocks[at + 1]
    assert cmd_knobs(argparse.Namespace(json=True)) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["knob"], r["role"], r["allowed"]) for r in rows] == [
        (s.name, s.role, s.describe()) for s in knob_specs().values()]
    assert next(r for r in rows if r["knob"] == "dtype")["allowed"] == "fp32 | bf16 | fp16"


def test_the_knobs_line_is_every_offline_knob_that_applies_in_declaration_order():
    from tuning.knobs import knobs_for
    from tuning.present.tables import knob_line

    line = " ".join(knob_line(Knobs(device="cpu")).split())
    named = [part.split("=")[0] for part in line.removeprefix("knobs: ").split()]
    assert named == [n for n in knobs_for("offline") if n not in ("buckets", "compile_mode", "sim_profile")]
    assert "max_wait_ms" not in named and "prefetch_factor=none" in line and "device=cpu" in line
    bucketed = " ".join(knob_line(Knobs(padding="bucket", buckets=(8, 16), num_workers=0)).split())
    assert "buckets=8,16" in bucketed and "prefetch_factor" not in bucketed  # it needs num_workers > 0
    assert "max_wait_ms=0.0" in knob_line(Knobs(), mode="served")


def test_code_that_names_a_level_uses_a_declared_one():
    """The screen's factors and the advice sentences name knob values; each must be one the knob declares."""
    import re
    from pathlib import Path

    import tuning
    from tuning.knobs import declared, knob_specs

    with pytest.raises(ValueError, match=r"allowed: naive \| fast"):
        declared("tokenizer", "slow")
    specs = knob_specs()
    root = Path(tuning.__file__).parent
    named = []
    for path in ("experiments/factors.py", "present/verdicts.py", "profile/diagnose.py"):
        for name, value in re.findall(r"\b(\w+)='?([\w-]+)'?", (root / path).read_text()):
            if name in specs and specs[name].kind == "choice":
                named.append(name)
                assert value in specs[name].choices, f"{path}: {name}={value}"
    assert {"tokenizer", "padding", "dtype", "graph"} <= set(named)  # the scan sees the sentences


def test_a_knob_declared_only_in_knobs_py_reaches_the_checks_listing_panel_and_line(monkeypatch, capsys):
    import argparse
    from dataclasses import dataclass

    import tuning.knobs as knobs_module
    from tuning import widgets
    from tuning.cli.commands import cmd_knobs
    from tuning.knobs import _knob
    from tuning.present.tables import knob_line

    @dataclass(frozen=True)
    class More(Knobs):
        beam_width: int = _knob(4, "a knob this test adds: candidates kept per step", "served", minimum=1,
                                steps=(1, 2, 4, 8), panel=True)

    monkeypatch.setattr(knobs_module, "Knobs", More)
    with pytest.raises(ValueError, match=r"knob beam_width=0 is out of range; allowed: an integer >= 1"):
        More(beam_width=0)
    assert parse_knob_value("beam_width", "8") == 8 and "beam_width" in knob_names()
    panel = widgets.knob_panel(More(device="cpu"), mode="online", measure=lambda k: None, run=False)
    assert list(panel.controls["beam_width"].options) == [1, 2, 4, 8]
    assert "beam_width" not in widgets.knob_panel(More(device="cpu"), measure=lambda k: None, run=False).controls
    assert "beam_width=4" in knob_line(More(), mode="served") and "beam_width" not in knob_line(More())
    assert cmd_knobs(argparse.Namespace(json=False)) == 0
    out = capsys.readouterr().out
    assert "beam_width = 4" in out and "applies: served (" in out.split("beam_width = 4")[1].split("\n")[1]
