"""The C consumer example, examples/c/read_cache.c, built with `zig cc` against the
installed library (static and shared) and compared line for line with the Python API.

The library is installed once per session with `zig build install` into pytest's
temporary directory (baseline x86-64, so valgrind can run it); both binaries are built
for the baseline CPU too.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "c" / "read_cache.c"
DOC = ROOT / "docs" / "c-api.md"
HEADER = ROOT / "native" / "include" / "dataset_rt.h"
ZIG = [sys.executable, "-m", "ziglang"]
# Strict C11 for every compiler; with zig cc also the baseline CPU, because zig cc targets
# the build machine's CPU by default and valgrind stops at AVX-512 instructions.
CFLAGS = ["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-O2", "-g"]
ZIG_CFLAGS = [*CFLAGS, "-mcpu=baseline"]
LINKAGES = ["static", "shared"]

# Caches with the same metadata schema can be opened together (730 samples in all).
SAME_SCHEMA = ["plain_one_shard", "plain_many_shards", "lz4_many_shards", "unicode_é_name"]

# (id, cache names, command-line options)
CONFIGS = [
    ("ordered", SAME_SCHEMA, []),
    ("ordered-one-cache", ["text_records_v1"], []),
    ("shuffled-seed-0", SAME_SCHEMA, ["--shuffle", "--seed", "0"]),
    ("shuffled-seed-42", SAME_SCHEMA, ["--shuffle", "--seed", "42"]),
    ("ordered-epoch-len-1000", SAME_SCHEMA, ["--epoch-len", "1000"]),
    ("shuffled-epoch-len-77", SAME_SCHEMA, ["--shuffle", "--seed", "42", "--epoch-len", "77"]),
    ("validate-ordered", SAME_SCHEMA, ["--validate"]),
    ("validate-shuffled", SAME_SCHEMA[2:], ["--validate", "--shuffle", "--seed", "7"]),
]


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kwargs)


def checked(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    result = run(cmd, **kwargs)
    assert result.returncode == 0, f"{shlex.join(cmd)}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="session")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`zig build install` into a fresh prefix, once per session. Debug: it builds in a
    fraction of ReleaseSafe's time, and the example then runs with every safety check of
    the Zig code on (the ReleaseSafe library is what the Python tests and the wheel's SDK
    tests in test_wheels.py run)."""
    out = tmp_path_factory.mktemp("prefix")
    options = ["-Doptimize=Debug", "-Dcpu=baseline"]
    checked([*ZIG, "build", "install", "--prefix", str(out), *options], cwd=ROOT)
    return out


def zig_cc(*args: str) -> None:
    """Compiles the example with `zig cc` and the strict flags."""
    checked([*ZIG, "cc", *ZIG_CFLAGS, str(EXAMPLE), *args])


@pytest.fixture(scope="session")
def binaries(prefix: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """read_cache linked statically (libdataset_rt.a) and dynamically (libdataset_rt.so)."""
    out = tmp_path_factory.mktemp("bin")
    include, lib = prefix / "include", prefix / "lib"
    static, shared = out / "read_cache_static", out / "read_cache_shared"
    # zig cc links its own compiler_rt and needs no -lunwind for the static archive.
    zig_cc(f"-I{include}", str(lib / "libdataset_rt.a"), "-lc", "-o", str(static))
    zig_cc(f"-I{include}", f"-L{lib}", "-ldataset_rt", f"-Wl,-rpath,{lib}", "-o", str(shared))
    return {"static": static, "shared": shared}


def needed(binary: Path) -> list[str] | None:
    """The binary's DT_NEEDED libraries (None when readelf is missing)."""
    readelf = shutil.which("readelf")
    if readelf is None:
        return None
    output = checked([readelf, "-d", str(binary)]).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", output)


def python_lines(names: list[str], options: list[str], io_backend: str) -> list[str]:
    """What read_cache prints for `options`, computed with the Python API."""
    import dataset_rt

    def value(flag: str) -> int | None:
        return int(options[options.index(flag) + 1]) if flag in options else None

    config = dataset_rt.ReaderConfig(
        seed=value("--seed") or 0,
        shuffle="--shuffle" in options,
        validate_cache="--validate" in options,
        io_backend=io_backend,
    )
    dataset = dataset_rt.DatasetRuntime(num_workers=2).cached_dataset(
        [FIXTURES / name for name in names], reader_config=config
    )
    lines = [f"samples {len(dataset)}"]  # before set_epoch_len: every physical sample
    epoch_len = value("--epoch-len")
    if epoch_len is not None:
        dataset.set_epoch_len(epoch_len)
    for sample in dataset:
        digest = hashlib.sha256(sample.data).hexdigest()
        lines.append(f"{sample.cache_id} {sample.sample_id} {len(sample.data)} {digest}")
    return lines


def test_install_layout(prefix: Path) -> None:
    lib = prefix / "lib"
    assert (lib / "libdataset_rt.a").is_file()
    assert (lib / "libdataset_rt.so").exists()
    assert (lib / "pkgconfig" / "dataset_rt.pc").is_file()
    assert (prefix / "include" / "dataset_rt.h").read_bytes() == HEADER.read_bytes()


def test_linkage(binaries: dict[str, Path]) -> None:
    static, shared = needed(binaries["static"]), needed(binaries["shared"])
    if static is None or shared is None:
        pytest.skip("binutils readelf is not installed")
    assert not any(name.startswith("libdataset_rt") for name in static), static
    assert "libdataset_rt.so.0" in shared, shared


@pytest.mark.parametrize("linkage", LINKAGES)
@pytest.mark.parametrize(
    ("names", "options"), [c[1:] for c in CONFIGS], ids=[c[0] for c in CONFIGS]
)
def test_output_matches_python(
    binaries: dict[str, Path], linkage: str, names: list[str], options: list[str], io_backend: str
) -> None:
    paths = [str(FIXTURES / name) for name in names]
    result = checked([str(binaries[linkage]), *options, "--backend", io_backend, *paths])
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    expected = python_lines(names, options, io_backend)
    assert len(lines) == len(expected)
    for number, (got, want) in enumerate(zip(lines, expected, strict=True), start=1):
        assert got == want, f"line {number}"
    manifests = [json.loads((FIXTURES / name / "manifest.json").read_bytes()) for name in names]
    assert lines[0] == f"samples {sum(m['sample_count'] for m in manifests)}"


@pytest.mark.parametrize("linkage", LINKAGES)
def test_not_a_cache(binaries: dict[str, Path], linkage: str, tmp_path: Path) -> None:
    """A directory without a manifest: exit 1 and Python's message for the same path."""
    import dataset_rt

    result = run([str(binaries[linkage]), str(tmp_path)])
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == f"error: missing manifest: {tmp_path}/manifest.json\n"
    runtime = dataset_rt.DatasetRuntime(num_workers=2)
    with pytest.raises(ValueError) as excinfo:
        runtime.cached_dataset([tmp_path], reader_config=dataset_rt.ReaderConfig(seed=0))
    assert result.stderr == f"error: {excinfo.value}\n"


@pytest.mark.parametrize("linkage", LINKAGES)
def test_validate_detects_corruption(binaries: dict[str, Path], linkage: str, fixture_copy) -> None:
    """--validate verifies every SHA-256 at open and fails as Python does; without it the
    cache still opens and reads (loading checks structure only)."""
    import dataset_rt

    cache = fixture_copy("plain_one_shard")
    shard = next((cache / "shards").iterdir())
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF  # the shard's last byte: the SHA-256 changes, the structure does not
    shard.write_bytes(bytes(data))

    result = run([str(binaries[linkage]), "--validate", str(cache)])
    assert result.returncode == 1
    assert result.stdout == ""
    with pytest.raises(ValueError) as excinfo:
        dataset_rt.DatasetRuntime(num_workers=2).cached_dataset(
            [cache], reader_config=dataset_rt.ReaderConfig(seed=0, validate_cache=True)
        )
    assert "checksum mismatch" in str(excinfo.value)
    assert result.stderr == f"error: {excinfo.value}\n"

    checked([str(binaries[linkage]), str(cache)])


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--seed"],
        ["--seed", "-1", "x"],
        ["--epoch-len", "ten", "x"],
        ["--backend", "aio", "x"],
        ["--frobnicate", "x"],
    ],
)
def test_usage_errors(binaries: dict[str, Path], args: list[str]) -> None:
    result = run([str(binaries["shared"]), *args])
    assert result.returncode == 2
    assert result.stdout == ""
    assert "usage: read_cache" in result.stderr


def test_library_errors_exit_1(binaries: dict[str, Path]) -> None:
    """Statuses from later calls are reported too (epoch length 0, duplicate caches)."""
    cache = str(FIXTURES / "text_records_v1")
    result = run([str(binaries["shared"]), "--epoch-len", "0", cache])
    assert result.returncode == 1
    assert (result.stdout, result.stderr) == ("", "error: epoch_len must be at least 1\n")
    result = run([str(binaries["shared"]), cache, cache])
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith("error: duplicate cache_id ")


def system_cc() -> str:
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no system C compiler (cc, gcc or clang)")
    return compiler


def test_system_cc_shared(prefix: Path, binaries: dict[str, Path], tmp_path: Path) -> None:
    """The shared library links with the system's C toolchain too."""
    lib = prefix / "lib"
    binary = tmp_path / "read_cache_cc"
    checked(
        [system_cc(), *CFLAGS, str(EXAMPLE), f"-I{prefix / 'include'}", f"-L{lib}",
         "-ldataset_rt", f"-Wl,-rpath,{lib}", "-o", str(binary)]
    )  # fmt: skip
    cache = str(FIXTURES / "plain_many_shards")
    args = ["--shuffle", "--seed", "5", cache]
    assert checked([str(binary), *args]).stdout == checked([str(binaries["shared"]), *args]).stdout


def test_system_cc_static(prefix: Path, tmp_path: Path) -> None:
    """The static archive links with the system's C toolchain (needs only libc)."""
    binary = tmp_path / "read_cache_cc_static"
    checked(
        [system_cc(), *CFLAGS, str(EXAMPLE), f"-I{prefix / 'include'}",
         str(prefix / "lib" / "libdataset_rt.a"), "-o", str(binary)]
    )  # fmt: skip
    checked([str(binary), str(FIXTURES / "text_records_v1")])


@pytest.mark.skipif(platform.machine() != "x86_64", reason="runs an x86_64 binary")
def test_musl_archive_links_into_a_position_independent_executable(tmp_path: Path) -> None:
    """The static archive of a musl build (as in the musllinux wheels) links into a PIE,
    the default of Alpine's and Debian's musl compilers: it must hold position-independent
    code, which Zig leaves out of musl archives unless asked. The static PIE runs here
    (musl is linked in) and reads what Python reads. Debug keeps the build short; the
    archive's code model does not depend on the optimize mode."""
    prefix = tmp_path / "musl"
    options = ["-Dtarget=x86_64-linux-musl", "-Doptimize=Debug", "-Dstrip=true"]
    checked([*ZIG, "build", "install", "--prefix", str(prefix), *options], cwd=ROOT)
    binary = tmp_path / "read_cache_musl_pie"
    checked(
        [*ZIG, "cc", "-target", "x86_64-linux-musl", "-fPIE", "-pie", *ZIG_CFLAGS,
         str(EXAMPLE), f"-I{prefix / 'include'}", str(prefix / "lib" / "libdataset_rt.a"),
         "-o", str(binary)]
    )  # fmt: skip
    names = ["text_records_v1"]
    result = checked([str(binary), "--backend", "threads", str(FIXTURES / names[0])])
    assert result.stdout.splitlines() == python_lines(names, [], "threads")


def test_valgrind_clean(binaries: dict[str, Path]) -> None:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        pytest.skip("valgrind is not installed")
    cache = str(FIXTURES / "text_records_v1")
    memcheck = [valgrind, "--leak-check=full", "--error-exitcode=9", str(binaries["shared"])]
    options = ["--validate", "--shuffle", "--seed", "3"]
    result = run([*memcheck, *options, "--backend", "threads", cache])
    assert result.returncode == 0, result.stderr
    assert "ERROR SUMMARY: 0 errors" in result.stderr, result.stderr
    assert "All heap blocks were freed -- no leaks are possible" in result.stderr, result.stderr
    assert result.stdout.splitlines() == python_lines(["text_records_v1"], options, "threads")
    # The error path frees everything too.
    result = run([*memcheck, cache, cache])
    assert result.returncode == 1, result.stderr
    assert "ERROR SUMMARY: 0 errors" in result.stderr, result.stderr
    assert "All heap blocks were freed -- no leaks are possible" in result.stderr, result.stderr


def test_pkg_config(prefix: Path, binaries: dict[str, Path], tmp_path: Path) -> None:
    """dataset_rt.pc gives flags that build and run the example."""
    pkg_config = shutil.which("pkg-config")
    if pkg_config is None:
        pytest.skip("pkg-config is not installed")
    env = {**os.environ, "PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")}
    from dataset_rt._native import ffi, lib

    version = checked([pkg_config, "--modversion", "dataset_rt"], env=env).stdout.strip()
    assert version == ffi.string(lib.drt_version()).decode()
    flags = shlex.split(checked([pkg_config, "--cflags", "--libs", "dataset_rt"], env=env).stdout)
    assert f"-I{prefix / 'include'}" in flags
    assert f"-L{prefix / 'lib'}" in flags
    assert "-ldataset_rt" in flags
    binary = tmp_path / "read_cache_pc"
    zig_cc(*flags, f"-Wl,-rpath,{prefix / 'lib'}", "-o", str(binary))
    cache = str(FIXTURES / "unicode_é_name")
    assert checked([str(binary), cache]).stdout == checked([str(binaries["shared"]), cache]).stdout


def test_doc_quotes_the_example() -> None:
    """docs/c-api.md shows the example's main loop verbatim (lines in the file's order)."""
    doc = DOC.read_text(encoding="utf-8")
    section = doc[doc.index("## A complete example") :]
    blocks = re.findall(r"```c\n(.*?)```", section, flags=re.S)
    assert blocks, "no C block in the complete-example section"
    source = EXAMPLE.read_text(encoding="utf-8").splitlines()
    position = 0
    for line in blocks[0].splitlines():
        if not line.strip():
            continue
        assert line in source[position:], f"not in read_cache.c (in order): {line!r}"
        position = source.index(line, position) + 1
