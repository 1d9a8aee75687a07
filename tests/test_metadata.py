"""The active metadata table: get/update semantics and validation order (reference 3.5, 4.6)."""

from __future__ import annotations

import json

import polars as pl
import pytest

import dataset_rt as drt
from tests.conftest import FIXTURES, expected


@pytest.fixture
def dataset(runtime):
    return runtime.cached_dataset(
        [FIXTURES / "unicode_é_name", FIXTURES / "plain_one_shard"],
        reader_config=drt.ReaderConfig(seed=42, shuffle=False),
    )


def test_initial_table(dataset) -> None:
    df = dataset.get_metadata()
    assert df.columns == ["cache_id", "sample_id", "flag", "label", "name", "score", "weight"]
    assert df.dtypes == [
        pl.UInt64,
        pl.UInt64,
        pl.Boolean,
        pl.Int64,
        pl.String,
        pl.Float64,
        pl.Float64,
    ]
    assert df.height == 130
    first = next(iter(dataset)).cache_id
    assert df["cache_id"].to_list()[:10] == [first] * 10
    assert df["sample_id"].to_list() == list(range(10)) + list(range(120))
    rows = expected("unicode_é_name")["samples"] + expected("plain_one_shard")["samples"]
    for name in ("flag", "label", "name", "score"):
        assert df[name].to_list() == [row["metadata"][name] for row in rows]
    assert df["weight"].to_list() == [1.0] * 130
    assert dataset.samples_metadata().equals(df)


def test_update_keeps_frame_and_resets(dataset) -> None:
    df = dataset.get_metadata()
    dataset.set_epoch_len(3)
    assert [s.sample_id for s in dataset] == [0, 1, 2]
    subset = df.filter(pl.col("label") > 0).with_columns(
        pl.col("sample_id").cast(pl.Int32),
        pl.col("weight").cast(pl.Int64),
        pl.lit("x").alias("extra"),
    )
    subset = pl.concat([subset, subset.head(2)])
    dataset.update_metadata(subset)
    assert dataset.get_metadata().equals(subset)
    assert len(dataset) == subset.height
    got = [(s.cache_id, s.sample_id) for s in dataset]
    assert got == list(zip(subset["cache_id"].to_list(), subset["sample_id"].to_list()))


def base(dataset) -> pl.DataFrame:
    return dataset.get_metadata()


CASES = [
    ("empty", lambda df: df.clear(), "metadata table must include at least one sample"),
    (
        "empty beats missing",
        lambda df: df.clear().drop("weight", "label"),
        "metadata table must include at least one sample",
    ),
    ("missing stored", lambda df: df.drop("label"), "samples metadata missing 'label' column"),
    (
        "stored type",
        lambda df: df.with_columns(pl.col("label").cast(pl.Int32)),
        "samples metadata column 'label' must have Arrow type Int64",
    ),
    (
        "stored type beats missing weight",
        lambda df: df.with_columns(pl.col("score").cast(pl.Float32)).drop("weight"),
        "samples metadata column 'score' must have Arrow type Float64",
    ),
    (
        "categorical string",
        lambda df: df.with_columns(pl.col("name").cast(pl.Categorical)),
        "samples metadata column 'name' must have Arrow type Utf8",
    ),
    (
        "missing cache_id",
        lambda df: df.drop("cache_id"),
        "samples metadata missing 'cache_id' column",
    ),
    (
        "missing sample_id",
        lambda df: df.drop("sample_id", "weight"),
        "samples metadata missing 'sample_id' column",
    ),
    ("missing weight", lambda df: df.drop("weight"), "samples metadata missing 'weight' column"),
    (
        "weight zero",
        lambda df: df.with_columns(
            pl.when(pl.int_range(pl.len()) == 1)
            .then(0.0)
            .otherwise(pl.col("weight"))
            .alias("weight")
        ),
        "weight 1 must be positive and finite",
    ),
    (
        "weight nan",
        lambda df: df.with_columns(
            pl.when(pl.int_range(pl.len()) == 4)
            .then(float("nan"))
            .otherwise(pl.col("weight"))
            .alias("weight")
        ),
        "weight 4 must be positive and finite",
    ),
    (
        "weight null",
        lambda df: df.with_columns(
            pl.when(pl.int_range(pl.len()) == 0)
            .then(None)
            .otherwise(pl.col("weight"))
            .alias("weight")
        ),
        "samples metadata column 'weight' contains null",
    ),
    (
        "weight int8",
        lambda df: df.with_columns(pl.col("weight").cast(pl.Int8)),
        "samples metadata column 'weight' must be numeric",
    ),
    (
        "weight string",
        lambda df: df.with_columns(pl.col("weight").cast(pl.String)),
        "samples metadata column 'weight' must be numeric",
    ),
    (
        "sample_id float",
        lambda df: df.with_columns(pl.col("sample_id").cast(pl.Float64)),
        "samples metadata column 'sample_id' must be an integer",
    ),
    (
        "sample_id negative",
        lambda df: df.with_columns(pl.col("sample_id").cast(pl.Int64) - 1),
        "samples metadata column 'sample_id' must be non-negative",
    ),
    (
        "cache_id null",
        lambda df: df.with_columns(
            pl.when(pl.int_range(pl.len()) == 3)
            .then(None)
            .otherwise(pl.col("cache_id"))
            .alias("cache_id")
        ),
        "samples metadata column 'cache_id' contains null",
    ),
    # In one row, the weight cell comes before the identity.
    (
        "string weight and an unknown sample in row 0",
        lambda df: df.with_columns(
            pl.col("weight").cast(pl.String),
            pl.when(pl.int_range(pl.len()) == 0)
            .then(99)
            .otherwise(pl.col("sample_id"))
            .alias("sample_id"),
        ),
        "samples metadata column 'weight' must be numeric",
    ),
    # A null cell is reported before the column's type (0.4.8 checks cell by cell)...
    (
        "float sample_id with a null in row 0",
        lambda df: df.with_columns(
            pl.when(pl.int_range(pl.len()) == 0)
            .then(None)
            .otherwise(pl.col("sample_id").cast(pl.Float64))
            .alias("sample_id")
        ),
        "samples metadata column 'sample_id' contains null",
    ),
    (
        "string weight of nulls",
        lambda df: df.with_columns(weight=pl.lit(None, pl.String)),
        "samples metadata column 'weight' contains null",
    ),
    # ...the type first when the null comes after row 0...
    (
        "float sample_id with a null in row 3",
        lambda df: df.with_columns(
            pl.when(pl.int_range(pl.len()) == 3)
            .then(None)
            .otherwise(pl.col("sample_id").cast(pl.Float64))
            .alias("sample_id")
        ),
        "samples metadata column 'sample_id' must be an integer",
    ),
    # ...and for a column of nulls only (Polars' Null dtype, no validity bitmap).
    (
        "weight all null",
        lambda df: df.with_columns(pl.lit(None).alias("weight")),
        "samples metadata column 'weight' must be numeric",
    ),
    (
        "sample_id all null",
        lambda df: df.with_columns(pl.lit(None).alias("sample_id")),
        "samples metadata column 'sample_id' must be an integer",
    ),
    (
        "null weight row 0 before null sample_id row 4",
        lambda df: df.with_columns(
            pl.when(pl.int_range(pl.len()) == 0)
            .then(None)
            .otherwise(pl.col("weight"))
            .alias("weight"),
            pl.when(pl.int_range(pl.len()) == 4)
            .then(None)
            .otherwise(pl.col("sample_id"))
            .alias("sample_id"),
        ),
        "samples metadata column 'weight' contains null",
    ),
    (
        "unknown sample",
        lambda df: df.with_columns(
            pl.when(pl.int_range(pl.len()) == 0)
            .then(99)
            .otherwise(pl.col("sample_id"))
            .alias("sample_id")
        ),
        None,
    ),
    (
        "unknown before negative weight",
        lambda df: df.with_columns(
            pl.when(pl.int_range(pl.len()) == 0)
            .then(-1.0)
            .otherwise(pl.col("weight"))
            .alias("weight"),
            pl.when(pl.int_range(pl.len()) == 5)
            .then(123)
            .otherwise(pl.col("cache_id"))
            .alias("cache_id"),
        ),
        "unknown samples metadata row identity cache_id=123 sample_id=5",
    ),
]


def test_frames_in_and_out_are_not_the_active_table(dataset) -> None:
    """As in 0.4.8: changing a frame in place, one that get_metadata returned or one given
    to update_metadata, leaves the active table as it was."""
    returned = dataset.get_metadata()
    returned.drop_in_place("weight")
    assert "weight" in dataset.get_metadata().columns
    given = dataset.get_metadata().head(5)
    dataset.update_metadata(metadata=given)  # 0.4.8's parameter name
    given.insert_column(0, pl.Series("extra", range(5)))
    given.drop_in_place("sample_id")
    assert dataset.get_metadata().columns == [*returned.columns, "weight"]
    dataset.set_samples_metadata(metadata=dataset.get_metadata())
    assert len(dataset) == 5


@pytest.mark.parametrize("name,edit,message", CASES, ids=[c[0] for c in CASES])
def test_validation_messages_and_state_kept(dataset, name, edit, message) -> None:
    before = dataset.get_metadata()
    dataset.set_epoch_len(4)
    first_window = [s.sample_id for s in dataset]
    bad = edit(before)
    if message is None:
        cache_id = before["cache_id"][0]
        message = f"unknown samples metadata row identity cache_id={cache_id} sample_id=99"
    with pytest.raises(ValueError) as info:
        dataset.update_metadata(bad)
    assert str(info.value) == message
    assert dataset.get_metadata().equals(before)
    assert len(dataset) == 4
    assert [s.sample_id for s in dataset] == [4, 5, 6, 7]
    assert first_window == [0, 1, 2, 3]


def test_non_dataframe(dataset) -> None:
    with pytest.raises(AttributeError, match="has no attribute 'to_arrow'"):
        dataset.update_metadata([1, 2])
    with pytest.raises(AttributeError, match="has no attribute '__arrow_c_stream__'"):
        dataset.update_metadata(dataset.get_metadata()["weight"])


def test_accepted_widths_and_large_table(dataset) -> None:
    df = dataset.get_metadata().with_columns(
        pl.col("cache_id").cast(pl.Int64),
        pl.col("sample_id").cast(pl.UInt32),
        pl.col("weight").cast(pl.Float32),
    )
    dataset.update_metadata(df)
    big = df.head(5).sample(n=1_000_000, with_replacement=True, seed=0)
    dataset.update_metadata(big)
    assert len(dataset) == 1_000_000


def test_dump_and_from_config(dataset, tmp_path) -> None:
    df = (
        dataset.get_metadata()
        .filter(pl.col("label") >= 0)
        .with_columns(pl.lit(2.0).alias("weight"))
    )
    dataset.update_metadata(df)
    dataset.set_epoch_len(7)
    path = dataset.dump_config(tmp_path)
    assert path == tmp_path / "dataset.json"
    config = json.loads(path.read_text())
    assert list(config) == [
        "version",
        "cache_paths",
        "reader_config",
        "num_workers",
        "epoch_len",
        "row_count",
        "metadata_file",
    ]
    assert config["reader_config"] == {
        "seed": 42,
        "prefetch_size": 64,
        "shuffle": False,
        "validate_cache": False,
    }
    assert (config["epoch_len"], config["row_count"], config["num_workers"]) == (7, df.height, 2)
    with pytest.raises(FileExistsError, match="dataset export already exists"):
        dataset.dump_config(tmp_path)
    restored = drt.CachedDataset.from_config(path)
    assert len(restored) == 7
    assert restored.get_metadata().equals(df)
    assert [(s.cache_id, s.sample_id) for s in restored] == [
        (s.cache_id, s.sample_id) for s in dataset
    ]


def test_update_manifests_migrates_v2(runtime, fixture_copy) -> None:
    cache = fixture_copy("unicode_é_name")
    manifest = json.loads((cache / "manifest.json").read_text())
    manifest["format_version"] = 2
    del manifest["cache_id"]
    manifest["zz_extra"] = [1]
    (cache / "manifest.json").write_text(json.dumps(manifest, indent=2))
    ds = runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=0))
    assert next(iter(ds)).cache_id == 0
    assert ds.update_manifests(True) == drt.Err(
        drt.ManifestUpdateError(
            drt.AbsentManifestTarget("unsupported migration request"),
            "unsupported manifest migration target; expected integer 3",
            (),
        )
    )
    result = ds.update_manifests(3)
    target = (cache / "manifest.json").resolve()
    assert result == drt.Ok(
        drt.ManifestUpdateReport((drt.ManifestUpdateEntry(target, 0, "updated"),))
    )
    migrated = json.loads(target.read_text())
    assert list(migrated)[:3] == ["format_version", "cache_id", "source_name"]
    assert list(migrated)[-1] == "zz_extra"
    assert migrated["cache_id"] == 0 and migrated["format_version"] == 3
    again = ds.update_manifests(3)
    assert again == drt.Ok(
        drt.ManifestUpdateReport((drt.ManifestUpdateEntry(target, 0, "unchanged"),))
    )
    assert (
        next(iter(runtime.cached_dataset([cache], reader_config=drt.ReaderConfig(seed=0)))).cache_id
        == 0
    )
