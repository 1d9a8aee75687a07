"""Throughput of the PyTorch loader next to the dataset's own readers.

    uv run python benchmarks/torch_loader.py [--samples N] [--size BYTES] [--batch B]

torch is not in the uv environment: when it cannot be imported, the script re-runs itself
in the pip-made CPU-torch virtualenv the tests use (``tests/refenv.py``, built on first
use). The cache is written to a temporary directory and read warm (page cache), so the
numbers are about the per-sample and per-batch work, not the disk:

- ``iter_batches`` (numpy batches, no per-sample objects) and ``iter(dataset)`` (one
  ``CachedSample`` per sample): the dataset's own readers, the ceiling for a loader;
- ``to_torch_dataloader`` in "global" and "replicate" mode with 0 and 2 workers (fork),
  default collate of ``CachedSample`` records, i.e. what a training loop receives.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def reexec_with_torch() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import refenv

    env = refenv.ensure_extra("torch-2.13.0", ("torch==2.13.0",), "import torch; print('ok')")
    os.execve(str(env.python), [str(env.python), __file__, *sys.argv[1:]], env.environ())


class Payloads:
    name = "bench_torch"

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size

    def __iter__(self):
        import dataset_rt as drt

        blob = bytes(range(256)) * (self.size // 256 + 1)
        for i in range(self.count):
            yield drt.CacheInput(blob[: self.size], {"label": i % 10})


def rate(label: str, samples: int, seconds: float, size: int) -> None:
    per_second = samples / seconds
    print(f"{label:<44} {per_second:>12,.0f} samples/s {per_second * size / 1e6:>9,.0f} MB/s")


def main() -> None:
    try:
        import torch
    except ImportError:
        reexec_with_torch()
        return
    import dataset_rt as drt

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    version = drt.native_info()["version"]
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, dataset_rt {version}")
    with tempfile.TemporaryDirectory(prefix="dataset_rt-bench-") as work:
        runtime = drt.DatasetRuntime(num_workers=2)
        result = runtime.from_cache_sources(
            Payloads(args.samples, args.size),
            work,
            reader_config=drt.ReaderConfig(seed=1, shuffle=False),
            writer_config=drt.WriterConfig(show_progress=False),
        )
        dataset = result.dataset
        n = len(dataset)
        for _ in dataset.iter_batches(args.batch):  # warm the page cache
            pass
        start = time.perf_counter()
        for _ in dataset.iter_batches(args.batch):
            pass
        rate("dataset.iter_batches", n, time.perf_counter() - start, args.size)
        start = time.perf_counter()
        for _ in dataset:
            pass
        rate("iter(dataset)", n, time.perf_counter() - start, args.size)
        for mode, workers in (("global", 0), ("global", 2), ("replicate", 0), ("replicate", 2)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                loader = dataset.to_torch_dataloader(
                    batch_size=args.batch,
                    seed=3,
                    worker_partition=mode,
                    num_workers=workers,
                    multiprocessing_context="fork" if workers else "spawn",
                    native_num_workers=1,
                    verbose=False,
                )
            for _ in loader:  # first pass starts the workers
                pass
            start = time.perf_counter()
            count = sum(len(batch.sample_id) for batch in loader)
            rate(
                f"to_torch_dataloader {mode}, {workers} workers",
                count,
                time.perf_counter() - start,
                args.size,
            )


if __name__ == "__main__":
    main()
