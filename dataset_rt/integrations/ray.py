"""Build caches on a Ray cluster (``pip install 'dataset-rt-zig[ray]'``). Importing this module
imports ray; ``import dataset_rt`` never does.

Two ways, both producing the same immutable, checksummed caches as ``write_cache``:

* :func:`write_sources`: one Ray task per source, each writing its own cache
  ``<base_dir>/<source.name>`` with the ordinary writer. Results come back as the usual
  ``CacheWriteSuccess``/``CacheWriteError`` list, in source order. The caches are
  byte-identical to what ``write_cache`` writes from the same sources.
* :class:`CacheDatasink`: ``dataset.write_datasink(CacheDatasink(base_dir, name))`` writes
  one ``ray.data.Dataset`` as one cache. Each write task writes a fragment
  (:mod:`dataset_rt.fragments`) named by its task index under a staging directory
  ``<base_dir>/tmp/<name>.<random>.fragments``; when every task succeeded one commit on
  the driver assigns sample ids in task-index order (the dataset's block order), merges
  and publishes atomically, then removes the fragments. A failed job publishes nothing
  and removes its fragments; a retried task rewrites its own fragment, so no sample is
  ever committed twice.

``base_dir`` must be on storage that every node and the driver see at the same path
(NFS, Lustre, a shared POSIX mount); see ``docs/guide-ray.md``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import ray
from ray.data.datasource.datasink import Datasink, WriteResult

from dataset_rt import remote
from dataset_rt.config import WriterConfig
from dataset_rt.fragments import (
    Fragment,
    commit_fragments,
    remove_fragments,
    write_fragment_arrow,
)
from dataset_rt.records import CacheWriteError, CacheWriteResult, CacheWriteSuccess
from dataset_rt.runtime import DatasetRuntime
from dataset_rt.writer import plan_sources

__all__ = ["CacheDatasink", "CacheDatasinkError", "write_sources"]

DEFAULT_WRITER_CONFIG = WriterConfig(show_progress=False)


def _write_source_task(source: Any, base_dir: str, config: WriterConfig, num_workers: int) -> Any:
    """Runs on a Ray worker: write one source with a runtime of its own."""
    runtime = DatasetRuntime(num_workers=num_workers)
    return runtime.write_cache(source, base_dir, writer_config=config)[0]


def write_sources(
    sources: Any,
    base_dir: str | os.PathLike[str],
    *,
    writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
    num_workers: int = 1,
    ray_remote_args: dict[str, Any] | None = None,
) -> list[CacheWriteResult]:
    """Write each source as its own Ray task into ``<base_dir>/<source.name>``.

    ``sources`` is a list of sources or one source; each is pickled (cloudpickle) to its
    task, so it must be picklable, and iterated there. Names are checked first on the
    driver exactly as ``write_cache`` checks them (duplicates raise ValueError before any
    task starts). Each task runs ``write_cache`` with a ``DatasetRuntime(num_workers)``
    and ``writer_config`` (``num_processes`` forced to 0); ``ray_remote_args`` (default
    ``{"num_cpus": num_workers}``) go to ``ray.remote``. Returns one result per source in
    source order; a task that fails in Ray itself (a lost worker, an unpicklable source)
    becomes ``CacheWriteError(name, "Ray error: ...")``. Calls ``ray.init()`` first when
    Ray is not initialized.
    """
    items = sources if isinstance(sources, list) else [sources]
    url = str(base_dir) if remote.is_url(base_dir) else None  # s3://...: tasks upload
    base = Path(base_dir)
    plans, results = plan_sources(items, base, writer_config)
    config = writer_config.model_copy(update={"num_processes": 0, "show_progress": False})
    if not ray.is_initialized():
        ray.init()
    remote_args = {"num_cpus": num_workers, **(ray_remote_args or {})}
    task = ray.remote(_write_source_task).options(**remote_args)
    target = url if url is not None else str(base)
    refs = [(plan, task.remote(plan.source, target, config, num_workers)) for plan in plans]
    for plan, ref in refs:
        try:
            result = ray.get(ref)
        except Exception as exc:
            result = CacheWriteError(plan.name, f"Ray error: {type(exc).__name__}: {exc}")
        else:
            if isinstance(result, CacheWriteSuccess):
                # The task reports the path as it saw it; report the caller's spelling.
                result = CacheWriteSuccess(
                    plan.name,
                    remote.join(url, plan.name) if url is not None else base / plan.name,  # type: ignore[arg-type]
                )
        results[plan.position] = result
    return [results[i] for i in range(len(items))]


class CacheDatasinkError(RuntimeError):
    """The commit of a :class:`CacheDatasink` failed; ``result`` is its CacheWriteError."""

    def __init__(self, result: CacheWriteError) -> None:
        super().__init__(f"{result.source_name}: {result.message}")
        self.result = result


class CacheDatasink(Datasink[Any]):
    """Writes a ``ray.data.Dataset`` as the cache ``<base_dir>/<name>``.

    Rows hold the payload in ``data_column`` (binary) and metadata in every other column
    (bool, integers, floats, strings; no nulls; the same columns in every block).
    Sample ids follow the order of the write tasks (their task index), which is the
    dataset's block order when ``DataContext.execution_options.preserve_order`` is on;
    ``on_write_start`` refuses to run without it unless ``ordered=False``.

    After a successful ``write_datasink`` call, :attr:`result` is the
    ``CacheWriteSuccess``. If the commit fails (an existing cache without ``replace``, a
    damaged fragment) ``write_datasink`` raises :class:`CacheDatasinkError` and nothing
    is published. Fragments and staging are removed in every case the driver survives.
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        name: str,
        *,
        data_column: str = "data",
        writer_config: WriterConfig = DEFAULT_WRITER_CONFIG,
        num_workers: int = 1,
        replace: bool = False,
        ordered: bool = True,
    ) -> None:
        if remote.is_url(base_dir):
            raise ValueError(
                f"CacheDatasink cannot write to {base_dir} yet: its fragments need a file "
                "system every node shares; write to a shared directory and upload, or use "
                "write_sources with the URL (docs/guide-remote.md)"
            )
        self.base_dir = str(base_dir)
        self.name = name
        self.data_column = data_column
        self.writer_config = writer_config
        self.num_workers = num_workers
        self.replace = replace
        self.ordered = ordered
        token = secrets.token_hex(8)
        self.fragments_dir = os.path.join(self.base_dir, "tmp", f"{name}.{token}.fragments")
        self.result: CacheWriteResult | None = None

    def get_name(self) -> str:
        return "DatasetRtCache"

    def on_write_start(self, schema: Any = None) -> None:
        """Checks order and destination before any task runs (fails fast)."""
        if self.ordered:
            from ray.data import DataContext

            if not DataContext.get_current().execution_options.preserve_order:
                raise ValueError(
                    "CacheDatasink assigns sample ids in block order: set "
                    "ray.data.DataContext.get_current().execution_options.preserve_order = True "
                    "(or pass ordered=False to accept the order in which blocks reach the "
                    "write tasks)"
                )
        destination = os.path.join(self.base_dir, self.name)
        if not self.replace and os.path.lexists(destination):
            raise ValueError(f"cache path already exists: {destination}")
        os.makedirs(self.fragments_dir, exist_ok=True)

    def write(self, blocks: Iterable[Any], ctx: Any) -> Fragment | None:
        """One write task: its blocks, in order, become fragment ``ctx.task_idx``."""
        from ray.data.block import BlockAccessor

        tables = (BlockAccessor.for_block(block).to_arrow() for block in blocks)
        runtime = DatasetRuntime(num_workers=self.num_workers)
        nonempty = _NonEmpty(tables)
        if not nonempty.any():
            return None
        return write_fragment_arrow(
            runtime,
            nonempty,
            self.fragments_dir,
            int(ctx.task_idx),
            data_column=self.data_column,
            writer_config=self.writer_config,
        )

    def on_write_complete(self, write_result: WriteResult[Any]) -> None:
        """Commits every fragment in task-index order, then removes the fragments."""
        fragments = sorted(
            (f for f in write_result.write_returns if f is not None),
            key=lambda f: int(f.fragment_id),
        )
        try:
            if not fragments:
                result: CacheWriteResult = CacheWriteError(
                    self.name, "cache source yielded no samples"
                )
            else:
                result = commit_fragments(fragments, self.base_dir, self.name, replace=self.replace)
        finally:
            remove_fragments(self.fragments_dir)
        self.result = result
        if isinstance(result, CacheWriteError):
            raise CacheDatasinkError(result)

    def on_write_failed(self, error: Exception) -> None:
        """Removes the fragments of a failed job; nothing was published."""
        remove_fragments(self.fragments_dir)


class _NonEmpty:
    """Iterates tables, skipping empty ones; ``any()`` peeks for a first non-empty one."""

    def __init__(self, tables: Iterable[Any]) -> None:
        self._it = iter(tables)
        self._first: Any = None

    def any(self) -> bool:
        for table in self._it:
            if table.num_rows:
                self._first = table
                return True
        return False

    def __iter__(self) -> Any:
        if self._first is not None:
            yield self._first
            self._first = None
        for table in self._it:
            if table.num_rows:
                yield table
