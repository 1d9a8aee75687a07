"""Release artefacts as users get them (issue 19).

Built once per session and shared by the tests (session fixtures):

* ``release``: ``scripts/build-wheels.sh OUT manylinux_2_17_x86_64``, i.e. the sdist, the
  x86_64 manylinux wheel built from that sdist (cross-compiled for glibc 2.17 with the
  pinned Zig), checked by ``scripts/check_wheel.py`` (auditwheel);
* ``venv_python``: a fresh virtualenv (``venv`` + pip) with only that wheel installed from
  the file and its dependencies from the package registry; it runs outside the checkout,
  with no ``PYTHONPATH``;
* ``sdk_binaries``: ``examples/c/read_cache.c`` built against the C SDK inside that
  installed wheel, statically and dynamically, with the flags of
  ``python -m dataset_rt config``;
* ``aarch64_binary``: the library built for ``aarch64-linux-gnu.2.17`` and the example
  linked against it, both with the pinned Zig, run under ``qemu-aarch64`` (Debian's
  ``qemu-user``, with ``libc6-arm64-cross`` for the aarch64 C library; ``.ci/run``
  installs both).

Tests that need the registry skip where it cannot be reached (``skip_or_fail``: they fail
under ``CI``); the qemu test skips where qemu or the aarch64 C library is missing and
fails under ``CI``.
"""

from __future__ import annotations

import importlib
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
import venv
import zipfile
from pathlib import Path

import pytest

from dataset_rt import _distribution
from tests.conftest import FIXTURES
from tests.refenv import NETWORK_ERROR_MARKERS, _clean_env, running_in_ci, skip_or_fail
from tests.test_c_example import CONFIGS, EXAMPLE, ZIG_CFLAGS, python_lines
from tests.test_seed_example import EXPECTED as SEED_OUTPUT

ROOT = Path(__file__).resolve().parents[1]
BUILD_WHEELS = ROOT / "scripts" / "build-wheels.sh"
CHECK_WHEEL = ROOT / "scripts" / "check_wheel.py"
SEED = ROOT / "examples" / "cache_text.py"
ZIG = [sys.executable, "-m", "ziglang"]
PLATFORM = "manylinux_2_17_x86_64"
AARCH64_TARGET = "aarch64-linux-gnu.2.17"
AARCH64_SYSROOT = Path("/usr/aarch64-linux-gnu")
# A few of test_c_example's configurations: ordered, shuffled, epoch length, validation.
QEMU_IDS = {"ordered", "shuffled-seed-42", "shuffled-epoch-len-77", "validate-shuffled"}
QEMU_CONFIGS = [c for c in CONFIGS if c[0] in QEMU_IDS]
TIMEOUT_S = 900
# Text in uv's or pip's output that means the registry could not be reached.
OFFLINE_MARKERS = (
    *NETWORK_ERROR_MARKERS,
    "Failed to fetch",
    "error sending request",
    "dns error",
    "failed to lookup address",
)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, **kwargs)


def checked(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    result = run(cmd, **kwargs)
    assert result.returncode == 0, f"{shlex.join(cmd)}\n{result.stdout}\n{result.stderr}"
    return result


def registry_checked(cmd: list[str], what: str, **kwargs) -> subprocess.CompletedProcess[str]:
    """Run a command that downloads from the package registry: skip (fail under CI) when
    the registry is unreachable, fail on any other error."""
    result = run(cmd, **kwargs)
    output = result.stdout + result.stderr
    if result.returncode != 0 and any(marker in output for marker in OFFLINE_MARKERS):
        skip_or_fail(f"{what}: the package registry is unreachable: {output[-400:]}")
    assert result.returncode == 0, f"{shlex.join(cmd)}\n{output[-6000:]}"
    return result


def user_env() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH, no VIRTUAL_ENV, no user site."""
    return _clean_env()


# ------------------------------------------------------------------------ artefacts


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the x86_64 manylinux wheel, from the documented script."""
    out = tmp_path_factory.mktemp("dist")
    # The script's python must be this environment's (it has auditwheel), as under uv run.
    env = {**user_env(), "PATH": f"{Path(sys.executable).parent}:{_clean_env()['PATH']}"}
    registry_checked(["bash", str(BUILD_WHEELS), str(out), PLATFORM], "uv build", env=env)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


@pytest.fixture(scope="session")
def venv_python(release: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the wheel installed by plain pip; returns its python."""
    directory = tmp_path_factory.mktemp("venv") / "env"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(directory)
    python = directory / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check"]
    registry_checked([*pip, str(release["wheel"])], "pip install the wheel", env=user_env())
    return python


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory outside the checkout to run the installed package from."""
    return tmp_path_factory.mktemp("user")


def venv_run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return checked([str(python), *args], cwd=cwd, env=user_env())


def config(python: Path, *options: str, cwd: Path) -> list[str]:
    """``python -m dataset_rt config OPTIONS`` in the virtualenv, split like a shell."""
    return shlex.split(venv_run(python, "-m", "dataset_rt", "config", *options, cwd=cwd).stdout)


@pytest.fixture(scope="session")
def sdk_binaries(venv_python: Path, workdir: Path) -> dict[str, Path]:
    """read_cache built against the installed wheel's SDK, static and shared (zig cc)."""
    out = workdir / "bin"
    out.mkdir()
    cflags = config(venv_python, "--cflags", cwd=workdir)
    static, shared = out / "read_cache_static", out / "read_cache_shared"
    static_libs = config(venv_python, "--libs", "--static", cwd=workdir)
    checked([*ZIG, "cc", *ZIG_CFLAGS, str(EXAMPLE), *cflags, *static_libs, "-o", str(static)])
    shared_libs = config(venv_python, "--libs", cwd=workdir)
    checked([*ZIG, "cc", *ZIG_CFLAGS, str(EXAMPLE), *cflags, *shared_libs, "-o", str(shared)])
    return {"static": static, "shared": shared}


# ------------------------------------------------------------------------ the wheel


def test_wheel_contents(release: dict[str, Path]) -> None:
    """Tagged py3-none-manylinux_2_17_x86_64, pure Python files plus a stripped library
    and the C SDK; the sdist holds the sources and nothing built."""
    wheel = release["wheel"]
    assert wheel.name == f"dataset_rt_zig-0.1.0-py3-none-{PLATFORM}.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        wheel_meta = archive.read("dataset_rt_zig-0.1.0.dist-info/WHEEL").decode()
        metadata = archive.read("dataset_rt_zig-0.1.0.dist-info/METADATA").decode()
        license_file = archive.read("dataset_rt_zig-0.1.0.dist-info/licenses/LICENSE")
    assert f"Tag: py3-none-{PLATFORM}" in wheel_meta
    assert "Root-Is-Purelib: false" in wheel_meta
    assert {n for n in names if n.endswith((".so", ".a"))} == {
        "dataset_rt/libdataset_rt.so",
        "dataset_rt/libdataset_rt.a",
    }
    assert not any(n.endswith(".pyc") or "/tests/" in n for n in names), sorted(names)
    # The license text travels with both (hatchling's default license files).
    assert license_file == (ROOT / "LICENSE").read_bytes()
    assert "License-File: LICENSE" in metadata
    with tarfile.open(release["sdist"]) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    for needed in (
        "build.zig",
        "hatch_build.py",
        "native/include/dataset_rt.h",
        "pyproject.toml",
        "LICENSE",
    ):
        assert needed in members, needed
    assert "native/src/root.zig" in members
    assert not any(m.endswith((".so", ".a")) or m.endswith("_ffi.py") for m in members)


def test_check_wheel_refuses_a_tag_older_than_the_symbols(release: dict[str, Path]) -> None:
    """The auditwheel check passes the wheel for its own tag and fails it for a tag whose
    glibc is older than a symbol the library needs (so the build can fail)."""
    checked([sys.executable, str(CHECK_WHEEL), str(release["wheel"])])
    older = ["--platform", "manylinux_2_5_x86_64"]
    result = run([sys.executable, str(CHECK_WHEEL), str(release["wheel"]), *older])
    assert result.returncode == 1
    assert "auditwheel: consistent with manylinux_2_" in result.stderr, result.stderr


def test_check_wheel_tag_order() -> None:
    sys.path.insert(0, str(CHECK_WHEEL.parent))
    try:
        import check_wheel
    finally:
        sys.path.remove(str(CHECK_WHEEL.parent))
    assert check_wheel.allows("manylinux_2_17_x86_64", "manylinux_2_5_x86_64")
    assert check_wheel.allows("manylinux_2_17_x86_64", "manylinux_2_17_x86_64")
    assert not check_wheel.allows("manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
    assert not check_wheel.allows("manylinux_2_17_x86_64", "manylinux_2_17_aarch64")
    assert not check_wheel.allows("manylinux_2_17_x86_64", "musllinux_1_1_x86_64")
    assert not check_wheel.allows("manylinux_2_17_x86_64", "linux_x86_64")
    assert check_wheel.allows("musllinux_1_2_aarch64", "musllinux_1_1_aarch64")


def test_seed_example_in_a_fresh_virtualenv(venv_python: Path, workdir: Path) -> None:
    """The seed example twice (the second run reuses the cache: same output, files not
    rewritten), then `dataset-rt verify` on the cache, all from the installed wheel."""
    here = workdir / "seed"
    here.mkdir()
    shutil.copy(SEED, here / "cache_text.py")
    script = "import dataset_rt as d; print(d.native_info()['library'])"
    where = venv_run(venv_python, "-c", script, cwd=here).stdout.strip()
    assert Path(where).is_relative_to(venv_python.parent.parent), where
    assert Path(where).name == "libdataset_rt.so"
    first = venv_run(venv_python, "cache_text.py", cwd=here)
    assert first.stdout == SEED_OUTPUT
    manifest = here / "cache_text" / "text_records_v1" / "manifest.json"
    written = manifest.stat().st_mtime_ns
    second = venv_run(venv_python, "cache_text.py", cwd=here)
    assert second.stdout == SEED_OUTPUT
    assert manifest.stat().st_mtime_ns == written
    command = venv_python.parent / "dataset-rt"
    verify = checked(
        [str(command), "verify", "--quiet", "cache_text/text_records_v1"], cwd=here, env=user_env()
    )
    assert verify.stdout.startswith("OK   cache_text/text_records_v1: 2 samples"), verify.stdout


# ------------------------------------------------------------------------ the C SDK


def test_sdk_paths(venv_python: Path, workdir: Path) -> None:
    """get_include()/get_library_dir() and the config command agree and point into the
    installed package, which holds the header, both libraries and the pkg-config file."""
    script = "import dataset_rt as d; print(d.get_include()); print(d.get_library_dir())"
    printed = venv_run(venv_python, "-c", script, cwd=workdir).stdout.split()
    include, libdir = map(Path, printed)
    site = venv_python.parent.parent
    assert include.is_relative_to(site) and libdir.is_relative_to(site)
    header = ROOT / "native" / "include" / "dataset_rt.h"
    assert (include / "dataset_rt.h").read_bytes() == header.read_bytes()
    assert (libdir / "libdataset_rt.so").is_file() and (libdir / "libdataset_rt.a").is_file()
    assert config(venv_python, "--cflags", cwd=workdir) == [f"-I{include}"]
    assert config(venv_python, "--include-dir", "--library-dir", cwd=workdir) == [
        str(include),
        str(libdir),
    ]
    assert config(venv_python, "--libs", cwd=workdir) == [
        f"-L{libdir}",
        f"-Wl,-rpath,{libdir}",
        "-ldataset_rt",
    ]


def test_sdk_linkage(sdk_binaries: dict[str, Path], venv_python: Path) -> None:
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("binutils readelf is not installed")
    static = checked([readelf, "-d", str(sdk_binaries["static"])]).stdout
    shared = checked([readelf, "-d", str(sdk_binaries["shared"])]).stdout
    assert "libdataset_rt" not in static
    assert "Shared library: [libdataset_rt.so]" in shared, shared
    assert str(venv_python.parent.parent) in shared  # the rpath into site-packages


@pytest.mark.parametrize("linkage", ["static", "shared"])
@pytest.mark.parametrize(
    ("names", "options"), [c[1:] for c in QEMU_CONFIGS], ids=[c[0] for c in QEMU_CONFIGS]
)
def test_sdk_example_matches_python(
    sdk_binaries: dict[str, Path], linkage: str, names: list[str], options: list[str]
) -> None:
    paths = [str(FIXTURES / name) for name in names]
    result = checked([str(sdk_binaries[linkage]), *options, "--backend", "threads", *paths])
    assert result.stdout.splitlines() == python_lines(names, options, "threads")


def test_sdk_pkg_config_and_system_cc(
    venv_python: Path, workdir: Path, sdk_binaries: dict[str, Path], tmp_path: Path
) -> None:
    """The pkg-config file is relocatable and its flags build the example with the
    system's C compiler; the static archive links with it too."""
    pkg_config, cc = shutil.which("pkg-config"), shutil.which("cc") or shutil.which("gcc")
    if pkg_config is None or cc is None:
        pytest.skip("pkg-config or a system C compiler is not installed")
    pc_dir = config(venv_python, "--pkg-config-dir", cwd=workdir)[0]
    env = {**user_env(), "PKG_CONFIG_PATH": pc_dir}
    flags = shlex.split(checked([pkg_config, "--cflags", "--libs", "dataset_rt"], env=env).stdout)
    cache = str(FIXTURES / "plain_many_shards")
    want = checked([str(sdk_binaries["shared"]), "--shuffle", "--seed", "3", cache]).stdout
    with_pc = tmp_path / "read_cache_pc"
    checked([cc, "-std=c11", "-O2", str(EXAMPLE), *flags, "-o", str(with_pc)])
    assert checked([str(with_pc), "--shuffle", "--seed", "3", cache]).stdout == want
    static = tmp_path / "read_cache_cc_static"
    static_flags = [
        *config(venv_python, "--cflags", cwd=workdir),
        *config(venv_python, "--libs", "--static", cwd=workdir),
    ]
    checked([cc, "-std=c11", "-O2", str(EXAMPLE), *static_flags, "-o", str(static)])
    assert checked([str(static), "--shuffle", "--seed", "3", cache]).stdout == want


# ------------------------------------------------------------------------ aarch64


def qemu_or_skip() -> str:
    """qemu-aarch64's path; skips (fails under CI) without it or the aarch64 C library."""
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    loader = AARCH64_SYSROOT / "lib" / "ld-linux-aarch64.so.1"
    missing = []
    if qemu is None:
        missing.append("qemu-aarch64 (Debian package qemu-user)")
    if not loader.exists():
        missing.append(f"{loader} (Debian package libc6-arm64-cross)")
    if missing:
        reason = f"cannot run aarch64 programs, missing: {', '.join(missing)}"
        reason += " (.ci/run installs both)"
        if running_in_ci():
            pytest.fail(f"{reason}; CI is set, so this must run", pytrace=False)
        pytest.skip(reason)
    assert qemu is not None
    return qemu


@pytest.fixture(scope="session")
def aarch64_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The library for aarch64 glibc 2.17 (the manylinux wheel's target) and read_cache
    linked against its static archive, both built with the pinned Zig. Debug: it builds
    in a fifth of ReleaseSafe's time and runs with every safety check on (the optimized
    code generation is the x86-64 tests')."""
    qemu_or_skip()
    prefix = tmp_path_factory.mktemp("aarch64")
    options = [f"-Dtarget={AARCH64_TARGET}", "-Doptimize=Debug", "-Dstrip=true"]
    checked([*ZIG, "build", "install", "--prefix", str(prefix), *options], cwd=ROOT)
    binary = prefix / "read_cache"
    archive = prefix / "lib" / "libdataset_rt.a"
    cflags = ["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-O2"]
    compile_ = [*ZIG, "cc", "-target", AARCH64_TARGET, *cflags, str(EXAMPLE)]
    checked([*compile_, f"-I{prefix / 'include'}", str(archive), "-lpthread", "-o", str(binary)])
    return binary


def test_aarch64_binary_is_aarch64(aarch64_binary: Path) -> None:
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("binutils readelf is not installed")
    header = checked([readelf, "-h", str(aarch64_binary)]).stdout
    assert re.search(r"Machine:\s+AArch64", header), header


@pytest.mark.parametrize(
    ("names", "options"), [c[1:] for c in QEMU_CONFIGS], ids=[c[0] for c in QEMU_CONFIGS]
)
def test_aarch64_under_qemu_matches_x86_64(
    aarch64_binary: Path, sdk_binaries: dict[str, Path], names: list[str], options: list[str]
) -> None:
    """Same samples in the same order on aarch64 (the "auto" backend: qemu refuses
    io_uring, so this is the thread pool) as on x86_64."""
    qemu = qemu_or_skip()
    paths = [str(FIXTURES / name) for name in names]
    got = checked([qemu, "-L", str(AARCH64_SYSROOT), str(aarch64_binary), *options, *paths])
    assert got.stderr == ""
    want = checked([str(sdk_binaries["static"]), *options, *paths])
    assert got.stdout.splitlines() == want.stdout.splitlines()
    assert len(got.stdout.splitlines()) > 1


# ------------------------------------------------------------------------ one owner


def fake_install(site: Path, name: str, version: str, files: list[str]) -> None:
    """A distribution's installed metadata: METADATA and a RECORD listing ``files``."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in [*files, f"{info.name}/RECORD"]))


def check(package: Path) -> None:
    importlib.invalidate_caches()  # importlib.metadata caches directory listings by mtime
    _distribution.check_single_owner(package)


def test_conflict_is_detected_from_installed_files(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    package = site / "dataset_rt"
    package.mkdir(parents=True)
    fake_install(site, "dataset-rt-zig", "0.1.0", ["dataset_rt/__init__.py", "dataset_rt/sdk.py"])
    check(package)  # ours alone
    fake_install(site, "other", "1.0", ["other/__init__.py"])
    check(package)
    reference = ["dataset_rt/__init__.py", "dataset_rt/_dataset_rt.abi3.so"]
    fake_install(site, "dataset-rt", "0.4.8", reference)
    with pytest.raises(ImportError) as excinfo:
        check(package)
    message = str(excinfo.value)
    assert "dataset-rt-zig 0.1.0" in message and "dataset-rt 0.4.8" in message
    repair = "pip uninstall -y dataset-rt && pip install --force-reinstall --no-deps dataset-rt-zig"
    assert repair in message
    # The reference beside an editable install (our files elsewhere): no conflict.
    shutil.rmtree(site / "dataset_rt_zig-0.1.0.dist-info")
    fake_install(site, "dataset-rt-zig", "0.1.0", ["_dataset_rt_zig.pth"])
    check(package)


def test_reference_installed_over_the_wheel(
    venv_python: Path, workdir: Path, release: dict[str, Path]
) -> None:
    """The real reference release and the wheel in one virtualenv: `import dataset_rt`
    (ours installed last) and the `dataset-rt` command (either installed last) name the
    one to uninstall, and the commands they give repair the environment. Runs last on
    the shared virtualenv and leaves it as it found it."""
    pip = [str(venv_python), "-m", "pip", "--no-input", "--disable-pip-version-check"]
    ours = [*pip, "install", "--no-deps", "--force-reinstall", str(release["wheel"])]
    reference = [*pip, "install", "--no-deps", "dataset-rt==0.4.8"]
    registry_checked(reference, "pip install dataset-rt", env=user_env())
    try:
        # Ours installed last: its __init__ runs and finds the reference's files.
        checked(ours, env=user_env())
        result = run([str(venv_python), "-c", "import dataset_rt"], cwd=workdir, env=user_env())
        assert result.returncode == 1
        assert "DistributionConflictError" in result.stderr
        assert "Uninstall dataset-rt, then reinstall dataset-rt-zig" in result.stderr
        # The reference installed last: its __init__ runs (without our check), but the
        # dataset-rt command, ours, still finds the mix and says so.
        checked([*reference, "--force-reinstall"], env=user_env())
        command = venv_python.parent / "dataset-rt"
        result = run([str(command), "--help"], cwd=workdir, env=user_env())
        assert result.returncode == 1
        assert "DistributionConflictError" in result.stderr
        assert "Uninstall dataset-rt, then reinstall dataset-rt-zig" in result.stderr
    finally:
        checked([*pip, "uninstall", "-y", "dataset-rt"], env=user_env())
        checked(ours, env=user_env())
    script = "import dataset_rt; dataset_rt.DatasetRuntime(num_workers=1)"
    venv_run(venv_python, "-c", script, cwd=workdir)


def test_a_failed_native_build_leaves_no_staging_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hatch_build.build_native removes its temporary prefix when zig build fails (hatch
    calls the hook's finalize only after a successful build). hatchling is a build
    requirement, not installed here: the hook's base class is stood in for."""
    interface = types.ModuleType("hatchling.builders.hooks.plugin.interface")
    interface.BuildHookInterface = object  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, interface.__name__, interface)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.delitem(sys.modules, "hatch_build", raising=False)
    import hatch_build

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(subprocess.CalledProcessError):
        hatch_build.build_native(ROOT, target="not-a-target")
    assert list(tmp_path.iterdir()) == []
