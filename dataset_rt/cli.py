"""The ``dataset-rt`` command (also ``python -m dataset_rt``): inspect and verify caches.

Subcommands:
* ``inspect PATH...``: manifest facts, schema, shards, sizes, compression, cache id
  (a table, or ``--json``);
* ``verify PATH...``: every SHA-256 and every record's embedded metadata checked against
  ``metadata.arrow``, with progress and MB/s; exit status 0 only when every cache is
  intact; every damaged file is named (a remote cache's shards are all downloaded first);
* ``head PATH [-n N]``: the first samples' identities, payload sizes and metadata;
* ``stats PATH``: per-column summaries of the metadata table (Polars);
* ``config --cflags --libs [--static]``: flags to build C programs against the C SDK
  inside the installed package (see ``dataset_rt.sdk``).

Exit status: 0 success, 1 a cache is damaged or cannot be read (or the output cannot be
written), 2 usage errors, 130 interrupted (Ctrl-C), 141 the reader of the output closed it.
Paths are shown as given, bytes that are not UTF-8 included.
"""

from __future__ import annotations

import argparse
import codecs
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from dataset_rt import _distribution

# The reference release installed over this package replaces dataset_rt/__init__.py (so
# its check never runs) and leaves a mix of both packages' modules: refuse it here too,
# before importing modules that the mix may have broken.
_distribution.check_single_owner()

from dataset_rt import _native, remote, sdk  # noqa: E402
from dataset_rt.api import CachedDataset, DatasetRuntime, ReaderConfig  # noqa: E402

# verify: samples a native batch may hold; the read-ahead byte budget bounds its bytes.
VERIFY_BATCH = 4096
# verify: a batch leaves its records in the read buffers and takes each cache's stored
# metadata rows (compared with every record's JSON under validate_cache).
VERIFY_FLAGS = int(_native.BatchFlag.STORED_METADATA)


def _runtime() -> DatasetRuntime:
    return DatasetRuntime(num_workers=2)


def _cache_arg(path: str) -> str:
    """argparse type of a cache path: not empty (it would name the working directory's
    files in every message)."""
    if not path:
        raise argparse.ArgumentTypeError("a cache path must not be empty")
    return path


def _open(runtime: DatasetRuntime, path: Path | str, *, validate: bool = False) -> CachedDataset:
    return runtime.cached_dataset(
        [path], reader_config=ReaderConfig(seed=0, shuffle=False, validate_cache=validate)
    )


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def cache_facts(path: Path | str, transport: _native.Remote | None = None) -> dict[str, Any]:
    """What ``inspect`` reports for one cache (after the library has opened it; a URL's
    files come through ``transport``, by default the environment's)."""
    config = ReaderConfig(seed=0, shuffle=False)
    with CachedDataset._open(_runtime()._runtime, [path], config, transport)._handle as handle:
        return _facts(path, handle)


def _facts(path: Path | str, handle: _native.Dataset) -> dict[str, Any]:
    info = handle.cache_info(0)
    # The cache's directory, or the verified local copy of a remote cache's files.
    local = Path(os.fsdecode(handle.cache_dir(0)))
    manifest = json.loads((local / "manifest.json").read_bytes())
    shards = manifest["shards"]
    sizes = {
        "shards": sum(s["byte_len"] for s in shards),
        "payloads_uncompressed": sum(s["uncompressed_byte_len"] for s in shards),
        "index": (local / "index.bin").stat().st_size,
        "metadata": (local / "metadata.arrow").stat().st_size,
    }
    compression = shards[0]["compression"] if shards else {"algo": "none", "ratio": 1.0}
    facts = {
        "path": str(path),
        "source_name": manifest["source_name"],
        "format_version": info.format_version,
        "cache_id": info.cache_id,
        "sample_count": info.sample_count,
        "schema": [
            {"name": name, "kind": _native.KIND_NAMES[kind]} for name, kind in handle.fields()
        ],
        "compression": compression,
        "shard_count": info.shard_count,
        "bytes": sizes,
    }
    if "fingerprint" in manifest:
        facts["fingerprint"] = manifest["fingerprint"]
    return facts


def cmd_inspect(args: argparse.Namespace, out: TextIO) -> int:
    status = 0
    reports = []
    for path in args.paths:
        try:
            reports.append(cache_facts(path))
        except (ValueError, RuntimeError, OSError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            status = 1
    if args.json:
        text = json.dumps(reports, indent=2, ensure_ascii=not _unicode_output(out))
        # A path's undecodable bytes (surrogates) become JSON escapes: the output stays
        # UTF-8, and json.loads + os.fsencode give the bytes back.
        if any("\udc80" <= ch <= "\udcff" for ch in text):
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        out.write(text + "\n")
        return status
    for facts in reports:
        sizes = facts["bytes"]
        compression = facts["compression"]
        rows = [
            ("path", facts["path"]),
            ("source_name", facts["source_name"]),
            ("format_version", facts["format_version"]),
            ("cache_id", facts["cache_id"]),
            ("samples", facts["sample_count"]),
            ("schema", ", ".join(f"{f['name']}: {f['kind']}" for f in facts["schema"]) or "(none)"),
            ("compression", f"{compression['algo']} (ratio {compression['ratio']})"),
            ("shards", f"{facts['shard_count']} ({_human(sizes['shards'])})"),
            ("payloads", _human(sizes["payloads_uncompressed"])),
            ("index.bin", _human(sizes["index"])),
            ("metadata.arrow", _human(sizes["metadata"])),
        ]
        if "fingerprint" in facts:
            rows.append(("fingerprint", facts["fingerprint"]))
        width = max(len(key) for key, _ in rows)
        for key, value in rows:
            out.write(f"{key:<{width}}  {value}\n")
        out.write("\n")
    return status


def _verify_one(path: Path | str, out: TextIO, progress: bool) -> bool:
    if not remote.is_url(path):
        return _verify_opened(path, out, progress, None)
    # The objects on the server, not this machine's copies of them: everything is
    # fetched again, into a directory of its own (a full download), removed after.
    with tempfile.TemporaryDirectory(prefix="dataset-rt-verify-") as directory:
        return _verify_opened(path, out, progress, remote.private(directory))


def _verify_opened(
    path: Path | str, out: TextIO, progress: bool, transport: _native.Remote | None
) -> bool:
    """``verify`` of one cache; a URL's files come through ``transport``. Every dataset
    it opens is closed when it returns."""
    started = time.monotonic()
    if progress and transport is not None:
        # The open downloads and verifies every shard before the records pass starts.
        sys.stderr.write(f"\r\x1b[2Kverify {path}: downloading and verifying every file ...")
        sys.stderr.flush()
    try:
        # Every shard size and SHA-256 (each damaged file named), the metadata kinds.
        config = ReaderConfig(seed=0, shuffle=False, validate_cache=True)
        dataset = CachedDataset._open(_runtime()._runtime, [path], config, transport, True)
    except (ValueError, RuntimeError, OSError) as exc:
        _write_fail(out, path, exc)
        return False
    finally:
        if progress and transport is not None:
            sys.stderr.write("\r\x1b[2K")
    with dataset._handle:
        try:
            facts = _facts(path, dataset._handle)
        except (ValueError, RuntimeError, OSError) as exc:
            _write_fail(out, path, exc)
            return False
        return _verify_records(path, dataset, facts, started, out, progress)


def _write_fail(out: TextIO, path: Path | str, exc: BaseException) -> None:
    """A ``FAIL`` line per line of the error: the library puts each damaged file of a
    cache on a line of its own (split on newlines only: paths may hold \\r or U+2028)."""
    for line in str(exc).split("\n"):
        out.write(f"FAIL {path}: {line}\n")


def _verify_records(
    path: Path | str,
    dataset: CachedDataset,
    facts: dict[str, Any],
    started: float,
    out: TextIO,
    progress: bool,
) -> bool:
    total = facts["sample_count"]
    read_bytes = facts["bytes"]["shards"] + facts["bytes"]["index"] + facts["bytes"]["metadata"]
    done = 0
    # Every record vs metadata.arrow, natively; nothing is copied out, so memory stays
    # within the read-ahead window whatever the record sizes.
    iterator = _native.Iterator.open(dataset._handle)
    try:
        while count := iterator.next_batch(VERIFY_BATCH, VERIFY_FLAGS).count:
            done += count
            if progress:
                elapsed = max(time.monotonic() - started, 1e-9)
                sys.stderr.write(
                    f"\r\x1b[2Kverify {path}: {done}/{total} samples | "
                    f"{read_bytes * done / total / elapsed / 1e6:,.1f} MB/s"
                )
                sys.stderr.flush()
    except (ValueError, RuntimeError) as exc:
        if progress:
            sys.stderr.write("\r\x1b[2K")
        _write_fail(out, path, exc)
        return False
    finally:
        iterator.close()
    if progress:
        sys.stderr.write("\r\x1b[2K")
    elapsed = max(time.monotonic() - started, 1e-9)
    out.write(
        f"OK   {path}: {total} samples, {_human(read_bytes)} in {elapsed:.2f}s "
        f"({read_bytes / elapsed / 1e6:,.1f} MB/s)\n"
    )
    return True


def cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    progress = sys.stderr.isatty() and not args.quiet
    results = [_verify_one(p, out, progress) for p in args.paths]
    return 0 if all(results) else 1


def cmd_head(args: argparse.Namespace, out: TextIO) -> int:
    try:
        dataset = _open(_runtime(), args.path)
        count = min(args.n, len(dataset))
        if count == 0:
            return 0
        dataset.set_epoch_len(count)
        ascii_only = not _unicode_output(out)
        for sample in dataset:
            metadata = json.dumps(sample.metadata, ensure_ascii=ascii_only)
            out.write(f"{sample.cache_id} {sample.sample_id} {len(sample.data)} {metadata}\n")
    except (ValueError, RuntimeError) as exc:
        print(f"{args.path}: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_stats(args: argparse.Namespace, out: TextIO) -> int:
    import polars as pl

    try:
        table = _open(_runtime(), args.path).get_metadata()
    except (ValueError, RuntimeError) as exc:
        print(f"{args.path}: {exc}", file=sys.stderr)
        return 1
    stored = table.drop("cache_id", "sample_id", "weight")
    if "statistic" in stored.columns:  # describe() adds its own "statistic" column
        rename, n = "statistic (metadata)", 1
        while rename in stored.columns:
            n += 1
            rename = f"statistic (metadata {n})"
        stored = stored.rename({"statistic": rename})
    out.write(f"{table.height} samples, {stored.width} metadata columns\n")
    if stored.width:
        with pl.Config(tbl_rows=50, tbl_cols=50, tbl_width_chars=200):
            out.write(f"{stored.describe()}\n")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dataset-rt", description="Inspect and verify dataset_rt caches."
    )
    sub = p.add_subparsers(dest="command", required=True)
    inspect = sub.add_parser("inspect", help="manifest facts, schema, shards, sizes")
    inspect.add_argument("paths", nargs="+", metavar="PATH", type=_cache_arg)
    inspect.add_argument("--json", action="store_true", help="print JSON instead of a table")
    inspect.set_defaults(run=cmd_inspect)
    verify = sub.add_parser("verify", help="check every checksum and record")
    verify.add_argument("paths", nargs="+", metavar="PATH", type=_cache_arg)
    verify.add_argument("--quiet", action="store_true", help="no progress line")
    verify.set_defaults(run=cmd_verify)
    head = sub.add_parser("head", help="the first samples")
    head.add_argument("path", metavar="PATH", type=_cache_arg)
    head.add_argument(
        "-n", type=_count, default=10, help="how many samples (default 10)", metavar="N"
    )
    head.set_defaults(run=cmd_head)
    stats = sub.add_parser("stats", help="per-column metadata summaries")
    stats.add_argument("path", metavar="PATH", type=_cache_arg)
    stats.set_defaults(run=cmd_stats)
    config = sub.add_parser("config", help="flags to build C programs against this package")
    sdk.add_arguments(config)
    config.set_defaults(run=sdk.cmd_config)
    return p


def _count(text: str) -> int:
    """argparse type of ``-n``: a non-negative integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("-n must be non-negative")
    return value


def _unicode_output(out: TextIO) -> bool:
    """Whether ``out``'s encoding holds any character (else JSON is written with ASCII
    escapes, which stay valid JSON; other text gets backslash escapes)."""
    try:
        "\u00e9\u4e2d".encode(getattr(out, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


class OutputError(Exception):
    """Standard output could not be written (other than a closed pipe)."""


class _Output:
    """Standard output for the commands: a failed write or flush is an
    :class:`OutputError` (a closed pipe stays ``BrokenPipeError``), so it is never
    mistaken for an error of a cache."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self.encoding = getattr(stream, "encoding", None)

    def _fail(self, exc: OSError) -> OutputError:
        return OutputError(exc.strerror or str(exc))

    def write(self, text: str) -> int:
        if self._stream is None:  # started with standard output closed
            raise OutputError("standard output is closed")
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise self._fail(exc) from exc

    def flush(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise self._fail(exc) from exc


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command (output to ``out``, by default standard output); returns the exit
    status. Raises :class:`OutputError` when standard output cannot be written."""
    args = parser().parse_args(argv)
    if out is None:
        stdout = _Output(sys.stdout)
        status = int(args.run(args, stdout))
        stdout.flush()
        return status
    return int(args.run(args, out))


def main_exit() -> None:
    """Console-script entry point. A reader that stops early (``| head``) ends the
    command quietly with status 141 (128 + SIGPIPE), as other commands end; Ctrl-C with
    130 (128 + SIGINT); output that cannot be written (a full disk) with a one-line
    error and status 1. Paths that are not UTF-8 are printed as their own bytes."""
    if sys.stderr is None:  # started with standard error closed: errors go nowhere
        sys.stderr = open(os.devnull, "w")
    codecs.register_error(_PATH_BYTES, _path_bytes)
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors=_PATH_BYTES)
    try:
        status = main()
    except BrokenPipeError:
        _quiet_stdout()
        raise SystemExit(141) from None
    except KeyboardInterrupt:
        if sys.stderr.isatty():  # the progress line
            sys.stderr.write("\r\x1b[2K")
        _quiet_stdout()
        raise SystemExit(130) from None
    except OutputError as exc:
        sys.stderr.write(f"dataset-rt: cannot write the output: {exc}\n")
        _quiet_stdout()
        raise SystemExit(1) from None
    raise SystemExit(status)


_PATH_BYTES = "dataset_rt.cli.path_bytes"


def _path_bytes(error: UnicodeError) -> tuple[str | bytes, int]:
    """Codec error handler of the command's output: a path's undecodable bytes (lone
    surrogates) are written back as those bytes, any other character the output encoding
    cannot hold (an ASCII locale) as a backslash escape."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    text = error.object[error.start : error.end]
    if all("\udc80" <= ch <= "\udcff" for ch in text):
        return codecs.lookup_error("surrogateescape")(error)
    return codecs.backslashreplace_errors(error)


def _quiet_stdout() -> None:
    """Points standard output at /dev/null: Python flushes it again at exit, which
    would fail (and print) a second time."""
    if sys.stdout is None:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass
    finally:
        os.close(devnull)
