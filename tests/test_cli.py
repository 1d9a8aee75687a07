"""The dataset-rt command on reference caches and on deliberately corrupted copies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, expected


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dataset_rt", *args], capture_output=True, text=True, timeout=120
    )


def flip_bit(path: Path, at: int | None = None) -> None:
    """Flip the low bit of byte ``at`` of the file at ``path`` (default: its middle byte)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x01
    path.write_bytes(bytes(data))


def test_inspect_json() -> None:
    result = run(
        "inspect", "--json", str(FIXTURES / "lz4_many_shards"), str(FIXTURES / "unicode_é_name")
    )
    assert result.returncode == 0, result.stderr
    first, second = json.loads(result.stdout)
    manifest = json.loads((FIXTURES / "lz4_many_shards" / "manifest.json").read_text())
    assert first["cache_id"] == manifest["cache_id"]
    assert first["sample_count"] == 300
    assert first["shard_count"] == len(manifest["shards"]) == 12
    assert first["compression"] == {"algo": "lz4", "ratio": 2.0}
    assert first["schema"] == manifest["metadata_schema"]
    assert first["bytes"]["shards"] == sum(s["byte_len"] for s in manifest["shards"])
    assert second["source_name"] == "unicode_é_name"


def test_inspect_table_and_missing() -> None:
    result = run("inspect", str(FIXTURES / "plain_one_shard"), "/nonexistent/cache")
    assert result.returncode == 1
    assert "cache_id" in result.stdout and "4233350989699285984" in result.stdout
    assert "missing manifest: /nonexistent/cache/manifest.json" in result.stderr


def test_verify_ok_and_corrupt(fixture_copy) -> None:
    good = run("verify", str(FIXTURES / "plain_many_shards"), str(FIXTURES / "lz4_many_shards"))
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.count("OK ") == 2
    broken = fixture_copy("plain_one_shard")
    flip_bit(broken / "shards" / "000000.bin")
    bad = run("verify", str(FIXTURES / "plain_one_shard"), str(broken))
    assert bad.returncode == 1
    assert f"FAIL {broken}: checksum mismatch for {broken}/shards/000000.bin" in bad.stdout
    assert f"OK   {FIXTURES / 'plain_one_shard'}" in bad.stdout


def test_paths_are_printed_as_given() -> None:
    """docs/cli.md: a path is printed as it was typed (a trailing or doubled slash kept),
    in verify's lines and inspect's report."""
    given = [f"{FIXTURES}/plain_one_shard/", f"{FIXTURES}//plain_one_shard"]
    verified = run("verify", *given)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert [line.split(":")[0] for line in verified.stdout.splitlines()] == [
        f"OK   {path}" for path in given
    ]
    inspected = run("inspect", "--json", *given)
    assert [report["path"] for report in json.loads(inspected.stdout)] == given


def test_verify_names_every_damaged_file(fixture_copy) -> None:
    """Every damaged file of a local cache gets a FAIL line (shards flipped, truncated,
    missing, and index.bin), in the order they are checked (index.bin, then shard by
    shard: size, SHA-256); the library's own validated open (the API's
    validate_cache=True) still names only the first, the one 0.4.8 names."""
    import dataset_rt as drt

    broken = fixture_copy("plain_many_shards")
    shards = broken / "shards"
    for path in (shards / "000003.bin", shards / "000011.bin", broken / "index.bin"):
        flip_bit(path)
    (shards / "000007.bin").write_bytes((shards / "000007.bin").read_bytes()[:-1])
    (shards / "000020.bin").unlink()
    result = run("verify", str(broken))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"FAIL {broken}: checksum mismatch for {broken}/index.bin",
        f"FAIL {broken}: checksum mismatch for {shards}/000003.bin",
        f"FAIL {broken}: shard length mismatch for {shards}/000007.bin",
        f"FAIL {broken}: checksum mismatch for {shards}/000011.bin",
        f"FAIL {broken}: I/O error: No such file or directory (os error 2): {shards}/000020.bin",
    ]
    runtime = drt.DatasetRuntime(num_workers=1)
    config = drt.ReaderConfig(seed=0, validate_cache=True)
    with pytest.raises(ValueError) as first:
        runtime.cached_dataset([str(broken)], reader_config=config)
    assert str(first.value) == f"checksum mismatch for {broken}/index.bin"


def test_validated_open_reports_the_first_damaged_file_0_4_8_reports(fixture_copy) -> None:
    """validate_cache=True checks metadata.arrow, index.bin, then each shard's size and
    SHA-256 in order, as dataset-rt 0.4.8 does (observed with it): an earlier shard's
    wrong SHA-256 is reported before a later shard's wrong size, a missing metadata.arrow
    before a shard's wrong size. Unvalidated opens check every shard's size first."""
    import dataset_rt as drt

    cache = fixture_copy("plain_many_shards")
    shards = cache / "shards"
    flip_bit(shards / "000002.bin")
    (shards / "000005.bin").write_bytes((shards / "000005.bin").read_bytes()[:-1])
    runtime = drt.DatasetRuntime(num_workers=1)
    validated = drt.ReaderConfig(seed=0, validate_cache=True)
    with pytest.raises(ValueError, match=r"^checksum mismatch for .*/shards/000002\.bin$"):
        runtime.cached_dataset([str(cache)], reader_config=validated)
    with pytest.raises(ValueError, match=r"^shard length mismatch for .*/shards/000005\.bin$"):
        runtime.cached_dataset([str(cache)], reader_config=drt.ReaderConfig(seed=0))
    (cache / "metadata.arrow").unlink()
    missing = r"^I/O error: No such file or directory .*/metadata\.arrow$"
    with pytest.raises(RuntimeError, match=missing):
        runtime.cached_dataset([str(cache)], reader_config=validated)


def test_verify_keeps_a_path_with_line_separators_on_one_line(fixture_copy, tmp_path) -> None:
    """A FAIL line per damaged file, whatever characters its path holds (U+2028 and a
    carriage return are line breaks to Python's splitlines)."""
    cache = tmp_path / "odd\u2028name\rhere"
    shutil.copytree(fixture_copy("plain_one_shard"), cache)
    flip_bit(cache / "shards" / "000000.bin", 0)
    # (Bytes: text mode would turn the carriage return into a newline.)
    result = subprocess.run(
        [sys.executable, "-m", "dataset_rt", "verify", str(cache)], capture_output=True, timeout=120
    )
    assert result.returncode == 1
    assert result.stdout.decode().split("\n") == [
        f"FAIL {cache}: checksum mismatch for {cache}/shards/000000.bin",
        "",
    ]


def test_verify_counts_damaged_files_past_the_message_bound(fixture_copy) -> None:
    """Past the 2 KiB of an error message, the last line counts the damaged files not
    named; every line named is whole."""
    broken = fixture_copy("plain_many_shards")
    names = sorted(p.name for p in (broken / "shards").iterdir())
    for name in names:
        flip_bit(broken / "shards" / name, 0)
    result = run("verify", str(broken))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    named = [f"FAIL {broken}: checksum mismatch for {broken}/shards/{n}" for n in names]
    more = len(names) - (len(lines) - 1)
    assert 0 < more < len(names)
    assert lines == [*named[: len(lines) - 1], f"FAIL {broken}: ... and {more} more damaged files"]


def test_verify_detects_edited_record_with_fixed_checksum(fixture_copy) -> None:
    import hashlib

    cache = fixture_copy("plain_one_shard")
    shard = cache / "shards" / "000000.bin"
    data = shard.read_bytes()
    edited = data.replace(b'"label":-3', b'"label":-4', 1)
    assert edited != data
    shard.write_bytes(edited)
    manifest = json.loads((cache / "manifest.json").read_text())
    manifest["shards"][0]["sha256"] = hashlib.sha256(edited).hexdigest()
    (cache / "manifest.json").write_text(json.dumps(manifest, indent=2))
    result = run("verify", str(cache))
    assert result.returncode == 1
    assert "embedded metadata does not match metadata.arrow for sample 0" in result.stdout


def test_head_and_stats() -> None:
    head = run("head", str(FIXTURES / "plain_one_shard"), "-n", "3")
    assert head.returncode == 0, head.stderr
    lines = head.stdout.splitlines()
    want = expected("plain_one_shard")["samples"][:3]
    assert len(lines) == 3
    for line, row in zip(lines, want):
        _, sample_id, size, metadata = line.split(" ", 3)
        assert (int(sample_id), int(size)) == (row["sample_id"], row["len"])
        assert json.loads(metadata) == row["metadata"]
    assert run("head", str(FIXTURES / "plain_one_shard"), "-n", "0").stdout == ""
    stats = run("stats", str(FIXTURES / "plain_one_shard"))
    assert stats.returncode == 0, stats.stderr
    assert stats.stdout.startswith("120 samples, 4 metadata columns")
    assert "label" in stats.stdout and "mean" in stats.stdout


def test_usage_error() -> None:
    assert run("frobnicate").returncode == 2


def _write(tmp_path, name: str, count: int, metadata) -> str:
    import dataset_rt as drt

    class Source:
        def __init__(self) -> None:
            self.name = name

        def __iter__(self):
            for i in range(count):
                yield drt.CacheInput(b"x" * 100, metadata(i))

    runtime = drt.DatasetRuntime(num_workers=1)
    [result] = runtime.write_cache(
        Source(), tmp_path, writer_config=drt.WriterConfig(show_progress=False)
    )
    assert isinstance(result, drt.CacheWriteSuccess), result
    return str(result.path)


def test_stats_of_a_column_named_statistic(tmp_path) -> None:
    path = _write(tmp_path, "s", 4, lambda i: {"statistic": i, "label": "a"})
    stats = run("stats", path)
    assert stats.returncode == 0, stats.stderr
    assert "statistic (metadata)" in stats.stdout and "label" in stats.stdout


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path) -> None:
    path = _write(tmp_path, "big", 5000, lambda i: {"label": i, "text": "t" * 40})
    with subprocess.Popen(
        [sys.executable, "-m", "dataset_rt", "head", path, "-n", "5000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.readline()
        process.stdout.close()  # as `| head -1` does
        stderr = process.stderr.read()
        assert process.wait(timeout=120) == 141
    assert stderr == b""


def test_stats_of_columns_named_like_its_renames(tmp_path) -> None:
    path = _write(
        tmp_path, "s2", 4, lambda i: {"statistic": i, "statistic (metadata)": -i, "label": "a"}
    )
    stats = run("stats", path)
    assert stats.returncode == 0, stats.stderr
    assert "statistic (metadata)" in stats.stdout and "statistic (metadata 2)" in stats.stdout


def _rss_after(code: str) -> tuple[subprocess.CompletedProcess[str], int, int]:
    """Runs ``code`` (which may print) after importing the command; the peak RSS in KiB
    before and after it, from the last line of stderr."""
    script = (
        "import resource, sys\n"
        "import polars, pyarrow, dataset_rt.cli as cli\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n"
        f"    {code}\n"
        "finally:\n"
        "    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "    print(before, after, file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    before, after = map(int, result.stderr.splitlines()[-1].split())
    return result, before, after


def test_verify_holds_large_records_within_the_read_ahead_budget(tmp_path) -> None:
    import dataset_rt as drt

    class Large:
        name = "large"

        def __iter__(self):
            for i in range(48):
                yield drt.CacheInput(bytes([i]) * (4 << 20), {"i": i})

    runtime = drt.DatasetRuntime(num_workers=1)
    [result] = runtime.write_cache(
        Large(), tmp_path, writer_config=drt.WriterConfig(show_progress=False)
    )
    path = str(result.path)
    done, before, after = _rss_after(f"sys.exit(cli.main(['verify', '--quiet', {path!r}]))")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"OK   {path}: 48 samples")
    # 192 MiB of records; the reads ahead hold a few of them (4096 samples a batch held
    # them all, twice).
    assert after - before < 96 * 1024, (before, after)


def test_interrupted_command_ends_quietly_with_status_130() -> None:
    code = (
        "import dataset_rt.cli as cli\n"
        "def interrupted(argv=None, out=None):\n"
        "    raise KeyboardInterrupt\n"
        "cli.main = interrupted\n"
        "cli.main_exit()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 130
    assert "Traceback" not in result.stderr


def test_output_that_cannot_be_written_is_an_error_not_a_traceback() -> None:
    cache = str(FIXTURES / "plain_one_shard")
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "dataset_rt", "inspect", cache],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1
    assert result.stderr.startswith("dataset-rt: cannot write the output: "), result.stderr
    assert "Traceback" not in result.stderr
    closed = subprocess.run(
        [sys.executable, "-m", "dataset_rt", "inspect", cache],
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(1),
    )
    assert closed.returncode == 1
    assert closed.stderr.startswith("dataset-rt: cannot write the output: "), closed.stderr


def test_paths_that_are_not_utf8(tmp_path) -> None:
    import shutil

    good = _write(tmp_path, "name", 3, lambda i: {"label": i})
    raw = os.fsencode(tmp_path) + b"/bad\xffname"
    os.rename(os.fsencode(good), raw)
    path = os.fsdecode(raw)
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}

    def command(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "dataset_rt", *args], capture_output=True, env=env, timeout=120
        )

    for args in (("inspect", path), ("verify", path), ("head", path), ("stats", path)):
        result = command(*args)
        assert result.returncode == 0, (args, result.stderr.decode(errors="replace"))
    # The table and the verify line give the path's own bytes back, as ls does.
    assert raw in command("inspect", path).stdout
    # JSON stays valid UTF-8; the undecodable byte is an escape that decodes back.
    listing = command("inspect", "--json", path).stdout
    [facts] = json.loads(listing.decode("utf-8"))
    assert os.fsencode(facts["path"]) == raw
    shutil.rmtree(raw)


def test_usage_errors_name_the_subcommand() -> None:
    negative = run("head", str(FIXTURES / "plain_one_shard"), "-n", "-1")
    assert negative.returncode == 2
    assert negative.stderr.startswith("usage: dataset-rt head")
    assert "-n must be non-negative" in negative.stderr
    empty = run("inspect", "")
    assert empty.returncode == 2
    assert "a cache path must not be empty" in empty.stderr


def test_a_closed_standard_error_changes_nothing() -> None:
    cache = str(FIXTURES / "plain_one_shard")
    result = subprocess.run(
        [sys.executable, "-m", "dataset_rt", "verify", "--quiet", cache],
        stdout=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(2),
    )
    assert result.returncode == 0
    assert result.stdout.startswith(f"OK   {cache}: 120 samples")


def test_an_ascii_output_gets_escapes_and_valid_json() -> None:
    cache = str(FIXTURES / "unicode_é_name")
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dataset_rt", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )

    head = command("head", "-n", "2", cache)
    assert head.returncode == 0, head.stderr
    first = head.stdout.splitlines()[0].split(" ", 3)[3]
    assert json.loads(first) == expected("unicode_é_name")["samples"][0]["metadata"]
    listing = command("inspect", "--json", cache)
    assert listing.returncode == 0, listing.stderr
    assert json.loads(listing.stdout)[0]["source_name"] == "unicode_é_name"
    table = command("inspect", cache)
    assert table.returncode == 0, table.stderr
    assert "source_name     unicode_\\xe9_name" in table.stdout
