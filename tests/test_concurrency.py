"""Processes, threads, fork, interpreter exit and a full disk.

* Two processes writing the same source name into one base at the same moment end with
  exactly one published cache (complete, checksum-valid, all of one writer's samples)
  and one ``CacheWriteError(name, "cache path already exists: <base>/<name>")``; several
  rounds, the first one with a base that does not exist yet (both create it).
* Four processes reading one dataset at once (both I/O backends, with and without
  ``validate_cache``) all get the expected samples.
* A dataset or runtime used in a child made by ``os.fork()`` raises
  ``RuntimeError("dataset_rt objects cannot be used in a forked child process; create the
  runtime and dataset in the child")`` instead of hanging; every operation runs in its own
  forked child under a deadline, so a hang names the operation. What works in the child
  (plain state copied by fork: ``len``, ``set_epoch_len``, ``io_backend``) is pinned too,
  as is a fresh runtime in the child, a normal interpreter exit of the child (finalizers of
  inherited handles), and the parent's objects afterwards.
* The interpreter exits cleanly (exit status 0, nothing on stderr, within a deadline) when
  a script ends with datasets, live iterators and runtimes, for both I/O backends.
* Several iterators of one dataset consumed from several threads at once take disjoint
  windows whose union is the sequential stream (ordered and shuffled).
* A full disk during a write (a 2 MiB tmpfs; a loop-mounted ext4 image if tmpfs cannot
  be mounted; skipped if neither can) gives a ``CacheWriteError`` naming the OS error
  (ENOSPC, "No space left on device"), publishes nothing and leaves ``<base>/tmp`` empty,
  wherever the disk fills up (shards, index, metadata.arrow, manifest).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dataset_rt as drt
from tests.conftest import FIXTURES, expected, io_uring_available

ROOT = Path(__file__).resolve().parents[1]
FORK_MESSAGE = (
    "dataset_rt objects cannot be used in a forked child process; create the runtime and "
    "dataset in the child"
)
PLAIN_ONE_SHARD_ID = 4233350989699285984
SAME_SCHEMA = ["plain_one_shard", "plain_many_shards", "lz4_many_shards", "unicode_é_name"]
SCRIPT_TIMEOUT_S = 120.0


def run_script(
    tmp_path: Path, source: str, *args: str, timeout: float = SCRIPT_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run Python ``source`` in a fresh interpreter (cwd: the repository); a hang fails."""
    script = tmp_path / f"script-{time.monotonic_ns()}.py"
    script.write_text(textwrap.dedent(source), encoding="utf-8")
    try:
        return subprocess.run(
            [sys.executable, str(script), *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"script did not finish within {timeout} s (hang)\n"
            f"stdout:\n{exc.stdout}\nstderr:\n{exc.stderr}"
        ) from None


def last_json(output: str) -> Any:
    lines = [line for line in output.splitlines() if line.startswith("{") or line.startswith("[")]
    assert lines, output
    return json.loads(lines[-1])


BACKENDS = ["io_uring", "threads"]


def backend_or_skip(backend: str) -> str:
    if backend == "io_uring" and not io_uring_available():
        pytest.skip("io_uring is not available here (kernel or seccomp refuses io_uring_setup)")
    return backend


# ------------------------------------------------------------ two writers, one name

WRITER = """
    import json, os, sys, time
    from pathlib import Path
    import dataset_rt as drt

    base, name, writer, go = sys.argv[1:5]
    count, size = int(sys.argv[5]), int(sys.argv[6])

    class Source:
        def __init__(self):
            self.name = name
        def __iter__(self):
            for i in range(count):
                payload = f"{writer}:{i}:".encode() + bytes([i % 251]) * size
                yield drt.CacheInput(payload, {"writer": writer, "i": i})

    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(show_progress=False, max_shard_bytes=64 * 1024)
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.0005)
    [result] = runtime.write_cache(Source(), base, writer_config=config)
    if isinstance(result, drt.CacheWriteSuccess):
        print(json.dumps({"ok": True, "name": result.source_name, "path": str(result.path)}))
    else:
        print(json.dumps({"ok": False, "name": result.source_name, "message": result.message}))
"""


def writer_payload(writer: str, i: int, size: int) -> bytes:
    return f"{writer}:{i}:".encode() + bytes([i % 251]) * size


# (samples per writer A, samples per writer B, payload bytes): equal sizes race at the
# rename; unequal ones have one writer publish while the other is still writing.
ROUNDS = [
    (300, 300, 100),
    (50, 50, 10),
    (2000, 2000, 300),
    (2000, 20, 300),
    (20, 2000, 300),
    (1, 1, 0),
]


@pytest.mark.parametrize("round_", range(len(ROUNDS)))
def test_two_writers_of_one_name_publish_exactly_one_cache(tmp_path: Path, round_: int) -> None:
    count_a, count_b, size = ROUNDS[round_]
    base = tmp_path / "base"  # does not exist yet: both writers create it
    name = "shared"
    go = tmp_path / "go"
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(WRITER), encoding="utf-8")
    processes = {
        writer: subprocess.Popen(
            [sys.executable, str(script), str(base), name, writer, str(go), str(count), str(size)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for writer, count in (("A", count_a), ("B", count_b))
    }
    try:
        for process in processes.values():
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready", (
                process.stderr.read() if process.stderr else ""
            )
        go.touch()
        outputs = {
            writer: process.communicate(timeout=SCRIPT_TIMEOUT_S)
            for writer, process in processes.items()
        }
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    results = {}
    for writer, (stdout, stderr) in outputs.items():
        assert processes[writer].returncode == 0, stderr
        results[writer] = last_json(stdout)
    winners = [w for w, r in results.items() if r["ok"]]
    losers = [w for w, r in results.items() if not r["ok"]]
    assert len(winners) == 1 and len(losers) == 1, results
    [winner], [loser] = winners, losers
    assert results[winner] == {"ok": True, "name": name, "path": str(base / name)}
    assert results[loser] == {
        "ok": False,
        "name": name,
        "message": f"cache path already exists: {base}/{name}",
    }
    # Exactly one cache, complete and checksum-valid, holding only the winner's samples.
    assert sorted(p.name for p in base.iterdir()) == [name, "tmp"]
    assert list((base / "tmp").iterdir()) == []
    count = count_a if winner == "A" else count_b
    dataset = drt.DatasetRuntime(num_workers=2).cached_dataset(
        [base / name], reader_config=drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True)
    )
    samples = list(dataset)
    assert len(samples) == count
    for i, sample in enumerate(samples):
        assert sample.metadata == {"i": i, "writer": winner}
        assert sample.data == writer_payload(winner, i, size)


# ------------------------------------------------------------ many readers at once

READER = """
    import hashlib, json, os, random, sys, time
    from pathlib import Path
    import dataset_rt as drt

    backend, validate, go = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    paths = [Path(p) for p in sys.argv[4:]]
    want = {}
    for path in paths:
        rows = json.loads(Path(str(path) + ".expected.json").read_text(encoding="utf-8"))["samples"]
        want[path.name] = {row["sample_id"]: (row["sha256"], row["metadata"]) for row in rows}
    runtime = drt.DatasetRuntime(num_workers=2)
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.0005)
    failures = []
    checked = 0

    ids = {p.name: json.loads((p / "manifest.json").read_bytes())["cache_id"] for p in paths}
    names = {cache_id: name for name, cache_id in ids.items()}

    def check(sample):
        global checked
        sha, metadata = want[names[sample.cache_id]][sample.sample_id]
        if hashlib.sha256(sample.data).hexdigest() != sha or sample.metadata != metadata:
            failures.append((sample.cache_id, sample.sample_id))
        checked += 1

    for shuffle in (False, True):
        config = drt.ReaderConfig(
            seed=11, shuffle=shuffle, validate_cache=validate, io_backend=backend, prefetch_size=16
        )
        dataset = runtime.cached_dataset(paths, reader_config=config)
        for _ in range(1 if not shuffle else 2):
            seen = [(s.cache_id, s.sample_id, check(s)) for s in dataset]
            physical = [(ids[p.name], i) for p in paths for i in sorted(want[p.name])]
            if not shuffle and [(c, i) for c, i, _ in seen] != physical:
                failures.append("ordered epoch out of order")
        for batch in dataset.iter_batches(32):
            for i in range(len(batch)):
                sha, _ = want[names[int(batch.cache_id[i])]][int(batch.sample_id[i])]
                if hashlib.sha256(batch.payload(i)).hexdigest() != sha:
                    failures.append(("batch", int(batch.sample_id[i])))
                checked += 1
        everything = [(ids[p.name], i) for p in paths for i in want[p.name]]
        random.Random(3).shuffle(everything)
        for cache_id, sample_id in everything:
            check(dataset.get_item(cache_id, sample_id))
    print(json.dumps({"failures": failures[:20], "checked": checked}))
"""


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate_cache"])
def test_many_processes_read_one_dataset_at_once(tmp_path: Path, validate: bool) -> None:
    backends = ["io_uring", "threads"] if io_uring_available() else ["threads"]
    paths = [str(FIXTURES / name) for name in SAME_SCHEMA]
    go = tmp_path / "go"
    script = tmp_path / "reader.py"
    script.write_text(textwrap.dedent(READER), encoding="utf-8")
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                backends[i % len(backends)],
                "1" if validate else "0",
                str(go),
                *paths,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready", (
                process.stderr.read() if process.stderr else ""
            )
        go.touch()
        outputs = [process.communicate(timeout=SCRIPT_TIMEOUT_S) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    total = sum(len(expected(name)["samples"]) for name in SAME_SCHEMA)
    for process, (stdout, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr
        result = last_json(stdout)
        assert result["failures"] == []
        # Per mode: one ordered or two shuffled epochs, one batched epoch, get_item of all.
        assert result["checked"] == (1 + 1 + 1) * total + (2 + 1 + 1) * total


# --------------------------------------------------------------------------- fork

# One interpreter per backend runs every operation (the imports and Polars' first use,
# about 2 s, once): for each, it opens the dataset and live objects afresh, forks a child
# that runs the operation alone under a deadline, then checks its own objects. So each
# child starts from the same state, as if its script ran alone.
FORK = """
    import faulthandler, json, os, sys, threading, time
    from pathlib import Path
    import dataset_rt as drt

    backend, bases, CACHE = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    CACHE_ID = 4233350989699285984
    FORK_TIMEOUT = 10

    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.ReaderConfig(seed=0, shuffle=False, io_backend=backend)
    warm = runtime.cached_dataset([CACHE], reader_config=config)
    warm.update_metadata(warm.get_metadata().head(50))      # Polars has run in the parent
    exported = bases / "export"
    exported.mkdir()
    snapshot = warm.dump_config(exported)                     # (7 columns: Polars' pool)


    def fork_with(op, base):
        dataset = runtime.cached_dataset([CACHE], reader_config=config)
        untouched = runtime.cached_dataset([CACHE], reader_config=config)  # metadata unasked
        table = dataset.get_metadata()                           # cached in the dataset
        iterator = iter(dataset)
        first = next(iterator).sample_id                         # a live iterator, mid-window
        assert dataset.get_item(CACHE_ID, 5).sample_id == 5      # a live lookup

        iterated = []

        class Source:
            name = "from_child"
            def __iter__(self):
                iterated.append(True)
                yield drt.CacheInput(b"x", {"i": 1})

        def attempt(fn):
            try:
                return {"ok": repr(fn())[:200]}
            except BaseException as exc:
                return {"error": [type(exc).__name__, str(exc)]}

        quiet = drt.WriterConfig(show_progress=False)

        def reopen():
            return runtime.cached_dataset([CACHE], reader_config=config)

        def write():
            return runtime.write_cache(Source(), base, writer_config=quiet)

        def write_and_load():
            return runtime.from_cache_sources(
                Source(), base, reader_config=config, writer_config=quiet
            )

        def writing(fn):
            return {**attempt(fn), "iterated": bool(iterated), "base_exists": base.exists()}

        def inherited_iterator():
            got = []
            try:
                for sample in iterator:
                    got.append(sample.sample_id)
            except BaseException as exc:
                return {"samples": got, "error": [type(exc).__name__, str(exc)]}
            return {"samples": got, "error": None}

        def fresh():
            own = drt.DatasetRuntime(num_workers=2)
            ds = own.cached_dataset([CACHE], reader_config=config)
            ids = [s.sample_id for s in ds]
            return ids == list(range(120)) and ds.get_item(CACHE_ID, 7).sample_id == 7

        def from_config():
            # As guide-torch.md recommends in a DataLoader worker's worker_init_fn.
            ds = drt.CachedDataset.from_config(snapshot)
            return [s.sample_id for s in ds] == list(range(50))

        OPS = {
            "from_config": lambda: attempt(from_config),
            "len": lambda: attempt(lambda: len(dataset)),
            "iter": lambda: attempt(lambda: next(iter(dataset))),
            "iter_batches": lambda: attempt(lambda: next(dataset.iter_batches(4))),
            "get_item": lambda: attempt(lambda: dataset.get_item(CACHE_ID, 3)),
            "get_item_locked": lambda: attempt(lambda: dataset.get_item(CACHE_ID, 3)),
            "get_items_locked": lambda: attempt(lambda: dataset.get_items([CACHE_ID], [3])),
            "get_item_busy": lambda: attempt(lambda: dataset.get_item(CACHE_ID, 3)),
            "set_epoch_len": lambda: attempt(lambda: dataset.set_epoch_len(3)),
            "io_backend": lambda: attempt(lambda: dataset.io_backend),
            "get_metadata_cached": lambda: attempt(lambda: dataset.get_metadata().shape),
            "get_metadata_uncached": lambda: attempt(lambda: untouched.get_metadata().shape),
            "update_metadata": lambda: attempt(lambda: dataset.update_metadata(table)),
            "cached_dataset": lambda: attempt(reopen),
            "write_cache": lambda: writing(write),
            "from_cache_sources": lambda: writing(write_and_load),
            "inherited_iterator": inherited_iterator,
            "fresh_runtime": lambda: attempt(fresh),
        }

        # "_locked": another thread of the parent holds the dataset's Python locks at the
        # fork (as a thread in get_item would); they never come free in the child.
        unhold = threading.Event()
        helper = None
        if op.endswith("_locked"):
            held = threading.Event()
            def hold():
                with dataset._lookup_lock, dataset._state_lock:
                    held.set()
                    unhold.wait()
            helper = threading.Thread(target=hold, daemon=True)
            helper.start()
            held.wait()
        # "_busy": another thread of the parent is (almost always) inside the native lookup
        # at the fork, whose in-use flag the child inherits.
        if op.endswith("_busy"):
            import numpy as np
            many = np.full(60000, CACHE_ID, np.uint64), np.arange(60000, dtype=np.uint64) % 120
            def hammer():
                while not unhold.is_set():
                    dataset.get_items(*many, copy=False)
            helper = threading.Thread(target=hammer, daemon=True)
            helper.start()
            time.sleep(0.2)

        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            faulthandler.dump_traceback_later(FORK_TIMEOUT, exit=True)  # a hang: stack + exit 1
            result = OPS[op]()
            faulthandler.cancel_dump_traceback_later()
            os.write(write_end, json.dumps(result).encode())
            os.close(write_end)
            # A normal interpreter exit: the inherited handles are finalized in the child.
            sys.exit(0)
        os.close(write_end)
        unhold.set()
        if helper is not None:
            helper.join()
        chunks = []
        while chunk := os.read(read_end, 1 << 16):
            chunks.append(chunk)
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
        child = json.loads(b"".join(chunks)) if chunks else None
        # The parent's objects are unaffected by the child.
        parent = {
            "next": next(iterator).sample_id,
            "get_item": dataset.get_item(CACHE_ID, 9).sample_id,
            "fresh_window": [s.sample_id for s in dataset][:3],
        }
        status = os.waitstatus_to_exitcode(status)
        return {"first": first, "child": child, "status": status, "parent": parent}


    for op in sys.argv[4:]:
        result = fork_with(op, bases / op)
        print(json.dumps({"op": op, **result}), flush=True)
"""

FORK_OPS_RAISING = [
    "iter",
    "iter_batches",
    "get_item",
    "get_item_locked",
    "get_items_locked",
    "get_item_busy",
    "cached_dataset",
]
FORK_OPS_WORKING = {"len": "120", "set_epoch_len": "None", "get_metadata_cached": "(120, 7)"}
FORK_OPS = [
    *FORK_OPS_RAISING,
    *FORK_OPS_WORKING,
    "io_backend",
    "get_metadata_uncached",
    "update_metadata",
    "write_cache",
    "from_cache_sources",
    "inherited_iterator",
    "fresh_runtime",
    "from_config",
]


@pytest.fixture(scope="module")
def fork_runs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``run(backend, op)``: the result of ``op`` in a forked child (see ``FORK``); the
    first call for a backend runs every operation of ``FORK_OPS`` with it."""
    runs: dict[str, dict[str, Any]] = {}

    def run(backend: str, op: str) -> dict[str, Any]:
        if backend not in runs:
            bases = tmp_path_factory.mktemp(f"fork-{backend}")
            out = run_script(
                bases,
                FORK,
                backend,
                str(bases),
                str(FIXTURES / "plain_one_shard"),
                *FORK_OPS,
                timeout=SCRIPT_TIMEOUT_S + 15 * len(FORK_OPS),
            )
            assert out.returncode == 0, out.stderr
            lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
            runs[backend] = {line.pop("op"): {**line, "stderr": out.stderr} for line in lines}
        assert op in runs[backend], f"no result for {op}\n{runs[backend]}"
        return runs[backend][op]

    return run


def run_fork(fork_runs: Any, backend: str, op: str) -> dict[str, Any]:
    result = fork_runs(backend, op)
    assert result["status"] == 0, (
        f"forked child exited with {result['status']} "
        f"(1: hang, stack on stderr; negative: a signal)\n{result['stderr']}"
    )
    # The parent's objects are unaffected: its iterator continues, a new one takes the
    # next window.
    assert result["first"] == 0
    assert result["parent"] == {"next": 1, "get_item": 9, "fresh_window": [0, 1, 2]}
    return result["child"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", FORK_OPS_RAISING)
def test_forked_child_gets_a_clear_error(fork_runs: Any, backend: str, op: str) -> None:
    child = run_fork(fork_runs, backend_or_skip(backend), op)
    assert child == {"error": ["RuntimeError", FORK_MESSAGE]}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", list(FORK_OPS_WORKING))
def test_forked_child_plain_state_works(fork_runs: Any, backend: str, op: str) -> None:
    """State copied by fork, with no native I/O behind it, is usable in the child."""
    child = run_fork(fork_runs, backend_or_skip(backend), op)
    assert child == {"ok": FORK_OPS_WORKING[op]}


@pytest.mark.parametrize("backend", BACKENDS)
def test_forked_child_io_backend(fork_runs: Any, backend: str) -> None:
    child = run_fork(fork_runs, backend_or_skip(backend), "io_backend")
    assert child == {"ok": repr(backend)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["get_metadata_uncached", "update_metadata"])
def test_forked_child_metadata_does_not_hang(fork_runs: Any, backend: str, op: str) -> None:
    """Polars' thread pool, used in the parent, deadlocks in a forked child: the dataset
    must refuse before handing anything to Polars."""
    child = run_fork(fork_runs, backend_or_skip(backend), op)
    assert child == {"error": ["RuntimeError", FORK_MESSAGE]}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["write_cache", "from_cache_sources"])
def test_forked_child_runtime_cannot_write(fork_runs: Any, backend: str, op: str) -> None:
    """The runtime is unusable in the child: writing raises (it is no per-source failure),
    without iterating the source or creating anything."""
    child = run_fork(fork_runs, backend_or_skip(backend), op)
    assert child == {
        "error": ["RuntimeError", FORK_MESSAGE],
        "iterated": False,
        "base_exists": False,
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_forked_child_inherited_iterator(fork_runs: Any, backend: str) -> None:
    """An iterator started in the parent yields at most what was already handed to Python
    before the fork (the right continuation), then raises the fork error."""
    child = run_fork(fork_runs, backend_or_skip(backend), "inherited_iterator")
    assert child["error"] == ["RuntimeError", FORK_MESSAGE]
    samples = child["samples"]
    assert samples == list(range(1, 1 + len(samples)))
    assert len(samples) < 120


@pytest.mark.parametrize("backend", BACKENDS)
def test_forked_child_can_open_its_own_runtime(fork_runs: Any, backend: str) -> None:
    child = run_fork(fork_runs, backend_or_skip(backend), "fresh_runtime")
    assert child == {"ok": "True"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_forked_child_opens_a_snapshot_with_from_config(fork_runs: Any, backend: str) -> None:
    """from_config installs the snapshot's table without Polars, whose thread pool (used
    in the parent) would hang the child."""
    child = run_fork(fork_runs, backend_or_skip(backend), "from_config")
    assert child == {"ok": "True"}


# ------------------------------------------------------------- interpreter exit

EXIT = """
    import sys, threading
    from pathlib import Path
    import dataset_rt as drt

    backend, variant = sys.argv[1], sys.argv[2]
    paths = [Path(p) for p in sys.argv[3:]]
    config = drt.ReaderConfig(seed=1, shuffle=True, io_backend=backend, prefetch_size=8)

    runtime = drt.DatasetRuntime(num_workers=2)
    other_runtime = drt.DatasetRuntime(num_workers=3)
    dataset = runtime.cached_dataset(paths, reader_config=config)
    in_order = config.model_copy(update={"shuffle": False})
    ordered = other_runtime.cached_dataset(paths, reader_config=in_order)
    live = [iter(dataset), iter(ordered), ordered.iter_batches(5), iter(dataset)]
    for it in live[:3]:
        for _ in range(3):
            next(it)
    dataset.get_item(next(iter(ordered)).cache_id, 1)
    ordered.get_metadata()

    if variant == "daemon_thread":
        def spin():
            while True:
                for sample in dataset:
                    pass
        threading.Thread(target=spin, daemon=True).start()
        next(iter(ordered))
    elif variant == "cycle":
        class Holder:
            pass
        holder = Holder()
        holder.self, holder.dataset, holder.runtime = holder, dataset, runtime
        holder.iterator = live[0]
        del holder
    elif variant == "exit_mid_iteration":
        for i, sample in enumerate(ordered):
            if i == 2:
                print("done", flush=True)
                sys.exit(0)
    elif variant == "exception":
        print("done", flush=True)
        for sample in dataset:
            raise RuntimeError("user error mid-iteration")
    print("done", flush=True)
"""

EXIT_VARIANTS = ["plain", "daemon_thread", "cycle", "exit_mid_iteration", "exception"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", EXIT_VARIANTS)
def test_interpreter_exits_cleanly_with_live_objects(
    tmp_path: Path, backend: str, variant: str
) -> None:
    paths = [str(FIXTURES / name) for name in SAME_SCHEMA]
    out = run_script(tmp_path, EXIT, backend_or_skip(backend), variant, *paths, timeout=60)
    assert out.stdout.strip() == "done", out.stderr
    if variant == "exception":
        assert out.returncode == 1, out.stderr
        assert out.stderr.rstrip().endswith("RuntimeError: user error mid-iteration"), out.stderr
    else:
        assert out.returncode == 0, out.stderr
        assert out.stderr == ""


# ------------------------------------------------------------ threads, one dataset

WINDOWS_PER_THREAD = 12
THREADS = 4
EPOCH_LEN = 7


def _windows_from_threads(dataset: Any, *, batches: bool) -> list[tuple[int, ...]]:
    barrier = threading.Barrier(THREADS)
    windows: list[tuple[int, ...]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def consume(index: int) -> None:
        try:
            barrier.wait()
            for _ in range(WINDOWS_PER_THREAD):
                if batches and index == 0:
                    window = tuple(int(s) for b in dataset.iter_batches(3) for s in b.sample_id)
                else:
                    window = tuple(sample.sample_id for sample in dataset)
                with lock:
                    windows.append(window)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=SCRIPT_TIMEOUT_S)
        assert not thread.is_alive(), "a reading thread hangs"
    assert errors == []
    return windows


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_iterators_in_threads_take_disjoint_windows(io_backend: str, shuffle: bool) -> None:
    cache = FIXTURES / "plain_one_shard"
    config = drt.ReaderConfig(seed=5, shuffle=shuffle, io_backend=io_backend, prefetch_size=4)
    runtime = drt.DatasetRuntime(num_workers=2)
    dataset = runtime.cached_dataset([cache], reader_config=config)
    dataset.set_epoch_len(EPOCH_LEN)
    want = {row["sample_id"]: row["sha256"] for row in expected("plain_one_shard")["samples"]}

    # Random access from another thread at the same time moves no window.
    stop = threading.Event()
    lookups: list[Any] = []

    def look_up() -> None:
        i = 0
        while not stop.is_set():
            sample = dataset.get_item(PLAIN_ONE_SHARD_ID, i % 120)
            lookups.append(hashlib.sha256(sample.data).hexdigest() == want[i % 120])
            i += 1
            time.sleep(0.0002)  # interleave with the readers rather than starve them

    looker = threading.Thread(target=look_up)
    looker.start()
    try:
        windows = _windows_from_threads(dataset, batches=True)
    finally:
        stop.set()
        looker.join(timeout=SCRIPT_TIMEOUT_S)
    assert lookups and all(lookups)

    total = THREADS * WINDOWS_PER_THREAD
    assert len(windows) == total and all(len(w) == EPOCH_LEN for w in windows)
    # The same number of windows read one after the other from a fresh dataset.
    fresh = runtime.cached_dataset([cache], reader_config=config)
    fresh.set_epoch_len(EPOCH_LEN)
    sequential = [tuple(sample.sample_id for sample in fresh) for _ in range(total)]
    if not shuffle:
        assert sequential == [
            tuple((k * EPOCH_LEN + j) % 120 for j in range(EPOCH_LEN)) for k in range(total)
        ]
    # Disjoint windows of one stream: each concurrent window is one of the sequential
    # windows, each taken once, and together they are the whole sequence.
    assert sorted(windows) == sorted(sequential)
    # And the data is right (one more concurrent pass, checking payloads).
    check = runtime.cached_dataset([cache], reader_config=config)
    barrier = threading.Barrier(THREADS)
    bad: list[int] = []

    def verify() -> None:
        barrier.wait()
        for _ in range(3):
            for sample in check:
                if hashlib.sha256(sample.data).hexdigest() != want[sample.sample_id]:
                    bad.append(sample.sample_id)

    threads = [threading.Thread(target=verify) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=SCRIPT_TIMEOUT_S)
    assert bad == []


# --------------------------------------------------------------------- full disk


def _mount(args: list[str]) -> str | None:
    """None when the mount worked, else why not."""
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{args[0]}: {exc}"
    return (
        None
        if result.returncode == 0
        else f"{' '.join(args)}: {result.stderr.strip() or result.returncode}"
    )


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB file system: a tmpfs, else a loop-mounted ext4 image, else skip."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    why_not = _mount(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)])
    if why_not is not None:
        image = tmp_path / "disk.img"
        with open(image, "wb") as f:
            f.truncate(4 << 20)
        why_not_loop = _mount(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)]) or _mount(
            ["mount", "-o", "loop", str(image), str(mount_point)]
        )
        if why_not_loop is not None:
            pytest.skip(
                f"cannot mount a small file system (tmpfs: {why_not}; loop image: {why_not_loop})"
            )
    try:
        yield mount_point
    finally:
        if (
            subprocess.run(
                ["umount", str(mount_point)], capture_output=True, check=False
            ).returncode
            != 0
        ):
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


class Blocks:
    """`count` samples of `size` bytes with int/str metadata."""

    def __init__(self, name: str, count: int, size: int) -> None:
        self.name = name
        self.count = count
        self.size = size

    def __iter__(self) -> Iterator[drt.CacheInput]:
        for i in range(self.count):
            yield drt.CacheInput(bytes([i % 251]) * self.size, {"i": i, "s": f"sample-{i}"})


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def fill(disk: Path, leave: int) -> None:
    """Write a filler file so that about ``leave`` bytes stay free."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        remaining = free_bytes(disk) - leave
        block = b"\0" * (64 << 10)
        while remaining > 0:
            try:
                remaining -= os.write(fd, block[: min(len(block), remaining)])
            except OSError:
                break
    finally:
        os.close(fd)


def assert_nothing_published(base: Path, name: str) -> None:
    assert not (base / name).exists()
    assert sorted(p.name for p in base.iterdir()) == ["tmp"]
    assert list((base / "tmp").iterdir()) == []


ENOSPC_TEXT = "No space left on device"


def test_full_disk_fails_cleanly_and_frees_the_space(small_disk: Path) -> None:
    base = small_disk / "base"
    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.WriterConfig(show_progress=False, max_shard_bytes=256 << 10)
    before = free_bytes(small_disk)
    [result] = runtime.write_cache(Blocks("big", 3000, 1000), base, writer_config=config)
    assert isinstance(result, drt.CacheWriteError), result
    assert result.source_name == "big"
    assert ENOSPC_TEXT in result.message, result.message
    assert_nothing_published(base, "big")
    assert free_bytes(small_disk) >= before - (64 << 10)  # the staged shards are gone
    # The space is usable again: a small cache fits and reads back checksum-valid.
    [result] = runtime.write_cache(Blocks("small", 50, 1000), base, writer_config=config)
    assert isinstance(result, drt.CacheWriteSuccess), result
    dataset = runtime.cached_dataset(
        [base / "small"], reader_config=drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True)
    )
    assert [s.metadata["i"] for s in dataset] == list(range(50))


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_disk_filling_up_at_every_stage(small_disk: Path, compression: str) -> None:
    """Leave less and less free space: each write either succeeds (a valid cache) or
    fails with ENOSPC and leaves nothing behind, wherever the disk fills up."""
    base = small_disk / "base"
    base.mkdir()
    runtime = drt.DatasetRuntime(num_workers=2)
    algo = drt.ShardCompression(algo=compression, ratio=2.0 if compression == "lz4" else 1.0)
    config = drt.WriterConfig(show_progress=False, max_shard_bytes=16 << 10, shard_compression=algo)
    source = Blocks("sweep", 60, 1500)
    outcomes: list[str] = []
    problems: list[str] = []
    for leave in range(0, 160 << 10, 4 << 10):
        fill(small_disk, leave)
        try:
            [result] = runtime.write_cache(source, base, writer_config=config)
        except Exception as exc:  # never: a full disk is this source's CacheWriteError
            problems.append(f"{leave} bytes free: write_cache raised {type(exc).__name__}: {exc}")
            outcomes.append("raised")
        else:
            if isinstance(result, drt.CacheWriteSuccess):
                dataset = runtime.cached_dataset(
                    [base / "sweep"],
                    reader_config=drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True),
                )
                assert [s.metadata["i"] for s in dataset] == list(range(60))
                outcomes.append("ok")
            else:
                outcomes.append(result.message)
                if result.source_name != "sweep" or ENOSPC_TEXT not in result.message:
                    problems.append(f"{leave} bytes free: {result!r} does not name ENOSPC")
        if outcomes[-1] != "ok":
            left = sorted(str(p.relative_to(base)) for p in base.rglob("*"))
            if left != ["tmp"]:
                problems.append(f"{leave} bytes free: left behind {left}")
        subprocess.run(
            ["rm", "-rf", str(base / "sweep"), *map(str, (base / "tmp").iterdir())], check=True
        )
        (small_disk / "filler").unlink()
    assert problems == [], "\n".join(problems)
    assert outcomes[0] != "ok" and outcomes[-1] == "ok", outcomes
