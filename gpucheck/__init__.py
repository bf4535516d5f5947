"""The GPU check: gpu_check.py is one stdlib-only file a person copies to a GPU node (docs/gpu-check.md); this
package only lets the tests import it."""
