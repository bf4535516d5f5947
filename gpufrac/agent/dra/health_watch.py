"""The node's lost GPUs for the DRA driver: NVML's XID events in (a thread of their own), the agent's inventory
observed at each publishing of the slices (decide.gpu_health)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpufrac.agent.dra.decide.gpu_health import GpuHealth, after_inventory, after_xid
from gpufrac.agent.edges.nvml import XidWatch

log = logging.getLogger(__name__)


class GpuHealthWatch:
    def __init__(self, listed: Callable[[], tuple[str, ...]], wait_ms: int = 1000) -> None:
        self._listed = listed
        self._lock = threading.Lock()
        self.health = GpuHealth()
        self._stop = threading.Event()
        self.xids = XidWatch(self.xid, listed, wait_ms)
        self._thread = threading.Thread(target=self.xids.run, args=(self._stop,), name="xid-watch", daemon=True)

    def xid(self, uuid: str, xid: int) -> None:
        with self._lock:
            before, self.health = self.health, after_xid(self.health, uuid, xid)
        if self.health is not before:
            log.warning("GPU %s is lost (XID %d): its DRA devices are tainted and no claim is prepared on it", uuid,
                        xid)

    def lost(self) -> dict[str, str]:
        """GPU UUID -> why it is lost, as of the GPUs NVML lists now."""
        with self._lock:
            before, self.health = self.health, after_inventory(self.health, self._listed())
        for uuid in set(before.lost) - set(self.health.lost):
            log.info("GPU %s is back: its DRA devices are untainted", uuid)
        return dict(self.health.lost)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
