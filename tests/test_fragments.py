"""Fragments and their commit (dataset_rt.fragments), without Ray."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pyarrow as pa
import pytest

import dataset_rt as drt
from dataset_rt import fragments as F

CFG = drt.WriterConfig(show_progress=False, max_shard_bytes=120)


def samples(k: int, n: int = 5) -> list[drt.CacheInput]:
    return [
        drt.CacheInput(f"payload-{k}-{i}".encode(), {"i": k * 100 + i, "s": f"s{i}", "f": i / 4})
        for i in range(n)
    ]


class Source:
    def __init__(self, name: str, items: list[drt.CacheInput]) -> None:
        self.name = name
        self.items = items

    def __iter__(self):
        return iter(self.items)


@pytest.fixture
def rt() -> drt.DatasetRuntime:
    return drt.DatasetRuntime(num_workers=2)


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def read_all(rt: drt.DatasetRuntime, path: Path) -> list[tuple[int, bytes, dict]]:
    config = drt.ReaderConfig(seed=0, shuffle=False, validate_cache=True)
    return [
        (s.sample_id, s.data, s.metadata) for s in rt.cached_dataset([path], reader_config=config)
    ]


def test_commit_equals_one_write_of_the_concatenation(rt, tmp_path):
    """Sample ids follow the fragment order; shards are the fragments' shards, unchanged
    and renumbered; index.bin is write_cache's index with shard ids offset."""
    frags = [
        F.write_fragment(rt, samples(k), tmp_path / "frags", k, writer_config=CFG) for k in range(3)
    ]
    assert [f.sample_count for f in frags] == [5, 5, 5]
    assert F.commit_fragments(frags, tmp_path / "base", "out") == drt.CacheWriteSuccess(
        "out", tmp_path / "base" / "out"
    )
    out = tmp_path / "base" / "out"
    everything = [s for k in range(3) for s in samples(k)]
    assert read_all(rt, out) == [
        (i, s.data, dict(sorted(s.metadata.items()))) for i, s in enumerate(everything)
    ]
    # Byte level: the shards of the cache are the fragments' shards in order.
    fragment_shards = [p.read_bytes() for f in frags for p in sorted((f.path / "shards").iterdir())]
    cache_shards = [p.read_bytes() for p in sorted((out / "shards").iterdir())]
    assert cache_shards == fragment_shards and len(cache_shards) > 3
    # index.bin: each fragment's rows with shard ids offset by the shards before it.
    expected = b""
    offset = 0
    for f in frags:
        for shard_id, at, length in struct.iter_unpack("<QQQ", (f.path / "index.bin").read_bytes()):
            expected += struct.pack("<QQQ", shard_id + offset, at, length)
        offset += len(list((f.path / "shards").iterdir()))
    assert (out / "index.bin").read_bytes() == expected
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source_name"] == "out" and manifest["sample_count"] == 15
    assert manifest["index_sha256"] == hashlib.sha256(expected).hexdigest()
    assert (
        manifest["metadata_sha256"]
        == hashlib.sha256((out / "metadata.arrow").read_bytes()).hexdigest()
    )
    # A single write of the same samples has the same records and metadata table.
    single = rt.write_cache(Source("out", everything), tmp_path / "single", writer_config=CFG)
    assert single == [drt.CacheWriteSuccess("out", tmp_path / "single" / "out")]
    assert b"".join(cache_shards) == b"".join(
        p.read_bytes() for p in sorted((tmp_path / "single/out/shards").iterdir())
    )
    ours = pa.ipc.open_file(str(out / "metadata.arrow")).read_all()
    theirs = pa.ipc.open_file(str(tmp_path / "single/out/metadata.arrow")).read_all()
    assert ours.equals(theirs) and ours.schema.equals(theirs.schema)
    assert pa.ipc.open_file(str(out / "metadata.arrow")).num_record_batches == 1
    assert (
        manifest["metadata_schema"]
        == json.loads((tmp_path / "single/out/manifest.json").read_text())["metadata_schema"]
    )
    # Staging is gone; the fragments are intact (hard links).
    assert list((tmp_path / "base" / "tmp").iterdir()) == []
    assert all((f.path / "manifest.json").exists() for f in frags)


def test_samples_without_metadata_commit(rt, tmp_path):
    """Fragments whose samples carry no metadata (``{}``, as write_cache takes them)
    commit to a cache with no metadata column and a row per sample."""
    frags = [
        F.write_fragment(rt, [(bytes([k, i]), {}) for i in range(k + 2)], tmp_path / "f", k)
        for k in range(2)
    ]
    out = tmp_path / "base" / "out"
    assert F.commit_fragments(frags, tmp_path / "base", "out") == drt.CacheWriteSuccess("out", out)
    assert read_all(rt, out) == [
        (i, d, {}) for i, d in enumerate([b"\0\0", b"\0\1", *(bytes([1, i]) for i in range(3))])
    ]
    table = pa.ipc.open_file(str(out / "metadata.arrow")).read_all()
    assert (table.num_rows, table.num_columns) == (5, 0)


def test_commit_is_deterministic(rt, tmp_path):
    frags = [
        F.write_fragment(rt, samples(k), tmp_path / "frags", k, writer_config=CFG) for k in range(2)
    ]
    for base in ("a", "b"):
        assert isinstance(F.commit_fragments(frags, tmp_path / base, "out"), drt.CacheWriteSuccess)
    assert tree(tmp_path / "a" / "out") == tree(tmp_path / "b" / "out")
    # Another order is another cache (ids follow the list).
    F.commit_fragments(frags[::-1], tmp_path / "c", "out")
    assert read_all(rt, tmp_path / "c" / "out")[0][1] == b"payload-1-0"


def test_rewriting_a_fragment_id_replaces_the_earlier_attempt(rt, tmp_path):
    frags_dir = tmp_path / "frags"
    F.write_fragment(rt, samples(0), frags_dir, 0, writer_config=CFG)
    retry = F.write_fragment(rt, samples(7, n=2), frags_dir, 0, writer_config=CFG)
    assert retry.sample_count == 2
    assert sorted(p.name for p in frags_dir.iterdir()) == ["000000000", "tmp"]
    assert list((frags_dir / "tmp").iterdir()) == []
    F.commit_fragments([retry], tmp_path / "base", "out")
    assert [d for _, d, _ in read_all(rt, tmp_path / "base" / "out")] == [
        b"payload-7-0",
        b"payload-7-1",
    ]


def test_a_failed_fragment_write_leaves_nothing_and_keeps_the_earlier_attempt(rt, tmp_path):
    frags_dir = tmp_path / "frags"
    first = F.write_fragment(rt, samples(0), frags_dir, "part-a", writer_config=CFG)

    def failing():
        yield from samples(1, n=3)
        raise RuntimeError("task died")

    with pytest.raises(F.FragmentWriteError) as info:
        F.write_fragment(rt, failing(), frags_dir, "part-a", writer_config=CFG)
    assert info.value.args == ("part-a", "Python error: RuntimeError: task died")
    assert list((frags_dir / "tmp").iterdir()) == []
    assert json.loads((first.path / "manifest.json").read_text())["sample_count"] == 5
    with pytest.raises(F.FragmentWriteError, match="cache source yielded no samples"):
        F.write_fragment(rt, [], frags_dir, 1, writer_config=CFG)
    assert sorted(p.name for p in frags_dir.iterdir()) == ["part-a", "tmp"]
    with pytest.raises(ValueError, match="plain path segment"):
        F.write_fragment(rt, samples(0), frags_dir, "a/b", writer_config=CFG)
    with pytest.raises(ValueError, match="negative"):
        F.write_fragment(rt, samples(0), frags_dir, -1, writer_config=CFG)


@pytest.mark.parametrize("damaged", ["shards/000001.bin", "index.bin", "metadata.arrow"])
def test_a_corrupt_fragment_is_rejected_naming_the_file(rt, tmp_path, damaged):
    frags = [
        F.write_fragment(rt, samples(k), tmp_path / "frags", k, writer_config=CFG) for k in range(2)
    ]
    target = frags[1].path / damaged
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    result = F.commit_fragments(frags, tmp_path / "base", "out")
    assert result == drt.CacheWriteError("out", f"checksum mismatch for {target}")
    assert not (tmp_path / "base" / "out").exists()
    assert list((tmp_path / "base" / "tmp").iterdir()) == []


def test_a_missing_fragment_is_rejected_naming_it(rt, tmp_path):
    frag = F.write_fragment(rt, samples(0), tmp_path / "frags", 0, writer_config=CFG)
    gone = tmp_path / "frags" / "000000009"
    result = F.commit_fragments([frag, gone], tmp_path / "base", "out")
    assert result == drt.CacheWriteError("out", f"missing fragment manifest: {gone}/manifest.json")
    os.remove(frag.path / "shards" / "000000.bin")
    result = F.commit_fragments([frag], tmp_path / "base", "out")
    assert isinstance(result, drt.CacheWriteError)
    assert result.message.endswith(f"{frag.path}/shards/000000.bin")
    assert not (tmp_path / "base" / "out").exists()
    assert list((tmp_path / "base" / "tmp").iterdir()) == []
    assert F.commit_fragments([], tmp_path / "base", "out") == drt.CacheWriteError(
        "out", "no fragments to commit"
    )


def test_each_fragments_metadata_rows_must_match_its_samples(rt, tmp_path):
    """Row counts that add up over the fragments but not per fragment (a producer that
    wrote wrong metadata.arrow files with matching checksums) would pair rows with other
    fragments' samples: the commit refuses, naming the file."""
    rows = [drt.CacheInput(b"a%d" % i, {"i": i}) for i in range(3)]
    frags = [F.write_fragment(rt, rows, tmp_path / "frags", k) for k in range(2)]
    for frag, values in zip(frags, ([0, 1, 2, 999], [100, 101])):
        table = pa.table({"i": pa.array(values, pa.int64())})
        table = table.cast(pa.schema([pa.field("i", pa.int64(), nullable=False)]))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        data = sink.getvalue().to_pybytes()
        (frag.path / "metadata.arrow").write_bytes(data)
        manifest = json.loads((frag.path / "manifest.json").read_text())
        manifest["metadata_sha256"] = hashlib.sha256(data).hexdigest()
        (frag.path / "manifest.json").write_text(json.dumps(manifest, indent=2))
    result = F.commit_fragments(frags, tmp_path / "base", "out")
    assert isinstance(result, drt.CacheWriteError), result
    assert result.message == (
        f"metadata row count does not match manifest: {frags[0].path}/metadata.arrow has 4 "
        "rows, 3 samples"
    )
    assert not (tmp_path / "base" / "out").exists()


def test_fragments_must_share_schema_and_compression(rt, tmp_path):
    a = F.write_fragment(rt, samples(0), tmp_path / "frags", 0, writer_config=CFG)
    b = F.write_fragment(
        rt, [drt.CacheInput(b"x", {"other": 1})], tmp_path / "frags", 1, writer_config=CFG
    )
    result = F.commit_fragments([a, b], tmp_path / "base", "out")
    assert (
        result.message
        == f"fragment {b.path} has a different metadata schema than fragment {a.path}"
    )
    lz4 = CFG.model_copy(update={"shard_compression": drt.ShardCompression(algo="lz4", ratio=2.0)})
    c = F.write_fragment(rt, samples(2), tmp_path / "frags", 2, writer_config=lz4)
    result = F.commit_fragments([a, c], tmp_path / "base", "out")
    assert "has a different shard compression than fragment" in result.message
    assert not (tmp_path / "base" / "out").exists()
    assert list((tmp_path / "base" / "tmp").iterdir()) == []
    # All lz4 works, and reads back.
    d = F.write_fragment(rt, samples(3), tmp_path / "frags", 3, writer_config=lz4)
    assert isinstance(F.commit_fragments([c, d], tmp_path / "base", "z"), drt.CacheWriteSuccess)
    assert len(read_all(rt, tmp_path / "base" / "z")) == 10


def test_commit_refuses_an_existing_cache_unless_replace(rt, tmp_path):
    frags = [
        F.write_fragment(rt, samples(k), tmp_path / "frags", k, writer_config=CFG) for k in range(2)
    ]
    base = tmp_path / "base"
    (base / "out").mkdir(parents=True)  # an empty directory counts as existing
    assert F.commit_fragments(frags, base, "out") == drt.CacheWriteError(
        "out", f"cache path already exists: {base}/out"
    )
    assert list((base / "out").iterdir()) == []
    os.rmdir(base / "out")
    assert isinstance(F.commit_fragments(frags, base, "out"), drt.CacheWriteSuccess)
    before = tree(base / "out")
    assert F.commit_fragments(frags[:1], base, "out").message.startswith(
        "cache path already exists"
    )
    assert tree(base / "out") == before  # never damaged
    assert isinstance(
        F.commit_fragments(frags[:1], base, "out", replace=True), drt.CacheWriteSuccess
    )
    assert len(read_all(rt, base / "out")) == 5
    assert list((base / "tmp").iterdir()) == []
    assert F.commit_fragments(frags, base, "tmp").message.startswith("CacheSource.name must be")


def test_arrow_fragments_without_python_rows(rt, tmp_path):
    table = pa.table(
        {
            "data": pa.array([b"a", b"", b"ccc", b"dd"], pa.binary()),
            "label": pa.array([1, 2, 3, 4], pa.int32()),
            "score": pa.array([0.5, 1.0, 1e-7, 2.0], pa.float32()),
            "ok": [True, False, True, True],
            "name": pa.array(["w", "x", "y", "é"], pa.large_string()),
        }
    )
    parts = [table.slice(0, 1), table.slice(1, 3).to_batches()[0]]
    frag = F.write_fragment_arrow(rt, parts, tmp_path / "frags", 0, writer_config=CFG)
    assert frag.sample_count == 4
    # The same rows through the per-sample API give the same bytes.
    rows = [
        drt.CacheInput(r["data"], {k: v for k, v in r.items() if k != "data"})
        for r in table.cast(
            pa.schema(
                [
                    ("data", pa.binary()),
                    ("label", pa.int64()),
                    ("score", pa.float64()),
                    ("ok", pa.bool_()),
                    ("name", pa.string()),
                ]
            )
        ).to_pylist()
    ]
    again = F.write_fragment(rt, rows, tmp_path / "frags2", 0, writer_config=CFG)
    assert tree(frag.path) == tree(again.path)
    with pytest.raises(F.FragmentWriteError, match="metadata column 'label' has nulls"):
        F.write_fragment_arrow(
            rt,
            [pa.table({"data": [b"x"], "label": pa.array([None], pa.int64())})],
            tmp_path / "frags",
            1,
            writer_config=CFG,
        )
    with pytest.raises(F.FragmentWriteError, match="has type list"):
        F.write_fragment_arrow(
            rt, [pa.table({"data": [b"x"], "v": [[1]]})], tmp_path / "frags", 1, writer_config=CFG
        )
    with pytest.raises(F.FragmentWriteError, match="metadata keys must be identical"):
        F.write_fragment_arrow(
            rt,
            [table.slice(0, 1), table.drop_columns(["ok"])],
            tmp_path / "frags",
            1,
            writer_config=CFG,
        )
    as_float = pa.table({"data": [b"x"], "i": [1.5]})
    with pytest.raises(F.FragmentWriteError, match="metadata field 'i' expected int, got float"):
        F.write_fragment_arrow(
            rt, [pa.table({"data": [b"x"], "i": [1]}), as_float], tmp_path / "frags", 1
        )
    twice = pa.Table.from_arrays(
        [pa.array([b"x"]), pa.array([1]), pa.array([2])], ["data"] + ["i"] * 2
    )
    with pytest.raises(F.FragmentWriteError, match=r"names columns more than once: \['i'\]"):
        F.write_fragment_arrow(rt, [twice], tmp_path / "frags", 1, writer_config=CFG)
    assert sorted(p.name for p in (tmp_path / "frags").iterdir()) == ["000000000", "tmp"]


def test_committed_cache_validates_in_the_reference(rt, tmp_path):
    """dataset-rt 0.4.8 loads a committed cache with validate_cache=True and reads it."""
    from refenv import ReferenceSetupError, ReferenceUnavailable, ensure_reference, skip_or_fail

    try:
        env = ensure_reference()
    except ReferenceUnavailable as exc:
        skip_or_fail(f"dataset-rt 0.4.8 unavailable: {exc}")
    except ReferenceSetupError:
        raise
    frags = [
        F.write_fragment(rt, samples(k), tmp_path / "frags", k, writer_config=CFG) for k in range(3)
    ]
    F.commit_fragments(frags, tmp_path / "base", "out")
    rows = env.read_validated(tmp_path / "base" / "out")
    expected = [
        [i, s.data.decode(), dict(sorted(s.metadata.items()))]
        for i, s in enumerate(x for k in range(3) for x in samples(k))
    ]
    assert rows == expected
