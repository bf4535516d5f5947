#!/usr/bin/env bash
# gpufrac's hardware check (gpucheck/gpu_check.py): needs only python3 and the NVIDIA driver. Run it as root on an idle
# GPU node; arguments go to the script (`bash gpucheck/gpu_check.sh --help`). Exit status 0 only when no check FAILed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${PYTHON:-python3}" "$here/gpu_check.py" "$@"
