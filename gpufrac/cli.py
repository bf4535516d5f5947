"""The `gpufrac` command: certs, webhook, review, agent."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufrac.core.contract import DEFAULT_MPS_ROOT, DEFAULT_SCHEDULER_USER

if TYPE_CHECKING:
    from gpufrac.webhook.policy import Policy

DEFAULT_DNS = ("gpufrac-webhook", "gpufrac-webhook.gpufrac-system", "gpufrac-webhook.gpufrac-system.svc")


def _policy(args: argparse.Namespace) -> Policy:  # imported lazily: `gpufrac agent` stays light
    from gpufrac.webhook.policy import Policy
    return Policy(
        scheduler_users=frozenset(args.scheduler_user or (DEFAULT_SCHEDULER_USER,)),
        scheduler_groups=frozenset(args.scheduler_group or ()),
        mps_root=args.mps_root,
        require_enforcing_node=args.require_enforcing_node,
    )


def _add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scheduler-user", action="append", metavar="NAME",
                        help="identity allowed to write bind-time values (repeatable; default "
                             f"{DEFAULT_SCHEDULER_USER})")
    parser.add_argument("--scheduler-group", action="append", metavar="GROUP", help="group with the same right")
    parser.add_argument("--mps-root", default=DEFAULT_MPS_ROOT, metavar="PATH",
                        help="host directory holding one MPS pipe directory per mode, <PATH>/<mode>: the agent's "
                             "--mps-root")
    parser.add_argument("--require-enforcing-node", action=argparse.BooleanOptionalAction, default=False,
                        help="add a required node affinity on gpufrac.io/enforcement.<mode> in (driver, mps)")


def _certs(args: argparse.Namespace) -> int:
    from gpufrac.certs.generate import write_dev_certs
    out = Path(args.out)
    write_dev_certs(out, args.dns or list(DEFAULT_DNS), days=args.days)
    print(f"wrote {out}/ca.crt, {out}/tls.crt, {out}/tls.key")
    return 0


def _webhook(args: argparse.Namespace) -> int:
    from gpufrac.core.bind import host_has_ipv6, resolve_bind
    from gpufrac.webhook.server import ServeOptions, serve

    def bind(text: str) -> str:  # no host: every address of the pod's IP family
        return resolve_bind(text, os.environ.get("POD_IP"), host_has_ipv6()) if text else ""

    serve(_policy(args), ServeOptions(Path(args.certs), bind(args.bind), args.workers, args.threads,
                                      log_level=args.log_level, metrics_bind=bind(args.metrics_bind)),
          args.metrics_dir)
    return 0


def _load_yaml(path: str) -> Any:
    import yaml
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _review(args: argparse.Namespace) -> int:
    from gpufrac.webhook.errors import BadReviewError
    from gpufrac.webhook.offline import review
    from gpufrac.webhook.policy import UserInfo
    try:
        result = review(_load_yaml(args.pod), _load_yaml(args.old) if args.old else None,
                        UserInfo(args.user, tuple(args.group or ())), _policy(args))
    except BadReviewError as exc:
        print(json.dumps({"allowed": False, "message": exc.message}), file=sys.stdout)
        return 2
    print(json.dumps(result.as_dict(), indent=2))
    return 0 if result.allowed else 1


def _agent(args: argparse.Namespace) -> int:
    from gpufrac.agent.cli import run
    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufrac", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    certs = commands.add_parser("certs", help="write a CA and a serving certificate (ca.crt, tls.crt, tls.key)")
    certs_sub = certs.add_subparsers(dest="certs_command")
    certs.add_argument("--out", default="certs/dev", help="directory to write to")
    certs.add_argument("--dns", action="append", metavar="NAME", help="a DNS name or IP to include (repeatable)")
    certs.add_argument("--days", type=int, default=365, help="validity of the serving certificate")
    certs.set_defaults(func=_certs)
    try:
        from gpufrac.certs.rotation import add_rotate_arguments, run_rotate
    except ImportError:
        pass
    else:
        rotate = certs_sub.add_parser("rotate", help="keep the chart's certificate Secret and caBundles current")
        add_rotate_arguments(rotate)
        rotate.set_defaults(func=run_rotate)

    webhook = commands.add_parser("webhook", help="serve the admission webhook over HTTPS")
    webhook.add_argument("--certs", required=True, help="directory with tls.crt and tls.key (re-read on rotation)")
    webhook.add_argument("--bind", default="0.0.0.0:8443", metavar="HOST:PORT",
                         help="admission port (HTTPS); no host (:8443): every address of the pod's IP family")
    webhook.add_argument("--metrics-bind", default="", metavar="HOST:PORT",
                         help="plain-HTTP port serving /metrics (default: none; /metrics is on --bind too)")
    webhook.add_argument("--workers", type=int, default=2)
    webhook.add_argument("--threads", type=int, default=8)
    webhook.add_argument("--log-level", default="info")
    _add_policy_arguments(webhook)
    webhook.set_defaults(func=_webhook)

    review = commands.add_parser("review", help="run a pod through mutation and validation offline")
    review.add_argument("pod", help="Pod manifest (YAML or JSON)")
    review.add_argument("--old", help="the pod before an UPDATE")
    review.add_argument("--user", default="alice", help="username of the requester")
    review.add_argument("--group", action="append", help="group of the requester (repeatable)")
    _add_policy_arguments(review)
    review.set_defaults(func=_review)

    agent = commands.add_parser("agent", help="run the node agent")
    try:
        from gpufrac.agent.cli import add_arguments
    except ImportError:
        pass
    else:
        add_arguments(agent)
    agent.set_defaults(func=_agent)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    metrics_dir = None
    if argv[:1] == ["webhook"]:
        from gpufrac.webhook.server import prepare_metrics_dir
        metrics_dir = prepare_metrics_dir()  # before the parser imports anything that imports prometheus_client
    args = build_parser().parse_args(argv)
    args.metrics_dir = metrics_dir
    return int(args.func(args) or 0)
