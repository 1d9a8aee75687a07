"""Every example in the documentation runs, and docs/api.md is up to date.

1. Each page (``docs/*.md`` and ``README.md``) runs in a fresh temporary working directory.
   Its fenced code blocks run in page order:

   * ```` ```python ```` blocks are executed in this process, all blocks of a page in one
     namespace (``__name__ == "__main__"``), so a page can build on its earlier blocks.
     Tracebacks point at the page's own line numbers.
   * ```` ```sh ```` and ```` ```bash ```` blocks are executed with ``bash -euo pipefail``
     in the same directory, with these mappings, so that commands can be shown the way a
     user types them in a checkout:

     - ``dataset-rt ...`` runs ``sys.executable -m dataset_rt ...`` and ``python`` runs
       ``sys.executable`` (wrappers put first on ``PATH``);
     - a line starting with ``uv run pytest`` is skipped (it would run this test again);
     - ``uv run X.py ...`` runs ``python X.py ...`` and ``uv run CMD ...`` runs ``CMD ...``,
       so the README's ``uv run examples/cache_text.py`` is
       ``python examples/cache_text.py``; ``examples/`` in the temporary directory is a
       link to the repository's ``examples/``.
   * ```` ```python torch ```` blocks need PyTorch, which the uv environment never has:
     ``tests/test_torch.py::test_guide_examples_run`` runs them (and checks their
     output blocks) in the PyTorch virtualenv instead.
   * Every other block (```` ```text ````, ```` ```console ````, ```` ```c ````, no language,
     ...) is shown, not executed.
   * A ```` ```text output ```` block right after an executed block is that block's expected
     standard output, compared exactly (trailing newlines aside). Plain ```` ```text ````
     blocks are for output that varies (timings) and are not compared.

   A failure names the page and the block number (1-based, counting every fenced block of
   the page) and its first line. Pages in ``PAGES_IN_CHECKOUT`` (the C API page, which
   builds and installs the library) run from the repository root with ``PREFIX`` set to
   a temporary install prefix.

2. ``docs/gen_api.py --check`` passes, i.e. ``docs/api.md`` is what the generator writes
   for the code as it is.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]

# Pages that run from the repository root (they build the library and its C example)
# with PREFIX pointing at a temporary install prefix.
PAGES_IN_CHECKOUT = {"c-api.md"}

EXECUTED = {"python", "sh", "bash"}
OPENING = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    number: int  # 1-based, counting every fenced block of the page
    language: str
    line: int  # 1-based line of the first content line
    code: str
    info: str = ""  # the whole info string, e.g. "text output"

    @property
    def is_expected_output(self) -> bool:
        return self.info.split() == ["text", "output"]

    def describe(self, page: Path) -> str:
        first = self.code.strip().splitlines()[0] if self.code.strip() else ""
        where = f"{page.relative_to(ROOT)} block {self.number}"
        return f"{where} ({self.language}, line {self.line}): {first}"


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order."""
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = OPENING.match(lines[i])
        if not match:
            i += 1
            continue
        fence = match["fence"]
        language = match["info"].split()[0].lower() if match["info"].strip() else ""
        body: list[str] = []
        j = i + 1
        closing = re.compile(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$")
        while j < len(lines) and not closing.match(lines[j]):
            body.append(lines[j])
            j += 1
        found.append(
            Block(
                len(found) + 1,
                language,
                i + 2,
                "\n".join(body) + "\n",
                match["info"].strip().lower(),
            )
        )
        i = j + 1
    return found


def shell_script(code: str) -> str:
    """A sh/bash block with the mappings of the module docstring applied."""
    out = []
    for line in code.splitlines():
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        if stripped.startswith("uv run pytest"):
            out.append(f"{indent}:  # skipped by tests/test_docs.py: {stripped}")
            continue
        if stripped.startswith("uv run "):
            rest = stripped[len("uv run ") :]
            first = rest.split(maxsplit=1)[0] if rest.strip() else ""
            stripped = f"python {rest}" if first.endswith(".py") else rest
        out.append(indent + stripped)
    return "set -euo pipefail\n" + "\n".join(out) + "\n"


def wrappers(directory: Path) -> Path:
    """A bin directory with ``python`` and ``dataset-rt`` running this interpreter."""
    directory.mkdir(parents=True, exist_ok=True)
    scripts = {
        "python": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n',
        "dataset-rt": f'#!/bin/sh\nexec "{sys.executable}" -m dataset_rt "$@"\n',
    }
    for name, text in scripts.items():
        path = directory / name
        path.write_text(text)
        path.chmod(0o755)
    return directory


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    bin_dir = wrappers(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    if page.name in PAGES_IN_CHECKOUT and page.parent.name == "docs":
        work = ROOT
        env["PREFIX"] = str(tmp_path / "prefix")
    monkeypatch.chdir(work)
    saved_environ = dict(os.environ)  # pages may set variables: restore them afterwards
    try:
        run_blocks(page, work, env)
    finally:
        os.environ.clear()
        os.environ.update(saved_environ)


def run_blocks(page: Path, work: Path, env: dict[str, str]) -> None:
    """Execute the page's blocks in order (see the module docstring)."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    page_blocks = blocks(page.read_text(encoding="utf-8"))
    for block, following in zip(page_blocks, [*page_blocks[1:], None]):
        if block.language not in EXECUTED or "torch" in block.info.split():
            continue
        if block.language == "python":
            # Pad so that tracebacks show the page's own line numbers.
            code = compile("\n" * (block.line - 1) + block.code, str(page), "exec")
            stdout = io.StringIO()
            try:
                with contextlib.redirect_stdout(stdout):
                    exec(code, namespace)
            except Exception:
                pytest.fail(f"{block.describe(page)}\n{traceback.format_exc()}", pytrace=False)
            output = stdout.getvalue()
        else:
            result = subprocess.run(
                ["bash", "-c", shell_script(block.code)],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if result.returncode != 0:
                pytest.fail(
                    f"{block.describe(page)}\nexit status {result.returncode}\n"
                    f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}",
                    pytrace=False,
                )
            output = result.stdout
        if following is not None and following.is_expected_output:
            want, got = following.code.rstrip("\n"), output.rstrip("\n")
            if want != got:
                diff = "\n".join(
                    difflib.unified_diff(
                        want.splitlines(),
                        got.splitlines(),
                        f"block {following.number} (expected)",
                        "actual",
                        lineterm="",
                    )
                )
                pytest.fail(
                    f"{block.describe(page)}\noutput differs from block {following.number}:"
                    f"\n{diff}",
                    pytrace=False,
                )


def test_api_reference_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_api.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_block_parser() -> None:
    text = (
        "intro\n```python\nx = 1\n```\n\n"
        "````text\n```python\nnot a block\n```\n````\n"
        "```sh\necho hi\n```\n```text output\nhi\n```\n"
    )
    found = blocks(text)
    assert [(b.number, b.language, b.line, b.code) for b in found] == [
        (1, "python", 3, "x = 1\n"),
        (2, "text", 7, "```python\nnot a block\n```\n"),
        (3, "sh", 12, "echo hi\n"),
        (4, "text", 15, "hi\n"),
    ]
    assert [b.is_expected_output for b in found] == [False, False, False, True]
    script = shell_script(
        "uv run pytest -q\nuv run examples/cache_text.py  # c\nuv run dataset-rt head x\n"
    )
    assert script.splitlines()[1:] == [
        ":  # skipped by tests/test_docs.py: uv run pytest -q",
        "python examples/cache_text.py  # c",
        "dataset-rt head x",
    ]
