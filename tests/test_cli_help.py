"""The CLI's help teaches (#51 item 4): every command shows working examples and groups its flags, the glossary
and the exit codes are said once (top-level), a misspelt flag gets a "did you mean", exit codes come from one
enum; and one default for one idea (item 5): one p99 target, one preset rule, names that do not collide.

Every example is parsed by the real parser here, so an example cannot name a flag that no longer exists.
"""

from __future__ import annotations

import argparse
import ast
import shlex
from pathlib import Path

import pytest

from tuning.cli.commands import COMMANDS, PRESET_RULE, _HelpFormatter, _subcommands, build_parser, default_preset, main
from tuning.cli.guard import EXIT_INTERRUPTED, EXIT_NOTHING, Exit

PARSER = build_parser()
SUBCOMMANDS = _subcommands(PARSER)
COMMANDS_PY = Path(__file__).resolve().parents[1] / "tuning" / "cli" / "commands.py"


def _help(parser: argparse.ArgumentParser) -> str:
    return parser.format_help()


def _example_lines(text: str, command: str) -> list[str]:
    """The ``python -m tuning COMMAND ...`` lines of a help's examples section."""
    section = text.split("examples:\n", 1)[1] if "examples:\n" in text else ""
    return [line.strip() for line in section.splitlines() if line.strip().startswith(f"python -m tuning {command}")]


def test_every_command_is_a_subcommand():
    assert list(SUBCOMMANDS) == list(COMMANDS)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_help_has_two_or_three_examples_of_its_own_command(command):
    lines = _example_lines(_help(SUBCOMMANDS[command]), command)
    assert 2 <= len(lines) <= 3, f"{command} --help has {len(lines)} examples: {lines}"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_example_parses(command):
    for line in _example_lines(_help(SUBCOMMANDS[command]), command):
        args = build_parser().parse_args(shlex.split(line)[3:])
        assert args.command == command, line


def test_top_level_examples_parse():
    lines = [line for name in COMMANDS for line in _example_lines(_help(PARSER), name)]
    assert len(lines) >= 2
    for line in lines:
        build_parser().parse_args(shlex.split(line)[3:])


def test_investigate_examples_cover_the_demo_a_running_service_and_a_started_one():
    lines = _example_lines(_help(SUBCOMMANDS["investigate"]), "investigate")
    assert any(line.startswith("python -m tuning investigate --quick") for line in lines)
    assert any("--url " in line and "--api tei" in line for line in lines)
    assert any("--server triton" in line and "--cmd " in line for line in lines)


def test_the_glossary_and_exit_codes_are_on_the_top_level_help_only():
    top = _help(PARSER)
    assert "terms:" in top and "wait_for_input" in top and "exit codes:" in top and "130" in top
    for name, sub in SUBCOMMANDS.items():
        text = _help(sub)
        assert "wait_for_input" not in text and "\nexit codes:\n" not in text, f"{name} --help repeats the glossary"
        assert "python -m tuning --help" in text, f"{name} --help does not say where the terms are"


def _groups(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    return {g.title: [a.option_strings[0] if a.option_strings else a.dest for a in g._group_actions]
            for g in parser._action_groups if g._group_actions}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_flags_are_grouped(command):
    groups = _groups(SUBCOMMANDS[command])
    assert set(groups["options"]) <= {"-h", "--verbose"}, f"{command}: flags outside a group: {groups['options']}"
    assert len(groups) >= 2


def test_loadtest_groups_its_flags_by_what_they_set():
    groups = _groups(SUBCOMMANDS["loadtest"])
    by_flag = {flag: title for title, flags in groups.items() for flag in flags}
    assert by_flag["--rate"] == by_flag["--concurrency"] == by_flag["--duration"] == "load shape"
    assert by_flag["--url"] == by_flag["--api"] == by_flag["--input-name"]
    assert by_flag["--locust-workers"] == by_flag["--remote-workers"] == by_flag["--engine"]
    assert by_flag["--json"] == "output"
    assert len({by_flag["--rate"], by_flag["--url"], by_flag["--locust-workers"], by_flag["--json"]}) == 4


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_default_is_said_twice(command):
    formatter = _HelpFormatter(f"python -m tuning {command}")
    for action in SUBCOMMANDS[command]._actions:
        text = formatter._expand_help(action) if action.help else ""
        assert text.count("(default") <= 1, f"{command} {action.option_strings}: {text}"


def test_a_misspelt_flag_names_the_command_and_the_flag_meant(capsys):
    code = main(["run", "--limt", "20"])
    err = capsys.readouterr().err
    assert code == Exit.USAGE
    assert err.strip() == "error: python -m tuning run: unrecognized argument --limt; did you mean --limit?"


def test_a_stray_word_points_to_the_commands_help(capsys):
    code = main(["plan", "--k", "4", "seven"])
    err = capsys.readouterr().err
    assert code == Exit.USAGE and len(err.strip().splitlines()) == 1
    assert "python -m tuning plan: unrecognized argument seven; see python -m tuning plan --help" in err


def test_an_old_alias_suggests_the_new_name(capsys):
    assert main(["loadtest", "--wrkers", "2"]) == Exit.USAGE
    assert "did you mean --locust-workers?" in capsys.readouterr().err


def test_exit_codes_are_one_enum():
    assert [(e.name, int(e)) for e in Exit] == [("OK", 0), ("NOTHING", 1), ("USAGE", 2), ("TARGET_MISSED", 3),
                                                ("INTERRUPTED", 130)]
    assert EXIT_NOTHING is Exit.NOTHING and EXIT_INTERRUPTED is Exit.INTERRUPTED


def test_no_command_returns_a_bare_number():
    tree = ast.parse(COMMANDS_PY.read_text(encoding="utf-8"))
    bare = [f"{fn.name}:{node.lineno}" for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)
            and (fn.name.startswith("cmd_") or fn.name == "main" or fn.name.startswith("_"))
            for node in ast.walk(fn) if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, int) and not isinstance(node.value.value, bool)]
    assert not bare, f"return Exit.X, not a number: {bare}"


# --- one default for one idea (#51 item 5) ------------------------------------------------------------------

def _option(command: str, flag: str) -> argparse.Action | None:
    return next((a for a in SUBCOMMANDS[command]._actions if flag in a.option_strings), None)


def test_one_p99_target_for_every_command():
    from tuning.experiments.ladder import DEFAULT_TARGET_P99_MS

    targets = {name: _option(name, "--target-p99-ms") for name in COMMANDS}
    assert {name for name, a in targets.items() if a} >= {"investigate", "tune"}
    # one target everywhere: the default, or where judging is asked for (loadtest), the flag given alone
    assert {a.const if a.nargs == "?" else a.default for a in targets.values() if a} == {DEFAULT_TARGET_P99_MS}


def test_one_preset_rule_said_in_every_preset_help():
    with_preset = {name: _option(name, "--preset") for name in COMMANDS if _option(name, "--preset")}
    assert set(with_preset) == {"run", "profile", "serve", "loadtest", "sweep", "plan", "precision"}
    for name, action in with_preset.items():
        assert action.default == default_preset(name) and PRESET_RULE in action.help, name
    assert {name for name, a in with_preset.items() if a.default == "tuned"} == {"serve", "loadtest"}


def test_locust_workers_do_not_collide_with_the_knob_num_workers():
    args = build_parser().parse_args(["loadtest", "--engine", "locust", "--locust-workers", "3", "--duration", "5"])
    assert args.locust_workers == 3
    old = build_parser().parse_args(["loadtest", "--engine", "locust", "--workers", "2", "--duration", "5"])
    assert old.locust_workers == 2  # the old name still works
    assert "--workers" not in " ".join(_example_lines(_help(SUBCOMMANDS["loadtest"]), "loadtest"))


def test_the_device_profiles_listed_are_the_shipped_files():
    from tuning.base.assets import shipped_profiles

    what_if = _option("investigate", "--what-if").help
    assert all(name in what_if for name in shipped_profiles()) and len(shipped_profiles()) >= 4


def test_the_knob_help_and_the_error_list_the_same_profiles():
    from dataclasses import fields

    from tuning.base.assets import device_profile_path, shipped_profiles
    from tuning.knobs import Knobs

    knob_help = next(f for f in fields(Knobs) if f.name == "sim_profile").metadata["help"]
    with pytest.raises(ValueError) as refused:
        device_profile_path("no-such-card")
    for name in shipped_profiles():
        assert name in knob_help and name in str(refused.value)


def test_precision_recommends_on_the_investigations_line():
    from tuning.experiments.factors import MIN_COSINE
    from tuning.present.verdicts import precision_verdict

    just_under = {"dtype": "bf16", "min_cosine": MIN_COSINE - 1e-4, "status": "ok"}
    assert "keep dtype=fp32" in precision_verdict([just_under]) and str(MIN_COSINE) in precision_verdict([just_under])
