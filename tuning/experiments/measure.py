"""The real measurement behind the ladder and ``investigate``: an in-process server per configuration, the
load from a separate process.

Models are built once per model-side configuration (device, dtype, graph...) and shared by the servers that
need them. The load generator runs in a child process (started once, on first use) and
reaches the server over a pipe (:class:`tuning.load.generator.PipeTarget`): its threads and its GIL stay out
of the measured server, as in ``bench/serving.py``. The same requests go in the same order for every
configuration; each open-loop run draws its Poisson arrivals from the same seed.
"""

from __future__ import annotations

import math
import signal
import warnings
from typing import Any, Callable, Sequence

from tuning.experiments.defaults import OPEN_LOOP_IN_FLIGHT
from tuning.experiments.trial import Trial
from tuning.knobs import Knobs
from tuning.profile.steal import StealWatch


def _load_client(address: str, authkey: bytes) -> None:
    """The child's loop: one load test per message on the control connection against the server behind
    the data connection (both to ``address``)."""
    from multiprocessing.connection import Client

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it ends this process
    control, data = Client(address, authkey=authkey), Client(address, authkey=authkey)
    _exit_with_parent()
    inputs = control.recv()
    while (kw := control.recv()) is not None:
        reply = run_one(data, inputs, kw)
        try:
            control.send(reply)
        except Exception as exc:  # a result that cannot be sent: the step's error, not a dead load process
            control.send(("error", f"the load test's result could not be sent: {type(exc).__name__}: {exc}", reply[2]))


def run_one(data: Any, inputs: Any, kw: dict[str, Any]) -> tuple[str, Any, list[str]]:
    """One load test in the load process against the server behind ``data``: ``("ok", result, notes)`` or
    ``("error", what failed, notes)``; ``notes`` are the unexpected RuntimeWarnings it raised, failed or not
    (:func:`told` raises them on the caller's side)."""
    from tuning.load import generator

    kw = dict(kw)
    keep = kw.pop("keep_server", False)  # a server kept warm for the next window: its cool-down drains, not abandoned
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        quiet_expected()
        try:
            with generator.PipeTarget(data) as target:
                reply: tuple[str, Any] = ("ok", generator.run_load(target, inputs, busy_probe=target.busy,
                                                                    abandon=None if keep else target.abandon, **kw))
        except Exception as exc:  # the parent reports it as the step's error
            reply = ("error", f"{type(exc).__name__}: {exc}")
    return (*reply, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])


def told(reply: tuple) -> Any:
    """The load process's reply on the caller's side: its warnings raised here, then its error, else its result."""
    kind, payload, *notes = reply
    for note in (notes[0] if notes else []):
        warnings.warn(note, RuntimeWarning, stacklevel=3)
    if kind == "error":
        raise RuntimeError(f"load generator: {payload}")
    return payload


# a probe past the knee is expected to fall behind, and the client's loop to work hard there: the trial's late sends
# and the client's CPU say so. Any other warning of a load test (an abandon that failed, so the cool-down waited for
# its queue) is passed on
EXPECTED_LOAD_WARNINGS = ("open loop offered", "the load client's loop used")


def quiet_expected() -> None:
    """Inside a ``warnings.catch_warnings()``: ignore the load test's expected warnings only."""
    import re

    for text in EXPECTED_LOAD_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(text), category=RuntimeWarning)


def _exit_with_parent() -> None:
    """End this process when the parent goes (killed, crashed): a thread polls the parent's pid."""
    import os
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(3)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class LoadProcess:
    """A load generator in a child process, driving one in-process server at a time over a local socket.

    The child is a fresh interpreter (``python -c``), not a ``multiprocessing`` spawn: a spawn re-imports the
    caller's main script, which breaks any script without an ``if __name__ == "__main__"`` guard."""

    def __init__(self, inputs: Sequence[Any], start_timeout_s: float = 120.0):
        import os
        import subprocess
        import sys
        import tempfile
        from multiprocessing.connection import Listener

        authkey = os.urandom(16)
        self._dir = tempfile.mkdtemp(prefix="tuning-load-")
        address = os.path.join(self._dir, "socket")
        listener = Listener(address, family="AF_UNIX", authkey=authkey)
        code = (f"from tuning.experiments.measure import _load_client; "
                f"_load_client({address!r}, bytes.fromhex({authkey.hex()!r}))")
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        self.process = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.DEVNULL)
        try:
            listener._listener._socket.settimeout(start_timeout_s)  # noqa: SLF001 (no public timeout on accept)
            self.control = listener.accept()
            self.data = listener.accept()
        except OSError as exc:
            self.process.kill()
            raise RuntimeError(f"the load process did not connect within {start_timeout_s:.0f} s: {exc}") from exc
        finally:
            listener.close()
        self.control.send(list(inputs))

    def run(self, server: Any, **kw: Any) -> Any:
        """One :func:`tuning.load.generator.run_load` from the child against ``server``; the server's own
        figures (batches, device) are added here, where the server lives."""
        from tuning.load.generator import attach_server, serve_pipe

        if self.process.poll() is not None:
            raise RuntimeError(f"the load process exited (code {self.process.returncode})")
        done = serve_pipe(server, self.data)
        self.control.send(kw)
        limit = 4 * (kw.get("duration_s") or 0) + 4 * (kw.get("warmup_s") or 0) + 120
        if not self.control.poll(limit):  # a hung server or client: fail this run, not the whole session
            raise TimeoutError(f"the load test gave no result within {limit:.0f} s (the server stopped answering?)")
        reply = self.control.recv()
        done()
        return attach_server(told(reply), server)  # warnings raised in the load process are told here

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self, kill: bool = False) -> None:
        import shutil

        try:
            if self.alive() and not kill:
                self.control.send(None)
                self.process.wait(5)
        except Exception:
            pass
        if self.alive():
            self.process.kill()
            self.process.wait(5)
        shutil.rmtree(self._dir, ignore_errors=True)


class LoadMeasure:
    """``measure(knobs, *, rate=None, record=False) -> Trial``: closed loop at ``concurrency`` (``rate=None``)
    or Poisson arrivals at ``rate`` req/s (at most ``open_concurrency`` in flight on the client), measured for
    ``duration_s`` after ``warmup_s``, against an in-process server, from a separate load process
    (``separate_process=False``: the load in this process's threads, as before)."""

    def __init__(self, inputs: Sequence[Any], concurrency: int = 32, duration_s: float = 15.0,
                 warmup_s: float = 2.0, model: Any = None, on_start: Callable[[Knobs], None] | None = None,
                 seed: int = 0, open_concurrency: int = OPEN_LOOP_IN_FLIGHT, separate_process: bool = True,
                 tokenizer: Any = None, formatter: Any = None, min_outcomes: int = 0, max_window_s: float | None = None,
                 warmup_requests: int = 0):
        if not inputs:
            raise ValueError("no inputs to load-test with: the data file is empty")
        self.inputs = list(inputs)
        self.concurrency, self.duration_s, self.warmup_s = concurrency, duration_s, warmup_s
        self.model = model
        self.on_start = on_start
        self.seed, self.open_concurrency = seed, open_concurrency
        self.separate_process = separate_process
        self.min_outcomes, self.max_window_s, self.warmup_requests = min_outcomes, max_window_s, warmup_requests
        self.serve_kwargs = {k: v for k, v in (("tokenizer", tokenizer), ("formatter", formatter)) if v is not None}
        self._engines: dict[tuple, Any] = {}
        self._process: LoadProcess | None = None
        self._server: Any = None  # kept warm while the knobs are unchanged (docs/deciding.md)
        self._server_knobs: Knobs | None = None
        self.runs = 0

    @staticmethod
    def _engine_key(k: Knobs) -> tuple:
        key = (k.device, k.sim_profile, k.dtype, k.graph, k.torch_threads, k.pin_memory)
        if k.graph != "eager":  # compiled or captured shapes depend on batch and padding
            key += (k.batch_size, k.padding, k.buckets, k.max_length)
        return key

    def engine(self, knobs: Knobs) -> Any:
        from tuning.runtime.engine import Engine

        key = self._engine_key(knobs)
        if key not in self._engines:
            self._engines[key] = Engine(knobs, self.model)
        return self._engines[key]

    def _load(self, server: Any, keep: bool = False, **kw: Any) -> Any:
        from tuning.load.generator import run_load

        if not self.separate_process:
            with warnings.catch_warnings():
                quiet_expected()
                return run_load(server, self.inputs, abandon=None if keep else lambda: server.close(drain=False), **kw)
        kw["keep_server"] = keep
        if self._process is None or not self._process.alive():
            self._process = LoadProcess(self.inputs)
        try:
            return self._process.run(server, **kw)
        except BaseException as exc:
            # a broken exchange (Ctrl-C mid-run, a timeout) leaves the pipe unusable: end it now, start afresh
            self._process.close(kill=not isinstance(exc, RuntimeError))
            self._process = None
            raise

    def window_s(self, rate: float | None) -> float:
        """The measured window: ``duration_s``, stretched in the open loop to hold ``min_outcomes`` arrivals
        (at most ``max_window_s``): a p99 needs outcomes, not seconds."""
        if rate is None or not self.min_outcomes:
            return self.duration_s
        want = max(self.duration_s, self.min_outcomes / rate)
        return min(want, self.max_window_s) if self.max_window_s else want

    def warm_server(self, knobs: Knobs) -> Any:
        """The server of ``knobs``, kept across windows while the knobs are unchanged (its model, threads and
        caches warm; the engine asks for windows of one configuration in a row where it can); another
        configuration closes it first."""
        from tuning.online.serve import Server

        if self._server is not None and self._server_knobs == knobs:
            return self._server
        self.close_server()
        self._server = Server(knobs, engine=self.engine(knobs), **self.serve_kwargs).__enter__()
        self._server_knobs = knobs
        return self._server

    def close_server(self, drain: bool = True) -> None:
        """Close the kept server (``drain=False``: fail what it still queues, as after a broken window)."""
        if self._server is not None:
            server, self._server, self._server_knobs = self._server, None, None
            server.close(drain=drain)

    def __call__(self, knobs: Knobs, *, rate: float | None = None, record: bool = False,
                 seed: int | None = None, window_s: float | None = None) -> Trial:
        """One load test of ``knobs``: closed loop (``rate=None``) or Poisson arrivals at ``rate`` req/s drawn
        from ``seed`` (default: the measurement's own), for ``window_s`` (default: :meth:`window_s`);
        ``record`` runs the profilers, on a server of its own. Otherwise the server is kept warm for the next
        window of the same knobs (:meth:`warm_server`)."""
        from tuning.online.serve import Server

        if rate is not None and not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate={rate!r} must be a number > 0 (requests per second)")
        if window_s is not None and not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s={window_s!r} must be a number of seconds > 0")
        if self.on_start:
            self.on_start(knobs)
        self.runs += 1
        kw: dict[str, Any] = {"duration_s": window_s or self.window_s(rate), "warmup_s": self.warmup_s, "rate": rate,
                              "concurrency": self.concurrency if rate is None else self.open_concurrency,
                              "seed": self.seed if seed is None else seed,
                              # warm-up arrivals, but never more than 2 x warmup_s of them at this rate
                              "warmup_requests": (min(self.warmup_requests, math.ceil(rate * 2 * self.warmup_s))
                                                  if rate is not None else 0)}
        if not record:
            server = self.warm_server(knobs)
            try:
                with StealWatch() as steal:
                    result = self._load(server, keep=True, **kw)
            except BaseException:
                # a broken window (Ctrl-C, a timeout) leaves the server's state unknown: the next one starts afresh,
                # and its queue is failed, not waited for
                self.close_server(drain=False)
                raise
            trial = Trial.from_load(result)
        else:
            from tuning.profile import Recorder

            self.close_server()
            with Server(knobs, engine=self.engine(knobs), **self.serve_kwargs) as server, StealWatch() as steal:
                with warnings.catch_warnings():  # no NVML here: the report says so
                    warnings.filterwarnings("ignore", message="GPU sampling (off|stopped)", category=RuntimeWarning)
                    with Recorder() as recorder:
                        result = self._load(server, **kw)
                trial = Trial.from_load(result, recorder.join(result))
        # over the measured window only (the load process's perf_counter is the same monotonic clock)
        trial.steal_share = steal.share(getattr(result, "t_window_start", None), getattr(result, "t_end", None))
        return trial

    def close(self) -> None:
        """Close the kept server and end the load process (it also ends with this process)."""
        self.close_server()
        if self._process is not None:
            self._process.close()
            self._process = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
