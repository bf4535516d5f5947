"""gpufrac's hardware check: proves on a real GPU node, in under ten minutes, what gpufrac promises.

Built into one file, gpu_check.pyz (`make gpu-check-pyz`, gpucheck/build.py: this package as a zipapp), that a person
copies to a GPU node and runs as root with `python3 gpu_check.pyz` (docs/gpu-check.md); from a checkout,
`bash gpucheck/gpu_check.sh` or `make gpu-check`. It needs only python3 (3.8+) and its standard library, and the
NVIDIA driver: the CUDA driver API (libcuda.so.1) and NVML (libnvidia-ml.so.1) through ctypes, and a tiny kernel given
to the driver as PTX text, so nothing is compiled or installed. It starts its own MPS control daemons (one per compute
mode, in the directory layout gpufrac's agent uses, under a scratch directory), runs CUDA clients as subprocesses of
itself (`gpu_check.pyz --client ...`, each with its own context and environment), and stops the daemons at the end
whatever happens. It prints one table (PASS / FAIL / SKIPPED with the reason and the numbers) and writes it, with the
raw numbers, to --out (JSON) and --out's .txt twin. Exit status: 0 only when no check FAILed.

Checks (docs/gpu-check.md says how to read them):
  1   inventory: GPUs, memory, driver, MPS control binary, whether the driver has the CUDA 13.4 memory limits
  2x  MPS pinned limit: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, as gpufrac formats it, holds two clients to their limits
  3x  CUDA 13.4 limits: NVIDIA_GPU_MEMORY_REQUEST/LIMIT applied to a cgroup as the toolkit hook does, held
  4x  compute modes: two spinning clients finish together under sm-sharing, take turns without MPS
  5x  pods: sm-sharing clients in their own mount/IPC/PID namespaces, seeing only the delivered directories
  6x  attribution: NVML's per-process memory and utilization name the client processes, not the MPS server; and
      which of the two this driver charges an MPS client's memory to
  7   the MPS daemons started, and stopped on `quit`
  8x  the runtime (crictl, containerd 2 with NRI and CDI, gpufrac's NRI plugin): a fraction named by its CDI device sees
      exactly its GPU and gets the CUDA 13.4 limits on its cgroup; a plain pod asking for every GPU by env sees none

Modules: the contract restated (contract), the judgements (judge), NVML, CUDA and the PTX kernel through ctypes (nvml,
cuda, ptx), the client subprocess (client/), the processes the parent runs (client_process, mps_daemon, processes),
what the checks share (session, rows), one module per group of checks (checks/), their order and cleanup (run), the
table and report (report), and the command line (cli).
"""
