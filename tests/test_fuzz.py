"""Fuzzing corrupted caches: no crash, no hang, no wrong bytes, only clear errors.

Two tests, both on copies of small caches (reference fixtures and caches written here):

* ``test_random_mutants_fail_cleanly``: seeded random mutants (bit flips, byte
  overwrites, truncation, extension, and structure-aware edits of ``index.bin`` rows,
  record length prefixes and LZ4 size prefixes; half of them with the manifest's
  checksums and sizes fixed up so that ``validate_cache=True`` gets past the SHA-256 check
  and exercises the deeper checks) of ``manifest.json``, ``index.bin``, ``metadata.arrow``
  and the shards. Each mutant is loaded with ``validate_cache`` False and True and fully
  read: ordered iteration, ``iter_batches``, ``get_item`` of every sample (and one past
  the end) and ``get_metadata``. Accepted outcomes: success, or ``ValueError``,
  ``RuntimeError``, ``IndexError`` or ``OverflowError`` (exactly these types, not
  subclasses such as ``UnicodeDecodeError``) with a non-empty message. When a read
  succeeds, the payload must be the bytes the (possibly corrupted) ``index.bin`` row
  points to, computed here from the record layout (``u64 LE json_len``, JSON, payload),
  and the metadata must be the record's embedded JSON where that JSON determines it; for
  LZ4 the payload must be as long as its size prefix says and equal a strict LZ4 block
  decoding whenever that decoding exists. A read the record layout makes impossible
  (range outside the shard, ``json_len`` past the record, JSON that is not an object of
  the schema's keys and kinds) must fail. Batches take their metadata from
  ``metadata.arrow`` (docs/compatibility.md): without ``validate_cache`` their metadata
  must be its row as pyarrow reads it and the JSON's claims do not apply to them.
* ``test_validate_cache_detects_every_single_byte_change``: with ``validate_cache=True``,
  every single-byte change to any file of a cache is detected when the cache is loaded,
  except the manifest edits that are undetectable by design (see ``classify_manifest``).
* Deterministic companions, independent of the seed, with the same checks:
  ``test_boundary_records_fail_cleanly`` (empty, short, overflowing and out-of-file index
  rows and ``json_len`` prefixes at the first record, a read-ahead batch boundary and the
  last record) and ``test_metadata_arrow_field_names_fail_cleanly`` (damaged field names
  in ``metadata.arrow``).

Every load and read runs in a worker subprocess (one long-lived interpreter fed through a
pipe), so a crash of the interpreter (a Zig panic, a segfault, an abort) is reported as a
failure naming the mutant, and the worker is restarted; a mutant that takes longer than
``MUTANT_TIMEOUT_S`` is reported as a hang (with the worker's Python stacks, dumped by
``faulthandler`` on SIGUSR1) and the worker is killed and restarted.

Run length: the default (CI) run takes about half a minute. ``DATASET_RT_FUZZ_ITERATIONS=N``
runs N random mutants per cache (default 25), and makes the detection test try every byte
position of every file (the default run samples the positions of the larger files) with
N // 20 random byte values on top of the fixed set (N >= 5100: all 255 values at every
position; that takes hours for the larger fixtures). ``DATASET_RT_FUZZ_SEED`` changes the
seed (default 20250601); a failure report names the seed and the mutant.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES, copy_writable, io_uring_available

ROOT = Path(__file__).resolve().parents[1]

ITERATIONS_ENV = "DATASET_RT_FUZZ_ITERATIONS"
SEED_ENV = "DATASET_RT_FUZZ_SEED"
LONG_ITERATIONS = int(os.environ.get(ITERATIONS_ENV, "0") or 0)
SEED = int(os.environ.get(SEED_ENV, "20250601"))
RANDOM_MUTANTS = LONG_ITERATIONS or 25  # per cache
EXTRA_VALUES_PER_POSITION = min(LONG_ITERATIONS // 20, 255)  # detection test, besides the fixed set
MUTANT_TIMEOUT_S = 10.0  # a normal mutant takes milliseconds
WORKER_START_TIMEOUT_S = 120.0
ALLOWED_ERRORS = ("ValueError", "RuntimeError", "IndexError", "OverflowError")
MAX_REPORTED = 10**6 if LONG_ITERATIONS else 25  # failures listed in an assertion message
# The worker needs about 200 MiB; reading a mutant of a cache of a few KiB must not take 1 GiB.
MAX_WORKER_RSS_KIB = 1 << 20

# ------------------------------------------------------------------------ the worker

WORKER_SOURCE = r'''
import faulthandler, hashlib, json, os, resource, signal, sys
faulthandler.enable()
faulthandler.register(signal.SIGUSR1, all_threads=True)
import dataset_rt as drt
import polars, pyarrow  # imported up front so the first mutant is not slow

runtime = drt.DatasetRuntime(num_workers=2)
REPLIES = int(sys.argv[1])  # the reply pipe (not stdout: nothing else may write into it)
ADDRESS_SPACE_HEADROOM = 1 << 30


def send(obj):
    view = memoryview((json.dumps(obj) + "\n").encode())
    while view:
        view = view[os.write(REPLIES, view):]


def err(exc):
    cls = type(exc)
    name = cls.__qualname__
    if cls.__module__ != "builtins":
        name = f"{cls.__module__}.{name}"
    return [name, str(exc)]


def sample(s):
    meta = [[k, v] for k, v in s.metadata.items()]
    return [s.cache_id, s.sample_id, hashlib.sha256(s.data).hexdigest(), len(s.data), meta]


def consume(iterator, limit):
    got = []
    try:
        for s in iterator:
            got.append(sample(s))
            if len(got) >= limit:
                break
    except Exception as exc:
        return {"samples": got, "error": err(exc)}
    return {"samples": got, "error": None}


def consume_batches(ds, limit):
    got = []
    try:
        for batch in ds.iter_batches(7):
            rows = batch.metadata.to_dicts()
            for i in range(len(batch)):
                data = batch.payload(i)
                meta = [[k, v] for k, v in rows[i].items()]
                got.append([int(batch.cache_id[i]), int(batch.sample_id[i]),
                            hashlib.sha256(data).hexdigest(), len(data), meta])
            if len(got) >= limit:
                break
    except Exception as exc:
        return {"samples": got, "error": err(exc)}
    return {"samples": got, "error": None}


def item(ds, cache_id, sample_id):
    try:
        return {"sample": sample(ds.get_item(cache_id, sample_id)), "error": None}
    except Exception as exc:
        return {"sample": None, "error": err(exc)}


def read_job(job):
    runs = []
    for validate in (False, True):
        run = {"validate": validate}
        runs.append(run)
        config = drt.ReaderConfig(seed=0, shuffle=False, validate_cache=validate,
                                  io_backend=job["backend"], prefetch_size=job["prefetch"])
        try:
            ds = runtime.cached_dataset([job["cache"]], reader_config=config)
        except Exception as exc:
            run["load"] = err(exc)
            continue
        run["load"] = None
        info = ds._handle.cache_info(0)  # the binding's drt_dataset_cache_info
        cache_id, count = info.cache_id, info.sample_count
        run["cache_id"], run["sample_count"], run["len"] = cache_id, count, len(ds)
        limit = job["limit"]
        run["iter"] = consume(iter(ds), limit)
        run["batches"] = consume_batches(ds, limit)
        run["items"] = [item(ds, cache_id, i) for i in range(min(count, limit))]
        run["past_end"] = item(ds, cache_id, count)
        try:
            df = ds.get_metadata()
            run["metadata"] = {"shape": list(df.shape), "error": None}
        except Exception as exc:
            run["metadata"] = {"shape": None, "error": err(exc)}
        del ds
    return {"runs": runs}


def detect_job(job):
    """Single-byte changes applied in place, one reply line per change."""
    config = drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True, io_backend=job["backend"])
    fd = os.open(job["file"], os.O_RDWR)
    try:
        for i, (pos, value) in enumerate(job["mutants"]):
            old = os.pread(fd, 1, pos)
            os.pwrite(fd, bytes([value]), pos)
            reply = {"i": i, "load": None, "read": None}
            try:
                try:
                    ds = runtime.cached_dataset([job["cache"]], reader_config=config)
                except Exception as exc:
                    reply["load"] = err(exc)
                else:
                    try:
                        next(iter(ds))
                    except Exception as exc:
                        reply["read"] = err(exc)
                    del ds
            finally:
                os.pwrite(fd, old, pos)
            send(reply)
    finally:
        os.close(fd)


def crash_job(job):
    if job["how"] == "abort":
        os.abort()
    import time
    time.sleep(3600)


# Warm up (polars and pyarrow reserve address space on first use), then allow 1 GiB more:
# a mutant of a cache of a few KiB that needs more allocates from corrupt sizes, and the
# MemoryError says so at once (without the limit it takes seconds and gigabytes of RAM).
read_job({"cache": sys.argv[2], "backend": "threads", "prefetch": 64, "limit": 10})
with open("/proc/self/status") as status:
    vm_size_kib = int(next(l for l in status if l.startswith("VmSize:")).split()[1])
limit = (vm_size_kib << 10) + ADDRESS_SPACE_HEADROOM
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
send({"ready": os.getpid()})
for line in sys.stdin:
    job = json.loads(line)
    if job["op"] == "read":
        reply = read_job(job)
        reply["max_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        send(reply)
    elif job["op"] == "detect":
        detect_job(job)
    else:
        crash_job(job)
'''


class WorkerDied(Exception):
    """The worker crashed or hung while handling reply number ``index`` of a request."""

    def __init__(self, kind: str, index: int, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.index = index
        self.detail = detail


class Worker:
    """One long-lived interpreter that loads and reads caches on request.

    ``request(job, replies)`` sends one JSON job and collects ``replies`` JSON lines, each
    within ``timeout`` seconds. A dead worker (crash) or a silent one (hang: its Python
    stacks are dumped to its stderr first) raises :class:`WorkerDied` with the index of
    the reply that never came, and the worker is replaced.
    """

    def __init__(self, timeout: float = MUTANT_TIMEOUT_S) -> None:
        self.timeout = timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        self.stderr = tempfile.TemporaryFile()
        read_end, write_end = os.pipe()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER_SOURCE,
                str(write_end),
                str(FIXTURES / "text_records_v1"),
            ],
            stdin=subprocess.PIPE,
            stdout=self.stderr,
            stderr=self.stderr,
            cwd=ROOT,
            pass_fds=[write_end],
        )
        os.close(write_end)
        self.replies = read_end
        self.buffer = b""
        self.eof = False
        ready = self._read_line(WORKER_START_TIMEOUT_S)
        if ready is None or "ready" not in json.loads(ready):
            raise RuntimeError(f"fuzz worker did not start: {self._stderr_tail()}")

    def _stderr_tail(self, limit: int = 3000) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode("utf-8", "replace")
        return text[-limit:]

    def _read_line(self, timeout: float) -> str | None:
        """The next line, or None if the worker died (``self.eof``) or stayed silent for
        ``timeout``."""
        fd = self.replies
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    return None
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    self.eof = True
                    return None
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode("utf-8")

    def request(self, job: dict[str, Any], replies: int = 1) -> list[Any]:
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(job).encode() + b"\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # reported below as a dead worker
        out = []
        for index in range(replies):
            line = self._read_line(self.timeout)
            if line is None:
                raise self._died(index)
            out.append(json.loads(line))
        return out

    def _died(self, index: int) -> WorkerDied:
        assert self.process is not None
        code = None
        if self.eof:  # reply pipe closed: the worker is exiting (a core dump may take a while)
            try:
                code = self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pass
        if code is None:
            kind = f"hang (no reply within {self.timeout:.0f} s)"
            self.process.send_signal(signal.SIGUSR1)  # faulthandler: dump every stack
            time.sleep(0.5)
            self.process.kill()
            self.process.wait()
        else:
            kind = f"crash (worker exit status {code}" + (
                f", signal {signal.Signals(-code).name})" if code < 0 else ")"
            )
        detail = self._stderr_tail()
        self.restart()
        return WorkerDied(kind, index, f"{kind}; worker stderr:\n{detail}")

    def restart(self) -> None:
        """A fresh worker (after a crash or hang, or to reset its peak RSS)."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.restarts += 1
        os.close(self.replies)
        self.stderr.close()
        self._start()

    def close(self) -> None:
        if self.process is not None:
            if self.process.stdin is not None:
                self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        os.close(self.replies)
        self.stderr.close()


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    w = Worker()
    yield w
    w.close()


@pytest.fixture(scope="module")
def backends() -> list[str]:
    """Mutants alternate between the read backends (io_uring only where the kernel allows it)."""
    return ["threads", "io_uring"] if io_uring_available() else ["threads"]


# ------------------------------------------------------------- caches written here


def _tiny_samples(compressible: bool) -> list[tuple[bytes, dict[str, Any]]]:
    rng = random.Random(7)
    names = [
        "",
        'quote " backslash \\ slash /',
        "line\nbreak\ttab\x01\x1f\x7f",
        "é中😀\u2028",
        "x" * 40,
    ]
    scores = [0.0, -0.0, 0.1, 5e-324, 1.7976931348623157e308, -2.5e-10, 1e16]
    labels = [-(2**63), 2**63 - 1, 0, -1, 123456789]
    out = []
    for i in range(7):
        if compressible:
            data = (b"abcabcabd" * (i * 9))[: i * 70] + bytes(
                rng.randrange(256) for _ in range(i % 3 * 5)
            )
        else:
            data = bytes(rng.randrange(256) for _ in range([0, 1, 9, 64, 200, 3, 31][i]))
        metadata = {
            "flag": i % 2 == 0,
            "label": labels[i % len(labels)],
            "name": names[i % len(names)],
            "score": scores[i % len(scores)],
        }
        out.append((data, metadata))
    return out


class _Source:
    def __init__(self, name: str, samples: list[tuple[bytes, dict[str, Any]]]) -> None:
        self.name = name
        self.samples = samples

    def __iter__(self) -> Iterator[Any]:
        import dataset_rt as drt

        for data, metadata in self.samples:
            yield drt.CacheInput(data, metadata)


@pytest.fixture(scope="module")
def written_caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small caches written by this project: several shards, every kind, odd values."""
    import dataset_rt as drt

    base = tmp_path_factory.mktemp("fuzz-written")
    runtime = drt.DatasetRuntime(num_workers=2)
    specs = {
        "tiny_plain": (drt.ShardCompression(), _tiny_samples(False), 160),
        "tiny_lz4": (drt.ShardCompression(algo="lz4", ratio=2.0), _tiny_samples(True), 240),
    }
    out = {}
    for name, (compression, samples, shard_bytes) in specs.items():
        config = drt.WriterConfig(
            show_progress=False, max_shard_bytes=shard_bytes, shard_compression=compression
        )
        [result] = runtime.write_cache(_Source(name, samples), base, writer_config=config)
        assert isinstance(result, drt.CacheWriteSuccess), result
        out[name] = base / name
    # The same plain cache as a format-2 manifest (no cache_id: the id is the position).
    v2 = copy_writable(out["tiny_plain"], base / "tiny_v2")
    manifest = json.loads((v2 / "manifest.json").read_bytes())
    manifest = {
        "format_version": 2,
        **{k: v for k, v in manifest.items() if k not in ("format_version", "cache_id")},
    }
    (v2 / "manifest.json").write_text(
        json.dumps(manifest, indent=2, ensure_ascii=False), encoding="utf-8"
    )
    out["tiny_v2"] = v2
    return out


def cache_source(name: str, written: dict[str, Path]) -> Path:
    return written[name] if name in written else FIXTURES / name


def cache_files(cache: Path) -> list[str]:
    """Every file of a cache, relative to it (manifest first)."""
    rest = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())
    rest.remove("manifest.json")
    return ["manifest.json", *rest]


# ----------------------------------------------------------------- strict JSON oracle


class _NotStrictJson(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _NotStrictJson(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise _NotStrictJson(f"{name} is not JSON")


def strict_json(raw: bytes) -> Any:
    """RFC 8259 JSON as serde_json reads it: UTF-8, no NaN/Infinity, no duplicate keys.

    Raises ValueError (UnicodeDecodeError, JSONDecodeError or _NotStrictJson) otherwise.
    """
    return json.loads(
        raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constants
    )


def _is_u64(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**64


def _canonical_manifest(manifest: Any, *, ignore_schema_names: bool) -> str:
    """The manifest with every value that loading ignores (by design) blanked out."""
    m = copy.deepcopy(manifest)
    if isinstance(m, dict):
        version = m.get("format_version")
        if type(version) is int and version in (2, 3):
            # 3 -> 2 is accepted by the reference: the cache loads as format 2, whose id is
            # its position in `paths` (any cache_id key is ignored). In format 3 any u64
            # is accepted: the id is not checked against the source name.
            m["format_version"] = "<2 or 3>"
            if version == 2 or _is_u64(m.get("cache_id")):
                m["cache_id"] = "<ignored or u64>"
        # source_name: informational, never compared with anything.
        if isinstance(m.get("source_name"), str):
            m["source_name"] = "<str>"
        for shard in m.get("shards") or []:
            if not isinstance(shard, dict):
                continue
            # uncompressed_byte_len: nothing reads it (any u64).
            if _is_u64(shard.get("uncompressed_byte_len")):
                shard["uncompressed_byte_len"] = "<u64>"
            compression = shard.get("compression")
            # ratio: advisory (any finite JSON number, also with algo "none").
            if isinstance(compression, dict):
                ratio = compression.get("ratio")
                if type(ratio) in (int, float) and math.isfinite(ratio):
                    compression["ratio"] = "<f64>"
        if ignore_schema_names:
            for entry in m.get("metadata_schema") or []:
                if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                    entry["name"] = "<str>"
    return json.dumps(m, sort_keys=True)


def classify_manifest(original: bytes, mutated: bytes) -> str:
    """How a validate_cache=True load must treat a changed manifest.

    * ``"identical"``: undetectable by design, and the cache must load and read: changes
      that keep the JSON semantically identical (whitespace for whitespace: space, tab,
      CR, LF), and changes the reference accepts on purpose because nothing checks the
      value: ``source_name`` (informational), ``cache_id`` (any u64; not checked against
      the name), ``format_version`` 3 -> 2 (a format-2 manifest: the id becomes the
      position in ``paths``), ``uncompressed_byte_len`` (never read) and the advisory
      compression ``ratio`` (any number). Unknown keys are ignored too, but a one-byte
      change cannot add a key without losing a required one (every field is required).
    * ``"schema_rename"``: a metadata schema field's *name* changed (and nothing else).
      The reference checks ``metadata.arrow`` against the manifest schema by position and
      kind only, so the load succeeds; the change is detected by the first read (the
      record's JSON lacks the renamed key). So: detected at load or at the first read.
    * ``"detect"``: everything else, including anything that is not strict JSON (serde:
      UTF-8, no duplicate keys), every changed SHA-256 digit (also a lowercase hex digit
      made uppercase: the reference compares the strings), sizes, counts, names, kinds.
    """
    try:
        parsed = strict_json(mutated)
    except ValueError:
        return "detect"
    before = strict_json(original)
    if _canonical_manifest(parsed, ignore_schema_names=False) == _canonical_manifest(
        before, ignore_schema_names=False
    ):
        return "identical"
    if _canonical_manifest(parsed, ignore_schema_names=True) == _canonical_manifest(
        before, ignore_schema_names=True
    ):
        return "schema_rename"
    return "detect"


# ----------------------------------------------------------- record layout oracle


def lz4_block_decode(src: bytes, size: int) -> bytes | None:
    """Strict LZ4 block decoding to exactly ``size`` bytes, or None if impossible."""
    out = bytearray()
    i, n = 0, len(src)

    def length(start: int) -> int | None:
        nonlocal i
        total = start
        if start == 15:
            while True:
                if i >= n:
                    return None
                byte = src[i]
                i += 1
                total += byte
                if byte != 255:
                    break
        return total

    while True:
        if i >= n:
            return None
        token = src[i]
        i += 1
        literals = length(token >> 4)
        if literals is None or i + literals > n or len(out) + literals > size:
            return None
        out += src[i : i + literals]
        i += literals
        if i == n:
            break  # the last sequence has literals only
        if i + 2 > n:
            return None
        offset = src[i] | src[i + 1] << 8
        i += 2
        if offset == 0 or offset > len(out):
            return None
        match = length(token & 15)
        if match is None:
            return None
        match += 4
        if len(out) + match > size:
            return None
        for _ in range(match):
            out.append(out[-offset])
    return bytes(out) if len(out) == size else None


@dataclass
class Expected:
    """What reading one index row may return."""

    must_fail: str | None = None  # why any successful read is wrong
    payload_sha: str | None = None  # exact payload, when known
    payload_len: int | None = None  # exact payload length, when known
    metadata: dict[str, Any] | None = None  # field -> exact value (fields it determines)
    keys: list[str] = field(default_factory=list)
    # must_fail and metadata come from the embedded JSON (not the record's structure).
    from_json: bool = False


def _expected_metadata(raw: bytes, schema: list[tuple[str, str]]) -> Expected:
    """What a record's embedded JSON determines about CachedSample.metadata."""
    try:
        parsed = strict_json(raw)
    except _NotStrictJson:
        return Expected()  # serde may differ (duplicate keys): no claim
    except ValueError as exc:
        return Expected(must_fail=f"embedded JSON is not JSON ({exc})")
    if not isinstance(parsed, dict):
        return Expected(must_fail="embedded JSON is not an object")
    names = [name for name, _ in schema]
    if sorted(parsed) != sorted(names):
        return Expected(
            must_fail=f"embedded keys {sorted(parsed)} are not the schema's {sorted(names)}"
        )
    values: dict[str, Any] = {}
    for name, kind in schema:
        value = parsed[name]
        if kind == "bool":
            if type(value) is not bool:
                return Expected(must_fail=f"field {name!r} is not a bool: {value!r}")
            values[name] = value
        elif kind == "string":
            if type(value) is not str:
                return Expected(must_fail=f"field {name!r} is not a string: {value!r}")
            if not any(0xD800 <= ord(c) <= 0xDFFF for c in value):  # lone surrogates: no claim
                values[name] = value
        elif kind == "int":
            if type(value) is not int or not -(2**63) <= value < 2**63:
                return Expected(must_fail=f"field {name!r} is not an int64: {value!r}")
            values[name] = value
        elif kind == "float":
            if type(value) in (bool, str, list, dict):
                return Expected(must_fail=f"field {name!r} is not a number: {value!r}")
            # null: the value comes from metadata.arrow; int: serde reads "-0" as a float;
            # out-of-range exponents: serde refuses, Python gives inf. No claim for those.
            if type(value) is float and math.isfinite(value):
                values[name] = value
    return Expected(metadata=values, keys=names)


@dataclass
class Oracle:
    """Expected outcome of reading every row of a (mutated) cache, from its files."""

    manifest_error: str | None  # the manifest is not usable JSON: the load must fail
    rows: list[Expected]
    cache_id: int | None = None
    sample_count: int | None = None
    # metadata.arrow's rows as pyarrow reads them (field -> value, schema names by
    # position), or None when pyarrow cannot read it or its columns are not the schema's.
    arrow_rows: list[dict[str, Any]] | None = None

    def batch_row(self, position: int, validate: bool) -> Expected:
        """What a batch (metadata from metadata.arrow, DRT_BATCH_STORED_METADATA) may
        return for a row: without validate_cache the embedded JSON is not parsed, so its
        claims give way to metadata.arrow's row (a row holding a null still takes the
        JSON's values); with validate_cache the JSON is parsed and compared as per sample."""
        want = self.rows[position]
        if validate or not want.from_json:
            return want
        arrow = (
            self.arrow_rows[position]
            if self.arrow_rows is not None and position < len(self.arrow_rows)
            else None
        )
        if arrow is not None and None in arrow.values():
            return want
        return Expected(
            payload_sha=want.payload_sha,
            payload_len=want.payload_len,
            metadata=arrow,
            keys=want.keys,
        )


def build_oracle(cache: Path) -> Oracle:
    try:
        manifest = strict_json((cache / "manifest.json").read_bytes())
        schema = [(f["name"], f["kind"]) for f in manifest["metadata_schema"]]
        shards = [(s["name"], s["compression"]["algo"]) for s in manifest["shards"]]
        version = manifest["format_version"]
        cache_id = 0 if version == 2 else manifest["cache_id"]
        sample_count = manifest["sample_count"]
    except FileNotFoundError:
        return Oracle("manifest.json is missing", [])
    except (ValueError, KeyError, TypeError) as exc:
        return Oracle(f"manifest is not a usable strict-JSON manifest ({exc!r})", [])
    index = (cache / "index.bin").read_bytes() if (cache / "index.bin").exists() else b""
    shard_bytes: dict[str, bytes | None] = {}
    rows = []
    for i in range(len(index) // 24):
        shard_id, offset, length = struct.unpack_from("<QQQ", index, 24 * i)
        rows.append(_expected_row(cache, shards, shard_bytes, schema, shard_id, offset, length))
    return Oracle(None, rows, cache_id, sample_count, _arrow_rows(cache, schema))


def _arrow_rows(cache: Path, schema: list[tuple[str, str]]) -> list[dict[str, Any]] | None:
    import pyarrow as pa

    types = {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "string": pa.string()}
    try:
        data = (cache / "metadata.arrow").read_bytes()
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
        # pyarrow trusts offsets until validated: an unchecked damaged column can crash
        # the test process in to_pylist.
        table.validate(full=True)
        if table.num_columns < len(schema):
            return None
        columns = []
        for i, (_, kind) in enumerate(schema):
            if table.schema.field(i).type != types.get(kind):
                return None
            columns.append(table.column(i).to_pylist())
    except Exception:  # any reader failure: no claim
        return None
    names = [name for name, _ in schema]
    return [dict(zip(names, values)) for values in zip(*columns)] if columns else None


def _expected_row(
    cache: Path,
    shards: list[tuple[str, str]],
    shard_bytes: dict[str, bytes | None],
    schema: list[tuple[str, str]],
    shard_id: int,
    offset: int,
    length: int,
) -> Expected:
    if shard_id >= len(shards):
        return Expected(must_fail=f"shard id {shard_id} is not in the manifest")
    name, algo = shards[shard_id]
    if name not in shard_bytes:
        path = cache / "shards" / name
        shard_bytes[name] = path.read_bytes() if "/" not in name and path.is_file() else None
    data = shard_bytes[name]
    if data is None:
        return Expected(must_fail=f"shard file {name!r} does not exist")
    if offset + length > len(data):
        return Expected(
            must_fail=f"record [{offset}, +{length}) is past the end of {name} ({len(data)} bytes)"
        )
    if length < 8:
        return Expected(must_fail=f"record length {length} < 8")
    record = data[offset : offset + length]
    (json_len,) = struct.unpack_from("<Q", record)
    if 8 + json_len > length:
        return Expected(must_fail=f"json_len {json_len} is past the record's end ({length} bytes)")
    expected = _expected_metadata(record[8 : 8 + json_len], schema)
    expected.from_json = True
    stored = record[8 + json_len :]
    if algo == "none":
        expected.payload_sha = hashlib.sha256(stored).hexdigest()
        expected.payload_len = len(stored)
    elif algo == "lz4":
        if len(stored) < 4:
            return Expected(must_fail=f"LZ4 payload of {len(stored)} bytes has no size prefix")
        (size,) = struct.unpack_from("<I", stored)
        expected.payload_len = size
        decoded = lz4_block_decode(stored[4:], size) if size <= 1 << 24 else None
        if decoded is not None:
            expected.payload_sha = hashlib.sha256(decoded).hexdigest()
    return expected


def _same_value(got: Any, want: Any) -> bool:
    if type(want) is float:
        return type(got) is float and struct.pack("<d", got) == struct.pack("<d", want)
    return type(got) is type(want) and got == want


def check_error(where: str, error: list[str] | None) -> list[str]:
    if error is None:
        return []
    kind, message = error
    problems = []
    if kind == "MemoryError":
        problems.append(
            f"{where}: MemoryError {message!r} (the worker may use 1 GiB more than it needs to"
            " start: an allocation sized from corrupt data?)"
        )
    elif kind not in ALLOWED_ERRORS:
        problems.append(f"{where}: unexpected exception type {kind}: {message!r}")
    elif not message.strip():
        problems.append(f"{where}: {kind} with an empty message")
    elif "(os error 14)" in message or "(os error 9)" in message:
        # EFAULT / EBADF: the kernel was handed a bad buffer address or descriptor.
        problems.append(
            f"{where}: {kind} {message!r}: a bad address or descriptor reached the kernel"
        )
    return problems


def check_sample(
    where: str, got: list[Any], want: Expected, cache_id: int, sample_id: int
) -> list[str]:
    got_cache, got_sample, sha, length, meta = got
    problems = []
    if (got_cache, got_sample) != (cache_id, sample_id):
        problems.append(
            f"{where}: identity ({got_cache}, {got_sample}) != ({cache_id}, {sample_id})"
        )
    if want.must_fail:
        return [*problems, f"{where}: read succeeded (len {length}) although {want.must_fail}"]
    if want.payload_len is not None and length != want.payload_len:
        problems.append(f"{where}: payload length {length}, the record says {want.payload_len}")
    elif want.payload_sha is not None and sha != want.payload_sha:
        problems.append(f"{where}: payload bytes differ from the bytes the index points to")
    values = dict(meta)
    if want.keys and [k for k, _ in meta] != want.keys:
        problems.append(
            f"{where}: metadata keys {[k for k, _ in meta]} != schema order {want.keys}"
        )
    for key, value in (want.metadata or {}).items():
        if key in values and not _same_value(values[key], value):
            problems.append(
                f"{where}: metadata {key!r} = {values[key]!r}, embedded JSON says {value!r}"
            )
    return problems


def check_read(reply: dict[str, Any], oracle: Oracle) -> list[str]:
    """Every problem with one mutant's worker reply (empty: the mutant passed)."""
    problems: list[str] = []
    plain, validated = reply["runs"]
    if plain["load"] is not None and validated["load"] is None:
        problems.append(f"loads with validate_cache=True but not without it ({plain['load']})")
    for run in reply["runs"]:
        tag = f"validate_cache={run['validate']}"
        if run["load"] is not None:
            problems += check_error(f"{tag} load", run["load"])
            continue
        if oracle.manifest_error is not None:
            problems.append(f"{tag}: load succeeded although the {oracle.manifest_error}")
            continue
        count = run["sample_count"]
        if count != len(oracle.rows) or count != oracle.sample_count:
            problems.append(
                f"{tag}: loaded with sample_count {count}; index.bin has {len(oracle.rows)} rows, "
                f"the manifest says {oracle.sample_count}"
            )
            continue
        if run["cache_id"] != oracle.cache_id:
            problems.append(f"{tag}: cache_id {run['cache_id']} != manifest's {oracle.cache_id}")
        if run["len"] != count:
            problems.append(f"{tag}: len(dataset) {run['len']} != sample_count {count}")
        cache_id = run["cache_id"]
        for mode in ("iter", "batches"):
            result = run[mode]
            problems += check_error(f"{tag} {mode}", result["error"])
            for position, got in enumerate(result["samples"]):
                want = (
                    oracle.batch_row(position, run["validate"])
                    if mode == "batches"
                    else oracle.rows[position]
                )
                problems += check_sample(f"{tag} {mode} #{position}", got, want, cache_id, position)
            if result["error"] is None and len(result["samples"]) != count:
                problems.append(f"{tag} {mode}: {len(result['samples'])} samples, expected {count}")
        for sample_id, result in enumerate(run["items"]):
            problems += check_error(f"{tag} get_item({sample_id})", result["error"])
            if result["sample"] is not None:
                problems += check_sample(
                    f"{tag} get_item({sample_id})",
                    result["sample"],
                    oracle.rows[sample_id],
                    cache_id,
                    sample_id,
                )
        past = run["past_end"]
        if past["error"] is None or past["error"][0] != "IndexError":
            problems.append(f"{tag}: get_item(cache_id, {count}) gave {past} instead of IndexError")
        problems += check_error(f"{tag} get_metadata", run["metadata"]["error"])
    return problems


# ------------------------------------------------------------------- random mutants

INTERESTING_U64 = [
    0,
    1,
    7,
    8,
    9,
    23,
    24,
    2**31 - 1,
    2**32 - 1,
    2**32,
    2**62,
    2**63 - 1,
    2**63,
    2**64 - 8,
    2**64 - 1,
]
INTERESTING_U32 = [0, 1, 2, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
INTERESTING_BYTES = [
    0x00,
    0x01,
    0x7F,
    0x80,
    0xFF,
    ord('"'),
    ord("\\"),
    ord("0"),
    ord("9"),
    ord("-"),
    ord("{"),
    ord("}"),
]


@dataclass
class Mutant:
    number: int
    backend: str
    fix_checksums: bool
    edits: list[str] = field(default_factory=list)

    def describe(self, cache: str) -> str:
        fixed = ", checksums fixed" if self.fix_checksums else ""
        return f"{cache} mutant #{self.number} (seed {SEED}, {self.backend}{fixed}): " + "; ".join(
            self.edits
        )


def _mutate_bytes(rng: random.Random, data: bytearray, rel: str) -> str:
    """One generic byte-level edit of ``data``; returns its description."""
    op = rng.choice(["flip", "byte", "run", "truncate", "extend"] if data else ["extend"])
    if op == "flip":
        pos, bit = rng.randrange(len(data)), rng.randrange(8)
        data[pos] ^= 1 << bit
        return f"{rel}: flip bit {bit} at {pos}"
    if op == "byte":
        pos = rng.randrange(len(data))
        value = rng.choice([*INTERESTING_BYTES, rng.randrange(256)])
        old, data[pos] = data[pos], value
        return f"{rel}: byte {pos} {old:#04x} -> {value:#04x}"
    if op == "run":
        pos = rng.randrange(len(data))
        run = bytes(rng.randrange(256) for _ in range(rng.randint(2, 16)))
        data[pos : pos + len(run)] = run[: len(data) - pos]
        return f"{rel}: overwrite {min(len(run), len(data) - pos)} bytes at {pos} with {run.hex()}"
    if op == "truncate":
        size = rng.choice([len(data) - 1, len(data) - rng.randint(1, 8), rng.randrange(len(data))])
        size = max(0, size)
        del data[size:]
        return f"{rel}: truncate to {size} bytes"
    extra = bytes(rng.choice([0, rng.randrange(256)]) for _ in range(rng.choice([1, 8, 24, 64])))
    data += extra
    return f"{rel}: append {extra.hex()}"


def _mutate_structured(
    rng: random.Random, files: dict[str, bytearray], names: list[str], lz4: bool
) -> str:
    """A structure-aware edit: an index field, a record's json_len or an LZ4 size prefix
    (of the files as edited so far; a generic edit of index.bin when they do not allow it)."""
    index = files["index.bin"]
    records = [struct.unpack_from("<QQQ", index, 24 * i) for i in range(len(index) // 24)]
    row = rng.randrange(len(records)) if records else None
    which = rng.choice(["index", "json_len", "lz4_size"] if lz4 else ["index", "json_len"])
    if row is None:
        return _mutate_bytes(rng, index, "index.bin")
    shard_id, offset, length = records[row]
    shard_rel = f"shards/{names[shard_id]}" if shard_id < len(names) else None
    shard = files.get(shard_rel) if shard_rel else None
    if which != "index" and (shard is None or offset + 8 > len(shard)):
        which = "index"
    if which == "index":
        column = rng.randrange(3)
        shard_size = len(shard) if shard is not None else 0
        old = records[row][column]
        value = rng.choice(
            [
                *INTERESTING_U64,
                shard_size,
                shard_size - 1,
                shard_size + 1,
                old - 1,
                old + 1,
                records[rng.randrange(len(records))][column],
            ]
        )
        value %= 2**64
        struct.pack_into("<Q", index, 24 * row + 8 * column, value)
        field_name = ("shard_id", "offset", "byte_len")[column]
        return f"index.bin: row {row} {field_name} {old} -> {value}"
    assert shard is not None
    (json_len,) = struct.unpack_from("<Q", shard, offset)
    at = offset + 8 + json_len
    if which == "json_len" or at + 4 > len(shard):
        extra = [length - 8, length - 7, json_len - 1, json_len + 1]
        value = rng.choice(INTERESTING_U64 + extra) % 2**64
        struct.pack_into("<Q", shard, offset, value)
        return f"{shard_rel}: record {row} json_len {json_len} -> {value}"
    (size,) = struct.unpack_from("<I", shard, at)
    value = rng.choice([*INTERESTING_U32, max(size - 1, 0), size + 1, 2 * size]) % 2**32
    struct.pack_into("<I", shard, at, value)
    return f"{shard_rel}: record {row} lz4 size {size} -> {value}"


def make_mutant(rng: random.Random, source: Path, target: Path, mutant: Mutant) -> None:
    """Copy ``source`` to ``target`` and apply 1-3 random edits (described in ``mutant``)."""
    copy_writable(source, target)
    files = {rel: bytearray((target / rel).read_bytes()) for rel in cache_files(target)}
    manifest = json.loads(files["manifest.json"])
    lz4 = any(s["compression"]["algo"] == "lz4" for s in manifest["shards"])
    edit_manifest = False
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        kind = rng.choices(["structured", "index", "arrow", "shard", "manifest"], [3, 2, 3, 3, 1])[
            0
        ]
        if kind == "structured":
            names = [shard["name"] for shard in manifest["shards"]]
            mutant.edits.append(_mutate_structured(rng, files, names, lz4))
        elif kind == "manifest":
            edit_manifest = True
        else:
            rel = {"index": "index.bin", "arrow": "metadata.arrow"}.get(kind) or rng.choice(
                [r for r in files if r.startswith("shards/")]
            )
            mutant.edits.append(_mutate_bytes(rng, files[rel], rel))
    if mutant.fix_checksums:
        # Make the SHA-256 digests and sizes match the edited files, so validate_cache=True
        # loads get past the checksum comparison into the structural and content checks.
        for shard in manifest["shards"]:
            data = files[f"shards/{shard['name']}"]
            shard["sha256"], shard["byte_len"] = hashlib.sha256(data).hexdigest(), len(data)
        manifest["index_sha256"] = hashlib.sha256(files["index.bin"]).hexdigest()
        manifest["metadata_sha256"] = hashlib.sha256(files["metadata.arrow"]).hexdigest()
        if len(files["index.bin"]) % 24 == 0:
            manifest["sample_count"] = len(files["index.bin"]) // 24
        files["manifest.json"] = bytearray(
            json.dumps(manifest, indent=2, ensure_ascii=False).encode()
        )
    if edit_manifest:
        mutant.edits.append(_mutate_bytes(rng, files["manifest.json"], "manifest.json"))
    if not mutant.edits:
        mutant.edits.append("no edit")
    for rel, data in files.items():
        (target / rel).write_bytes(bytes(data))


RANDOM_CACHES = [
    "plain_one_shard",
    "lz4_many_shards",
    "unicode_é_name",
    "tiny_plain",
    "tiny_lz4",
    "tiny_v2",
]


@pytest.mark.parametrize("name", RANDOM_CACHES)
def test_random_mutants_fail_cleanly(
    worker: Worker, backends: list[str], written_caches: dict[str, Path], tmp_path: Path, name: str
) -> None:
    source = cache_source(name, written_caches)
    rng = random.Random(f"{SEED}-{name}")
    failures: list[str] = []
    for number in range(RANDOM_MUTANTS):
        mutant = Mutant(number, backends[number % len(backends)], fix_checksums=rng.random() < 0.5)
        target = tmp_path / f"m{number}" / name
        make_mutant(rng, source, target, mutant)
        oracle = build_oracle(target)
        job = {
            "op": "read",
            "cache": str(target),
            "backend": mutant.backend,
            "prefetch": rng.choice([1, 3, 64]),
            "limit": 400,
        }
        try:
            [reply] = worker.request(job)
        except WorkerDied as died:
            failures.append(f"{mutant.describe(name)}\n  -> {died.detail}")
            continue
        problems = check_read(reply, oracle)
        if reply["max_rss_kib"] > MAX_WORKER_RSS_KIB:
            # Corrupt sizes (an LZ4 size prefix, a json_len) must be checked against what
            # the record can hold before anything is allocated for them.
            problems.append(
                f"worker peak RSS reached {reply['max_rss_kib'] // 1024} MiB reading this mutant"
            )
            worker.restart()  # resets the peak
        if problems:
            failures.append(f"{mutant.describe(name)}\n  -> " + "\n  -> ".join(problems[:8]))
        shutil.rmtree(target.parent)
    assert not failures, f"{len(failures)} of {RANDOM_MUTANTS} mutants failed:\n" + "\n".join(
        failures[:MAX_REPORTED]
    )


def _set_u64(data: bytearray, at: int, value: int) -> None:
    struct.pack_into("<Q", data, at, value % 2**64)


def _edge_edits(files: dict[str, bytearray], row: int, names: list[str]) -> dict[str, Any]:
    """Boundary values for one index row and its record (name -> edit of ``files``)."""
    index = files["index.bin"]
    shard_id, offset, length = struct.unpack_from("<QQQ", index, 24 * row)
    shard_rel = f"shards/{names[shard_id]}"
    size = len(files[shard_rel])
    (json_len,) = struct.unpack_from("<Q", files[shard_rel], offset)

    def index_field(column: int, value: int) -> Any:
        return lambda: _set_u64(index, 24 * row + 8 * column, value)

    def both(new_offset: int, new_length: int) -> Any:
        return lambda: (index_field(1, new_offset)(), index_field(2, new_length)())

    def record_json_len(value: int) -> Any:
        return lambda: _set_u64(files[shard_rel], offset, value)

    return {
        "byte_len 0": index_field(2, 0),
        "byte_len 1": index_field(2, 1),
        "byte_len 8": index_field(2, 8),
        "byte_len 2**64-1": index_field(2, 2**64 - 1),
        "byte_len to the shard's end + 1": index_field(2, size - offset + 1),
        "offset = shard size, byte_len 0": both(size, 0),
        "offset = shard size": index_field(1, size),
        "offset 2**63": index_field(1, 2**63),
        "offset 2**64-1": index_field(1, 2**64 - 1),
        "offset 2**64-8, byte_len 16": both(2**64 - 8, 16),
        "json_len 0": record_json_len(0),
        "json_len = byte_len - 8": record_json_len(length - 8),
        "json_len = byte_len - 7": record_json_len(length - 7),
        "json_len 2**63": record_json_len(2**63),
        "json_len 2**64-1": record_json_len(2**64 - 1),
        "json_len 2**64-8": record_json_len(2**64 - 8),
        "json_len + 1": record_json_len(json_len + 1),
    }


def read_edited(
    worker: Worker, job: dict[str, Any], target: Path, what: str, failures: list[str]
) -> None:
    """Read the edited cache ``target`` in the worker; record a crash, a hang or a wrong
    result under ``what``. The cache is removed afterwards, unless the worker died on it."""
    try:
        [reply] = worker.request(job)
    except WorkerDied as died:
        failures.append(f"{what}\n  -> {died.detail}")
        return
    problems = check_read(reply, build_oracle(target))
    if problems:
        failures.append(f"{what}\n  -> " + "\n  -> ".join(problems[:6]))
    shutil.rmtree(target.parent)


@pytest.mark.parametrize("name", ["plain_one_shard", "lz4_many_shards"])
def test_boundary_records_fail_cleanly(
    worker: Worker, backends: list[str], tmp_path: Path, name: str
) -> None:
    """Deterministic edge cases of the record layout (independent of the random seed):
    empty, short, overflowing and out-of-file index rows and json_len prefixes, on the
    first record, at a read-ahead batch boundary and on the last record."""
    source = FIXTURES / name
    names = [s["name"] for s in json.loads((source / "manifest.json").read_bytes())["shards"]]
    count = len((source / "index.bin").read_bytes()) // 24
    failures: list[str] = []
    number = 0
    # (row, prefetch_size): the first record, the first of the second read-ahead batch,
    # the last record; and the first record read one at a time.
    for row, prefetch in [(0, 64), (64, 64), (count - 1, 64), (0, 1)]:
        pristine = {rel: bytearray((source / rel).read_bytes()) for rel in cache_files(source)}
        for edit in _edge_edits(pristine, row, names):
            for backend in backends:
                target = copy_writable(source, tmp_path / f"e{number}" / name)
                number += 1
                files = {rel: bytearray(data) for rel, data in pristine.items()}
                _edge_edits(files, row, names)[edit]()
                for rel, data in files.items():
                    (target / rel).write_bytes(bytes(data))
                job = {
                    "op": "read",
                    "cache": str(target),
                    "backend": backend,
                    "prefetch": prefetch,
                    "limit": 400,
                }
                what = f"{name} row {row}: {edit} ({backend}, prefetch_size={prefetch})"
                read_edited(worker, job, target, what, failures)
    assert not failures, f"{len(failures)} of {number} edge cases failed:\n" + "\n".join(
        failures[:MAX_REPORTED]
    )


@pytest.mark.parametrize("name", ["plain_one_shard", "tiny_plain"])
def test_metadata_arrow_field_names_fail_cleanly(
    worker: Worker, written_caches: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """Deterministic edits of the field names stored in metadata.arrow (schema message and
    footer): invalid UTF-8, a NUL, another letter; with the manifest's metadata_sha256
    left alone and fixed up (so validate_cache=True reads the file too)."""
    source = cache_source(name, written_caches)
    arrow = (source / "metadata.arrow").read_bytes()
    fields = [
        f["name"] for f in json.loads((source / "manifest.json").read_bytes())["metadata_schema"]
    ]
    failures: list[str] = []
    number = 0
    for field_name in fields:
        raw = field_name.encode()
        at = arrow.find(raw)
        while at >= 0:
            for value in (0xCC, 0x00, ord("X")):
                for fix in (False, True):
                    target = copy_writable(source, tmp_path / f"a{number}" / name)
                    number += 1
                    data = bytearray(arrow)
                    data[at + len(raw) - 1] = value
                    (target / "metadata.arrow").write_bytes(bytes(data))
                    if fix:
                        manifest = json.loads((target / "manifest.json").read_bytes())
                        manifest["metadata_sha256"] = hashlib.sha256(data).hexdigest()
                        text = json.dumps(manifest, indent=2, ensure_ascii=False)
                        (target / "manifest.json").write_text(text, encoding="utf-8")
                    job = {
                        "op": "read",
                        "cache": str(target),
                        "backend": "threads",
                        "prefetch": 64,
                        "limit": 400,
                    }
                    what = f"{name} metadata.arrow byte {at + len(raw) - 1}"
                    what += f" (field {field_name!r}) -> {value:#04x}"
                    what += ", metadata_sha256 fixed" if fix else ""
                    read_edited(worker, job, target, what, failures)
            at = arrow.find(raw, at + 1)
    assert number > 0
    assert not failures, f"{len(failures)} of {number} edits failed:\n" + "\n".join(
        failures[:MAX_REPORTED]
    )


def test_pristine_caches_pass_the_oracle(
    worker: Worker, backends: list[str], written_caches: dict[str, Path], tmp_path: Path
) -> None:
    """The harness itself: unmutated caches load, read completely and match the oracle."""
    for name in RANDOM_CACHES:
        target = copy_writable(cache_source(name, written_caches), tmp_path / name)
        for backend in backends:
            [reply] = worker.request(
                {
                    "op": "read",
                    "cache": str(target),
                    "backend": backend,
                    "prefetch": 64,
                    "limit": 400,
                }
            )
            assert check_read(reply, build_oracle(target)) == []
            for run in reply["runs"]:
                assert run["load"] is None
                assert run["iter"]["error"] is None and run["batches"]["error"] is None
                assert all(item["error"] is None for item in run["items"])
                assert run["metadata"]["error"] is None


def test_worker_reports_crashes_and_hangs() -> None:
    """The harness itself: a dying worker is a reported crash, a silent one a hang."""
    w = Worker(timeout=2.0)
    try:
        with pytest.raises(WorkerDied) as crash:
            w.request({"op": "crash", "how": "abort"})
        assert "SIGABRT" in crash.value.kind
        with pytest.raises(WorkerDied) as hang:
            w.request({"op": "crash", "how": "hang"})
        assert hang.value.kind.startswith("hang")
        assert "crash_job" in hang.value.detail  # the worker's stack, dumped by faulthandler
        assert w.restarts == 2
        # The replacement worker is usable.
        [reply] = w.request(
            {
                "op": "read",
                "cache": str(FIXTURES / "text_records_v1"),
                "backend": "threads",
                "prefetch": 64,
                "limit": 10,
            }
        )
        assert reply["runs"][0]["load"] is None
    finally:
        w.close()


# ------------------------------------------------------------ single-byte detection


def _replacement_values(rng: random.Random, original: int, rel: str) -> set[int]:
    """The replacement bytes tried at one position in the default run.

    Binary files: one random byte (the SHA-256 comparison sees any change). The manifest:
    the byte with bit 0 and bit 5 flipped (a neighbouring digit or letter, a lowercase hex
    digit made uppercase), one byte chosen for the character's class (other whitespace,
    which must stay accepted; a digit, sign or exponent in a number; a quote or backslash
    in a string; another structural character) and one random byte.
    """
    if rel != "manifest.json":
        return {original ^ rng.randrange(1, 256)}
    char = chr(original)
    if char in " \t\r\n":
        choices = " \t\r\n1x,"
    elif char.isdigit():
        choices = "0159 -.eE"
    elif char.isalpha() or char == "_":
        choices = '"\\ \x7f\x00' + char.upper() + "\u00e9"
    else:
        choices = '"{}[],: '
    return {original ^ 0x01, original ^ 0x20, ord(rng.choice(choices)) & 0xFF, rng.randrange(256)}


def _mutants_for(
    rng: random.Random, data: bytes, rel: str, positions: int | None
) -> list[tuple[int, int]]:
    """(position, new byte) pairs: at every position, or at ``positions`` of them (the
    first and last 32 bytes and a seeded sample), with the values of the default run, or
    with every value when DATASET_RT_FUZZ_ITERATIONS >= 255."""
    if LONG_ITERATIONS or positions is None or positions >= len(data):
        chosen = list(range(len(data)))
    else:
        edges = set(range(min(32, len(data)))) | set(range(max(0, len(data) - 32), len(data)))
        middle = [p for p in range(len(data)) if p not in edges]
        chosen = sorted(
            edges | set(rng.sample(middle, max(0, min(len(middle), positions - len(edges)))))
        )
    mutants = []
    for pos in chosen:
        values = _replacement_values(rng, data[pos], rel)
        if EXTRA_VALUES_PER_POSITION >= 255:
            values = set(range(256))
        else:
            values |= {rng.randrange(256) for _ in range(EXTRA_VALUES_PER_POSITION)}
        values.discard(data[pos])
        mutants += [(pos, value) for value in sorted(values)]
    return mutants


# The caches of the detection test, with how many byte positions of the manifest and of
# every other file the default run tries (None: every position). Every position of every
# file is tried when DATASET_RT_FUZZ_ITERATIONS is set.
DETECTION_CACHES: dict[str, tuple[int | None, int | None]] = {
    "tiny_plain": (600, 200),
    "tiny_lz4": (300, 100),
    "tiny_v2": (300, 0),
    "unicode_é_name": (None, 200),
    "plain_one_shard": (200, 200),
    "lz4_many_shards": (200, 70),
}


@pytest.mark.parametrize("name", list(DETECTION_CACHES))
def test_validate_cache_detects_every_single_byte_change(
    worker: Worker, backends: list[str], written_caches: dict[str, Path], tmp_path: Path, name: str
) -> None:
    source = cache_source(name, written_caches)
    cache = copy_writable(source, tmp_path / name)
    rng = random.Random(f"{SEED}-detect-{name}")
    manifest_positions, file_positions = DETECTION_CACHES[name]
    failures: list[str] = []
    tried = 0
    for rel in cache_files(cache):
        path = cache / rel
        pristine = path.read_bytes()
        mutants = _mutants_for(
            rng, pristine, rel, manifest_positions if rel == "manifest.json" else file_positions
        )
        classes = [
            classify_manifest(pristine, _with_byte(pristine, pos, value))
            if rel == "manifest.json"
            else "detect"
            for pos, value in mutants
        ]
        tried += len(mutants)
        start = 0
        while start < len(mutants):
            batch = mutants[start : start + 4000]
            backend = backends[(start // 4000) % len(backends)]
            job = {
                "op": "detect",
                "cache": str(cache),
                "file": str(path),
                "mutants": batch,
                "backend": backend,
            }
            try:
                replies = worker.request(job, replies=len(batch))
            except WorkerDied as died:
                path.write_bytes(pristine)  # the worker may have died with the byte changed
                pos, value = batch[died.index]
                change = f"byte {pos} {pristine[pos]:#04x} -> {value:#04x}"
                failures.append(f"{name}/{rel}: {change} ({backend}): {died.detail}")
                start += died.index + 1
                continue
            for (pos, value), reply, kind in zip(
                batch, replies, classes[start : start + len(batch)]
            ):
                problem = _detection_problem(kind, reply)
                if problem:
                    change = f"byte {pos} {pristine[pos]:#04x} -> {value:#04x}"
                    where = f"{backend}, {_context(pristine, pos)}"
                    failures.append(f"{name}/{rel}: {change} ({where}): {problem}")
            start += len(batch)
        assert path.read_bytes() == pristine
    assert not failures, (
        f"{len(failures)} of {tried} single-byte changes mishandled (seed {SEED}):\n"
        + "\n".join(failures[:MAX_REPORTED])
    )


def _with_byte(data: bytes, pos: int, value: int) -> bytes:
    return data[:pos] + bytes([value]) + data[pos + 1 :]


def _context(data: bytes, pos: int) -> str:
    start = data.rfind(b"\n", 0, pos) + 1
    end = data.find(b"\n", pos)
    end = len(data) if end < 0 else end
    if end - start > 120 or b"\0" in data[:64]:
        return f"offset {pos}"
    return f"line {data[start:end].strip()!r}"


def _detection_problem(kind: str, reply: dict[str, Any]) -> str | None:
    load, read = reply["load"], reply["read"]
    for error in (load, read):
        if error is not None and (error[0] not in ALLOWED_ERRORS or not error[1].strip()):
            return f"unclear error {error}"
    if kind == "detect" and load is None:
        return "not detected at load" + (
            f" (the first read raised {read})" if read else " (and the first read succeeded)"
        )
    if kind == "schema_rename" and load is None and read is None:
        return "schema field rename not detected at load nor by the first read"
    if kind == "identical" and (load is not None or read is not None):
        return f"a change undetectable by design was rejected: load {load}, read {read}"
    return None
