"""PyTorch loaders over caches read from object storage (run by
tests/test_remote_integrations.py in the torch virtualenv, with the S3 client
environment and ``DATASET_RT_CACHE_DIR`` set). Prints one JSON object: check name ->
[ok, detail].

    python url_batches.py LOCAL_CACHES_JSON URL_CACHES_JSON

Every loader over the URLs must yield exactly the batches of the same loader over the
local copies (payload bytes, identities, metadata), per-sample and tensor path, in
every worker partition, with 0 and 2 workers (spawn and forkserver: the workers open
their readers from the snapshot, which keeps the URLs, and share one shard cache
directory; the local loaders' workers are forked). Forked workers fail with a clear
error over URLs (obstore is not fork safe).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from batch_checks import from_samples, from_tensors, passes

import dataset_rt as drt

RESULTS: dict[str, list[Any]] = {}

MODES = [
    {"worker_partition": "global", "shuffle": True, "seed": 5},
    {"worker_partition": "split", "shuffle": False},
    {"worker_partition": "replicate", "shuffle": True, "seed": 5},
]
# Not "fork": obstore (the client) is not fork safe, see check_fork_is_refused.
SETUPS = [
    {"num_workers": 0},
    {"num_workers": 2, "persistent_workers": True, "multiprocessing_context": "spawn"},
    {"num_workers": 2, "persistent_workers": True, "multiprocessing_context": "forkserver"},
]
LOCAL_START = {"spawn": {"multiprocessing_context": "fork"}}
LOCAL_START["forkserver"] = LOCAL_START["spawn"]
COMBOS = [
    *[(mode, SETUPS[0], tensors) for mode in MODES for tensors in (False, True)],
    (MODES[0], SETUPS[1], False),
    (MODES[0], SETUPS[1], True),
    (MODES[1], SETUPS[1], True),
    (MODES[2], SETUPS[2], False),
]


def check(name: str, ok: bool, detail: object = "") -> None:
    RESULTS[name] = [bool(ok), "" if ok else str(detail)[:3000]]


def loader(paths: list[str], **kwargs: Any) -> Any:
    kwargs.setdefault("verbose", False)
    kwargs.setdefault("native_num_workers", 2)
    runtime = drt.DatasetRuntime(num_workers=2)
    dataset = runtime.cached_dataset(paths, reader_config=drt.ReaderConfig(seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dataset.to_torch_dataloader(**kwargs)


def check_fork_is_refused(urls: list[str]) -> None:
    """Forked workers of a process that already used obstore cannot use it (its runtime's
    threads are gone): the loader fails with the transport's message, never hangs."""
    data = loader(urls, num_workers=2, multiprocessing_context="fork", batch_size=7, timeout=120)
    started = time.monotonic()
    try:
        next(iter(data))
        check("fork: refused with a clear error", False, "a batch came back")
    except Exception as exc:
        text = str(exc)
        ok = "cannot be used in a process forked from one that already used it" in text
        check("fork: refused with a clear error", ok, text)
    del data
    print(f"{time.monotonic() - started:6.1f} s  fork", file=sys.stderr, flush=True)


def main() -> None:
    local, urls = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    shards = Path(os.environ["DATASET_RT_CACHE_DIR"]) / "shards"
    for mode, setup, tensors in COMBOS:
        kwargs = {**mode, **setup, "batch_size": 7, "samples_per_epoch": 90}
        render = from_samples
        if tensors:
            kwargs["batch_format"] = "tensors"
            render = from_tensors
        name = f"{mode} {setup} tensors={tensors}"
        started = time.monotonic()
        # The local reference with forked workers where the URLs' use spawn or forkserver:
        # the start method changes nothing read, and forked workers start in a fraction
        # of the time (they need not import torch again).
        local_kwargs = {**kwargs, **LOCAL_START.get(setup.get("multiprocessing_context"), {})}
        try:
            expected = passes(loader(local, **local_kwargs), 2, render)
            got = passes(loader(urls, **kwargs), 2, render)
            check(name, got == expected and len(expected[0]) > 5, (got[:1], expected[:1]))
        except Exception:
            check(name, False, traceback.format_exc())
        print(f"{time.monotonic() - started:6.1f} s  {name}", file=sys.stderr, flush=True)
    check_fork_is_refused(urls)
    held = sorted(p.name for p in shards.glob("*.bin")) if shards.exists() else []
    check("the shard cache holds the shards", len(held) > 3, held)
    leftovers = [p.name for p in shards.glob("*.tmp")] if shards.exists() else []
    check("no half-downloaded shard is left", not leftovers, leftovers)
    print(json.dumps(RESULTS))


if __name__ == "__main__":
    main()
