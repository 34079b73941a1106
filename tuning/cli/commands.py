"""Command line: ``python -m tuning {run,...} --preset NAME [--set knob=value ...]``.

Bad flags or knob values exit with code 2 and one clear line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import math
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from tuning.base.contract import with_schema
from tuning.base.format import fit
from tuning.base.machine import MachineWatch
from tuning.cli.guard import EXIT_CODES, TERMS, Exit
from tuning.knobs import PRESETS, Knobs, parse_knob_value, preset, preset_note


class UsageError(Exception):
    """A bad flag or value: exit 2 with one line."""


class _Parser(argparse.ArgumentParser):
    """argparse's errors as one line, exit 2 (argparse prints the usage too); an unknown flag is named with its
    subcommand and the flag it most likely meant, since a typo is the commonest reason for one."""

    def error(self, message: str) -> None:
        raise UsageError(f"{self.prog}: {message}")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = _subcommands(self).get(getattr(parsed, "command", None) or "", self)
            raise UsageError(_unrecognized(command, extras))
        return parsed


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser of each subcommand (argparse has no public accessor for them)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """One line for what ``parser`` did not take: the first unknown flag (else the first stray word) and the
    closest of that parser's own flags, e.g. ``python -m tuning run: unrecognized argument --limt; did you mean
    --limit?``."""
    word = next((e for e in extras if e.startswith("-")), extras[0]).split("=", 1)[0]
    canonical = {o: next(f for f in a.option_strings if f.startswith("--"))  # an old alias suggests the new name
                 for a in parser._actions for o in a.option_strings if o.startswith("--")}
    close = difflib.get_close_matches(word, list(canonical), n=1, cutoff=0.6) if word.startswith("-") else []
    hint = f"did you mean {canonical[close[0]]}?" if close else f"see {parser.prog} --help"
    return f"{parser.prog}: unrecognized argument {word}; {hint}"


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for assignment in args.set or []:
        name, sep, text = assignment.partition("=")
        if not sep or not name:
            raise UsageError(f"--set {assignment!r}: expected knob=value, e.g. --set batch_size=8")
        overrides[name.strip()] = parse_knob_value(name.strip(), text)
    return overrides


def knobs_from_args(args: argparse.Namespace) -> Knobs:
    return preset(args.preset, **_overrides(args))


SERVING_COMMANDS = ("serve", "loadtest")
PRESET_RULE = ("serve and loadtest start from tuned (what you would deploy); run, profile, sweep, plan and precision "
               "start from baseline (the investigation's start, so that one --set shows its own effect)")


def default_preset(command: str) -> str:
    """One rule for every command (PRESET_RULE): the commands that serve run what you would ship, the ones
    that study one variable start where the investigation starts."""
    return "tuned" if command in SERVING_COMMANDS else "baseline"


def _add_knob_flags(p: Any, command: str) -> None:
    p.add_argument("--preset", default=default_preset(command), choices=sorted(PRESETS),
                   help=f"the knobs to start from (python -m tuning knobs lists them); {PRESET_RULE}")
    p.add_argument("--set", action="append", metavar="KNOB=VALUE",
                   help="change one knob (repeatable), e.g. --set batch_size=8 --set dtype=bf16")


def _add_json_flag(p: Any, what: str = "print one JSON object instead of a table") -> None:
    p.add_argument("--json", action="store_true", help=what)


def _add_data_flags(p: Any) -> None:
    from tuning.base.assets import DEFAULT_DATA

    p.add_argument("--data", type=Path, default=DEFAULT_DATA,
                   help="requests: record JSONL (default: the shipped demo), JSONL with a text field, CSV/TSV, Parquet, "
                        "or plain text with one request per line (format by extension, or --format)")
    p.add_argument("--limit", type=_positive_int, default=None, help="read only the first N lines (rows)")
    p.add_argument("--text-field", default=None, metavar="NAME",
                   help="JSONL: the field holding the text (default: 'text' for a line without the record schema)")
    p.add_argument("--text-column", default=None, metavar="NAME",
                   help="CSV/TSV/Parquet: the column holding the text (default: 'text', or the only column)")
    p.add_argument("--format", default=None, choices=["jsonl", "csv", "tsv", "parquet", "text"],
                   help="the data format when the extension does not say it")


def _add_model_flags(p: Any) -> None:
    p.add_argument("--model", default=None, metavar="DIR|MODULE:FACTORY",
                   help="your model: a sentence-transformers style folder (config.json, *.safetensors, tokenizer.json; "
                        "BERT-family), or module:factory returning the model or (model, tokenizer)")
    p.add_argument("--formatter", default=None, metavar="MODULE:FUNCTION",
                   help="your record -> text step (default: title, category, attributes, body)")


def _custom(args: argparse.Namespace, knobs: Knobs) -> tuple[dict[str, Any], str]:
    """The model, tokenizer and formatter ``--model``/``--formatter`` name (keyword arguments for
    Pipeline and Server), and a label for the model."""
    from tuning.inputs.records import format_record
    from tuning.runtime.custom import resolve_formatter, resolve_model

    model, tokenizer, label = resolve_model(getattr(args, "model", None), knobs)
    formatter = resolve_formatter(getattr(args, "formatter", None)) or format_record
    return {"model": model, "tokenizer": tokenizer, "formatter": formatter}, label


def _data_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The data flags as the readers' keyword arguments."""
    return {"text_field": args.text_field, "text_column": args.text_column, "format": args.format}


def _inputs(args: argparse.Namespace) -> list[Any]:
    """The requests of ``--data`` in any format, as the server and the load generator take them."""
    from tuning.inputs.readers import read_inputs

    return [raw for _, raw in read_inputs(args.data, args.limit, **_data_kwargs(args))]


def _add_metrics_flag(p: Any) -> None:
    p.add_argument("--metrics-url", default=None,
                   help="the service's Prometheus metrics, scraped as the measured window opens and closes (default: "
                        "/metrics beside --url, where this package's server and TEI export them; Triton: "
                        "http://HOST:8002/metrics; MLServer: http://HOST:8082/metrics)")
    p.add_argument("--metrics-map", default=None, metavar="KEY=NAME,...",
                   help="read any exporter: queue=NAME,compute=NAME,request=NAME,batch=NAME, each a histogram "
                        "(its mean per request; a time's unit from its name's _seconds/_ms/_us, or NAME:s). Known "
                        "without it: this package's server, TEI, Triton, Ray Serve, MLServer")


def _add_api_flags(p: Any) -> None:
    """The request schema of the service at --url (tuning.load.apis)."""
    from tuning.load.apis import API_ALIASES, API_NAMES

    p.add_argument("--api", choices=[*API_NAMES, *API_ALIASES], default=None,
                   help="the service's request schema: tuning (POST /embed {\"text\"}), tei (/embed {\"inputs\": [...]}), "
                        "openai (/v1/embeddings), kserve or triton (/v2/models/NAME/infer), custom (--body); "
                        "default tuning, or custom with --body")
    p.add_argument("--body", default=None, metavar="JSON",
                   help="a request template: a string value exactly \"{text}\" is the text, \"{texts}\" the list "
                        "(e.g. '{\"input\": \"{text}\"}'); nothing else is substituted")
    p.add_argument("--route", default=None, help="the path to POST to (default: the URL's own, else the API's)")
    p.add_argument("--model-name", default=None, help="openai: the model field; kserve: the model in the route")
    p.add_argument("--input-name", default="TEXT", help="kserve: the input tensor's name (default TEXT)")
    p.add_argument("--output-name", default=None, help="kserve: the output holding the embeddings (default: the first)")
    p.add_argument("--header", action="append", default=None, metavar="'K: V'",
                   help="an HTTP header for every request (repeatable; values of Authorization and API keys are "
                        "never printed)")
    p.add_argument("--timeout", type=_positive_float, default=60.0, help="seconds per request before it is an error")
    p.add_argument("--client-batch", type=_positive_int, default=1,
                   help="texts per request, as TEI and OpenAI clients send (latency per request; throughput as qps "
                        "and texts_per_s)")
    p.add_argument("--no-validate", action="store_true",
                   help="count any 2xx as ok (for a service whose answer is not one embedding per text)")


def api_from_args(args: argparse.Namespace, recipe: Any = None) -> Any:
    """The :class:`tuning.load.apis.Api` the flags describe, a ``--server`` recipe filling in what they leave
    out (an ApiError, exit 2, names a bad one)."""
    from urllib.parse import urlsplit

    from tuning.load.apis import KSERVE_ROUTE, Api, parse_headers, parse_template, schema_name

    template = parse_template(getattr(args, "body", None))
    defaults = dict(recipe.api_options) if recipe is not None else {}
    name = getattr(args, "api", None) or ("custom" if template is not None else recipe.api if recipe else "tuning")
    if template is not None and name != "custom":
        raise UsageError(f"--body goes with --api custom (or no --api), not --api {name}: that API has its own body")
    given = {"route": args.route, "model_name": args.model_name, "output_name": args.output_name,
             "input_name": args.input_name if args.input_name != "TEXT" else None}
    fields = {**defaults, **{k: v for k, v in given.items() if v is not None}}
    if not fields.get("model_name") and not fields.get("route") and schema_name(name) == "kserve":
        named = KSERVE_ROUTE.fullmatch(urlsplit(getattr(args, "url", None) or "").path)
        if named:  # a full KServe URL carries its model's name
            fields["model_name"] = named.group(1)
    metrics_map = getattr(args, "metrics_map", None)
    if metrics_map is not None:
        from tuning.load.scrape import parse_metrics_map

        try:
            parse_metrics_map(metrics_map)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
    return Api(name, template=template, headers=parse_headers(args.header), client_batch=args.client_batch,
               validate=not args.no_validate, timeout_s=args.timeout, metrics_map=metrics_map, **fields)


def _api_inputs(args: argparse.Namespace, api: Any, inputs: list[Any]) -> list[Any]:
    """Request bodies for ``api`` (:func:`tuning.load.apis.request_bodies`, with --formatter)."""
    from tuning.load.apis import request_bodies

    return request_bodies(api, inputs, getattr(args, "formatter", None))


def _int_at_least(lo: int, hint: str = "") -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {lo}{hint}")
        return value
    return parse


_positive_int = _int_at_least(1)
_nonnegative_int = _int_at_least(0, " (0: off)")


def _bounded_int(lo: int, hi: int, what: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text!r}: {what}")
        return value
    return parse


_port = _bounded_int(0, 65535, "a port is 0-65535 (0: any free port)")
_count = _bounded_int(0, 10**9, "give 0 or more")
_length = _bounded_int(3, 512, "give 3-512 tokens (the model's position limit is 512; [CLS] and [SEP] included)")


def _seconds(minimum: float, what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value >= minimum or value != value or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r}: {what}")
        return value
    return parse


_interval = _seconds(0.1, "the sampling interval is >= 0.1 seconds")
_nonneg_seconds = _seconds(0.0, "give 0 or more seconds")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default once: appended where it has one and its help does not already say it in
    words (a help that names its default says it better than the value would), and keeps the epilog's layout
    (the examples, the terms)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        says_it = "%(default)" in text or "default" in text
        if says_it or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


_MACHINE: MachineWatch | None = None  # started by main(): the machine block's load and steal at the start


def _print_json(obj: Any, result: bool = True) -> None:
    """Every result's ``--json`` output: one object with ``schema_version`` first and the ``machine`` block that
    made it (README, "JSON output"); ``result=False``: a listing that is not a measurement (``knobs --json``)."""
    if result and isinstance(obj, dict) and "machine" not in obj:
        obj = {**obj, "machine": (_MACHINE or MachineWatch()).info()}
    print(json.dumps(with_schema(obj) if result else obj, indent=2, default=str))


def _announce_knobs(args: argparse.Namespace) -> None:
    """Every command with --preset names the knobs it runs with (``run`` prints its own line, ``serve`` names
    the preset in its first line, the one that gives the URL)."""
    if getattr(args, "preset", None) is None or args.json or args.command in ("run", "serve") \
            or getattr(args, "url", None):
        return
    changes = f" with --set {' --set '.join(args.set)}" if args.set else ""
    note = preset_note(args.preset, _overrides(args))
    print(fit(f"knobs: preset {args.preset}{f' ({note})' if note else ''}{changes} (python -m tuning knobs lists them)"),
          flush=True)


def _emit(args: argparse.Namespace, summary: Any, render: Callable[[], str]) -> int:
    """Print ``summary`` as JSON with ``--json``, else the readable rendering."""
    if args.json:
        _print_json(summary)
    else:
        print(fit(render()))
    return Exit.OK


def cmd_run(args: argparse.Namespace) -> int:
    from tuning.offline.pipeline import Pipeline
    from tuning.present.tables import format_run

    knobs = knobs_from_args(args)
    custom, label = _custom(args, knobs)
    _compile_note(knobs)
    result = Pipeline(knobs, **custom).run(args.data, args.limit, keep_embeddings=False, **_data_kwargs(args))
    summary = {**result.summary(), "model": label}
    note = preset_note(args.preset, _overrides(args))
    head = f"knobs: preset {args.preset} ({note})\n" if note else ""
    code = _emit(args, summary, lambda: f"{head}model: {label}\n" + format_run(result))
    _nothing_done(summary["ok"], summary["requests"], summary["error_reasons"])
    return code


def _compile_note(knobs: Knobs) -> None:
    """graph=compile on a CPU: say plainly what it costs."""
    if knobs.graph == "compile" and knobs.device != "cuda":
        import torch

        if knobs.device == "cpu" or not torch.cuda.is_available():
            warnings.warn("graph=compile on a CPU: torch.compile takes tens of seconds per shape (outside the "
                          "measured window), and what it saves is kernel launches, which cost little on a CPU; it "
                          "pays on a GPU. On a CPU keep graph=eager", RuntimeWarning, stacklevel=2)


def cmd_profile(args: argparse.Namespace) -> int:
    from tuning.experiments.profiled import profile_pipeline
    from tuning.offline.pipeline import Pipeline
    from tuning.present.tables import format_profile

    knobs = knobs_from_args(args)
    custom, _ = _custom(args, knobs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the GPU section reports the reason instead
        profile = profile_pipeline(knobs, args.data, args.limit, interval=args.interval, pipeline=Pipeline(knobs, **custom),
                                   **_data_kwargs(args))
    return _emit(args, profile.summary(), lambda: format_profile(profile))


def cmd_serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    from tuning.online.httpfront import HttpFront
    from tuning.online.serve import Server

    knobs = knobs_from_args(args)
    custom, _ = _custom(args, knobs)
    server = Server(knobs, **custom)
    front = HttpFront(server, args.host, args.port, backlog=args.backlog, max_connections=args.max_connections)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    talk = sys.stderr if args.json else sys.stdout  # with --json, stdout holds only the summary
    with front:
        t0, url = time.perf_counter(), front.url
        print(f"serving {args.preset} on {front.url}  (uvicorn + starlette; POST /embed, GET /healthz, GET /metrics; "
              "Ctrl-C stops)", file=talk, flush=True)
        try:
            stop.wait(args.duration)
        except KeyboardInterrupt:
            pass
        print("shutting down: answering requests in flight, then draining the queue", file=talk, flush=True)
    up = time.perf_counter() - t0
    counts = dict(server.counts)
    answered = sum(counts.values())
    summary = {"url": url, "preset": args.preset, "uptime_s": round(up, 3), "requests": answered,
               "outcomes": counts, "qps": round(counts.get("ok", 0) / up, 3) if up > 0 else None,
               "knobs": server.knobs.as_dict()}
    return _emit(args, summary, lambda: (f"served {answered} requests in {up:.1f} s: "
                                         + ", ".join(f"{k} {v}" for k, v in counts.items())
                                         + f"; {summary['qps'] or 0:.1f} ok/s"))


def cmd_loadtest_any(args: argparse.Namespace) -> int:
    """``loadtest``: our own load generator, or ``--engine locust``."""
    from tuning.experiments.defaults import OPEN_LOOP_IN_FLIGHT

    if args.rate is not None and "--concurrency" not in _given(args):  # the open loop's cap, not the clients'
        args.concurrency = OPEN_LOOP_IN_FLIGHT
    if args.engine == "tuning":
        if args.locust_workers is not None or args.remote_workers:
            raise UsageError("loadtest: --locust-workers and --remote-workers go with --engine locust")
        return cmd_loadtest(args)
    if args.target_p99_ms is not None:
        raise UsageError("loadtest --engine locust: --target-p99-ms needs each request's scheduled arrival, which "
                         "locust does not keep; hold the rate with the default engine")
    if "--workers" in _given(args):
        warnings.warn("--workers is now --locust-workers (locust's processes, not the knob num_workers); the old "
                      "name still works", UserWarning, stacklevel=2)
    return cmd_loadtest_locust(args)


def cmd_loadtest_locust(args: argparse.Namespace) -> int:
    """locust headless, a master and --locust-workers local worker processes, mapped into the loadtest
    summary."""
    from contextlib import nullcontext

    from tuning.load.locust_engine import run_locust
    from tuning.present.tables import format_load

    if args.duration is None or args.requests is not None:
        raise UsageError("loadtest --engine locust: give --duration S (locust runs for a time, not a count)")
    if args.rate is not None or args.profile:
        raise UsageError("loadtest --engine locust: a closed loop at --concurrency users; --rate and --profile "
                         "go with our own engine")
    inputs = _inputs(args)
    front = None
    if not args.url:  # no server given: serve the preset here, on a free loopback port
        from tuning.online.httpfront import HttpFront
        from tuning.online.serve import Server
        from tuning.runtime.engine import Engine

        knobs = knobs_from_args(args)
        custom = _custom(args, knobs)[0]
        # the locust master and its local workers are processes this command starts: their cores are not the model's
        engine = Engine(knobs, custom.pop("model"), reserved_cores=(args.locust_workers or 1) + 1)
        front = HttpFront(Server(knobs, engine=engine, **custom))
    api = api_from_args(args) if args.url else None
    with front or nullcontext():
        url = api.url(args.url) if api else front.url + "/embed"
        result = run_locust(url, _api_inputs(args, api, inputs) if api else inputs, args.concurrency, args.duration,
                            workers=args.locust_workers or 1, warmup_s=args.warmup_s if args.warmup_s is not None else 2.0,
                            remote_workers=args.remote_workers, master_host=args.master_host, api=api)
    summary = result.summary()
    summary["target"] = url
    _nothing_done(summary["ok"], summary["submitted"], summary["error_reasons"], args.url)
    return _emit(args, summary, lambda: format_load(summary))


def cmd_loadtest(args: argparse.Namespace) -> int:
    from tuning.load.generator import run_load
    from tuning.present.tables import format_load

    if (args.requests is None) == (args.duration is None):
        raise UsageError("loadtest: give exactly one of --requests N or --duration S")
    if args.profile and args.url:
        raise UsageError("loadtest: --profile records this process; with --url run `profile` where the server runs")
    if args.target_p99_ms is not None and (args.rate is None or args.duration is None):
        raise UsageError(f"loadtest --target-p99-ms {args.target_p99_ms:g}: a target is held open-loop for a time; "
                         "give --rate R (the rate to hold) and --duration S (how long: a bursty server needs "
                         "minutes, and the result says how long when it could not tell)")
    inputs = _inputs(args)
    load = dict(concurrency=args.concurrency, requests=args.requests, duration_s=args.duration, rate=args.rate,
                warmup_requests=args.warmup, warmup_s=args.warmup_s or 0.0)
    if args.url:  # the async keep-alive client (a bad row is its own error outcome, not sent); the server's
        # busy total is read when the measured window opens and when it closes
        api = api_from_args(args)
        url = api.url(args.url)
        from tuning.load.procs import run_load_procs
        from tuning.load.scrape import MetricsProbe, mapping_of, metrics_url

        probe = MetricsProbe(metrics_url(url, args.metrics_url), model=api.model_name, mapping=mapping_of(api))
        try:
            result, notes = run_load_procs(url, _api_inputs(args, api, inputs), args.client_procs, busy_probe=probe,
                                           api=api, **load)
        except ValueError as exc:
            raise UsageError(f"loadtest: {exc}") from exc
        for note in notes:
            print(f"warning: {note}", file=sys.stderr)
    else:
        from tuning.online.serve import Server

        knobs = knobs_from_args(args)
        with Server(knobs, **_custom(args, knobs)[0]) as server:
            if args.profile:
                from tuning.profile import Recorder

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # the GPU section reports the reason
                    with Recorder() as recorder:
                        result = run_load(server, inputs, **load)
            else:
                result = run_load(server, inputs, **load)
    summary = result.summary()
    summary["target"] = args.url or "in-process"
    if args.url:
        summary["server_metrics"] = probe.result().summary()
    # a test stopped early (its first answers all errors) says so, with its first reason, instead of the commonest
    reasons = [{"reason": summary["stopped_early"]}] if summary.get("stopped_early") else summary["error_reasons"]
    _nothing_done(summary["ok"], summary["submitted"], reasons, args.url)
    if args.profile and not args.url:
        profile = recorder.join(result).summary()
        summary.update({key: profile[key] for key in ("diagnosis", "threads", "gpu")})
    if args.target_p99_ms is not None:
        from tuning.experiments.capacity import hold_check
        from tuning.experiments.trial import Trial

        summary["hold"] = hold_check(Trial.from_load(result), args.target_p99_ms)
    return _emit(args, summary, lambda: format_load(summary))


def cmd_watch(args: argparse.Namespace) -> int:
    from tuning.experiments.defaults import CLOSED_LOOP_CLIENTS
    from tuning.experiments.watch import watch
    from tuning.present.tables import format_watch

    if args.pid is None and args.url is None:
        raise UsageError("watch: give --pid PID (a local service's process) or --url URL (a service to drive, "
                         "local or remote: its process is found from the listening port when it is local), or both")
    if args.url is None and args.concurrency is not None:
        raise UsageError("watch: --concurrency drives load at --url; give --url too")
    api = api_from_args(args) if args.url else None
    url = api.url(args.url) if api else None
    inputs = _api_inputs(args, api, _inputs(args)) if args.url else None
    result = watch(args.pid, url, inputs, concurrency=args.concurrency or CLOSED_LOOP_CLIENTS,
                   duration_s=args.duration, interval=args.interval, api=api, metrics_url=args.metrics_url)
    if result.load is not None:  # an honest watch: no ok answer, no diagnosis (as loadtest)
        s = result.load.summary()
        _nothing_done(s["ok"], s["submitted"], [{"reason": s["stopped_early"]}] if s.get("stopped_early")
                      else s["error_reasons"], url)
    return _emit(args, result.summary(), lambda: format_watch(result))


def _number_list(kind: type, minimum: float, what: str, example: str, rule: str) -> Callable[[str], list]:
    """An argparse type for comma-separated numbers of ``kind`` that are all >= ``minimum``."""
    def parse(text: str) -> list:
        try:
            values = [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what}, e.g. {example}") from None
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: give {rule}, e.g. {example}")
        return values
    return parse


_int_list = _number_list(int, 1, "integers", "1,2,4,8", "positive integers")
_float_list = _number_list(float, 0, "numbers", "0,5,20", "numbers >= 0")


def cmd_sweep(args: argparse.Namespace) -> int:
    from tuning.present.tables import format_load_sweep, table
    from tuning.present.verdicts import batch_sweep_verdict, load_sweep_verdict
    from tuning.runtime.engine import Engine

    if args.url:
        return _sweep_url(args)
    knobs = knobs_from_args(args)
    custom, _ = _custom(args, knobs)
    engine = Engine(knobs, custom.pop("model"))
    if args.variable == "batch":
        from tuning.experiments.sweeps import run_batch_sweep

        result = run_batch_sweep(knobs, args.sizes or [1, 2, 4, 8, 16, 32], args.length, args.repeats, engine=engine)
        summary = result.summary()
        if args.json:
            _print_json(summary)
        else:
            print(fit(f"batch sweep at {args.length} tokens, {summary['device_label']} {summary['dtype']} "
                      f"{summary['graph']}"))
            print(table(summary["points"], ["batch_size", "status", "per_batch_ms", "per_sample_ms", "texts_per_s",
                                            "memory_mb"]))
            print(fit(f"knee (smallest batch within 5% of the best per-sample cost): {summary['knee']}; "
                      f"marginal gain under 5% from batch {summary['diminishing_returns_at']}\n"
                      + batch_sweep_verdict(summary)))
        return Exit.OK
    from tuning.experiments.sweeps import load_sweep

    inputs = _inputs(args)
    variable = {"concurrency": "concurrency", "wait": "max_wait_ms"}[args.variable]
    values = args.values or ([1, 4, 16, 32, 64] if variable == "concurrency" else [0.0, 5.0, 20.0, 50.0])
    if variable == "concurrency":
        if any(v != int(v) or v < 1 for v in values):
            raise UsageError(f"sweep concurrency --values {','.join(f'{v:g}' for v in values)}: concurrency is a "
                             "whole number of clients >= 1, e.g. --values 1,8,32")
        values = [int(v) for v in values]
    from tuning.online.serve import Server

    frame = load_sweep(knobs, inputs, variable, values, requests=args.requests,
                  concurrency=None if variable == "concurrency" else args.concurrency,
                  server_factory=lambda k: Server(k, engine=engine, **custom))
    points = frame.astype(object).where(frame.notna(), None).to_dict("records")
    if args.json:
        _print_json({"variable": variable, "device": engine.device_info, "points": points,
                     "verdict": load_sweep_verdict(variable, points)})
    else:
        print(format_load_sweep(variable, points, load_sweep_verdict(variable, points)))
    _nothing_done(int(frame["ok"].sum()), int(frame[["ok", "errors", "timeouts", "rejected"]].sum().sum()), [])
    return Exit.OK


def _sweep_url(args: argparse.Namespace) -> int:
    """``sweep concurrency --url``: the same sweep against a running service, in its own request schema."""
    from tuning.experiments.sweeps import url_concurrency_sweep
    from tuning.present.tables import format_load_sweep
    from tuning.present.verdicts import load_sweep_verdict

    if args.variable != "concurrency":
        raise UsageError(f"sweep {args.variable} --url: only concurrency is a client-side variable; a service's own "
                         "knobs (its max batch size, its batch wait) are swept by `tune --cmd ... --space`")
    api = api_from_args(args)
    url = api.url(args.url)
    values = [int(v) for v in (args.values or [1, 4, 16, 32, 64])]
    frame = url_concurrency_sweep(url, _api_inputs(args, api, _inputs(args)), values, requests=args.requests, api=api)
    points = frame.astype(object).where(frame.notna(), None).to_dict("records")
    if args.json:
        _print_json({"variable": "concurrency", "target": url, "points": points,
                     "verdict": load_sweep_verdict("concurrency", points)})
    else:
        print(f"target {url}")
        print(format_load_sweep("concurrency", points, load_sweep_verdict("concurrency", points)))
    _nothing_done(int(frame["ok"].sum()), int(frame[["ok", "errors", "timeouts", "rejected"]].sum().sum()), [], url)
    return Exit.OK


def _record_jsonl(args: argparse.Namespace) -> bool:
    """Whether ``--data`` is JSONL read line by line as it comes (records or lines with a ``text`` field)."""
    from tuning.inputs.readers import detect_format

    return detect_format(args.data, args.format) == "jsonl" and args.text_field is None


def _observed(args: argparse.Namespace, max_length: int) -> tuple[list[int], list[int]]:
    """Per input of ``--data`` in any format: token length (0 for a bad row) and size in bytes."""
    from tuning.base.assets import tokenizer_files
    from tuning.inputs.tokenize import FastTokenizer

    inputs = _inputs(args)
    slots = [i for i, x in enumerate(inputs) if isinstance(x, str)]
    lengths, sizes = [0] * len(inputs), [len(x.encode()) if isinstance(x, str) else 0 for x in inputs]
    encoded = FastTokenizer(tokenizer_files()[1], max_length).encode_batch([inputs[i] for i in slots])
    for i, enc in zip(slots, encoded):
        lengths[i] = len(enc.ids)
    return lengths, sizes


def cmd_plan(args: argparse.Namespace) -> int:
    from tuning.inputs.buckets import observed_inputs, padding_waste
    from tuning.present.tables import table

    knobs = knobs_from_args(args)
    import numpy as np

    if _record_jsonl(args):
        lengths, sizes = observed_inputs(args.data, args.limit, knobs.max_length)
    else:
        lengths, sizes = _observed(args, knobs.max_length)
    report = padding_waste(lengths, k=args.k, sizes=sizes, knobs=knobs)
    rows = report.table.to_dict("records")
    valid = [n for n in lengths if n]
    if args.json:
        _print_json({"k": args.k, "planned_buckets": list(report.planned), "requests": len(lengths),
                     "batch_size": knobs.batch_size, "window": knobs.bucket_window, "strategies": rows})
    else:
        print(f"{len(lengths)} requests, token lengths p50 {int(np.median(valid))}, max {max(valid)}; "
              f"every row simulates the pipeline's batches (batch_size {knobs.batch_size}, "
              f"window {knobs.bucket_window})")
        print(table(rows, ["strategy", "shapes", "padded_tokens", "real_tokens", "padded_over_real", "waste"]))
        best = min(rows, key=lambda r: r["waste"])
        print(f"least padding: {best['strategy']}: {best['settings']}")
        now = next((r for r in rows if r.get("strategy") == "current"), None)
        print(f"verdict: {best['strategy']} pads {best['waste']:.0%} of the model's tokens"
              + (f" against {now['waste']:.0%} with the current knobs" if now else "")
              + f"; to use it: {best['settings']}.")
    return Exit.OK


def cmd_precision(args: argparse.Namespace) -> int:
    from tuning.experiments.precision import precision_report
    from tuning.inputs.readers import load_texts
    from tuning.present.tables import table
    from tuning.present.verdicts import precision_verdict

    knobs_from_args(args)  # its knobs are checked like every command's (a typo is an error, not ignored)
    report = precision_report(load_texts(args.data, args.limit, **_data_kwargs(args)))

    def render() -> str:
        rows = [{**r, "min_cosine": f"{r['min_cosine']:.6f}", "mean_cosine": f"{r['mean_cosine']:.6f}"}
                if r["status"] == "ok" else r for r in report.to_frame().to_dict("records")]
        return (f"embeddings against fp32 on {report.texts} texts ({report.device})\n"
                + table(rows, ["dtype", "texts", "min_cosine", "mean_cosine", "status"]) + "\n" + verdict)
    verdict = precision_verdict(report.to_frame().to_dict("records"))
    return _emit(args, {**report.summary(), "verdict": verdict}, render)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def verify_seconds(args: argparse.Namespace) -> float:
    """``--verify``: as given, else the mode's default hold."""
    from tuning.experiments.defaults import VERIFY_S_FULL, VERIFY_S_QUICK

    return args.verify if args.verify is not None else (VERIFY_S_QUICK if args.quick else VERIFY_S_FULL)


MIN_VERIFY_S = 10.0  # the shortest --verify hold


def _verify_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value == 0 or (value >= MIN_VERIFY_S and math.isfinite(value))):
        raise argparse.ArgumentTypeError(f"{text!r}: give 0 (no hold) or at least {MIN_VERIFY_S:g} seconds (a "
                                         "hold's first third is its queue filling; 60 or more tells more)")
    return value


def cmd_calibrate(args: argparse.Namespace) -> int:
    from tuning.present.tables import table
    from tuning.sim.calibrate import calibrate_files, describe, unidentified

    for source in args.sources:
        if not source.is_file():
            raise UsageError(f"--from {str(source)!r}: no such file; write one with `python -m tuning sweep batch --json > FILE`")
    profile, worst, points = calibrate_files(args.sources, args.name or args.out.stem, base=args.base)
    profile.to_json(args.out)
    summary = {"profile": str(args.out), "points": len(points), "worst_fit_error": worst, "fitted": describe(profile)}

    summary["unidentified"] = {k: profile.sources[k] for k in unidentified(profile)}

    def render() -> str:
        notes = "".join(f"\nnote: {k} {v}" for k, v in summary["unidentified"].items())
        return (f"fitted {profile.name} from {len(points)} points (worst fit error {worst:.1%}); wrote {args.out}\n"
                + table([describe(profile)], list(describe(profile))) + notes
                + f"\nuse it: --set device=sim --set sim_profile={args.out}")

    return _emit(args, summary, render)


def cmd_investigate(args: argparse.Namespace) -> int:
    from tuning.cli import guard as cliguard

    if args.url or args.cmd or args.server:
        return cmd_investigate_service(args)
    if args.verify:  # 0 (no hold) is what the embedded pipeline does anyway
        raise UsageError(f"--verify {args.verify:g} does not apply: it holds a service's claimed capacity (--url, "
                         "--cmd or --server); hold the embedded pipeline's with the `loadtest ... --target-p99-ms` "
                         "line its run prints")
    from tuning.experiments.ladder import LadderError
    from tuning.present.investigation import investigate
    from tuning.present.tables import format_investigation

    what_if = None if args.what_if.lower() == "none" else args.what_if
    data = args.data if _record_jsonl(args) else _inputs(args)
    custom, label = _custom(args, preset("baseline"))
    extra = {k: v for k, v in custom.items() if v is not None and (k != "formatter" or args.formatter)}
    try:
        inv = investigate(data, args.device, args.quick, what_if, args.out, args.target_p99_ms,
                          progress=not args.json, limit=args.limit, objective=args.objective,
                          error_budget=args.error_budget, seed=args.seed, concurrency=args.concurrency,
                          compile_on_cpu=args.compile_on_cpu or None, resume=args.resume, **extra)
    except LadderError as exc:
        raise cliguard.NothingAchieved(str(exc)) from exc
    code = _emit(args, inv.summary(), lambda: format_investigation(inv))
    if inv.interrupted:
        return Exit.INTERRUPTED
    return code if inv.target_met else Exit.TARGET_MISSED  # the files and the closest are there


def cmd_tune(args: argparse.Namespace) -> int:
    """``tune``: the engine over a service's own knobs (each configuration started from --cmd, kept warm while
    measured, stopped when another is asked for)."""
    from tuning.experiments.tune import CHECKPOINT, read_checkpoint, run_tune
    from tuning.present.html import render_tune
    from tuning.present.tables import format_tune

    service = started_service(args, "tune")
    space, api, settings = service["space"], service["api"], tune_settings(args)
    previous = read_checkpoint(args.resume) if args.resume is not None else None
    bodies = _api_inputs(args, api, _inputs(args))
    out = args.out if args.out is not None else args.resume  # a resumed run goes on writing where it was
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)

    def save(result: Any) -> None:
        if out is None:
            return
        summary = result.summary()
        for name, text in ((CHECKPOINT, json.dumps(with_schema(summary), indent=2, default=str)),
                           ("tune.html", render_tune(summary, resume_dir=out))):
            tmp = out / f"{name}.tmp"
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(out / name)  # never half a file, even on Ctrl-C
    say = (lambda line: None) if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    with sigterm_as_interrupt():
        result = run_tune(service["cmd"], space, service["url"], bodies, api, args.target_p99_ms, settings,
                          ready_url=service["ready_url"], say=say, on_row=save, resume=previous,
                          metrics_url=service["metrics_url"], verify_s=verify_seconds(args))
    save(result)
    code = _emit(args, result.summary(), lambda: format_tune(result))
    if result.interrupted:
        if out is not None:
            say(f"go on with the same command and --resume {out} (the configurations in {out / CHECKPOINT} are kept)")
        return Exit.INTERRUPTED
    if result.error or not result.rows or all(r.error for r in result.rows):
        return Exit.NOTHING
    return code if result.target_met else Exit.TARGET_MISSED


def started_service(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The service started per configuration (``tune``, ``investigate --cmd``): its command line, space, URL,
    ready check, metrics URL and API, from the flags and the ``--server`` recipe (a flag given wins)."""
    from tuning.experiments.tune import parse_space

    recipe = _recipe(args)
    space = parse_space(args.space) if args.space else (recipe.default_space() if recipe else parse_space([]))
    if recipe is not None:
        try:
            cmd = recipe.command_line(args.cmd if args.cmd is not None else _recipe_command(recipe), list(space))
        except ValueError as exc:
            raise UsageError(f"{command}: {exc}") from None
    elif args.cmd is None:
        raise UsageError(f"{command}: give --cmd 'your server --port {{port}} ...' (or --server NAME for a recipe)")
    else:
        cmd = args.cmd
    _check_not_shell(command, cmd)
    if "{port}" not in cmd:
        raise UsageError(f"{command} --cmd: put {{port}} where the server takes its port, e.g. "
                         "--cmd 'python app.py --port {port}'")
    missing = [n for n in space if "{" + n + "}" not in cmd]
    if missing:
        raise UsageError(f"{command} --cmd: no {{{missing[0]}}} in the command, so --space {missing[0]} would "
                         "change nothing")
    url = args.url or (recipe.url if recipe else None)
    if url is None:
        raise UsageError(f"{command} --cmd: give --url with {{port}}, e.g. --url http://127.0.0.1:{{port}}/embed")
    api = api_from_args(args, recipe)
    api.url(url.replace("{port}", "1"))  # a bad URL is named now, not per configuration
    ready = args.ready_url or (recipe.ready_url if recipe else None)
    return {"cmd": cmd, "space": space, "url": url, "api": api,
            "ready_url": ready,
            "metrics_url": args.metrics_url or (recipe.metrics_url if recipe else None)}


CMD_RULE = ("--cmd is not a shell (its words are run as they are): no VAR=value prefix, pipes, &&, redirections "
            "or $VAR; set a variable with env, e.g. --cmd 'env VAR={name} python app.py --port {port}'")
SHELL_WORDS = ("|", "||", "&&", ";", "&", ">", ">>", "<", "2>&1")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _check_not_shell(command: str, cmd: str) -> None:
    """What only a shell would do in ``--cmd`` (a VAR=value prefix, an operator), named before any server
    starts, with :data:`CMD_RULE` (a program that is not there is named where it is started)."""
    import shlex

    try:
        words = shlex.split(cmd)
    except ValueError as exc:
        raise UsageError(f"{command} --cmd {cmd!r}: {exc}; {CMD_RULE}") from None
    if not words:
        raise UsageError(f"{command} --cmd: empty; give your server's command line, e.g. 'python app.py --port {{port}}'")
    first = words[0]
    if ASSIGNMENT.match(first):
        raise UsageError(f"{command} --cmd: {first!r} reads as a shell variable assignment, but --cmd is not a "
                         f"shell; write it as --cmd {shlex.quote('env ' + cmd)}")
    operator = next((w for w in words if w in SHELL_WORDS), None)
    if operator is not None:
        raise UsageError(f"{command} --cmd: {operator!r} needs a shell (or --cmd \"sh -c '...'\"); {CMD_RULE}")


def tune_settings(args: argparse.Namespace) -> Any:
    """The engine's settings for a service: ``--quick``, ``--ready-timeout``, ``--strategy``, ``--concurrency``."""
    import dataclasses

    from tuning.experiments.tune import TuneSettings

    settings = TuneSettings.quick() if args.quick else TuneSettings()
    changes = {"startup_timeout_s": args.startup_timeout, "strategy": args.strategy,
               "concurrency": getattr(args, "concurrency", None)}
    return dataclasses.replace(settings, **{k: v for k, v in changes.items() if v is not None})


def cmd_investigate_service(args: argparse.Namespace) -> int:
    """``investigate --url`` (a running service) or ``--cmd`` (started per configuration): the engine, then
    the baseline and the winner watched under load, in summary.json and report.html."""
    from tuning.experiments.service import SUMMARY, investigate_service
    from tuning.experiments.tune import read_checkpoint
    from tuning.load.apis import request_bodies
    from tuning.present.service import write_service_files
    from tuning.present.tables import format_service

    _refuse(_given(args), ["--device", "--what-if", "--objective", "--model", "--error-budget", "--seed"],
            "they set up the embedded pipeline; investigate --url/--cmd measures your service as it is")
    settings = tune_settings(args)
    inputs = _inputs(args)
    recipe = _recipe(args)
    starts = args.cmd is not None or (args.url is None and recipe is not None and recipe.command is not None)
    if not starts and args.url is None:
        raise UsageError(f"investigate --server {args.server}: give --cmd (your server's command line, started per "
                         "configuration) or --url (a server that runs already)")
    if starts:
        service = started_service(args, "investigate")
        url, api, space = service["url"], service["api"], service["space"]
        cmd, ready, metrics = service["cmd"], service["ready_url"], service["metrics_url"]
        _refuse(_given(args), ["--pid"], "with --cmd the process is found from its port")
    else:
        api, url, cmd, ready = api_from_args(args, recipe), args.url, None, None
        _check_listening(api.url(url))
        metrics = args.metrics_url
        space = _space_or_none(args.space)
    formatter = getattr(args, "formatter", None)
    previous = read_checkpoint(args.resume, SUMMARY, "investigate") if args.resume is not None else None
    if previous is not None and not previous.get("service"):
        raise UsageError(f"--resume {args.resume}: that run investigated the embedded pipeline, not a service; "
                         "run it without --url/--cmd, or this one without --resume")
    out = args.out if args.resume is None or "--out" in _given(args) else args.resume
    say = (lambda line: None) if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    with sigterm_as_interrupt():
        inv = investigate_service(url, lambda a: request_bodies(a, inputs, formatter), api, args.target_p99_ms,
                                  settings, cmd=cmd, space=space, ready_url=ready, metrics_url=metrics, pid=args.pid,
                                  out=out, resume=previous, server=args.server, say=say, on_save=write_service_files,
                                  verify_s=verify_seconds(args))
    code = _emit(args, inv.summary(), lambda: format_service(inv))
    if inv.interrupted:
        if out is not None:
            say(f"go on with the same command and --resume {out}")
        return Exit.INTERRUPTED
    if inv.tune.error or not inv.tune.rows or all(r.error for r in inv.tune.rows):
        return Exit.NOTHING
    return code if inv.target_met else Exit.TARGET_MISSED


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While servers this command started are up, SIGTERM (``kill``, ``timeout``, a CI runner's stop) is read
    as Ctrl-C: the run stops its servers with their process groups and keeps what it measured, instead of
    dying with them left running."""
    import signal

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread (a test driving main()): nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _recipe(args: argparse.Namespace) -> Any:
    """The ``--server`` recipe (None without one; a usage error names the known ones)."""
    if not args.server:
        return None
    from tuning.load.servers import recipe

    try:
        return recipe(args.server)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _recipe_command(recipe: Any) -> str | None:
    """A recipe's own command line, run by this interpreter (the one that has its packages); its example script
    must be there (``examples/`` comes with a checkout, not with the installed package)."""
    import shlex

    if recipe.command is None or not recipe.command.startswith("python "):
        return recipe.command
    rest = recipe.command[len("python "):]
    script = shlex.split(rest)[0]
    if script.endswith(".py") and not Path(script).is_file():
        raise UsageError(f"--server {recipe.name} starts {script}, which is not here: run from a checkout of this "
                         f"project, or give --cmd 'python /path/to/{Path(script).name}'")
    return f"{shlex.quote(sys.executable)} {rest}"


def _space_or_none(items: Sequence[str] | None) -> dict[str, list[str]] | None:
    from tuning.experiments.tune import parse_space

    return parse_space(items) if items else None


def _add_service_flags(p: Any, command: str) -> None:
    """How to start (or reach) the user's service: shared by ``tune`` and ``investigate --cmd/--url``."""
    from tuning.experiments.defaults import VERIFY_S_FULL, VERIFY_S_QUICK
    from tuning.load.servers import RECIPES

    p.add_argument("--server", default=None, choices=list(RECIPES), metavar="NAME",
                   help=f"a server recipe ({', '.join(RECIPES)}): fills in the API, the URL, the ready check, the "
                        "metrics URL, the port flags and a default --space (docs/your-service.md)")
    p.add_argument("--cmd", default=None, help="the service's command line, with {port} (and {metrics_port}) and a "
                   "{name} per --space; with --server, its flags are appended for you. It is not a shell: no "
                   "VAR=value prefix, pipes or $VAR; set a variable with env VAR={name} python app.py ...")
    p.add_argument("--space", action="append", default=None, metavar="NAME=V1,V2",
                   help="a knob of the service and its values (repeatable; the first value is the baseline)")
    p.add_argument("--ready-url", default=None, help="GET this (with {port}) until 2xx before measuring "
                   "(default: the recipe's, else until a first request is ok)")
    p.add_argument("--ready-timeout", "--startup-timeout", dest="startup_timeout", type=_positive_float, default=None,
                   metavar="S",
                   help="seconds a configuration may take to become ready; answers that say it is still loading "
                        "(404, 503, refused connections) are waited through (default 180)")
    p.add_argument("--verify", type=_verify_value, default=None, metavar="SECONDS",
                   help="hold the claimed capacity open-loop this long before it is shipped, lower where it does "
                        f"not hold (default: {VERIFY_S_QUICK:.0f} with --quick, else {VERIFY_S_FULL:.0f}; 0: no hold)")
    p.add_argument("--strategy", choices=("grid", "coordinate"), default=None,
                   help="how the space is explored: every configuration (grid, the default up to 16) or coordinate "
                        "descent from the first values (the default beyond)")
    if command == "tune":
        p.add_argument("--url", default=None, help="the endpoint, with {port}, e.g. http://127.0.0.1:{port}/predict "
                       "(default: the recipe's)")
        _add_metrics_flag(p)


def _add_target_flag(p: Any, what: str) -> None:
    """``--target-p99-ms``: one default for every command (DEFAULT_TARGET_P99_MS), so that two commands run
    without it judge against the same line."""
    from tuning.experiments.defaults import DEFAULT_TARGET_P99_MS

    p.add_argument("--target-p99-ms", type=_positive_float, default=DEFAULT_TARGET_P99_MS, metavar="MS", help=what)


def _add_tune_flags(p: argparse.ArgumentParser) -> None:
    service = p.add_argument_group("your service (started once per configuration)")
    _add_service_flags(service, "tune")
    engine = p.add_argument_group("target and engine")
    _add_target_flag(engine, "the p99 target of the capacity; exit 3 when no configuration meets it (or, held, "
                             "keeps it)")
    engine.add_argument("--quick", action="store_true", help="short windows and fewer pairs (the same design, "
                        "docs/deciding.md)")
    _add_data_flags(p.add_argument_group("requests"))
    _add_api_flags(p.add_argument_group("the service's API"))
    output = p.add_argument_group("output")
    output.add_argument("--out", type=Path, default=None, help="write tune.json and tune.html (the table and the "
                        "charts) here, rewritten after every configuration")
    output.add_argument("--resume", type=Path, default=None, metavar="DIR",
                        help="go on from an earlier run's DIR/tune.json (same --cmd, --space, --url, API, target, "
                             "--quick and requests): its configurations are kept, the rest measured, and those that "
                             "ended in an error there (the server never came up, or crashed) measured again; writes "
                             "there unless --out is given")
    _add_json_flag(output, "print only the JSON summary")


def _add_investigate_flags(p: argparse.ArgumentParser) -> None:
    from tuning.experiments.defaults import DEFAULT_OUT, OBJECTIVES

    what = p.add_argument_group("what to investigate (default: the embedded pipeline on the shipped requests)")
    _add_data_flags(what)
    _add_model_flags(what)
    what.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "sim"],
                      help="auto: CUDA when present, else the CPU (plus the what-if on the simulated device); "
                           "sim: the simulated device only")
    what.add_argument("--what-if", default="h200-sxm-estimate", metavar="PROFILE",
                      help=f"simulated device profile for the what-if section: {_profile_choices()}; none: skip")
    engine = p.add_argument_group("target and engine")
    _add_target_flag(engine, "p99 latency target: a configuration's capacity is the highest rate that meets it; "
                             "exit 3 when no configuration meets it (or, held, keeps it)")
    engine.add_argument("--quick", action="store_true", help="the same design with fewer windows: a 16-run screen, "
                        "up to 8 confirmation pairs at a 10%% minimum effect, shorter target windows")
    engine.add_argument("--objective", default=None, choices=list(OBJECTIVES),
                        help="target (default): capacity at the p99 target, open loop; qps: closed-loop throughput "
                             "(batch jobs)")
    engine.add_argument("--error-budget", type=_share, default=None, metavar="SHARE",
                        help="the share of failed requests a passing rate may have (default 0.001: 0.1%%)")
    engine.add_argument("--concurrency", type=_positive_int, default=None,
                        help="the closed loop's clients (the throughput windows); default 16")
    engine.add_argument("--seed", type=int, default=None, help="the open loop's arrival seed (default 0)")
    engine.add_argument("--compile-on-cpu", action="store_true",
                        help="screen torch.compile on a CPU too (off by default: it costs tens of seconds a shape)")
    service = p.add_argument_group("your service (instead of the embedded pipeline: docs/your-service.md)")
    service.add_argument("--url", default=None, help="a running service at this endpoint (its capacity at the "
                         "target, the client's levers, a diagnosis), or with --cmd the endpoint with {port}")
    _add_service_flags(service, "investigate")
    service.add_argument("--pid", type=_positive_int, default=None, help="--url: the service's process, for "
                         "per-thread CPU and memory (default: the process listening on the URL's port, when it is "
                         "on this machine)")
    _add_metrics_flag(service)
    _add_api_flags(p.add_argument_group("the service's API"))
    output = p.add_argument_group("output")
    output.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help="output directory (report.html, "
                        "experiments.csv, summary.json, environment.json), rewritten after every window")
    output.add_argument("--resume", type=Path, default=None, metavar="DIR",
                        help="go on from an interrupted run in DIR: its logged windows are replayed (same settings)")
    _add_json_flag(output, "print only the final JSON summary (no progress)")


def _profile_choices() -> str:
    """The shipped device profiles, read from their files (so a new profile is listed without touching this)."""
    from tuning.base.assets import shipped_profiles

    return f"a shipped name ({', '.join(shipped_profiles())}) or a JSON path from `python -m tuning calibrate`"


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: give a share such as 0.001 (0.1%)") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a share in [0, 1): 0.001 is 0.1%")
    return value


def cmd_knobs(args: argparse.Namespace) -> int:
    from tuning.knobs import Knobs, knob_specs

    where = {"offline": "the offline replay only", "served": "the served path only (server, batcher, load)",
             "both": "the offline replay and the served path"}
    values = {"default": Knobs().as_dict(), **{f"preset {name}": preset(name).as_dict() for name in PRESETS}}
    rows = [{"knob": s.name, "role": s.role, "allowed": s.describe(),
             **{column: v.get(s.name, s.default) for column, v in values.items()}, "help": s.help}
            for s in knob_specs().values()]
    if args.json:
        _print_json(rows, result=False)
        return Exit.OK
    for r in rows:
        presets = ", ".join(f"{name} {_short(r[f'preset {name}'])}" for name in PRESETS)
        print(f"{r['knob']} = {_short(r['default'])}   ({presets})\n    applies: {r['role']} ({where[r['role']]}); "
              f"allowed: {r['allowed']}\n    {r['help']}")
    print("\nchange one with --set KNOB=VALUE (repeatable), start from --preset NAME")
    return Exit.OK


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    _add_knob_flags(p.add_argument_group("knobs"), "run")
    _add_data_flags(p.add_argument_group("requests"))
    _add_model_flags(p.add_argument_group("your model"))
    _add_json_flag(p.add_argument_group("output"))


def _add_profile_flags(p: argparse.ArgumentParser) -> None:
    _add_run_flags(p)
    sampling = p.add_argument_group("profiler")
    sampling.add_argument("--interval", type=_interval, default=0.5, help="sampling interval in seconds (>= 0.1)")


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    _add_knob_flags(p.add_argument_group("knobs"), "serve")
    _add_model_flags(p.add_argument_group("your model"))
    server = p.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    server.add_argument("--port", type=_port, default=8000, help="port (0: any free port)")
    server.add_argument("--backlog", type=_positive_int, default=4096,
                        help="listen backlog: new connections the kernel queues before they are accepted")
    server.add_argument("--max-connections", type=_positive_int, default=None,
                        help="open connections the front serves (default 1024, or the open-file limit less 64 where "
                             "lower); a request on one past it gets 503 when its headers arrive (an overload past "
                             "the front's own ceiling is shed here, before the server's queue)")
    server.add_argument("--duration", type=_positive_float, default=None, help="stop after S seconds")
    _add_json_flag(p.add_argument_group("output"), "print a JSON summary on stdout when it stops (the talk goes to "
                   "stderr)")


def _add_loadtest_flags(p: argparse.ArgumentParser) -> None:
    from tuning.experiments.defaults import CLOSED_LOOP_CLIENTS, DEFAULT_TARGET_P99_MS, OPEN_LOOP_IN_FLIGHT

    shape = p.add_argument_group("load shape")
    shape.add_argument("--concurrency", type=_positive_int, default=CLOSED_LOOP_CLIENTS,
                       help=f"closed loop: clients, each sending when its last answer came; open loop (--rate): the "
                            f"most requests in flight on the client, {OPEN_LOOP_IN_FLIGHT} unless given, as in the "
                            "engine's windows (a lower cap holds a batching server's batches at it)")
    shape.add_argument("--requests", type=_positive_int, default=None, help="measured requests")
    shape.add_argument("--duration", type=_positive_float, default=None, help="measured seconds")
    shape.add_argument("--rate", type=_positive_float, default=None, help="open loop: Poisson arrivals per second")
    shape.add_argument("--target-p99-ms", type=_positive_float, default=None, nargs="?",
                       const=DEFAULT_TARGET_P99_MS,
                       help=f"hold --rate for --duration and judge it against this p99 target (alone: "
                            f"{DEFAULT_TARGET_P99_MS:.0f}, the default target everywhere): pass, fail or "
                            "indeterminate, the share over it with its bounds, the p99 with its interval (bursts "
                            "counted), the client's lag (the check a claimed capacity is held to)")
    shape.add_argument("--warmup", type=_count, default=16, help="warm-up requests excluded from the figures")
    shape.add_argument("--warmup-s", type=_nonneg_seconds, default=None,
                       help="warm-up seconds excluded from the figures (our engine: besides --warmup; locust: "
                            "default 2)")
    target = p.add_argument_group("target service and API (default: this package's server, in this process)")
    target.add_argument("--url", default=None, help="drive an HTTP endpoint instead, e.g. "
                        "http://127.0.0.1:8000/embed")
    _add_api_flags(target)
    _add_metrics_flag(target)
    local = p.add_argument_group("the in-process server (without --url)")
    _add_knob_flags(local, "loadtest")
    _add_model_flags(local)
    local.add_argument("--profile", action="store_true",
                       help="run the load under the recorder and add the diagnosis")
    _add_data_flags(p.add_argument_group("requests"))
    engine = p.add_argument_group("load generator")
    engine.add_argument("--engine", choices=["tuning", "locust"], default="tuning",
                        help="ours (an asyncio keep-alive client for --url) or locust (headless master + "
                             "--locust-workers processes; closed loop, needs --duration)")
    engine.add_argument("--client-procs", type=_positive_int, default=1,
                        help="our engine with --url: load-client processes (one asyncio loop tops out near one core; "
                             "give one per core the client may use), their outcomes merged exactly")
    engine.add_argument("--locust-workers", "--workers", dest="locust_workers", type=_positive_int, default=None,
                        metavar="N", help="--engine locust: local worker processes (default 1); --workers is the "
                                          "old name, still accepted with a note (it read like the knob num_workers, "
                                          "the DataLoader's workers)")
    engine.add_argument("--remote-workers", type=_count, default=0,
                        help="--engine locust: workers to wait for from other machines (run there: locust -f "
                             "tuning/load/locustfile.py --worker --master-host THIS_HOST)")
    engine.add_argument("--master-host", default="127.0.0.1",
                        help="--engine locust: address the master binds (loopback unless remote workers join)")
    _add_json_flag(p.add_argument_group("output"))


def _add_sweep_flags(p: argparse.ArgumentParser) -> None:
    what = p.add_argument_group("what to sweep")
    what.add_argument("variable", choices=["batch", "concurrency", "wait"], help="what to sweep")
    what.add_argument("--sizes", type=_int_list, default=None, help="batch: batch sizes, e.g. 1,2,4,8,16,32")
    what.add_argument("--length", type=_length, default=64, help="batch: tokens per input")
    what.add_argument("--repeats", type=_positive_int, default=5, help="batch: timed repeats per batch size")
    what.add_argument("--values", type=_float_list, default=None, help="concurrency or wait: the clients or "
                      "max_wait_ms values")
    what.add_argument("--requests", type=_positive_int, default=200, help="concurrency or wait: requests per point")
    what.add_argument("--concurrency", type=_positive_int, default=32, help="wait: clients in flight")
    local = p.add_argument_group("the in-process model and server (without --url)")
    _add_knob_flags(local, "sweep")
    _add_model_flags(local)
    _add_data_flags(p.add_argument_group("requests (concurrency and wait)"))
    target = p.add_argument_group("a running service (sweep concurrency only)")
    target.add_argument("--url", default=None, help="sweep concurrency against a running service at this endpoint "
                        "(its request schema: --api / --body)")
    _add_api_flags(target)
    _add_json_flag(p.add_argument_group("output"))


def _add_plan_flags(p: argparse.ArgumentParser) -> None:
    plan = p.add_argument_group("plan")
    plan.add_argument("--k", type=_positive_int, default=4, help="number of bucket lengths (shapes)")
    _add_knob_flags(p.add_argument_group("knobs (batch_size, max_length, bucket_window are simulated)"), "plan")
    _add_data_flags(p.add_argument_group("requests"))
    _add_json_flag(p.add_argument_group("output"))


def _add_precision_flags(p: argparse.ArgumentParser) -> None:
    _add_knob_flags(p.add_argument_group("knobs"), "precision")
    _add_data_flags(p.add_argument_group("texts"))
    _add_json_flag(p.add_argument_group("output"))


def _add_watch_flags(p: argparse.ArgumentParser) -> None:
    what = p.add_argument_group("what to watch")
    what.add_argument("--pid", type=_positive_int, default=None,
                      help="process id of the running service (default with --url: the process listening on its "
                           "port when the host is this machine; none for a remote or containerized one)")
    what.add_argument("--duration", type=_positive_float, default=10.0,
                      help="seconds to watch (with --url: measured seconds of load)")
    what.add_argument("--interval", type=_interval, default=0.5, help="sampling interval in seconds (>= 0.1)")
    load = p.add_argument_group("load while watching")
    load.add_argument("--url", default=None, help="drive load at this endpoint while watching, e.g. "
                      "http://127.0.0.1:8000/embed (POST JSON {\"text\": ...} or a record)")
    load.add_argument("--concurrency", type=_positive_int, default=None, help="clients in flight with --url "
                      "(default 8)")
    _add_metrics_flag(load)
    _add_api_flags(p.add_argument_group("the service's API"))
    _add_data_flags(p.add_argument_group("requests"))
    _add_json_flag(p.add_argument_group("output"), "print the tables as JSON frames and the diagnosis")


def _add_calibrate_flags(p: argparse.ArgumentParser) -> None:
    fit = p.add_argument_group("fit")
    fit.add_argument("--from", dest="sources", action="append", required=True, type=Path, metavar="SWEEP.json",
                     help="`sweep batch --json` output (repeat for more lengths, dtypes and graph modes)")
    fit.add_argument("--base", default=None, help="profile whose memory, copy and power figures are kept "
                     "(default: h200-sxm-estimate on CUDA; this machine on a CPU)")
    output = p.add_argument_group("output")
    output.add_argument("-o", "--out", type=Path, required=True, help="where to write the device profile JSON")
    output.add_argument("--name", default=None, help="profile name (default: the output file's stem)")
    _add_json_flag(output, "print the fitted profile as JSON")


def _add_knobs_flags(p: argparse.ArgumentParser) -> None:
    _add_json_flag(p.add_argument_group("output"), "print the knobs as JSON")


class Command(NamedTuple):
    """A subcommand, declared in one place: what runs, its one-line help, its flags and its examples
    (each a command line and what it does; tests/test_cli_help.py parses every one, so they cannot rot)."""

    handler: Callable[[argparse.Namespace], int]
    help: str
    add_flags: Callable[[argparse.ArgumentParser], None]
    examples: tuple[tuple[str, str], ...]


COMMANDS: dict[str, Command] = {
    "investigate": Command(
        cmd_investigate, "the main job: baseline under load, the experiment engine (screen, confirm, target check: "
                         "docs/deciding.md), what-if, HTML report", _add_investigate_flags,
        (("python -m tuning investigate --quick", "the demo: the embedded pipeline on the shipped requests"),
         ("python -m tuning investigate --url http://127.0.0.1:8080/embed --api tei --quick",
          "a service that runs already (here text-embeddings-inference): its capacity, levers and a diagnosis"),
         ('python -m tuning investigate --server triton --cmd "$HOME/.venvs/pytriton/bin/python '
          'examples/pytriton_server.py" --quick',
          "a server started once per configuration of its own knobs, here PyTriton from its own environment "
          "(docs/your-service.md)"))),
    "run": Command(
        cmd_run, "replay the records through the offline pipeline and print throughput and the stage ledger",
        _add_run_flags,
        (("python -m tuning run --limit 200", "the shipped requests, baseline knobs"),
         ("python -m tuning run --preset tuned --set batch_size=32 --limit 500", "one change against tuned"),
         ("python -m tuning run --data reviews.csv --text-column body", "your own texts, from a CSV column"))),
    "tune": Command(
        cmd_tune, "a service's own knobs: start it from --cmd per configuration, decide with the experiment engine, "
                  "print the command line to ship", _add_tune_flags,
        (("python -m tuning tune --server tuning --quick", "this package's server over its recipe's default space"),
         ('python -m tuning tune --cmd "python app.py --port {port} --max-batch {max_batch}" '
          '--url "http://127.0.0.1:{port}/embed" --space max_batch=1,8,32 --out tune-run',
          "your server: {port} and one {name} per --space knob; tune.html in tune-run/"))),
    "profile": Command(
        cmd_profile, "run the offline pipeline under every profiler and print the diagnosis", _add_profile_flags,
        (("python -m tuning profile --limit 300", "where the baseline spends its time"),
         ("python -m tuning profile --preset tuned --interval 0.2", "the tuned knobs, sampled more often"))),
    "serve": Command(
        cmd_serve, "serve POST /embed, GET /healthz and GET /metrics over HTTP (loopback by default)",
        _add_serve_flags,
        (("python -m tuning serve --port 8000", "the tuned knobs until Ctrl-C"),
         ("python -m tuning serve --port 0 --set batch_size=8 --set max_wait_ms=5 --duration 60",
          "any free port, two knobs changed, for a minute"))),
    "loadtest": Command(
        cmd_loadtest_any, "load-test the in-process server (or --url) at fixed concurrency or rate; --engine locust "
                          "for locust with --locust-workers N processes", _add_loadtest_flags,
        (("python -m tuning loadtest --requests 500 --concurrency 16", "the in-process server, closed loop"),
         ("python -m tuning loadtest --url http://127.0.0.1:8000/embed --rate 90 --duration 180 --target-p99-ms 300",
          "a running server, open loop at 90 requests/s for 3 minutes, judged against a 300 ms p99 target"),
         ("python -m tuning loadtest --url http://127.0.0.1:8080/embed --api tei --engine locust "
          "--locust-workers 2 --duration 30", "text-embeddings-inference, driven by locust"))),
    "sweep": Command(
        cmd_sweep, "sweep one variable: batch size (model, fixed shapes), concurrency or wait (server)",
        _add_sweep_flags,
        (("python -m tuning sweep batch --sizes 1,4,16,64 --length 128", "the model's per-sample cost by batch"),
         ("python -m tuning sweep wait --values 0,5,20 --concurrency 16", "the server's batch wait, max_wait_ms"),
         ("python -m tuning sweep concurrency --url http://127.0.0.1:8080/embed --api tei --values 1,8,32",
          "a running service's throughput and latency by clients in flight"))),
    "plan": Command(
        cmd_plan, "choose k bucket lengths from the token-length histogram; padding waste per strategy",
        _add_plan_flags,
        (("python -m tuning plan --k 4", "four bucket lengths for the shipped requests"),
         ("python -m tuning plan --data reviews.csv --text-column body --set max_length=512 --k 6",
          "your texts, up to 512 tokens, six shapes"))),
    "precision": Command(
        cmd_precision, "accuracy of bf16/fp16 embeddings against fp32 (min and mean cosine)", _add_precision_flags,
        (("python -m tuning precision --limit 200", "the shipped texts"),
         ("python -m tuning precision --data questions.txt --json", "your texts, one a line, as JSON"))),
    "watch": Command(
        cmd_watch, "watch a running service from outside (per-thread CPU, memory, GPU), optionally under load at its "
                   "URL, with a diagnosis from what can be seen", _add_watch_flags,
        (("python -m tuning watch --pid 12345 --duration 30", "a local process as it is, for 30 s"),
         ("python -m tuning watch --url http://127.0.0.1:8080/embed --api tei --duration 20",
          "under load at its URL (its process found from the port when it is local)"))),
    "calibrate": Command(
        cmd_calibrate, "fit a simulated-device profile from batch sweeps measured on a real device",
        _add_calibrate_flags,
        (("python -m tuning calibrate --from sweep-64.json --from sweep-128.json -o my-gpu.json",
          "from `python -m tuning sweep batch --length 64 --json > sweep-64.json` (and 128) run on the device"),
         ("python -m tuning calibrate --from sweep-bf16.json --base h100-sxm-estimate --name my-h100 -o my-h100.json",
          "keep a shipped profile's memory, copy and power figures"))),
    "knobs": Command(
        cmd_knobs, "list every knob with its help, its default and each preset's value", _add_knobs_flags,
        (("python -m tuning knobs", "every knob, its default and each preset's value"),
         ("python -m tuning knobs --json", "the same as JSON"))),
}

TOP_EXAMPLES = (*COMMANDS["investigate"].examples[:2], COMMANDS["knobs"].examples[0])


def _examples(examples: Sequence[tuple[str, str]]) -> str:
    return "examples:\n" + "\n".join(f"  {line}\n      {what}" for line, what in examples)


TOP_EPILOG = "\n\n".join([_examples(TOP_EXAMPLES) + "\n  (each command's --help: its flags, grouped, and its own "
                                                     "examples)", TERMS, EXIT_CODES])


def build_parser() -> argparse.ArgumentParser:
    """The CLI's parser: each command's flags, grouped, and its examples come from COMMANDS; the terms and the
    exit codes are said once, on the top-level help."""
    parser = _Parser(prog="python -m tuning", description="Tuning workbook for online inference services.",
                     formatter_class=_HelpFormatter,
                     epilog=TOP_EPILOG)
    from tuning import __version__

    parser.add_argument("--version", action="version", version=f"tuning {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help, formatter_class=_HelpFormatter,
                           epilog=_examples(command.examples) + "\n\nterms and exit codes: python -m tuning --help")
        p.add_argument("--verbose", action="store_true",
                       help="show every warning with its source, the profiler's own log lines, and tracebacks")
        command.add_flags(p)
    return parser


def _check_data_path(path: Path) -> None:
    """``--data`` names a readable file (a directory or a missing path is a usage error)."""
    if path.is_dir():
        raise UsageError(f"--data {str(path)!r} is a directory; pass a file in it, e.g. --data {path}/requests.jsonl")
    if not path.is_file():
        raise UsageError(f"--data {str(path)!r}: no such file; pass a JSONL, CSV/TSV, Parquet or text file")


def _given(args: argparse.Namespace) -> set[str]:
    """The long options written on the command line (so a flag that does not apply can be refused)."""
    return {a.split("=", 1)[0] for a in getattr(args, "_argv", []) if a.startswith("--")}


def _refuse(given: set[str], flags: Sequence[str], why: str) -> None:
    used = [f for f in flags if f in given]
    if used:
        raise UsageError(f"{' and '.join(used)} {'does' if len(used) == 1 else 'do'} not apply: {why}")


def _check_applies(args: argparse.Namespace) -> None:
    """Refuse flags the command would silently ignore, with the reason."""
    given = _given(args)
    if args.command == "sweep" and args.variable == "batch":
        _refuse(given, ["--values", "--requests", "--concurrency", "--data", "--limit"],
                "sweep batch times the model on random tokens at --sizes and --length; they go with "
                "sweep concurrency / sweep wait")
    elif args.command == "sweep":
        _refuse(given, ["--sizes", "--length", "--repeats"], "they go with sweep batch")
        if args.url:
            _refuse(given, ["--set", "--preset", "--model", "--formatter"],
                    "with --url the server runs elsewhere with its own knobs; set them where it runs")
        if args.variable == "concurrency":
            _refuse(given, ["--concurrency"], "sweep concurrency sweeps it: give the values with --values 1,8,32")
            if args.values and any(v != int(v) or v < 1 for v in args.values):
                raise UsageError(f"sweep concurrency --values {','.join(f'{v:g}' for v in args.values)}: "
                                 "concurrency is a whole number of clients >= 1, e.g. --values 1,8,32")
    if args.command == "loadtest" and args.url:
        _refuse(given, ["--set", "--preset", "--model", "--formatter"],
                "with --url the server runs elsewhere with its own knobs; set them where it runs "
                "(python -m tuning serve --set ...)")
    if args.command == "loadtest" and not args.url:
        _refuse(given, ["--client-procs"], "the in-process server is driven from this process; --client-procs "
                "spreads the load of --url over processes")
    if args.command == "loadtest" and getattr(args, "engine", None) == "locust":
        _refuse(given, ["--client-procs"], "locust spreads its own load: --locust-workers N")


def _check_inputs(args: argparse.Namespace) -> None:
    """A run on data without one valid request would measure nothing: say so now (exit 1), naming the first
    reason and the formats accepted."""
    from tuning.cli import guard as cliguard
    from tuning.inputs.readers import parse_line, read_inputs
    from tuning.inputs.records import RecordError

    if getattr(args, "data", None) is None or (args.command == "watch" and not args.url):
        return
    if args.command == "sweep" and args.variable == "batch":
        return
    items = read_inputs(args.data, args.limit, **_data_kwargs(args))
    if not items:
        raise cliguard.NothingAchieved(f"--data {str(args.data)!r} has no requests (an empty file); "
                                       f"{cliguard.DATA_FORMATS}")
    first = None
    for n, raw in items:
        item = parse_line(raw, n, args.text_field) if isinstance(raw, bytes) else raw
        if isinstance(item, RecordError):
            first = first or f"line {item.line}: {item.reason}"
        elif isinstance(item, str) and not item.strip():
            first = first or f"line {n}: empty text"
        else:
            return
    raise cliguard.NothingAchieved(f"--data {str(args.data)!r}: none of its {len(items)} lines is a valid request "
                                   f"({first}); {cliguard.DATA_FORMATS}")


def _check_listening(url: str, timeout_s: float = 5.0) -> None:
    """A running service (``--url``) is reached before anything is measured or written: a dead endpoint is one
    line and exit 1, not a run of errors and a report of nothing."""
    import socket
    from urllib.parse import urlsplit

    from tuning.cli import guard as cliguard

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return
    except ConnectionRefusedError:
        why = "nothing listens there"
    except socket.timeout:
        why = f"no answer within {timeout_s:.0f} s"
    except OSError as exc:
        why = f"cannot reach {parts.hostname}:{port} ({exc.strerror or exc})"
    raise cliguard.NothingAchieved(f"no answer from {url}: {why}; start your service first, or check the URL")


def _nothing_done(ok: int, submitted: int, reasons: list[dict[str, Any]], url: str | None = None) -> None:
    """Exit 1 (after the table) when not one request succeeded."""
    from tuning.cli import guard as cliguard

    if ok or not submitted:
        return
    reason = reasons[0]["reason"] if reasons else "unknown"
    if url and ("connect" in reason.lower() or "refused" in reason.lower()):
        raise cliguard.NothingAchieved(f"no answer from {url}: nothing listens there (start one with "
                                       "`python -m tuning serve --port 8000`, or check the URL)")
    raise cliguard.NothingAchieved(f"none of the {submitted} requests succeeded (first reason: {reason})")


def _os_error(args: argparse.Namespace | None, exc: OSError) -> str:
    import errno

    port = getattr(args, "port", None)
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} is in use; pass --port 0 (any free port) or another port"
    if exc.errno == errno.EACCES and port is not None:
        return f"port {port} needs privileges to bind; pass a port above 1023, or --port 0"
    if exc.errno in (errno.EADDRNOTAVAIL, socket_gaierror_errno()) and port is not None:
        return f"cannot bind --host {args.host!r}: not an address of this machine; use 127.0.0.1 or 0.0.0.0"
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def socket_gaierror_errno() -> int:
    import socket

    return socket.EAI_NONAME


def _interrupted(args: argparse.Namespace | None, exc: KeyboardInterrupt) -> int:
    """Ctrl-C: one line saying how far it got, the partial table (or JSON), exit 130; no traceback."""
    import signal


    with contextlib.suppress(ValueError):  # a second Ctrl-C while printing is ignored
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    partial = getattr(exc, "partial", None)
    as_json = bool(getattr(args, "json", False))
    line, summary, render = "interrupted before anything was measured", {"interrupted": True}, None
    try:
        line, summary, render = _partial_view(args, partial) if partial is not None else (line, summary, None)
    except Exception:  # the partial view is a courtesy: never a traceback on the way out
        pass
    print(line, file=sys.stderr, flush=True)
    if as_json:
        _print_json({**summary, "interrupted": True})
    elif render is not None:
        with contextlib.suppress(Exception):
            print(render(), flush=True)
    return Exit.INTERRUPTED


def _partial_view(args: argparse.Namespace, partial: Any) -> tuple[str, dict[str, Any], Callable[[], str] | None]:
    """(the line, the JSON summary, the rendering) of what an interrupted command measured."""
    from tuning.present.tables import format_load, format_run, table

    if hasattr(partial, "requests") and hasattr(partial, "batches"):  # an offline run
        s = partial.summary()
        return f"interrupted after {s['requests']} requests", s, lambda: format_run(partial)
    if hasattr(partial, "timings"):  # a load test
        s = partial.summary()
        s["target"] = getattr(args, "url", None) or "in-process"
        return f"interrupted after {s['submitted']} requests", s, lambda: format_load(s)
    if hasattr(partial, "rows") and hasattr(partial, "knee"):  # sweep batch
        s = partial.summary()
        sizes = [p["batch_size"] for p in s["points"]]
        return (f"interrupted after {len(sizes)} sweep points (batch sizes {sizes})", s,
                lambda: table(s["points"], ["batch_size", "status", "per_batch_ms", "per_sample_ms", "texts_per_s"]))
    rows = partial.astype(object).where(partial.notna(), None).to_dict("records")  # sweep concurrency / wait
    return (f"interrupted after {len(rows)} sweep points", {"points": rows},
            lambda: partial.round(2).to_string(index=False) if rows else "")


def main(argv: Sequence[str] | None = None) -> int:
    from tuning.cli import guard as cliguard

    global _MACHINE
    parser = build_parser()
    args = None
    try:
        args = parser.parse_args(argv)
        args._argv = list(sys.argv[1:] if argv is None else argv)
        if not args.command:
            raise UsageError(f"{parser.prog}: choose a command: {', '.join(COMMANDS)} (see --help)")
        if getattr(args, "data", None) is not None:
            _check_data_path(args.data)
        verbose = getattr(args, "verbose", False)
        with cliguard.warning_policy(verbose), \
                (contextlib.nullcontext() if verbose else cliguard.filter_native_stderr()):
            _check_applies(args)
            _check_inputs(args)
            _MACHINE = MachineWatch()  # once the command line is known good: a usage error loads no torch
            _announce_knobs(args)
            return COMMANDS[args.command][0](args)
    except KeyboardInterrupt as exc:  # Ctrl-C: what was measured so far, then exit 130
        return _interrupted(args, exc)
    except cliguard.NothingAchieved as exc:
        print(f"error: {exc}", file=sys.stderr)
        return Exit.NOTHING
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return Exit.USAGE
    except (ValueError, TypeError) as exc:  # knob validation: names field, value and what is allowed
        print(f"error: {exc}", file=sys.stderr)
        return Exit.USAGE
    except (FileNotFoundError, ModuleNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return Exit.USAGE
    except OSError as exc:  # the environment, not the arguments: a port in use, a file that cannot be written
        print(f"error: {_os_error(args, exc)}", file=sys.stderr)
        return Exit.NOTHING
    except Exception as exc:  # nothing a user can cause should get here: one line, the traceback with --verbose
        if getattr(args, "verbose", False):
            raise
        first = (str(exc).splitlines() or [""])[0][:300]
        print(f"error: {type(exc).__name__}: {first} (an internal error: rerun with --verbose for the traceback "
              "and report it)", file=sys.stderr)
        return Exit.NOTHING
