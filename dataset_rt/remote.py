"""Caches on object storage (``s3://``, ``gs://``, ``az://``, ...): the obstore transport
the native core fetches through, where the local copies live, and uploads.

The core decides everything about correctness (``native/src/io/remote.zig``): which
objects to fetch, their sizes and SHA-256 against the manifest, the shard cache and its
budget, retries. This module only moves bytes with the ``obstore`` client (the
``dataset-rt-zig[remote]`` extra) and classifies its errors, and uploads a cache built
locally (``manifest.json`` last: its presence publishes the cache; never replacing an
existing one; one writer per URL at a time, by a lock object).

Credentials and endpoints come from the environment, as obstore and the cloud CLIs take
them (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``,
``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``; ``GOOGLE_APPLICATION_CREDENTIALS``;
``AZURE_STORAGE_ACCOUNT_NAME``, ...). The local directory is ``DATASET_RT_CACHE_DIR`` or
``$XDG_CACHE_HOME/dataset_rt`` (``~/.cache/dataset_rt``), the shard budget
``DATASET_RT_SHARD_CACHE_BYTES`` (default 16 GiB).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
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
    """``base/name`` for a URL (one slash; the ``://`` of ``scheme://`` is kept)."""
    scheme, sep, rest = base.partition("://")
    if not sep:
        return base.rstrip("/") + "/" + name
    return f"{scheme}://{rest.rstrip('/')}/{name}"


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
                try:
                    store = from_url(root, client_options=options, retry_config={"max_retries": 0})
                except Exception as exc:  # an unknown scheme, no bucket: one line, no dump
                    raise classify(exc) from exc
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
    # (A list request to a missing bucket is a generic error naming S3's code.)
    if isinstance(exc, (FileNotFoundError, ox.NotFoundError)) or "NoSuchBucket" in text:
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
_PRIVATE_REMOTES: list[_native.Remote] = []


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


def private(cache_dir: str | os.PathLike[str]) -> _native.Remote:
    """A transport over ``cache_dir`` for one caller alone, not shared with
    :func:`remote`'s callers (``dataset-rt verify`` fetches into a directory of its own).
    Kept for the life of the process like theirs (a fetch ahead may call back after the
    last dataset using it closes); the directory may be removed once its datasets close."""
    _require_obstore()
    handle = _native.Remote.open(
        ObstoreTransport(), str(cache_dir), default_budget(), DEFAULT_RETRIES
    )
    with _REMOTES_LOCK:
        _PRIVATE_REMOTES.append(handle)
    return handle


def exists(url: str, transport: ObstoreTransport | None = None) -> bool:
    """Whether a cache is published at ``url`` (its ``manifest.json`` exists), asked
    through ``transport`` (default: a new one). Raises ``RuntimeError`` naming ``url``
    when the store cannot say (credentials, a bad URL)."""
    obstore = _require_obstore()
    try:
        store, key = (transport or ObstoreTransport()).locate(join(url, "manifest.json"))
        obstore.head(store, key)
        return True
    except _native.RemoteError as exc:
        raise RuntimeError(f"cannot check {url}: {exc}") from exc
    except Exception as exc:
        error = classify(exc)
        if error.code == _native.RemoteCode.NOT_FOUND:
            return False
        raise RuntimeError(f"cannot check {url}: {_explain(url, error)}") from exc


def leftovers(url: str, transport: ObstoreTransport | None = None) -> tuple[list[str], bool]:
    """Up to 3 keys of objects under ``url/`` other than a writer's upload lock (what an
    interrupted upload or another tool left where no cache is published: a write refuses
    such a prefix, as it refuses a local path that exists), and whether an upload lock is
    there. Raises ``RuntimeError`` naming ``url`` when the store cannot say."""
    obstore = _require_obstore()
    transport = transport or ObstoreTransport()
    try:
        store, prefix = transport.locate(join(url, ""))
        found: list[str] = []
        locked = False
        for batch in obstore.list(store, prefix, chunk_size=8):
            for meta in batch:
                if meta["path"] == prefix + UPLOAD_LOCK:
                    locked = True
                else:
                    found.append(meta["path"])
            if len(found) >= 3:
                break
        if found and not locked:
            try:
                obstore.head(store, prefix + UPLOAD_LOCK)
                locked = True
            except Exception as exc:
                if classify(exc).code != _native.RemoteCode.NOT_FOUND:
                    raise
        return found[:3], locked
    except _native.RemoteError as exc:
        raise RuntimeError(f"cannot check {url}: {exc}") from exc
    except Exception as exc:
        error = classify(exc)
        if error.code == _native.RemoteCode.NOT_FOUND:  # no bucket: nothing there
            return [], False
        raise RuntimeError(f"cannot check {url}: {_explain(url, error)}") from exc


def not_a_cache(url: str, keys: list[str]) -> str:
    """Why a write refuses ``url``: objects (``keys``, from :func:`leftovers`) but no
    ``manifest.json`` under it."""
    return (
        f"cache path already exists: {url} (it holds objects but no manifest.json, so it is "
        f"not a complete cache: {', '.join(keys)}{', ...' if len(keys) >= 3 else ''}); "
        f"delete them (for example: aws s3 rm --recursive {url}/) before writing this cache"
    )


def _explain(url: str, error: _native.RemoteError) -> str:
    """An upload's or a check's client error in words (as the core words a read's)."""
    if error.code == _native.RemoteCode.DENIED:
        return (
            f"access denied to {url}: the object store refused the credentials (check "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE, or "
            f"GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_* for other stores): {error}"
        )
    if error.code == _native.RemoteCode.NOT_FOUND:
        return f"the bucket of {url} does not exist: {error}"
    return str(error)


#: A staging directory of ``uploads/`` younger than this is never swept (its writer may
#: not hold its lock yet).
STAGING_GRACE_SECONDS = 60.0


@contextlib.contextmanager
def upload_staging() -> Iterator[Path]:
    """A new directory ``<local directory>/uploads/write-*`` where caches are built before
    their upload, removed on exit. Its writer holds a lock on it (``flock``) meanwhile:
    first, the directories of writers that died (their lock free, a minute old) are
    removed. Raises ``OSError`` when the local directory is unusable."""
    import fcntl
    import shutil
    import tempfile

    root = default_cache_dir() / "uploads"
    root.mkdir(parents=True, exist_ok=True)
    for entry in root.glob("write-*"):
        try:
            if time.time() - entry.lstat().st_mtime < STAGING_GRACE_SECONDS:
                continue
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass  # a live writer's
        finally:
            os.close(fd)
    staging = Path(tempfile.mkdtemp(prefix="write-", dir=root))
    try:
        fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        os.close(fd)


class UploadError(RuntimeError):
    """An upload failed; nothing was published (the message says what is left)."""


#: The object a writer holds under a cache's URL while it uploads the cache (created with
#: a conditional put, deleted when the upload ends): a second writer of the same URL stops
#: before uploading anything instead of overwriting the first one's objects.
UPLOAD_LOCK = ".dataset-rt-upload"


class _Cancelled(Exception):
    """The upload was told to stop (Ctrl-C in the thread that waits for it)."""


class _Upload:
    """One cache's upload (see :func:`upload_cache`), run on a thread of its own: a
    request in flight cannot be interrupted (obstore returns when it ends), so Ctrl-C is
    taken by the waiting thread, which tells this one to stop at the next request; this
    one then always deletes what it uploaded."""

    def __init__(self, local: Path, url: str) -> None:
        import socket
        import uuid

        self.obstore = _require_obstore()
        self.transport = ObstoreTransport()
        self.local, self.url = local, url
        self.cancel = threading.Event()
        self.done = threading.Event()
        #: Keys put, or being put (a put cut short may still have stored its object).
        self.touched: list[str] = []
        self.error: BaseException | None = None
        self.token = (
            f"{socket.gethostname()} pid {os.getpid()} "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {uuid.uuid4().hex}"
        ).encode()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def _run(self) -> None:
        url = self.url
        if exists(url, self.transport):
            raise FileExistsError(f"cache path already exists: {url}")
        store, lock_key = self.transport.locate(join(url, UPLOAD_LOCK))
        try:
            locked = self._put_create(store, lock_key, self.token)
        except _Cancelled as exc:
            self._delete(self.touched)
            raise UploadError(f"upload to {url} interrupted; nothing was uploaded") from exc
        except Exception as exc:
            self._delete(self.touched)
            message = _explain(url, classify(exc))
            raise UploadError(f"upload to {url} failed: {message}; nothing was uploaded") from exc
        if not locked:
            raise FileExistsError(self._locked_message(store, lock_key))
        # Whether the objects put belong to a cache another writer published meanwhile.
        theirs = False
        try:
            # Published between the check above and the lock (its writer has let go).
            if exists(url, self.transport):
                raise FileExistsError(f"cache path already exists: {url}")
            # Objects of an interrupted upload or of another tool: never written over.
            keys, _ = leftovers(url, self.transport)  # (the lock is this writer's)
            if keys:
                raise FileExistsError(not_a_cache(url, keys))
            for path in sorted(p for p in self.local.rglob("*") if p.is_file()):
                rel = path.relative_to(self.local).as_posix()
                if rel != "manifest.json":
                    self._put(*self.transport.locate(join(url, rel)), path)
            manifest = (self.local / "manifest.json").read_bytes()
            if not self._put_create(store, self._key("manifest.json"), manifest):
                # Only past a writer that ignored the lock (or deleted it).
                theirs = True
                raise FileExistsError(
                    f"cache path already exists: {url} (published by another writer during "
                    f"this upload, past its lock {url}/{UPLOAD_LOCK}); the objects were left "
                    f"as they are: check the cache with `dataset-rt verify {url}`"
                )
        except BaseException as exc:
            # The lock goes last: until it is gone, no other writer starts putting the
            # keys this cleanup deletes.
            uploaded = [key for key in self.touched if key != lock_key]
            left = [] if theirs else self._delete(uploaded)
            left += self._delete([lock_key])
            if isinstance(exc, FileExistsError) and (theirs or not uploaded):
                raise
            detail = (
                "nothing was published (no manifest.json); the objects uploaded were deleted"
                if not left
                else "nothing was published (no manifest.json), but these objects are left "
                f"behind under {url}: {', '.join(left)}; delete them (for example: aws s3 "
                f"rm --recursive {url}/) before writing this cache again"
            )
            if isinstance(exc, _Cancelled):
                raise UploadError(f"upload of {self.local} to {url} interrupted; {detail}") from exc
            client = _is_client_error(exc)
            message = _explain(url, classify(exc)) if client else exc
            raise UploadError(
                f"upload of {self.local} to {url} failed: {message}; {detail}"
            ) from exc
        # Published: a lock left behind by a failed delete is harmless (the next writer
        # finds the cache first).
        self._delete([lock_key])

    def _key(self, rel: str) -> str:
        return self.transport.locate(join(self.url, rel))[1]

    def _locked_message(self, store: Any, lock_key: str) -> str:
        """Why the lock could not be had: the cache was published meanwhile, or another
        writer holds it (or died holding it)."""
        if exists(self.url, self.transport):
            return f"cache path already exists: {self.url}"
        try:
            holder = bytes(self.obstore.get(store, lock_key).bytes()).decode(errors="replace")
        except Exception:
            holder = "unknown writer"
        lock = f"{self.url}/{UPLOAD_LOCK}"
        return (
            f"cache path {self.url} is being written by another writer ({holder}, holding "
            f"{lock}); nothing was uploaded. If no writer is running (one was killed), "
            f"delete what it left (for example: aws s3 rm --recursive {self.url}/) and "
            "write again"
        )

    def _put(self, store: Any, key: str, path: Path) -> None:
        """Put the file ``path`` at ``key`` (retried with backoff on transient errors)."""
        self.touched.append(key)
        self._retrying(lambda: _put_file(self.obstore, store, key, path))

    def _put_create(self, store: Any, key: str, data: bytes) -> bool:
        """Put ``data`` at ``key`` only if no object is there (retried with backoff on
        transient errors). False when another object is there (a retried put that
        stored ``data`` before its answer was lost counts as done)."""
        from obstore import exceptions as ox

        self.touched.append(key)
        try:
            self._retrying(lambda: self.obstore.put(store, key, data, mode="create"))
            return True
        except (ox.AlreadyExistsError, ox.PreconditionError, FileExistsError):
            try:
                ours = bytes(self.obstore.get(store, key).bytes()) == data
            except Exception:
                ours = False
            if not ours:
                self.touched.pop()  # another writer's object: never deleted here
            return ours

    def _retrying(self, request: Callable[[], Any]) -> None:
        """``request()``, again after transient failures (the reads' policy: up to
        :data:`DEFAULT_RETRIES` more attempts, backing off 0.1 s, doubling, <= 2 s);
        :class:`_Cancelled` once the upload is told to stop."""
        for attempt in range(DEFAULT_RETRIES + 1):
            if self.cancel.is_set():
                raise _Cancelled
            try:
                request()
                return
            except Exception as exc:
                if _is_client_error(exc) and classify(exc).code == _native.RemoteCode.RETRY:
                    if attempt < DEFAULT_RETRIES and not self.cancel.wait(
                        min(0.1 * 2**attempt, 2.0)
                    ):
                        continue
                raise

    def _delete(self, keys: Iterable[str]) -> list[str]:
        store = self.transport.locate(join(self.url, ""))[0]
        return _delete_quietly(self.obstore, store, keys)


def _is_client_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the object-store client, not from reading local files
    (obstore raises builtin ``OSError`` subclasses too, always with its debug text)."""
    return not isinstance(exc, OSError) or "Debug source:" in str(exc)


def upload_cache(local: Path, url: str) -> None:
    """Upload the complete local cache ``local`` to ``url``.

    Holding the lock object ``<url>/.dataset-rt-upload`` (a conditional put: a second
    writer of the same URL fails at once, naming the holder), every file except
    ``manifest.json`` is put, then ``manifest.json`` with a conditional put (create only):
    its presence publishes the cache; then the lock is deleted. Transient failures are
    retried with backoff. An existing cache at ``url`` is never replaced
    (``FileExistsError``). On failure, or on ``KeyboardInterrupt``/``SystemExit`` (taken
    between requests: one in flight ends first), the objects put are deleted (best
    effort) and the error lists any that remain (``UploadError``; the interrupt itself is
    raised unchanged after the cleanup)."""
    upload = _Upload(local, url)
    worker = threading.Thread(target=upload.run, name="dataset-rt-upload", daemon=True)
    worker.start()
    interrupt: BaseException | None = None
    # Not Thread.join: an interrupt inside it can mark a running thread stopped (3.11).
    while not upload.done.is_set():
        try:
            upload.done.wait(0.25)
        except (KeyboardInterrupt, SystemExit) as exc:
            if interrupt is None:
                interrupt = exc
                upload.cancel.set()
                sys.stderr.write(
                    f"dataset-rt: interrupted; the upload to {url} stops after the request "
                    "in flight and deletes what it uploaded\n"
                )
    if interrupt is not None:
        raise interrupt
    if upload.error is not None:
        raise upload.error


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
