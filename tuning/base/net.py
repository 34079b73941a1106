"""Small network helpers shared by the servers and load engines."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it; another process may take it before it is bound)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def url_host_port(url: str) -> tuple[str, int]:
    """The host and TCP port a URL names (its scheme's default port when it gives none); a ValueError naming
    the URL when it has no host or its port is not a number."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{url!r}: its port is not a number 0-65535; give e.g. http://127.0.0.1:8000/embed") from None
    if not parts.hostname:
        raise ValueError(f"{url!r}: no host in it; give e.g. http://127.0.0.1:8000/embed")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _addresses(host: str) -> set[str]:
    """The IP addresses ``host`` resolves to here (none when it does not resolve)."""
    try:
        return {_plain_ip(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (socket.gaierror, UnicodeError, OSError):
        return set()


def _plain_ip(ip: str) -> str:
    """An address without its IPv6 zone, and an IPv4-mapped IPv6 address as IPv4 (both name one listener)."""
    ip = ip.split("%", 1)[0]
    return ip[7:] if ip.lower().startswith("::ffff:") and "." in ip else ip


def own_addresses() -> set[str]:
    """Every address of this machine's network interfaces."""
    import psutil

    return {_plain_ip(a.address) for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family in (socket.AF_INET, socket.AF_INET6)}


def is_local_host(host: str) -> bool:
    """Whether ``host`` is this machine: localhost, a loopback address, or an address of one of its interfaces
    (a process listening there can be found from its port; a remote one cannot)."""
    import ipaddress

    addresses = _addresses(host) if host.lower() != "localhost" else {"127.0.0.1", "::1"}
    if not addresses:
        return False
    if all(ipaddress.ip_address(ip).is_loopback for ip in addresses):
        return True
    return bool(addresses & own_addresses())


def listening_pid(url: str) -> int | None:
    """The pid of the process LISTENING on the port of ``url`` when the URL's host is this machine; None when
    the host is another machine, nothing listens there, or the listener is not visible to this user (another
    user's process, a container's network namespace: psutil then gives no pid, or AccessDenied).

    Several processes can hold one listening socket (a parent and the workers it forked, or SO_REUSEPORT
    workers): the one whose parent is not among them is given, since watching a process covers its children."""
    host, port = url_host_port(url)
    if not is_local_host(host):
        return None
    wanted = _addresses(host) | ({"127.0.0.1", "::1"} if host.lower() == "localhost" else set())
    pids = _listeners(port, wanted | {"0.0.0.0", "::"})
    return _root(pids) if pids else None


def _listeners(port: int, ips: set[str]) -> set[int]:
    """Pids with a TCP socket listening on ``port`` at one of ``ips`` (the wildcards included by the caller)."""
    import psutil

    try:
        conns = psutil.net_connections(kind="inet")
    except psutil.AccessDenied:  # macOS without root: look through this user's own processes instead
        return _own_listeners(port, ips)
    return {c.pid for c in conns if c.pid and _listens(c, port, ips)}


def _own_listeners(port: int, ips: set[str]) -> set[int]:
    import psutil

    pids = set()
    for proc in psutil.process_iter():
        try:
            if any(_listens(c, port, ips) for c in proc.net_connections(kind="inet")):
                pids.add(proc.pid)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return pids


def _listens(conn: object, port: int, ips: set[str]) -> bool:
    import psutil

    laddr = getattr(conn, "laddr", None)
    return (getattr(conn, "status", None) == psutil.CONN_LISTEN and bool(laddr) and laddr.port == port
            and _plain_ip(laddr.ip) in ips)


def _root(pids: set[int]) -> int:
    """The pid among ``pids`` whose parent is not among them (the lowest such, or the lowest pid)."""
    import psutil

    roots = []
    for pid in pids:
        try:
            if psutil.Process(pid).ppid() not in pids:
                roots.append(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return min(roots or pids)
