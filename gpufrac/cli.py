"""The `gpufrac` command: certs, webhook, review, agent, agent-withdraw, mps, node-check.

Every flag can also be set from the environment, as `GPUFRAC_<FLAG>` (`--log-level` is `GPUFRAC_LOG_LEVEL`); a
flag on the command line wins. `--help` of each command lists every flag with its default and its variable.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpufrac.core.annotations import ComputeMode
from gpufrac.core.argtypes import positive_int
from gpufrac.core.buildinfo import version
from gpufrac.core.contract import DEFAULT_DRIVER_NAME, DEFAULT_MPS_ROOT, DEFAULT_SCHEDULER_USER, Delivery
from gpufrac.core.jsonlog import add_log_arguments
from gpufrac.flags import FlagParser, apply_environment

if TYPE_CHECKING:
    from gpufrac.webhook.decide.policy import Policy
    from gpufrac.webhook.serve.server import ServeOptions

DEFAULT_DNS = ("gpufrac-webhook", "gpufrac-webhook.gpufrac-system", "gpufrac-webhook.gpufrac-system.svc")
DEFAULT_CERTS_OUT = "certs/dev"


# ---- the commands ----


def _policy(args: argparse.Namespace) -> Policy:  # imported lazily: `gpufrac agent` stays light
    from gpufrac.webhook.decide.policy import Policy
    return Policy(
        scheduler_users=frozenset(args.scheduler_user or (DEFAULT_SCHEDULER_USER,)),
        scheduler_groups=frozenset(args.scheduler_group or ()),
        mps_root=args.mps_root,
        require_enforcing_node=args.require_enforcing_node,
        allow_multiple_fraction_containers=args.allow_multiple_fraction_containers,
        keep_off_reclaimed_nodes=args.keep_off_reclaimed_nodes,
        delivery=Delivery(args.delivery),
        csi_driver=args.csi_driver,
        default_mode=ComputeMode(args.default_mode) if args.default_mode else None,
    )


def _add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scheduler-user", action="append", metavar="NAME",
                        help="identity allowed to write bind-time values (repeatable; default "
                             f"{DEFAULT_SCHEDULER_USER})")
    parser.add_argument("--scheduler-group", action="append", metavar="GROUP",
                        help="group whose members may write bind-time values (repeatable)")
    parser.add_argument("--mps-root", default=DEFAULT_MPS_ROOT, metavar="PATH",
                        help="host directory holding one MPS pipe directory per mode, <PATH>/<mode>, and the daemons' "
                             "shared memory, <PATH>/shm: the agent's --mps-root")
    parser.add_argument("--delivery", choices=[str(d) for d in Delivery], default=str(Delivery.CSI),
                        help="how fractional containers get the MPS directories: csi (an inline volume served by "
                             "the node agent; Pod Security baseline allows it) or hostPath (needs a privileged "
                             "namespace)")
    parser.add_argument("--csi-driver", default=DEFAULT_DRIVER_NAME, help="the agent's CSI driver (delivery csi)")
    parser.add_argument("--default-mode", choices=["", *(str(m) for m in ComputeMode)], default="",
                        help="the compute mode written on CREATE for a fraction that names none (where the nodes' "
                             "drivers enforce sm-sharing only, before r615); '': none written, KAI's time-slicing")
    parser.add_argument("--require-enforcing-node", action=argparse.BooleanOptionalAction, default=False,
                        help="add a required node affinity on gpufrac.io/enforcement.<mode> in (driver, mps)")
    parser.add_argument("--keep-off-reclaimed-nodes", action=argparse.BooleanOptionalAction, default=False,
                        help="give a controller's fractional pods a node affinity that the agent's reclaim back-off "
                             "label fails (the chart sets it where reclaim.policy is evict and reclaim.backoffSeconds "
                             "> 0)")
    parser.add_argument("--allow-multiple-fraction-containers", action=argparse.BooleanOptionalAction,
                        default=False, help="admit pods in which several containers hold a fraction (KAI's binder "
                                            "binds one per pod; only for a binder that binds each)")


def _certs(args: argparse.Namespace) -> int:
    from gpufrac.certs.generate import write_dev_certs
    out = Path(args.out or DEFAULT_CERTS_OUT).resolve()
    write_dev_certs(out, args.dns or list(DEFAULT_DNS), days=args.days)
    print(f"wrote {out}/ca.crt, {out}/tls.crt, {out}/tls.key" +
          ("" if args.out else f" (no --out: the default, {DEFAULT_CERTS_OUT} in the current directory)"))
    return 0


def port_in_use(bind: str) -> bool:
    """Whether another process listens on HOST:PORT already (gunicorn would retry, then fail with a traceback)."""
    from gpufrac.core.bind import split_bind
    host, port = split_bind(bind)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            probe.bind((host, int(port)))
        except OSError as err:
            return err.errno == errno.EADDRINUSE
    return False


def _webhook(args: argparse.Namespace) -> int:
    from gpufrac.core.bind import host_has_ipv6, resolve_bind
    from gpufrac.webhook.serve.server import ServeOptions, serve

    def bind(text: str) -> str:  # no host: every address of the pod's IP family
        return resolve_bind(text, os.environ.get("POD_IP"), host_has_ipv6()) if text else ""

    for flag, address in (("--bind", bind(args.bind)), ("--metrics-bind", bind(args.metrics_bind))):
        if address and port_in_use(address):
            print(f"gpufrac webhook: {address} is already in use (another webhook running?); choose another "
                  f"with {flag} HOST:PORT (make run: BIND=127.0.0.1:8444)", file=sys.stderr)
            return 2
    serve(_policy(args), ServeOptions(Path(args.certs), bind(args.bind), args.workers, args.threads,
                                      log_level=args.log_level, log_format=args.log_format,
                                      metrics_bind=bind(args.metrics_bind)),
          args.metrics_dir)
    return 0


def _review(args: argparse.Namespace) -> int:
    """Exit 0: every manifest allowed; 1: something denied; 2: the input could not be reviewed (one line on
    stderr naming the file and the problem)."""
    from gpufrac.webhook.decide.policy import UserInfo
    from gpufrac.webhook.offline import UnreadableError, review_files
    try:
        results = review_files(args.manifests, args.old, UserInfo(args.user, tuple(args.group or ())),
                               _policy(args), sys.stdin)
    except UnreadableError as exc:
        print(f"gpufrac review: {exc}", file=sys.stderr)
        return 2
    code = 0 if all(r["allowed"] for r in results) else 1
    try:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=2))
        sys.stdout.flush()
    except BrokenPipeError:  # `gpufrac review x.yaml | head`: the reader left; the exit code still says it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


def _policies(args: argparse.Namespace) -> int:
    from gpufrac.webhook.render import policies
    if args.format == "helm":
        sys.stdout.write(policies.render_helm())
    elif args.format == "docs":
        sys.stdout.write(policies.rule_table_markdown())
    else:
        objects = policies.policy_objects(_policy(args), actions=args.action or ("Deny",),
                                          excluded_namespaces=args.exclude_namespace or ("kube-system",))
        sys.stdout.write(policies.render_yaml(objects))
    return 0


def _agent(args: argparse.Namespace) -> int:
    from gpufrac.agent.programs.node_agent import run
    return run(args)


def _agent_withdraw(args: argparse.Namespace) -> int:
    from gpufrac.agent.programs.withdraw import run
    return run(args)


def _mps_roll(args: argparse.Namespace) -> int:
    from gpufrac.agent.programs.mps_roll import run
    return run(args)


def _mps(args: argparse.Namespace) -> int:
    from gpufrac.agent.programs.mps_service import run
    return run(args)


def _node_check(args: argparse.Namespace) -> int:
    """Exit 0: every enabled mode is enforceable here; 1: not; 2: bad input (argparse)."""
    from gpufrac.agent.decide.node_check import node_check, render_table
    from gpufrac.agent.edges.node_facts import Where, gather
    where = Where(modes=args.modes, nri_enabled=args.nri, nri_socket=args.nri_socket,
                  cdi_dirs=tuple(args.cdi_spec_dir or Where.cdi_dirs), containerd=args.containerd,
                  cri_socket=args.cri_socket, crictl=args.crictl, mps_binary=args.mps_binary,
                  mps_root=args.mps_root, cgroup_root=args.cgroup_root, toolkit_config=args.toolkit_config)
    report = node_check(gather(where))
    sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n" if args.json else render_table(report))
    return 0 if report.ok else 1


def _check_modes(text: str) -> tuple[ComputeMode, ...]:
    try:
        modes = tuple(ComputeMode(m.strip()) for m in text.split(",") if m.strip())
    except ValueError:
        modes = ()
    if not modes:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of {', '.join(ComputeMode)}")
    return modes


def _add_node_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    parser.add_argument("--modes", type=_check_modes, default=",".join(ComputeMode), metavar="MODE,…",
                        help="the compute modes the agent serves here (its --modes, the chart's agent.modes)")
    parser.add_argument("--nri", action=argparse.BooleanOptionalAction, default=True,
                        help="the agent runs its NRI plugin (the chart's nri.enabled)")
    parser.add_argument("--nri-socket", type=Path, default=Path("/var/run/nri/nri.sock"), metavar="PATH",
                        help="the runtime's NRI socket (the chart's nri.socketPath)")
    parser.add_argument("--cdi-spec-dir", type=Path, action="append", metavar="PATH",
                        help="a directory of CDI specs, as the runtime's cdi_spec_dirs (repeatable; default "
                             "/etc/cdi, /var/run/cdi)")
    parser.add_argument("--containerd", default="containerd", metavar="PATH",
                        help="the containerd binary whose --version is read (without --cri-socket)")
    parser.add_argument("--cri-socket", type=Path, metavar="PATH",
                        help="read the runtime's name and version from its CRI socket through crictl instead "
                             "(e.g. /run/containerd/containerd.sock)")
    parser.add_argument("--crictl", default="crictl", metavar="PATH", help="the crictl binary (with --cri-socket)")
    parser.add_argument("--mps-binary", default="nvidia-cuda-mps-control", metavar="PATH",
                        help="the MPS control daemon executable (a name is looked up on PATH)")
    parser.add_argument("--mps-root", type=Path, default=Path(DEFAULT_MPS_ROOT), metavar="PATH",
                        help="the agent's --mps-root: where each mode's control socket is while its daemon runs")
    parser.add_argument("--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"), metavar="PATH",
                        help="where the host's cgroups are mounted")
    parser.add_argument("--toolkit-config", type=Path, default=Path("/etc/nvidia-container-runtime/config.toml"),
                        metavar="PATH", help="NVIDIA container toolkit's config (its envvar setting)")


def _serve_defaults() -> type[ServeOptions]:
    from gpufrac.webhook.serve.server import ServeOptions
    return ServeOptions  # its class attributes are the defaults


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `command`, only that subcommand gets its arguments: `gpufrac webhook` then
    imports neither the agent nor the Kubernetes client (tens of MiB in each worker)."""
    parser = FlagParser(prog="gpufrac", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gpufrac {version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    def subcommand(name: str, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text)
        return parser

    certs = subcommand("certs", "write a CA and a serving certificate (ca.crt, tls.crt, tls.key) for development")
    certs.add_argument("--out", metavar="DIR",
                       help=f"directory to write to (default: {DEFAULT_CERTS_OUT} in the current directory)")
    certs.add_argument("--dns", action="append", metavar="NAME",
                       help=f"a DNS name or IP the serving certificate names (repeatable; default "
                            f"{', '.join(DEFAULT_DNS)})")
    certs.add_argument("--days", type=positive_int, default=365, help="validity of the serving certificate")
    certs.set_defaults(func=_certs)
    if command in (None, "certs"):
        from gpufrac.certs.rotation import add_rotate_arguments, run_rotate
        rotate = certs.add_subparsers(dest="certs_command").add_parser(
            "rotate", help="keep the chart's certificate Secret and caBundles current")
        add_rotate_arguments(rotate)
        rotate.set_defaults(func=run_rotate)

    webhook = subcommand("webhook", "serve the admission webhook over HTTPS")
    serve_defaults = _serve_defaults() if command in (None, "webhook") else None
    webhook.add_argument("--certs", required=True, metavar="DIR",
                         help="directory with tls.crt and tls.key (re-read when they change)")
    webhook.add_argument("--bind", default="0.0.0.0:8443", metavar="HOST:PORT",
                         help="admission port (HTTPS); no host (:8443): every address of the pod's IP family")
    webhook.add_argument("--metrics-bind", default="", metavar="HOST:PORT",
                         help="plain-HTTP port serving /metrics (default: none; /metrics is on --bind too)")
    webhook.add_argument("--workers", type=positive_int, metavar="N", help="worker processes",
                         default=serve_defaults and serve_defaults.workers)
    webhook.add_argument("--threads", type=positive_int, metavar="N", help="reviews each worker answers at once",
                         default=serve_defaults and serve_defaults.threads)
    add_log_arguments(webhook, stream="stdout")
    _add_policy_arguments(webhook)
    webhook.set_defaults(func=_webhook)

    review = subcommand("review", "review manifests offline as the API server would: pods through both webhooks, "
                                  "workloads' pod templates through the validating one")
    review.add_argument("manifests", nargs="+", metavar="FILE",
                        help="YAML or JSON, any number of documents: Pod, Deployment, StatefulSet, DaemonSet, "
                             "ReplicaSet, Job, CronJob, PodTemplate (or a List of them); - for standard input")
    review.add_argument("--old", metavar="FILE", help="the object before an UPDATE (one document, as the manifest; "
                                                      "default: none, a CREATE)")
    review.add_argument("--user", default="alice", help="username of the requester")
    review.add_argument("--group", action="append", help="group of the requester (repeatable)")
    _add_policy_arguments(review)
    review.set_defaults(func=_review)

    policies = subcommand("policies", "write the ValidatingAdmissionPolicies (and Bindings) generated from the "
                                      "webhook's rule table: the deny rules CEL can carry, run by the API server")
    policies.add_argument("--format", choices=("yaml", "helm", "docs"), default="yaml",
                          help="yaml: the objects for this configuration; helm: the chart's template "
                               "(charts/gpufrac/templates/policies/); docs: which rule runs where, as a table")
    policies.add_argument("--action", action="append", choices=("Deny", "Warn", "Audit"),
                          help="the Bindings' validationActions (repeatable; default Deny)")
    policies.add_argument("--exclude-namespace", action="append", metavar="NAME",
                          help="a namespace the policies skip (repeatable; default kube-system)")
    _add_policy_arguments(policies)
    policies.set_defaults(func=_policies)

    agent = subcommand("agent", "run the node agent (one per GPU node)")
    if command in (None, "agent"):
        from gpufrac.agent.programs.node_agent import add_arguments
        add_arguments(agent)
    agent.set_defaults(func=_agent)

    withdraw = subcommand("agent-withdraw", "before an uninstall (the chart's pre-delete hook): stop the agents, "
                                            "remove their node labels and conditions, stop the MPS daemons")
    if command in (None, "agent-withdraw"):
        from gpufrac.agent.programs.withdraw import add_arguments as add_withdraw_arguments
        add_withdraw_arguments(withdraw)
    withdraw.set_defaults(func=_agent_withdraw)

    mps = subcommand("mps", "run one compute mode's MPS control daemon, supervised (the <release>-mps DaemonSet)")
    if command in (None, "mps"):
        from gpufrac.agent.programs.mps_service import add_arguments as add_mps_arguments
        add_mps_arguments(mps)
    mps.set_defaults(func=_mps)

    mps_roll = subcommand("mps-roll", "after an upgrade, move each node's MPS pod to the new image, node by node: "
                                      "cordon, wait for (or evict, or list) its fractional pods, replace the MPS "
                                      "pod, uncordon")
    if command in (None, "mps-roll"):
        from gpufrac.agent.programs.mps_roll import add_arguments as add_mps_roll_arguments
        add_mps_roll_arguments(mps_roll)
    mps_roll.set_defaults(func=_mps_roll)
    node_check = subcommand("node-check", "say what this node can enforce and, for what it cannot, why and what "
                                          "to do: runtime, NRI, CDI specs, driver, MPS, toolkit, cgroups (exit 0: "
                                          "every enabled mode is enforceable, 1: not)")
    _add_node_check_arguments(node_check)
    node_check.set_defaults(func=_node_check)
    apply_environment(parser, os.environ)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    metrics_dir = None
    command = argv[0] if argv and not argv[0].startswith("-") else None
    if command == "webhook":
        from gpufrac.webhook.serve.server import prepare_metrics_dir
        metrics_dir = prepare_metrics_dir()  # before the parser imports anything that imports prometheus_client
    args = build_parser(command).parse_args(argv)
    args.metrics_dir = metrics_dir
    return int(args.func(args) or 0)
