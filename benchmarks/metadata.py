"""Metadata-table benchmark at scale: dataset_rt next to dataset-rt 0.4.8 in the same run.

    uv run python benchmarks/metadata.py              # full: 1,000 x 10,000 rows, 10,000 small
    uv run python benchmarks/metadata.py --quick      # smoke: 100 x 10,000 rows, 1,000 small
    uv run python benchmarks/metadata.py --workdir /tmp/drt-meta   # keep and reuse the caches
    uv run python benchmarks/metadata.py --no-reference --only update

Workloads (written once by this project, read by both implementations):

- big: ``--caches`` caches (1,000) of ``--rows`` rows (10,000) each, 10M rows in all;
- small: ``--small-caches`` caches (10,000) of 10 rows each.

They are written by a few processes of this project (each calls ``write_cache`` with 50
sources at a time), about 80 s for the full set on 2 cores; ``--workdir`` keeps them.

Every row has an 8-byte payload, ``(cache index << 32 | row)`` little-endian, and metadata
``{"label": row % 10, "split": "train" if row % 10 < 8 else "val"}``.

Cases, each in a fresh subprocess per implementation (ours: this project's interpreter;
ref: dataset-rt 0.4.8 in its own virtualenv, see ``common.Reference``):

1. ``cached_dataset`` over the big caches;
2. ``get_metadata()``, first and second call;
3. ``update_metadata`` with a filter (``label < 5``, half the rows), a reweighting
   (``weight = label + 1``) and a 2x duplication (``pl.concat([df, df])``);
4. the first 100,000 samples of shuffled (weighted) iteration after the reweighting;
5. ``cached_dataset`` over the small caches, then ``get_metadata()``.

Time: each step runs once per process (first calls are what is measured); with
``--repeat N`` every case runs in N fresh processes and the best is shown. The page cache
is warmed (every cache file read once) before the cases.
Peak memory: the child's ``VmHWM`` (peak resident set) after the step, minus its
``VmRSS`` right after importing dataset_rt, polars, pyarrow and numpy. The peak is reset
(``/proc/self/clear_refs`` = 5) just before each timed step, so a step's peak includes
what earlier steps left resident (the dataset, the table the user holds) but not their
transient peaks. ``ru_maxrss`` is not used: after ``exec`` from a ``vfork`` (what
``subprocess`` uses) it starts at the parent's peak and it cannot be reset.

Verification (untimed): table digests (height, schema, sums, first and last rows) equal to
the expected ones and to the reference's; ``len(ds)`` after each update; the 100,000
shuffled samples' payloads and metadata match their ids, and their id sequence equals the
reference's (SPEC section 4: bit-exact order).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    bench_parser,
    bench_workdir,
    fmt_num,
    get_reference,
    portable_source,
    print_header,
    print_table,
)

FULL = {"caches": 1_000, "rows": 10_000, "small_caches": 10_000, "small_rows": 10}
QUICK = {"caches": 100, "rows": 10_000, "small_caches": 1_000, "small_rows": 10}
ITER_SAMPLES = 100_000
WORKLOAD_FORMAT = 1  # bump when the generated caches change
SOURCES_PER_CALL = 50


# ------------------------------------------------------------------ child (portable)
# Standard library, polars and the dataset_rt module only: the same source runs in this
# project's interpreter and in the reference's.


def cache_names(kind: str, count: int) -> list[str]:
    return [f"{kind}{i:05d}" for i in range(count)]


def cache_id_of(name: str) -> int:
    """SPEC section 3: first 8 bytes of SHA-256 of the name, big-endian, top bit cleared."""
    import hashlib as _hashlib

    return int.from_bytes(_hashlib.sha256(name.encode()).digest()[:8], "big") & (2**63 - 1)


def _mem_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB."""
    found = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                found[key] = int(value.split()[0])
    return found["VmRSS"], found["VmHWM"]


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def table_digest(df: Any) -> dict[str, Any]:
    """Order-sensitive summary of a metadata table, comparable across implementations."""
    import polars as pl

    out: dict[str, Any] = {
        "height": df.height,
        "columns": list(df.columns),
        "dtypes": [str(t) for t in df.dtypes],
        "cache_ids": int(df.get_column("cache_id").n_unique()),
        "sample_id_sum": int(df.get_column("sample_id").cast(pl.Int64).sum()),
        "label_sum": int(df.get_column("label").sum()),
        "train": int((df.get_column("split") == "train").sum()),
        "weight_sum": float(df.get_column("weight").sum()),
        "first": [str(v) for v in df.row(0)],
        "last": [str(v) for v in df.row(df.height - 1)],
    }
    # A few rows spread over the table, in order (catches reordered rows).
    step = max(1, df.height // 7)
    out["rows_sample"] = [[str(v) for v in df.row(i)] for i in range(0, df.height, step)]
    return out


def run_case(d: Any, spec: dict[str, Any], case: str) -> dict[str, Any]:
    """Run one case in this (fresh) process; returns timings, peaks and checks."""
    import gc
    import hashlib as _hashlib
    import itertools
    import time as _time

    import numpy  # noqa: F401  (imported before the baseline on both sides)
    import polars as pl
    import pyarrow  # noqa: F401

    gc.collect()
    rss0, hwm0 = _mem_kib()
    state = {"max_hwm": hwm0}
    steps: dict[str, dict[str, Any]] = {}

    def step(name: str, fn: Any) -> Any:
        gc.collect()
        before, hwm = _mem_kib()
        state["max_hwm"] = max(state["max_hwm"], hwm)
        reset = _reset_peak()
        t0 = _time.perf_counter()
        value = fn()
        seconds = _time.perf_counter() - t0
        _, hwm = _mem_kib()
        state["max_hwm"] = max(state["max_hwm"], hwm)
        steps[name] = {
            "s": seconds,
            "peak_mib": (hwm - rss0) / 1024,
            "delta_mib": (hwm - before) / 1024,
            "reset": reset,
        }
        return value

    kind = "small" if case == "small" else "big"
    names = cache_names(kind, spec[f"{kind}_caches"])
    rows = spec[f"{kind}_rows"]
    paths = [f"{spec['base']}/{kind}/{n}" for n in names]
    index_of = {cache_id_of(n): i for i, n in enumerate(names)}
    rt = d.DatasetRuntime(num_workers=spec["num_workers"])
    config = d.ReaderConfig(seed=0)
    checks: dict[str, Any] = {}

    ds = step("open", lambda: rt.cached_dataset(paths, reader_config=config))
    checks["len"] = len(ds)
    if case == "open":
        pass
    elif case in ("get_metadata", "small"):
        df = step("get_metadata", ds.get_metadata)
        step("get_metadata_2", ds.get_metadata)
        checks["table"] = table_digest(df)
    else:
        df = ds.get_metadata()
        if case == "update_filter":
            new = step("prepare", lambda: df.filter(pl.col("label") < 5))
        elif case == "update_dup":
            new = step("prepare", lambda: pl.concat([df, df]))
        else:  # update_reweight, iterate
            new = step(
                "prepare", lambda: df.with_columns(weight=(pl.col("label") + 1).cast(pl.Float64))
            )
        step("update", lambda: ds.update_metadata(new))
        checks["len_after"] = len(ds)
        checks["expected_len_after"] = new.height
        if case == "iterate":
            n = spec["iter_samples"]

            def consume() -> float:
                it = iter(ds)
                t0 = _time.perf_counter()
                next(it)
                first = _time.perf_counter() - t0
                for _ in itertools.islice(it, n - 1):
                    pass
                del it
                return first

            steps_first = step("iterate", consume)
            steps["iterate"]["first_sample_s"] = steps_first
            # Untimed verification pass over the same stream (an update restarts it).
            ds.update_metadata(new)
            id_hash = _hashlib.sha256()
            bad, first_bad, count, counts = 0, "", 0, {}
            it = iter(ds)
            for s in itertools.islice(it, n):
                count += 1
                sid, cid = int(s.sample_id), int(s.cache_id)
                id_hash.update(cid.to_bytes(8, "little") + sid.to_bytes(8, "little"))
                label = sid % 10
                counts[label] = counts.get(label, 0) + 1
                want = {"label": label, "split": "train" if label < 8 else "val"}
                index = index_of.get(cid)
                problem = ""
                if index is None:
                    problem = f"unknown cache_id {cid}"
                elif bytes(s.data) != ((index << 32) | sid).to_bytes(8, "little"):
                    problem = f"payload of ({cid}, {sid})"
                elif dict(s.metadata) != want:
                    problem = f"metadata of ({cid}, {sid}) is {s.metadata!r}"
                if problem:
                    bad += 1
                    first_bad = first_bad or problem
            del it
            checks["iter"] = {
                "count": count,
                "bad": bad,
                "first_bad": first_bad,
                "ids": id_hash.hexdigest(),
                "label_counts": [counts.get(k, 0) for k in range(10)],
            }
        else:
            after = step("get_metadata_after", ds.get_metadata)
            checks["table"] = table_digest(after)
    _, hwm = _mem_kib()
    return {
        "case": case,
        "rows_per_cache": rows,
        "steps": steps,
        "child_peak_mib": (max(state["max_hwm"], hwm) - rss0) / 1024,
        "baseline_mib": rss0 / 1024,
        "checks": checks,
    }


CHILD_MAIN = """
import importlib.metadata as _md
import json as _json
import sys as _sys

import dataset_rt as _d

_spec = _json.loads(open(_sys.argv[1]).read())
_out = run_case(_d, _spec, _sys.argv[2])
_out["version"] = _md.version("dataset-rt")
print(_json.dumps(_out))
"""


def child_script() -> str:
    helpers = [cache_names, cache_id_of, _mem_kib, _reset_peak, table_digest, run_case]
    return portable_source(helpers) + CHILD_MAIN


# ------------------------------------------------------------------ workloads


class Source:
    """``rows`` records: 8-byte payload ``index << 32 | row``, label and split metadata."""

    def __init__(self, name: str, index: int, rows: int) -> None:
        self.name = name
        self.index = index
        self.rows = rows

    def __iter__(self) -> Any:
        import dataset_rt as d

        make = d.CacheInput
        base = self.index << 32
        metas = [{"label": k, "split": "train" if k < 8 else "val"} for k in range(10)]
        for i in range(self.rows):
            yield make(data=(base | i).to_bytes(8, "little"), metadata=dict(metas[i % 10]))


def write_part(base: Path, kind: str, count: int, rows: int, part: int, parts: int) -> None:
    """Write the caches ``i`` with ``i % parts == part`` that are missing (worker entry)."""
    import dataset_rt as d

    rt = d.DatasetRuntime(num_workers=2)
    config = d.WriterConfig(show_progress=False)
    names = cache_names(kind, count)
    todo = [
        Source(n, i, rows)
        for i, n in enumerate(names)
        if i % parts == part and not (base / kind / n / "manifest.json").exists()
    ]
    for start in range(0, len(todo), SOURCES_PER_CALL):
        chunk = todo[start : start + SOURCES_PER_CALL]
        for result in rt.write_cache(chunk, base / kind, writer_config=config):
            if type(result).__name__ != "CacheWriteSuccess":
                raise SystemExit(f"writing {result.source_name} failed: {result}")


def warm_page_cache(base: Path) -> float:
    """Read every file under ``base`` once; returns the bytes read."""
    buf = memoryview(bytearray(4 << 20))
    total = 0
    for root, _dirs, files in os.walk(base):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                while (n := os.readv(fd, [buf])) > 0:
                    total += n
            finally:
                os.close(fd)
    return total


def build_workloads(workdir: Path, counts: dict[str, int], env: dict[str, str]) -> Path:
    base = workdir / "caches"
    marker = workdir / "workloads.json"
    params = {"format": WORKLOAD_FORMAT, **counts}
    try:
        if json.loads(marker.read_text()) == params:
            print(f"workloads: reusing {base}")
            return base
    except (OSError, ValueError):
        pass
    marker.unlink(missing_ok=True)
    # Drop any cache set of another size (partial sets of the same size are completed).
    for kind, count in (("big", counts["caches"]), ("small", counts["small_caches"])):
        wanted = set(cache_names(kind, count)) | {"tmp"}
        folder = base / kind
        if folder.exists():
            for entry in folder.iterdir():
                if entry.name not in wanted:
                    shutil.rmtree(entry, ignore_errors=True)
    jobs = [
        ("big", counts["caches"], counts["rows"], 2),
        # fsync-bound: more writers than cores helps.
        ("small", counts["small_caches"], counts["small_rows"], 4),
    ]
    for kind, count, rows, parts in jobs:
        t0 = time.perf_counter()
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--write-part",
                    json.dumps([str(base), kind, count, rows, part, parts]),
                ],
                env=env,
            )
            for part in range(parts)
        ]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"writing the {kind} caches failed (exit codes {codes})")
        elapsed = time.perf_counter() - t0
        print(
            f"workloads: wrote {count:,} {kind} caches x {rows:,} rows in {elapsed:.1f} s "
            f"({parts} writer processes)",
            flush=True,
        )
    marker.write_text(json.dumps(params))
    return base


# ------------------------------------------------------------------ running cases

CASES = [
    "open",
    "get_metadata",
    "update_filter",
    "update_reweight",
    "update_dup",
    "iterate",
    "small",
]


def run_ours(script: Path, spec_path: Path, case: str, env: dict[str, str], timeout: float) -> Any:
    try:
        proc = subprocess.run(
            [sys.executable, str(script), str(spec_path), case],
            env=env,
            cwd=script.parent,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"timeout": timeout}
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_ref(ref: Any, script: str, spec_path: Path, case: str, timeout: float) -> Any:
    try:
        return ref.run_json(script, [str(spec_path), case], timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"timeout": timeout}
    except (RuntimeError, ValueError, OSError) as exc:
        return {"error": str(exc)[-2000:]}


# ------------------------------------------------------------------ report

ROWS = [
    # (label, case, steps summed)
    ("1. open {caches} caches ({total} rows)", "open", ("open",)),
    ("2. get_metadata() first call", "get_metadata", ("get_metadata",)),
    ("2. get_metadata() second call", "get_metadata", ("get_metadata_2",)),
    ("3. update_metadata: filter label<5 ({half} rows)", "update_filter", ("update",)),
    ("3. update_metadata: reweight ({total} rows)", "update_reweight", ("update",)),
    ("3. update_metadata: 2x duplicate ({double} rows)", "update_dup", ("update",)),
    ("4. first {iter} shuffled samples after reweight", "iterate", ("iterate",)),
    ("5. open {small} small caches ({small_total} rows)", "small", ("open",)),
    ("5. get_metadata() on {small} small caches", "small", ("get_metadata",)),
    ("5. open + get_metadata(), {small} small caches", "small", ("open", "get_metadata")),
]


def measure(runs: list[Any] | None, steps: tuple[str, ...]) -> tuple[float, float] | None:
    """(best seconds over the runs, peak MiB of that run) of a sum of steps; None if absent."""
    best = None
    for res in runs or []:
        if not isinstance(res, dict) or "steps" not in res:
            continue
        found = [res["steps"].get(name) for name in steps]
        if any(f is None for f in found):
            continue
        seconds = sum(f["s"] for f in found)
        peak = max(f["peak_mib"] for f in found)
        if best is None or seconds < best[0]:
            best = (seconds, peak)
    return best


def failure(runs: list[Any] | None) -> str | None:
    """Why no run of a case produced numbers (timeout or error), if so."""
    for res in runs or []:
        if isinstance(res, dict) and "timeout" in res:
            return f"> {res['timeout']:.0f} (timeout)"
        if isinstance(res, dict) and "error" in res:
            return "error"
    return None


def fmt_s(seconds: float) -> str:
    if seconds >= 0.1:
        return f"{seconds:.2f}"
    if seconds >= 0.001:
        return f"{seconds:.3f}"
    return f"{seconds * 1e6:.0f} us"


def cell_time(runs: list[Any] | None, steps: tuple[str, ...]) -> str:
    got = measure(runs, steps)
    if got is not None:
        return fmt_s(got[0])
    return failure(runs) or "-"


def cell_peak(runs: list[Any] | None, steps: tuple[str, ...]) -> str:
    got = measure(runs, steps)
    return fmt_num(got[1]) if got else "-"


def ratio(ours: list[Any] | None, ref: list[Any] | None, steps: tuple[str, ...]) -> str:
    a, b = measure(ours, steps), measure(ref, steps)
    if a and b and a[0] > 0:
        value = b[0] / a[0]
        return f"{value:,.0f}x" if value >= 100 else f"{value:.2f}x"
    if a and a[0] > 0 and (failure(ref) or "").endswith("(timeout)"):
        return f"> {ref[0]['timeout'] / a[0]:,.0f}x"
    return "-"


def expected_checks(case: str, counts: dict[str, int]) -> dict[str, Any]:
    """What the checks must say, computed from the workload definition."""
    kind_caches, rows = (
        (counts["small_caches"], counts["small_rows"])
        if case == "small"
        else (counts["caches"], counts["rows"])
    )
    total = kind_caches * rows
    per_cache_label = [sum(1 for r in range(rows) if r % 10 == k) for k in range(10)]
    sid_sum = rows * (rows - 1) // 2
    label_sum = sum(k * c for k, c in enumerate(per_cache_label))
    train = sum(per_cache_label[:8])
    want: dict[str, Any] = {"len": total}
    table = {
        "height": total,
        "columns": ["cache_id", "sample_id", "label", "split", "weight"],
        "cache_ids": kind_caches,
        "sample_id_sum": kind_caches * sid_sum,
        "label_sum": kind_caches * label_sum,
        "train": kind_caches * train,
        "weight_sum": float(total),
    }
    if case in ("get_metadata", "small"):
        want["table"] = table
    elif case == "update_filter":
        low = [r for r in range(rows) if r % 10 < 5]
        want["table"] = {
            **table,
            "height": kind_caches * len(low),
            "sample_id_sum": kind_caches * sum(low),
            "label_sum": kind_caches * sum(r % 10 for r in low),
            "train": kind_caches * len(low),
            "weight_sum": float(kind_caches * len(low)),
        }
    elif case == "update_reweight":
        weight_sum = kind_caches * sum((r % 10) + 1 for r in range(rows))
        want["table"] = {**table, "weight_sum": float(weight_sum)}
    elif case == "update_dup":
        doubled = ("height", "sample_id_sum", "label_sum", "train", "weight_sum")
        want["table"] = {key: (2 * v if key in doubled else v) for key, v in table.items()}
    return want


def verify(case: str, res: Any, counts: dict[str, int], peer: Any) -> str:
    """'ok' or what is wrong with one child's checks (and, given, against the peer's)."""
    if not isinstance(res, dict) or "checks" not in res:
        return "-"
    checks = res["checks"]
    want = expected_checks(case, counts)
    problems = []
    if checks.get("len") != want["len"]:
        problems.append(f"len {checks.get('len')} != {want['len']}")
    if "len_after" in checks and checks["len_after"] != checks["expected_len_after"]:
        problems.append(f"len after update {checks['len_after']} != {checks['expected_len_after']}")
    table = checks.get("table")
    if "table" in want:
        for key, value in want["table"].items():
            got = None if table is None else table.get(key)
            if got != value:
                problems.append(f"table {key} {got!r} != {value!r}")
    it = checks.get("iter")
    if it is not None:
        if it["count"] != ITER_SAMPLES or it["bad"]:
            problems.append(
                f"iteration: {it['count']} samples, {it['bad']} bad ({it['first_bad']})"
            )
    if isinstance(peer, dict) and "checks" in peer:
        pc = peer["checks"]
        if table is not None and pc.get("table") is not None:
            keys = (
                "height",
                "dtypes",
                "first",
                "last",
                "rows_sample",
                "sample_id_sum",
                "weight_sum",
            )
            for key in keys:
                if table.get(key) != pc["table"].get(key):
                    problems.append(f"table {key} differs from the reference")
        if it is not None and pc.get("iter") is not None and it["ids"] != pc["iter"]["ids"]:
            problems.append("shuffled id sequence differs from the reference")
    return "ok" if not problems else "; ".join(problems[:3])


def main() -> int:
    parser = bench_parser(
        __doc__.split("\n")[0],
        quick_help="100 x 10,000 rows; 1,000 small caches",
        workdir_help="keep the caches here (reused when present)",
        repeat_help="runs of each case, each in a fresh process; best shown (default 3; --quick 1)",
        only_help="run cases whose name contains this",
    )
    parser.add_argument("--caches", type=int, help="big caches (default 1,000; --quick 100)")
    parser.add_argument("--rows", type=int, help="rows per big cache (default 10,000)")
    parser.add_argument(
        "--small-caches", type=int, help="small caches of 10 rows (default 10,000; --quick 1,000)"
    )
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument(
        "--timeout",
        type=float,
        help="seconds per case and implementation (default 300; --quick 120)",
    )
    parser.add_argument("--write-part", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.write_part:
        base, kind, count, rows, part, parts = json.loads(args.write_part)
        write_part(Path(base), kind, count, rows, part, parts)
        return 0

    counts = dict(QUICK if args.quick else FULL)
    for key in ("caches", "rows", "small_caches"):
        if getattr(args, key) is not None:
            counts[key] = getattr(args, key)
    timeout = args.timeout or (120.0 if args.quick else 300.0)
    args.repeat = max(1, args.repeat or (1 if args.quick else 3))
    with bench_workdir(args.workdir, "metadata") as (workdir, pinned):
        return run(args, counts, timeout, workdir, pinned)


def run(
    args: argparse.Namespace,
    counts: dict[str, int],
    timeout: float,
    workdir: Path,
    pinned: str | None,
) -> int:
    started = time.perf_counter()
    env = dict(os.environ)
    total = counts["caches"] * counts["rows"]
    print_header("metadata", args.quick, workdir, pinned)
    print(
        f"- workloads: {counts['caches']:,} caches x {counts['rows']:,} rows ({total:,} rows), "
        f"{counts['small_caches']:,} small caches x {counts['small_rows']} rows; 8-byte payloads; "
        f"num_workers={args.num_workers}; page cache warm; each case in a fresh process, "
        f"best of {args.repeat} (each step runs once per process); timeout {timeout:.0f} s per case"
    )
    print(flush=True)

    base = build_workloads(workdir, counts, env)
    t0 = time.perf_counter()
    warmed = warm_page_cache(base)
    print(
        f"page cache: read {warmed / 2**20:,.0f} MiB of caches in {time.perf_counter() - t0:.1f} s"
    )
    spec = {
        "base": str(base),
        "big_caches": counts["caches"],
        "big_rows": counts["rows"],
        "small_caches": counts["small_caches"],
        "small_rows": counts["small_rows"],
        "num_workers": args.num_workers,
        "iter_samples": ITER_SAMPLES,
    }
    spec_path = workdir / "metadata-spec.json"
    spec_path.write_text(json.dumps(spec))
    script_text = child_script()
    script = workdir / "metadata_child.py"
    script.write_text("from __future__ import annotations\n" + script_text)

    cases = [c for c in CASES if args.only.lower() in c]
    ref = get_reference(not args.no_reference)
    ours: dict[str, list[Any]] = {c: [] for c in cases}
    refs: dict[str, list[Any]] = {c: [] for c in cases} if ref is not None else {}
    for rep in range(args.repeat):
        for case in cases:
            tag = f" (run {rep + 1}/{args.repeat})" if args.repeat > 1 else ""
            print(f"ours: {case}{tag} ...", flush=True)
            res = run_ours(script, spec_path, case, env, timeout)
            ours[case].append(res)
            if "error" in res:
                print(f"  ours failed: {res['error']}")
            if ref is not None:
                print(f"ref:  {case}{tag} ...", flush=True)
                res = run_ref(ref, script_text, spec_path, case, timeout)
                refs[case].append(res)
                if "error" in res:
                    print(f"  reference failed: {res['error']}")

    ref_version = next(
        (r["version"] for runs in refs.values() for r in runs if "version" in r), None
    )
    labels = {
        "caches": f"{counts['caches']:,}",
        "total": f"{total / 1e6:g}M",
        "half": f"{total / 2e6:g}M",
        "double": f"{2 * total / 1e6:g}M",
        "iter": f"{ITER_SAMPLES:,}",
        "small": f"{counts['small_caches']:,}",
        "small_total": f"{counts['small_caches'] * counts['small_rows']:,}",
    }

    # Verification: every run of ours against the expected values and the reference's
    # first complete run; the reference against the expected values (shown, not fatal).
    status: dict[str, str] = {}
    problems = []
    ref_notes = []
    for case in cases:
        peer = next((r for r in refs.get(case, []) if "checks" in r), None)
        found = [verify(case, r, counts, peer) for r in ours[case]]
        bad = [f for f in found if f not in ("ok", "-")]
        status[case] = bad[0] if bad else ("ok" if "ok" in found else "-")
        if bad:
            problems.append(f"{case}: {bad[0]}")
        for r in refs.get(case, []):
            note = verify(case, r, counts, None)
            if note not in ("ok", "-"):
                ref_notes.append(f"{case}: {note}")

    print()
    print(f"## Metadata at scale (ref = dataset-rt {ref_version or 'not run'})")
    print()
    rows = []
    for label, case, steps in ROWS:
        if case not in cases:
            continue
        o, r = ours.get(case), refs.get(case)
        rows.append(
            [
                label.format(**labels),
                cell_time(o, steps),
                cell_peak(o, steps),
                cell_time(r, steps) if ref is not None else "-",
                cell_peak(r, steps) if ref is not None else "-",
                ratio(o, r, steps),
                status[case],
            ]
        )
    print_table(
        [
            "case",
            "ours s",
            "ours peak MiB",
            "ref s",
            "ref peak MiB",
            "ratio (ref s / ours s)",
            "verified",
        ],
        rows,
        [False, True, True, True, True, True, False],
    )
    print()
    print(
        "peak MiB: the child's peak RSS during the step (VmHWM, reset just before it) minus its "
        "RSS after importing dataset_rt, polars, pyarrow and numpy; it includes what earlier "
        "steps left resident (the open dataset, the table the caller holds)."
    )

    update_rows = []
    for case in ("update_filter", "update_reweight", "update_dup"):
        if case not in cases:
            continue
        cells = [case]
        for runs in (ours.get(case), refs.get(case)):
            res = next((x for x in runs or [] if "steps" in x), None)
            if res is None:
                cells += ["-", "-"]
                continue
            rows_after = res["checks"]["expected_len_after"]
            rise = res["steps"]["update"]["delta_mib"] * 2**20
            cells += [f"{rows_after:,}", f"{rise / rows_after:.1f}"]
        update_rows.append(cells)
    if update_rows:
        print()
        print("## update_metadata: memory rise during the call per row of the new table")
        print()
        print_table(
            ["case", "ours rows", "ours B/row", "ref rows", "ref B/row"],
            update_rows,
            [False, True, True, True, True],
        )
        print()
        print(
            "The identity and weight columns alone are 24 B/row (u64, u64, f64); the table "
            "the caller passes in is already resident before the call."
        )

    print()
    print(
        "## Details (each step of the first complete run of every case: "
        "time / peak MiB / the step's own rise MiB)"
    )
    print()
    detail_rows = []
    for case in cases:
        for who, runs in (("ours", ours.get(case)), ("ref", refs.get(case))):
            if not runs:
                continue
            res = next((x for x in runs if "steps" in x), runs[0])
            if "steps" not in res:
                detail_rows.append([case, who, failure(runs) or "-", "-", "-"])
                continue
            parts = []
            for name, st in res["steps"].items():
                extra = (
                    f", first sample {st['first_sample_s'] * 1e3:.0f} ms"
                    if "first_sample_s" in st
                    else ""
                )
                ms, peak, rise = st["s"] * 1e3, st["peak_mib"], st["delta_mib"]
                parts.append(f"{name} {ms:,.1f} ms / {peak:,.0f} / +{rise:,.0f}{extra}")
            peak, baseline = res["child_peak_mib"], res["baseline_mib"]
            detail_rows.append([case, who, "; ".join(parts), f"{peak:,.0f}", f"{baseline:,.0f}"])
    print_table(
        ["case", "impl", "steps", "child peak MiB", "baseline MiB"],
        detail_rows,
        [False, False, False, True, True],
    )
    print()
    print(f"total benchmark time: {time.perf_counter() - started:.0f} s")
    print(f"- load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps({"counts": counts, "ours": ours, "ref": refs}, indent=1))
    if ref_notes:
        print()
        print("reference verification notes (not fatal):")
        for note in ref_notes:
            print(f"- {note}")
    if problems:
        print()
        print("VERIFICATION FAILED:")
        for p in problems:
            print(f"- {p}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
