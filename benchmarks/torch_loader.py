"""Throughput of the PyTorch loader next to the dataset's own readers and LitData.

    uv run python benchmarks/torch_loader.py [--small N] [--large N] [--batch B] [--repeat R]
        [--no-litdata]

torch is not in the uv environment: when it cannot be imported, the script re-runs itself
in the pip-made CPU-torch virtualenv the tests use (``tests/refenv.py``, built on first
use). LitData runs in a virtualenv of its own (``litdata`` and the same CPU torch,
built the same way), as a subprocess of this script.

For 512 B and 64 KiB records (``--small`` and ``--large`` samples of each), the same
records are written once as a dataset_rt cache and once as a LitData dataset (``optimize``;
each record a ``uint8`` array and an int label), in temporary directories read warm
(page cache), so the numbers are about per-sample and per-batch work, not the disk. Every
reader goes through the records in order (``shuffle=False``, ``worker_partition="global"``),
and each line is the best of ``--repeat`` timed passes after one untimed pass (which also
starts persistent workers):

- ``iter_batches``: the dataset's own batch reader (numpy batches), the ceiling;
- ``loader samples``: ``to_torch_dataloader`` per sample (``CachedSample`` records and
  torch's default collate, dataset-rt 0.4.8's path) with 0 and 2 workers;
- ``loader tensors``: ``to_torch_dataloader(batch_format="tensors")`` with 0 and 2
  workers (fork);
- ``litdata``: LitData's ``StreamingDataLoader`` over ``StreamingDataset`` with 0 and 2
  workers.

The header prints the machine's load average: on a busy machine the numbers mean little.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
LITDATA = "litdata==0.2.76"
SIZES = (512, 64 * 1024)


def reexec_with_torch() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import refenv

    env = refenv.ensure_extra("torch-2.13.0", (TORCH,), "import torch; print('ok')")
    os.execve(str(env.python), [str(env.python), __file__, *sys.argv[1:]], env.environ())


def blob(size: int) -> bytes:
    return (bytes(range(256)) * (size // 256 + 1))[:size]


class Payloads:
    name = "bench_torch"

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size

    def __iter__(self):
        import dataset_rt as drt

        data = blob(self.size)
        for i in range(self.count):
            yield drt.CacheInput(data, {"label": i % 10})


def best(passes: int, run) -> tuple[float, int]:
    """(best seconds, samples) of ``passes`` timed runs of ``run() -> samples`` after one
    untimed run."""
    run()
    times = []
    count = 0
    for _ in range(passes):
        start = time.perf_counter()
        count = run()
        times.append(time.perf_counter() - start)
    return min(times), count


def line(label: str, count: int, seconds: float, size: int, ceiling: float | None) -> float:
    per_second = count / seconds
    share = f"{per_second / ceiling:>6.0%}" if ceiling else "      "
    print(
        f"  {label:<34} {per_second:>12,.0f} samples/s {per_second * size / 1e6:>8,.0f} MB/s "
        f"{share}",
        flush=True,
    )
    return per_second


# ------------------------------------------------------------------ LitData (own venv)


def litdata_env():
    sys.path.insert(0, str(ROOT / "tests"))
    import refenv

    return refenv.ensure_extra(
        "litdata-0.2.76", (LITDATA, TORCH), "import litdata, torch; print('ok')"
    )


def _litdata_sample(index: int, size: int = 0) -> dict:
    import numpy as np

    return {"data": np.frombuffer(blob(size), dtype=np.uint8), "label": index % 10}


def run_litdata_side(spec: dict) -> None:
    """In the LitData virtualenv: write ``spec["count"]`` records with ``optimize``, then
    time ``StreamingDataLoader`` passes; prints JSON {workers: [seconds, samples]}."""
    import functools

    import litdata as ld
    import torch

    torch.set_num_threads(1)
    out = spec["dir"]
    ld.optimize(
        fn=functools.partial(_litdata_sample, size=spec["size"]),
        inputs=list(range(spec["count"])),
        output_dir=out,
        chunk_bytes="64MB",
        num_workers=1,
    )
    results = {}
    for workers in (0, 2):
        dataset = ld.StreamingDataset(out, shuffle=False)
        loader = ld.StreamingDataLoader(
            dataset, batch_size=spec["batch"], num_workers=workers, persistent_workers=workers > 0
        )

        def run(loader=loader) -> int:
            return sum(len(batch["label"]) for batch in loader)

        results[workers] = best(spec["repeat"], run)
    print(json.dumps(results))


def litdata_rates(env, work: Path, size: int, count: int, args) -> dict[str, tuple[float, int]]:
    spec = {"dir": str(work / "litdata"), "size": size, "count": count, "batch": args.batch}
    spec["repeat"] = args.repeat
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run(
        [str(env.python), __file__, "--litdata-side", json.dumps(spec)],
        env=clean,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"LitData run failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ dataset_rt


def measure(size: int, count: int, args, lit_env) -> None:
    import dataset_rt as drt

    print(f"\n{size} B records, {count:,} samples, batch {args.batch}", flush=True)
    with tempfile.TemporaryDirectory(prefix="dataset_rt-bench-") as work:
        runtime = drt.DatasetRuntime(num_workers=2)
        result = runtime.from_cache_sources(
            Payloads(count, size),
            work,
            reader_config=drt.ReaderConfig(seed=1, shuffle=False),
            writer_config=drt.WriterConfig(show_progress=False),
        )
        dataset = result.dataset

        def batches() -> int:
            return sum(len(b) for b in dataset.iter_batches(args.batch))

        seconds, n = best(args.repeat, batches)
        ceiling = line("dataset.iter_batches", n, seconds, size, None)
        for batch_format in ("samples", "tensors"):
            for workers in (0, 2):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    loader = dataset.to_torch_dataloader(
                        batch_size=args.batch,
                        shuffle=False,
                        worker_partition="global",
                        num_workers=workers,
                        multiprocessing_context="fork" if workers else "spawn",
                        native_num_workers=1,
                        verbose=False,
                        batch_format=batch_format,
                    )

                def run(loader=loader) -> int:
                    return sum(len(batch.sample_id) for batch in loader)

                seconds, n = best(args.repeat, run)
                line(f"loader {batch_format}, {workers} workers", n, seconds, size, ceiling)
                del loader
        if lit_env is not None:
            for workers, (seconds, n) in litdata_rates(
                lit_env, Path(work), size, count, args
            ).items():
                line(f"litdata StreamingDataLoader, {workers} workers", n, seconds, size, ceiling)


def main() -> None:
    if "--litdata-side" in sys.argv:
        run_litdata_side(json.loads(sys.argv[sys.argv.index("--litdata-side") + 1]))
        return
    try:
        import torch
    except ImportError:
        reexec_with_torch()
        return
    import dataset_rt as drt

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=200_000, help="512 B records")
    parser.add_argument("--large", type=int, default=8192, help="64 KiB records")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-litdata", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    version = drt.native_info()["version"]
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, dataset_rt {version}, "
        f"{LITDATA}; load average at start: {load}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print("(last column: share of iter_batches)")
    lit_env = None if args.no_litdata else litdata_env()
    for size, count in zip(SIZES, (args.small, args.large)):
        measure(size, count, args, lit_env)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average at end: {load}")


if __name__ == "__main__":
    main()
