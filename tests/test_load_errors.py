"""Loading and reading corrupted caches fails like dataset-rt 0.4.8.

Every row of shared/reference/dataset-rt-0.4.8.md table 4.5 and the dataset-level load
errors below it, on copies of the reference fixture caches, with
``ReaderConfig.validate_cache`` False and True: where the error surfaces (load, iteration,
``get_item``, ``get_metadata``), its type and its message. Expected values were observed
with the reference release and are hard-coded.

Deliberate differences (SPEC.md "Compatibility policy" and section 4):
* I/O error messages name the file after the OS text, so they are checked with
  ``startswith(<reference text>)`` plus the file's path appearing in the message.
* JSON parser wording is ours: only the ``JSON error: `` prefix is checked, except where
  the reference's text is its own check (unsupported format version, missing field
  `cache_id`, unknown variant `zstd`, invalid type string "5", integer format_version);
  there the message must start with the reference's exact text (our messages may go on
  to name the manifest).
* Policy 1: the 271/3.0 float defect is fixed, so ``validate_cache=True`` accepts the
  fixtures.

Also: after an error during iteration the iterator is finished (``next`` raises
StopIteration) and the dataset stays usable; no file on disk is changed by loading or
reading.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import dataset_rt as drt
from tests.conftest import FIXTURES, expected, snapshot

PLAIN_ONE_SHARD_ID = 4233350989699285984
PLAIN_MANY_SHARDS_ID = 8396414845348598824
UNICODE_ID = 716452998420398136
BAD = 2  # the sample a record-level corruption is applied to

# ---------------------------------------------------------------------------- helpers


def manifest(cache: Path) -> dict[str, Any]:
    return json.loads((cache / "manifest.json").read_text(encoding="utf-8"))


def edit_manifest(cache: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    data = manifest(cache)
    change(data)
    (cache / "manifest.json").write_text(
        json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8"
    )


def index_row(cache: Path, i: int) -> tuple[int, int, int]:
    return struct.unpack("<QQQ", (cache / "index.bin").read_bytes()[24 * i : 24 * i + 24])


def set_index_field(cache: Path, i: int, field: int, value: int) -> None:
    path = cache / "index.bin"
    data = bytearray(path.read_bytes())
    data[24 * i + 8 * field : 24 * i + 8 * field + 8] = struct.pack("<Q", value)
    path.write_bytes(bytes(data))


def shard_path(cache: Path, shard_id: int) -> Path:
    return cache / "shards" / f"{shard_id:06}.bin"


def xor_byte(path: Path, offset: int, mask: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def record_json_len(cache: Path, i: int) -> int:
    shard_id, offset, _ = index_row(cache, i)
    return struct.unpack("<Q", shard_path(cache, shard_id).read_bytes()[offset : offset + 8])[0]


def edit_record_json(cache: Path, i: int, old: bytes, new: bytes) -> None:
    """Replace bytes of record i's JSON (same length) and fix the shard's sha256."""
    assert len(old) == len(new)
    shard_id, offset, length = index_row(cache, i)
    path = shard_path(cache, shard_id)
    data = bytearray(path.read_bytes())
    record = bytes(data[offset : offset + length])
    assert record.count(old) >= 1, record[:100]
    data[offset : offset + length] = record.replace(old, new, 1)
    path.write_bytes(bytes(data))
    edit_manifest(
        cache,
        lambda m: m["shards"][shard_id].__setitem__("sha256", hashlib.sha256(data).hexdigest()),
    )


Reader = Callable[..., drt.ReaderConfig]


@pytest.fixture
def reader(io_backend: str) -> Reader:
    """``reader(validate, shuffle=..., seed=...)``: a ReaderConfig on the test's I/O backend.

    Every test here runs on both read backends (SPEC section 6, conftest ``io_backend``).
    """

    def make(validate: bool, *, shuffle: bool = False, seed: int = 0) -> drt.ReaderConfig:
        return drt.ReaderConfig(
            seed=seed, shuffle=shuffle, validate_cache=validate, io_backend=io_backend
        )

    return make


# -------------------------------------------------------------------- message checks

Check = Callable[[str, Path], None]


def exact(text: str) -> Check:
    """The reference's exact message; ``{cache}`` stands for the cache directory."""

    def check(message: str, cache: Path) -> None:
        assert message == text.format(cache=cache)

    check.__doc__ = text
    return check


def in_shard(text: str) -> Check:
    """A record's error: the reference's exact message, then ours names the record's
    shard file (``<text>: <cache>/shards/<name>``)."""

    def check(message: str, cache: Path) -> None:
        assert message.startswith(f"{text}: {cache / 'shards'}/"), message
        assert message.endswith(".bin"), message

    check.__doc__ = f"{text}: <shard>"
    return check


def names_file(text: str, file: str) -> Check:
    """The reference's exact message, then ours names the file: ``<text>: <cache>/<file>``."""

    def check(message: str, cache: Path) -> None:
        assert message == f"{text}: {cache / file}", message

    check.__doc__ = f"{text}: {file}"
    return check


def io_error(text: str, file: str) -> Check:
    """Reference I/O text first, then our message names the file."""

    def check(message: str, cache: Path) -> None:
        assert message.startswith(text), message
        assert str(cache / file) in message, message

    check.__doc__ = f"{text} ... {file}"
    return check


def starts(text: str) -> Check:
    """The message starts with ``text`` (reference wording of its own check, or a prefix)."""

    def check(message: str, cache: Path) -> None:
        assert message.startswith(text), message
        assert len(message) > len("JSON error: "), message

    check.__doc__ = text
    return check


JSON_ERROR = starts("JSON error: ")


def in_metadata_arrow(prefix: str) -> Check:
    """Starts with ``prefix`` and ends naming the cache's ``metadata.arrow`` (the middle is
    the Arrow library's own detail)."""

    def check(message: str, cache: Path) -> None:
        assert message.startswith(prefix), message
        assert message.endswith(f": {cache / 'metadata.arrow'}"), message

    check.__doc__ = prefix
    return check


# 0.4.8's texts for a metadata.arrow whose footer cannot be located or read.
BAD_FOOTER = "invalid metadata Arrow footer"
NO_FOOTER = "Arrow error: Parser error: Arrow file does not contain correct footer"


def checksum(file: str) -> Check:
    return exact("checksum mismatch for {cache}/" + file)


# -------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Outcome:
    """Where and how one corruption surfaces for one validate_cache setting."""

    stage: str  # "load", "iterate" or "ok" (everything reads)
    error: type[BaseException] | None = None
    check: Check | None = None
    after: int = 0  # samples yielded (ordered) before an iterate error
    get_metadata: tuple[type[BaseException], Check] | None = None  # when get_metadata fails


OK = Outcome("ok")


def load(error: type[BaseException], check: Check) -> Outcome:
    return Outcome("load", error, check)


def iterate(error: type[BaseException], check: Check, after: int = BAD, **kw: Any) -> Outcome:
    return Outcome("iterate", error, check, after, **kw)


@dataclass(frozen=True)
class Case:
    corrupt: Callable[[Path], Any]
    plain: Outcome
    validate: Outcome
    fixture: str = "plain_one_shard"
    verify: Callable[[list[drt.CachedSample], Path], None] | None = None  # for "ok" reads


def _flip_payload(cache: Path) -> None:
    shard_id, offset, length = index_row(cache, BAD)
    xor_byte(shard_path(cache, shard_id), offset + length - 1, 0x01)


def _payload_is_corrupted(samples: list[drt.CachedSample], cache: Path) -> None:
    """The flipped payload byte comes back as is; every other sample is intact."""
    want = expected("plain_one_shard")["samples"]
    shard_id, offset, length = index_row(cache, BAD)
    original = (FIXTURES / "plain_one_shard" / "shards" / f"{shard_id:06}.bin").read_bytes()
    record = original[offset : offset + length]
    payload = bytearray(record[8 + record_json_len(cache, BAD) :])
    payload[-1] ^= 0x01
    for sample, row in zip(samples, want, strict=True):
        if sample.sample_id == BAD:
            assert sample.data == bytes(payload)
            assert hashlib.sha256(sample.data).hexdigest() != row["sha256"]
        else:
            assert hashlib.sha256(sample.data).hexdigest() == row["sha256"]


def _flip_json_utf8(cache: Path) -> None:
    shard_id, offset, _ = index_row(cache, BAD)
    xor_byte(shard_path(cache, shard_id), offset + 8 + 3, 0xC0)  # inside '"flag"'


def _flip_length_prefix(cache: Path) -> None:
    shard_id, offset, _ = index_row(cache, BAD)
    xor_byte(shard_path(cache, shard_id), offset + 4, 0x10)


def _change_json_value(cache: Path) -> None:
    edit_record_json(cache, BAD, b'"label":-1,', b'"label":-7,')


def _changed_value_is_returned(samples: list[drt.CachedSample], cache: Path) -> None:
    assert samples[BAD].metadata["label"] == -7
    assert samples[BAD + 1].metadata["label"] == 0


def _rename_json_key(cache: Path) -> None:
    edit_record_json(cache, BAD, b'"name":', b'"nbme":')


def _truncate_shard(cache: Path) -> None:
    path = shard_path(cache, 0)
    path.write_bytes(path.read_bytes()[:-1])


def _extend_shard(cache: Path) -> None:
    path = shard_path(cache, 0)
    path.write_bytes(path.read_bytes() + b"\x00")


def _byte_len_plus_one(cache: Path) -> None:
    edit_manifest(
        cache, lambda m: m["shards"][0].__setitem__("byte_len", m["shards"][0]["byte_len"] + 1)
    )


def _delete(rel: str) -> Callable[[Path], None]:
    return lambda cache: (cache / rel).unlink()


def _truncate_index_one_byte(cache: Path) -> None:
    path = cache / "index.bin"
    path.write_bytes(path.read_bytes()[:-1])


def _index_missing_row(cache: Path) -> None:
    path = cache / "index.bin"
    path.write_bytes(path.read_bytes()[:-24])


def _index_empty(cache: Path) -> None:
    (cache / "index.bin").write_bytes(b"")


def _metadata_flip_middle(cache: Path) -> None:
    path = cache / "metadata.arrow"
    xor_byte(path, len(path.read_bytes()) // 2, 0x01)


def _metadata_truncate(cache: Path) -> None:
    path = cache / "metadata.arrow"
    path.write_bytes(path.read_bytes()[:-10])


def _metadata_garbage(cache: Path) -> None:
    path = cache / "metadata.arrow"
    path.write_bytes(bytes((i * 37 + 11) % 256 for i in range(path.stat().st_size)))


def _metadata_leading_magic(cache: Path) -> None:
    """The first bytes damaged, the footer and trailing magic intact (pyarrow reads only
    the end of the file)."""
    with (cache / "metadata.arrow").open("r+b") as f:
        f.write(b"XXXXXX")


def _metadata_footer_length(value: int) -> Callable[[Path], None]:
    def corrupt(cache: Path) -> None:
        path = cache / "metadata.arrow"
        data = bytearray(path.read_bytes())
        data[-10:-6] = value.to_bytes(4, "little", signed=True)
        path.write_bytes(bytes(data))

    return corrupt


def _set(key: str, value: Any) -> Callable[[Path], None]:
    return lambda cache: edit_manifest(cache, lambda m: m.__setitem__(key, value))


def _sample_count(delta: int) -> Callable[[Path], None]:
    return lambda cache: edit_manifest(
        cache, lambda m: m.__setitem__("sample_count", m["sample_count"] + delta)
    )


def _drop(key: str) -> Callable[[Path], None]:
    return lambda cache: edit_manifest(cache, lambda m: m.pop(key))


def _v2_ids(samples: list[drt.CachedSample], cache: Path) -> None:
    assert {s.cache_id for s in samples} == {0}


def _ids(value: int) -> Callable[[list[drt.CachedSample], Path], None]:
    def verify(samples: list[drt.CachedSample], cache: Path) -> None:
        assert {s.cache_id for s in samples} == {value}

    return verify


def _schema_kind(cache: Path) -> None:
    edit_manifest(cache, lambda m: m["metadata_schema"][1].__setitem__("kind", "float"))  # label


def _schema_reorder(cache: Path) -> None:
    edit_manifest(
        cache, lambda m: m.__setitem__("metadata_schema", list(reversed(m["metadata_schema"])))
    )


def _reordered_values(samples: list[drt.CachedSample], cache: Path) -> None:
    want = expected("plain_one_shard")["samples"]
    for sample, row in zip(samples, want, strict=True):
        assert sample.metadata == row["metadata"]
        assert list(sample.metadata) == ["score", "name", "label", "flag"]


def _schema_drop(cache: Path) -> None:
    edit_manifest(cache, lambda m: m["metadata_schema"].pop())  # score


def _sha(key: str) -> Callable[[Path], None]:
    def corrupt(cache: Path) -> None:
        if key == "shard":
            edit_manifest(cache, lambda m: m["shards"][0].__setitem__("sha256", "0" * 64))
        else:
            edit_manifest(cache, lambda m: m.__setitem__(key, "0" * 64))

    return corrupt


def _algo(algo: str) -> Callable[[Path], None]:
    return lambda cache: edit_manifest(
        cache, lambda m: [shard["compression"].__setitem__("algo", algo) for shard in m["shards"]]
    )


def _accepted_changes(cache: Path) -> None:
    def change(m: dict[str, Any]) -> None:
        m["source_name"] = "something else"
        m["shards"][0]["uncompressed_byte_len"] = 1
        m["shards"][0]["compression"]["ratio"] = 7.5
        m["an_extra_key"] = {"nested": [1, 2]}

    edit_manifest(cache, change)


def _manifest_text(text: str) -> Callable[[Path], None]:
    return lambda cache: (cache / "manifest.json").write_text(text, encoding="utf-8")


def _duplicate_key(cache: Path) -> None:
    path = cache / "manifest.json"
    text = path.read_text(encoding="utf-8")
    assert text.startswith('{\n  "format_version": 3,\n')
    path.write_text(
        text.replace('"format_version": 3,', '"format_version": 3, "format_version": 3,', 1)
    )


def _drop_last_shard(cache: Path) -> None:
    edit_manifest(cache, lambda m: m["shards"].pop())


def _index_field(field: int, value: int) -> Callable[[Path], None]:
    return lambda cache: set_index_field(cache, BAD, field, value)


SHARD0 = "shards/000000.bin"
NOENT = "I/O error: No such file or directory (os error 2)"
FILL = "I/O error: failed to fill whole buffer"

CASES: dict[str, Case] = {
    "flip_payload_byte": Case(
        _flip_payload, OK, load(ValueError, checksum(SHARD0)), verify=_payload_is_corrupted
    ),
    "flip_json_byte_invalid_utf8": Case(
        _flip_json_utf8, iterate(RuntimeError, JSON_ERROR), load(ValueError, checksum(SHARD0))
    ),
    "flip_length_prefix": Case(
        _flip_length_prefix,
        iterate(ValueError, in_shard("invalid binary record")),
        load(ValueError, checksum(SHARD0)),
    ),
    "change_json_value_sha_fixed": Case(
        _change_json_value,
        OK,
        iterate(
            ValueError, in_shard("embedded metadata does not match metadata.arrow for sample 2")
        ),
        verify=_changed_value_is_returned,
    ),
    "rename_json_key_sha_fixed": Case(
        _rename_json_key,
        iterate(ValueError, in_shard("embedded metadata field 'name' is missing")),
        iterate(ValueError, in_shard("embedded metadata field 'name' is missing")),
    ),
    "truncate_shard_1_byte": Case(
        _truncate_shard,
        load(ValueError, exact("shard length mismatch for {cache}/" + SHARD0)),
        load(ValueError, exact("shard length mismatch for {cache}/" + SHARD0)),
    ),
    "extend_shard_1_byte": Case(
        _extend_shard,
        load(ValueError, exact("shard length mismatch for {cache}/" + SHARD0)),
        load(ValueError, exact("shard length mismatch for {cache}/" + SHARD0)),
    ),
    "manifest_byte_len_plus_1": Case(
        _byte_len_plus_one,
        load(ValueError, exact("shard length mismatch for {cache}/" + SHARD0)),
        load(ValueError, exact("shard length mismatch for {cache}/" + SHARD0)),
    ),
    "delete_shard": Case(
        _delete(SHARD0),
        load(RuntimeError, io_error(NOENT, SHARD0)),
        load(RuntimeError, io_error(NOENT, SHARD0)),
    ),
    "delete_metadata_arrow": Case(
        _delete("metadata.arrow"),
        load(RuntimeError, io_error(NOENT, "metadata.arrow")),
        load(RuntimeError, io_error(NOENT, "metadata.arrow")),
    ),
    "delete_index": Case(
        _delete("index.bin"),
        load(RuntimeError, io_error(NOENT, "index.bin")),
        load(RuntimeError, io_error(NOENT, "index.bin")),
    ),
    "delete_manifest": Case(
        _delete("manifest.json"),
        load(ValueError, exact("missing manifest: {cache}/manifest.json")),
        load(ValueError, exact("missing manifest: {cache}/manifest.json")),
    ),
    "index_truncated_1_byte": Case(
        _truncate_index_one_byte,
        load(ValueError, names_file("index length is not divisible by row size", "index.bin")),
        load(ValueError, checksum("index.bin")),
    ),
    "index_missing_row": Case(
        _index_missing_row,
        load(ValueError, names_file("index row count does not match manifest", "index.bin")),
        load(ValueError, checksum("index.bin")),
    ),
    "index_empty": Case(
        _index_empty,
        load(ValueError, names_file("index row count does not match manifest", "index.bin")),
        load(ValueError, checksum("index.bin")),
    ),
    "index_bad_offset": Case(
        _index_field(1, 10**6),
        iterate(RuntimeError, io_error(FILL, SHARD0)),
        load(ValueError, checksum("index.bin")),
    ),
    "index_bad_length": Case(
        _index_field(2, 10**6),
        iterate(RuntimeError, io_error(FILL, SHARD0)),
        load(ValueError, checksum("index.bin")),
    ),
    "index_short_length": Case(
        _index_field(2, 5),
        iterate(ValueError, in_shard("invalid binary record")),
        load(ValueError, checksum("index.bin")),
    ),
    "index_shard_id_99": Case(
        _index_field(0, 99),
        load(ValueError, names_file("index references missing shard 99", "index.bin")),
        load(ValueError, checksum("index.bin")),
    ),
    "manifest_drops_last_shard": Case(
        _drop_last_shard,
        load(ValueError, names_file("index references missing shard 24", "index.bin")),
        load(ValueError, names_file("index references missing shard 24", "index.bin")),
        fixture="plain_many_shards",
    ),
    "metadata_arrow_flip_middle": Case(
        _metadata_flip_middle, OK, load(ValueError, checksum("metadata.arrow"))
    ),
    "metadata_arrow_truncated": Case(
        _metadata_truncate,
        Outcome("ok", get_metadata=(RuntimeError, names_file(NO_FOOTER, "metadata.arrow"))),
        load(ValueError, checksum("metadata.arrow")),
    ),
    "metadata_arrow_garbage": Case(
        _metadata_garbage,
        Outcome("ok", get_metadata=(ValueError, names_file(BAD_FOOTER, "metadata.arrow"))),
        load(ValueError, checksum("metadata.arrow")),
    ),
    "metadata_arrow_leading_magic": Case(
        _metadata_leading_magic,
        Outcome("ok", get_metadata=(ValueError, names_file(BAD_FOOTER, "metadata.arrow"))),
        load(ValueError, checksum("metadata.arrow")),
    ),
    # The footer length (the i32 before the trailing magic) damaged, as 0.4.8 reports it.
    "metadata_arrow_footer_length_huge": Case(
        _metadata_footer_length(2**31 - 1),
        Outcome("ok", get_metadata=(ValueError, names_file(BAD_FOOTER, "metadata.arrow"))),
        load(ValueError, checksum("metadata.arrow")),
    ),
    "metadata_arrow_footer_length_zero": Case(
        _metadata_footer_length(0),
        Outcome("ok", get_metadata=(ValueError, names_file(BAD_FOOTER, "metadata.arrow"))),
        load(ValueError, checksum("metadata.arrow")),
    ),
    "metadata_arrow_footer_length_negative": Case(
        _metadata_footer_length(-1),
        Outcome(
            "ok",
            get_metadata=(
                RuntimeError,
                names_file(
                    "Arrow error: Parser error: Invalid footer length: -1", "metadata.arrow"
                ),
            ),
        ),
        load(ValueError, checksum("metadata.arrow")),
    ),
    "metadata_arrow_footer_unverifiable": Case(
        _metadata_footer_length(1),
        Outcome("ok", get_metadata=(ValueError, in_metadata_arrow(BAD_FOOTER + ": "))),
        load(ValueError, checksum("metadata.arrow")),
    ),
    "sample_count_plus_1": Case(
        _sample_count(+1),
        load(ValueError, names_file("index row count does not match manifest", "index.bin")),
        load(
            ValueError, names_file("metadata row count does not match manifest", "metadata.arrow")
        ),
    ),
    "sample_count_minus_1": Case(
        _sample_count(-1),
        load(ValueError, names_file("index row count does not match manifest", "index.bin")),
        load(
            ValueError, names_file("metadata row count does not match manifest", "metadata.arrow")
        ),
    ),
    "format_version_4": Case(
        _set("format_version", 4),
        load(RuntimeError, starts("JSON error: unsupported format version 4")),
        load(RuntimeError, starts("JSON error: unsupported format version 4")),
    ),
    "format_version_1": Case(
        _set("format_version", 1),
        load(RuntimeError, starts("JSON error: unsupported format version 1")),
        load(RuntimeError, starts("JSON error: unsupported format version 1")),
    ),
    "format_version_string": Case(
        _set("format_version", "3"),
        load(RuntimeError, starts("JSON error: manifest requires integer format_version")),
        load(RuntimeError, starts("JSON error: manifest requires integer format_version")),
    ),
    "format_version_2_on_v3_cache": Case(_set("format_version", 2), OK, OK, verify=_v2_ids),
    "schema_kind_changed": Case(
        _schema_kind,
        iterate(
            ValueError,
            in_shard("embedded metadata field 'label' expected float, got int"),
            after=0,
            get_metadata=(
                ValueError,
                exact("metadata column 'label' does not match manifest schema"),
            ),
        ),
        load(ValueError, names_file("metadata 'label' is not float", "metadata.arrow")),
    ),
    "schema_reordered": Case(
        _schema_reorder,
        Outcome(
            "ok",
            get_metadata=(
                ValueError,
                exact("metadata column 'score' does not match manifest schema"),
            ),
        ),
        load(ValueError, names_file("metadata 'score' is not float", "metadata.arrow")),
        verify=_reordered_values,
    ),
    "schema_drops_a_column": Case(
        _schema_drop,
        iterate(
            ValueError,
            in_shard("embedded metadata keys do not match schema"),
            after=0,
            get_metadata=(ValueError, exact("metadata batch column count does not match manifest")),
        ),
        iterate(
            ValueError,
            in_shard("embedded metadata keys do not match schema"),
            after=0,
            get_metadata=(ValueError, exact("metadata batch column count does not match manifest")),
        ),
    ),
    "wrong_index_sha": Case(_sha("index_sha256"), OK, load(ValueError, checksum("index.bin"))),
    "wrong_metadata_sha": Case(
        _sha("metadata_sha256"), OK, load(ValueError, checksum("metadata.arrow"))
    ),
    "wrong_shard_sha": Case(_sha("shard"), OK, load(ValueError, checksum(SHARD0))),
    "compression_changed_to_lz4": Case(
        _algo("lz4"),
        iterate(ValueError, starts("failed to decompress lz4 payload: "), after=0),
        iterate(ValueError, starts("failed to decompress lz4 payload: "), after=0),
    ),
    "compression_zstd": Case(
        _algo("zstd"),
        load(RuntimeError, starts("JSON error: unknown variant `zstd`, expected `none` or `lz4`")),
        load(RuntimeError, starts("JSON error: unknown variant `zstd`, expected `none` or `lz4`")),
    ),
    "source_name_uncompressed_len_ratio_extra_key": Case(_accepted_changes, OK, OK),
    "manifest_not_json": Case(
        _manifest_text("{x"), load(RuntimeError, JSON_ERROR), load(RuntimeError, JSON_ERROR)
    ),
    "manifest_empty": Case(
        _manifest_text(""), load(RuntimeError, JSON_ERROR), load(RuntimeError, JSON_ERROR)
    ),
    "manifest_array": Case(
        _manifest_text("[]"), load(RuntimeError, JSON_ERROR), load(RuntimeError, JSON_ERROR)
    ),
    "manifest_duplicate_key": Case(
        _duplicate_key,
        load(RuntimeError, starts("JSON error: duplicate manifest field")),
        load(RuntimeError, starts("JSON error: duplicate manifest field")),
    ),
    "v3_without_cache_id": Case(
        _drop("cache_id"),
        load(RuntimeError, starts("JSON error: missing field `cache_id`")),
        load(RuntimeError, starts("JSON error: missing field `cache_id`")),
    ),
    "cache_id_string": Case(
        _set("cache_id", "5"),
        load(RuntimeError, starts('JSON error: invalid type: string "5", expected u64')),
        load(RuntimeError, starts('JSON error: invalid type: string "5", expected u64')),
    ),
    "cache_id_negative": Case(
        _set("cache_id", -1), load(RuntimeError, JSON_ERROR), load(RuntimeError, JSON_ERROR)
    ),
    "cache_id_u64_max": Case(_set("cache_id", 2**64 - 1), OK, OK, verify=_ids(2**64 - 1)),
    "cache_id_small": Case(_set("cache_id", 7), OK, OK, verify=_ids(7)),
}


def _case_params() -> list[Any]:
    return [
        pytest.param(name, validate, id=f"{name}-{'validate' if validate else 'plain'}")
        for name in CASES
        for validate in (False, True)
    ]


def _check_error(exc: BaseException, outcome: Outcome, cache: Path) -> None:
    assert type(exc) is outcome.error, repr(exc)
    assert outcome.check is not None
    outcome.check(str(exc), cache)


def _cache_id(cache: Path) -> int:
    data = manifest(cache)
    return data["cache_id"] if data.get("format_version") == 3 else 0


@pytest.mark.parametrize(("name", "validate"), _case_params())
def test_corrupted_cache(runtime, reader: Reader, fixture_copy, name: str, validate: bool) -> None:
    case = CASES[name]
    outcome = case.validate if validate else case.plain
    cache = fixture_copy(case.fixture)
    case.corrupt(cache)
    root = cache.parent
    before = snapshot(root)

    if outcome.stage == "load":
        with pytest.raises(BaseException) as info:
            runtime.cached_dataset([cache], reader_config=reader(validate))
        _check_error(info.value, outcome, cache)
        # Loading again fails the same way (nothing was cached or repaired).
        with pytest.raises(BaseException) as again:
            runtime.cached_dataset([cache], reader_config=reader(validate))
        assert type(again.value) is type(info.value) and str(again.value) == str(info.value)
        assert snapshot(root) == before
        return

    dataset = runtime.cached_dataset([cache], reader_config=reader(validate))
    cache_id = _cache_id(cache)
    total = manifest(cache)["sample_count"]
    if outcome.stage == "ok":
        samples = list(dataset)
        assert [s.sample_id for s in samples] == list(range(total))
        if case.verify is not None:
            case.verify(samples, cache)
        assert dataset.get_item(cache_id, total - 1).sample_id == total - 1
    else:
        iterator = iter(dataset)
        got: list[int] = []
        with pytest.raises(BaseException) as info:
            for sample in iterator:
                got.append(sample.sample_id)
        _check_error(info.value, outcome, cache)
        # The error surfaces at its position in the stream: the samples before the bad one
        # are delivered first, in order (SPEC 6: a reorder stage delivers in plan order; the
        # reference does this in most runs, but can lose in-flight samples to the race).
        assert got == list(range(outcome.after))
        # That iterator is finished.
        with pytest.raises(StopIteration):
            next(iterator)
        # Random access to the bad sample fails the same way; others work.
        with pytest.raises(BaseException) as item_info:
            dataset.get_item(cache_id, outcome.after)
        _check_error(item_info.value, outcome, cache)
        if outcome.after > 0:
            assert dataset.get_item(cache_id, 0).sample_id == 0
            # A new iterator takes the next window (positions total.., i.e. row 0 again).
            assert next(iter(dataset)).sample_id == 0
        else:
            with pytest.raises(BaseException) as again:
                next(iter(dataset))
            _check_error(again.value, outcome, cache)

    if outcome.get_metadata is not None:
        error, check = outcome.get_metadata
        try:
            dataset.get_metadata()
        except BaseException as exc:
            assert type(exc) is error, repr(exc)
            check(str(exc), cache)
        else:
            pytest.fail("get_metadata did not raise")
    assert snapshot(root) == before


DAMAGED_METADATA_ARROW = [
    name
    for name, case in CASES.items()
    if name.startswith("metadata_arrow_") and case.plain.get_metadata is not None
]


def _fix_metadata_checksum(cache: Path) -> None:
    digest = hashlib.sha256((cache / "metadata.arrow").read_bytes()).hexdigest()
    edit_manifest(cache, lambda m: m.__setitem__("metadata_sha256", digest))


@pytest.mark.parametrize("name", DAMAGED_METADATA_ARROW)
def test_damaged_metadata_arrow_fails_batches_and_get_items_alike(
    runtime, reader: Reader, fixture_copy, name: str
) -> None:
    """``iter_batches`` and ``get_items`` read metadata.arrow natively (arrow.zig), as a
    validated open does (not with pyarrow, as ``get_metadata`` does): the validated
    open's error type and text for the same damage (its checksum fixed up), naming
    metadata.arrow (not the shard of the record being read)."""
    case = CASES[name]
    cache = fixture_copy(case.fixture)
    case.corrupt(cache)
    _fix_metadata_checksum(cache)
    with pytest.raises((ValueError, RuntimeError)) as opened:
        runtime.cached_dataset([cache], reader_config=reader(True))
    assert str(cache / "metadata.arrow") in str(opened.value)
    dataset = runtime.cached_dataset([cache], reader_config=reader(False))
    cache_id = _cache_id(cache)
    for read in (
        lambda: next(iter(dataset.iter_batches(8))),
        lambda: dataset.get_items([cache_id], [0]),
    ):
        with pytest.raises(type(opened.value)) as info:
            read()
        assert str(info.value) == str(opened.value)


@pytest.mark.parametrize(
    ("footer_length", "message"),
    [
        (0, "Arrow error: Parser error: Unable to get root as footer: "),
        (1, "Arrow error: Parser error: Unable to get root as footer: "),
        (2**31 - 1, "Arrow error: Parser error: Unable to get root as footer: "),
        (-1, "Arrow error: Parser error: Invalid footer length: -1"),
    ],
)
def test_damaged_footer_fails_a_validated_open_as_0_4_8(
    runtime, reader: Reader, fixture_copy, footer_length: int, message: str
) -> None:
    """0.4.8's validated open reads metadata.arrow with arrow-rs: a footer it cannot use
    is a RuntimeError "Arrow error: Parser error: ..." (its get_metadata, by hand, says
    ValueError "invalid metadata Arrow footer" for some of them: tested above)."""
    cache = fixture_copy("plain_one_shard")
    _metadata_footer_length(footer_length)(cache)
    _fix_metadata_checksum(cache)
    with pytest.raises(RuntimeError) as info:
        runtime.cached_dataset([cache], reader_config=reader(True))
    assert str(info.value).startswith(message), info.value
    assert str(info.value).endswith(f": {cache / 'metadata.arrow'}"), info.value


@pytest.mark.parametrize("shuffle", [False, True], ids=["ordered", "shuffled"])
def test_garbage_metadata_arrow_still_iterates(
    runtime, reader: Reader, fixture_copy, shuffle: bool
) -> None:
    cache = fixture_copy("plain_one_shard")
    _metadata_garbage(cache)
    before = snapshot(cache)
    dataset = runtime.cached_dataset([cache], reader_config=reader(False, shuffle=shuffle, seed=3))
    want = {row["sample_id"]: row for row in expected("plain_one_shard")["samples"]}
    samples = list(dataset)
    assert len(samples) == 120
    for sample in samples:
        assert hashlib.sha256(sample.data).hexdigest() == want[sample.sample_id]["sha256"]
        assert sample.metadata == want[sample.sample_id]["metadata"]
    if not shuffle:
        assert [s.sample_id for s in samples] == list(range(120))
    assert snapshot(cache) == before


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_error_ends_only_that_iterator(
    runtime, reader: Reader, fixture_copy, validate: bool
) -> None:
    """Reference 4.5: the failing iterator is finished; the next one takes the next window."""
    cache = fixture_copy("plain_one_shard")
    _rename_json_key(cache)
    before = snapshot(cache)
    dataset = runtime.cached_dataset([cache], reader_config=reader(validate))
    dataset.set_epoch_len(3)
    iterator = iter(dataset)
    got = []
    with pytest.raises(
        ValueError, match=r"^embedded metadata field 'name' is missing: .*/shards/000000\.bin$"
    ):
        for sample in iterator:
            got.append(sample.sample_id)
    assert got == [0, 1]
    with pytest.raises(StopIteration):
        next(iterator)
    with pytest.raises(StopIteration):
        next(iterator)
    assert [s.sample_id for s in dataset] == [3, 4, 5]
    assert [s.sample_id for s in dataset] == [6, 7, 8]
    with pytest.raises(
        ValueError, match=r"^embedded metadata field 'name' is missing: .*/shards/000000\.bin$"
    ):
        dataset.get_item(PLAIN_ONE_SHARD_ID, 2)
    assert dataset.get_item(PLAIN_ONE_SHARD_ID, 3).sample_id == 3
    assert len(dataset) == 3
    assert snapshot(cache) == before


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_error_in_shuffled_stream_ends_the_iterator(
    runtime, reader: Reader, fixture_copy, validate: bool
) -> None:
    cache = fixture_copy("plain_one_shard")
    _rename_json_key(cache)
    before = snapshot(cache)
    dataset = runtime.cached_dataset([cache], reader_config=reader(validate, shuffle=True, seed=0))
    dataset.set_epoch_len(2000)
    iterator = iter(dataset)
    got = []
    with pytest.raises(
        ValueError, match=r"^embedded metadata field 'name' is missing: .*/shards/000000\.bin$"
    ):
        for sample in iterator:
            got.append(sample.sample_id)
    assert BAD not in got and len(got) < 2000
    with pytest.raises(StopIteration):
        next(iterator)
    # Still usable: random access to a good sample works.
    assert dataset.get_item(PLAIN_ONE_SHARD_ID, 0).sample_id == 0
    assert snapshot(cache) == before


def test_error_in_one_of_two_iterators(runtime, reader: Reader, fixture_copy) -> None:
    """Two live iterators: the failing one ends, the other continues its own window."""
    cache = fixture_copy("plain_one_shard")
    _rename_json_key(cache)
    dataset = runtime.cached_dataset([cache], reader_config=reader(False))
    dataset.set_epoch_len(3)
    first, second = iter(dataset), iter(dataset)
    assert next(first).sample_id == 0  # reserves 0..2
    assert next(second).sample_id == 3  # reserves 3..5
    assert next(first).sample_id == 1
    with pytest.raises(ValueError):
        next(first)
    assert [s.sample_id for s in second] == [4, 5]
    with pytest.raises(StopIteration):
        next(first)


def test_error_with_a_second_cache(runtime, reader: Reader, fixture_copy) -> None:
    """A corrupt record in the second cache: the first cache's samples come first."""
    good = fixture_copy("unicode_é_name")
    bad = fixture_copy("plain_one_shard")
    _flip_length_prefix(bad)
    dataset = runtime.cached_dataset([good, bad], reader_config=reader(False))
    iterator = iter(dataset)
    got = []
    # The error names the corrupt record's shard, in the second cache.
    with pytest.raises(
        ValueError, match=rf"^invalid binary record: {re.escape(str(bad / SHARD0))}$"
    ):
        for sample in iterator:
            got.append((sample.cache_id, sample.sample_id))
    assert got == [(UNICODE_ID, i) for i in range(10)] + [
        (PLAIN_ONE_SHARD_ID, 0),
        (PLAIN_ONE_SHARD_ID, 1),
    ]
    with pytest.raises(StopIteration):
        next(iterator)
    with pytest.raises(ValueError) as info:
        runtime.cached_dataset([good, bad], reader_config=reader(True))
    assert str(info.value) == f"checksum mismatch for {bad / SHARD0}"


@pytest.mark.parametrize(
    "name", ["plain_one_shard", "plain_many_shards", "lz4_many_shards", "unicode_é_name"]
)
def test_validate_cache_accepts_the_fixtures(
    runtime, reader: Reader, fixture_copy, name: str
) -> None:
    # Policy 1: the reference rejects 271 / 3.0 (score of sample 271) with validate_cache.
    cache = fixture_copy(name)
    before = snapshot(cache)
    dataset = runtime.cached_dataset([cache], reader_config=reader(True))
    want = expected(name)["samples"]
    samples = list(dataset)
    assert [s.metadata for s in samples] == [row["metadata"] for row in want]
    assert snapshot(cache) == before


# ---------------------------------------------------------------- dataset-level errors


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_no_paths(runtime, reader: Reader, validate: bool) -> None:
    with pytest.raises(ValueError) as info:
        runtime.cached_dataset([], reader_config=reader(validate))
    assert type(info.value) is ValueError
    assert str(info.value) == "CachedDataset requires at least one cache path"


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_nonexistent_path(runtime, reader: Reader, tmp_path: Path, validate: bool) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ValueError) as info:
        runtime.cached_dataset([missing], reader_config=reader(validate))
    assert str(info.value) == f"missing manifest: {missing}/manifest.json"
    assert not missing.exists()


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_base_directory_is_not_a_cache(
    runtime, reader: Reader, fixture_copy, validate: bool
) -> None:
    cache = fixture_copy("plain_one_shard")
    base = cache.parent
    before = snapshot(base)
    with pytest.raises(ValueError) as info:
        runtime.cached_dataset([base], reader_config=reader(validate))
    assert str(info.value) == f"missing manifest: {base}/manifest.json"
    assert snapshot(base) == before


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_a_file_is_not_a_cache(runtime, reader: Reader, fixture_copy, validate: bool) -> None:
    cache = fixture_copy("plain_one_shard")
    with pytest.raises(ValueError) as info:
        runtime.cached_dataset([cache / "index.bin"], reader_config=reader(validate))
    assert str(info.value) == f"missing manifest: {cache}/index.bin/manifest.json"


def test_bare_string_is_iterated_per_character(runtime, reader: Reader, fixture_copy) -> None:
    cache = fixture_copy("plain_one_shard")
    with pytest.raises(ValueError) as info:
        runtime.cached_dataset(str(cache), reader_config=reader(False))
    assert str(info.value) == "missing manifest: /manifest.json"


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_good_path_then_missing_path(
    runtime, reader: Reader, fixture_copy, tmp_path: Path, validate: bool
) -> None:
    cache = fixture_copy("plain_one_shard")
    missing = tmp_path / "missing"
    with pytest.raises(ValueError) as info:
        runtime.cached_dataset([cache, missing], reader_config=reader(validate))
    assert str(info.value) == f"missing manifest: {missing}/manifest.json"


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_same_path_twice(runtime, reader: Reader, fixture_copy, validate: bool) -> None:
    cache = fixture_copy("plain_one_shard")
    with pytest.raises(ValueError) as info:
        runtime.cached_dataset([cache, cache], reader_config=reader(validate))
    assert str(info.value) == f"duplicate cache_id {PLAIN_ONE_SHARD_ID}"


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_two_caches_with_the_same_name(
    runtime, reader: Reader, fixture_copy, tmp_path: Path, validate: bool
) -> None:
    cache = fixture_copy("plain_one_shard")
    other = tmp_path / "elsewhere" / "plain_one_shard"
    shutil.copytree(cache, other)
    with pytest.raises(ValueError) as info:
        runtime.cached_dataset([cache, other], reader_config=reader(validate))
    assert str(info.value) == f"duplicate cache_id {PLAIN_ONE_SHARD_ID}"


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_v2_position_ids_must_be_unique(
    runtime, reader: Reader, fixture_copy, validate: bool
) -> None:
    first = fixture_copy("plain_one_shard")
    second = fixture_copy("unicode_é_name")
    _set("format_version", 2)(first)
    _set("cache_id", 0)(second)  # v3 id 0 collides with the v2 position 0
    with pytest.raises(ValueError) as info:
        runtime.cached_dataset([first, second], reader_config=reader(validate))
    assert str(info.value) == "duplicate cache_id 0"


def _renamed_schema_field(cache: Path) -> None:
    edit_manifest(cache, lambda m: m["metadata_schema"][0].__setitem__("name", "flah"))


@pytest.mark.parametrize(
    ("change", "validated_message"),
    [
        pytest.param(None, None, id="other_fixture_schema"),
        # With validate_cache the reference checks each cache's metadata.arrow against its
        # own manifest first, so an edited schema fails that check before the comparison.
        pytest.param(_schema_kind, "metadata 'label' is not float", id="kind"),
        pytest.param(_schema_reorder, "metadata 'score' is not float", id="order"),
        pytest.param(_renamed_schema_field, None, id="name"),
    ],
)
@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_caches_must_share_one_schema(
    runtime,
    reader: Reader,
    fixture_copy,
    change: Any,
    validated_message: str | None,
    validate: bool,
) -> None:
    first = fixture_copy("unicode_é_name")
    if change is None:
        second = fixture_copy("text_records_v1")
    else:
        second = fixture_copy("plain_one_shard")
        change(second)
    with pytest.raises(ValueError) as info:
        runtime.cached_dataset([first, second], reader_config=reader(validate))
    if validate and validated_message is not None:
        assert str(info.value) == f"{validated_message}: {second / 'metadata.arrow'}"
    else:
        assert str(info.value) == "all caches must share the same metadata schema"


def _zero_sample_cache(cache: Path) -> None:
    import pyarrow as pa

    (cache / "index.bin").write_bytes(b"")
    table = pa.ipc.open_file(str(cache / "metadata.arrow")).read_all().slice(0, 0)
    with pa.OSFile(str(cache / "metadata.arrow"), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)

    def change(m: dict[str, Any]) -> None:
        m["sample_count"] = 0
        m["index_sha256"] = hashlib.sha256(b"").hexdigest()
        m["metadata_sha256"] = hashlib.sha256((cache / "metadata.arrow").read_bytes()).hexdigest()

    edit_manifest(cache, change)


@pytest.mark.parametrize("validate", [False, True], ids=["plain", "validate"])
def test_zero_sample_cache(runtime, reader: Reader, fixture_copy, validate: bool) -> None:
    cache = fixture_copy("text_records_v1")
    _zero_sample_cache(cache)
    before = snapshot(cache)
    with pytest.raises(ValueError) as info:
        runtime.cached_dataset([cache], reader_config=reader(validate))
    assert str(info.value) == "dataset contains no physical samples"
    assert snapshot(cache) == before


def test_reader_config_is_required(runtime, fixture_copy) -> None:
    cache = fixture_copy("plain_one_shard")
    with pytest.raises(TypeError) as info:
        runtime.cached_dataset([cache])  # type: ignore[call-arg]
    assert str(info.value).endswith("missing 1 required keyword-only argument: 'reader_config'")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"seed": 0}, "'dict' object has no attribute 'seed'"),
        (None, "'NoneType' object has no attribute 'seed'"),
    ],
    ids=["dict", "none"],
)
def test_reader_config_must_be_a_config(runtime, fixture_copy, config: Any, message: str) -> None:
    cache = fixture_copy("plain_one_shard")
    with pytest.raises(AttributeError) as info:
        runtime.cached_dataset([cache], reader_config=config)
    assert str(info.value) == message


def test_load_errors_change_nothing_on_disk(runtime, reader: Reader, fixture_copy) -> None:
    """Every load and read above leaves the tree as it was; here all fixtures at once."""
    copies = [
        fixture_copy(name) for name in ("plain_one_shard", "plain_many_shards", "lz4_many_shards")
    ]
    root = copies[0].parent
    before = snapshot(root)
    for validate in (False, True):
        dataset = runtime.cached_dataset(
            copies, reader_config=reader(validate, shuffle=True, seed=9)
        )
        assert len(list(dataset)) == 720
        dataset.get_item(PLAIN_MANY_SHARDS_ID, 271)
    with pytest.raises(ValueError):
        runtime.cached_dataset([*copies, root], reader_config=reader(False))
    assert snapshot(root) == before
    assert snapshot(FIXTURES / "plain_one_shard") == snapshot(copies[0])


# ------------------------------------------- files that are not what they should be


def test_shard_name_longer_than_a_file_name_is_an_io_error(runtime, fixture_copy) -> None:
    """A shard name of 256 bytes cannot name a file: 0.4.8's "File name too long" (it
    aborted the process: std's statFile treats ENAMETOOLONG as unreachable)."""
    cache = fixture_copy("plain_one_shard")
    edit_manifest(cache, lambda m: m["shards"][0].__setitem__("name", "x" * 256))
    with pytest.raises(RuntimeError) as info:
        runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=0))
    assert (
        str(info.value)
        == f"I/O error: File name too long (os error 36): {cache}/shards/{'x' * 256}"
    )


SPECIAL_FILE_SCRIPT = """
import os, sys
import dataset_rt as drt
cache, name, kind, validate, call = sys.argv[1:]
target = os.path.join(cache, name)
os.remove(target)
if kind == "fifo":
    os.mkfifo(target)
else:
    os.symlink("/dev/zero", target)
runtime = drt.DatasetRuntime(num_workers=1)
try:
    config = drt.ReaderConfig(seed=0, validate_cache=validate == "1")
    dataset = runtime.cached_dataset([cache], reader_config=config)
    if call == "get_metadata":
        dataset.get_metadata()
    else:
        next(iter(dataset.iter_batches(4)))
    print("no error")
except Exception as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize(
    ("name", "kind", "validate", "call"),
    [
        ("manifest.json", "fifo", "0", "batches"),
        ("index.bin", "fifo", "0", "batches"),
        ("index.bin", "zero", "1", "batches"),
        ("metadata.arrow", "fifo", "1", "batches"),
        ("metadata.arrow", "zero", "1", "batches"),
        ("metadata.arrow", "fifo", "0", "batches"),
        ("metadata.arrow", "fifo", "0", "get_metadata"),
    ],
)
def test_special_files_are_rejected_without_blocking(
    fixture_copy, name: str, kind: str, validate: str, call: str
) -> None:
    """A FIFO blocks an open for reading and /dev/zero never ends a read (0.4.8 hangs on
    both): a cache file must be a regular file, or the load names it."""
    import subprocess
    import sys

    cache = fixture_copy("plain_one_shard")
    done = subprocess.run(
        [sys.executable, "-c", SPECIAL_FILE_SCRIPT, str(cache), name, kind, validate, call],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == f"ValueError not a regular file: {cache}/{name}"


@pytest.mark.parametrize("name", ["manifest.json", "index.bin", "metadata.arrow"])
def test_a_cache_file_in_a_symlink_loop_is_named_as_an_os_error(
    runtime, fixture_copy, name: str
) -> None:
    """0.4.8 reports a manifest it cannot stat (a symbolic link loop) as missing; the
    OS error is reported instead, naming the file (docs/compatibility.md)."""
    cache = fixture_copy("plain_one_shard")
    (cache / name).unlink()
    (cache / name).symlink_to(name)
    with pytest.raises(RuntimeError) as caught:
        runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=0)).get_metadata()
    assert str(caught.value) == (
        f"I/O error: Too many levels of symbolic links (os error 40): {cache / name}"
    )


def test_batches_check_metadata_column_names(runtime, tmp_path: Path) -> None:
    """Batches take metadata.arrow's columns by position: a manifest naming them in
    another order is refused, as get_metadata refuses it, instead of values served under
    each other's names."""

    class Source:
        name = "ab"

        def __iter__(self) -> Any:
            for i in range(4):
                yield drt.CacheInput(b"x%d" % i, {"a": i, "b": 100 + i})

    config = drt.WriterConfig(show_progress=False)
    [result] = runtime.write_cache(Source(), tmp_path, writer_config=config)
    cache = result.path
    edit_manifest(
        cache,
        lambda m: m.__setitem__(
            "metadata_schema", [{"name": "b", "kind": "int"}, {"name": "a", "kind": "int"}]
        ),
    )
    cache_id = manifest(cache)["cache_id"]
    message = f"metadata column 'b' does not match manifest schema: {cache}/metadata.arrow"
    dataset = runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=0))
    with pytest.raises(ValueError) as info:
        next(iter(dataset.iter_batches(4)))
    assert str(info.value) == message
    with pytest.raises(ValueError) as info:
        dataset.get_items([cache_id, cache_id], [0, 1])
    assert str(info.value) == message
    with pytest.raises(ValueError, match="metadata column 'b' does not match manifest schema"):
        dataset.get_metadata()


def test_a_shard_deleted_while_open_is_named(runtime, fixture_copy) -> None:
    """The cache directory is the one opened; only a shard is gone: the error names it
    (not "the cache was replaced")."""
    cache = fixture_copy("plain_many_shards")
    dataset = runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=0))
    shard = cache / "shards" / manifest(cache)["shards"][0]["name"]
    shard.unlink()
    with pytest.raises(RuntimeError) as info:
        list(dataset)
    assert str(info.value) == f"I/O error: No such file or directory (os error 2): {shard}"


def test_deeply_nested_manifest_is_refused_as_in_0_4_8(runtime, fixture_copy) -> None:
    """An extra manifest key nesting 200 arrays: 0.4.8's serde_json stops at 128 levels
    ("JSON error: recursion limit exceeded"); so does the load here (the command's own
    JSON reading of the manifest then never sees it)."""
    cache = fixture_copy("plain_one_shard")
    text = (cache / "manifest.json").read_text(encoding="utf-8")
    (cache / "manifest.json").write_text(
        text.replace("{", '{"deep": ' + "[" * 200 + "]" * 200 + ", ", 1), encoding="utf-8"
    )
    with pytest.raises(RuntimeError) as info:
        runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=0))
    assert str(info.value).startswith("JSON error: recursion limit exceeded at line 1 column ")
    assert str(info.value).endswith(f" in {cache}/manifest.json")


@pytest.mark.parametrize("lz4", [False, True], ids=["plain", "lz4"])
def test_record_errors_name_the_records_shard(
    runtime, reader: Reader, fixture_copy, lz4: bool
) -> None:
    """A corrupt record in a later shard: every read path names that shard's file
    after the reference's text (per-sample ordered and shuffled, batches copied and
    not, get_item, get_items)."""
    cache = fixture_copy("lz4_many_shards" if lz4 else "plain_many_shards")
    total = manifest(cache)["sample_count"]
    victim = total - 2
    shard_id, offset, _ = index_row(cache, victim)
    assert shard_id > 0
    xor_byte(shard_path(cache, shard_id), offset + 4, 0x10)  # its JSON length
    want = f"invalid binary record: {shard_path(cache, shard_id)}"
    cache_id = _cache_id(cache)
    for shuffle in (False, True):
        config = drt.ReaderConfig(
            seed=0, shuffle=shuffle, validate_cache=False, io_backend=reader(False).io_backend
        )
        dataset = runtime.cached_dataset([cache], reader_config=config)
        dataset.set_epoch_len(4 * total)
        with pytest.raises(ValueError) as info:
            for _ in dataset:
                pass
        assert str(info.value) == want
        for copy in (True, False):
            with pytest.raises(ValueError) as info:
                for _ in dataset.iter_batches(7, copy=copy):
                    pass
            assert str(info.value) == want
    with pytest.raises(ValueError) as info:
        dataset.get_item(cache_id, victim)
    assert str(info.value) == want
    with pytest.raises(ValueError) as info:
        dataset.get_items([cache_id] * 3, [0, victim, 1])
    assert str(info.value) == want
    assert dataset.get_item(cache_id, 0).sample_id == 0


@pytest.mark.parametrize("name", ["data", "metadata", "a", "cache"])
def test_record_errors_name_the_shard_whatever_the_cache_is_called(
    runtime, reader: Reader, fixture_copy, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A relative cache path that occurs in the message's text ("data" in "metadata",
    "a" anywhere) still gets the shard named: only a path of its own counts as naming a
    file of the cache."""
    source = fixture_copy("plain_one_shard")
    monkeypatch.chdir(source.parent)
    source.rename(name)
    _rename_json_key(Path(name))
    dataset = runtime.cached_dataset([name], reader_config=reader(False))
    want = f"embedded metadata field 'name' is missing: {name}/shards/000000.bin"
    with pytest.raises(ValueError) as info:
        for _ in dataset:
            pass
    assert str(info.value) == want
    with pytest.raises(ValueError) as info:
        dataset.get_item(PLAIN_ONE_SHARD_ID, 2)
    assert str(info.value) == want


@pytest.mark.parametrize("relative", [True, False], ids=["relative", "absolute"])
def test_a_removed_cache_is_named_once_on_every_read_path(
    runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: bool
) -> None:
    """A cache removed while open: iteration, get_item and get_items all say so in the
    same words, without a shard's name appended (the message names the cache)."""
    from tests.sources import Numbers

    [result] = runtime.write_cache(
        [Numbers("c", count=50)],
        tmp_path,
        writer_config=drt.WriterConfig(max_shard_bytes=200, show_progress=False),
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    monkeypatch.chdir(tmp_path)
    path = "c" if relative else str(tmp_path / "c")
    config = drt.ReaderConfig(seed=0, shuffle=False, prefetch_size=1)
    dataset = runtime.cached_dataset([path], reader_config=config)
    dataset.set_epoch_len(1)
    [first] = list(dataset)
    shutil.rmtree(tmp_path / "c")
    dataset.set_epoch_len(50)
    want = (
        f"cache {path} was replaced (rebuilt) or removed while this dataset was open; open it again"
    )
    with pytest.raises(ValueError) as info:
        for _ in dataset:
            pass
    assert str(info.value) == want
    with pytest.raises(ValueError) as info:
        dataset.get_item(first.cache_id, 40)
    assert str(info.value) == want
    with pytest.raises(ValueError) as info:
        dataset.get_items([first.cache_id] * 2, [30, 41])
    assert str(info.value) == want
