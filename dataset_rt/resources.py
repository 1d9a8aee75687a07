"""CPU budgets for a process, as dataset-rt 0.4.8's ``dataset_rt.resources`` computes them.

Public functions (the same names, arguments, results, warnings and messages as 0.4.8):

* :func:`available_cpu_count`: whole CPUs this process may use, from ``os.cpu_count()``,
  the CPU affinity mask and, on Linux, the cgroup (v1 and v2) CPU quotas and CPU sets
  visible from this process, up to the root of each visible cgroup mount;
* :func:`native_worker_count`: native threads per consumer for a CPU budget;
* :func:`loading_worker_count`: loading processes per rank for a CPU budget.

Plain Python; nothing here touches the native library.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path, PurePosixPath

__all__ = ["available_cpu_count", "loading_worker_count", "native_worker_count"]

# Native threads per consumer and loading processes per rank, at most.
NATIVE_WORKERS_MAX = 4
LOADING_WORKERS_MAX = 4

# The escapes /proc/<pid>/mountinfo uses in paths.
_MOUNT_ESCAPES = (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\"))


@dataclass(frozen=True)
class _Membership:
    """One line of /proc/<pid>/cgroup: the controllers (empty for v2) and the path."""

    controllers: frozenset[str]
    path: PurePosixPath


@dataclass(frozen=True)
class _Mount:
    """A visible cgroup mount that can limit CPUs: which part of the hierarchy it shows
    (``root``), where (``path``), its version and its controllers (v1 mount options)."""

    root: PurePosixPath
    path: Path
    version: int
    controllers: frozenset[str]


def _kernel_path(text: str) -> PurePosixPath:
    """An absolute path from a kernel file; ValueError for anything that could escape."""
    path = PurePosixPath(text)
    if not path.is_absolute() or ".." in path.parts:
        raise ValueError("invalid cgroup path")
    return path


def _parse_memberships(text: str) -> list[_Membership]:
    memberships = []
    for line in text.splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        int(hierarchy)  # a malformed line is a ValueError
        names = frozenset(name for name in controllers.split(",") if name)
        memberships.append(_Membership(names, _kernel_path(path)))
    return memberships


def _unescape(text: str) -> str:
    for escaped, character in _MOUNT_ESCAPES:
        text = text.replace(escaped, character)
    return text


def _parse_mounts(text: str) -> Iterator[_Mount]:
    """cgroup2 mounts, and cgroup (v1) mounts of the ``cpu`` or ``cpuset`` controller."""
    for line in text.splitlines():
        fields, tail = line.split(" - ", 1)
        fstype, _source, options = tail.split(maxsplit=2)
        if fstype not in ("cgroup", "cgroup2"):
            continue
        parts = fields.split()
        root = _kernel_path(_unescape(parts[3]))
        mount_point = Path(_kernel_path(_unescape(parts[4])))
        controllers = frozenset(options.split(","))
        if fstype == "cgroup2":
            yield _Mount(root, mount_point, 2, controllers)
        elif controllers & {"cpu", "cpuset"}:
            yield _Mount(root, mount_point, 1, controllers)


def _read_if_present(path: Path) -> str | None:
    """The stripped text of a controller file; None when there is no such file (other
    errors propagate)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _cpus_in_set(text: str) -> int | None:
    """CPUs in a CPU list such as ``0-3,6``: increasing, non-overlapping ranges (None for
    an empty list)."""
    if not text:
        return None
    total = 0
    last = -1
    for item in text.split(","):
        bounds = item.split("-")
        first = int(bounds[0])
        final = int(bounds[1]) if len(bounds) == 2 else first
        if len(bounds) > 2 or first <= last or final < first:
            raise ValueError("invalid cgroup CPU set")
        total += final - first + 1
        last = final
    return total


def _limits_in(directory: Path, mount: _Mount) -> Iterator[Fraction]:
    """The CPU limits one cgroup directory sets: a quota (fractional CPUs) and a CPU set."""
    if mount.version == 2:
        cpu_max = _read_if_present(directory / "cpu.max")
        if cpu_max is not None:
            quota, period = cpu_max.split()
            if int(period) <= 0:
                raise ValueError("invalid cgroup CPU period")
            if quota != "max":
                share = Fraction(int(quota), int(period))
                if share <= 0:
                    raise ValueError("invalid cgroup CPU quota")
                yield share
        cpus = _read_if_present(directory / "cpuset.cpus.effective")
    else:
        if "cpu" in mount.controllers:
            quota_text = _read_if_present(directory / "cpu.cfs_quota_us")
            period_text = _read_if_present(directory / "cpu.cfs_period_us")
            if (quota_text is None) != (period_text is None):
                raise ValueError("incomplete cgroup CPU quota")
            if quota_text is not None and period_text is not None:
                quota_us, period_us = int(quota_text), int(period_text)
                if period_us <= 0 or quota_us == 0 or quota_us < -1:
                    raise ValueError("invalid cgroup CPU quota")
                if quota_us > 0:
                    yield Fraction(quota_us, period_us)
        cpus = (
            _read_if_present(directory / "cpuset.cpus") if "cpuset" in mount.controllers else None
        )
    if cpus is not None:
        count = _cpus_in_set(cpus)
        if count is not None:
            yield Fraction(count)


def _cgroup_limits(proc: Path) -> Iterator[Fraction]:
    """Every CPU limit on this process's cgroups, from its own directory up to the top of
    each visible mount (ancestors above a mount's root are not visible)."""
    memberships = _parse_memberships((proc / "cgroup").read_text())
    for mount in _parse_mounts((proc / "mountinfo").read_text()):
        for membership in memberships:
            if mount.version == 2:
                if membership.controllers:
                    continue
            elif not membership.controllers & mount.controllers:
                continue
            # In a cgroup namespace the path may already be relative to the mount's root.
            if membership.path.is_relative_to(mount.root):
                relative = membership.path.relative_to(mount.root)
            else:
                relative = membership.path.relative_to(PurePosixPath("/"))
            directory = mount.path / relative
            while True:
                yield from _limits_in(directory, mount)
                if directory == mount.path:
                    break
                directory = directory.parent


def available_cpu_count() -> int:
    """Whole CPUs this process may use: the least of ``os.cpu_count()``, the affinity
    mask and (on Linux) every visible cgroup CPU quota and CPU set, rounded down, at
    least 1.

    When the affinity mask or the cgroup files cannot be read or parsed it warns
    (``RuntimeWarning``: "Cannot determine CPU affinity; using one CPU: ..." or "Cannot
    determine container CPU limits; using one CPU: ...") and returns 1. Limits set above
    the visible cgroup mounts, and other processes' demand, are not known.
    """
    limit = Fraction(os.cpu_count() or 1)
    getaffinity = getattr(os, "sched_getaffinity", None)
    try:
        affinity = 0 if getaffinity is None else len(getaffinity(0))
    except OSError as error:
        warnings.warn(
            f"Cannot determine CPU affinity; using one CPU: {error}", RuntimeWarning, stacklevel=2
        )
        return 1
    if affinity:
        limit = min(limit, Fraction(affinity))
    if sys.platform == "linux":
        try:
            for constraint in _cgroup_limits(Path("/proc/self")):
                limit = min(limit, constraint)
        except (OSError, ValueError, IndexError) as error:
            warnings.warn(
                f"Cannot determine container CPU limits; using one CPU: {error}",
                RuntimeWarning,
                stacklevel=2,
            )
            return 1
    return max(1, limit.numerator // limit.denominator)


def native_worker_count(cpu_count: int, *, num_workers: int, local_ranks: int) -> int:
    """Native threads for each of ``max(1, num_workers) * local_ranks`` consumers sharing
    ``cpu_count`` CPUs: between 1 and 4.

    Raises ValueError ("CPU and rank budgets must be positive; loading workers
    nonnegative") unless ``cpu_count >= 1``, ``num_workers >= 0`` and ``local_ranks >= 1``.
    """
    if cpu_count < 1 or num_workers < 0 or local_ranks < 1:
        raise ValueError("CPU and rank budgets must be positive; loading workers nonnegative")
    consumers = max(1, num_workers) * local_ranks
    return max(1, min(NATIVE_WORKERS_MAX, cpu_count // consumers))


def loading_worker_count(cpu_count: int, *, local_ranks: int) -> int:
    """Loading processes per rank when ``local_ranks`` ranks share ``cpu_count`` CPUs,
    leaving one CPU per rank for training: between 0 and 4.

    Raises ValueError ("CPU and rank budgets must be positive") unless both are >= 1.
    """
    if cpu_count < 1 or local_ranks < 1:
        raise ValueError("CPU and rank budgets must be positive")
    return min(LOADING_WORKERS_MAX, max(0, cpu_count // local_ranks - 1))
