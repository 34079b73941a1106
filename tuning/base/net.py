"""Small network helpers shared by the servers and load engines."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it; another process may take it before it is bound)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
