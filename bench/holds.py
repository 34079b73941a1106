"""Holding a claimed capacity on a real server, for the bench scripts: the command line run as a user runs it
(``python -m tuning ... --json``), one configuration's server started from a command with ``{port}`` and waited
for, and open-loop holds of it judged by ``loadtest --target-p99-ms`` (``capacity.hold_check``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]


def cli(*argv: str, cwd: Path, timeout: float) -> tuple[int, dict, float]:
    """``python -m tuning ARGV --json`` as a user runs it: (exit code, its JSON, seconds)."""
    t0 = time.time()
    done = subprocess.run([sys.executable, "-m", "tuning", *argv, "--json"], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        out = json.loads(done.stdout)
    except ValueError:
        out = {"stderr": done.stderr[-1500:]}
    return done.returncode, out, round(time.time() - t0, 1)


class Served:
    """One configuration's server, started from ``command`` (``{port}`` and ``{metrics_port}`` filled with free
    ports; a leading ``python`` is this interpreter) in ``cwd``, ready once ``ready_path`` answers 200 (else
    after ``settle_s``)."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str] | None = None, ready_path: str | None = None,
                 settle_s: float = 3.0, ready_timeout_s: float = 300.0):
        import shlex

        from tuning.base.net import free_port

        self.port = free_port()
        argv = shlex.split(command.replace("{port}", str(self.port)).replace("{metrics_port}", str(free_port())))
        if argv and argv[0] == "python":
            argv[0] = sys.executable
        self.proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        if ready_path is None:
            time.sleep(settle_s)
            return
        deadline = time.time() + ready_timeout_s
        while True:
            try:
                with urllib.request.urlopen(self.url(ready_path), timeout=5) as resp:  # loopback only
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.close()
                raise RuntimeError(f"{command!r} did not become ready at {ready_path} "
                                   f"(exit {self.proc.returncode})")
            time.sleep(0.5)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def hold(self, path: str, api_flags: Sequence[str], rate: float, seconds: float, target: float) -> dict:
        """An open-loop hold of ``rate`` for ``seconds``, judged against the ``target`` p99."""
        code, s, _ = cli("loadtest", "--url", self.url(path), *api_flags, "--rate", f"{rate:.1f}", "--duration",
                         str(seconds), "--target-p99-ms", str(target), cwd=ROOT, timeout=seconds * 3 + 120)
        h = s.get("hold") or {}
        return {"rate": round(rate, 1), "exit": code, "verdict": h.get("verdict"), "p99_ms": h.get("p99_ms"),
                "share": h.get("share"), "share_high": h.get("share_high"), "lag_p99_ms": h.get("lag_p99_ms"),
                "qps": s.get("qps"), "met": h.get("p99_ms") is not None and h["p99_ms"] <= target}

    def close(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
