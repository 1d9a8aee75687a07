"""Caches on object storage (``s3://``, ``gs://``, ``az://``, ...): the obstore transport
the native core fetches through, where the local copies live, and uploads.

The core decides everything about correctness (``native/src/io/remote.zig``): which
objects to fetch, their sizes and SHA-256 against the manifest, the shard cache and its
budget, retries. This module only moves bytes with the ``obstore`` client (the
``dataset-rt-zig[remote]`` extra) and classifies its errors, and uploads a cache built
locally (shards, ``index.bin``, ``metadata.arrow``, then ``manifest.json`` last: its
presence publishes the cache; never replacing an existing one).

Credentials and endpoints come from the environment, as obstore and the cloud CLIs take
them (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``,
``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``; ``GOOGLE_APPLICATION_CREDENTIALS``;
``AZURE_STORAGE_ACCOUNT_NAME``, ...). The local directory is ``DATASET_RT_CACHE_DIR`` or
``$XDG_CACHE_HOME/dataset_rt`` (``~/.cache/dataset_rt``), the shard budget
``DATASET_RT_SHARD_CACHE_BYTES`` (default 16 GiB).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from dataset_rt import _native
from dataset_rt.config import is_url as is_url  # the one rule; callers use remote.is_url

CACHE_DIR_ENV = "DATASET_RT_CACHE_DIR"
BUDGET_ENV = "DATASET_RT_SHARD_CACHE_BYTES"
DEFAULT_BUDGET = 16 << 30
#: Further attempts after a transient failure (the core backs off 0.1 s, doubling, <= 2 s).
DEFAULT_RETRIES = 5
#: Upload part size: files larger than this are uploaded in parts of this size.
UPLOAD_CHUNK = 16 << 20
#: Pieces in which a ranged GET's body is copied into the shard file or the core's buffer
#: (``read_to_file``, ``read_into``).
STREAM_CHUNK = 1 << 20

_TRANSIENT = re.compile(
    r"error sending request|connection|connect|reset|timed out|timeout|broken pipe|"
    r"\b5\d\d\b|slow ?down|incomplete|body",
    re.IGNORECASE,
)


def join(base: str, name: str) -> str:
    """``base/name`` for a URL (one slash)."""
    return base.rstrip("/") + "/" + name


def _require_obstore() -> Any:
    try:
        import obstore
    except ImportError as exc:  # pragma: no cover - the extra is a dev dependency
        raise ImportError(
            "caches on object storage need the obstore client: pip install 'dataset-rt-zig[remote]'"
        ) from exc
    return obstore


def default_cache_dir() -> Path:
    """``DATASET_RT_CACHE_DIR``, else ``$XDG_CACHE_HOME/dataset_rt`` (``~/.cache``)."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "dataset_rt"


def default_budget() -> int:
    """``DATASET_RT_SHARD_CACHE_BYTES`` (an integer), else 16 GiB."""
    raw = os.environ.get(BUDGET_ENV)
    if not raw:
        return DEFAULT_BUDGET
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{BUDGET_ENV} must be a number of bytes, not {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{BUDGET_ENV} must be greater than zero")
    return value


#: The process that made the first obstore request (obstore's runtime starts there).
_CLIENT_PID: list[int] = []

FORKED_MESSAGE = (
    "the object store client (obstore) cannot be used in a process forked from one that "
    "already used it: its runtime's threads do not survive fork, and its requests would "
    "never finish; start worker processes with 'spawn' or 'forkserver' instead (for "
    "example to_torch_dataloader(multiprocessing_context='spawn'), the default, or "
    "multiprocessing.set_start_method('spawn'))"
)


def _check_not_forked() -> None:
    """Raises ``RemoteError`` (not retried) in a process forked after obstore was used in
    its parent, where a request would hang forever (obstore is not fork safe)."""
    pid = os.getpid()
    if not _CLIENT_PID:
        _CLIENT_PID.append(pid)
    elif _CLIENT_PID[0] != pid:
        raise _native.RemoteError(_native.RemoteCode.FAILED, FORKED_MESSAGE)


class ObstoreTransport:
    """The ``RemoteTransport`` over obstore: one store per ``scheme://bucket`` (configured
    from the environment), HEAD for open, ranged GET for read. obstore's own retries are
    turned off: the core retries with backoff and names the URL.

    A handle pins the object's version seen by ``open``: every ranged GET of it carries
    ``If-Match: <the ETag from the HEAD>``, so a read of an object replaced since fails
    with ``RemoteCode.CHANGED`` (HTTP 412) instead of returning bytes of another version
    (a store that reports no ETag is read unconditionally). Client errors become
    ``RemoteError``s (``classify``); ``KeyboardInterrupt`` and ``SystemExit`` propagate
    unchanged (the library call raises them again: ``_native._remote_failure``)."""

    def __init__(self) -> None:
        self._stores: dict[str, Any] = {}
        self._lock = threading.Lock()

    def locate(self, url: str) -> tuple[Any, str]:
        """The store of ``url``'s bucket and the object's key in it. Raises
        ``RemoteError`` in a process forked after obstore was used (see
        :data:`FORKED_MESSAGE`): every request starts here."""
        _check_not_forked()
        scheme, _, rest = url.partition("://")
        bucket, _, key = rest.partition("/")
        root = f"{scheme}://{bucket}"
        with self._lock:
            store = self._stores.get(root)
            if store is None:
                from obstore.store import from_url

                options: dict[str, Any] = {"connect_timeout": "5s", "timeout": "120s"}
                # Client options replace the environment's: keep AWS_ALLOW_HTTP's word.
                if os.environ.get("AWS_ALLOW_HTTP", "").lower() in ("true", "1"):
                    options["allow_http"] = True
                store = from_url(root, client_options=options, retry_config={"max_retries": 0})
                self._stores[root] = store
        return store, key

    def open(self, url: str) -> tuple[int, Any]:
        obstore = _require_obstore()
        store, key = self.locate(url)
        try:
            meta = obstore.head(store, key)
        except Exception as exc:
            raise classify(exc) from exc
        return int(meta["size"]), (store, key, meta.get("e_tag"))

    @staticmethod
    def _options(handle: Any, offset: int, end: int) -> dict[str, Any]:
        """GET options for ``[offset, end)`` of the version ``handle`` pinned."""
        options: dict[str, Any] = {"range": (offset, end)}
        if handle[2]:
            options["if_match"] = handle[2]
        return options

    def read(self, handle: Any, offset: int, length: int) -> Any:
        obstore = _require_obstore()
        store, key, _ = handle
        try:
            result = obstore.get(store, key, options=self._options(handle, offset, offset + length))
            return result.bytes()
        except Exception as exc:
            raise classify(exc) from exc

    def _stream(
        self, handle: Any, offset: int, length: int, sink: Callable[[memoryview, int], None]
    ) -> int:
        """Streams the ``length`` bytes at ``offset`` in pieces of :data:`STREAM_CHUNK`
        (however large the range, the client holds one piece at a time), handing each to
        ``sink(piece, at)`` (``at``: the bytes before it). Returns the number of bytes
        streamed (less than ``length`` if the body was short; the core retries)."""
        obstore = _require_obstore()
        store, key, _ = handle
        streamed = 0
        try:
            result = obstore.get(store, key, options=self._options(handle, offset, offset + length))
            for piece in result.stream(min_chunk_size=STREAM_CHUNK):
                view = memoryview(piece).cast("B")
                if streamed + len(view) > length:
                    raise _native.RemoteError(
                        _native.RemoteCode.FAILED,
                        f"the server sent more than the {length} bytes asked for",
                    )
                sink(view, streamed)
                streamed += len(view)
        except _native.RemoteError:
            raise
        except Exception as exc:
            raise classify(exc) from exc
        return streamed

    def read_into(self, handle: Any, offset: int, out: memoryview) -> int:
        """Streams the ``len(out)`` bytes at ``offset`` into ``out`` (the core's mapping of
        a shard file or its buffer of a byte-range read); see :meth:`_stream`."""

        def copy(view: memoryview, at: int) -> None:
            out[at : at + len(view)] = view

        return self._stream(handle, offset, len(out), copy)

    def read_to_file(self, handle: Any, offset: int, length: int, fd: int) -> int:
        """Streams the ``length`` bytes at ``offset`` into the file ``fd`` at ``offset``
        with ``os.pwrite`` (several threads write ranges of one file); see
        :meth:`_stream`."""

        def write(view: memoryview, at: int) -> None:
            while view:
                n = os.pwrite(fd, view, offset + at)
                view = view[n:]
                at += n

        return self._stream(handle, offset, length, write)

    def close(self, handle: Any) -> None:
        return None


def classify(exc: BaseException) -> _native.RemoteError:
    """The core's view of an obstore error: not found, denied, changed (a conditional
    read's precondition failed), transient or failed."""
    from obstore import exceptions as ox

    text = str(exc).split("\n\nDebug source:")[0].strip() or type(exc).__name__
    if isinstance(exc, (FileNotFoundError, ox.NotFoundError)):
        code = _native.RemoteCode.NOT_FOUND
    elif isinstance(exc, ox.PreconditionError):
        code = _native.RemoteCode.CHANGED
    elif isinstance(exc, (ox.PermissionDeniedError, ox.UnauthenticatedError)):
        code = _native.RemoteCode.DENIED
    elif isinstance(exc, (ConnectionError, TimeoutError)) or _TRANSIENT.search(text):
        code = _native.RemoteCode.RETRY
    else:
        code = _native.RemoteCode.FAILED
    return _native.RemoteError(code, text)


_REMOTES: dict[tuple[str, int, int, int], _native.Remote] = {}
_REMOTES_LOCK = threading.Lock()


def remote(
    cache_dir: str | os.PathLike[str] | None = None,
    budget_bytes: int | None = None,
    retries: int = DEFAULT_RETRIES,
) -> _native.Remote:
    """The native transport for this configuration (one per process and configuration,
    kept for the life of the process: datasets call back into it). A forked child gets
    its own (the parent's stays referenced, never used there)."""
    _require_obstore()
    directory = str(Path(cache_dir) if cache_dir is not None else default_cache_dir())
    budget = default_budget() if budget_bytes is None else int(budget_bytes)
    key = (directory, budget, int(retries), os.getpid())
    with _REMOTES_LOCK:
        handle = _REMOTES.get(key)
        if handle is None:
            handle = _native.Remote.open(ObstoreTransport(), directory, budget, retries)
            _REMOTES[key] = handle
        return handle


def exists(url: str) -> bool:
    """Whether a cache is published at ``url`` (its ``manifest.json`` exists)."""
    obstore = _require_obstore()
    transport = ObstoreTransport()
    store, key = transport.locate(join(url, "manifest.json"))
    try:
        obstore.head(store, key)
        return True
    except Exception as exc:
        error = classify(exc)
        if error.code == _native.RemoteCode.NOT_FOUND:
            return False
        raise RuntimeError(f"cannot check {url}: {error}") from exc


class UploadError(RuntimeError):
    """An upload failed; nothing was published (the message says what is left)."""


def upload_cache(local: Path, url: str) -> None:
    """Upload the complete local cache ``local`` to ``url``: every file except
    ``manifest.json``, then ``manifest.json`` with a conditional put (create only). An
    existing cache at ``url`` is never replaced (``FileExistsError`` before anything is
    uploaded, or from the conditional put). On failure the objects already uploaded are
    deleted (best effort) and the error lists any that remain."""
    obstore = _require_obstore()
    transport = ObstoreTransport()
    manifest_store, manifest_key = transport.locate(join(url, "manifest.json"))
    if exists(url):
        raise FileExistsError(f"cache path already exists: {url}")
    files = sorted(
        p
        for p in local.rglob("*")
        if p.is_file() and p.relative_to(local).as_posix() != "manifest.json"
    )
    uploaded: list[str] = []
    try:
        for path in files:
            rel = path.relative_to(local).as_posix()
            store, key = transport.locate(join(url, rel))
            _put_file(obstore, store, key, path)
            uploaded.append(key)
        data = (local / "manifest.json").read_bytes()
        try:
            obstore.put(manifest_store, manifest_key, data, mode="create")
        except BaseException as exc:
            from obstore import exceptions as ox

            if isinstance(exc, (ox.AlreadyExistsError, ox.PreconditionError, FileExistsError)):
                raise FileExistsError(
                    f"cache path already exists: {url} (published by another writer during "
                    "this upload)"
                ) from exc
            raise
    except BaseException as exc:
        left = _delete_quietly(obstore, manifest_store, uploaded)
        detail = (
            "nothing was published (no manifest.json); the objects uploaded were deleted"
            if not left
            else "nothing was published (no manifest.json), but these objects are left "
            f"behind under {url}: {', '.join(left)}; delete them (for example: aws s3 rm "
            f"--recursive {url}/) before writing this cache again"
        )
        if isinstance(exc, FileExistsError):
            raise FileExistsError(f"{exc}; {detail}") from exc
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        message = classify(exc) if not isinstance(exc, OSError) else exc
        raise UploadError(f"upload of {local} to {url} failed: {message}; {detail}") from exc


def _put_file(obstore: Any, store: Any, key: str, path: Path) -> None:
    """Upload one file (multipart above :data:`UPLOAD_CHUNK`)."""
    size = path.stat().st_size
    if size <= UPLOAD_CHUNK:
        obstore.put(store, key, path.read_bytes())
    else:
        with open(path, "rb") as handle:
            obstore.put(store, key, handle, chunk_size=UPLOAD_CHUNK)


def _delete_quietly(obstore: Any, store: Any, keys: Iterable[str]) -> list[str]:
    """Delete ``keys``; returns those that could not be deleted."""
    left = []
    for key in keys:
        try:
            obstore.delete(store, key)
        except BaseException:
            left.append(key)
    return left


def upload_files(local: Path, url: str) -> list[str]:
    """Upload every file under the directory ``local`` to ``url/<relative path>`` (plain
    puts, no publication marker: for staging such as a Ray job's fragments). Returns the
    relative paths uploaded, sorted. On failure the objects already uploaded are deleted
    (best effort) and the error is raised."""
    obstore = _require_obstore()
    transport = ObstoreTransport()
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    uploaded: list[tuple[Any, str]] = []
    try:
        for rel in files:
            store, key = transport.locate(join(url, rel))
            _put_file(obstore, store, key, local / rel)
            uploaded.append((store, key))
    except BaseException as exc:
        for store, key in uploaded:
            _delete_quietly(obstore, store, [key])
        if isinstance(exc, (KeyboardInterrupt, SystemExit, OSError)):
            raise
        raise classify(exc) from exc
    return files


def download_files(url: str, names: Iterable[str], local: Path) -> None:
    """Download ``url/<name>`` for each of ``names`` into ``local/<name>`` (directories
    made as needed), streaming each object in pieces of :data:`STREAM_CHUNK`. The caller
    verifies the contents (checksums in a manifest)."""
    obstore = _require_obstore()
    transport = ObstoreTransport()
    for name in names:
        store, key = transport.locate(join(url, name))
        target = local / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            result = obstore.get(store, key)
            with open(target, "wb") as out:
                for piece in result.stream(min_chunk_size=STREAM_CHUNK):
                    out.write(memoryview(piece))
        except OSError:
            raise
        except BaseException as exc:
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise classify(exc) from exc


def delete_prefix(url: str) -> list[str]:
    """Delete every object under ``url/`` (best effort). Returns the keys that could not
    be listed or deleted (empty when everything is gone)."""
    obstore = _require_obstore()
    transport = ObstoreTransport()
    store, prefix = transport.locate(join(url, ""))
    try:
        keys = [m["path"] for batch in obstore.list(store, prefix) for m in batch]
    except BaseException:
        return [prefix + "*"]
    return _delete_quietly(obstore, store, keys)
