"""Open files: a control plane holds one per connected node and per client connection.

Linux starts a process with a soft limit of 1,024 open files (systemd's
default too), far below its hard limit. At the soft limit the server could not
accept another connection: asyncio logged "socket.accept() out of system
resource" and tried again a second later, so nodes beyond about a thousand
never joined and the log did not say why. The server raises its soft limit
to the hard one at start, and says so in words when it runs out anyway.
"""

from __future__ import annotations

import asyncio
import errno
import resource
from typing import Any

import structlog

log = structlog.get_logger(__name__)

# What a hard limit of "unlimited" is taken as: Linux refuses more than fs.nr_open, 1,048,576 by default.
UNLIMITED = 1 << 20
# Below this, the log says how few nodes the server can hold.
FEW = 4096
# What asyncio's accept loop reports when it could not accept a connection for want of a resource.
_ACCEPT_FAILED = "socket.accept() out of system resource"


def raise_limit() -> int:
    """Raise this process's soft limit of open files as far as its hard limit allows; the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = UNLIMITED if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit", limit=soft, wanted=want, error=str(exc))
    return UNLIMITED if soft == resource.RLIM_INFINITY else soft


def report(limit: int) -> None:
    """Log the limit, and warn when it holds only a small fleet."""
    if limit < FEW:
        log.warning(
            f"this server may have only {limit} files open at once, one per connected node and client "
            "connection; raise its limit (LimitNOFILE= in its systemd unit, or `ulimit -Hn`) to hold "
            "more nodes",
            open_files_limit=limit,
        )
    else:
        log.info("open-file limit", open_files_limit=limit)


def explain_accept_failures(loop: asyncio.AbstractEventLoop) -> None:
    """Say in words, instead of asyncio's line and traceback, why a connection could not be accepted."""
    default = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if context.get("message") == _ACCEPT_FAILED and isinstance(exc, OSError):
            where = context.get("socket")
            address = where.getsockname() if where is not None else None
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
                whose = "this server's" if exc.errno == errno.EMFILE else "the machine's"
                log.error(
                    f"cannot accept a connection: {whose} open files are all in use (this server's "
                    f"limit is {soft}, one per connected node and client connection); raise "
                    "LimitNOFILE= in its systemd unit (or `ulimit -n`); it tries again in a second",
                    listener=_address(address),
                )
            else:
                log.error(
                    f"cannot accept a connection: {exc.strerror or exc}; it tries again in a second",
                    listener=_address(address),
                )
            return
        if default is not None:
            default(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


def _address(address: object) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address or "")
