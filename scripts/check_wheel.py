"""Check that a release wheel is what its tag says (run by scripts/build-wheels.sh).

    python scripts/check_wheel.py WHEEL [--platform TAG]

Exit status 0 when all of these hold, 1 (with the reasons) otherwise:

* the file name's tag is ``py3-none-TAG`` (``--platform`` defaults to the name's tag);
* the wheel holds the package's library, the cffi module and the C SDK (header, static
  library, pkg-config file);
* the shared library is for TAG's architecture and carries no debug info;
* ``auditwheel show`` finds the wheel consistent with TAG or an older policy of the same
  family: a library that needs a newer glibc (or musl) symbol than TAG allows fails.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from elftools.elf.elffile import ELFFile

REQUIRED = [
    "dataset_rt/__init__.py",
    "dataset_rt/_ffi.py",
    "dataset_rt/libdataset_rt.so",
    "dataset_rt/libdataset_rt.a",
    "dataset_rt/include/dataset_rt.h",
    "dataset_rt/pkgconfig/dataset_rt.pc",
]
MACHINES = {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}
TAG = re.compile(r"^(?P<family>manylinux|musllinux)_(?P<major>\d+)_(?P<minor>\d+)_(?P<arch>\w+)$")
AUDITWHEEL_TAG = re.compile(r'following\s+platform\s+tag:\s+"(?P<tag>[^"]+)"')


def wheel_platform(wheel: Path) -> str:
    """The platform part of ``name-version-py3-none-PLATFORM.whl`` (error if not py3-none)."""
    parts = wheel.name.removesuffix(".whl").split("-")
    if len(parts) != 5 or parts[2:4] != ["py3", "none"]:
        raise ValueError(f"{wheel.name}: expected NAME-VERSION-py3-none-PLATFORM.whl")
    return parts[4]


def allows(wanted: str, reported: str) -> bool:
    """True when a wheel that auditwheel finds consistent with ``reported`` may be tagged
    ``wanted``: same family and architecture, and a policy no newer than ``wanted``."""
    want, got = TAG.match(wanted), TAG.match(reported)
    if want is None or got is None:
        return False
    same = (want["family"], want["arch"]) == (got["family"], got["arch"])
    version = (int(got["major"]), int(got["minor"]))
    return same and version <= (int(want["major"]), int(want["minor"]))


def check(wheel: Path, platform: str) -> list[str]:
    """The problems found (empty when the wheel is good)."""
    problems = []
    tag = TAG.match(platform)
    if tag is None:
        return [f"{platform}: not a manylinux_X_Y_ARCH or musllinux_X_Y_ARCH tag"]
    if wheel_platform(wheel) != platform:
        problems.append(f"{wheel.name}: file name says {wheel_platform(wheel)}, not {platform}")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        problems += [f"missing {name}" for name in REQUIRED if name not in names]
        if "dataset_rt/libdataset_rt.so" in names:
            elf = ELFFile(io.BytesIO(archive.read("dataset_rt/libdataset_rt.so")))
            machine = elf.header["e_machine"]
            if machine != MACHINES.get(tag["arch"]):
                problems.append(f"libdataset_rt.so is {machine}, not {tag['arch']}")
            if elf.get_section_by_name(".debug_info") is not None:
                problems.append("libdataset_rt.so has debug info (not stripped)")
    # No library search path: the wheel may need nothing but the policy's system libraries,
    # and this machine's are for another libc or architecture (glibc's libc.so is a linker
    # script that auditwheel cannot read when it looks for musl's libc.so).
    with tempfile.TemporaryDirectory() as nowhere:
        shown = subprocess.run(
            [sys.executable, "-m", "auditwheel", "show", "--ldpaths", nowhere, str(wheel)],
            capture_output=True,
            text=True,
            check=False,
        )
    found = AUDITWHEEL_TAG.search(shown.stdout)
    if shown.returncode != 0 or found is None:
        problems.append(f"auditwheel show failed:\n{shown.stdout}{shown.stderr}")
    elif not allows(platform, found["tag"]):
        problems.append(
            f"auditwheel: consistent with {found['tag']} only, not {platform} "
            f"(a symbol newer than the tag allows?):\n{shown.stdout}"
        )
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--platform", help="the tag to check against (default: the name's)")
    args = parser.parse_args()
    platform = args.platform or wheel_platform(args.wheel)
    problems = check(args.wheel, platform)
    for problem in problems:
        print(f"{args.wheel.name}: {problem}", file=sys.stderr)
    if not problems:
        print(f"{args.wheel.name}: ok ({platform})")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
