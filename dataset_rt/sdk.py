"""The C SDK inside the installed package, for C, C++, Rust or Go programs.

A wheel (and a checkout's editable install) holds, in the package directory::

    dataset_rt/libdataset_rt.so          the shared library (also what Python loads)
    dataset_rt/libdataset_rt.a           the static library (needs only libc and pthreads)
    dataset_rt/include/dataset_rt.h      the header
    dataset_rt/pkgconfig/dataset_rt.pc   relocatable pkg-config file

:func:`get_include` and :func:`get_library_dir` give the directories;
``python -m dataset_rt config --cflags --libs`` (also ``dataset-rt config``) prints the
flags, for example ``cc app.c $(python -m dataset_rt config --cflags --libs)``. Dynamic
linking adds an rpath to the package directory, since a pip-installed package is not on
the dynamic loader's search path; ``--static`` links the archive instead.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TextIO

PACKAGE_DIR = Path(__file__).resolve().parent
HEADER = "dataset_rt.h"
SHARED_LIBRARY = "libdataset_rt.so"
STATIC_LIBRARY = "libdataset_rt.a"
PKG_CONFIG = "dataset_rt.pc"
# What the static archive needs beyond libc (pthreads are in libc from glibc 2.34 and in
# musl, but the wheels target glibc 2.17).
STATIC_DEPENDENCIES = ["-lpthread"]


def get_include() -> str:
    """The directory holding ``dataset_rt.h`` (pass it as ``-I``)."""
    return str(PACKAGE_DIR / "include")


def get_library_dir() -> str:
    """The directory holding ``libdataset_rt.so`` and ``libdataset_rt.a`` (the package
    directory itself: the shared library is the one Python loads)."""
    return str(PACKAGE_DIR)


def get_pkgconfig_dir() -> str:
    """The directory holding ``dataset_rt.pc`` (add it to ``PKG_CONFIG_PATH``)."""
    return str(PACKAGE_DIR / "pkgconfig")


def cflags() -> list[str]:
    """Compiler flags: the include directory."""
    return [f"-I{get_include()}"]


def libs(*, static: bool = False) -> list[str]:
    """Linker flags: the shared library with an rpath to it, or with ``static`` the
    archive's path and what it needs."""
    libdir = get_library_dir()
    if static:
        return [str(Path(libdir) / STATIC_LIBRARY), *STATIC_DEPENDENCIES]
    return [f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-ldataset_rt"]


def missing_files() -> list[str]:
    """The SDK files this installation lacks (empty for a wheel or an editable install)."""
    expected = [
        Path(get_include()) / HEADER,
        Path(get_library_dir()) / SHARED_LIBRARY,
        Path(get_library_dir()) / STATIC_LIBRARY,
        Path(get_pkgconfig_dir()) / PKG_CONFIG,
    ]
    return [str(path) for path in expected if not path.is_file()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``config`` subcommand's options."""
    parser.add_argument("--cflags", action="store_true", help="compiler flags (-I...)")
    parser.add_argument("--libs", action="store_true", help="linker flags")
    parser.add_argument("--static", action="store_true", help="with --libs: link libdataset_rt.a")
    parser.add_argument("--include-dir", action="store_true", help="print get_include()")
    parser.add_argument("--library-dir", action="store_true", help="print get_library_dir()")
    parser.add_argument(
        "--pkg-config-dir", action="store_true", help="the directory of dataset_rt.pc"
    )


def cmd_config(args: argparse.Namespace, out: TextIO) -> int:
    """Print what was asked: flags on one line (shell-quoted), then each directory on a
    line of its own. Exit status 1 when the installation has no C SDK, 2 when nothing
    was asked."""
    flags = [*(cflags() if args.cflags else []), *(libs(static=args.static) if args.libs else [])]
    directories = [
        *([get_include()] if args.include_dir else []),
        *([get_library_dir()] if args.library_dir else []),
        *([get_pkgconfig_dir()] if args.pkg_config_dir else []),
    ]
    if not flags and not directories:
        print(
            "dataset-rt config: ask for --cflags, --libs [--static], --include-dir, "
            "--library-dir or --pkg-config-dir",
            file=sys.stderr,
        )
        return 2
    missing = missing_files()
    if missing:
        print(f"dataset-rt config: this installation has no C SDK: {missing}", file=sys.stderr)
        return 1
    if flags:
        out.write(shlex.join(flags) + "\n")
    for directory in directories:
        out.write(directory + "\n")
    return 0
