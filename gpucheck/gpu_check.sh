#!/usr/bin/env bash
# gpufrac's hardware check from a checkout (the package gpucheck/, as `python3 -m gpucheck`; on a node without the
# checkout, the one file `make gpu-check-pyz` builds): needs only python3 and the NVIDIA driver. Run it as root on an
# idle GPU node; arguments go to the check (`bash gpucheck/gpu_check.sh --help`). Exit status 0 only when no check
# FAILed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${PYTHON:-python3}" "$here/__main__.py" "$@"
