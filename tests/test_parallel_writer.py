"""WriterConfig(num_processes=N): sources written by spawned processes (reference 4.4)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import dataset_rt as drt
from tests.sources import Exiting, Failing, Interrupting, InterruptingOpaque, Numbers, Slow


def config(**kwargs) -> drt.WriterConfig:
    return drt.WriterConfig(**{"num_processes": 2, "show_progress": False, **kwargs})


def staging(base: Path) -> list[Path]:
    return list((base / "tmp").iterdir()) if (base / "tmp").exists() else []


def test_results_in_order_and_identical_bytes(runtime, tmp_path: Path) -> None:
    sources = [Numbers("a"), Failing("b"), Numbers("c", count=0), Numbers("d", count=50)]
    results = runtime.write_cache(sources, tmp_path / "p", writer_config=config())
    assert results == [
        drt.CacheWriteSuccess("a", tmp_path / "p" / "a"),
        drt.CacheWriteError("b", "Python error: RuntimeError: boom in child"),
        drt.CacheWriteError("c", "cache source yielded no samples"),
        drt.CacheWriteSuccess("d", tmp_path / "p" / "d"),
    ]
    serial = runtime.write_cache(
        [Numbers("a"), Numbers("d", count=50)],
        tmp_path / "s",
        writer_config=drt.WriterConfig(show_progress=False),
    )
    for result in serial:
        for name in ("index.bin", "shards/000000.bin"):
            assert (result.path / name).read_bytes() == (
                tmp_path / "p" / result.source_name / name
            ).read_bytes()
    assert staging(tmp_path / "p") == []


def test_names_checked_up_front(runtime, tmp_path: Path) -> None:
    results = runtime.write_cache([Numbers("TMP"), Numbers("ok")], tmp_path, writer_config=config())
    assert results[0] == drt.CacheWriteError(
        "source[0]", "CacheSource.name must be a non-reserved plain path segment"
    )
    assert isinstance(results[1], drt.CacheWriteSuccess)
    # Every source fails, each under its own name (issue 15 item 4; 0.4.8 does the same,
    # see test_pool_matches_0_4_8), with the message naming the first colliding name.
    dup = runtime.write_cache(
        [Numbers("x"), Numbers("X"), Numbers("y")], tmp_path / "d", writer_config=config()
    )
    assert dup == [drt.CacheWriteError(name, "duplicate generated cache path: X") for name in "xXy"]
    assert not (tmp_path / "d").exists()
    unicode = runtime.write_cache(
        [Numbers("é"), Numbers("e\u0301"), Numbers("TMP")], tmp_path / "u", writer_config=config()
    )
    assert unicode == [
        drt.CacheWriteError("é", "duplicate generated cache path: e\u0301"),
        drt.CacheWriteError("e\u0301", "duplicate generated cache path: e\u0301"),
        drt.CacheWriteError(
            "source[2]", "CacheSource.name must be a non-reserved plain path segment"
        ),
    ]


def test_unpicklable_source(runtime, tmp_path: Path) -> None:
    class Local(Numbers):
        pass

    [result] = runtime.write_cache([Local("loc")], tmp_path, writer_config=config())
    assert result.source_name == "loc"
    assert result.message.startswith("source serialization failed: ")


def test_timeout_kills_and_cleans(runtime, tmp_path: Path) -> None:
    sources = [Slow("slow", count=200), Slow("slow2", count=200), Numbers("later")]
    results = runtime.write_cache(
        sources, tmp_path, writer_config=config(process_timeout_seconds=1.0)
    )
    assert results == [
        drt.CacheWriteError(s.name, "writer process timeout exceeded") for s in sources
    ]
    assert staging(tmp_path) == []
    assert not (tmp_path / "slow").exists()


def test_any_finite_timeout_is_a_deadline(runtime, tmp_path: Path) -> None:
    """A timeout beyond what one wait can take (about 24.8 days) is waited for in parts."""
    sources = [Numbers("a", count=5), Numbers("b", count=5)]
    results = runtime.write_cache(
        sources, tmp_path, writer_config=config(process_timeout_seconds=1e300)
    )
    assert results == [drt.CacheWriteSuccess(s.name, tmp_path / s.name) for s in sources]


def test_interrupt_in_child_is_reraised(runtime, tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        runtime.write_cache(
            [Interrupting("i"), Numbers("n")], tmp_path, writer_config=config(num_processes=1)
        )
    assert staging(tmp_path) == []
    assert not (tmp_path / "i").exists()


def test_interrupt_whose_arguments_cannot_travel_is_reraised(runtime, tmp_path: Path) -> None:
    """Arguments that cannot be pickled come back as their reprs; the interrupt is still
    raised (not turned into results)."""
    with pytest.raises(KeyboardInterrupt) as info:
        runtime.write_cache(
            [InterruptingOpaque("i"), Numbers("n")], tmp_path, writer_config=config(num_processes=1)
        )
    [text] = info.value.args
    assert "lock" in text
    assert staging(tmp_path) == []


def test_a_second_interrupt_does_not_cut_the_cleanup_short(
    runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C twice: the second lands while the pool cleans up after the first (here, in
    the sweep); the cleanup still finishes (no staging left) and an interrupt is raised."""
    from dataset_rt import parallel

    real_sweep = parallel._sweep
    calls: list[Path] = []

    def interrupted_once(base: Path) -> None:
        calls.append(base)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real_sweep(base)

    monkeypatch.setattr(parallel, "_sweep", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        runtime.write_cache(
            [Interrupting("i"), Slow("s", count=200)], tmp_path, writer_config=config()
        )
    assert len(calls) == 2
    assert staging(tmp_path) == []


def test_results_sent_before_a_worker_died_are_kept(
    runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that died and one that finished, seen at once: the finished source is a
    success (it is published), the rest fail as the pool stops."""
    import time

    from dataset_rt import parallel

    real_wait = parallel.wait

    def late_wait(conns, timeout=None):
        time.sleep(1.5)  # (a busy parent: both workers are done by the time it looks)
        return real_wait(conns, timeout)

    monkeypatch.setattr(parallel, "wait", late_wait)
    results = runtime.write_cache(
        [Exiting("dies"), Numbers("ok")], tmp_path, writer_config=config(num_processes=2)
    )
    assert results == [
        drt.CacheWriteError("dies", "writer child exited with code 3"),
        drt.CacheWriteSuccess("ok", tmp_path / "ok"),
    ]
    assert staging(tmp_path) == []


def test_worker_death_stops_the_pool(runtime, tmp_path: Path) -> None:
    """As in 0.4.8: a writer process that dies stops the pool; nothing is retried."""
    sources = [Numbers("first"), Exiting("dies"), Numbers("later"), Numbers("last")]
    results = runtime.write_cache(sources, tmp_path, writer_config=config(num_processes=1))
    assert results == [
        drt.CacheWriteSuccess("first", tmp_path / "first"),
        *(
            drt.CacheWriteError(name, "writer child exited with code 3")
            for name in ("dies", "later", "last")
        ),
    ]
    assert staging(tmp_path) == []
    assert not (tmp_path / "dies").exists()


# Run unchanged by this project (a fresh interpreter) and by dataset-rt 0.4.8
# (tests/refenv.py): a pool of 2 writer processes over 7 sources whose first source only
# finishes once the 6 others have started, then duplicate names. It prints what it saw.
POOL_SCRIPT = r"""
import hashlib, json, os, sys
from pathlib import Path

SOURCES = '''
import os, time
from pathlib import Path

import dataset_rt as drt


class Probe:
    def __init__(self, name, directory, wait_for=0):
        self.name, self.directory, self.wait_for = name, directory, wait_for

    def __iter__(self):
        directory = Path(self.directory)
        (directory / (self.name + ".pid")).write_text(str(os.getpid()))
        deadline = time.monotonic() + 60
        while len(list(directory.glob("*.pid"))) < self.wait_for + 1:
            if time.monotonic() > deadline:
                raise TimeoutError("the other sources were not written meanwhile")
            time.sleep(0.01)
        for i in range(30):
            yield drt.CacheInput(bytes([i % 251]) * (i * 7), {"i": i, "tag": self.name + str(i)})
'''


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main():
    work = Path(sys.argv[1])
    (work / "pool_sources.py").write_text(SOURCES)
    sys.path.insert(0, str(work))
    import dataset_rt as drt
    from pool_sources import Probe

    rt = drt.DatasetRuntime(num_workers=1)
    config = drt.WriterConfig(num_processes=2, show_progress=False, process_timeout_seconds=120)
    pids = work / "pids"
    pids.mkdir()
    names = ["slow"] + ["fast%d" % i for i in range(6)]
    sources = [Probe("slow", str(pids), wait_for=6)] + [Probe(n, str(pids)) for n in names[1:]]
    results = rt.write_cache(sources, work / "caches", writer_config=config)
    pid_of = {p.stem: int(p.read_text()) for p in pids.glob("*.pid")}
    report = {
        "results": [
            [type(r).__name__, r.source_name, str(r[1]).replace(str(work), "<work>")]
            for r in results
        ],
        "processes": len(set(pid_of.values())),
        "slow_alone": pid_of["slow"] not in {pid_of[n] for n in names[1:]},
        "in_parent": os.getpid() in pid_of.values(),
        "bytes": {
            n: [digest(work / "caches" / n / "index.bin"),
                digest(work / "caches" / n / "shards" / "000000.bin")]
            for n in names
        },
        "duplicates": [],
    }
    for group in (["x", "X", "y"], ["Case", "case"], ["\u00e9", "e\u0301"]):
        out = rt.write_cache(
            [Probe(n, str(pids)) for n in group], work / "dups", writer_config=config
        )
        report["duplicates"].append([[r.source_name, r.message] for r in out])
    print(json.dumps(report))


if __name__ == "__main__":
    main()
"""


def run_here(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with this project's dataset_rt in a fresh interpreter."""
    path = Path(args[0]) / "script.py"
    path.write_text(script, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(path), *args], capture_output=True, text=True, timeout=300, check=False
    )


def run_pool_script(run, work: Path) -> dict:
    work.mkdir()
    proc = run(POOL_SCRIPT, str(work))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_pool_reuses_workers_and_hands_out_sources_dynamically(tmp_path: Path) -> None:
    report = run_pool_script(run_here, tmp_path / "ours")
    names = ["slow"] + [f"fast{i}" for i in range(6)]
    assert report["results"] == [["CacheWriteSuccess", n, f"<work>/caches/{n}"] for n in names]
    # 2 processes wrote all 7 sources (one process per source would be 7), and while
    # "slow" held one, the other wrote all six others (a static split would leave "slow"
    # waiting for sources queued behind it).
    assert report["processes"] == 2 and report["slow_alone"] and not report["in_parent"]
    # Bytes identical to writing in this process.
    sys.path.insert(0, str(tmp_path / "ours"))
    try:
        from pool_sources import Probe  # type: ignore[import-not-found]

        pids = tmp_path / "serial-pids"
        pids.mkdir()
        serial = drt.DatasetRuntime(num_workers=1).write_cache(
            [Probe(n, str(pids)) for n in names],
            tmp_path / "serial",
            writer_config=drt.WriterConfig(show_progress=False),
        )
    finally:
        sys.path.remove(str(tmp_path / "ours"))
        sys.modules.pop("pool_sources", None)
    for result in serial:
        assert [
            hashlib.sha256((result.path / name).read_bytes()).hexdigest()
            for name in ("index.bin", "shards/000000.bin")
        ] == report["bytes"][result.source_name]
    assert report["duplicates"] == [
        [[n, "duplicate generated cache path: X"] for n in ("x", "X", "y")],
        [[n, "duplicate generated cache path: case"] for n in ("Case", "case")],
        [[n, "duplicate generated cache path: e\u0301"] for n in ("\u00e9", "e\u0301")],
    ]


@pytest.mark.compat
def test_pool_matches_0_4_8(tmp_path: Path) -> None:
    """The same pool scenario in 0.4.8: the same results, process count, dynamic hand-out,
    duplicate errors and index/shard bytes."""
    from refenv import ReferenceUnavailable, ensure_reference, skip_or_fail

    try:
        reference = ensure_reference()
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 reference unavailable: {exc}")
    ours = run_pool_script(run_here, tmp_path / "ours")
    theirs = run_pool_script(reference.run, tmp_path / "ref")
    assert ours == theirs
