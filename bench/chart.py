"""The webhook settings the Helm chart runs with, read from charts/gpufrac/values.yaml (so the bench follows the
chart when its defaults change)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from gpufrac.core.contract import DEFAULT_MPS_ROOT
from gpufrac.webhook.decide.policy import Policy

ROOT = Path(__file__).resolve().parent.parent
VALUES = ROOT / "charts" / "gpufrac" / "values.yaml"


@dataclass(frozen=True)
class ChartWebhook:
    workers: int
    threads: int
    scheduler_users: tuple[str, ...]
    scheduler_groups: tuple[str, ...]
    require_enforcing_node: bool
    mps_root: str
    memory_limit: str = "none"  # resources.limits.memory of the webhook container

    def args(self) -> list[str]:
        """`gpufrac webhook` arguments as templates/webhook/deployment.yaml renders them (less --certs/--bind)."""
        out: list[str] = []
        for user in self.scheduler_users:
            out += ["--scheduler-user", user]
        for group in self.scheduler_groups:
            out += ["--scheduler-group", group]
        out += ["--mps-root", self.mps_root,
                "--require-enforcing-node" if self.require_enforcing_node else "--no-require-enforcing-node",
                "--workers", str(self.workers), "--threads", str(self.threads)]
        return out

    def policy(self) -> Policy:
        return Policy(
            scheduler_users=frozenset(self.scheduler_users),
            scheduler_groups=frozenset(self.scheduler_groups),
            mps_root=self.mps_root,
            require_enforcing_node=self.require_enforcing_node,
        )


def chart_webhook(values: Path = VALUES) -> ChartWebhook:
    data = yaml.safe_load(values.read_text())
    webhook = data.get("webhook") or {}
    return ChartWebhook(
        workers=int(webhook.get("workers", 2)),
        threads=int(webhook.get("threads", 8)),
        scheduler_users=tuple(webhook.get("schedulerUsers") or ()),
        scheduler_groups=tuple(webhook.get("schedulerGroups") or ()),
        require_enforcing_node=bool(webhook.get("requireEnforcingNode", False)),
        mps_root=str((data.get("mps") or {}).get("root", DEFAULT_MPS_ROOT)),
        memory_limit=str(((webhook.get("resources") or {}).get("limits") or {}).get("memory", "none")),
    )
