"""WriterProfilerConfig(enabled=True): the JSON stage summary of reference section 5.6."""

from __future__ import annotations

import json
from pathlib import Path

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
    assert stages["python_next"]["calls"] == 300  # the final StopIteration is not counted
    assert stages["record_encode"]["calls"] == 300
    assert stages["compression"]["bytes"] == 300 * 64
    assert all(
        s["total_ns"] >= 0 and set(s) == {"name", "calls", "total_ns", "bytes"}
        for s in stages.values()
    )
    failed = {stage["name"] for stage in document["sources"][1]["stages"]}
    assert "python_next" in failed and "publish" not in failed
