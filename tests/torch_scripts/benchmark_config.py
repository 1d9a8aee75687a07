"""The benchmark's options as a user meets them, printed as one JSON line; run the same in
this checkout and in dataset-rt 0.4.8 (tests/test_run_benchmark.py compares the two).

``argv[1]``: JSON list of cases ``{"args": [...], "env": {...}}`` parsed by pydantic-settings'
``CliApp.run(BenchmarkConfig)`` (the entry point's own parsing); and ``{"topology": {...}}``
cases, torchrun environments read by ``Topology``. Prints ``{"fields", "help", "cases"}``:
each field's type, default and constraints; ``--help`` from its option list on (the
description above it is the class docstring, prose that may differ); per case the parsed
settings, or the validation errors (location, message, type), or the exit of argparse.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from typing import Any

from pydantic import ValidationError
from pydantic_settings import CliApp, SettingsError

from dataset_rt.benchmarks.config import BenchmarkConfig, Topology


def field_table() -> dict[str, list[str]]:
    return {
        name: [repr(field.annotation), repr(field.default), repr(field.metadata)]
        for name, field in BenchmarkConfig.model_fields.items()
    }


def options_help() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        CliApp.run(BenchmarkConfig, cli_args=["--help"])
    text = out.getvalue()
    return text[text.index("options:") :]


def errors(error: ValidationError) -> list[list[Any]]:
    return [[list(e["loc"]), e["msg"], e["type"]] for e in error.errors()]


@contextlib.contextmanager
def environment(values: dict[str, str]):
    saved = dict(os.environ)
    os.environ.update(values)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    if "topology" in case:
        with environment(case["topology"]):
            try:
                return {"ok": Topology().model_dump()}
            except ValidationError as error:
                return {"errors": errors(error)}
    stderr = io.StringIO()
    with environment(case.get("env", {})), contextlib.redirect_stderr(stderr):
        try:
            config = CliApp.run(BenchmarkConfig, cli_args=case["args"])
        except ValidationError as error:
            return {"errors": errors(error)}
        except SystemExit as exit_:
            lines = stderr.getvalue().strip().splitlines()
            return {"exit": exit_.code, "message": lines[-1] if lines else ""}
        except SettingsError as error:
            return {"settings_error": str(error)}
    return {"ok": config.model_dump(mode="json")}


def main() -> None:
    cases = json.loads(sys.argv[1])
    sys.argv[0] = "run_benchmark"  # argparse names the program in its errors
    result = {
        "fields": field_table(),
        "help": options_help(),
        "cases": [run_case(case) for case in cases],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
