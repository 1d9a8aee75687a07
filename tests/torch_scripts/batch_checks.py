"""Checks of the loader's tensor path, ``batch_format="tensors"`` (run by
tests/test_torch.py in a virtualenv with torch). Prints one JSON object: check name ->
[ok, detail].

    python batch_checks.py MIXED_CACHES_JSON FIXED_CACHES_JSON

MIXED: caches with payloads of varying length and int, float, bool and str metadata.
FIXED: caches whose payloads are 4 little-endian int64 each, with an int ``label``.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import sys
import time
import warnings
from typing import Any

import torch
from torch.utils.data._utils.pin_memory import pin_memory

import dataset_rt as drt
from dataset_rt import _native
from dataset_rt.integrations import torch as drt_torch
from dataset_rt.integrations.torch import TensorBatch

MIXED: list[str] = []
FIXED: list[str] = []
RESULTS: dict[str, list[Any]] = {}

MODES = [
    {"worker_partition": "global", "shuffle": True, "seed": 5},
    {"worker_partition": "global", "shuffle": False},
    {"worker_partition": "replicate", "shuffle": True, "seed": 5},
    {"worker_partition": "split", "shuffle": True, "seed": 5},
    {"worker_partition": "split", "shuffle": False},
]
SETUPS = [
    {"num_workers": 0},
    {"num_workers": 2, "persistent_workers": True, "multiprocessing_context": "fork"},
    {"num_workers": 2, "persistent_workers": True, "multiprocessing_context": "spawn"},
]


def check(name: str, ok: bool, detail: object = "") -> None:
    RESULTS[name] = [bool(ok), "" if ok else str(detail)[:3000]]


def open_dataset(paths: list[str]) -> Any:
    runtime = drt.DatasetRuntime(num_workers=1)
    return runtime.cached_dataset(paths, reader_config=drt.ReaderConfig(seed=0))


def loader(paths: list[str], **kwargs: Any) -> Any:
    kwargs.setdefault("verbose", False)
    kwargs.setdefault("native_num_workers", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return open_dataset(paths).to_torch_dataloader(**kwargs)


def plain(value: Any) -> Any:
    """A collated metadata column as (type tag, values)."""
    if isinstance(value, torch.Tensor):
        return [str(value.dtype), value.tolist()]
    return ["list", list(value)]


def from_samples(batch: Any) -> dict[str, Any]:
    """What the per-sample path's batch (torch's default collate of CachedSample) holds."""
    return {
        "payloads": [bytes(p).hex() for p in batch.data],
        "ids": [[int(c), int(s)] for c, s in zip(batch.cache_id, batch.sample_id)],
        "id_dtypes": [str(batch.cache_id.dtype), str(batch.sample_id.dtype)],
        "metadata": {name: plain(v) for name, v in batch.metadata.items()},
    }


def from_tensors(batch: TensorBatch) -> dict[str, Any]:
    count = len(batch)
    flat = batch.data.reshape(-1)
    offsets = batch.offsets.tolist()
    assert len(offsets) == count + 1 and offsets[0] == 0, offsets
    return {
        "payloads": [bytes(flat[offsets[i] : offsets[i + 1]].numpy()).hex() for i in range(count)],
        "ids": [[int(c), int(s)] for c, s in zip(batch.cache_id, batch.sample_id)],
        "id_dtypes": [str(batch.cache_id.dtype), str(batch.sample_id.dtype)],
        "metadata": {name: plain(v) for name, v in batch.metadata.items()},
    }


def passes(data: Any, count: int, render: Any) -> list[list[Any]]:
    return [[render(batch) for batch in data] for _ in range(count)]


def check_same_batches() -> None:
    """The tensor path yields the per-sample path's batches (payload bytes, identities,
    metadata and its dtypes), for every mode, with 0 and 2 workers, fork and spawn.
    Spawned workers are compared with the per-sample batches of forked ones (the start
    method changes nothing read; each spawned worker imports torch, which takes
    seconds)."""
    variants = [{"drop_last": False}, {"drop_last": True}]
    forked: dict[str, tuple[list[list[Any]], int]] = {}  # per-sample batches and len
    for mode, setup, variant in itertools.product(MODES, SETUPS, variants):
        spawn = setup.get("multiprocessing_context") == "spawn"
        if variant["drop_last"] and spawn:
            continue  # spawn is slow; drop_last is covered with fork and in-process
        kwargs = {**mode, **setup, **variant, "batch_size": 4, "samples_per_epoch": 23}
        name = f"same batches {mode} {setup} {variant}"
        key = json.dumps([mode, variant], sort_keys=True)
        if spawn:
            expected, expected_len = forked[key]
        else:
            samples = loader(MIXED, **kwargs)
            expected, expected_len = passes(samples, 2, from_samples), len(samples)
            if setup.get("multiprocessing_context") == "fork":
                forked[key] = (expected, expected_len)
        tensors = loader(MIXED, **kwargs, batch_format="tensors")
        got = passes(tensors, 2, from_tensors)
        check(name, got == expected and len(expected[0]) > 3, (got[:1], expected[:1]))
        check(name + ": len", len(tensors) == expected_len, (len(tensors), expected_len))
        kinds = {type(b).__name__ for b in tensors}
        check(name + ": type", kinds == {"TensorBatch"}, kinds)


def check_fixed_length_and_transform() -> None:
    """Equal-length payloads come as [batch, length]; batch_transform_fn runs on each
    whole batch in the process that builds it (a worker), and its result is the batch."""
    plain_batches = list(
        loader(FIXED, batch_size=5, shuffle=False, num_workers=0, batch_format="tensors")
    )
    shapes = [tuple(b.data.shape) for b in plain_batches]
    check(
        "fixed-length payloads are [batch, length]",
        shapes == [(5, 32), (5, 32), (2, 32)],
        shapes,
    )
    by_workers: dict[int, list[list[list[int]]]] = {}
    for setup in SETUPS:
        # Spawned workers read what forked ones read (see check_same_batches).
        if setup.get("multiprocessing_context") != "spawn":
            by_workers[setup["num_workers"]] = [
                [list(range(i, i + 4)) for i in batch.sample_id.tolist()]
                for batch in loader(FIXED, batch_size=5, shuffle=False, **setup)
            ]
        expected = by_workers[setup["num_workers"]]
        data = loader(
            FIXED,
            batch_size=5,
            shuffle=False,
            batch_format="tensors",
            batch_transform_fn=decode_tokens,
            **setup,
        )
        results = list(data)
        tokens = [r["tokens"].tolist() for r in results]
        pids = {int(r["pid"]) for r in results}
        in_workers = os.getpid() not in pids if setup["num_workers"] else pids == {os.getpid()}
        check(f"batch_transform_fn {setup}: decoded", tokens == expected, (tokens, expected))
        check(f"batch_transform_fn {setup}: runs in the consumer", in_workers, pids)


def decode_tokens(batch: TensorBatch) -> dict[str, torch.Tensor]:
    """A batch transform: the fixed-size records as int64 tokens (importable by spawn)."""
    return {"tokens": batch.data.view(torch.int64), "pid": torch.tensor(os.getpid())}


def check_resume() -> None:
    """A tensor-path loader interrupted mid-pass and restored continues exactly."""
    rng = random.Random(11)
    for mode, setup in itertools.product(MODES, SETUPS[:2]):
        kwargs = {**mode, **setup, "batch_size": 3, "samples_per_epoch": 20}
        kwargs["batch_format"] = "tensors"
        full = passes(loader(MIXED, **kwargs), 3, from_tensors)
        per_sample = passes(
            loader(MIXED, **{k: v for k, v in kwargs.items() if k != "batch_format"}),
            3,
            from_samples,
        )
        check(f"resume {mode} {setup}: uninterrupted equals per-sample", full == per_sample)
        expected = [b for one_pass in full for b in one_pass]
        for cut in sorted(rng.sample(range(1, len(expected)), 2)):
            first = loader(MIXED, **kwargs)
            got: list[Any] = []
            state = None
            for _ in range(3):
                for batch in first:
                    got.append(from_tensors(batch))
                    if len(got) == cut:
                        state = json.loads(json.dumps(first.state_dict()))
                        break
                if state is not None:
                    break
            del first
            second = loader(MIXED, **kwargs)
            second.load_state_dict(state)
            while len(got) < len(expected):
                before = len(got)
                got.extend(from_tensors(b) for b in second)
                if len(got) == before:
                    break
            name = f"resume {mode} {setup} cut={cut}/{len(expected)}"
            check(name, got == expected, (cut, state))


def check_pin_memory() -> None:
    """Pinning a batch pins its one buffer once and keeps every field a view of it.

    This machine has no accelerator, where torch refuses to pin; ``Tensor.pin_memory``
    is replaced by a counting copy to check the structure (real pinning is torch's)."""
    data = loader(MIXED, batch_size=4, shuffle=False, num_workers=0, batch_format="tensors")
    batch = next(iter(data))
    calls = []
    original = torch.Tensor.pin_memory

    def fake_pin(self: torch.Tensor, *args: Any) -> torch.Tensor:
        calls.append(self.numel())
        return self.clone()

    torch.Tensor.pin_memory = fake_pin  # type: ignore[method-assign]
    try:
        pinned = pin_memory(batch)
    finally:
        torch.Tensor.pin_memory = original  # type: ignore[method-assign]
    base = pinned.buffer.data_ptr()
    end = base + pinned.buffer.numel()
    fields = [pinned.data, pinned.offsets, pinned.cache_id, pinned.sample_id]
    fields += [v for v in pinned.metadata.values() if isinstance(v, torch.Tensor)]
    check(
        "pin_memory pins one buffer per batch",
        calls == [batch.buffer.numel()]
        and isinstance(pinned, TensorBatch)
        and all(base <= f.data_ptr() < end or f.numel() == 0 for f in fields)
        and from_tensors(pinned) == from_tensors(batch),
        calls,
    )
    moved = batch.to("cpu", non_blocking=True)
    check("to(device) keeps the batch", from_tensors(moved) == from_tensors(batch))
    check("payload(i)", batch.payload(-1).hex() == from_tensors(batch)["payloads"][-1])


def check_fields_share_buffer() -> None:
    """Host batches (built in this process, and a worker's seen in the training process)
    make their fields from numpy views: each field still lies in ``buffer``'s bytes, and
    writing through a field shows in ``buffer``."""
    for setup in SETUPS[:2]:
        data = loader(MIXED, batch_size=4, shuffle=False, batch_format="tensors", **setup)
        for i, batch in enumerate(data):
            base = batch.buffer.data_ptr()
            end = base + batch.buffer.numel()
            fields = [batch.data, batch.offsets, batch.cache_id, batch.sample_id]
            fields += [v for v in batch.metadata.values() if isinstance(v, torch.Tensor)]
            inside = all(base <= f.data_ptr() < end or f.numel() == 0 for f in fields)
            head, shared = batch._layout[2], True
            if batch.data.numel():
                before = int(batch.buffer[head])
                batch.data.view(-1)[0] = (before + 1) % 256
                shared = int(batch.buffer[head]) == (before + 1) % 256
            check(f"fields lie in the buffer {setup} batch {i}", inside and shared)
            if i == 3:
                break


def shm_rings(pids: list[int]) -> set[str]:
    """Names of files in /dev/shm that name one of ``pids`` (ring files of those
    processes would; other work on the machine may have files of its own there)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {n for n in os.listdir("/dev/shm") if any(f"-{pid}-" in n for pid in pids)}


def check_reused_memory() -> None:
    """Batch memory is reused only once a batch is dropped: batches kept (all of a pass,
    every other one, or across passes) keep their bytes while later ones are built, with
    rings and pools small enough to wrap and fill (fresh memory then) many times."""
    saved = drt_torch._RING_MIN_BYTES, drt_torch._POOL_MIN_BYTES, drt_torch._BUNDLE_BYTES
    saved_threshold = drt_torch._POOL_BATCH_MIN_BYTES
    drt_torch._RING_MIN_BYTES = drt_torch._POOL_MIN_BYTES = 4096
    drt_torch._POOL_BATCH_MIN_BYTES = 0  # every batch in the pool, however small
    drt_torch._BUNDLE_BYTES = 1024  # bundles of a few batches of this data
    drt_torch._POOL = None
    try:
        for setup in SETUPS[:2]:
            kwargs = {"worker_partition": "global", "shuffle": True, "seed": 3, **setup}
            kwargs.update(batch_size=3, samples_per_epoch=60)
            expected = passes(loader(MIXED, **kwargs), 3, from_samples)
            data = loader(MIXED, **kwargs, batch_format="tensors")
            kept = [list(data) for _ in range(2)]  # two whole passes kept
            rendered = [[from_tensors(b) for b in one_pass] for one_pass in kept]
            check(f"kept batches keep their bytes {setup}", rendered == expected[:2], rendered[:1])
            alternate: list[Any] = []
            rendered = []
            for i, batch in enumerate(data):  # every other batch kept, the rest dropped
                rendered.append(from_tensors(batch))
                if i % 2:
                    alternate.append((len(rendered) - 1, batch))
            later = all(from_tensors(b) == rendered[i] for i, b in alternate)
            check(f"every other batch kept {setup}", rendered == expected[2] and later)
    finally:
        drt_torch._RING_MIN_BYTES, drt_torch._POOL_MIN_BYTES, drt_torch._BUNDLE_BYTES = saved
        drt_torch._POOL_BATCH_MIN_BYTES = saved_threshold
        drt_torch._POOL = None


def check_bundled_handover() -> None:
    """A worker hands small batches to the training process up to 64 per DataLoader item
    (a bundle; torch's round trip per item costs more CPU than building a small batch),
    and the loop still receives them one at a time in torch's order."""
    received: list[int] = []
    unbundle = drt_torch._unbundle

    def counted(bundles: Any) -> Any:
        for bundle in bundles:
            received.append(len(bundle.items))
            yield bundle

    # (Only the training process calls _unbundle: workers never see the wrapper.)
    drt_torch._unbundle = lambda bundles, counts: unbundle(counted(bundles), counts)
    try:
        kwargs = {"worker_partition": "global", "shuffle": False, **SETUPS[1]}
        kwargs.update(batch_size=1, samples_per_epoch=128)
        expected = passes(loader(MIXED, **kwargs), 2, from_samples)
        received.clear()
        got = passes(loader(MIXED, **kwargs, batch_format="tensors"), 2, from_tensors)
        check("bundled hand-over: same batches", got == expected, (got[:1], expected[:1]))
        # 64 batches a worker a pass: one bundle (two of 32 before round 8).
        check("bundled hand-over: 64 batches an item", received == [64] * 4, received)
    finally:
        drt_torch._unbundle = unbundle


def check_words_into() -> None:
    """``Batch.words_into`` (how a batch's header is filled): the identities and the int
    and float columns land at the offsets asked, exactly as numpy reads them from the
    batch; the payload lengths come back as bytes; an array that does not fit raises
    ValueError and copies nothing."""
    import numpy as np

    dataset = open_dataset(MIXED)
    numbers = (_native.Kind.INT, _native.Kind.FLOAT)
    wide = [i for i, (_, kind) in enumerate(dataset._columns) if kind in numbers]
    with dataset._range_batches(0, 7) as reader:
        batch, _ = reader._iterator.next_batch_into(7, drt_torch._CONTIGUOUS, drt_torch._NOWHERE)
        n = batch.count
        lengths, cache_id, sample_id = batch.lengths_and_ids()
        places = [(-1, 8), (-2, 8 + 8 * n)]
        places += [(i, 8 + 8 * n * (2 + k)) for k, i in enumerate(wide)]
        out = np.zeros(8 + 8 * n * (2 + len(wide)), dtype=np.uint8)
        got = batch.words_into(out, places)
        check("words_into: lengths", got == lengths.tobytes(), (got, lengths))
        words = out[8:].view(np.uint64)
        check("words_into: cache ids", (words[:n] == cache_id).all(), words[:n])
        check("words_into: sample ids", (words[n : 2 * n] == sample_id).all(), words[n : 2 * n])
        for k, i in enumerate(wide):
            expected = batch.column_array(i, dataset._columns[i][1])
            column = out[8 + 8 * n * (2 + k) :][: 8 * n].view(expected.dtype)
            check(f"words_into: column {i}", (column == expected).all(), (column, expected))
        check("words_into: int and float columns seen", len(wide) >= 2, wide)
        small = np.zeros(8 * n + 7, dtype=np.uint8)
        try:
            batch.words_into(small, [(-2, 0), (-1, 8)])
            raised = False
        except ValueError:
            raised = True
        check("words_into: too small raises, copies nothing", raised and not small.any(), small)


def check_shared_layout() -> None:
    """Batches of one shape (fixed-size records) share one layout object and one empty
    strings dict, so a worker's bundle pickles them once: a bundle of 8 such batches
    pickles to much less than 8 times one batch's entry."""
    import pickle

    dataset = open_dataset(FIXED)
    batches = list(drt_torch._tensor_batches(dataset, 0, 40, 0, 0, 4, "pool"))
    layouts = {id(b._layout) for b in batches[1:]}
    strings = {id(b._strings) for b in batches}
    check("shared layout: one object", len(layouts) == 1, [b._layout for b in batches])
    check("shared layout: one strings dict", len(strings) == 1, strings)
    entries = [(8 * i, 64, b._layout, b._strings) for i, b in enumerate(batches[1:9])]
    one, eight = len(pickle.dumps(entries[:1])), len(pickle.dumps(entries))
    check("shared layout: pickled once", eight < 3 * one, (one, eight))


def check_payloads_in_place() -> None:
    """The native reader writes a batch's payloads straight into its buffer when the
    room foreseen from the latest batch holds them, else they are copied out of the
    reader's buffer (the first batch, larger batches): both give the per-sample path's
    batches. Checked with the room as foreseen (batches in place) and with half of it
    (payloads that overflow it midway), a reader prefetch of 3 (a batch spans reads)."""
    runtime = drt.DatasetRuntime(num_workers=1)
    dataset = runtime.cached_dataset(MIXED, reader_config=drt.ReaderConfig(seed=0, prefetch_size=3))
    saved = drt_torch._SLACK, drt_torch._MARGIN
    original = _native.Iterator.next_batch_into
    placed: list[bool] = []

    def counting(self: Any, *args: Any) -> Any:
        batch, fits = original(self, *args)
        if batch.count:
            placed.append(fits)
        return batch, fits

    _native.Iterator.next_batch_into = counting  # type: ignore[method-assign]
    try:
        for slack, margin, name in ((saved[0], saved[1], "foreseen"), (0.5, 0, "overflowing")):
            drt_torch._SLACK, drt_torch._MARGIN = slack, margin
            placed.clear()
            for mode, setup in itertools.product(MODES, SETUPS[:2]):
                kwargs = {**mode, **setup, "batch_size": 4, "samples_per_epoch": 23}
                kwargs.update(verbose=False, native_num_workers=1)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    samples = dataset.to_torch_dataloader(**kwargs)
                    tensors = dataset.to_torch_dataloader(**kwargs, batch_format="tensors")
                expected = passes(samples, 2, from_samples)
                got = passes(tensors, 2, from_tensors)
                check(f"{name} room {mode} {setup}", got == expected, (got[:1], expected[:1]))
            # (Counted in this process: the 0-worker loaders.)
            inside, outside = placed.count(True), placed.count(False)
            wanted = inside > 5 * outside if name == "foreseen" else outside > 5 * inside
            check(f"{name} room: payloads in place {inside}, copied {outside}", wanted)
    finally:
        _native.Iterator.next_batch_into = original  # type: ignore[method-assign]
        drt_torch._SLACK, drt_torch._MARGIN = saved


def check_rings_forgotten() -> None:
    """After a pass of workers that do not persist, the training process keeps no
    mapping of their rings but through batches it still holds, which stay intact."""
    kwargs = {"batch_size": 3, "num_workers": 2, "persistent_workers": False}
    kwargs.update(multiprocessing_context="fork", shuffle=False)
    expected = passes(loader(MIXED, **kwargs), 1, from_samples)[0]
    kept = list(loader(MIXED, **kwargs, batch_format="tensors"))
    check("rings of exited workers are unmapped", not drt_torch._MAPPED, drt_torch._MAPPED)
    check("their batches stay intact", [from_tensors(b) for b in kept] == expected)


def check_killed_worker_leaves_nothing() -> None:
    """A worker killed with batches in flight (its ring not yet mapped by the training
    process) leaves no file behind: rings are unnamed shared memory."""
    import signal

    data = loader(
        MIXED,
        batch_size=2,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="fork",
        batch_format="tensors",
        samples_per_epoch=200,
    )
    iterator = iter(data)
    time.sleep(1.0)  # the workers build their first batches; none is received yet
    workers = data._iterator._workers
    pids = [worker.pid for worker in workers]
    # What a kill now would leave behind (rings not mapped by the training process).
    unmapped = shm_rings(pids)
    os.kill(workers[1].pid, signal.SIGKILL)
    workers[1].join()
    raised = False
    try:
        for _ in iterator:
            pass
    except RuntimeError:
        raised = True
    data._drt_shutdown_workers()
    after = shm_rings(pids)
    check("killed worker: the loader raises", raised)
    check("unmapped rings have no file", not unmapped, sorted(unmapped))
    check("killed worker: no ring file left", not after, sorted(after))


def check_raises(name: str, call: Any, error: type[Exception], text: str) -> None:
    try:
        call()
    except error as exc:
        check(name, str(exc) == text, exc)
    else:
        check(name, False, "no error")


def check_validation() -> None:
    dataset = open_dataset(MIXED)

    def make(**kwargs: Any) -> Any:
        return dataset.to_torch_dataloader(verbose=False, num_workers=0, **kwargs)

    cases = [
        ({"batch_format": "arrow"}, ValueError, "batch_format must be 'samples' or 'tensors'"),
        (
            {"batch_transform_fn": decode_tokens},
            ValueError,
            "batch_transform_fn requires batch_format='tensors'",
        ),
        (
            {"batch_format": "tensors", "sample_transform_fn": decode_tokens},
            ValueError,
            "batch_format='tensors' builds whole batches without per-sample objects, so it "
            "takes no sample_transform_fn; use batch_transform_fn (it receives each "
            "TensorBatch)",
        ),
        (
            {"batch_format": "tensors", "collate_fn": list},
            ValueError,
            "batch_format='tensors' builds whole batches without per-sample objects, so it "
            "takes no collate_fn; use batch_transform_fn (it receives each TensorBatch)",
        ),
        (
            {"dataloader_kwargs": {"batch_format": "tensors"}},
            ValueError,
            "dataloader_kwargs contains reserved arguments: batch_format",
        ),
    ]
    for kwargs, error, text in cases:
        check_raises(f"validation {sorted(kwargs)}", lambda k=kwargs: make(**k), error, text)
    check_raises(
        "unpicklable batch_transform_fn",
        lambda: dataset.to_torch_dataloader(
            verbose=False,
            num_workers=1,
            batch_format="tensors",
            batch_transform_fn=lambda b: b,
        ),
        TypeError,
        "batch_transform_fn must be picklable for multiprocess loading",
    )


def check_width() -> None:
    """The one payload length of a batch (its ``[batch, length]`` shape), or -1: lengths
    compared with cached even lengths, including ones with the right total only."""
    import numpy as np

    packer = drt_torch._Packer(None, [], "pool")  # type: ignore[arg-type]
    cases = {
        (3, 3, 3): 3,
        (0, 0): 0,
        (2, 0, 4): -1,  # total 3 x 2
        (5,): 5,
        (3, 3, 4): -1,
        (4, 4, 4): 4,
        (4, 4, 3, 5): -1,
    }
    for _ in range(2):  # computed, then cached
        for lengths, width in cases.items():
            got = packer.width(np.array(lengths, dtype=np.uint64).tobytes())
            check(f"width of {lengths}", got == width, got)


def main() -> None:
    MIXED.extend(json.loads(sys.argv[1]))
    FIXED.extend(json.loads(sys.argv[2]))
    torch.set_num_threads(1)
    for step in (
        check_width,
        check_same_batches,
        check_fixed_length_and_transform,
        check_resume,
        check_pin_memory,
        check_fields_share_buffer,
        check_validation,
        check_reused_memory,
        check_bundled_handover,
        check_words_into,
        check_shared_layout,
        check_payloads_in_place,
        check_rings_forgotten,
        check_killed_worker_leaves_nothing,
    ):
        try:
            step()
        except Exception:  # report, keep checking
            import traceback

            check(step.__name__ + " raised", False, traceback.format_exc())
    print(json.dumps(RESULTS))


if __name__ == "__main__":
    main()
