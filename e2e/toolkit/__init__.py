"""The harness toolkit that e2e/, bench/ and tests/ share, one module per job:

- `procs`: child processes in their own session, known by pid + start time; `free_port`; stopping a group.
- `wait`: the one polling helper (`wait_until`).
- `server`: the one server-process wrapper: spawn, poll a readiness check, fail with the log's tail.
- `web`: HTTPS GETs against the cluster's and the webhook's CAs.
- `tools`: where the Kubernetes binaries built by e2e/build-tools.sh and kubectl are.
- `pki`: the cluster's CA, serving certificates, tokens and kubeconfigs.
- `objects`: the bootstrap objects, read from the YAML files in `bootstrap/`.
- one module per component (`etcd`, `apiserver`, ...): its command line and its readiness check.

Adding a component is adding its module and listing it in the orchestration (e2e/cluster.py, e2e/node.py).
"""
