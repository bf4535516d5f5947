"""`python -m e2e up|down|status|demo` — the local control plane from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from e2e import state
from e2e.cluster import ControlPlane
from e2e.names import DEFAULT_WORKDIR
from e2e.state import REAL_NODE, private_workdir
from e2e.toolkit.errors import ClusterError


def cluster_class(kind: str) -> type[ControlPlane] | None:
    """The class of a cluster by the kind its state file records."""
    if kind == REAL_NODE:
        from e2e.node import RealCluster  # PyYAML and the node's toolkit only for a real node: `down` needs neither

        return RealCluster
    return ControlPlane if kind == ControlPlane.kind else None


def _workdirs(root: Path) -> list[Path]:
    """`root` and every directory under it that holds a control plane's state file (tests and the demo run
    their own clusters in subdirectories)."""
    return sorted({p.parent for p in root.glob("**/state.json")} | {root})


def load(workdir: Path) -> ControlPlane | None:
    """A view of the cluster running in `workdir`, of the kind it records, or None."""
    recorded = state.read(workdir) or {}
    cls = cluster_class(str(recorded.get("kind")))
    return cls.load(workdir) if cls else None


def cmd_up(args: argparse.Namespace) -> int:
    running = load(args.workdir)
    wanted = ControlPlane.kind if args.api_only else REAL_NODE
    if running is not None and running.kind == wanted and all(running.status().values()):
        print(running.usage())
        print("(already running)")
        return 0
    if args.api_only:
        cp = ControlPlane(args.workdir, detach=True, quiet=False)
    else:
        from e2e.node import RealCluster

        cp = RealCluster(args.workdir, detach=True, quiet=False, nri=not args.no_nri)
    try:
        cp.start()
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(cp.usage())
    print(
        f"cold start: {cp.timings.get('cold_start_s')} s "
        f"(kube-apiserver ready after {cp.timings.get('apiserver_ready_s')} s)"
    )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    """Stop the cluster of `up` (the workdir itself) and orphans under it: clusters of test sessions or demos
    whose owning process is gone. Clusters still owned by a live process (a running test session, a demo, a
    colleague's `--workdir …` cluster) are left alone and listed, unless --all."""
    anything = False
    for wd in _workdirs(args.workdir):
        owner = state.owner(wd)
        if owner is None:
            continue
        detach, owner_alive = owner
        orphan = not detach and not owner_alive
        if not (args.all or wd == args.workdir or orphan):
            print(f"left running: {os.path.relpath(wd)} (owned by a live process or started with --workdir; "
                  "stop it with `python -m e2e --workdir DIR down`, or `down --all`)")
            continue
        stopped = state.stop_recorded(wd)
        if stopped:
            anything = True
            print(f"stopped {', '.join(stopped)} ({os.path.relpath(wd)})")
    if not anything:
        print(f"nothing was running in {os.path.relpath(args.workdir)}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    rc = 1
    for wd in _workdirs(args.workdir):
        cp = load(wd)
        if cp is None:
            continue
        st = cp.status()
        print(f"{wd} ({cp.kind}): " + ", ".join(f"{n}={'up' if st[n] else 'DOWN'}" for n in cp.components))
        if all(st.values()):
            rc = 0
            if args.json:
                print(
                    json.dumps(
                        {
                            "server": cp.server,
                            "webhook": cp.webhook_url,
                            "kubeconfigs": {k: str(v) for k, v in cp.kubeconfigs.items()},
                        }
                    )
                )
    if rc:
        print("no control plane running")
    return rc


def cmd_demo(args: argparse.Namespace) -> int:
    if args.api_only:
        from e2e.demo import run_demo

        return run_demo(private_workdir("demo", args.workdir))
    from e2e.node_demo import run_node_demo

    return run_node_demo(private_workdir("demo", args.workdir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e", description=__doc__)
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a real one-node cluster in the background (or --api-only)")
    up.add_argument("--api-only", action="store_true",
                    help="only etcd, kube-apiserver and the webhook on the host (pods are stored, never run)")
    up.add_argument("--no-nri", action="store_true",
                    help="the real node's containerd with NRI disabled (a runtime without NRI, as containerd 1.x)")
    down = sub.add_parser("down", help="stop what `up` started")
    down.add_argument("--all", action="store_true",
                      help="also clusters under the workdir that live processes still own (tests, demos)")
    status = sub.add_parser("status", help="what is running")
    status.add_argument("--json", action="store_true")
    demo = sub.add_parser("demo", help="a real node, helm install, the seed examples running, helm uninstall")
    demo.add_argument("--api-only", action="store_true", help="the API-only control plane: admissions only")
    args = parser.parse_args(argv)
    args.workdir = args.workdir.resolve()
    return {"up": cmd_up, "down": cmd_down, "status": cmd_status, "demo": cmd_demo}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
