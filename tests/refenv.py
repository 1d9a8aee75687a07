"""A Python interpreter with the reference release, dataset-rt 0.4.8, in its own virtualenv.

The reference and this project share the import name ``dataset_rt``, so the reference can
never be installed into the project's environment. This module builds a separate
virtualenv with the standard library's ``venv`` and pip (uv is not needed inside it), at a
stable cache location outside the repository, keyed by the reference version and the
Python version, and runs scripts in it as subprocesses.

- Reuse: a virtualenv whose marker file (written only after a successful install and
  import check) matches this module's expectations is reused as is.
- Concurrency: creation is serialized with an exclusive ``fcntl.flock`` on a lock file
  beside the virtualenv, so pytest-xdist workers or two test runs never build it together;
  a half-built virtualenv (no marker) is deleted and rebuilt by the next holder of the lock.
- Offline machines: when pip cannot reach the package registry, ``ensure_reference``
  raises :class:`ReferenceUnavailable` (the tests skip with pip's last error line, through
  :func:`skip_or_fail`); any other failure raises :class:`ReferenceSetupError` (the
  tests fail).
- CI: with the environment variable ``CI`` set (CI runs with ``CI=true``), an unreachable
  registry fails those tests instead (:func:`skip_or_fail`): CI cannot pass by skipping
  the comparisons with the reference or the PyTorch and Ray suites.
- Isolation: scripts run with ``-I`` (no user site, no ``PYTHON*`` variables, no script
  or working directory on ``sys.path``), ``PYTHONPATH`` removed, and a fresh temporary
  working directory, and a prelude asserts that ``dataset_rt`` is the reference release
  imported from inside the virtualenv, so the project is never compared with itself.

Environment overrides (developer use): ``DATASET_RT_REF_VENV`` sets the virtualenv path.

The same machinery builds *extra* virtualenvs (:func:`ensure_extra`): pip installs optional
integration packages there (torch, ray) that must never enter the uv environment (uv
would download a multi-gigabyte CUDA torch; pip takes the machine's local CPU build), and
scripts run with this project and its uv environment on ``PYTHONPATH``, so they import
this checkout's ``dataset_rt`` together with the extra packages.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import venv
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

REFERENCE_VERSION = "0.4.8"
REFERENCE_REQUIREMENT = f"dataset-rt=={REFERENCE_VERSION}"
VENV_ENV_VAR = "DATASET_RT_REF_VENV"
MARKER_NAME = "dataset_rt_reference.ok.json"
# Bumped when the way the virtualenv is built changes, so old ones are rebuilt.
MARKER_SCHEMA = 1

INSTALL_TIMEOUT_S = 1200.0
CHECK_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 300.0

# Text in pip's output that means the registry could not be reached (as opposed to a
# broken requirement, a failing build or a full disk, which must fail the tests).
NETWORK_ERROR_MARKERS = (
    "NewConnectionError",
    "ConnectionError",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "No route to host",
    "Connection refused",
    "Connection reset by peer",
    "ProxyError",
    "Failed to establish a new connection",
    "connection broken by",
)

# Run before every reference script: prove that the interpreter imports the reference
# release from its own virtualenv and not this project (they share the import name).
_PRELUDE = r"""
import importlib.metadata, os, runpy, sys
import dataset_rt
_file = os.path.realpath(dataset_rt.__file__)
_prefix = os.path.realpath(sys.prefix)
assert _file.startswith(_prefix + os.sep), f"dataset_rt imported from {_file}, outside {_prefix}"
assert sys.prefix != sys.base_prefix, "not running inside a virtualenv"
_version = importlib.metadata.version("dataset-rt")
assert _version == "@VERSION@", f"dataset-rt {_version} installed, expected @VERSION@"
del _file, _prefix, _version
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
""".replace("@VERSION@", REFERENCE_VERSION)


_READ_VALIDATED = """
import json, sys
import dataset_rt as drt
rt = drt.DatasetRuntime(num_workers=1)
config = drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True)
ds = rt.cached_dataset([sys.argv[1]], reader_config=config)
print(json.dumps([[s.sample_id, s.data.decode(), s.metadata] for s in ds]))
"""


class ReferenceUnavailable(Exception):
    """The reference cannot be installed because the package registry is unreachable."""


CI_ENV_VAR = "CI"


def running_in_ci() -> bool:
    """Whether ``CI`` is set to a true value (anything but empty, ``0``, ``false``, ``no``)."""
    value = os.environ.get(CI_ENV_VAR, "").strip().lower()
    return value not in ("", "0", "false", "no")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the current test because a virtualenv it needs cannot be installed from the
    package registry (``reason`` says why); under CI (:func:`running_in_ci`) fail with
    that reason instead, so that CI never passes by skipping these suites.

    Only for registry problems: skips for other reasons (io_uring refused by the kernel,
    a missing system tool) stay ``pytest.skip``."""
    __tracebackhide__ = True  # report the calling test, not this helper
    if running_in_ci():
        pytest.fail(
            f"{reason} (the {CI_ENV_VAR} environment variable is set: suites that need the "
            "package registry must run, not skip)",
            pytrace=False,
        )
    pytest.skip(reason)


class ReferenceSetupError(Exception):
    """Building or checking the reference virtualenv failed for another reason."""


@dataclass(frozen=True)
class ReferenceEnv:
    """A working virtualenv with dataset-rt 0.4.8."""

    venv: Path
    python: Path

    def run(
        self, script: str, *args: str, timeout: float = RUN_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run ``script`` (Python source) in the reference virtualenv; see :func:`run_reference`."""
        return _run_script(self.python, script, args, timeout)

    def read_validated(self, cache: Path) -> Any:
        """``[[sample_id, data as text, metadata], ...]`` of the cache ``cache`` read in
        order by dataset-rt 0.4.8 with ``validate_cache=True`` (an AssertionError with its
        stderr when it fails)."""
        proc = self.run(_READ_VALIDATED, str(cache))
        if proc.returncode != 0:
            raise AssertionError(f"dataset-rt 0.4.8 could not read {cache}:\n{proc.stderr}")
        return json.loads(proc.stdout)


def default_venv_dir() -> Path:
    """``~/.cache/dataset_rt-tests/ref-<version>-py<major>.<minor>`` (or ``$XDG_CACHE_HOME``)."""
    override = os.environ.get(VENV_ENV_VAR)
    if override:
        return Path(override).expanduser()
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    tag = f"ref-{REFERENCE_VERSION}-py{sys.version_info.major}.{sys.version_info.minor}"
    return Path(cache_home) / "dataset_rt-tests" / tag


def _venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def _expected_marker(requirement: str = REFERENCE_REQUIREMENT) -> dict[str, object]:
    return {
        "schema": MARKER_SCHEMA,
        "requirement": requirement,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def _marker_ok(venv_dir: Path, expected: dict[str, object]) -> bool:
    """True when the virtualenv was completed by a successful install and import check."""
    marker = venv_dir / MARKER_NAME
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(recorded, dict):
        return False
    if any(recorded.get(key) != value for key, value in expected.items()):
        return False
    python = _venv_python(venv_dir)
    # The base interpreter the venv links to may have gone away (e.g. a Python upgrade).
    return python.exists() and os.access(python, os.X_OK)


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in (
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONSAFEPATH",
        "VIRTUAL_ENV",
        "PYTHONUSERBASE",
    ):
        env.pop(key, None)
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _last_error_line(output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    if errors:
        return errors[-1]
    return lines[-1] if lines else "(pip printed nothing)"


def _base_python() -> str:
    """The interpreter to build the virtualenv from (not the project's venv wrapper)."""
    # venv follows sys._base_executable itself; keep the project's venv out of the picture.
    return getattr(sys, "_base_executable", None) or sys.executable


def _build(
    venv_dir: Path,
    requirements: tuple[str, ...],
    check: Callable[[Path], tuple[bool, str]],
    marker: dict[str, object],
) -> None:
    """Create the virtualenv, pip install ``requirements``, run ``check``, write the marker."""
    what = " ".join(requirements)
    if venv_dir.exists():
        shutil.rmtree(venv_dir)
    builder = venv.EnvBuilder(with_pip=True, clear=True, symlinks=True)
    try:
        builder.create(venv_dir)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ReferenceSetupError(f"could not create the virtualenv {venv_dir}: {exc}") from exc
    python = _venv_python(venv_dir)
    command = [
        str(python),
        "-m",
        "pip",
        "install",
        "--no-input",
        "--disable-pip-version-check",
        "--retries",
        "2",
        *requirements,
    ]
    try:
        proc = subprocess.run(
            command,
            env=_clean_env(),
            cwd=venv_dir,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ReferenceUnavailable(
            f"pip install {what} timed out after {INSTALL_TIMEOUT_S:.0f} s"
        ) from exc
    if proc.returncode != 0:
        output = proc.stdout + "\n" + proc.stderr
        reason = _last_error_line(output)
        network = [
            line.strip()
            for line in output.splitlines()
            if any(marker in line for marker in NETWORK_ERROR_MARKERS)
        ]
        if network:
            reason = f"{reason} (after: {network[-1][:240]})"
            raise ReferenceUnavailable(f"cannot install {what} (registry unreachable): {reason}")
        raise ReferenceSetupError(
            f"pip install {what} failed (exit {proc.returncode}): {reason}\n{output[-4000:]}"
        )
    good, detail = check(python)
    if not good:
        raise ReferenceSetupError(f"the virtualenv {venv_dir} failed its check:\n{detail}")
    recorded = dict(marker)
    recorded["base_python"] = _base_python()
    tmp_marker = venv_dir / (MARKER_NAME + ".partial")
    tmp_marker.write_text(json.dumps(recorded, indent=2), encoding="utf-8")
    os.replace(tmp_marker, venv_dir / MARKER_NAME)


def _ensure(
    venv_dir: Path,
    requirements: tuple[str, ...],
    check: Callable[[Path], tuple[bool, str]],
    marker: dict[str, object],
) -> None:
    """Build ``venv_dir`` unless its marker matches; serialized across processes."""
    if not _marker_ok(venv_dir, marker):
        with _exclusive_lock(venv_dir.parent / (venv_dir.name + ".lock")):
            # Another process may have finished it while we waited for the lock.
            if not _marker_ok(venv_dir, marker):
                _build(venv_dir, requirements, check, marker)


def _check_reference(python: Path) -> tuple[bool, str]:
    check = _run_script(python, "print('ok')", (), CHECK_TIMEOUT_S)
    good = check.returncode == 0 and check.stdout.strip() == "ok"
    return good, f"dataset_rt {REFERENCE_VERSION} import: {check.stdout}\n{check.stderr}"


def ensure_reference(venv_dir: Path | None = None, *, extra: tuple[str, ...] = ()) -> ReferenceEnv:
    """The reference virtualenv, built first if needed (safe to call concurrently).

    ``extra`` requirements (e.g. ``("torch==2.13.0",)``) are installed beside the
    reference, in a virtualenv of their own (``ref-0.4.8+torch==2.13.0-py3.11``).
    Raises ReferenceUnavailable when the registry cannot be reached, ReferenceSetupError
    for any other failure.
    """
    venv_dir = Path(venv_dir) if venv_dir is not None else default_venv_dir()
    if extra:
        venv_dir = venv_dir.with_name(
            venv_dir.name.replace("-py", "+" + "+".join(extra) + "-py", 1)
        )
    requirements = (REFERENCE_REQUIREMENT, *extra)
    marker = _expected_marker(" ".join(requirements))
    _ensure(venv_dir, requirements, _check_reference, marker)
    return ReferenceEnv(venv=venv_dir, python=_venv_python(venv_dir))


REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ExtraEnv:
    """A pip-made virtualenv with optional packages, run together with this checkout."""

    venv: Path
    python: Path

    def environ(self) -> dict[str, str]:
        """Environment for processes in this virtualenv: this checkout and the uv
        environment's packages on ``PYTHONPATH`` (after the extra packages, which the
        interpreter's own site-packages provide)."""
        env = _clean_env()
        project_site = sysconfig.get_paths()["purelib"]
        env["PYTHONPATH"] = os.pathsep.join((str(REPO_ROOT), project_site))
        return env

    def run(
        self,
        args: list[str],
        *,
        cwd: Path,
        timeout: float = RUN_TIMEOUT_S,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python args...`` in this virtualenv (``args`` start with a script or ``-m``)."""
        full_env = self.environ()
        full_env.update(env or {})
        return subprocess.run(
            [str(self.python), *args],
            env=full_env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def ensure_extra(name: str, requirements: tuple[str, ...], probe: str) -> ExtraEnv:
    """A virtualenv with ``requirements`` pip-installed, built on first use.

    ``probe`` is Python source that must print ``ok`` with this checkout importable (for
    example ``import torch, dataset_rt; print('ok')``). Raises ReferenceUnavailable when
    the registry cannot be reached, ReferenceSetupError for any other failure.
    """
    version = f"py{sys.version_info.major}.{sys.version_info.minor}"
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    venv_dir = Path(cache_home) / "dataset_rt-tests" / f"extra-{name}-{version}"
    marker = _expected_marker(" ".join(requirements))

    def check(python: Path) -> tuple[bool, str]:
        env = ExtraEnv(venv_dir, python)
        with tempfile.TemporaryDirectory(prefix="dataset_rt-extra-") as work:
            proc = env.run(["-c", probe], cwd=Path(work), timeout=CHECK_TIMEOUT_S)
        return proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr

    _ensure(venv_dir, requirements, check, marker)
    return ExtraEnv(venv_dir, _venv_python(venv_dir))


def _run_script(
    python: Path, script: str, args: tuple[str, ...] | list[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="dataset_rt-ref-") as workdir:
        work = Path(workdir)
        (work / "prelude.py").write_text(_PRELUDE, encoding="utf-8")
        (work / "script.py").write_text(script, encoding="utf-8")
        return subprocess.run(
            [str(python), "-I", str(work / "prelude.py"), str(work / "script.py"), *map(str, args)],
            env=_clean_env(),
            cwd=work,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def run_reference(
    script: str, *args: str, timeout: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run Python source ``script`` with dataset-rt 0.4.8 and return the finished process.

    ``args`` become ``sys.argv[1:]``. The interpreter runs isolated (``-I``, no
    ``PYTHONPATH``) in a fresh temporary working directory, so it cannot import this
    project's ``dataset_rt``. Builds the virtualenv on first use (see
    :func:`ensure_reference` for the exceptions).
    """
    return ensure_reference().run(script, *args, timeout=timeout)


if __name__ == "__main__":
    # `python tests/refenv.py` builds (or checks) the virtualenv and prints its path.
    env = ensure_reference()
    print(env.python)
