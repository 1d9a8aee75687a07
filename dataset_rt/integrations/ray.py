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

``base_dir`` is storage that every node and the driver see at the same path (NFS,
Lustre, a shared POSIX mount; see ``docs/guide-ray.md``), or an object store URL
(``s3://bucket/prefix``, see ``docs/guide-remote.md``): then each cache is built locally
in staging and uploaded with :func:`dataset_rt.remote.upload_cache` (the manifest last,
never replacing a cache). :func:`write_sources` tasks upload their own caches;
``CacheDatasink`` tasks upload their fragments under
``<url>/tmp/<name>.<random>.fragments/``, and the commit on the driver downloads them,
merges them locally and uploads the cache.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

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

__all__ = ["CacheDatasink", "CacheDatasinkError", "RemoteFragment", "write_sources"]

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


class RemoteFragment(NamedTuple):
    """A fragment a write task uploaded (``CacheDatasink`` to a URL): its id, the URL
    prefix of this attempt's files, their paths relative to it, and its sample count."""

    fragment_id: str
    url: str
    files: tuple[str, ...]
    sample_count: int


class CacheDatasink(Datasink[Any]):
    """Writes a ``ray.data.Dataset`` as the cache ``<base_dir>/<name>``.

    Rows hold the payload in ``data_column`` (binary) and metadata in every other column
    (bool, integers, floats, strings; no nulls; the same columns in every block).
    Sample ids follow the order of the write tasks (their task index), which is the
    dataset's block order when ``DataContext.execution_options.preserve_order`` is on;
    ``on_write_start`` refuses to run without it unless ``ordered=False``.

    ``base_dir`` may be an object store URL (``s3://bucket/prefix``): each write task
    writes its fragment in a local staging directory (under ``DATASET_RT_CACHE_DIR``)
    and uploads it under ``<url>/tmp/<name>.<random>.fragments/<task>.<attempt>/``;
    the commit on the driver downloads the fragments, merges them locally (checking
    every fragment file's SHA-256) and uploads the cache with
    :func:`dataset_rt.remote.upload_cache` (manifest last, create only). A cache on
    object storage is never replaced (``replace=True`` is refused for a URL). Every
    byte crosses the network three times (task up, driver down, driver up).

    After a successful ``write_datasink`` call, :attr:`result` is the
    ``CacheWriteSuccess``. If the commit fails (an existing cache without ``replace``, a
    damaged fragment, a failed upload) ``write_datasink`` raises
    :class:`CacheDatasinkError` and nothing is published. Fragments and staging (local
    or uploaded) are removed in every case the driver survives.
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
        self.url = str(base_dir).rstrip("/") if remote.is_url(base_dir) else None
        if self.url is not None and replace:
            raise ValueError(
                f"CacheDatasink cannot replace a cache on object storage ({base_dir}): "
                "delete the old cache or write to another URL"
            )
        self.base_dir = self.url if self.url is not None else str(base_dir)
        self.name = name
        self.data_column = data_column
        self.writer_config = writer_config
        self.num_workers = num_workers
        self.replace = replace
        self.ordered = ordered
        token = secrets.token_hex(8)
        if self.url is not None:
            self.fragments_dir = remote.join(self.url, f"tmp/{name}.{token}.fragments")
        else:
            self.fragments_dir = os.path.join(self.base_dir, "tmp", f"{name}.{token}.fragments")
        self.result: CacheWriteResult | None = None

    @property
    def destination(self) -> str:
        """``<base_dir>/<name>``: a path, or a URL."""
        if self.url is not None:
            return remote.join(self.url, self.name)
        return os.path.join(self.base_dir, self.name)

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
        if self.url is not None:
            if remote.exists(self.destination):
                raise ValueError(f"cache path already exists: {self.destination}")
            return
        if not self.replace and os.path.lexists(self.destination):
            raise ValueError(f"cache path already exists: {self.destination}")
        os.makedirs(self.fragments_dir, exist_ok=True)

    def write(self, blocks: Iterable[Any], ctx: Any) -> Fragment | RemoteFragment | None:
        """One write task: its blocks, in order, become fragment ``ctx.task_idx`` (for a
        URL: written in local staging, uploaded, then the staging removed)."""
        from ray.data.block import BlockAccessor

        tables = (BlockAccessor.for_block(block).to_arrow() for block in blocks)
        runtime = DatasetRuntime(num_workers=self.num_workers)
        nonempty = _NonEmpty(tables)
        if not nonempty.any():
            return None
        if self.url is None:
            return write_fragment_arrow(
                runtime,
                nonempty,
                self.fragments_dir,
                int(ctx.task_idx),
                data_column=self.data_column,
                writer_config=self.writer_config,
            )
        staging = _staging_dir("fragment-")
        try:
            fragment = write_fragment_arrow(
                runtime,
                nonempty,
                staging,
                int(ctx.task_idx),
                data_column=self.data_column,
                writer_config=self.writer_config,
            )
            # Each attempt of a task has a prefix of its own: a retried task never mixes
            # its files with a lost attempt's; the commit takes the attempt returned.
            prefix = remote.join(
                self.fragments_dir, f"{fragment.fragment_id}.{secrets.token_hex(4)}"
            )
            files = remote.upload_files(Path(fragment.path), prefix)
            return RemoteFragment(fragment.fragment_id, prefix, tuple(files), fragment.sample_count)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

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
            elif self.url is None:
                result = commit_fragments(fragments, self.base_dir, self.name, replace=self.replace)
            else:
                result = self._commit_remote(fragments)
        finally:
            self._remove_fragments()
        self.result = result
        if isinstance(result, CacheWriteError):
            raise CacheDatasinkError(result)

    def on_write_failed(self, error: Exception) -> None:
        """Removes the fragments of a failed job; nothing was published."""
        self._remove_fragments()

    def _commit_remote(self, fragments: list[RemoteFragment]) -> CacheWriteResult:
        """Downloads the uploaded fragments, commits them in local staging and uploads
        the cache (``upload_cache``: manifest last, never replacing one)."""
        staging = _staging_dir("commit-")
        try:
            local = []
            for fragment in fragments:
                path = Path(staging) / "fragments" / fragment.fragment_id
                remote.download_files(fragment.url, fragment.files, path)
                local.append(path)
            result = commit_fragments(local, Path(staging) / "cache", self.name)
            if isinstance(result, CacheWriteSuccess):
                remote.upload_cache(Path(result.path), self.destination)
                result = CacheWriteSuccess(self.name, self.destination)  # type: ignore[arg-type]
            return result
        except (OSError, RuntimeError) as exc:
            return CacheWriteError(self.name, str(exc))
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _remove_fragments(self) -> None:
        if self.url is None:
            remove_fragments(self.fragments_dir)
            return
        left = remote.delete_prefix(self.fragments_dir)
        if left:
            import warnings

            warnings.warn(
                f"CacheDatasink could not delete its fragments under {self.fragments_dir}/ "
                f"({len(left)} objects); delete them (for example: aws s3 rm --recursive "
                f"{self.fragments_dir}/)",
                RuntimeWarning,
                stacklevel=2,
            )


def _staging_dir(prefix: str) -> str:
    """A new directory under ``DATASET_RT_CACHE_DIR/uploads`` (as ``write_cache`` to a
    URL stages there); the caller removes it."""
    root = remote.default_cache_dir() / "uploads"
    root.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=root)


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
