"""Listen addresses as nats-server reads them: ``host:port``, IPv6 in brackets, one socket.

* ``listen`` takes ``"host:port"``, ``"[::1]:4222"``, ``":4222"`` (every IPv4 address, as
  nats-server's default host) or a bare port number; ``-1`` picks a free port.
* A host may be written bare (``::1``) or in brackets (``[::1]``); it is kept bare.
* A name that resolves to several addresses is listened on at one of them, an IPv4
  one first (Go's ``net.Listen``), and ``::`` takes IPv4 clients too (a dual-stack
  socket), so one server has one client address, as nats-server has.
"""

from __future__ import annotations

import ipaddress
import socket

ANY_IPV4 = "0.0.0.0"


def bare_host(host: str) -> str:
    """``[::1]`` → ``::1``; any other host as it is."""
    if len(host) > 1 and host[0] == "[" and host[-1] == "]":
        return host[1:-1]
    return host


def show(host: str, port: int) -> str:
    """``host:port`` as nats-server logs it: an IPv6 host in brackets."""
    host = bare_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_listen(value: str | int) -> tuple[str | None, int]:
    """A ``listen`` value as ``(host, port)``; ``host`` is ``None`` for a bare port.

    The forms Go's ``net.SplitHostPort`` takes, then the port as an integer; anything
    else is a ``ValueError`` saying what is wrong.
    """
    if isinstance(value, bool):
        raise ValueError(f"could not parse address {value!r}")
    if isinstance(value, int):
        return None, value
    text = value.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"could not parse address {value!r}: missing ']'")
        host, rest = text[1:end], text[end + 1 :]
        if not rest:
            raise ValueError(f"could not parse address {value!r}: missing port")
        if rest[0] != ":" or "[" in host:
            raise ValueError(f"could not parse address {value!r}")
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            if text.lstrip("+-").isdigit():
                return None, int(text)
            raise ValueError(f"could not parse address {value!r}: missing port")
        if ":" in host:
            raise ValueError(
                f"could not parse address {value!r}: too many colons "
                "(write an IPv6 address in brackets, as in [::1]:4222)"
            )
        if "[" in host or "]" in host:
            raise ValueError(f"could not parse address {value!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"could not parse address {value!r}: bad port {port_text!r}") from None
    return host or ANY_IPV4, port


def listen_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A bound, listening, non-blocking TCP socket for ``host`` and ``port`` (0 picks one).

    ``OSError`` when the host does not resolve or the address cannot be taken.
    """
    infos = socket.getaddrinfo(
        bare_host(host) or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    family, kind, proto, _, address = next(
        (info for info in infos if info[0] == socket.AF_INET), infos[0]
    )
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            dual = ipaddress.ip_address(str(address[0]).partition("%")[0]).is_unspecified
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual else 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
