"""WriterProfilerConfig(enabled=True): the JSON stage summary of reference section 5.6."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dataset_rt as drt
from tests.sources import Failing, Numbers


def test_profile_written_also_after_failures(runtime, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    config = drt.WriterConfig(
        show_progress=False,
        num_processes=2,  # ignored with the profiler on, as in the reference
        shard_compression=drt.ShardCompression(algo="lz4"),
        profiler=drt.WriterProfilerConfig(enabled=True, path=out),
    )
    results = runtime.write_cache(
        [Numbers("a", count=300), Failing("b")], tmp_path / "base", writer_config=config
    )
    assert isinstance(results[0], drt.CacheWriteSuccess)
    assert results[1] == drt.CacheWriteError("b", "Python error: RuntimeError: boom in child")
    document = json.loads(out.read_text())
    assert document["format_version"] == 1 and document["elapsed_ns"] > 0
    assert [s["source_name"] for s in document["sources"]] == ["a", "b"]
    stages = {stage["name"]: stage for stage in document["sources"][0]["stages"]}
    assert set(stages) == {
        "compression",
        "disk_write",
        "finish_index",
        "finish_manifest",
        "finish_metadata",
        "ingress_wait",
        "metadata_validate",
        "publish",
        "python_extract",
        "python_next",
        "record_encode",
        "shard_flush",
    }
    assert list(stages) == sorted(stages)
    # Every next() on the source, including the one that ends it (as 0.4.8 counts).
    assert stages["python_next"]["calls"] == 301
    assert stages["python_extract"]["calls"] == 300
    assert stages["record_encode"]["calls"] == 300
    assert stages["compression"]["bytes"] == 300 * 64
    assert all(
        s["total_ns"] >= 0 and set(s) == {"name", "calls", "total_ns", "bytes"}
        for s in stages.values()
    )
    failed = {stage["name"]: stage for stage in document["sources"][1]["stages"]}
    assert "publish" not in failed
    assert failed["python_next"]["calls"] == 4  # 3 samples, then the call that raised


@pytest.mark.parametrize("size", [64, 100_000])  # copied into records / written directly
def test_uncompressed_writes_report_the_compression_stage(
    runtime, tmp_path: Path, size: int
) -> None:
    """Without compression the stage is still reported, one call per record with its
    payload bytes, as 0.4.8 reports it whatever the algorithm."""
    out = tmp_path / "profile.json"
    config = drt.WriterConfig(
        show_progress=False, profiler=drt.WriterProfilerConfig(enabled=True, path=out)
    )
    results = runtime.write_cache(
        [Numbers("a", count=30, size=size)], tmp_path / "base", writer_config=config
    )
    assert isinstance(results[0], drt.CacheWriteSuccess)
    source = json.loads(out.read_text())["sources"][0]
    stages = {stage["name"]: stage for stage in source["stages"]}
    assert (stages["compression"]["calls"], stages["compression"]["bytes"]) == (30, 30 * size)
    assert stages["record_encode"]["calls"] == 30


# Run unchanged by this project and by dataset-rt 0.4.8: the calls of the per-sample
# Python stages for sources of 3 samples, failing at the third next(), failing after the
# last sample, and empty.
PROFILE_SCRIPT = r"""
import json, sys
from pathlib import Path
import dataset_rt as drt


class Source:
    def __init__(self, name, count, fail_at=None):
        self.name, self.count, self.fail_at = name, count, fail_at

    def __iter__(self):
        for i in range(self.count + 1):
            if i == self.fail_at:
                raise KeyError("oops")
            if i < self.count:
                yield drt.CacheInput(bytes([i]), {"i": i})


work = Path(sys.argv[1])
config = drt.WriterConfig(
    show_progress=False, profiler=drt.WriterProfilerConfig(enabled=True, path=work / "p.json")
)
sources = [Source("ok", 3), Source("fails", 3, fail_at=2), Source("fails_late", 3, fail_at=3),
           Source("empty", 0)]
runtime = drt.DatasetRuntime(num_workers=1)
results = runtime.write_cache(sources, work / "caches", writer_config=config)
document = json.loads((work / "p.json").read_text())
print(json.dumps({
    "results": [[type(r).__name__, r.source_name] for r in results],
    "calls": [
        {s["name"]: s["calls"] for s in source["stages"] if s["name"].startswith("python_")}
        for source in document["sources"]
    ],
}))
"""


def run_profile_script(run, work: Path) -> dict:
    work.mkdir()
    proc = run(PROFILE_SCRIPT, str(work))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def run_here(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
    )


def test_python_next_counts_every_call(tmp_path: Path) -> None:
    report = run_profile_script(run_here, tmp_path / "ours")
    # Sources by name, as 0.4.8 lists them: empty, fails, fails_late, ok.
    assert report["calls"] == [
        {"python_next": 1},
        {"python_next": 3, "python_extract": 2},
        {"python_next": 4, "python_extract": 3},
        {"python_next": 4, "python_extract": 3},
    ]


@pytest.mark.compat
def test_profile_counts_match_0_4_8(tmp_path: Path) -> None:
    from refenv import ReferenceUnavailable, ensure_reference, skip_or_fail

    try:
        reference = ensure_reference()
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 reference unavailable: {exc}")
    ours = run_profile_script(run_here, tmp_path / "ours")
    assert ours == run_profile_script(reference.run, tmp_path / "ref")
