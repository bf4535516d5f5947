"""What gpufrac's admission costs the API server, per request kind (issue 34): a plain pod's CREATE, a plain pod's
status write, a fractional pod's CREATE and the binder's UPDATE, through a real kube-apiserver (e2e.cluster.
ControlPlane), with the chart's defaults (webhooks and ValidatingAdmissionPolicies), with the policies off (the two
webhooks alone) and with nothing installed, in alternating rounds on one control plane.

Each cell is one client sending its requests one at a time after a few unmeasured ones (the API server compiles a
re-created policy on first use, and the webhook connection is re-opened); the figure is the kube-apiserver
process's CPU time over the cell divided by its requests (a machine's noise moves wall time far more than CPU
time), beside the p50 latency. Every request must succeed: a refused one is counted as an error, never timed.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.apiserver import _unbind_policies, _unregister, _webhook_names, started_control_plane
from e2e.denial_corpus import BIND_VALUES
from gpufrac.core.contract import FRACTIONAL_LABEL
from testkit.pods import NOTEBOOK

NAMESPACE = "team-a"
BENCH_LABEL = "gpufrac-bench"  # on every pod this section makes: deleted between rounds
SETUPS = ("gpufrac defaults", "policies off", "nothing")
KINDS = ("plain CREATE", "plain status write", "fractional CREATE", "binder UPDATE")
STATUS_POOL = 20  # plain pods whose status is written in turn
WARM_UP = 5
# The targets, as (kind, the most a setup may cost against "nothing", a setup it must stay below).
TARGETS = {"plain CREATE": (1.05, None), "plain status write": (1.05, None), "fractional CREATE": (2.0, "policies off")}


@dataclass
class TaxCell:
    setup: str
    kind: str
    cpu_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    wrong: int = 0  # a fractional CREATE that came back mutated where nothing is installed, or not where it is

    @property
    def cpu_ms(self) -> float:
        return self.cpu_seconds / len(self.latencies) * 1000 if self.latencies else float("nan")

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies) * 1000 if self.latencies else float("nan")


@dataclass
class TaxResult:
    cells: dict[tuple[str, str], TaxCell]
    rounds: int
    requests: int
    server_version: str
    load_before: str
    load_after: str


_names = itertools.count()


def _pod(fractional: bool) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": f"tax-{next(_names)}", "namespace": NAMESPACE, "labels": {BENCH_LABEL: "1"}}
    if fractional:
        metadata["annotations"] = dict(NOTEBOOK)  # the seed notebook: one time-slicing container `app`
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"schedulerName": "kai-scheduler",
                     "containers": [{"name": "app", "image": "nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04",
                                     "command": ["sleep", "infinity"]}]}}


class Requests:
    """The four request kinds, each a call that sends one request; `fractional` collects the fractional pods made,
    which the binder's UPDATEs then bind (one each)."""

    def __init__(self, api: Any, binder: Any, mutated_expected: bool) -> None:
        self.api = api
        self.binder = binder
        self.mutated_expected = mutated_expected
        self.fractional: list[str] = []
        self.status_pool: list[str] = []
        self._turn = itertools.count()
        self.wrong = 0

    def prepare(self) -> None:
        for _ in range(STATUS_POOL):
            body = _pod(False)
            self.api.create_namespaced_pod(NAMESPACE, body, _preload_content=False)
            self.status_pool.append(body["metadata"]["name"])

    def plain_create(self) -> None:
        self.api.create_namespaced_pod(NAMESPACE, _pod(False), _preload_content=False)

    def status_write(self) -> None:
        turn = next(self._turn)
        name = self.status_pool[turn % len(self.status_pool)]
        self.api.patch_namespaced_pod_status(name, NAMESPACE, {"status": {"message": f"bench {turn}"}},
                                             _preload_content=False)

    def fractional_create(self) -> None:
        body = _pod(True)
        data = self.api.create_namespaced_pod(NAMESPACE, body, _preload_content=False).data
        if (FRACTIONAL_LABEL.encode() in data) != self.mutated_expected:
            self.wrong += 1
        self.fractional.append(body["metadata"]["name"])

    def binder_update(self) -> None:
        """What KAI's binder writes at bind: the devices and the memory values, as the scheduler's identity."""
        name = self.fractional.pop()
        self.binder.patch_namespaced_pod(name, NAMESPACE, {"metadata": {"annotations": dict(BIND_VALUES)}},
                                         _preload_content=False)


def _measure(cell: TaxCell, send: Callable[[], None], count: int, cpu: Callable[[], float]) -> None:
    for _ in range(WARM_UP):
        try:
            send()
        except Exception:  # a warm-up refusal shows again below, counted
            pass
    before = cpu()
    for _ in range(count):
        started = time.perf_counter()
        try:
            send()
        except Exception as err:
            cell.errors += 1
            cell.first_error = cell.first_error or " ".join(str(err).split())[:300]
            continue
        cell.latencies.append(time.perf_counter() - started)
    cell.cpu_seconds += cpu() - before


def _switch(setup: str, cp: Any, admission_api: Any, api: Any, names: list[tuple[str, str]]) -> None:
    if setup == "gpufrac defaults":
        cp.policies = True
        cp.apply_webhook_configurations()  # re-creates the configurations, policies and bindings; waits for both
    elif setup == "policies off":
        cp.policies = False
        cp.apply_webhook_configurations()  # the validating webhook called on a pod's CREATE and pods/status again
        _unbind_policies(cp, admission_api)
    else:
        _unregister(cp, admission_api, api, names)
        _unbind_policies(cp, admission_api)
    time.sleep(2)  # the validating configuration comes by its own informer


def _round(r: int, cells: dict[tuple[str, str], TaxCell], clients: tuple[Any, Any], cp: Any, admission_api: Any,
           names: list[tuple[str, str]], count: int) -> None:
    api, binder = clients
    cpu = cp.procs["kube-apiserver"].cpu_seconds
    order = SETUPS[r % 3:] + SETUPS[:r % 3]  # rotate: no setup always comes first, none comes twice in a row
    for setup in order:
        _switch(setup, cp, admission_api, api, names)
        requests = Requests(api, binder, mutated_expected=setup != "nothing")
        requests.prepare()
        sends = {"plain CREATE": requests.plain_create, "plain status write": requests.status_write,
                 "fractional CREATE": requests.fractional_create, "binder UPDATE": requests.binder_update}
        for kind in KINDS:
            cell = cells.setdefault((setup, kind), TaxCell(setup, kind))
            _measure(cell, sends[kind], count, cpu)
            cell.wrong += requests.wrong if kind == "fractional CREATE" else 0
        print(f"[bench] tax round {r + 1} {setup}: " + ", ".join(
            f"{k} {cells[(setup, k)].cpu_ms:.2f} ms" for k in KINDS), file=sys.stderr, flush=True)
        api.delete_collection_namespaced_pod(NAMESPACE, label_selector=BENCH_LABEL, grace_period_seconds=0)


def run(*, requests: int, rounds: int, workdir: Path) -> TaxResult | str:
    """`requests` per cell and round: the binder's UPDATEs bind the fractional pods the round made, so at most
    `requests` + the warm-up of them."""
    from kubernetes import client, config

    from bench import machine

    cp = started_control_plane(workdir)
    if isinstance(cp, str):
        return cp
    try:
        def api_for(user: str) -> Any:
            configuration = client.Configuration()
            config.load_kube_config(config_file=str(cp.kubeconfigs[user]), client_configuration=configuration)
            return client.ApiClient(configuration)

        admin = api_for("admin")
        api, binder = client.CoreV1Api(admin), client.CoreV1Api(api_for("binder"))
        admission_api = client.AdmissionregistrationV1Api(admin)
        names = _webhook_names(cp.workdir / "webhook-configurations.yaml")
        load_before = machine.load_average()
        cells: dict[tuple[str, str], TaxCell] = {}
        for r in range(rounds):
            _round(r, cells, (api, binder), cp, admission_api, names, requests)
        return TaxResult(cells, rounds, requests, cp.server_version, load_before, machine.load_average())
    finally:
        cp.stop()


def _ratio(cell: TaxCell, base: TaxCell | None) -> float:
    return cell.cpu_ms / base.cpu_ms if base is not None and base.cpu_ms else float("nan")


def target_rows(result: TaxResult) -> list[tuple[str, str, bool]]:
    """(kind, the target in words, met) for each of the issue's targets."""
    rows = []
    for kind, (most, below) in TARGETS.items():
        defaults, nothing = result.cells[("gpufrac defaults", kind)], result.cells[("nothing", kind)]
        ratio = _ratio(defaults, nothing)
        met = ratio <= most
        words = f"defaults ≤ {most:g}× nothing (×{ratio:.2f})"
        if below is not None:
            other = result.cells[(below, kind)]
            met = met and defaults.cpu_ms < other.cpu_ms
            words += f" and < {below} ({defaults.cpu_ms:.2f} vs {other.cpu_ms:.2f} ms)"
        rows.append((kind, words, met))
    return rows


def markdown(result: TaxResult | str | None) -> str:
    if result is None:
        return ""
    lines = ["## Admission's cost to the API server, per request (issue 34)", ""]
    if isinstance(result, str):
        return "\n".join([*lines, result])
    lines += [f"kube-apiserver {result.server_version}, {result.rounds} rounds of {result.requests} requests per "
              f"cell, one client, setups alternating; load average {result.load_before} before, {result.load_after} "
              "after. CPU: the kube-apiserver process's user + system time per request.", "",
              "| request | setup | API server CPU ms / request | × nothing | p50 ms | errors |",
              "|---|---|---|---|---|---|"]
    for kind in KINDS:
        nothing = result.cells.get(("nothing", kind))
        for setup in SETUPS:
            cell = result.cells[(setup, kind)]
            errors = f"{cell.errors} ({cell.first_error[:80]})" if cell.errors else "0"
            if cell.wrong:
                errors += f", {cell.wrong} mutated wrongly"
            lines.append(f"| {kind} | {setup} | {cell.cpu_ms:.2f} | {_ratio(cell, nothing):.2f} | "
                         f"{cell.p50_ms:.1f} | {errors} |")
    lines += ["", "| target | met |", "|---|---|"]
    lines += [f"| {kind}: {words} | {'yes' if met else '**no**'} |" for kind, words, met in target_rows(result)]
    return "\n".join(lines)


if __name__ == "__main__":  # a quick look: python -m bench.admission_tax
    print(markdown(run(requests=50, rounds=1, workdir=Path(".e2e/bench-tax"))))
