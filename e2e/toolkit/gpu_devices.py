"""The node's fake GPU device nodes, with the numbers NVIDIA's driver gives them.

/dev/nvidia0..N-1 (one per GPU of the fake NVML, in its index order), /dev/nvidiactl and /dev/nvidia-modeset are
character devices of the driver's fixed major 195 (minors 0..N-1, 255 for nvidiactl, 254 for nvidia-modeset),
/dev/nvidia-uvm and /dev/nvidia-uvm-tools of UVM_MAJOR (minors 0 and 1), made with mknod on the host's /dev
(where containerd, runc and NVIDIA's tools look them up) and removed on the way out. No driver answers to these
numbers here, so a process that may open one gets ENXIO ("No such device or address"), one the container's device
cgroup does not allow gets EPERM: a test tells a granted device from a leaked device node (PROBE_COMMAND).
/dev/null's numbers (1:3), used before, are always allowed by runc and could not tell.

Never on a machine with an NVIDIA driver: `create` refuses where a driver is loaded (/proc/driver/nvidia, or
an `nvidia*` entry in /proc/devices), where another driver registered one of the majors, or where a path holds
something else; `remove` removes only nodes with exactly our numbers, and nothing while a driver is loaded.

The CDI specs naming these nodes are not written here: `nvidia-ctk cdi generate` writes them against the fake
NVML (e2e.toolkit.nvidia_toolkit).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from e2e.toolkit.errors import ClusterError

NVIDIA_MAJOR = 195  # the driver's fixed major (the kernel's devices.txt: "195 char Nvidia graphics devices")
CTL_MINOR = 255  # /dev/nvidiactl
MODESET_MINOR = 254  # /dev/nvidia-modeset
# nvidia-uvm registers a dynamic major (alloc_chrdev_region). 510 lies in the kernel's second dynamic range
# (384..511), which it hands out from 511 downwards only once 234..254 are used up, so no driver of a machine like
# this one holds it (`create` checks /proc/devices); the same number as the fake driver root's
# (testkit.fakes.driver_root.UVM_MAJOR).
UVM_MAJOR = 510
# What an older harness made (/dev/null's numbers): never a driver's, removed on sight.
OLD_FAKE = (1, 3)
CONTROL_DEVICES = ("nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools")
PROC = Path("/proc")
# A command for a container: each NVIDIA device node it has, as `<name> <major>:<minor> <open result>`,
# where the open result is `ok`, `ENXIO` (the device cgroup allows the device: granted) or `EPERM` (denied).
# busybox has no errno output, so the message tells them apart.
PROBE_COMMAND = (
    "for d in /dev/nvidia*; do [ -e \"$d\" ] || continue; "
    "r=$( (: < \"$d\") 2>&1 ); case \"$r\" in '') r=ok;; *'not permitted'*) r=EPERM;; "
    "*'No such device'*) r=ENXIO;; *) r=\"other:$r\";; esac; "
    "echo \"DEV ${d#/dev/} $(stat -c '%t:%T' \"$d\") $r\"; done"
)


def gpu_device(index: int, dev: Path = Path("/dev")) -> Path:
    return dev / f"nvidia{index}"


def numbers(count: int) -> dict[str, tuple[int, int]]:
    """{device name under /dev: (major, minor)}: the GPUs', then the control devices'."""
    nums = {f"nvidia{i}": (NVIDIA_MAJOR, i) for i in range(count)}
    nums.update({"nvidiactl": (NVIDIA_MAJOR, CTL_MINOR), "nvidia-modeset": (NVIDIA_MAJOR, MODESET_MINOR),
                 "nvidia-uvm": (UVM_MAJOR, 0), "nvidia-uvm-tools": (UVM_MAJOR, 1)})
    return nums


def device_paths(count: int, dev: Path = Path("/dev")) -> list[Path]:
    """The GPUs' device nodes, then the control devices."""
    return [dev / name for name in numbers(count)]


def driver_loaded(proc: Path = PROC) -> list[str]:
    """Why this machine has an NVIDIA driver (empty: it has none)."""
    why = []
    if (proc / "driver" / "nvidia").exists():
        why.append(f"{proc / 'driver' / 'nvidia'} exists")
    why += [f"{proc / 'devices'} lists {name!r} at major {major}" for major, name in _char_majors(proc).items()
            if name.startswith("nvidia")]
    return why


def _char_majors(proc: Path) -> dict[int, str]:
    try:
        text = (proc / "devices").read_text()
    except OSError:
        return {}
    majors: dict[int, str] = {}
    for line in text.split("Block devices:")[0].splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit():
            majors[int(fields[0])] = fields[1]
    return majors


def _expected(path: Path) -> tuple[int, int] | None:
    """Our numbers for a /dev/nvidia* name (None: not a name we make)."""
    name = path.name
    if name.startswith("nvidia") and name[len("nvidia"):].isdigit():
        return NVIDIA_MAJOR, int(name[len("nvidia"):])
    return numbers(0).get(name)


def is_fake(path: Path, proc: Path = PROC) -> bool:
    """A character device with exactly the numbers we give its name, on a machine with no NVIDIA driver."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    want = _expected(path)
    return (want is not None and stat.S_ISCHR(st.st_mode)
            and (os.major(st.st_rdev), os.minor(st.st_rdev)) == want and not driver_loaded(proc))


def _old_fake(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == OLD_FAKE


def create(count: int, dev: Path = Path("/dev"), proc: Path = PROC) -> list[str]:
    """Make the device nodes of `count` GPUs and the control devices; a ClusterError where an NVIDIA driver is
    loaded, another driver holds one of the majors, or a path is taken by anything else (never shadow a GPU)."""
    if why := driver_loaded(proc):
        raise ClusterError(f"this machine has an NVIDIA driver ({'; '.join(why)}): the real node's fake GPUs "
                           "(character devices 195:N) would be the real ones; not making them")
    taken = {m: n for m, n in _char_majors(proc).items() if m in (NVIDIA_MAJOR, UVM_MAJOR)}
    if taken:
        raise ClusterError(f"{proc / 'devices'} has drivers at the fake GPUs' majors ({taken}): opening a fake "
                           "device node would reach them; not making them")
    nums = numbers(count)
    paths = [dev / name for name in nums]
    for path in paths:
        if _old_fake(path):
            path.unlink()
    other = [str(p) for p in paths if os.path.lexists(p) and not is_fake(p, proc)]
    if other:
        raise ClusterError(f"{', '.join(other)} exist and are not the harness's fake devices "
                           f"({NVIDIA_MAJOR}:N, {UVM_MAJOR}:0/1): not shadowing them")
    for name, (major, minor) in nums.items():
        path = dev / name
        if not os.path.lexists(path):
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            os.chmod(path, 0o666)  # mknod honours the umask
    return [str(p) for p in paths]


def remove(dev: Path = Path("/dev"), proc: Path = PROC) -> list[str]:
    """Remove every fake NVIDIA device node under `dev` (nothing while a driver is loaded); returns what went."""
    gone = []
    for path in sorted(dev.glob("nvidia*")):
        if is_fake(path, proc) or _old_fake(path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            gone.append(str(path))
    return gone


def parse_probe(output: str) -> dict[str, tuple[str, str]]:
    """PROBE_COMMAND's lines: {device name: ('major:minor' in decimal, open result)}."""
    seen = {}
    for line in output.splitlines():
        fields = line.split(maxsplit=3)
        if len(fields) == 4 and fields[0] == "DEV":
            major, minor = (int(x, 16) for x in fields[2].split(":"))
            seen[fields[1]] = (f"{major}:{minor}", fields[3])
    return seen
