"""Row 1, the inventory (NVML, the driver, the GPUs, the MPS control binary, CUDA, unshare), and row 1c: CUDA's device
facts and the spin kernel's calibration without MPS."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from typing import Any

from gpucheck.client_process import ClientError
from gpucheck.contract import MIB, has_driver_memory_limits, modes_to_serve
from gpucheck.nvml import Nvml, NvmlError
from gpucheck.rows import FAIL, PASS, Row
from gpucheck.session import Session


class Inventory:
    def __init__(self, session: Session) -> None:
        self.s = session

    def run(self) -> None:
        s, node, args = self.s, self.s.node, self.s.args
        inv: dict[str, Any] = {"nvml_library": args.nvml}
        s.raw["inventory"] = inv
        node.mps_control = args.mps_control if args.mps_control else shutil.which("nvidia-cuda-mps-control")
        if node.mps_control and not os.access(node.mps_control, os.X_OK):
            inv["mps_control_problem"] = f"{node.mps_control} is not executable"
            node.mps_control = None
        inv["mps_control"] = node.mps_control
        self.find_cuda(inv)
        self.find_unshare(inv)
        try:
            gpus = self.read_nvml(inv)
        except (OSError, AttributeError, NvmlError) as err:
            s.add(Row("1", "inventory", FAIL, f"NVML unusable ({args.nvml}): {err}", inv))
            return
        if not gpus:
            s.add(Row("1", "inventory", FAIL, f"NVML reports no GPUs (driver {inv['driver_version']})", inv))
            return
        if args.gpu >= len(gpus):
            s.add(Row("1", "inventory", FAIL, f"--gpu {args.gpu}: the node has {len(gpus)} GPU(s)", inv))
            return
        gpu = gpus[args.gpu]
        assert node.nvml is not None
        node.handle = node.nvml.handle(args.gpu)
        node.gpu_uuid, node.gpu_total_mib, node.compute_mode = gpu["uuid"], gpu["memory_total_mib"], gpu[
            "compute_mode"]
        node.served = modes_to_serve(node.driver_limits) if node.mps_control else ()
        details = self.describe(inv, gpus, gpu)
        s.add(Row("1", "inventory", PASS if node.mps_control else FAIL, "; ".join(details), inv))

    def read_nvml(self, inv: dict[str, Any]) -> list[dict[str, Any]]:
        """The driver, its CUDA version and every GPU, as NVML reports them (into inv); the node's NVML handle."""
        node = self.s.node
        nvml = node.nvml = Nvml(self.s.args.nvml)
        nvml.init()
        inv["driver_version"] = nvml.driver_version()
        inv["cuda_driver_version"] = nvml.cuda_driver_version()
        gpus = []
        for index in range(nvml.device_count()):
            handle = nvml.handle(index)
            memory = nvml.memory(handle)
            try:
                processes: Any = sorted(nvml.processes(handle))
            except NvmlError as err:
                processes = str(err)
            gpus.append({"index": index, "uuid": nvml.uuid(handle), "name": nvml.name(handle),
                         "memory_total_mib": memory.total // MIB, "memory_used_mib": memory.used // MIB,
                         "compute_mode": nvml.compute_mode(handle), "mig": nvml.mig_enabled(handle),
                         "processes": processes})
        inv["gpus"] = gpus
        node.driver_limits = has_driver_memory_limits(inv["driver_version"], inv["cuda_driver_version"])
        inv["driver_memory_limits"] = node.driver_limits
        inv["nvml_memory_limits_api"] = nvml.has("nvmlDeviceSetMemoryLimits_v1")
        return gpus

    def describe(self, inv: dict[str, Any], gpus: list[dict[str, Any]], gpu: dict[str, Any]) -> list[str]:
        node = self.s.node
        cuda_text = f"{inv['cuda_driver_version'] // 1000}.{inv['cuda_driver_version'] % 1000 // 10}"
        names = ", ".join(f"{g['index']}: {g['name']} {g['memory_total_mib']} MiB" for g in gpus)
        details = [f"{len(gpus)} GPU(s) [{names}]; driver {inv['driver_version']}, CUDA {cuda_text}",
                   f"CUDA 13.4 memory limits: {'yes' if node.driver_limits else 'no'}"
                   f" (NVML setter {'present' if inv['nvml_memory_limits_api'] else 'absent'})",
                   f"MPS control: {node.mps_control or 'not found'}",
                   f"compute mode {gpu['compute_mode'] or 'unknown'}",
                   f"checking GPU {self.s.args.gpu} ({gpu['uuid']})"]
        if gpu["mig"]:
            details.append("MIG is enabled (memory limits do not apply to MIG)")
        if gpu["compute_mode"] == "Exclusive_Process" and len(node.served) > 1:
            details.append("WARNING: EXCLUSIVE_PROCESS lets one MPS server at a time use the GPU: the second "
                           "daemon's checks may fail for that reason alone")
        if isinstance(gpu["processes"], str):
            details.append(f"NVML process list unavailable: {gpu['processes']}")
        elif gpu["processes"]:
            details.append(f"WARNING: {len(gpu['processes'])} compute process(es) already on it: timings and "
                           "memory numbers assume an idle GPU")
        if node.cuda_path is None:
            details.append(f"CUDA: {node.cuda_reason}")
        if not node.mps_control:
            details.append("nvidia-cuda-mps-control not found (PATH or --mps-control)")
        return details

    def find_cuda(self, inv: dict[str, Any]) -> None:
        node, path = self.s.node, self.s.args.cuda
        if path == "none":
            node.cuda_reason = node.cuda_short = "disabled with --cuda none"
            return
        try:
            ctypes.CDLL(path)  # only dlopen here: the parent never initializes CUDA
            node.cuda_path = path
        except OSError as err:
            node.cuda_reason = f"{path} cannot be loaded ({err})"
            node.cuda_short = f"{path} cannot be loaded"
        inv["cuda_library"] = node.cuda_path

    def find_unshare(self, inv: dict[str, Any]) -> None:
        node = self.s.node
        unshare = shutil.which("unshare")
        if unshare is None:
            node.unshare_reason = "unshare (util-linux) not found"
        else:
            try:
                probe = subprocess.run([unshare, "--mount", "--ipc", "--pid", "--fork", "--mount-proc", "true"],
                                       capture_output=True, text=True, timeout=15, check=False)
                if probe.returncode == 0:
                    node.unshare = unshare
                else:
                    node.unshare_reason = f"unshare is not permitted here: {probe.stderr.strip()[:160]}"
            except (OSError, subprocess.TimeoutExpired) as err:
                node.unshare_reason = f"unshare failed: {err}"
        inv["unshare"] = node.unshare or node.unshare_reason

    def cuda_setup(self) -> None:
        """Row 1c (only when it fails): a plain CUDA client's device facts, and the spin kernel's calibration."""
        s, node = self.s, self.s.node
        if node.cuda_path is None:
            return
        client = s.start_client("calibrate", {"action": "calibrate", "target_s": s.args.spin_seconds},
                                s.client_env(s.no_mps_dir))
        try:
            readies, results = s.group([client], result_timeout=s.args.spin_seconds * 20 + 60)
            node.device, node.calibration = readies[0], results[0]
            s.raw["cuda"] = {"device": node.device, "calibration": node.calibration}
            s.log(f"CUDA: {node.device['name']}, sm_{node.device['cc_major']}{node.device['cc_minor']}, "
                  f"{node.device['sm_count']} SMs, kernel as {node.device['ptx_target']}; "
                  f"{node.calibration['iterations']} iterations spin {node.calibration['solo_s']:.2f}s alone")
        except ClientError as err:
            node.cuda_reason = node.cuda_short = f"CUDA does not work without MPS: {err}"
            node.device = {}
            s.add(Row("1c", "CUDA without MPS", FAIL, str(err), {"event": err.event}))
        finally:
            client.close()
