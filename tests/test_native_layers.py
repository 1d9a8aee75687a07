"""The native tree's layers: every ``@import`` of a project file goes down a layer (or stays
in its own folder), never up. The layer order is the architecture (docs/architecture.md):
base → codec → format → store → io → read | write → abi, with ``root.zig`` on top."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "native" / "src"

# Folder → rank. A file may import files of a lower rank, or of its own folder. `read`
# and `write` share a rank but are siblings: neither imports the other.
LAYERS = {
    "base": 0,
    "codec": 1,
    "format": 2,
    "store": 3,
    "io": 4,
    "read": 5,
    "write": 5,
    "abi": 6,
    ".": 7,  # root.zig
}

IMPORT = re.compile(r'@import\("([^"]+)"\)')


def layer_of(path: Path, src: Path) -> str:
    rel = path.relative_to(src)
    return rel.parts[0] if len(rel.parts) > 1 else "."


def violations(src: Path = SRC) -> list[str]:
    """Every import that goes up a layer, sideways between layers, or out of the tree."""
    src = src.resolve()
    found: list[str] = []
    for file in sorted(src.rglob("*.zig")):
        here = layer_of(file, src)
        if here not in LAYERS:
            found.append(f"{file.relative_to(src)}: folder {here!r} is not a known layer")
            continue
        for line_no, line in enumerate(file.read_text().splitlines(), 1):
            for target in IMPORT.findall(line):
                if not target.endswith(".zig"):
                    continue  # std, builtin, build_options
                resolved = (file.parent / target).resolve()
                where = f"{file.relative_to(src)}:{line_no}: imports {target}"
                if not resolved.is_relative_to(src):
                    found.append(f"{where} (outside native/src)")
                    continue
                there = layer_of(resolved, src)
                if there == here:
                    continue
                if there not in LAYERS or LAYERS[there] >= LAYERS[here]:
                    found.append(f"{where} ({here} may not import {there})")
    return found


def test_native_imports_only_go_down() -> None:
    assert violations() == []


def test_every_native_file_is_in_a_layer_folder() -> None:
    top = sorted(p.name for p in SRC.glob("*.zig"))
    assert top == ["root.zig"]


def test_the_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The check is not vacuous: a codec file importing the reader is reported."""
    for folder in ("codec", "read"):
        (tmp_path / folder).mkdir()
    (tmp_path / "read" / "iterator.zig").write_text('const std = @import("std");\n')
    (tmp_path / "codec" / "lz4.zig").write_text('const it = @import("../read/iterator.zig");\n')
    (tmp_path / "root.zig").write_text('comptime { _ = @import("codec/lz4.zig"); }\n')
    assert violations(tmp_path) == [
        "codec/lz4.zig:1: imports ../read/iterator.zig (codec may not import read)"
    ]


@pytest.mark.parametrize(("a", "b"), [("read", "write"), ("write", "read")])
def test_read_and_write_are_siblings(tmp_path: Path, a: str, b: str) -> None:
    for folder in (a, b):
        (tmp_path / folder).mkdir()
    (tmp_path / b / "x.zig").write_text("")
    (tmp_path / a / "y.zig").write_text(f'const x = @import("../{b}/x.zig");\n')
    assert len(violations(tmp_path)) == 1
