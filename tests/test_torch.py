"""The PyTorch adapters, run with a CPU build of torch in a pip-made virtualenv.

torch never enters the uv environment (uv would download a multi-gigabyte CUDA build;
pip takes the machine's local CPU wheel): ``refenv.ensure_extra`` builds a virtualenv
with ``torch==2.13.0`` once (cached, locked) and the scripts in ``tests/torch_scripts``
run there with this checkout on ``PYTHONPATH``. The tests skip, printing the reason,
only when pip cannot reach the package registry.

- ``loader_checks.py``: "global" mode equals the dataset's own stream for 0, 2 and 3
  workers; exact resume after interrupting at random batches, for every mode, with and
  without (persistent) workers; state errors; ``to_torch_iterable_dataset`` in workers
  (fork and spawn); the reference's validation messages.
- ``reference_batches.py``: "split"/"replicate" give dataset-rt 0.4.8's batches.
- ``batch_checks.py``: the tensor path (``batch_format="tensors"``) yields the per-sample
  path's batches (payload bytes, identities, metadata) in every mode with 0 and 2
  workers, fork and spawn; fixed-length payloads as ``[batch, length]``;
  ``batch_transform_fn`` in the workers; exact resume; pinning one buffer per batch;
  validation.
- ``ddp_global.py`` under ``torchrun`` with the gloo backend: 2 ranks cover each pass
  exactly once in global order (per-sample and tensor path); a job interrupted on 2
  ranks resumes on 1 and on 3.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from refenv import (
    ExtraEnv,
    ReferenceSetupError,
    ReferenceUnavailable,
    ensure_extra,
    ensure_reference,
    skip_or_fail,
)
from sources import Mixed, Numbers

import dataset_rt as drt

TORCH = "torch==2.13.0"
SCRIPTS = Path(__file__).parent / "torch_scripts"
SEED = 20261129


@pytest.fixture(scope="module")
def torch_env() -> ExtraEnv:
    try:
        return ensure_extra("torch-2.13.0", (TORCH,), "import torch, dataset_rt; print('ok')")
    except ReferenceUnavailable as exc:
        print(f"PyTorch cannot be installed here: {exc}")
        skip_or_fail(f"PyTorch cannot be installed here: {exc}")
    except ReferenceSetupError as exc:
        pytest.fail(f"could not set up the PyTorch virtualenv: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    base = tmp_path_factory.mktemp("torch")
    runtime = drt.DatasetRuntime(num_workers=2)
    result = runtime.from_cache_sources(
        [Numbers("a", 11), Numbers("b", 6)], base, reader_config=drt.ReaderConfig(seed=0)
    )
    return [str(p) for p in result.dataset.cache_paths]


class Tokens:
    """Twelve records of 4 little-endian int64 tokens ``i .. i + 3``."""

    name = "tokens"

    def __iter__(self):
        for i in range(12):
            tokens = b"".join((i + k).to_bytes(8, "little") for k in range(4))
            yield drt.CacheInput(tokens, {"label": i % 3})


@pytest.fixture(scope="module")
def batch_caches(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str]]:
    base = tmp_path_factory.mktemp("torch-batches")
    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.ReaderConfig(seed=0)
    mixed = runtime.from_cache_sources([Mixed("m", 13), Mixed("n", 8)], base, reader_config=config)
    fixed = runtime.from_cache_sources(Tokens(), base, reader_config=config)
    return (
        [str(p) for p in mixed.dataset.cache_paths],
        [str(p) for p in fixed.dataset.cache_paths],
    )


def run_json(env: ExtraEnv, args: list[str], cwd: Path, timeout: float = 600) -> Any:
    proc = env.run(args, cwd=cwd, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_dataset_rt_never_imports_torch(torch_env: ExtraEnv, tmp_path: Path) -> None:
    script = "import sys, dataset_rt; print('torch' in sys.modules)"
    proc = torch_env.run(["-c", script], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


REBUILT = """
import json, sys
import dataset_rt as drt

class Source:
    name = "t"
    def __init__(self, version):
        self.fingerprint = self.version = version
    def __iter__(self):
        return iter([drt.CacheInput(f"{self.version}-{i}".encode(), {"i": i}) for i in range(8)])

def texts(batch):
    return [bytes(s.data).decode() for s in batch]

if __name__ == "__main__":
    runtime = drt.DatasetRuntime(num_workers=2)
    config = drt.ReaderConfig(seed=0, shuffle=False)
    dataset = runtime.from_cache_sources(Source("v1"), "caches", reader_config=config).dataset
    out = {}
    for workers in (0, 1, 2):
        loader = dataset.to_torch_dataloader(
            batch_size=4, shuffle=False, num_workers=workers, persistent_workers=False,
            collate_fn=texts,
        )
        out[f"before {workers}"] = [x for b in loader for x in b]
    stale = drt.WriterConfig(show_progress=False, on_stale="rebuild")
    runtime.from_cache_sources(Source("v2"), "caches", reader_config=config, writer_config=stale)
    for workers in (0, 1, 2):
        loader = dataset.to_torch_dataloader(
            batch_size=4, shuffle=False, num_workers=workers, persistent_workers=False,
            collate_fn=texts,
        )
        try:
            out[f"after {workers}"] = [x for b in loader for x in b]
        except Exception as exc:
            out[f"after {workers}"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))
"""


def test_loaders_never_read_a_cache_rebuilt_since(torch_env: ExtraEnv, tmp_path: Path) -> None:
    """A loader of a dataset whose cache was rebuilt in place (on_stale="rebuild") fails
    as the dataset itself does, with any worker count: its workers would otherwise pair
    the old table with the new bytes."""
    script = tmp_path / "rebuilt.py"
    script.write_text(REBUILT)
    out = run_json(torch_env, [str(script)], tmp_path)
    for workers in (0, 1, 2):
        assert out[f"before {workers}"] == [f"v1-{i}" for i in range(8)]
        after = out[f"after {workers}"]
        assert isinstance(after, str) and after.startswith("ValueError: "), after
        # (From a worker, PyTorch's text around the message.)
        assert "was replaced (rebuilt) or removed while this dataset was open" in after


RESUMED = """
import json, warnings
import dataset_rt as drt

class Source:
    name = "n"
    def __iter__(self):
        for j in range(23):
            yield drt.CacheInput(j.to_bytes(8, "little"), {"label": j % 3})

def ids_of(batch):
    return [s.sample_id for s in batch]

def run(loader):
    return list(loader)

def plain(state):
    return json.loads(json.dumps(state))

if __name__ == "__main__":
    warnings.simplefilter("ignore")
    runtime = drt.DatasetRuntime(num_workers=2)
    runtime.write_cache(Source(), "caches", writer_config=drt.WriterConfig(show_progress=False))
    dataset = runtime.cached_dataset(["caches/n"], reader_config=drt.ReaderConfig(seed=0))
    out = {}
    for mode, workers in (("split", 0), ("split", 2), ("replicate", 0), ("global", 0)):
        options = dict(batch_size=4, worker_partition=mode, num_workers=workers, collate_fn=ids_of)
        seed = dataset.to_torch_dataloader(**options).state_dict()["seed"]
        full = run(dataset.to_torch_dataloader(seed=seed, **options))
        first = dataset.to_torch_dataloader(seed=seed, **options)
        batches = iter(first)
        next(batches), next(batches)
        saved = plain(first.state_dict())
        del batches
        resumed = dataset.to_torch_dataloader(**options)  # seed="random": adopts the saved one
        resumed.load_state_dict(saved)
        again = plain(resumed.state_dict())  # a checkpoint before the loop starts
        used = dataset.to_torch_dataloader(**options)  # its own seed; a pass read already
        run(used)
        used.load_state_dict(saved)
        out[f"{mode} {workers}"] = {
            "resumed": run(resumed) == full[2:],
            # (random_seed says how this loader was made: seed="random".)
            "state after load": {**again, "random_seed": False} == saved,
            "after a pass": run(used) == full[2:],
        }
    print(json.dumps(out))
"""


def test_resuming_continues_exactly_and_a_loaded_state_is_kept(
    torch_env: ExtraEnv, tmp_path: Path
) -> None:
    """A loader with seed="random" adopts a saved state's seed (shuffled "split" slices a
    row order made from it; readers it opened for its own seed are not reused), and
    state_dict() before the first pass after loading is the loaded position, in every
    mode."""
    script = tmp_path / "resumed.py"
    script.write_text(RESUMED)
    out = run_json(torch_env, [str(script)], tmp_path)
    assert out == {
        key: {"resumed": True, "state after load": True, "after a pass": True}
        for key in ("split 0", "split 2", "replicate 0", "global 0")
    }


RINGS = """
import gc, json, os
import dataset_rt as drt

class Source:
    name = "big"
    def __iter__(self):
        for j in range(1200):
            yield drt.CacheInput(bytes(4096), {"i": j})

def rings():
    maps = sum("dataset_rt-batches" in line for line in open("/proc/self/maps"))
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds += "dataset_rt-batches" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return maps, fds

if __name__ == "__main__":
    runtime = drt.DatasetRuntime(num_workers=2)
    runtime.write_cache(Source(), "caches", writer_config=drt.WriterConfig(show_progress=False))
    dataset = runtime.cached_dataset(["caches/big"], reader_config=drt.ReaderConfig(seed=0))
    out = {"before": rings()}
    for stop in (None, 2):
        loader = dataset.to_torch_dataloader(
            batch_size=128, shuffle=False, num_workers=2, persistent_workers=False,
            batch_format="tensors", multiprocessing_context="fork",
        )
        for k, batch in enumerate(loader):
            if k == stop:
                break
        del batch, loader
        gc.collect()
        out["full pass" if stop is None else "early break"] = rings()
    print(json.dumps(out))
"""


def test_rings_of_finished_workers_are_unmapped_after_an_early_break(
    torch_env: ExtraEnv, tmp_path: Path
) -> None:
    """The tensor path with workers: once a pass ends, even by a break, and its batches
    are gone, the training process keeps no mapping or descriptor of the workers' rings."""
    script = tmp_path / "rings.py"
    script.write_text(RINGS)
    out = run_json(torch_env, [str(script)], tmp_path)
    assert out == {"before": [0, 0], "full pass": [0, 0], "early break": [0, 0]}


def test_loader_checks(torch_env: ExtraEnv, caches: list[str], tmp_path: Path) -> None:
    results = run_json(torch_env, [str(SCRIPTS / "loader_checks.py"), *caches], tmp_path)
    assert len(results) > 50
    failures = {name: detail for name, (ok, detail) in results.items() if not ok}
    assert not failures, json.dumps(failures, indent=1)[:8000]


def test_tensor_batches(
    torch_env: ExtraEnv, batch_caches: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    mixed, fixed = batch_caches
    script = str(SCRIPTS / "batch_checks.py")
    results = run_json(torch_env, [script, json.dumps(mixed), json.dumps(fixed)], tmp_path)
    assert len(results) > 60
    failures = {name: detail for name, (ok, detail) in results.items() if not ok}
    assert not failures, json.dumps(failures, indent=1)[:8000]


@pytest.mark.compat
def test_reference_modes_match_0_4_8(
    torch_env: ExtraEnv, caches: list[str], tmp_path: Path
) -> None:
    try:
        reference = ensure_reference(extra=(TORCH,))
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 with PyTorch unavailable: {exc}")
    configs: list[dict[str, Any]] = []
    combos = ((True, None), (False, None), (True, "split"), (False, "replicate"))
    for table in (None, "filtered"):
        for shuffle, partition in combos:
            for batch_size, budget, drop_last in ((3, None, False), (4, 10, True), (2, 7, False)):
                configs.append(
                    {
                        "table": table,
                        "num_workers": 0,
                        "shuffle": shuffle,
                        "worker_partition": partition,
                        "batch_size": batch_size,
                        "samples_per_epoch": budget,
                        "drop_last": drop_last,
                    }
                )
    for shuffle, partition in combos:
        configs.append(
            {
                "table": "filtered",
                "num_workers": 2,
                "persistent_workers": True,
                "multiprocessing_context": "fork",
                "shuffle": shuffle,
                "worker_partition": partition,
                "batch_size": 2,
                "samples_per_epoch": 7,
            }
        )
    configs.append(
        {"num_workers": 2, "persistent_workers": False, "shuffle": True, "batch_size": 3}
    )
    configs.append({"num_workers": 2, "multiprocessing_context": "forkserver", "batch_size": 5})
    for config in configs:
        config["native_num_workers"] = 1
        if config["shuffle"] if "shuffle" in config else True:
            config["seed"] = 42
    script = SCRIPTS / "reference_batches.py"
    argument = json.dumps(configs)
    ours = run_json(torch_env, [str(script), argument, *caches], tmp_path)
    proc = reference.run(script.read_text(), argument, *caches, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(ours) == len(theirs) == len(configs)
    for config, mine, ref in zip(configs, ours, theirs):
        assert mine == ref, config


@pytest.mark.compat
def test_budget_follows_set_epoch_len_as_0_4_8(
    torch_env: ExtraEnv, caches: list[str], tmp_path: Path
) -> None:
    """Issue 15, item 1: without samples_per_epoch the budget is len(dataset), including
    a set_epoch_len override; an inherited budget outside 1..2**53 raises 0.4.8's error."""
    configs: list[dict[str, Any]] = [
        {"epoch_len": 3, "shuffle": False, "num_workers": 0, "batch_size": 1},
        {"epoch_len": 3, "shuffle": False, "num_workers": 0, "batch_size": 2, "passes": 3},
        {"epoch_len": 5, "seed": 42, "num_workers": 0, "batch_size": 2},
        {"epoch_len": 4, "table": "filtered", "shuffle": False, "num_workers": 0},
        {"epoch_len": 30, "seed": 42, "worker_partition": "split", "num_workers": 0},
        {
            "epoch_len": 7,
            "shuffle": False,
            "num_workers": 2,
            "persistent_workers": True,
            "multiprocessing_context": "fork",
            "batch_size": 2,
        },
        {"epoch_len": 2**53, "shuffle": False, "num_workers": 0, "passes": 0},
        {"epoch_len": 2**53 + 1, "shuffle": False, "num_workers": 0},
        {"epoch_len": 2**63 - 1, "seed": 1, "num_workers": 0},
    ]
    for config in configs:
        config["native_num_workers"] = 1
    script = SCRIPTS / "reference_batches.py"
    argument = json.dumps(configs)
    ours = run_json(torch_env, [str(script), argument, *caches], tmp_path)
    # What 0.4.8 does, written out: 3 samples a pass, continuing the ordered cursor.
    first = ours[0]["batches"][0][0][0][0]  # the first cache's id
    expected = [[[[first, i]] for i in range(k, k + 3)] for k in (0, 3)]
    assert ours[0]["batches"] == expected
    assert ours[0]["len"] == 3 and ours[2]["len"] == 3
    message = "ValueError: inherited samples_per_epoch must be between 1 and 9007199254740992"
    assert ours[7] == ours[8] == {"error": message}
    assert ours[6]["len"] == 2**53
    try:
        reference = ensure_reference(extra=(TORCH,))
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 with PyTorch unavailable: {exc}")
    proc = reference.run(script.read_text(), argument, *caches, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    for config, mine, ref in zip(configs, ours, theirs, strict=True):
        assert mine == ref, config


# ------------------------------------------------------------------ torchrun


def global_batches(caches: list[str], batch_size: int, count: int) -> list[list[list[int]]]:
    """The global stream cut into batches: the dataset's own draw stream (its default
    table keeps uniform draws) with the loaders' seed."""
    runtime = drt.DatasetRuntime(num_workers=1)
    dataset = runtime.cached_dataset(
        caches, reader_config=drt.ReaderConfig(seed=SEED, shuffle=True)
    )
    dataset.set_epoch_len(count * batch_size)
    flat = [[s.cache_id, s.sample_id] for s in dataset]
    return [flat[i : i + batch_size] for i in range(0, len(flat), batch_size)]


def torchrun(
    env: ExtraEnv, out: Path, nproc: int, caches: list[str], **config: Any
) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        "paths": caches,
        "out": str(out),
        "seed": SEED,
        "batch_size": 4,
        "samples": 48,
        "workers": 2,
        "passes": 2,
        "load_state": None,
        "stop_after": None,
        **config,
    }
    args = [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-port",
        str(random.Random().randrange(20000, 60000)),
        str(SCRIPTS / "ddp_global.py"),
        json.dumps(settings),
    ]
    proc = env.run(args, cwd=out, timeout=600, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-6000:])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def check_ranks(
    ranks: list[dict[str, Any]],
    stream: list[list[list[int]]],
    first_batch: int,
    per_pass: tuple[int, int],
) -> int:
    """Every rank's batch at (pass, step) is global batch
    ``pass_start + step * world + rank``; the ranks together read each global batch of
    the run exactly once. Returns the global batch after the last one read."""
    world = len(ranks)
    read: list[int] = []
    for rank, result in enumerate(ranks):
        for entry in result["batches"]:
            start = first_batch if entry["pass"] == 0 else first_batch + per_pass[0]
            start += max(0, entry["pass"] - 1) * per_pass[1]
            index = start + entry["step"] * world + rank
            assert entry["ids"] == stream[index], (rank, entry["pass"], entry["step"])
            read.append(index)
    assert sorted(read) == list(range(first_batch, first_batch + len(read)))
    return first_batch + len(read)


@pytest.fixture(scope="module")
def stream(caches: list[str]) -> list[list[list[int]]]:
    return global_batches(caches, 4, 200)


def test_torchrun_global_mode_reads_each_batch_once(
    torch_env: ExtraEnv, caches: list[str], stream: list[list[list[int]]], tmp_path: Path
) -> None:
    ranks = torchrun(torch_env, tmp_path / "full", 2, caches)
    assert [r["len"] for r in ranks] == [6, 6]  # 48 samples / (2 ranks x 4)
    for result in ranks:
        assert [b["pass"] for b in result["batches"]] == [0] * 6 + [1] * 6
    end = check_ranks(ranks, stream, 0, (12, 12))
    assert end == 24  # two passes of 12 global batches, none skipped or repeated


def test_torchrun_global_tensor_batches_read_each_batch_once(
    torch_env: ExtraEnv, caches: list[str], stream: list[list[list[int]]], tmp_path: Path
) -> None:
    ranks = torchrun(torch_env, tmp_path / "tensors", 2, caches, batch_format="tensors")
    assert [r["len"] for r in ranks] == [6, 6]
    for result in ranks:
        assert [b["pass"] for b in result["batches"]] == [0] * 6 + [1] * 6
        assert {b["type"] for b in result["batches"]} == {"TensorBatch"}
    end = check_ranks(ranks, stream, 0, (12, 12))
    assert end == 24


def test_torchrun_elastic_resume_from_2_ranks_into_1_and_3(
    torch_env: ExtraEnv, caches: list[str], stream: list[list[list[int]]], tmp_path: Path
) -> None:
    stop = random.Random(SEED).randrange(7, 11)  # inside the second pass
    before = torchrun(torch_env, tmp_path / "before", 2, caches, stop_after=stop)
    consumed = check_ranks(before, stream, 0, (12, 12))
    assert consumed == 2 * stop
    state_file = tmp_path / "before" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["position"] == consumed * 4 and len(json.dumps(state)) < 1000
    for world in (1, 3):
        after = torchrun(
            torch_env,
            tmp_path / f"after{world}",
            world,
            caches,
            load_state=str(state_file),
            passes=2,
        )
        # The rest of the interrupted pass (24 - consumed global batches, rounded up to
        # whole rounds of `world`), then a full pass of 48 samples.
        rest = -(-(24 - consumed) // world) * world
        end = check_ranks(after, stream, consumed, (rest, 48 // 4 // world * world))
        assert end == consumed + rest + 12


def test_without_torch_the_adapters_raise_the_reference_import_error(caches: list[str]) -> None:
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed in this environment")
    runtime = drt.DatasetRuntime(num_workers=1)
    dataset = runtime.cached_dataset(caches, reader_config=drt.ReaderConfig(seed=0))
    for name in ("to_torch_iterable_dataset", "to_torch_dataloader"):
        with pytest.raises(ImportError) as info:
            getattr(dataset, name)()
        assert str(info.value) == f"CachedDataset.{name} requires PyTorch to be installed"
    assert "torch" not in sys.modules


def test_guide_examples_run(torch_env: ExtraEnv, tmp_path: Path) -> None:
    from test_docs import ROOT, blocks

    page = ROOT / "docs" / "guide-torch.md"
    page_blocks = blocks(page.read_text(encoding="utf-8"))
    runnable = [
        (block, following)
        for block, following in zip(page_blocks, [*page_blocks[1:], None])
        if block.info.split() == ["python", "torch"]
    ]
    assert len(runnable) >= 5
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps([[block.line, block.code] for block, _ in runnable]))
    outputs = run_json(torch_env, [str(SCRIPTS / "run_blocks.py"), str(spec)], tmp_path)
    for (block, following), output in zip(runnable, outputs):
        if following is not None and following.is_expected_output:
            assert output.rstrip("\n") == following.code.rstrip("\n"), block.describe(page)
