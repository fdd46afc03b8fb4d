"""Whether a server may listen on a port: one check for every command and config that
names one (`tracerl gateway --port`, `tracerl serve --port`, a run's ``agent.port``), made
before a model loads, so a port in use costs a second, not a model load and a traceback;
and the same two lines when a port is taken between that check and the bind (`port_error`).

Standard library only (no torch, no tracerl layer above `tracerl.errors`): the commands
(`tracerl.cli.common.port_free`) and the preflight (`tracerl.preflight`) both ask it.
"""

from __future__ import annotations

import socket

from tracerl.errors import UserError


def port_error(host: str, port: int, e: BaseException, option: str = "--port") -> UserError:
    """The `UserError` for `host:port` refused with `e` (an `OSError` from a bind or an
    address lookup, or the `OverflowError` of a port past 65535); `option` names where the
    port was given (``--port``, ``agent.port``)."""
    if not 0 <= port <= 65535 or isinstance(e, OverflowError):
        return UserError(
            f"{option} {port}: a port is a number from 0 to 65535",
            f"pick one in that range with {option} (0: any free port)",
        )
    if isinstance(e, socket.gaierror):
        return UserError(f"cannot listen on {host}: {e}", "give an address of this machine")
    why = getattr(e, "strerror", None) or str(e)
    return UserError(
        f"port {port} on {host} is in use or not allowed ({why})",
        f"pick another with {option} (or stop what listens there)",
    )


def check_port(host: str, port: int, option: str = "--port") -> None:
    """`UserError` (two lines) when `host:port` cannot be listened on. Bound as the servers
    bind (``SO_REUSEADDR``: a port whose last connections are still closing is free to
    them); port 0 (any free port) always is. A port outside 0..65535 is refused: the socket
    layer would take it modulo 65536, or raise."""
    if not 0 <= port <= 65535:
        raise port_error(host, port, OverflowError(port), option)
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise port_error(host, port, e, option) from e
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            raise port_error(host, port, e, option) from e
