"""A started service is every process it made (tuning/load/proctree.py), as ``tune`` starts and stops it:
stopped leader first, so that its own shutdown runs; its memory and its being gone counted over its workers in
process groups of their own (tests/apps/tree_service.py, shaped like Ray Serve)."""

import sys
import time
from pathlib import Path

import psutil

from tuning.experiments.tune import ServiceGroup
from tuning.load.proctree import StopGrace

APP = Path(__file__).parent / "apps" / "tree_service.py"
WORKERS = ("same-group", "own-group")


def _wait_for(what, timeout_s: float = 60.0):
    """Polls ``what()`` until it is true (the state the test waits on) or fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (found := what()):
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what.__doc__ or what}"
        time.sleep(0.02)
    return found


def _start(folder: Path, *flags: str) -> tuple[ServiceGroup, dict[str, int]]:
    group = ServiceGroup(f"{sys.executable} {APP} {folder} {' '.join(flags)}")
    _wait_for(lambda: (folder / "leader.ready").exists() or not group.alive())
    assert group.alive(), group.tail()
    return group, {name: int((folder / f"{name}.ready").read_text()) for name in WORKERS}


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_stop_signals_the_leader_alone_and_its_own_shutdown_stops_its_workers(tmp_path):
    group, workers = _start(tmp_path)
    group.stop()
    leader = group.proc.pid
    assert (tmp_path / "leader.cleaned").exists()  # its cleanup ran, undisturbed
    for name in WORKERS:  # each worker's SIGTERM came from the leader, none from the group signal
        assert int((tmp_path / f"{name}.term").read_text()) == leader, name
    assert group.stopped_by == ["SIGTERM to the leader"]
    assert group.gone() and not any(_running(pid) for pid in workers.values())


def test_memory_counts_the_worker_in_a_process_group_of_its_own(tmp_path):
    group, _ = _start(tmp_path, "--worker-mb", "120")
    try:
        assert group.tree.rss_bytes() >= 240 * 2**20  # both workers' ballast, whatever their groups
        _wait_for(lambda: group.peak_rss >= 240 * 2**20, timeout_s=60)  # the sampler's peak, as tune reports it
    finally:
        group.stop()


def test_a_worker_its_careless_leader_leaves_behind_is_not_gone_until_stopped(tmp_path):
    group, workers = _start(tmp_path, "--careless")
    me = psutil.Process().pid
    group.stop(StopGrace(leader_s=30, rest_s=0.5))  # its workers never exit by themselves: no wait is too short
    assert group.stopped_by == ["SIGTERM to the leader", "SIGTERM to its process group",
                                "SIGTERM to every process left"]
    assert int((tmp_path / "same-group.term").read_text()) == me  # the group signal reached it
    assert int((tmp_path / "own-group.term").read_text()) == me  # and the session's leftover, by its own pid
    assert group.gone() and not any(_running(pid) for pid in workers.values())


def test_gone_is_false_while_a_worker_in_its_own_group_outlives_the_leader(tmp_path):
    group, workers = _start(tmp_path, "--careless")
    try:
        group.proc.terminate()
        group.proc.wait(30)
        assert _running(workers["own-group"])
        assert not group.gone()  # the replica still runs: the service is not gone
    finally:
        group.stop(StopGrace(leader_s=30, rest_s=0.5))
    assert group.gone()


def test_workers_that_ignore_sigterm_get_sigkill(tmp_path):
    group, workers = _start(tmp_path, "--careless", "--stubborn")
    group.stop(StopGrace(leader_s=30, rest_s=0.5))
    assert group.stopped_by[-1] == "SIGKILL to every process left"
    assert group.gone() and not any(_running(pid) for pid in workers.values())


def _statuses(group: ServiceGroup) -> set[str]:
    return {p.status() for p in group.tree.members()}


def test_a_paused_service_is_stopped_in_every_process_and_runs_again_when_resumed(tmp_path):
    """tune keeps the confirmation's other arm warm beside the one measured; a server that polls while idle
    (LitServe's worker at batch_timeout 0 took most of a core) took the CPU from it. Paused, it keeps its memory
    and takes none."""
    group, workers = _start(tmp_path)
    try:
        group.pause()
        _wait_for(lambda: _statuses(group) == {psutil.STATUS_STOPPED})
        assert len(group.tree.members()) == 3  # the leader and both workers, whatever their groups
        group.resume()
        _wait_for(lambda: psutil.STATUS_STOPPED not in _statuses(group))
    finally:
        group.stop()


def test_a_paused_service_is_stopped_as_a_running_one_its_own_shutdown_included(tmp_path):
    group, workers = _start(tmp_path)
    group.pause()
    _wait_for(lambda: _statuses(group) == {psutil.STATUS_STOPPED})
    group.stop()
    assert (tmp_path / "leader.cleaned").exists() and group.stopped_by == ["SIGTERM to the leader"]
    assert group.gone() and not any(_running(pid) for pid in workers.values())
