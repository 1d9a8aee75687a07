"""Hatch build hook: build the Zig core and ship it inside the package.

Runs ``python -m ziglang build`` (the pinned ``ziglang`` PyPI package is a build
requirement, so no other toolchain is needed), copies ``libdataset_rt.so`` into
``dataset_rt/``, and generates ``dataset_rt/_ffi.py``, cffi's out-of-line ABI-mode module,
from the declarations between the ``DRT_CDEF`` markers of ``native/include/dataset_rt.h``.
Both files are git-ignored and force-included in the wheel, which is tagged for the
platform (``py3-none-<platform>``: ABI mode does not depend on the Python version).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

HEADER = Path("native/include/dataset_rt.h")
BEGIN, END = "/* DRT_CDEF_BEGIN */", "/* DRT_CDEF_END */"
LIBRARY = "libdataset_rt.so"


def cdef_region(header_text: str) -> str:
    """Return the declarations between the DRT_CDEF markers (what cffi parses)."""
    start = header_text.index(BEGIN) + len(BEGIN)
    return header_text[start : header_text.index(END)]


def build_native(root: Path, optimize: str = "ReleaseSafe", cpu: str = "baseline") -> Path:
    """Build the shared library with the pinned Zig and return its installed path."""
    prefix = Path(tempfile.mkdtemp(prefix="dataset_rt-zig-"))
    command = [
        sys.executable,
        "-m",
        "ziglang",
        "build",
        f"-Doptimize={optimize}",
        f"-Dcpu={cpu}",
        "--prefix",
        str(prefix),
    ]
    subprocess.run(command, cwd=root, check=True)
    return prefix / "lib" / LIBRARY


def write_ffi_module(root: Path) -> Path:
    """Generate dataset_rt/_ffi.py from the header's declaration region."""
    import cffi

    ffibuilder = cffi.FFI()
    ffibuilder.cdef(cdef_region((root / HEADER).read_text()))
    ffibuilder.set_source("dataset_rt._ffi", None)
    target = root / "dataset_rt" / "_ffi.py"
    staged = target.with_name(f"._ffi.{os.getpid()}.tmp")
    ffibuilder.emit_python_code(str(staged))
    os.replace(staged, target)
    return target


class NativeBuildHook(BuildHookInterface):
    """Builds libdataset_rt and the cffi module before hatch collects the wheel files."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        optimize = os.environ.get("DATASET_RT_ZIG_OPTIMIZE", "ReleaseSafe")
        cpu = os.environ.get("DATASET_RT_ZIG_CPU", "baseline")
        built = build_native(root, optimize, cpu)
        package = root / "dataset_rt"
        # Replace the library by rename, never by writing over it: a process that has the
        # old file mapped (a running job, a test session) would crash on changed pages.
        staged = package / f".{LIBRARY}.{os.getpid()}.tmp"
        shutil.copy2(built, staged)
        os.replace(staged, package / LIBRARY)
        shutil.rmtree(built.parent.parent, ignore_errors=True)
        write_ffi_module(root)

        build_data["pure_python"] = False
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["tag"] = f"py3-none-{platform}"
        if version != "editable":
            build_data["force_include"][str(package / LIBRARY)] = f"dataset_rt/{LIBRARY}"
            build_data["force_include"][str(package / "_ffi.py")] = "dataset_rt/_ffi.py"
