"""Listen addresses. A bind without a host (`:8443`) listens on every address of the pod's IP family, so one
chart works on IPv4, IPv6 and dual-stack clusters: `::` (which also takes IPv4 on Linux, where IPV6_V6ONLY is
off by default) when the pod's IP is IPv6 or unknown and the host has IPv6, `0.0.0.0` otherwise."""

from __future__ import annotations

import socket

IPV4_ANY = "0.0.0.0"
IPV6_ANY = "::"


def split_bind(bind: str) -> tuple[str, str]:
    """HOST:PORT into (host, port); an IPv6 host may be bracketed (`[::1]:8443`); the host may be empty."""
    host, sep, port = bind.rpartition(":")
    if not sep:
        return "", bind
    return host.strip("[]"), port


def join_bind(host: str, port: str | int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def wildcard_host(pod_ip: str | None, ipv6_available: bool) -> str:
    """The any-address of the pod's family: from its IP when known (POD_IP, status.podIP), else the host's."""
    if pod_ip:
        return IPV6_ANY if ":" in pod_ip else IPV4_ANY
    return IPV6_ANY if ipv6_available else IPV4_ANY


def resolve_bind(bind: str, pod_ip: str | None, ipv6_available: bool) -> str:
    """`bind` with an empty host replaced by the wildcard of the pod's family; any other bind unchanged."""
    host, port = split_bind(bind)
    if host:
        return bind
    return join_bind(wildcard_host(pod_ip, ipv6_available), port)


def host_has_ipv6() -> bool:
    """Whether this host can listen on IPv6 (a kernel booted with ipv6.disable=1 cannot)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind((IPV6_ANY, 0))
    except OSError:
        return False
    return True
