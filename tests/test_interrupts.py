"""Real signals during writes: SIGINT stops cleanly, SIGKILL never publishes a partial cache."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import dataset_rt as drt

ROOT = Path(__file__).resolve().parents[1]

WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import dataset_rt as drt

    class Source:
        def __init__(self, name, count):
            self.name, self.count = name, count
        def __iter__(self):
            marker = Path(sys.argv[1]) / f"started-{self.name}"
            for i in range(self.count):
                if i == 100:
                    marker.touch()
                if self.count > 1000:
                    time.sleep(0.0002)
                yield drt.CacheInput(bytes([i % 256]) * 4096, {"i": i, "s": str(i)})

    base = Path(sys.argv[1]) / "base"
    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(show_progress=False, max_shard_bytes=256 * 1024)
    names = sys.argv[2:]
    for name in names:
        count = 50 if name.startswith("small") else 1_000_000
        print(runtime.write_cache(Source(name, count), base, writer_config=config), flush=True)
    """
)


def start(tmp_path: Path, *names: str) -> subprocess.Popen[str]:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), *names],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(path: Path, process: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(process.stderr.read() if process.stderr else "writer exited")
        if time.monotonic() > deadline:
            raise AssertionError("writer did not start")
        time.sleep(0.01)


def published(base: Path) -> list[Path]:
    return sorted(p for p in base.iterdir() if p.name != "tmp") if base.exists() else []


def test_sigint_stops_promptly_and_cleans_up(tmp_path: Path) -> None:
    process = start(tmp_path, "small-a", "big", "small-b")
    wait_for(tmp_path / "started-big", process)
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - sent < 10
    assert "KeyboardInterrupt" in stderr
    base = tmp_path / "base"
    assert [p.name for p in published(base)] == ["small-a"]
    assert list((base / "tmp").iterdir()) == []


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_sigkill_never_publishes_a_partial_cache(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    names = [f"small-{i}" for i in range(rng.randint(0, 3))] + ["big"]
    process = start(tmp_path, *names)
    wait_for(tmp_path / "started-big", process)
    time.sleep(rng.uniform(0, 0.5))
    process.kill()
    process.wait(timeout=30)
    base = tmp_path / "base"
    runtime = drt.DatasetRuntime(num_workers=2)
    for cache in published(base):
        dataset = runtime.cached_dataset(
            [cache], reader_config=drt.ReaderConfig(seed=0, validate_cache=True)
        )
        assert len(list(dataset)) == 50
    assert not (base / "big").exists()

    # The killed writer's staging directory is swept by the next writer under the base.
    class Again:
        name = "big"

        def __iter__(self):
            yield drt.CacheInput(b"x", {"i": 1, "s": "1"})

    [result] = runtime.write_cache(
        Again(), base, writer_config=drt.WriterConfig(show_progress=False)
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    assert list((base / "tmp").iterdir()) == []


def test_sweep_leaves_live_writers_alone(tmp_path: Path) -> None:
    process = start(tmp_path, "big")
    wait_for(tmp_path / "started-big", process)
    try:
        raw = os.fsencode(tmp_path / "base")
        from dataset_rt._native import lib

        assert lib.drt_staging_sweep(raw, len(raw)) == 0
        assert len(list((tmp_path / "base" / "tmp").iterdir())) == 1
    finally:
        process.kill()
        process.wait(timeout=30)


GET_ITEM_INTERRUPTS = textwrap.dedent(
    """
    import random, signal, sys
    import dataset_rt as drt

    class Small:
        name = "small"
        def __iter__(self):
            for i in range(64):
                yield drt.CacheInput(bytes([i]) * 100, {"i": i})

    rt = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(show_progress=False)
    [result] = rt.write_cache(Small(), sys.argv[1], writer_config=config)
    ds = rt.cached_dataset([result.path], reader_config=drt.ReaderConfig(seed=0))
    cid = next(iter(ds)).cache_id
    ds.get_item(cid, 0)
    rnd = random.Random(0)
    signal.signal(signal.SIGALRM, signal.default_int_handler)
    for rep in range(300):
        signal.setitimer(signal.ITIMER_REAL, rnd.uniform(0.0005, 0.005))
        try:
            while True:
                ds.get_item(cid, 7)
        except KeyboardInterrupt:
            pass
        signal.setitimer(signal.ITIMER_REAL, 0)
        if ds._lookup_lock.locked():
            sys.exit(f"interrupt {rep + 1} left the lookup lock held")
        assert ds.get_item(cid, 8).data == bytes([8]) * 100
    print("ok")
    """
)


def test_ctrl_c_during_get_item_leaves_it_usable(tmp_path: Path) -> None:
    """Ctrl-C (KeyboardInterrupt) landing anywhere in ``get_item``, 300 times: the dataset's
    lookup lock is never left held, so the next ``get_item`` returns (an interrupt right
    after the lock's acquire() call, before its try block, blocked every later call)."""
    done = subprocess.run(
        [sys.executable, "-c", GET_ITEM_INTERRUPTS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
