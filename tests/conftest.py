"""Shared test fixtures: reference caches copied into the repository, and helpers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

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


@pytest.fixture
def fixture_copy(tmp_path: Path):
    """Copy a reference cache into a writable temporary directory."""

    def copy(name: str) -> Path:
        target = tmp_path / "copies" / name
        shutil.copytree(FIXTURES / name, target)
        for path in target.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        return target

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
