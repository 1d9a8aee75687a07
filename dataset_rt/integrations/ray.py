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
  the driver assigns sample ids in task-index order (the dataset's block order: each
  write task refuses to run unless the ``DataContext`` it executes with preserves
  order), merges and publishes atomically, then removes the fragments. A failed job
  publishes nothing and removes its fragments; a retried task rewrites its own fragment,
  so no sample is ever committed twice.

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

import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import ray
from ray.data.datasource.datasink import Datasink, WriteResult

from dataset_rt import _native, remote
from dataset_rt.config import WriterConfig, WriterProfilerConfig
from dataset_rt.fragments import (
    Fragment,
    commit_fragments,
    remove_fragments,
    write_fragment_arrow,
)
from dataset_rt.records import CacheWriteError, CacheWriteResult, CacheWriteSuccess
from dataset_rt.runtime import DatasetRuntime
from dataset_rt.writer import _u64, _write_profile, plan_sources

__all__ = ["CacheDatasink", "CacheDatasinkError", "RemoteFragment", "write_sources"]

DEFAULT_WRITER_CONFIG = WriterConfig(show_progress=False)


# Terminal colour and cursor sequences (CSI ... final byte) that Ray puts in its errors.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

# Profile entries of one task: the ``sources`` list of the profile it wrote.
_SourceProfiles = list[dict[str, Any]]


def _write_source_task(
    source: Any, base_dir: str, config: WriterConfig, num_workers: int
) -> tuple[CacheWriteResult, _SourceProfiles | None]:
    """Runs on a Ray worker: write one source with a runtime of its own.

    Returns its result and, when ``config.profiler`` is enabled, the profile's ``sources``
    entries: the task profiles into a temporary file of its own (removed here) and the
    driver writes the one profile of the whole call."""
    runtime = DatasetRuntime(num_workers=num_workers)
    if not config.profiler.enabled:
        return runtime.write_cache(source, base_dir, writer_config=config)[0], None
    fd, name = tempfile.mkstemp(prefix="dataset_rt-profile-", suffix=".json")
    os.close(fd)
    path = Path(name)
    try:
        profiler = WriterProfilerConfig(enabled=True, path=path)
        local = config.model_copy(update={"profiler": profiler})
        result = runtime.write_cache(source, base_dir, writer_config=local)[0]
        return result, json.loads(path.read_text(encoding="utf-8"))["sources"]
    finally:
        path.unlink(missing_ok=True)


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
    task, so it must be picklable, and iterated there. ``num_workers`` is checked first,
    as ``DatasetRuntime(num_workers=...)`` checks it (``ValueError`` for 0, ``TypeError``
    for a non-integer, ``OverflowError`` for a negative number). Names are checked next
    on the driver exactly as ``write_cache`` checks them (duplicates raise ValueError
    before any task starts). Each task runs ``write_cache`` with a
    ``DatasetRuntime(num_workers)`` and ``writer_config`` (``num_processes`` forced to 0);
    ``ray_remote_args`` go to ``ray.remote``. Without ``num_cpus`` in them, a task asks
    for ``min(num_workers, CPUs of the largest alive node)`` CPUs (``num_workers`` when
    no node has a whole CPU, e.g. an autoscaling cluster with none started yet), so that
    it can always be scheduled.

    Returns one result per source in source order; a task that fails in Ray itself (a
    lost worker, a source that cannot be pickled) becomes ``CacheWriteError(name, "Ray
    error: ...")`` (terminal colour codes removed) and the other sources still run. With
    ``writer_config.profiler`` enabled, the driver writes one profile at its ``path``
    (atomically, after the last task), listing every source written, as ``write_cache``
    does. Calls ``ray.init()`` first when Ray is not initialized.
    """
    count = _check_num_workers(num_workers)
    items = sources if isinstance(sources, list) else [sources]
    url = str(base_dir) if remote.is_url(base_dir) else None  # s3://...: tasks upload
    base = Path(base_dir)
    # A URL base is named as given in errors (Path would print "s3:/bucket/...").
    plans, results = plan_sources(items, url if url is not None else base, writer_config)
    config = writer_config.model_copy(update={"num_processes": 0, "show_progress": False})
    if not ray.is_initialized():
        ray.init()
    remote_args = dict(ray_remote_args or {})
    if "num_cpus" not in remote_args:
        remote_args["num_cpus"] = _default_num_cpus(count)
    task = ray.remote(_write_source_task).options(**remote_args)
    target = url if url is not None else str(base)
    profiling = writer_config.profiler.enabled
    profiles: _SourceProfiles = []
    started_ns = time.perf_counter_ns()
    try:
        refs = []
        for plan in plans:
            try:
                # Pickles the source here: one that cannot be pickled fails alone.
                refs.append((plan, task.remote(plan.source, target, config, count)))
            except Exception as exc:
                results[plan.position] = CacheWriteError(plan.name, _ray_error(exc))
                profiles.append({"source_name": plan.name, "stages": []})
        for plan, ref in refs:
            try:
                result, profile = ray.get(ref)
            except Exception as exc:
                result, profile = CacheWriteError(plan.name, _ray_error(exc)), None
            if isinstance(result, CacheWriteSuccess):
                # The task reports the path as it saw it; report the caller's spelling.
                result = CacheWriteSuccess(
                    plan.name,
                    remote.join(url, plan.name) if url is not None else base / plan.name,  # type: ignore[arg-type]
                )
            if profile is None:
                profile = [{"source_name": plan.name, "stages": []}]
            profiles.extend(profile)
            results[plan.position] = result
    finally:
        if profiling:
            elapsed_ns = time.perf_counter_ns() - started_ns
            # In write_cache's format: sources sorted by name, as the writer lists them.
            profiles.sort(key=lambda e: e["source_name"].encode("utf-8", "surrogatepass"))
            _write_profile(Path(writer_config.profiler.path), elapsed_ns, profiles)
    return [results[i] for i in range(len(items))]


def _check_num_workers(num_workers: int) -> int:
    """``num_workers`` as an int, checked on the driver as ``DatasetRuntime(num_workers=...)``
    checks it, with its exceptions and messages (a task would only fail, or never be
    scheduled, later)."""
    count = _u64(num_workers)  # TypeError for floats, strings; OverflowError
    if count == 0:
        raise ValueError("num_workers must be greater than zero")
    return count


def _default_num_cpus(num_workers: int) -> int:
    """``min(num_workers, CPUs of the largest alive node)``: a task asking for more CPUs
    than any node has is never scheduled (Ray waits forever). ``num_workers`` when no
    node has a whole CPU (an autoscaler may still add one)."""
    largest = max(
        (
            float(node.get("Resources", {}).get("CPU", 0))
            for node in ray.nodes()
            if node.get("Alive")
        ),
        default=0.0,
    )
    if largest < 1:
        return num_workers
    return min(num_workers, int(largest))


def _ray_error(exc: BaseException) -> str:
    """``"Ray error: <type>: <message>"`` for a task that failed in Ray, without the
    terminal colour codes Ray puts in its messages."""
    return "Ray error: " + _ANSI_ESCAPE.sub("", f"{type(exc).__name__}: {exc}").rstrip()


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


_ORDER_REFUSED = (
    "CacheDatasink assigns sample ids in block order, but this dataset executes without "
    "preserve_order: set ray.data.DataContext.get_current().execution_options."
    "preserve_order = True before creating the dataset (a Dataset keeps the DataContext "
    "it was created with; or set it in ds.context), or pass ordered=False to accept the "
    "order in which blocks reach the write tasks"
)


class _OrderRefused(ValueError):
    """A write task's refusal to run without ``preserve_order`` (see ``_ORDER_REFUSED``)."""


class CacheDatasink(Datasink[Any]):
    """Writes a ``ray.data.Dataset`` as the cache ``<base_dir>/<name>``.

    Rows hold the payload in ``data_column`` (binary) and metadata in every other column
    (bool, integers, floats, strings; no nulls; the same columns in every block).
    Sample ids follow the order of the write tasks (their task index), which is the
    dataset's block order when ``execution_options.preserve_order`` is on in the
    ``DataContext`` the dataset executes with: the one it was created with
    (``ds.context``), not the global one at the time of the write. Unless
    ``ordered=False``, every write task checks that context before it writes anything,
    and a job without it fails with ``ValueError`` (nothing is written or published).

    ``name`` is checked when the sink is created, with ``write_cache``'s rules and
    messages (``ValueError``, e.g. ``"CacheSource.name must be a plain path segment"``),
    and ``num_workers`` (native writer threads per task) as ``DatasetRuntime`` checks it.

    ``base_dir`` may be an object store URL (``s3://bucket/prefix``): each write task
    writes its fragment in a local staging directory
    (:func:`dataset_rt.remote.upload_staging`: ``DATASET_RT_CACHE_DIR/uploads/write-*``,
    which a later writer removes if its task was killed) and uploads it under
    ``<url>/tmp/<name>.<random>.fragments/<task>.<attempt>/``; the commit on the driver
    downloads the fragments, merges them locally (checking every fragment file's
    SHA-256) and uploads the cache with :func:`dataset_rt.remote.upload_cache` (manifest
    last, create only). A cache on object storage is never replaced (``replace=True`` is
    refused for a URL). Every byte crosses the network three times (task up, driver
    down, driver up).

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
        if not isinstance(name, str):
            raise TypeError(f"'{type(name).__name__}' object is not an instance of 'str'")
        _native.source_name_check(name)  # write_cache's and commit_fragments' rules
        self.num_workers = _check_num_workers(num_workers)
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
        """Checks the destination before any task runs (fails fast). The order is checked
        by the write tasks: only they see the ``DataContext`` the dataset executes with
        (Ray calls this with the global one current)."""
        if self.url is not None:
            if remote.exists(self.destination):
                raise ValueError(f"cache path already exists: {self.destination}")
            return
        if not self.replace and os.path.lexists(self.destination):
            raise ValueError(f"cache path already exists: {self.destination}")
        os.makedirs(self.fragments_dir, exist_ok=True)

    def write(self, blocks: Iterable[Any], ctx: Any) -> Fragment | RemoteFragment | None:
        """One write task: its blocks, in order, become fragment ``ctx.task_idx`` (for a
        URL: written in local staging, uploaded, then the staging removed).

        Unless ``ordered=False``, raises before reading a block when the ``DataContext``
        this task executes with (Ray makes the dataset's current in its tasks) does not
        preserve order: task indexes would then not follow the dataset's rows."""
        from ray.data import DataContext
        from ray.data.block import BlockAccessor

        if self.ordered and not DataContext.get_current().execution_options.preserve_order:
            raise _OrderRefused(_ORDER_REFUSED)

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
        with remote.upload_staging() as staging:
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
        """Removes the fragments of a failed job; nothing was published. When the write
        tasks refused the job for its order, raises a plain ``ValueError`` saying how to
        set ``preserve_order`` (``write_datasink`` raises it) instead of Ray's task error
        with its remote traceback."""
        self._remove_fragments()
        if _refused_order(error):
            raise ValueError(_ORDER_REFUSED) from None

    def _commit_remote(self, fragments: list[RemoteFragment]) -> CacheWriteResult:
        """Downloads the uploaded fragments, commits them in local staging and uploads
        the cache (``upload_cache``: manifest last, never replacing one)."""
        try:
            with remote.upload_staging() as staging:
                local = []
                for fragment in fragments:
                    path = staging / "fragments" / fragment.fragment_id
                    remote.download_files(fragment.url, fragment.files, path)
                    local.append(path)
                result = commit_fragments(local, staging / "cache", self.name)
                if isinstance(result, CacheWriteSuccess):
                    remote.upload_cache(Path(result.path), self.destination)
                    result = CacheWriteSuccess(self.name, self.destination)  # type: ignore[arg-type]
                return result
        except (OSError, RuntimeError) as exc:
            return CacheWriteError(self.name, str(exc))

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


def _refused_order(error: BaseException) -> bool:
    """Whether ``error`` is, or wraps (Ray's ``RayTaskError.cause``, ``__cause__``), a
    write task's :class:`_OrderRefused`."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, _OrderRefused):
            return True
        seen.add(id(current))
        cause = getattr(current, "cause", None)
        current = cause if isinstance(cause, BaseException) else current.__cause__
    return False


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
