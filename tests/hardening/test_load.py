"""The webhook process under load and faults: certificate rotation mid-load, SIGTERM mid-load, stalled clients.

Short bounds here (GPUFRAC_LOAD_SECONDS, default 6 s of load); `make soak` runs the same harness for longer.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time

import pytest
from cryptography import x509

from e2e.hardening.harness import Load, Server, slow_client, timed_review

LOAD_SECONDS = float(os.environ.get("GPUFRAC_LOAD_SECONDS") or 6)
GRACEFUL_TIMEOUT = 20  # webhook.server.ServeOptions.graceful_timeout
MUTATING_TIMEOUT = 3.0  # the chart's webhook.mutating.timeoutSeconds: an answer later than this is a failure


@pytest.fixture
def server(tmp_path):
    srv = Server(tmp_path, workers=2, threads=4)
    yield srv
    srv.stop()


def served_serial(server: Server) -> int:
    with server.context().wrap_socket(socket.create_connection(("127.0.0.1", server.port), timeout=10),
                                      server_hostname="localhost") as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True)).serial_number


def test_sustained_load_with_a_certificate_rotation_loses_no_request_and_no_memory(server, record_property):
    workers = server.worker_pids()
    Load(server, threads=8, total=400, seconds=30).run()  # warm-up: imports, caches, connection pools
    rss_before = server.rss_kib()

    load = Load(server, threads=8, seconds=LOAD_SECONDS, reconnect_every=25).start()
    time.sleep(LOAD_SECONDS / 2)
    rotated = server.rotate()
    result = load.join()
    rss_after = server.rss_kib()
    record_property("load", result.summary())
    print(f"\nload+rotation: {result.summary()}; RSS {rss_before} -> {rss_after} KiB")
    record_property("rss_kib", f"{rss_before} -> {rss_after}")

    assert result.failures == [], result.summary() + "\n" + "\n".join(result.failures[:10])
    assert result.ok > 100 and result.connections > 8, result.summary()
    assert served_serial(server) == rotated.certificate.serial_number, "new connections did not get the new cert"
    assert server.worker_pids() == workers, "a worker died or was replaced under load"
    assert server.log_problems() == []
    assert rss_after <= rss_before * 1.15 + 8 * 1024, f"RSS grew from {rss_before} KiB to {rss_after} KiB"


def test_sigterm_under_load_finishes_every_review_sent_before_it_and_exits_0(server, record_property):
    load = Load(server, threads=8, seconds=GRACEFUL_TIMEOUT, reconnect_every=10, timeout=GRACEFUL_TIMEOUT,
                stop_on_refused=True).start()
    time.sleep(min(LOAD_SECONDS / 3, 2.0))
    signalled = time.monotonic()
    os.kill(server.popen.pid, signal.SIGTERM)  # the kubelet signals the container's main process only
    try:
        code = server.popen.wait(timeout=GRACEFUL_TIMEOUT + 5)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the webhook did not exit within graceful_timeout ({GRACEFUL_TIMEOUT} s) after SIGTERM")
    exited = time.monotonic() - signalled
    load.stop()
    result = load.join()
    before = [t for t in result.timeline if t[1] < signalled]
    lost = [t for t in before if t[3]]
    begun = [t for t in result.timeline if t[0] < signalled <= t[1] and t[3]]  # connecting or sending at the signal
    figures = (f"{len(before)} reviews sent before SIGTERM, {len(lost)} lost ({len(begun)} being connected or sent "
               f"at the signal failed); exit {code} after {exited:.2f} s; "
               f"{result.summary()}")
    record_property("sigterm", figures)
    print(f"\nsigterm: {figures}")
    assert code == 0
    assert len(before) > 50, "too little load to tell"
    assert lost == [], f"{len(lost)} reviews sent before SIGTERM got no answer: {[t[3] for t in lost[:5]]}"
    assert server.log_problems() == []


@pytest.mark.parametrize("stage", ["tcp", "hello", "headers", "body"])
def test_one_stalled_client_does_not_hold_up_the_others(server, stage):
    stalled = slow_client(server, stage)
    try:
        time.sleep(0.3)
        kept = server.connection(timeout=MUTATING_TIMEOUT)
        timings = [timed_review(server, timeout=MUTATING_TIMEOUT) for _ in range(10)]
        timings += [timed_review(server, conn=kept) for _ in range(10)]
        kept.close()
    finally:
        stalled.close()
    errors = [e for _, e in timings if e]
    slowest = max(t for t, _ in timings)
    assert errors == [] and slowest < MUTATING_TIMEOUT / 2, \
        f"with one client stalled at {stage}: slowest {slowest:.2f} s, {errors}"
    assert server.log_problems() == []


def test_as_many_stalled_clients_as_threads_do_not_stop_the_webhook(server):
    stalled = []
    try:
        for _ in range(2 * 4):  # workers x threads; each handshake takes one thread, then stalls in the headers
            stalled.append(slow_client(server, "headers"))
        time.sleep(0.3)
        timings = [timed_review(server, timeout=MUTATING_TIMEOUT + 1) for _ in range(3)]
    except (OSError, ssl.SSLError) as exc:  # a stalled client could not even finish its own handshake
        pytest.fail(f"{len(stalled)} stalled clients already blocked new handshakes: {exc}")
    finally:
        for sock in stalled:
            sock.close()
    assert all(not e and t < MUTATING_TIMEOUT for t, e in timings), \
        f"with {len(stalled)} stalled clients, reviews took {[(round(t, 2), e[:40]) for t, e in timings]}"
