"""Shared test fixtures: reference caches copied into the repository, and helpers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import zig_tests

# The S3 server fixtures of the remote-cache tests (tests/remote_server.py).
from remote_server import s3_bucket, s3_server  # noqa: F401

FIXTURES = Path(__file__).parent / "fixtures" / "dataset-rt-0.4.8"
FIXTURE_NAMES = [
    "plain_one_shard",
    "plain_many_shards",
    "lz4_many_shards",
    "unicode_é_name",
    "text_records_v1",
]


def expected(name: str) -> dict[str, Any]:
    """The expected.json of a reference cache."""
    return json.loads((FIXTURES / f"{name}.expected.json").read_text(encoding="utf-8"))


def copy_writable(source: Path, target: Path) -> Path:
    """Copy the tree ``source`` to ``target`` with writable permissions; returns target."""
    shutil.copytree(source, target)
    for path in target.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return target


def snapshot(root: Path) -> dict[str, str]:
    """Relative path -> content hash (or kind) of everything under ``root`` (a file: its
    hash under ".")."""
    if root.is_file():
        return {".": hashlib.sha256(root.read_bytes()).hexdigest()}
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def fixture_copy(tmp_path: Path):
    """Copy a reference cache into a writable temporary directory."""

    def copy(name: str) -> Path:
        return copy_writable(FIXTURES / name, tmp_path / "copies" / name)

    return copy


@pytest.fixture(scope="session")
def runtime():
    import dataset_rt as drt

    return drt.DatasetRuntime(num_workers=2)


def io_uring_available() -> bool:
    """Whether datasets here can read with io_uring (the library's own probe)."""
    import dataset_rt as drt

    return bool(drt.native_info()["io_uring_available"])


@pytest.fixture(params=["io_uring", "threads"])
def io_backend(request: pytest.FixtureRequest) -> str:
    """Every read test runs on both I/O backends; io_uring skips where the kernel refuses it."""
    if request.param == "io_uring" and not io_uring_available():
        pytest.skip("io_uring is not available here (kernel or seccomp refuses io_uring_setup)")
    return request.param


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the Zig unit tests in the background when they were selected, so that they
    run beside the Python tests (tests/zig_tests.py)."""
    if any(
        item.name == "test_zig_unit_tests" and item.path.name == "test_native.py"
        for item in session.items
    ):
        zig_tests.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    zig_tests.stop()
