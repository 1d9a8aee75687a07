"""The loader's planning arithmetic (dataset_rt.integrations._loading), without PyTorch."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataset_rt.integrations import _loading as plan


def test_derive_seed_matches_the_reference() -> None:
    # Reference section 2.9: base 42, rank 0, worker 0.
    assert plan.derive_seed(42, 0, 0) == 1239376960125403275
    seeds = {plan.derive_seed(7, rank, worker) for rank in range(4) for worker in range(4)}
    assert len(seeds) == 16
    with pytest.raises(ValueError, match="rank_id and worker_id must fit u32"):
        plan.derive_seed(1, 1 << 32, 0)


def simulate_round_robin(counts: list[int], yielded: int) -> tuple[list[int], int]:
    """A DataLoader's cycle over workers, skipping those that ran out, one batch at a time."""
    taken = [0] * len(counts)
    worker = 0
    for _ in range(yielded):
        while taken[worker] >= counts[worker]:
            worker = (worker + 1) % len(counts)
        taken[worker] += 1
        worker = (worker + 1) % len(counts)
    if any(t < c for t, c in zip(taken, counts)):
        while taken[worker] >= counts[worker]:
            worker = (worker + 1) % len(counts)
    else:
        worker = 0
    return taken, worker


@given(st.lists(st.integers(0, 7), min_size=1, max_size=6), st.data())
def test_round_robin_matches_a_step_by_step_simulation(counts: list[int], data) -> None:
    yielded = data.draw(st.integers(0, sum(counts)))
    assert plan.round_robin(counts, yielded) == simulate_round_robin(counts, yielded)


@given(
    batches=st.integers(1, 12),
    world=st.integers(1, 4),
    workers=st.integers(0, 4),
    batch_size=st.integers(1, 5),
    start=st.integers(0, 100),
)
def test_global_pass_gives_every_position_to_exactly_one_consumer(
    batches: int, world: int, workers: int, batch_size: int, start: int
) -> None:
    positions: list[int] = []
    for rank in range(world):
        one_pass = plan.GlobalPass(start, batches, batch_size, world, rank)
        for worker in range(max(1, workers)):
            first, count, block_len, stride = one_pass.worker_range(worker, workers)
            positions += [first + k // block_len * stride + k % block_len for k in range(count)]
    assert sorted(positions) == list(range(start, one_pass.end))


def test_global_budget_rounds_to_whole_rounds() -> None:
    with pytest.warns(UserWarning, match="requested 10 global samples, effective 12; padded 2"):
        assert plan.global_batches_per_rank(10, 2, 3, False, rank=0) == 2
    with pytest.warns(UserWarning, match="effective 6; discarded 4"):
        assert plan.global_batches_per_rank(10, 2, 3, True, rank=0) == 1
    assert plan.global_batches_per_rank(12, 2, 3, False, rank=1) == 2
    with pytest.raises(ValueError, match="less than one batch per rank"):
        plan.global_batches_per_rank(5, 2, 3, True, rank=0)


def options(**overrides: object) -> plan.LoaderOptions:
    settings: dict[str, object] = {
        "shuffle": True,
        "seed": "random",
        "samples_per_epoch": None,
        "partition": None,
        "batch_size": 1,
        "num_workers": "auto",
        "native_num_workers": "auto",
        "drop_last": False,
        "pin_memory": False,
        "persistent_workers": "auto",
        "timeout": 0,
        "context": "spawn",
        "prefetch": "auto",
        "verbose": True,
    }
    settings.update(overrides)
    return plan.LoaderOptions(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_size": 0}, "batch_size must be a positive integer fitting sys.maxsize"),
        (
            {"samples_per_epoch": 0},
            "samples_per_epoch must be a positive integer <= 9007199254740992 or None",
        ),
        (
            {"num_workers": -1},
            "num_workers must be 'auto' or an integer between 0 and 4294967295",
        ),
        (
            {"native_num_workers": 0},
            "native_num_workers must be 'auto' or an integer between 1 and 9223372036854775807",
        ),
        ({"seed": None}, "seed must be 'random' or an unsigned 64-bit integer"),
        ({"seed": -1}, "seed must be 'random' or an unsigned 64-bit integer"),
        (
            {"seed": 1, "shuffle": False},
            "seed requires shuffle=True; use 'random' for sequential reading",
        ),
        (
            {"partition": "rows"},
            "worker_partition must be 'split', 'replicate', 'global', or None",
        ),
        (
            {"context": "nope"},
            "multiprocessing_context must be 'inherit', an available start method, or BaseContext",
        ),
    ],
)
def test_option_messages(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as info:
        options(**overrides)
    assert str(info.value) == message


def test_worker_resolution_rules() -> None:
    with pytest.raises(ValueError, match="timeout must be zero with num_workers=0"):
        plan.resolve_workers(options(num_workers=0, timeout=1), 1)
    with pytest.raises(ValueError, match="persistent_workers=True requires num_workers > 0"):
        plan.resolve_workers(options(num_workers=0, persistent_workers=True), 1)
    with pytest.raises(ValueError, match="prefetch_factor requires num_workers > 0"):
        plan.resolve_workers(options(num_workers=0, prefetch=2), 1)
    resolved = plan.resolve_workers(options(num_workers=2, native_num_workers=3), 1)
    assert (resolved.processes, resolved.native_threads, resolved.persistent) == (2, 3, True)
    assert resolved.prefetch == 2 and resolved.context is not None
    auto = plan.resolve_workers(options(), 1)
    cpus = plan.available_cpu_count()
    assert auto.processes == min(4, max(0, cpus - 1))
    assert auto.native_threads == max(1, min(4, cpus // max(1, auto.processes)))
