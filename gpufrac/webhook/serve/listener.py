"""The admission port's listening socket, made here and handed to gunicorn by its documented `fd://FD` bind, so that
it can carry TCP_DEFER_ACCEPT: the kernel completes accept() only once a connection has sent its first bytes.

Why: gunicorn's gthread worker gives each new connection a thread that waits up to 5 s for its first bytes (a
constant, no setting) before parking it. A few connections that open and send nothing (as many as a worker has
threads) would then hold every thread and delay reviews past the webhook's timeout; with TCP_DEFER_ACCEPT they wait
in the kernel instead, holding nothing, until they send or DEFER_ACCEPT_SECONDS pass. The API server, the probes and
any TLS client send first, so they are accepted at once.
"""

from __future__ import annotations

import socket

from gpufrac.core.bind import split_bind

# How long a connection that sends nothing waits in the kernel before gunicorn gets it (Linux rounds it up to its
# SYN-ACK retransmission steps: 1, 3, 7, 15, 31 s). Then gunicorn's own 5 s wait, then its poller.
DEFER_ACCEPT_SECONDS = 30
BACKLOG = 2048  # gunicorn's default


def listening_fd(bind: str) -> int:
    """A TCP socket bound to HOST:PORT and listening, as a file descriptor for gunicorn to own (`fd://`)."""
    host, port = split_bind(bind)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds: a restart rebinds at once
        if hasattr(socket, "TCP_DEFER_ACCEPT"):  # Linux
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, DEFER_ACCEPT_SECONDS)
        sock.bind((host, int(port)))
        sock.listen(BACKLOG)
        sock.set_inheritable(True)
    except OSError as err:  # a port below 1024 without the capability, an address this host does not have
        sock.close()
        raise SystemExit(f"gpufrac webhook: cannot listen on {bind}: {err.strerror or err}") from None
    except BaseException:
        sock.close()
        raise
    return sock.detach()  # gunicorn closes it: this object must not
