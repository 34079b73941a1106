"""A service shaped like Ray Serve's, for the tests of stopping a service and counting its processes: a leader
that starts a worker in its own process group (as gcs_server and raylet are) and one in a process group of its
own (as Ray's replica is), each holding ``--worker-mb`` of memory.

``python tree_service.py FOLDER [--careless] [--stubborn] [--worker-mb N]``. Each worker writes
``FOLDER/NAME.ready`` (its pid) once its memory is held, and on SIGTERM ``FOLDER/NAME.term`` (the pid that sent
it) and exits; ``--stubborn`` workers note each SIGTERM and go on (only SIGKILL stops them). On SIGTERM the
leader stops its workers itself and writes ``FOLDER/leader.cleaned`` (its cleanup ran), or with ``--careless``
exits at once and leaves them running. It writes ``FOLDER/leader.ready`` when both workers are ready."""

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def write(path: Path, text: str) -> None:
    """Whole or not at all: a reader waiting for the file never sees it half written."""
    part = path.with_suffix(".part")
    part.write_text(text)
    part.rename(path)


def worker(folder: Path, name: str, mb: int, stubborn: bool) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # taken below with the sender's pid
    ballast = b"x" * (mb * 2**20)  # written, so resident
    write(folder / f"{name}.ready", str(os.getpid()))
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM})
        write(folder / f"{name}.term", str(info.si_pid))
        if not stubborn:
            return
    del ballast


def leader(args: argparse.Namespace) -> None:
    folder = Path(args.folder)
    common = [sys.executable, __file__, str(folder), "--worker-mb", str(args.worker_mb)] + \
        (["--stubborn"] if args.stubborn else [])
    workers = [subprocess.Popen([*common, "--worker", "same-group"]),
               subprocess.Popen([*common, "--worker", "own-group"], process_group=0)]

    def on_term(signum, frame):
        if not args.careless:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait()
            write(folder / "leader.cleaned", "yes")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    while not all((folder / f"{n}.ready").exists() for n in ("same-group", "own-group")):
        time.sleep(0.01)
    write(folder / "leader.ready", str(os.getpid()))
    while True:
        signal.pause()


p = argparse.ArgumentParser()
p.add_argument("folder")
p.add_argument("--worker")
p.add_argument("--worker-mb", type=int, default=1)
p.add_argument("--careless", action="store_true")
p.add_argument("--stubborn", action="store_true")
args = p.parse_args()
if args.worker:
    worker(Path(args.folder), args.worker, args.worker_mb, args.stubborn)
else:
    leader(args)
