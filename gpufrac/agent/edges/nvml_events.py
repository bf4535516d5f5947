"""Critical XID errors from NVML's event sets (edge), as NVIDIA's device plugin watches them: every GPU NVML lists
is registered for `nvmlEventTypeXidCriticalError`, and registered again when the GPUs listed change."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pynvml

log = logging.getLogger(__name__)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class XidWatch:
    def __init__(self, on_xid: Callable[[str, int], None], listed: Callable[[], tuple[str, ...]],
                 wait_ms: int = 1000, retry_s: float = 5.0) -> None:
        self._on_xid = on_xid
        self._listed = listed  # the GPUs the agent read last (sorted UUIDs): a change registers them again
        self._wait_ms = wait_ms
        self._retry_s = retry_s
        self.watching: tuple[str, ...] = ()  # the GPUs registered now: an XID before its registration is not seen

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self._watch(stop)
            except pynvml.NVMLError as err:
                log.warning("watching the GPUs' XID errors failed, retrying in %.0f s: %s", self._retry_s, err)
                stop.wait(self._retry_s)

    def _watch(self, stop: threading.Event) -> None:
        pynvml.nvmlInit()
        try:
            events = pynvml.nvmlEventSetCreate()
            try:
                registered = self.watching = self._register(events)
                while not stop.is_set() and self._listed() == registered:
                    try:
                        event = pynvml.nvmlEventSetWait(events, self._wait_ms)
                    except pynvml.NVMLError_Timeout:
                        continue
                    self._on_xid(_text(pynvml.nvmlDeviceGetUUID(event.device)), int(event.eventData))
            finally:
                self.watching = ()
                pynvml.nvmlEventSetFree(events)
        finally:
            pynvml.nvmlShutdown()

    @staticmethod
    def _register(events: object) -> tuple[str, ...]:
        uuids = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
            except pynvml.NVMLError_NotSupported:
                log.warning("GPU %s reports no XID events: its loss is not seen", uuid)
            uuids.append(uuid)
        return tuple(sorted(uuids))
