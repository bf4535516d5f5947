"""The skew rule between a release's webhook and its agents: the same major.minor (patches may differ). A
`helm upgrade` rolls both, so they differ for a moment; longer, a webhook and an agent may disagree on the
annotations they exchange. Pure."""

from __future__ import annotations

import re

WEBHOOK_SKEW = "WebhookVersionSkew"


def minor_version(version: str) -> tuple[int, int] | None:
    match = re.match(r"^\s*v?(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


def webhook_skew(agent: str, webhook: str | None) -> tuple[str, str] | None:
    """(reason, message) while the webhook runs another major.minor than this agent; None when they match or the
    webhook's version is not known (no webhook in the release, not readable: nothing to say)."""
    if not webhook:
        return None
    ours, theirs = minor_version(agent), minor_version(webhook)
    if ours is None or theirs is None or ours == theirs:
        return None
    return (WEBHOOK_SKEW, f"the webhook runs gpufrac {webhook} and this agent {agent}: a release's webhook and agents "
                          "must share major.minor (docs/CHANGELOG.md, version skew); finish the helm upgrade or roll "
                          "both back")
