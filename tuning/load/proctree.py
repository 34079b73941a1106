"""A started service as every process it made, and how to stop it so that its own shutdown runs.

A server started in a session of its own (``start_new_session=True``) is rarely one process, and rarely one
process group: Ray Serve's replica, proxy and controller each run in a group of their own, and PyTriton's model
runs in the parent script while ``tritonserver`` listens. :class:`ServiceTree` is the leader, its children
(recursively), the processes in its session, and any of those seen before that still run (a worker reparented
after its parent exited, or one that left the session): what the service's memory is summed over, and what
must be gone before the service is.

Stopping signals the leader alone first: an app stops its workers in its own order (Ray's ``serve.shutdown``
takes seconds), and SIGTERM to the whole group would kill its workers under it and stall its cleanup until the
SIGKILL. What outlives the leader gets SIGTERM by group, then whatever else is left, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class StopGrace:
    """Seconds each step of a stop waits for what it signalled to exit before the next step."""

    leader_s: float = 15.0  # the leader's own shutdown (it stops its workers)
    rest_s: float = 5.0  # what outlived the leader, after it exits and after each later signal


class ServiceTree:
    """The processes of the service whose leader is ``leader_pid`` (a session leader: its pid is its session's
    and its process group's id)."""

    def __init__(self, leader_pid: int):
        self.leader_pid = leader_pid
        self._seen: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()  # a memory sampler's thread and a stop may ask at once

    def members(self) -> list[psutil.Process]:
        """Every live process of the service now (zombies are dead: they only wait to be reaped)."""
        found: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            leader = psutil.Process(self.leader_pid)
            found[leader.pid] = leader
            found.update((p.pid, p) for p in leader.children(recursive=True))
        for proc in psutil.process_iter():
            with contextlib.suppress(OSError):
                if os.getsid(proc.pid) == self.leader_pid:
                    found.setdefault(proc.pid, proc)
        with self._lock:
            for pid, proc in self._seen.items():
                if pid not in found and proc.is_running():  # is_running: the same process, not a reused pid
                    found[pid] = proc
            self._seen.update(found)
        return [p for p in found.values() if _alive(p)]

    def rss_bytes(self) -> int:
        """Resident memory summed over the service's processes."""
        total = 0
        for proc in self.members():
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        return total

    def gone(self) -> bool:
        return not self.members()

    def pause(self) -> None:
        """SIGSTOP to its process group and every process of the service: it keeps its memory and its loaded
        model and takes no CPU (a server that polls while idle takes it from the one measured beside it)."""
        self._signal_group(signal.SIGSTOP)
        self._signal_members(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT to what :meth:`pause` stopped."""
        self._signal_group(signal.SIGCONT)
        self._signal_members(signal.SIGCONT)

    def stop(self, leader: subprocess.Popen | None = None, grace: StopGrace = StopGrace()) -> list[str]:
        """Stop the service: SIGTERM to the leader and wait for it; SIGTERM to its process group, then to every
        process left; SIGKILL to what still runs. ``leader``: the caller's handle on the leader process, waited on
        (reaped: it does not stay a zombie). Returns the steps that had to be taken, in order. A paused service
        is resumed first: a stopped process takes its SIGTERM only once it runs."""
        self.resume()
        steps = []
        if self._signal_leader(signal.SIGTERM):
            steps.append("SIGTERM to the leader")
            self._wait_leader(leader, grace.leader_s)
            self._wait_gone(grace.rest_s)
        for what, send in (("SIGTERM to its process group", self._signal_group),
                           ("SIGTERM to every process left", self._signal_members)):
            if self.gone():
                return steps
            send(signal.SIGTERM)
            steps.append(what)
            self._wait_gone(grace.rest_s)
        if not self.gone():
            self._signal_group(signal.SIGKILL)
            self._signal_members(signal.SIGKILL)
            steps.append("SIGKILL to every process left")
            self._wait_gone(grace.rest_s)
        self._wait_leader(leader, grace.rest_s)
        return steps

    def _signal_leader(self, sig: int) -> bool:
        try:
            os.kill(self.leader_pid, sig)
        except ProcessLookupError:
            return False
        return True

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.leader_pid, sig)

    def _signal_members(self, sig: int) -> None:
        for proc in self.members():
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)

    def _wait_leader(self, leader: subprocess.Popen | None, timeout_s: float) -> None:
        if leader is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                leader.wait(timeout_s)
        else:
            with contextlib.suppress(psutil.Error):
                psutil.Process(self.leader_pid).wait(timeout_s)

    def _wait_gone(self, timeout_s: float) -> None:
        """Until no process of the service runs, or ``timeout_s``: each live one waited on by psutil."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            live = self.members()
            if not live:
                return
            psutil.wait_procs(live, timeout=min(left, 0.5))


SERVICE_PARENTS = frozenset({"raylet"})  # programs not in Python that start a service's workers (Ray's replicas)
RUNNERS = ("honcho", "foreman", "overmind", "circusd", "supervisord", "jupyter", "ipykernel", "pytest", "pm2")
# Python programs that run several services or other work side by side: a service under one is not all of it


def service_root(pid: int) -> int:
    """The top of the service that ``pid`` (a process found listening on the service's port) belongs to: the
    port's process climbed while its parent is part of the same service, a Python program (the script that
    started it: ``serve run``, PyTriton's, gunicorn's master) or a :data:`SERVICE_PARENTS` one (the raylet
    under ``serve run``), and is neither one of :data:`RUNNERS` nor this process or one of its ancestors. A
    shell, a supervisor, an IDE or init ends the climb. A port is often held by one part of a service: Ray
    Serve's proxy (the replica is its sibling under the raylet), ``tritonserver`` under the PyTriton script
    where the model runs; the root's whole tree is the service."""
    mine = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        mine |= {p.pid for p in psutil.Process().parents()}
    root = pid
    with contextlib.suppress(psutil.Error):
        for parent in psutil.Process(pid).parents():
            if parent.pid <= 1 or parent.pid in mine or not _part_of_service(parent):
                break
            root = parent.pid
    return root


def _part_of_service(proc: psutil.Process) -> bool:
    try:
        name = proc.name()
        command = proc.cmdline()
    except psutil.Error:  # not ours to read: not ours to count either
        return False
    if name in SERVICE_PARENTS:
        return True
    program = os.path.basename(command[0]) if command else name
    if not (name.startswith("python") or program.startswith("python")):
        return False
    entry = command[2] if command[1:2] == ["-m"] and len(command) > 2 else (
        os.path.basename(command[1]) if len(command) > 1 and not command[1].startswith("-") else "")
    return not any(entry.startswith(r) for r in RUNNERS)  # the script or module it runs


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
