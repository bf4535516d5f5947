"""Keeps the fractional pods bound to this node in memory: list, then watch; resume after disconnects; relist
on 410 Gone."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from gpufrac.kube.errors import GoneError, KubeError

log = logging.getLogger(__name__)


class PodSource(Protocol):
    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]: ...

    def watch_pods(
        self, node: str, resource_version: str, timeout_seconds: int
    ) -> Iterator[dict[str, Any]]: ...


def apply_event(pods: dict[str, dict[str, Any]], event: dict[str, Any]) -> str | None:
    """Apply one watch event to the cache (by pod UID); returns the resourceVersion to resume from."""
    obj = event.get("object") or {}
    metadata = obj.get("metadata") or {}
    kind = event.get("type")
    if kind in ("ADDED", "MODIFIED"):
        pods[metadata["uid"]] = obj
    elif kind == "DELETED":
        pods.pop(metadata.get("uid", ""), None)
    return metadata.get("resourceVersion")


class PodCache:
    def __init__(
        self,
        source: PodSource,
        node: str,
        *,
        watch_timeout: int = 300,
        retry_delay: float = 2.0,
        on_reconnect: Callable[[], None] | None = None,
    ) -> None:
        self._source = source
        self._node = node
        self._watch_timeout = watch_timeout
        self._retry_delay = retry_delay
        self._on_reconnect = on_reconnect or (lambda: None)
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self.synced = threading.Event()
        self.relists = 0
        self._thread: threading.Thread | None = None

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._pods.values())

    def get(self, uid: str) -> dict[str, Any] | None:
        with self._lock:
            return self._pods.get(uid)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="pod-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def relist(self) -> str:
        items, resource_version = self._source.list_pods(self._node)
        with self._lock:
            self._pods = {p["metadata"]["uid"]: p for p in items}
        self.relists += 1
        self.synced.set()
        return resource_version

    def run(self) -> None:
        resource_version: str | None = None
        reconnecting = False
        while not self._stop.is_set():
            try:
                if reconnecting:
                    self._on_reconnect()
                    reconnecting = False
                if resource_version is None:
                    resource_version = self.relist()
                for event in self._source.watch_pods(self._node, resource_version, self._watch_timeout):
                    with self._lock:
                        resource_version = apply_event(self._pods, event) or resource_version
                    if self._stop.is_set():
                        return
                # the server ended the watch (timeout): resume from where we were
            except GoneError:
                log.info("pod watch expired (410 Gone), relisting")
                resource_version = None
                reconnecting = True
            except (KubeError, OSError, ValueError) as err:
                log.warning("pod watch interrupted: %s; retrying in %.0fs", err, self._retry_delay)
                reconnecting = True
                self._stop.wait(self._retry_delay)
            except Exception as err:  # urllib3 protocol errors and the like: the connection dropped
                log.warning("pod watch connection lost: %s; retrying in %.0fs", err, self._retry_delay)
                reconnecting = True
                self._stop.wait(self._retry_delay)
