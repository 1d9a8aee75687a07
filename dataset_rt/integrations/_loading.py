"""Loader planning without PyTorch: option validation, CPU budgets, seeds and the
arithmetic that decides which stream positions each consumer reads.

A *consumer* is one process reading samples for a DataLoader: the training process
itself (``num_workers=0``) or one of its DataLoader workers, on one rank. Everything
here is O(workers) integer arithmetic on counts (no metadata rows); the native reader
turns the resulting positions into samples (``drt_iter_open_range``).

Modes (``worker_partition``):

- ``"replicate"`` / ``"split"`` (dataset-rt 0.4.8): each consumer reads its own stream
  from a private reader (its derived seed; in "split" its own slice of the rows), with a
  fixed per-pass budget. Reproduced exactly, including budgets and seeds.
- ``"global"`` (this project): one stream for the whole job, cut into batches of
  ``batch_size`` positions; on each rank, local batch ``s`` of a pass is global batch
  ``first + s * world_size + rank`` and goes to worker ``s % num_workers``, so the
  DataLoaders of all ranks together read every batch of the pass exactly once, in order.
"""

from __future__ import annotations

import math
import os
import secrets
import sys
import warnings
from dataclasses import dataclass
from multiprocessing import get_all_start_methods, get_context
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any, Literal

U64_MAX = (1 << 64) - 1
# Torch computes ceil(sample_count / batch_size) through floating-point division.
MAX_SAMPLE_BUDGET = min(sys.maxsize, 1 << 53)
SEED_DOMAIN = 0x4453545253454544  # "DSTRSEED": part of the reference's seed derivation

Partition = Literal["split", "replicate", "global"]

RESERVED_KWARGS = frozenset(
    {
        "dataset",
        "sampler",
        "batch_sampler",
        "shuffle",
        "seed",
        "samples_per_epoch",
        "worker_partition",
        "work_dir",
        "batch_size",
        "num_workers",
        "sample_transform_fn",
        "collate_fn",
        "drop_last",
        "pin_memory",
        "timeout",
        "native_num_workers",
        "multiprocessing_context",
        "worker_init_fn",
        "prefetch_factor",
        "persistent_workers",
        "verbose",
        "dataloader_kwargs",
        # This project's tensor path.
        "batch_format",
        "batch_transform_fn",
    }
)


def _check_count(value: object, *, name: str, minimum: int, maximum: int) -> None:
    if value == "auto" and isinstance(value, str):
        return
    if type(value) is int and minimum <= value <= maximum:
        return
    raise ValueError(f"{name} must be 'auto' or an integer between {minimum} and {maximum}")


@dataclass(frozen=True)
class LoaderOptions:
    """The scalar settings of ``to_torch_dataloader``, validated in the reference's order
    with its messages (``__post_init__`` raises ``ValueError``)."""

    shuffle: bool
    seed: int | Literal["random"]
    samples_per_epoch: int | None
    partition: Partition | None
    batch_size: int
    num_workers: int | Literal["auto"]
    native_num_workers: int | Literal["auto"]
    drop_last: bool
    pin_memory: bool
    persistent_workers: bool | Literal["auto"]
    timeout: float
    context: str | BaseContext
    prefetch: int | Literal["auto"]
    verbose: bool

    def __post_init__(self) -> None:
        _check_count(self.num_workers, name="num_workers", minimum=0, maximum=(1 << 32) - 1)
        _check_count(
            self.native_num_workers, name="native_num_workers", minimum=1, maximum=sys.maxsize
        )
        for name in ("shuffle", "drop_last", "pin_memory", "verbose"):
            if type(getattr(self, name)) is not bool:
                raise ValueError(f"{name} must be a boolean")
        if type(self.batch_size) is not int or not 1 <= self.batch_size <= sys.maxsize:
            raise ValueError("batch_size must be a positive integer fitting sys.maxsize")
        if self.samples_per_epoch is not None and (
            type(self.samples_per_epoch) is not int
            or not 1 <= self.samples_per_epoch <= MAX_SAMPLE_BUDGET
        ):
            raise ValueError(
                f"samples_per_epoch must be a positive integer <= {MAX_SAMPLE_BUDGET} or None"
            )
        if (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, (int, float))
            or not math.isfinite(self.timeout)
            or self.timeout < 0
        ):
            raise ValueError("timeout must be finite and nonnegative")
        _check_count(self.prefetch, name="prefetch_factor", minimum=1, maximum=sys.maxsize)
        if self.persistent_workers not in ("auto", True, False) or (
            type(self.persistent_workers) not in (bool, str)
        ):
            raise ValueError("persistent_workers must be a boolean or 'auto'")
        self._check_seed()
        if not (
            isinstance(self.context, BaseContext)
            or self.context == "inherit"
            or (isinstance(self.context, str) and self.context in get_all_start_methods())
        ):
            raise ValueError(
                "multiprocessing_context must be 'inherit', an available start method, "
                "or BaseContext"
            )
        if self.partition not in (None, "split", "replicate", "global"):
            raise ValueError("worker_partition must be 'split', 'replicate', 'global', or None")

    def _check_seed(self) -> None:
        if self.seed == "random" and isinstance(self.seed, str):
            return
        if type(self.seed) is int:
            if not self.shuffle:
                raise ValueError("seed requires shuffle=True; use 'random' for sequential reading")
            if 0 <= self.seed <= U64_MAX:
                return
        raise ValueError("seed must be 'random' or an unsigned 64-bit integer")

    @property
    def resolved_partition(self) -> Partition:
        """``None`` means "replicate" for shuffled and "split" for ordered reading."""
        if self.partition is None:
            return "replicate" if self.shuffle else "split"
        return self.partition


@dataclass(frozen=True)
class Workers:
    """Concrete worker settings after "auto" selection."""

    processes: int
    native_threads: int
    persistent: bool
    prefetch: int | None
    context: BaseContext | None


def resolve_workers(options: LoaderOptions, world_size: int) -> Workers:
    """Resolve "auto" counts from one CPU-budget observation; check zero-worker rules."""
    processes, threads = options.num_workers, options.native_num_workers
    if processes == "auto" or threads == "auto":
        cpus = available_cpu_count()
        ranks = local_rank_count(world_size)
        if processes == "auto":
            processes = min(4, max(0, cpus // ranks - 1))
        if threads == "auto":
            threads = max(1, min(4, cpus // (max(1, int(processes)) * ranks)))
    processes, threads = int(processes), int(threads)
    if processes == 0 and options.timeout != 0:
        raise ValueError("timeout must be zero with num_workers=0")
    if options.persistent_workers == "auto":
        persistent = processes > 0
    elif options.persistent_workers is True and processes == 0:
        raise ValueError("persistent_workers=True requires num_workers > 0")
    else:
        persistent = bool(options.persistent_workers)
    if options.prefetch == "auto":
        prefetch = 2 if processes > 0 else None
    elif processes == 0:
        raise ValueError("prefetch_factor requires num_workers > 0")
    else:
        prefetch = int(options.prefetch)
    context: BaseContext | None = None
    if processes > 0:
        if isinstance(options.context, BaseContext):
            context = options.context
        elif options.context == "inherit":
            context = get_context()
        else:
            context = get_context(options.context)
    return Workers(processes, threads, persistent, prefetch, context)


def local_rank_count(world_size: int) -> int:
    """Ranks sharing this machine: ``LOCAL_WORLD_SIZE`` when set (torchrun), else all."""
    if world_size <= 1:
        return world_size
    configured = os.environ.get("LOCAL_WORLD_SIZE")
    if configured is None:
        return world_size
    local = int(configured)
    if not 1 <= local <= world_size:
        raise ValueError("LOCAL_WORLD_SIZE must be between one and the distributed world size")
    return local


def available_cpu_count() -> int:
    """Whole CPUs this process may use: affinity, bounded by cgroup v2 ``cpu.max`` quotas
    of its cgroup and ancestors and by a cgroup v1 CFS quota, rounded down, at least 1.
    Unreadable limits are ignored (the affinity stands)."""
    try:
        limit = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        limit = float(os.cpu_count() or 1)
    for quota in _cgroup_quotas():
        limit = min(limit, quota)
    return max(1, int(limit))


def _cgroup_quotas() -> list[float]:
    quotas: list[float] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return quotas
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            base = Path("/sys/fs/cgroup")
            current = base / path.lstrip("/")
            while True:
                quotas.extend(_read_quota_v2(current / "cpu.max"))
                if current == base or base not in current.parents:
                    break
                current = current.parent
        elif "cpu" in controllers.split(","):
            for root in (Path("/sys/fs/cgroup/cpu,cpuacct"), Path("/sys/fs/cgroup/cpu")):
                quotas.extend(_read_quota_v1(root / path.lstrip("/")))
                quotas.extend(_read_quota_v1(root))
    return quotas


def _read_quota_v2(file: Path) -> list[float]:
    try:
        fields = file.read_text().split()
        if len(fields) == 2 and fields[0] != "max" and int(fields[1]) > 0:
            return [int(fields[0]) / int(fields[1])]
    except (OSError, ValueError):
        pass
    return []


def _read_quota_v1(directory: Path) -> list[float]:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        if quota > 0 and period > 0:
            return [quota / period]
    except (OSError, ValueError):
        pass
    return []


def _mix(value: int) -> int:
    """The SplitMix64 finalizer (an invertible permutation of u64)."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & U64_MAX
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & U64_MAX
    return value ^ (value >> 31)


def derive_seed(base_seed: int, rank: int, worker: int) -> int:
    """The reader seed of consumer (rank, worker) for a base seed, as dataset-rt 0.4.8
    derives it: distinct (rank, worker) pairs never collide for one base seed."""
    for name, value in (("base_seed", base_seed), ("rank_id", rank), ("worker_id", worker)):
        if type(value) is not int or not 0 <= value <= U64_MAX:
            raise ValueError(f"{name} must be a u64 integer")
    if rank >= 1 << 32 or worker >= 1 << 32:
        raise ValueError("rank_id and worker_id must fit u32")
    return _mix(((rank << 32) | worker) ^ _mix(base_seed ^ SEED_DOMAIN))


def random_seed() -> int:
    return secrets.randbits(64)


def span(count: int, parts: int, part: int) -> tuple[int, int]:
    """``(offset, length)`` of part ``part`` of ``count`` items cut into ``parts``
    contiguous spans; the first ``count % parts`` spans hold one more."""
    size, extra = divmod(count, parts)
    return part * size + min(part, extra), size + int(part < extra)


@dataclass(frozen=True)
class ConsumerPlan:
    """One consumer's fixed share in the reference modes: it reads ``sample_count``
    samples per pass from its own reader over rows ``[offset, offset + population)``
    (cyclic; in the shared shuffled row order when ``partition_seed`` is set) with
    reader seed ``seed``."""

    rank: int
    worker: int
    offset: int
    population: int
    sample_count: int
    seed: int
    partition_seed: int | None


def rank_budget(samples: int, rank: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """The reference's per-rank budget (equal on every rank); warns on rank 0 when the
    global budget had to change."""
    if drop_last:
        local = samples // (world_size * batch_size) * batch_size
    else:
        local = (samples + world_size - 1) // world_size
    effective = local * world_size
    if effective != samples and rank == 0:
        _warn_adjusted(samples, effective)
    return local


def _warn_adjusted(samples: int, effective: int) -> None:
    action = "padded" if effective > samples else "discarded"
    warnings.warn(
        f"samples_per_epoch adjusted: requested {samples} global samples, effective "
        f"{effective}; {action} {abs(effective - samples)} for equal rank batch counts",
        UserWarning,
        stacklevel=4,
    )


def worker_budgets(samples: int, workers: int, populations: int, batch_size: int) -> list[int]:
    """Whole batches per worker (first workers one more), the tail to the last active."""
    if samples == 0:
        return [0] * workers
    if populations == 0:
        raise ValueError("samples_per_epoch requires a nonempty population")
    batches, tail = divmod(samples, batch_size)
    active = min(workers, populations, max(1, batches))
    budgets = [span(batches, active, i)[1] * batch_size for i in range(active)]
    budgets[-1] += tail
    return budgets + [0] * (workers - active)


def reference_plans(
    *,
    row_count: int,
    rank: int,
    world_size: int,
    workers: int,
    batch_size: int,
    samples: int,
    partition: Literal["split", "replicate"],
    shuffle: bool,
    seed: int | None,
    drop_last: bool,
) -> list[ConsumerPlan]:
    """The consumers of one rank in the reference modes, exactly as dataset-rt 0.4.8
    plans them (O(workers))."""
    count = rank_budget(samples, rank, world_size, batch_size, drop_last)
    consumers = max(1, workers)
    population = row_count
    if partition == "replicate":
        rank_offset, rank_length = 0, population
        populations = consumers
    else:
        if samples == population:
            population = count * world_size
        elif population < world_size:
            population = (population + world_size - 1) // world_size * world_size
        rank_offset, rank_length = span(population, world_size, rank)
        populations = rank_length
    budgets = worker_budgets(count, consumers, populations, batch_size)
    active = sum(budget > 0 for budget in budgets)
    full_pass = sum(budgets) == rank_length
    plans = []
    offset = rank_offset
    for worker, budget in enumerate(budgets):
        if budget == 0:
            size = 0
        elif partition == "replicate":
            size = row_count
        elif full_pass:
            size = budget
        else:
            size = span(rank_length, active, worker)[1]
        reader_seed = 0 if not shuffle else derive_seed(_require(seed), rank, worker)
        plans.append(
            ConsumerPlan(
                rank=rank,
                worker=worker,
                offset=0 if partition == "replicate" else offset,
                population=size,
                sample_count=budget,
                seed=reader_seed,
                partition_seed=seed if shuffle and partition == "split" else None,
            )
        )
        offset += size
    return plans


def _require(seed: int | None) -> int:
    if seed is None:
        raise RuntimeError("shuffled reading requires a resolved seed")
    return seed


def round_robin(batch_counts: list[int], yielded: int) -> tuple[list[int], int]:
    """After a DataLoader yielded ``yielded`` batches from workers holding
    ``batch_counts`` batches: the batches each worker had delivered, and the worker that
    delivers the next one (0 when none is left).

    A DataLoader over an iterable dataset takes batches from its workers in a fixed
    cycle (worker 0, 1, ...), skipping workers that have run out. O(workers log workers).
    """
    taken = [0] * len(batch_counts)
    remaining = yielded
    done_rounds = 0
    for level in sorted(set(batch_counts)):
        if level <= done_rounds:
            continue
        active = [w for w, n in enumerate(batch_counts) if n > done_rounds]
        rounds = level - done_rounds
        full = min(rounds, remaining // len(active))
        for w in active:
            taken[w] += full
        remaining -= full * len(active)
        done_rounds += full
        if full < rounds:
            for w in active[:remaining]:
                taken[w] += 1
            return taken, active[remaining]
    return taken, 0


@dataclass(frozen=True)
class GlobalPass:
    """One pass of the global stream on one rank: ``batches`` local batches of
    ``batch_size`` positions each, the first global batch of the pass starting at stream
    position ``start``; local batch ``s`` is at ``start + (s * world_size + rank) * B``."""

    start: int
    batches: int
    batch_size: int
    world_size: int
    rank: int

    @property
    def end(self) -> int:
        """Stream position after the pass (over all ranks)."""
        return self.start + self.batches * self.world_size * self.batch_size

    def worker_range(self, worker: int, workers: int, skip: int = 0) -> tuple[int, int, int, int]:
        """``(start, count, block_len, block_stride)`` of the positions worker ``worker``
        of ``workers`` reads: local batches ``skip + worker``, ``skip + worker + workers``,
        ..., i.e. every ``workers``-th batch of this rank after the first ``skip``."""
        workers = max(1, workers)
        remaining = self.batches - skip
        mine = max(0, (remaining - worker + workers - 1) // workers)
        step = self.world_size * self.batch_size
        first = self.start + ((skip + worker) * self.world_size + self.rank) * self.batch_size
        return first, mine * self.batch_size, self.batch_size, step * workers


def global_batches_per_rank(
    samples: int, world_size: int, batch_size: int, drop_last: bool, *, rank: int
) -> int:
    """Local batches per pass in "global" mode: every rank reads the same number of full
    batches; the pass covers ``samples`` rounded up (or down with ``drop_last``) to whole
    rounds of ``world_size`` batches (rank 0 warns when that changes the count)."""
    per_round = world_size * batch_size
    batches = samples // per_round if drop_last else -(-samples // per_round)
    if batches == 0:
        raise ValueError(
            f"samples_per_epoch={samples} is less than one batch per rank "
            f"({world_size} ranks x batch_size {batch_size}) with drop_last=True"
        )
    if batches * per_round != samples and rank == 0:
        _warn_adjusted(samples, batches * per_round)
    return batches


def as_plain(value: Any) -> Any:
    """``value`` with tuples turned into lists (a state dict compares equal after JSON)."""
    if isinstance(value, dict):
        return {k: as_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_plain(v) for v in value]
    return value
