"""`DatasetRuntime`: the native worker pool and the entry points that write and load caches.

The layer above the dataset and the writers: it decides where sources are written (this
process, or spawned writer processes with ``num_processes > 0``) and which existing caches
are reused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dataset_rt import _native, remote
from dataset_rt.config import DEFAULT_WRITER_CONFIG, ReaderConfig, WriterConfig
from dataset_rt.dataset import CachedDataset, probe_cache
from dataset_rt.parallel import write_in_processes
from dataset_rt.records import (
    CacheSource,
    CacheSourcesDatasetError,
    CacheSourcesDatasetResult,
    CacheSourcesDatasetSuccess,
    CacheWriteError,
    CacheWriteResult,
    CacheWriteSuccess,
)
from dataset_rt.writer import _Plan, _u64, is_parallel, plan_sources, write_planned


class DatasetRuntime:
    """Owns one fixed native pool of exactly ``num_workers`` threads.

    The threads start now and stop when the runtime and every dataset or writer using it
    are gone. A runtime cannot be pickled or used in a forked child process.
    """

    __slots__ = ("_runtime",)

    def __init__(self, *, num_workers: int) -> None:
        count = _u64(num_workers)
        # Closed when collected: datasets and writers opened from it keep the pool alive.
        self._runtime = _native.Runtime.open(count)

    @property
    def num_workers(self) -> int:
        """Threads in the native pool."""
        return self._runtime.num_workers

    def __reduce__(self) -> Any:
        raise TypeError("cannot pickle 'builtins.DatasetRuntime' object")  # 0.4.8's text

    def __copy__(self) -> DatasetRuntime:
        """``copy.copy``: another handle on the same native pool (as in 0.4.8)."""
        other = object.__new__(DatasetRuntime)
        other._runtime = self._runtime
        return other

    def __repr__(self) -> str:
        return f"DatasetRuntime(num_workers={self._runtime.num_workers})"

    def write_cache(
        self,
        sources: CacheSource | list[CacheSource],
        path: str | os.PathLike[str],
        *,
        writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
    ) -> list[CacheWriteResult]:
        """Write each source into ``<path>/<source.name>``.

        ``sources`` is a list of sources or one source. Returns one
        ``CacheWriteSuccess``/``CacheWriteError`` per source, in order. Raises for invalid
        configs and duplicate names (before anything is written); ``KeyboardInterrupt`` and
        ``SystemExit`` propagate unchanged after cleanup.
        """
        _native.check_owner(self._runtime.pid)
        items = sources if isinstance(sources, list) else [sources]
        if remote.is_url(path):
            return self._write_remote(items, str(path), writer_config)
        base = Path(path)
        plans, results = plan_sources(items, base, writer_config)
        results.update(self._write_planned(plans, base, writer_config))
        return [results[i] for i in range(len(items))]

    def _write_remote(
        self, items: list[Any], url: str, writer_config: WriterConfig, reuse: bool = False
    ) -> list[CacheWriteResult]:
        """Write each source locally into a staging base, then upload it to
        ``<url>/<name>`` (dataset_rt.remote.upload_cache: manifest last, never replacing).
        With ``reuse``, a cache already at the URL is a success without writing (its
        fingerprint checked as locally)."""
        plans, results = plan_sources(items, url, writer_config)
        with contextlib.ExitStack() as stack:
            try:
                staging = stack.enter_context(remote.upload_staging())
            except OSError as exc:
                message = f"I/O error: cannot stage uploads in {remote.default_cache_dir()}: {exc}"
                for plan in plans:
                    results[plan.position] = CacheWriteError(plan.name, message)
                return [results[i] for i in range(len(items))]
            to_write = []
            validate = bool(getattr(writer_config, "validate_cache", False))
            for plan in plans:
                target = remote.join(url, plan.name)
                try:
                    published = remote.exists(target)
                    left, locked = ([], False) if published else remote.leftovers(target)
                except RuntimeError as exc:
                    results[plan.position] = CacheWriteError(plan.name, str(exc))
                    continue
                # Checked again under the upload's lock; while another writer holds it,
                # the upload says who does.
                if left and not locked:
                    results[plan.position] = CacheWriteError(
                        plan.name, remote.not_a_cache(target, left)
                    )
                    continue
                if not published:
                    to_write.append(plan)
                    continue
                if not reuse:
                    results[plan.position] = CacheWriteError(
                        plan.name, f"cache path already exists: {target}"
                    )
                    continue
                error, fingerprint = probe_cache(self._runtime, target, validate=validate)
                if (
                    error is None
                    and plan.fingerprint is not None
                    and fingerprint != plan.fingerprint
                ):
                    error = (
                        f"stale cache {target}: its fingerprint {fingerprint!r} differs from the "
                        f"source's {plan.fingerprint!r}; nothing was rebuilt or deleted "
                        "(caches on object storage are never replaced: delete it, or write to "
                        "another URL)"
                    )
                results[plan.position] = (
                    CacheWriteSuccess(plan.name, target)  # type: ignore[arg-type]
                    if error is None
                    else CacheWriteError(plan.name, error)
                )
            written = self._write_planned(to_write, staging, writer_config)
            for position, result in written.items():
                if isinstance(result, CacheWriteSuccess):
                    target = remote.join(url, result.source_name)
                    try:
                        remote.upload_cache(Path(result.path), target)
                        result = CacheWriteSuccess(result.source_name, target)  # type: ignore[arg-type]
                    except (OSError, RuntimeError) as exc:
                        result = CacheWriteError(result.source_name, str(exc))
                results[position] = result
            return [results[i] for i in range(len(items))]

    def _write_planned(
        self, plans: list[_Plan], base: Path, config: WriterConfig
    ) -> dict[int, CacheWriteResult]:
        """Write planned sources here or in spawned processes; results by position."""
        if is_parallel(config):
            return write_in_processes(plans, base, config, self._runtime.num_workers)
        return write_planned(self._runtime, plans, base, config)

    def cached_dataset(
        self, paths: Sequence[str | os.PathLike[str]], *, reader_config: ReaderConfig
    ) -> CachedDataset:
        """Load caches (in ``paths`` order) as one ``CachedDataset``; raises load errors."""
        return CachedDataset._open(
            self._runtime, [p if remote.is_url(p) else Path(p) for p in paths], reader_config
        )

    def from_cache_sources(
        self,
        sources: CacheSource | list[CacheSource],
        path: str | os.PathLike[str],
        *,
        reader_config: ReaderConfig,
        writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
    ) -> CacheSourcesDatasetResult:
        """Write (or reuse) each source's cache, then load every cache that exists.

        A complete cache already at ``<path>/<name>`` is reused without iterating its
        source (checksum-verified first with ``writer_config.validate_cache``). A path
        there that is not a complete cache is reported as a ``CacheWriteError``. Returns
        ``CacheSourcesDatasetSuccess(dataset, results)`` when at least one cache is
        available, else ``CacheSourcesDatasetError(results, message)``.
        """
        _native.check_owner(self._runtime.pid)
        items = sources if isinstance(sources, list) else [sources]
        if not items:
            return CacheSourcesDatasetError([], "no cache sources were provided")
        if remote.is_url(path):
            final = self._write_remote(items, str(path), writer_config, reuse=True)
            return self._load_results(final, reader_config)
        base = Path(path)
        plans, results = plan_sources(items, base, writer_config)
        validate = bool(getattr(writer_config, "validate_cache", False))
        rebuild = getattr(writer_config, "on_stale", "error") == "rebuild"
        to_write, to_rebuild = [], []
        for plan in plans:
            target = base / plan.name
            if not os.path.lexists(target):
                to_write.append(plan)
                continue
            error, fingerprint = probe_cache(self._runtime, target, validate=validate)
            if error is None and plan.fingerprint is not None and fingerprint != plan.fingerprint:
                if rebuild:
                    to_rebuild.append(dataclasses.replace(plan, replace=True))
                    continue
                error = (
                    f"stale cache {target}: its fingerprint {fingerprint!r} differs from the "
                    f"source's {plan.fingerprint!r}; nothing was rebuilt or deleted "
                    "(WriterConfig(on_stale='rebuild') rebuilds it)"
                )
            results[plan.position] = (
                CacheWriteSuccess(plan.name, target)
                if error is None
                else CacheWriteError(plan.name, error)
            )
        results.update(self._write_planned(to_write, base, writer_config))
        if to_rebuild:  # swapped in by this process (the exchange is not done by children)
            serial = writer_config.model_copy(update={"num_processes": 0})
            results.update(self._write_planned(to_rebuild, base, serial))
        final = [results[i] for i in range(len(items))]
        return self._load_results(final, reader_config)

    def _load_results(
        self, final: list[CacheWriteResult], reader_config: ReaderConfig
    ) -> CacheSourcesDatasetResult:
        """Load every cache written or reused, or report that none is available."""
        paths = [r.path for r in final if isinstance(r, CacheWriteSuccess)]
        if not paths:
            detail = "; ".join(
                f"{r.source_name}: {r.message}" for r in final if isinstance(r, CacheWriteError)
            )
            return CacheSourcesDatasetError(final, f"no caches were written: {detail}")
        dataset = CachedDataset._open(self._runtime, paths, reader_config)
        return CacheSourcesDatasetSuccess(dataset, final)
