"""What both kinds of cluster call things and where they keep them: the repository's paths, the namespaces, the
node and the users the tests act as."""

from __future__ import annotations

import os
from pathlib import Path

from gpufrac.core.contract import DEFAULT_SCHEDULER_USER

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_WORKDIR = REPO_ROOT / ".e2e"
CHART_DIR = REPO_ROOT / "charts" / "gpufrac"
# The real node's root (containerd's state, the kubelet's, the fake GPUs): one per machine.
NODE_ROOT = Path(os.environ.get("GPUFRAC_NODE_ROOT", "/var/lib/gpufrac-node"))

USER_NAMESPACE = "team-a"
RELEASE_NAMESPACE = "gpufrac-system"
NODE_NAME = "gpu-node-1"
SCHEDULER_USER = DEFAULT_SCHEDULER_USER  # the identity the webhook trusts by default
RS_CONTROLLER_USER = "system:serviceaccount:kube-system:replicaset-controller"
# The readiness condition types KAI reads, which the chart has the agent publish by default (agent.readyConditionTypes).
KAI_CONDITIONS = ("gpu-sharing.nvidia.com/Ready", "gpu-fractioning.nvidia.com/Ready")
