"""gRPC stubs generated for a test or a benchmark from one .proto, into a directory of its own (nothing generated
is committed), and imported from there."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType


def stubs_from(proto: Path, out: Path, stub: str) -> tuple[ModuleType, ModuleType]:
    """(messages, services): `proto` copied to `out` as `<stub>.proto` and compiled with grpcio-tools, once per
    `out`; `out` joins sys.path so that the services module finds its messages."""
    if not (out / f"{stub}_pb2_grpc.py").exists():
        out.mkdir(parents=True, exist_ok=True)
        copy = out / f"{stub}.proto"
        if copy.resolve() != proto.resolve():  # a caller may have fetched it there already
            copy.write_bytes(proto.read_bytes())
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{out}", f"--python_out={out}",
                        f"--grpc_python_out={out}", str(out / f"{stub}.proto")], check=True)
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module(f"{stub}_pb2"), importlib.import_module(f"{stub}_pb2_grpc")
