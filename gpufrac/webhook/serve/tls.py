"""The webhook's TLS, on the standard library's public `ssl` API: the serving context (TLS >= 1.2, re-read when the
certificate rotates), its socket class with a per-request deadline against slow clients, and the careful close of a
connection whose answer is written while its client is still sending."""

from __future__ import annotations

import errno
import logging
import os
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

# A review arrives in one piece from the API server; a client that takes longer than this to finish its TLS
# handshake, or to send one request, is cut off so it cannot hold one of a worker's few threads.
CLIENT_DEADLINE_SECONDS = 1.0
# A connection closed after its answer (a body refused unread, or `Connection: close`) is drained this long at
# most, and this much at most, so the client that is still sending gets to read the answer.
CLOSING_DRAIN_SECONDS = 2.0
CLOSING_DRAIN_BYTES = 32 * 1024 * 1024
log = logging.getLogger("gpufrac.webhook")


class DeadlineSSLSocket(ssl.SSLSocket):
    """A server-side TLS socket whose blocking reads stop at a per-request deadline (a stalled or trickling client
    gets cut off, not waited for). Installed through `SSLContext.sslsocket_class` (public since Python 3.7); it
    overrides public socket methods only. gunicorn switches the socket to blocking for each request it reads.

    Its own state has public names (`request_deadline`, `closed_early`): a `_name` of ours could shadow one of
    SSLSocket's own."""

    request_deadline: float | None = None
    closed_early = False  # cut off or drained already: a later close must not linger on it (see shutdown)

    def start_deadline(self) -> None:
        self.request_deadline = time.monotonic() + CLIENT_DEADLINE_SECONDS
        self.settimeout(CLIENT_DEADLINE_SECONDS)

    def restart_deadline(self) -> None:
        """The rest of the request gets its own time from now (the app held it back, waiting for its turn)."""
        if self.request_deadline is not None:
            self.start_deadline()

    def setblocking(self, flag: bool) -> None:
        if flag:
            self.start_deadline()
        else:
            self.request_deadline = None
            super().setblocking(False)

    def cut_off(self, stage: str) -> ConnectionResetError:
        self.closed_early = True
        try:
            peer: object = self.getpeername()
        except OSError:
            peer = "?"
        log.warning("dropped a slow client", extra={"peer": str(peer), "stage": stage})
        # gunicorn closes a reset connection quietly; any other socket error would be logged with a traceback.
        return ConnectionResetError(errno.ECONNRESET, f"no complete {stage} within {CLIENT_DEADLINE_SECONDS} s")

    def before_read(self) -> None:
        if self.request_deadline is None:
            return
        remaining = self.request_deadline - time.monotonic()
        if remaining <= 0:
            raise self.cut_off("request")
        self.settimeout(remaining)

    def do_handshake(self, block: bool = False) -> None:
        self.start_deadline()  # gunicorn wraps a blocking socket, which would wait for ever
        try:
            super().do_handshake(block)
        except TimeoutError:
            raise self.cut_off("TLS handshake") from None
        self.start_deadline()  # the first request gets its own time

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        self.before_read()
        try:
            return super().recv(buflen, flags)
        except TimeoutError:
            raise self.cut_off("request") from None

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        self.before_read()
        try:
            return super().recv_into(buffer, nbytes, flags)
        except TimeoutError:
            raise self.cut_off("request") from None

    def sendall(self, data: Any, flags: int = 0) -> None:
        if self.request_deadline is not None:
            self.settimeout(CLIENT_DEADLINE_SECONDS)  # the answer gets its own time, whatever reading took
        super().sendall(data, flags)

    def shutdown(self, how: int) -> None:
        # gunicorn closes "gracefully" on its accept thread, lingering for the peer to close; a client cut off for
        # being slow would make it linger in turn, and stall every new connection of the worker meanwhile. A
        # connection already drained on its worker thread (close_after_answer) has nothing left to linger for.
        if self.closed_early:
            raise OSError(errno.ENOTCONN, "cut off or drained already: closed without lingering")
        super().shutdown(how)


def close_after_answer(sock: socket.socket) -> None:
    """Close a connection whose answer is written, the way Go's net/http does, on the worker thread: stop writing
    (FIN after the answer), then read and drop what the client still sends (the rest of a body refused unread)
    until it closes, for a bounded time and size. A client that sends its whole body before it reads (Python's
    requests, any client without `Expect: 100-continue`) then reads the answer instead of a reset; and gunicorn's
    own close on the accept thread finds nothing to wait for, so no other connection waits on this one.

    The drained bytes are read from the socket under TLS, undecrypted (the plain `socket.socket` methods):
    nothing more is read from this session.
    """
    try:
        socket.socket.shutdown(sock, socket.SHUT_WR)  # the TCP socket's, not the TLS layer's (no more records)
    except OSError:
        return
    finally:
        if isinstance(sock, DeadlineSSLSocket):
            sock.closed_early = True
    deadline = time.monotonic() + CLOSING_DRAIN_SECONDS
    buffer = bytearray(256 * 1024)
    drained = 0
    try:
        while drained < CLOSING_DRAIN_BYTES:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            socket.socket.settimeout(sock, remaining)
            n = socket.socket.recv_into(sock, buffer)
            if n == 0:
                break
            drained += n
    except OSError:
        pass


class CertificateReloader:
    """gunicorn's `ssl_context` server hook: the serving context, rebuilt when tls.crt or tls.key change on disk.

    gunicorn asks for a context on every accepted connection; building one costs a file read and key parse, so it
    is cached and rebuilt only when the files change (a Secret update swaps them atomically). A cert and key
    caught mid-rotation that do not match keep the previous context until the pair is whole again.
    """

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.lock = threading.Lock()
        self.stamp: tuple[Any, ...] | None = None
        self.current: ssl.SSLContext | None = None

    def files_stamp(self) -> tuple[Any, ...]:
        stats = [os.stat(f) for f in (self.cert_file, self.key_file)]
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in stats)

    def build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.sslsocket_class = DeadlineSSLSocket
        context.load_cert_chain(certfile=str(self.cert_file), keyfile=str(self.key_file))
        return context

    def context(self) -> ssl.SSLContext:
        with self.lock:
            try:
                stamp = self.files_stamp()
                if stamp != self.stamp or self.current is None:
                    self.current = self.build()
                    self.stamp = stamp
            except (OSError, ssl.SSLError):
                if self.current is None:
                    raise
            return self.current

    def __call__(self, _conf: Any, _default_factory: Any) -> ssl.SSLContext:
        return self.context()
