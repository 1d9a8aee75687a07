"""Single-process checks of the PyTorch adapters (run by tests/test_torch.py in a
virtualenv with torch). Prints one JSON object: check name -> [ok, detail].

    python loader_checks.py CACHE_PATH...
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import warnings
from typing import Any

import polars as pl
import torch
from torch.utils.data import DataLoader

import dataset_rt as drt

PATHS: list[str] = []
RESULTS: dict[str, list[Any]] = {}


def check(name: str, ok: bool, detail: object = "") -> None:
    RESULTS[name] = [bool(ok), "" if ok else str(detail)[:2000]]


def open_dataset(shuffle: bool = False, seed: int = 0, table: str | None = None) -> Any:
    runtime = drt.DatasetRuntime(num_workers=1)
    dataset = runtime.cached_dataset(
        PATHS, reader_config=drt.ReaderConfig(seed=seed, shuffle=shuffle)
    )
    if table == "weighted":
        meta = dataset.get_metadata()
        dataset.update_metadata(
            meta.filter(pl.col("sample_id") % 5 != 2).with_columns(
                weight=(pl.col("sample_id") % 3 + 1).cast(pl.Float64)
            )
        )
    return dataset


def ids(batch: Any) -> list[list[int]]:
    return [[int(c), int(s)] for c, s in zip(batch.cache_id, batch.sample_id)]


def flat(batches: list[Any]) -> list[list[int]]:
    return [pair for batch in batches for pair in batch]


def loader(dataset: Any, **kwargs: Any) -> Any:
    kwargs.setdefault("verbose", False)
    kwargs.setdefault("native_num_workers", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dataset.to_torch_dataloader(**kwargs)


def global_stream(shuffle: bool, seed: int, table: str | None, count: int) -> list[list[int]]:
    """The dataset's own stream (one dataset, reader seed = the loader's seed)."""
    dataset = open_dataset(shuffle=shuffle, seed=seed, table=table)
    dataset.set_epoch_len(count)
    return [[s.cache_id, s.sample_id] for s in dataset]


def check_global_mode() -> None:
    for shuffle, table in ((False, None), (True, None), (True, "weighted")):
        seed = 1234 if shuffle else "random"
        expected = global_stream(shuffle, 1234 if shuffle else 0, table, 3 * 24)
        runs = {}
        for workers, context in ((0, None), (2, "fork"), (3, "fork")):
            kwargs: dict[str, Any] = {"multiprocessing_context": context} if context else {}
            data = loader(
                open_dataset(table=table),
                batch_size=4,
                shuffle=shuffle,
                seed=seed,
                worker_partition="global",
                samples_per_epoch=24,
                num_workers=workers,
                **kwargs,
            )
            passes = [[ids(b) for b in data] for _ in range(3)]
            runs[workers] = passes
            name = f"global shuffle={shuffle} table={table} workers={workers}"
            check(name + ": len", len(data) == 6, len(data))
            check(
                name + ": stream",
                flat(flat(passes)) == expected,
                (flat(flat(passes))[:12], expected[:12]),
            )


def check_padding_warning() -> None:
    dataset = open_dataset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = dataset.to_torch_dataloader(
            batch_size=4,
            shuffle=False,
            worker_partition="global",
            samples_per_epoch=10,
            num_workers=0,
            verbose=False,
        )
    messages = [str(w.message) for w in caught]
    check(
        "global pads to whole batches with the reference's warning",
        len(data) == 3
        and any("requested 10 global samples, effective 12; padded 2" in m for m in messages),
        messages,
    )


def run_passes(data: Any, passes: int) -> list[list[list[list[int]]]]:
    return [[ids(b) for b in data] for _ in range(passes)]


def check_resume() -> None:
    rng = random.Random(7)
    configs = [
        {"worker_partition": "global", "shuffle": True, "seed": 5},
        {"worker_partition": "global", "shuffle": False},
        {"worker_partition": "replicate", "shuffle": True, "seed": 5},
        {"worker_partition": "split", "shuffle": True, "seed": 5},
        {"worker_partition": "split", "shuffle": False},
    ]
    worker_setups = [
        {"num_workers": 0},
        {"num_workers": 2, "persistent_workers": True, "multiprocessing_context": "fork"},
        {"num_workers": 2, "persistent_workers": False, "multiprocessing_context": "fork"},
    ]
    for config, setup in itertools.product(configs, worker_setups):
        kwargs = {**config, **setup, "batch_size": 3, "samples_per_epoch": 20}
        table = "weighted" if config["shuffle"] else None
        full = run_passes(loader(open_dataset(table=table), **kwargs), 3)
        total = sum(len(p) for p in full)
        for cut in sorted(rng.sample(range(1, total), 2)):
            resume_at(f"resume {config} {setup} cut={cut}/{total}", kwargs, table, full, cut)


def resume_at(
    name: str, kwargs: dict[str, Any], table: str | None, full: list[Any], cut: int
) -> None:
    """Consume ``cut`` batches (across passes), save the state, stop; then a fresh loader
    from a fresh dataset loads it and reads the remaining passes: together they must
    equal the uninterrupted passes ``full``."""
    expected = [batch for one_pass in full for batch in one_pass]
    first = loader(open_dataset(table=table), **kwargs)
    got: list[list[list[int]]] = []
    state = None
    for _ in range(len(full)):
        for batch in first:
            got.append(ids(batch))
            if len(got) == cut:
                state = json.loads(json.dumps(first.state_dict()))
                break
        if state is not None:
            break
    del first
    second = loader(open_dataset(table=table), **kwargs)
    second.load_state_dict(state)
    for _ in range(len(full)):  # the rest of the interrupted pass, then the later ones
        if len(got) >= len(expected):
            break
        got.extend(ids(b) for b in second)
    check(name, got == expected, (got, full))
    check(name + ": small state", len(json.dumps(state)) < 1000, state)


def check_raises(
    name: str, call: Any, error: type[Exception], text: str, exact: bool = False
) -> None:
    """``call()`` must raise ``error`` whose message is (or with ``exact`` False,
    contains) ``text``."""
    try:
        call()
    except error as exc:
        check(name, str(exc) == text if exact else text in str(exc), exc)
    else:
        check(name, False, "no error")


def check_resume_errors() -> None:
    def split(table: str | None = None, **kwargs: Any) -> Any:
        settings = {"batch_size": 2, "shuffle": True, "seed": 3, "worker_partition": "split"}
        return loader(open_dataset(table=table), num_workers=0, **{**settings, **kwargs})

    state = split().state_dict()
    for name, other, text in (
        ("different table rejected", split("weighted"), "different active table"),
        ("different seed rejected", split(seed=4), "seed=3"),
        ("split needs the same batch size", split(batch_size=3), "same batch_size"),
        ("another mode rejected", split(worker_partition="global"), "worker_partition='split'"),
    ):
        check_raises(name, lambda other=other: other.load_state_dict(state), ValueError, text)
    # A loader made with seed="random" adopts the saved seed.
    saved = split(seed=99, worker_partition="replicate")
    expected = [ids(b) for b in saved]
    fresh = split(seed="random", worker_partition="replicate")
    fresh.load_state_dict(split(seed=99, worker_partition="replicate").state_dict())
    check("random seed adopts the saved seed", [ids(b) for b in fresh] == expected)


def check_iterable_dataset() -> None:
    dataset = open_dataset(shuffle=True, seed=8, table="weighted")
    window = len(dataset)
    reference = open_dataset(shuffle=True, seed=8, table="weighted")
    expected = [[[s.cache_id, s.sample_id] for s in reference] for _ in range(3)]
    for context, persistent in (("fork", True), ("fork", False), ("spawn", True)):
        wrapped = dataset.to_torch_iterable_dataset()
        data = DataLoader(
            wrapped,
            batch_size=None,
            num_workers=2,
            multiprocessing_context=context,
            persistent_workers=persistent,
        )
        passes = [[[int(s.cache_id), int(s.sample_id)] for s in data] for _ in range(3)]
        name = f"iterable dataset in workers ({context}, persistent={persistent})"
        check(
            name + ": each epoch is one window",
            all(sorted(p) == sorted(e) for p, e in zip(passes, expected)),
            (passes, expected),
        )
        check(name + ": len", len(wrapped) == window)
    main = list(dataset.to_torch_iterable_dataset())
    check(
        "iterable dataset in the main process is iter(dataset)",
        [[s.cache_id, s.sample_id] for s in main] == expected[0],
    )


def check_validation() -> None:
    dataset = open_dataset()
    cases = [
        ({"batch_size": 0}, "batch_size must be a positive integer fitting sys.maxsize"),
        (
            {"seed": 3, "shuffle": False},
            "seed requires shuffle=True; use 'random' for sequential reading",
        ),
        (
            {"worker_partition": "rows"},
            "worker_partition must be 'split', 'replicate', 'global', or None",
        ),
        ({"num_workers": 0, "timeout": 5}, "timeout must be zero with num_workers=0"),
        (
            {"num_workers": 0, "persistent_workers": True},
            "persistent_workers=True requires num_workers > 0",
        ),
        (
            {"dataloader_kwargs": {"sampler": None}},
            "dataloader_kwargs contains reserved arguments: sampler",
        ),
        ({"seed": -1}, "seed must be 'random' or an unsigned 64-bit integer"),
    ]
    for kwargs, message in cases:
        call = lambda kwargs=kwargs: dataset.to_torch_dataloader(verbose=False, **kwargs)  # noqa: E731
        check_raises(f"validation {kwargs}", call, ValueError, message, exact=True)
    check_raises(
        "unpicklable transform",
        lambda: dataset.to_torch_dataloader(
            verbose=False, num_workers=1, sample_transform_fn=lambda s: s
        ),
        TypeError,
        "sample_transform_fn must be picklable for multiprocess loading",
        exact=True,
    )


def check_work_dir_and_logging() -> None:
    import logging
    import tempfile
    from pathlib import Path

    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("dataset_rt.loader")
    handler = Collect()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with tempfile.TemporaryDirectory() as work:
            data = open_dataset().to_torch_dataloader(
                batch_size=4, shuffle=False, num_workers=0, work_dir=work
            )
            batches = [ids(b) for b in data]
            exports = list(Path(work).glob("dataset-rt-*/dataset.json"))
            del data
            check("work_dir keeps the snapshot", len(exports) == 1 and exports[0].exists(), exports)
    finally:
        logger.removeHandler(handler)
    check("all batches read", len(batches) == 5, batches)
    events = [r.split()[0] for r in records]
    check(
        "verbose logs the loader and reader events",
        events[:2] == ["event=loader_ready", "event=reader_started"]
        and "event=reader_pass" in events,
        records,
    )


def main() -> None:
    PATHS.extend(sys.argv[1:])
    torch.set_num_threads(1)
    for step in (
        check_global_mode,
        check_padding_warning,
        check_resume,
        check_resume_errors,
        check_iterable_dataset,
        check_work_dir_and_logging,
        check_validation,
    ):
        try:
            step()
        except Exception as exc:  # report, keep checking
            import traceback

            check(step.__name__ + " raised", False, traceback.format_exc())
            del exc
    print(json.dumps(RESULTS))


if __name__ == "__main__":
    main()
