"""One rank of the benchmark: read a dataset through ``to_torch_dataloader``, transform
each sample into features, train a small DistributedDataParallel model on them for
``repeats`` passes, check what was read, and (global rank 0) write the JSON report.

The workload, the checks and the report fields are dataset-rt 0.4.8's, so the two
packages can be compared on the same command line. The checks a run must pass before it
reports anything:

- the loader's per-consumer shares add up to the rank's budget and, in "split" mode,
  tile the rank's span of rows (computed here independently of the loader);
- every rank runs the same code, options and active table (a collective comparison);
- each pass yields exactly ``len(loader)`` batches and the rank's budget of samples, the
  same on every rank; synthetic samples match their metadata, and sequential synthetic
  reads follow each consumer's planned rows;
- a fresh loader with the same options reproduces the first batches; model parameters
  agree across ranks; no loader worker outlives the run; the code did not change.

Needs the ``benchmark`` extra (torch, pydantic-settings, psutil).
"""

from __future__ import annotations

import faulthandler
import gc
import hashlib
import multiprocessing
import platform
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from importlib.metadata import PackageNotFoundError, version
from itertools import islice
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, NamedTuple

import psutil
import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, get_worker_info

import dataset_rt
from dataset_rt import CachedSample, CacheInput, CacheWriteSuccess, DatasetRuntime
from dataset_rt.benchmarks.config import DIGEST_FEATURES, BenchmarkConfig, Topology
from dataset_rt.benchmarks.resources import (
    ResourceObserver,
    Resources,
    combine_resources,
    resource_snapshot,
)
from dataset_rt.config import ReaderConfig, WriterConfig
from dataset_rt.integrations._loading import ConsumerPlan, span
from dataset_rt.integrations.torch import DatasetRTDataLoader

__all__ = ["PassResult", "RankResult", "Report", "run_rank"]

# Batches of each pass hashed into ``prefix_digest`` (and replayed by a fresh loader).
PREFIX_BATCHES = 4
# Rank 0 prints progress every this many batches (unless quiet).
PROGRESS_BATCHES = 100
# Model parameters of two ranks may differ by float rounding only.
PARAMETER_TOLERANCE = 1e-6
LEARNING_RATE = 0.01
# Seconds to wait for a loader worker process or the observer thread to end.
JOIN_TIMEOUT_S = 5.0
# Files whose bytes identify the reader and the benchmark (relative to the package),
# hashed into reader_sha256 / benchmark_sha256 with the native library itself.
READER_FILES = (
    "config.py",
    "records.py",
    "dataset.py",
    "runtime.py",
    "_native.py",
    "integrations/_loading.py",
    "integrations/torch.py",
)
BENCHMARK_FILES = (
    "run_benchmark.py",
    "benchmarks/config.py",
    "benchmarks/distributed.py",
    "benchmarks/resources.py",
)


# ------------------------------------------------------------------ report records


class _Record(BaseModel):
    """Report records: strict, closed and finite, as they cross the collectives and JSON."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class PassResult(_Record):
    """One pass on one rank. ``elapsed_seconds`` runs from the barrier before the pass
    to its last batch; ``first_batch_seconds`` is the wait for the first batch (the
    first pass includes starting readers and workers, not a cold OS page cache);
    ``batch_wait_seconds`` sums the waits for batches, ``training_seconds`` the training
    steps. ``prefix_digest`` hashes the (cache_id, sample_id) of the first batches."""

    batches: int
    samples: int
    elapsed_seconds: float
    first_batch_seconds: float
    batch_wait_seconds: float
    training_seconds: float
    prefix_digest: str
    gpu_peak_allocated_bytes: int
    gpu_peak_reserved_bytes: int
    resources: Resources


class RankResult(_Record):
    """What one rank measured and verified (counts and timings, never samples)."""

    rank: int
    local_rank: int
    hostname: str
    device: str
    dataset_rt_version: str
    torch_version: str
    python_version: str
    platform: str
    reader_sha256: str
    benchmark_sha256: str
    accelerator_build: str
    population: int
    global_requested_samples: int
    global_effective_samples: int
    loader_batches: int
    construction_seconds: float
    replay_verified: bool
    sequential_fixture_order_verified: bool
    parameter_max_difference: float
    cleanup_seconds: float
    passes: tuple[PassResult, ...]


class Report(_Record):
    """The whole run. ``global_samples_per_second[k]`` is the samples all ranks read in
    pass ``k`` divided by the slowest rank's ``elapsed_seconds`` of that pass."""

    recorded_at: datetime
    settings: BenchmarkConfig
    world_size: int
    backend: str
    synthetic: bool
    ranks: tuple[RankResult, ...]
    global_samples_per_second: tuple[float, ...]


# ------------------------------------------------------------------ synthetic input


@dataclass
class SyntheticSource:
    """A cache source of ``count`` samples whose payload and metadata both encode the
    sample's global position (``cache_position * count + index``), so a reader can check
    every sample it gets. Payloads are ``payload_bytes`` long; the ``wide`` metadata
    column pads each row to ``metadata_bytes`` characters."""

    name: str
    cache_position: int
    count: int
    payload_bytes: int
    metadata_bytes: int

    def __iter__(self) -> Iterator[CacheInput]:
        for index in range(self.count):
            position = self.cache_position * self.count + index
            yield CacheInput(
                payload_for(position, index, self.payload_bytes),
                {
                    "benchmark_position": position,
                    "wide": str(position).ljust(self.metadata_bytes, "x")
                    if self.metadata_bytes
                    else "",
                },
            )


def identity_header(position: int, sample_id: int) -> bytes:
    """The first 16 payload bytes of a synthetic sample: position and row, little-endian."""
    return position.to_bytes(8, "little") + sample_id.to_bytes(8, "little")


def payload_for(position: int, sample_id: int, size: int) -> bytes:
    """The header repeated to ``size`` bytes."""
    header = identity_header(position, sample_id)
    return (header * -(-size // len(header)))[:size]


@contextmanager
def open_dataset(config: BenchmarkConfig) -> Iterator[Any]:
    """The dataset to read: ``config.cache_paths`` as they are, or synthetic caches
    written into a temporary directory that lives until the rank is done with them."""
    runtime = DatasetRuntime(num_workers=config.native_num_workers)
    reader_config = ReaderConfig(
        seed=config.seed, shuffle=config.shuffle, prefetch_size=config.prefetch_size
    )
    with TemporaryDirectory(prefix="dataset-rt-benchmark-") as directory:
        paths: tuple[Path, ...] = config.cache_paths
        if not paths:
            sources = [
                SyntheticSource(
                    f"benchmark-{position}",
                    position,
                    config.samples_per_cache,
                    config.payload_bytes,
                    config.metadata_bytes,
                )
                for position in range(config.caches)
            ]
            written = runtime.write_cache(
                sources, Path(directory), writer_config=WriterConfig(show_progress=False)
            )
            failed = [r for r in written if not isinstance(r, CacheWriteSuccess)]
            if failed:
                raise RuntimeError(failed[0])
            paths = tuple(r.path for r in written)
        yield runtime.cached_dataset(paths, reader_config=reader_config)


# ------------------------------------------------------------------ samples and batches


class Identity(NamedTuple):
    """Where a sample came from (``position``: synthetic inputs only, else 0) and which
    DataLoader worker read it (0 in the training process)."""

    cache_id: int
    sample_id: int
    position: int
    worker: int


@dataclass(frozen=True)
class Sample:
    """A transformed sample: CPU features (workers never touch the accelerator)."""

    inputs: torch.Tensor
    identity: Identity


@dataclass(frozen=True)
class Batch:
    """Stacked features and the identities of their samples. ``pin_memory`` is torch's
    hook for custom batch types (``pin_memory=True``)."""

    inputs: torch.Tensor
    identities: tuple[Identity, ...]

    def pin_memory(self) -> Batch:
        """This batch with its features in pinned memory."""
        return Batch(self.inputs.pin_memory(), self.identities)


@dataclass(frozen=True)
class Transform:
    """Synthetic per-sample CPU work (not a real decoder): SHA-256 of the payload, hashed
    ``rounds`` more times, as ``features`` floats in [0, 1]. For synthetic inputs it
    first checks that the payload belongs to the metadata row it came with."""

    features: int
    rounds: int
    synthetic: bool

    def __call__(self, sample: CachedSample) -> Sample:
        position = 0
        if self.synthetic:
            position = sample.metadata["benchmark_position"]
            if type(position) is not int:
                raise ValueError("synthetic position must be an integer")
            if sample.data[:16] != identity_header(position, sample.sample_id):
                raise ValueError("synthetic payload identity differs from metadata")
        digest = hashlib.sha256(sample.data).digest()
        for _ in range(self.rounds):
            digest = hashlib.sha256(digest).digest()
        features = torch.frombuffer(bytearray(digest), dtype=torch.uint8).float().div_(255)
        info = get_worker_info()
        worker = 0 if info is None else info.id
        identity = Identity(sample.cache_id, sample.sample_id, position, worker)
        return Sample(features.repeat(self.features // DIGEST_FEATURES), identity)


def collate(samples: list[Sample]) -> Batch:
    """One batch from a list of samples."""
    return Batch(torch.stack([s.inputs for s in samples]), tuple(s.identity for s in samples))


def make_loader(dataset: Any, config: BenchmarkConfig, synthetic: bool) -> DataLoader[Any]:
    """The loader every rank builds alike, through the public ``to_torch_dataloader``."""
    workers = config.num_workers
    return dataset.to_torch_dataloader(
        batch_size=config.batch_size,
        sample_transform_fn=Transform(config.input_features, config.transform_rounds, synthetic),
        collate_fn=collate,
        shuffle=config.shuffle,
        seed=config.seed if config.shuffle else "random",
        samples_per_epoch=config.samples_per_epoch,
        worker_partition=config.worker_partition,
        num_workers=workers,
        drop_last=config.drop_last,
        pin_memory=config.pin_memory,
        timeout=config.worker_timeout if workers else 0,
        native_num_workers=config.native_num_workers,
        multiprocessing_context=config.worker_context,
        prefetch_factor=config.prefetch_factor if workers else "auto",
        persistent_workers=config.persistent_workers and workers > 0,
        verbose=not config.quiet,
    )


# ------------------------------------------------------------------ independent checks


def local_samples(samples: int, ranks: int, batch_size: int, drop_last: bool) -> int:
    """Samples per rank and pass for a global budget ``samples``: whole batches per rank
    (rounded down) with ``drop_last``, else the budget split evenly, rounded up."""
    if drop_last:
        return samples // (ranks * batch_size) * batch_size
    return -(-samples // ranks)


def consumer_plans(loader: DataLoader[Any]) -> tuple[ConsumerPlan, ...]:
    """The fixed per-consumer shares of a "split"/"replicate" loader (one per worker, or
    one for the training process): rows ``offset .. offset + population`` (cyclic) and
    ``sample_count`` samples per pass."""
    if not isinstance(loader, DatasetRTDataLoader):
        raise TypeError("expected a dataset_rt DataLoader")
    return tuple(loader.dataset.layout.plans)  # type: ignore[attr-defined]


def requested_samples(config: BenchmarkConfig, population: int) -> int:
    """The global budget per pass: ``samples_per_epoch``, else the dataset's length."""
    return population if config.samples_per_epoch is None else config.samples_per_epoch


def validate_plans(
    plans: tuple[ConsumerPlan, ...],
    population: int,
    requested: int,
    config: BenchmarkConfig,
    topology: Topology,
) -> None:
    """Check the loader's shares against the budget and rank span computed here: the
    shares add up to the rank's budget; "replicate" consumers each see every row;
    "split" consumers tile this rank's span of rows without gaps or overlaps."""
    quota = local_samples(requested, topology.world_size, config.batch_size, config.drop_last)
    active = [p for p in plans if p.sample_count]
    if sum(p.sample_count for p in active) != quota:
        raise ValueError("worker plans multiply or lose the local budget")
    if quota == 0:
        return
    if config.worker_partition == "replicate":
        if any(p.offset != 0 or p.population != population for p in active):
            raise ValueError("replicated worker population is incomplete")
        return
    if requested == population:
        # A full pass: every rank reads `quota` rows (the last rank wraps around).
        start, length = topology.rank * quota, quota
    else:
        # Ranks split the rows (at least one row each, wrapping) into contiguous spans.
        rows = max(population, topology.world_size)
        start, length = span(rows, topology.world_size, topology.rank)
    cursor = start
    for p in active:
        if p.offset != cursor or p.population == 0:
            raise ValueError("split worker spans overlap or omit positions")
        cursor += p.population
    if cursor != start + length:
        raise ValueError("split rank span has incorrect coverage")


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def code_sha256(relative_paths: tuple[str, ...], extra: tuple[Path, ...] = ()) -> str:
    """One hex SHA-256 over the names and contents of package files (installed or a
    checkout, edits included) and ``extra`` files."""
    package = Path(__file__).resolve().parents[1]
    named = [(name, package / name) for name in relative_paths]
    named += [(path.name, path) for path in extra]
    digest = hashlib.sha256()
    for name, path in named:
        digest.update(name.encode())
        digest.update(file_sha256(path).encode())
    return digest.hexdigest()


def reader_sha256() -> str:
    """Identifies the reading code: the Python reader and loader and the native library."""
    library = Path(str(dataset_rt.native_info()["library"]))
    return code_sha256(READER_FILES, (library,))


def benchmark_sha256() -> str:
    """Identifies the benchmark's own code."""
    return code_sha256(BENCHMARK_FILES)


def agree_on_inputs(dataset: Any, config: BenchmarkConfig, topology: Topology) -> tuple[str, str]:
    """Fail unless every rank runs the same code and workload on the same active table
    (before any training collective); returns (reader, benchmark) fingerprints."""
    signature = (
        reader_sha256(),
        benchmark_sha256(),
        dataset.table_digest(),
        config.model_dump_json(exclude={"ranks", "output", "cache_paths", "quiet"}),
    )
    gathered: list[Any] = [None] * topology.world_size
    dist.all_gather_object(gathered, signature)
    if any(tuple(other) != signature for other in gathered):
        raise ValueError("rank code, workloads, or active metadata differ")
    return signature[0], signature[1]


def hash_identities(batch: Batch, digest: Any) -> None:
    """Feed the (cache_id, sample_id) of each sample of ``batch`` to ``digest``."""
    for identity in batch.identities:
        digest.update(identity.cache_id.to_bytes(8, "little"))
        digest.update(identity.sample_id.to_bytes(8, "little"))


def check_sequential_order(
    batch: Batch, plans: tuple[ConsumerPlan, ...], counters: list[int], population: int
) -> None:
    """Sequential synthetic reading: the n-th sample consumer w reads is row
    ``offset + n mod population_w`` of its plan (rows wrap around the dataset)."""
    for identity in batch.identities:
        plan = plans[identity.worker]
        read = counters[identity.worker]
        if identity.position != (plan.offset + read % plan.population) % population:
            raise ValueError("sequential fixture position differs from worker plan")
        counters[identity.worker] = read + 1


# ------------------------------------------------------------------ measurement


def synchronize(device: torch.device) -> None:
    """Wait for queued accelerator work, so wall-clock times include it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Run:
    """What the passes of one rank share."""

    config: BenchmarkConfig
    topology: Topology
    device: torch.device
    loader: DataLoader[Any]
    plans: tuple[ConsumerPlan, ...]
    model: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    population: int
    synthetic: bool


def measure_pass(run: Run, counters: list[int]) -> PassResult:
    """One full pass of ``run.loader`` with a training step per batch, timed from a
    barrier of all ranks, with the rank's process tree sampled meanwhile; then the
    counts are checked against the budget and against the other ranks."""
    config, device = run.config, run.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    check_order = run.synthetic and not config.shuffle
    observer = ResourceObserver()
    thread = threading.Thread(target=observer.run, name="resource-observer", daemon=True)
    digest = hashlib.sha256()
    batches = samples = 0
    waiting_s = training_s = first_s = 0.0
    synchronize(device)
    dist.barrier()
    started = time.perf_counter()
    thread.start()
    iterator: Iterator[Any] | None = None
    try:
        iterator = iter(run.loader)
        while True:
            asked = time.perf_counter()
            batch = next(iterator, None)
            if batch is None:
                break
            got = time.perf_counter()
            waiting_s += got - asked
            if not isinstance(batch, Batch):
                raise TypeError("expected benchmark batch")
            if batches == 0:
                first_s = got - started
            if batches < PREFIX_BATCHES:
                hash_identities(batch, digest)
            if check_order:
                check_sequential_order(batch, run.plans, counters, run.population)
            run.optimizer.zero_grad(set_to_none=True)
            inputs = batch.inputs.to(device, non_blocking=config.pin_memory)
            run.model(inputs).square().mean().backward()
            run.optimizer.step()
            synchronize(device)
            training_s += time.perf_counter() - got
            batches += 1
            samples += len(batch.identities)
            if run.topology.rank == 0 and not config.quiet and batches % PROGRESS_BATCHES == 0:
                print(f"{batches}/{len(run.loader)} batches", file=sys.stderr)
    finally:
        del iterator
        observer.stop.set()
        thread.join(JOIN_TIMEOUT_S)
        if thread.is_alive():
            raise RuntimeError("resource observer did not stop")
    elapsed_s = time.perf_counter() - started
    if observer.failures:
        raise RuntimeError("resource observation failed") from observer.failures[0]
    resources = combine_resources(observer.peak, resource_snapshot(psutil.Process()))
    expected = local_samples(
        requested_samples(config, run.population),
        run.topology.world_size,
        config.batch_size,
        config.drop_last,
    )
    if samples != expected or batches != len(run.loader):
        raise ValueError("observed batches or sample count differ from reported loader length")
    counts = torch.tensor([batches, samples], dtype=torch.int64, device=device)
    lowest, highest = counts.clone(), counts.clone()
    dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    dist.all_reduce(highest, op=dist.ReduceOp.MAX)
    if not torch.equal(lowest, highest):
        raise ValueError("rank sample or batch counts differ")
    cuda = device.type == "cuda"
    return PassResult(
        batches=batches,
        samples=samples,
        elapsed_seconds=elapsed_s,
        first_batch_seconds=first_s,
        batch_wait_seconds=waiting_s,
        training_seconds=training_s,
        prefix_digest=digest.hexdigest(),
        gpu_peak_allocated_bytes=torch.cuda.max_memory_allocated(device) if cuda else 0,
        gpu_peak_reserved_bytes=torch.cuda.max_memory_reserved(device) if cuda else 0,
        resources=resources,
    )


def verify_replay(dataset: Any, config: BenchmarkConfig, synthetic: bool, expected: str) -> None:
    """A fresh loader with the same options yields the same first batches as the first
    pass did (only those batches are read; the loader is released before returning)."""
    loader = make_loader(dataset, config, synthetic)
    digest = hashlib.sha256()
    iterator = iter(loader)
    try:
        for batch in islice(iterator, PREFIX_BATCHES):
            if not isinstance(batch, Batch):
                raise TypeError("expected benchmark batch")
            hash_identities(batch, digest)
    finally:
        del iterator, loader
        gc.collect()
    if digest.hexdigest() != expected:
        raise ValueError("fresh seeded loader did not reproduce its initial prefix")


def parameter_difference(model: DistributedDataParallel, device: torch.device) -> float:
    """The largest difference of any parameter from rank 0's (DDP keeps them equal),
    holding one parameter-sized copy at a time."""
    largest = torch.zeros((), device=device)
    for parameter in model.parameters():
        reference = parameter.detach().clone()
        dist.broadcast(reference, src=0)
        largest = torch.maximum(largest, (parameter.detach() - reference).abs().max())
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    difference = float(largest.item())
    if difference > PARAMETER_TOLERANCE:
        raise ValueError("model parameters differ across ranks")
    return difference


def device_for(topology: Topology, config: BenchmarkConfig) -> torch.device:
    """CPU, or the CUDA device of this local rank (set as current before NCCL starts);
    never falls back from CUDA to CPU."""
    if config.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available() or topology.local_rank >= torch.cuda.device_count():
        raise ValueError("requested CUDA topology exceeds available CUDA devices")
    if not dist.is_nccl_available():
        raise ValueError("CUDA benchmark requires a PyTorch build with NCCL")
    torch.cuda.set_device(topology.local_rank)
    return torch.device("cuda", topology.local_rank)


def backend_for(device: torch.device) -> str:
    """The process-group backend: NCCL for CUDA, gloo for CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def package_version(name: str) -> str:
    """The installed version of distribution ``name`` ("unknown" when it has no
    metadata, e.g. a checkout on ``PYTHONPATH`` without an install)."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def stop_loader_workers() -> None:
    """Wait for loader worker processes to exit; fail if one does not."""
    for child in multiprocessing.active_children():
        child.join(JOIN_TIMEOUT_S)
        if child.is_alive():
            raise RuntimeError("loading worker survived benchmark cleanup")


def execute(config: BenchmarkConfig, topology: Topology, device: torch.device) -> RankResult:
    """The whole benchmark on this rank (inside an initialized process group)."""
    synthetic = not config.cache_paths
    with open_dataset(config) as dataset:
        population = len(dataset)
        requested = requested_samples(config, population)
        started = time.perf_counter()
        loader = make_loader(dataset, config, synthetic)
        construction_s = time.perf_counter() - started
        plans = consumer_plans(loader)
        validate_plans(plans, population, requested, config, topology)
        fingerprints = agree_on_inputs(dataset, config, topology)
        torch.manual_seed(config.seed)
        network = torch.nn.Sequential(
            torch.nn.Linear(config.input_features, config.model_width),
            torch.nn.ReLU(),
            torch.nn.Linear(config.model_width, 1),
        ).to(device)
        model = DistributedDataParallel(
            network, device_ids=[topology.local_rank] if device.type == "cuda" else None
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        run = Run(config, topology, device, loader, plans, model, optimizer, population, synthetic)
        consumers = max(1, config.num_workers)
        counters = [0] * consumers
        passes: list[PassResult] = []
        for repeat in range(config.repeats):
            if repeat and config.num_workers and not config.persistent_workers:
                # Restarted workers read their shares from the start again.
                counters = [0] * consumers
            if topology.rank == 0 and not config.quiet:
                print(
                    f"pass {repeat + 1}/{config.repeats}; {len(loader)} batches per rank",
                    file=sys.stderr,
                )
            passes.append(measure_pass(run, counters))
        difference = parameter_difference(model, device)
        verify_replay(dataset, config, synthetic, passes[0].prefix_digest)
        loader_batches = len(loader)
        started = time.perf_counter()
        del run, loader, model, optimizer, network
        gc.collect()
        stop_loader_workers()
        cleanup_s = time.perf_counter() - started
        if fingerprints != (reader_sha256(), benchmark_sha256()):
            raise RuntimeError("reader or benchmark code changed during measurement")
        effective = topology.world_size * local_samples(
            requested, topology.world_size, config.batch_size, config.drop_last
        )
        return RankResult(
            rank=topology.rank,
            local_rank=topology.local_rank,
            hostname=socket.gethostname(),
            device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            dataset_rt_version=package_version("dataset-rt"),
            torch_version=package_version("torch"),
            python_version=platform.python_version(),
            platform=platform.platform(),
            reader_sha256=fingerprints[0],
            benchmark_sha256=fingerprints[1],
            accelerator_build=torch.version.cuda
            or getattr(torch.version, "hip", None)
            or "not reported by this PyTorch build",
            population=population,
            global_requested_samples=requested,
            global_effective_samples=effective,
            loader_batches=loader_batches,
            construction_seconds=construction_s,
            replay_verified=True,
            sequential_fixture_order_verified=synthetic and not config.shuffle,
            parameter_max_difference=difference,
            cleanup_seconds=cleanup_s,
            passes=tuple(passes),
        )


def global_rates(results: tuple[RankResult, ...], repeats: int) -> tuple[float, ...]:
    """Per pass: all ranks' samples over the slowest rank's elapsed time."""
    return tuple(
        sum(r.passes[k].samples for r in results)
        / max(r.passes[k].elapsed_seconds for r in results)
        for k in range(repeats)
    )


def run_rank(config: BenchmarkConfig) -> None:
    """Run this process as one rank of a torchrun job (``RANK``, ``WORLD_SIZE``, ...
    set): join the process group (gloo on CPU, NCCL on CUDA), benchmark, and on global
    rank 0 write the report to ``config.output`` and print it as one JSON line."""
    # A native abort in a rank (torchrun reports only its signal) prints every thread's
    # Python stack to the rank's stderr.
    faulthandler.enable()
    topology = Topology()  # type: ignore[call-arg]  # fields come from the environment
    if config.ranks not in (1, topology.world_size):
        raise ValueError(
            "--ranks disagrees with torchrun WORLD_SIZE; omit it under external torchrun"
        )
    # Ranks and loader workers share the machine's cores; keep torch's own pool small.
    torch.set_num_threads(1)
    device = device_for(topology, config)
    dist.init_process_group(
        backend_for(device),
        init_method="env://",
        timeout=timedelta(seconds=config.timeout_seconds),
    )
    try:
        result = execute(config, topology, device)
        gathered: list[Any] = [None] * topology.world_size
        dist.all_gather_object(gathered, result)
        if topology.rank == 0:
            results = tuple(gathered)
            report = Report(
                recorded_at=datetime.now(timezone.utc),
                settings=config,
                world_size=topology.world_size,
                backend=str(dist.get_backend()),
                synthetic=not config.cache_paths,
                ranks=results,
                global_samples_per_second=global_rates(results, config.repeats),
            )
            config.output.parent.mkdir(parents=True, exist_ok=True)
            config.output.write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
            print(report.model_dump_json(), flush=True)
        # No rank tears the group down while another still uses it.
        dist.barrier()
    finally:
        dist.destroy_process_group()
