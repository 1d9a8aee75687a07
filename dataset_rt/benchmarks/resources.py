"""Peak resources of a rank's process tree (the training process, its DataLoader workers
and their helpers), sampled by a thread that only reads ``/proc`` through psutil and never
touches samples. Needs psutil (the ``benchmark`` extra)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import psutil
from pydantic import BaseModel, ConfigDict

__all__ = ["ResourceObserver", "Resources", "combine_resources", "resource_snapshot"]

# How often the observer samples: often enough to see short-lived workers, cheap enough
# (one /proc walk of a handful of processes) not to disturb the measurement.
SAMPLE_INTERVAL_S = 0.05


class Resources(BaseModel):
    """Totals over a process tree. RSS is summed per process, so pages shared between a
    rank and its workers count once per process."""

    model_config = ConfigDict(extra="forbid", strict=True)

    rss_bytes: int = 0
    threads: int = 0
    file_descriptors: int = 0
    processes: int = 0


def resource_snapshot(process: psutil.Process) -> Resources:
    """``process`` and all its descendants now; a process that exits while being
    measured is left out."""
    rss = threads = descriptors = count = 0
    for member in (process, *process.children(recursive=True)):
        try:
            with member.oneshot():
                member_rss = member.memory_info().rss
                member_threads = member.num_threads()
                member_descriptors = member.num_fds()
        except psutil.NoSuchProcess:
            continue
        rss += member_rss
        threads += member_threads
        descriptors += member_descriptors
        count += 1
    return Resources(rss_bytes=rss, threads=threads, file_descriptors=descriptors, processes=count)


def combine_resources(left: Resources, right: Resources) -> Resources:
    """The field-wise maximum (peaks of each quantity, possibly at different times)."""
    return Resources(
        **{name: max(getattr(left, name), getattr(right, name)) for name in Resources.model_fields}
    )


@dataclass
class ResourceObserver:
    """Run ``run`` in a thread; set ``stop`` to end it. Keeps only the running peak and
    the first error (O(processes) work per sample, no time series)."""

    stop: threading.Event = field(default_factory=threading.Event)
    peak: Resources = field(default_factory=Resources)
    failures: list[Exception] = field(default_factory=list)

    def run(self) -> None:
        """Sample this process's tree every ``SAMPLE_INTERVAL_S`` until ``stop`` is set."""
        process = psutil.Process()
        try:
            while not self.stop.is_set():
                self.peak = combine_resources(self.peak, resource_snapshot(process))
                self.stop.wait(SAMPLE_INTERVAL_S)
        except Exception as error:
            self.failures.append(error)
