"""The package's structure, checked from the source alone (``ast``; nothing is imported).

1. **One binding.** Only ``dataset_rt/_native.py`` touches cffi: no other module imports
   ``dataset_rt._ffi`` or names ``ffi`` / ``lib`` (imported, assigned or as an attribute
   such as ``_native.lib``).
2. **Layers.** Every module of ``dataset_rt`` has a layer in :data:`LAYERS`, and every
   import of a ``dataset_rt`` module (module level, inside functions, under
   ``TYPE_CHECKING``) goes to the same or a lower layer. The one exception is
   :data:`SANCTIONED`, which must stay a lazy (function-local) import. A new module fails
   until it is placed in the table.
3. **No cycles** in the import graph (without the sanctioned edge).
4. **The binding mirrors the header**: every ``drt_*`` function has a wrapper named after
   it (``drt_iter_next_batch`` is ``Iterator.next_batch``, ``drt_io_uring_available`` is
   ``io_uring_available``), and every ``DRT_*`` constant is read from ``lib`` there
   (never retyped as a number).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dataset_rt"
HEADER = ROOT / "native" / "include" / "dataset_rt.h"
BINDING = "dataset_rt._native"
GENERATED = "dataset_rt._ffi"  # written by hatch_build.py; not parsed

# Lowest first. A module may import modules of its own layer or of layers below it.
LAYERS: list[tuple[str, set[str]]] = [
    # Plain Python: configuration models, records and results, CPU budgets; which
    # distribution is installed; where the C SDK's files are. No native code.
    (
        "foundation",
        {
            "dataset_rt.config",
            "dataset_rt.records",
            "dataset_rt.resources",
            "dataset_rt._distribution",
            "dataset_rt.sdk",
            # Reused batch memory (rings released by views' deaths; numpy only).
            "dataset_rt._buffers",
        },
    ),
    # The binding: the only module that talks to the library (and cffi's module).
    ("binding", {BINDING, GENERATED}),
    # Files beside the native core: metadata.arrow and the active table, manifest
    # migration, dataset.json snapshots (and 0.4.8's module path for them).
    (
        "files",
        {
            "dataset_rt.metadata",
            "dataset_rt.manifests",
            "dataset_rt.snapshot",
            "dataset_rt.reconstruction",
            # Caches on object storage: the obstore transport, URL helpers, uploads.
            "dataset_rt.remote",
        },
    ),
    # Reading and writing: datasets, the writer, spawned writer processes.
    ("engines", {"dataset_rt.dataset", "dataset_rt.writer", "dataset_rt.parallel"}),
    # DatasetRuntime: where sources are written and which caches are reused.
    ("runtime", {"dataset_rt.runtime"}),
    # The public surface built on a runtime: the facade, the package, fragments.
    ("facade", {"dataset_rt", "dataset_rt.api", "dataset_rt.fragments"}),
    # Front ends: the framework integrations and the command line.
    (
        "frontends",
        {
            "dataset_rt.integrations",
            "dataset_rt.integrations._loading",
            "dataset_rt.integrations.loader",
            "dataset_rt.integrations.loader_logging",
            "dataset_rt.integrations.loader_options",
            "dataset_rt.integrations.loading",
            "dataset_rt.integrations.torch",
            "dataset_rt.integrations.ray",
            "dataset_rt.cli",
            "dataset_rt.__main__",
            # python -m dataset_rt.run_benchmark (the benchmark extra; torch imported lazily).
            "dataset_rt.run_benchmark",
            "dataset_rt.benchmarks",
            "dataset_rt.benchmarks.config",
            "dataset_rt.benchmarks.resources",
            "dataset_rt.benchmarks.distributed",
        },
    ),
]
LAYER_OF = {module: index for index, (_, modules) in enumerate(LAYERS) for module in modules}

# The one upward import, and why it is allowed.
SANCTIONED = {
    ("dataset_rt.dataset", "dataset_rt.integrations.torch"): (
        "CachedDataset.to_torch_* hand over to the PyTorch adapters; imported inside the "
        "method so that `import dataset_rt` never imports torch"
    ),
}

# Handles of the binding, by the prefix of their C functions.
HANDLE_CLASSES = {
    "runtime": "Runtime",
    "dataset": "Dataset",
    "iter": "Iterator",
    "lookup": "Lookup",
    "writer": "Writer",
    "commit": "Commit",
    "remote": "Remote",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    """Every module of the package (recursively) except the generated cffi module."""
    found = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    found.pop(GENERATED, None)
    return found


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    context: str  # "module", "function" or "TYPE_CHECKING"

    def describe(self) -> str:
        return f"{self.source}:{self.line} imports {self.target} ({self.context})"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, context: str = "module") -> Iterator[tuple[ast.AST, str]]:
    """Every node below ``node`` with where it sits: module level, inside a function
    (anywhere below a def or lambda), or in an ``if TYPE_CHECKING:`` block."""
    for child in ast.iter_child_nodes(node):
        inner = context
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner = "function"
        yield child, inner
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.body:
                yield statement, "TYPE_CHECKING"
                yield from _walk(statement, "TYPE_CHECKING")
            for statement in child.orelse:
                yield statement, inner
                yield from _walk(statement, inner)
            continue
        yield from _walk(child, inner)


def _resolve(base: str, name: str, known: set[str]) -> str:
    """``from base import name``: the module ``base.name`` when it is one, else ``base``."""
    candidate = f"{base}.{name}"
    return candidate if candidate in known else base


def imports(
    source: str, tree: ast.Module, known: set[str], *, is_package: bool = False
) -> list[Import]:
    """The imports of ``dataset_rt`` modules in one module (``is_package``: it is an
    ``__init__.py``, which matters for relative imports)."""
    found = []
    for node, context in _walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from this module's package, level - 1 steps up
                parts = source.split(".") if is_package else source.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [_resolve(base, alias.name, known) for alias in node.names]
        for target in targets:
            if target == "dataset_rt" or target.startswith("dataset_rt."):
                found.append(Import(source, target, node.lineno, context))
    return found


def all_imports() -> list[Import]:
    modules = sources()
    known = set(modules) | set(LAYER_OF)
    return [
        edge
        for name, path in modules.items()
        for edge in imports(name, parse(path), known, is_package=path.name == "__init__.py")
    ]


# ------------------------------------------------------------------------ 1. binding


def ffi_uses(source: str, tree: ast.Module) -> list[str]:
    """Places where a module touches cffi's ``ffi`` or ``lib`` or the generated module."""
    hits = []
    for node, _ in _walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Name) and node.id in ("ffi", "lib"):
            hits.append(f"{source}:{line} uses the name {node.id!r}")
        elif isinstance(node, ast.Attribute) and node.attr in ("ffi", "lib"):
            hits.append(f"{source}:{line} uses the attribute .{node.attr}")
        elif isinstance(node, ast.alias) and {node.name, node.asname} & {"ffi", "lib"}:
            hits.append(f"{source}:{line} imports {node.name!r}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == GENERATED:
                    hits.append(f"{source}:{line} imports {GENERATED}")
        elif isinstance(node, ast.ImportFrom):
            names = {alias.name for alias in node.names}
            if node.module == GENERATED or (node.module == "dataset_rt" and "_ffi" in names):
                hits.append(f"{source}:{line} imports {GENERATED}")
            if node.module == BINDING and names & {"ffi", "lib"}:
                hits.append(f"{source}:{line} imports ffi/lib from the binding")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and any(isinstance(a, ast.Constant) and a.value in ("ffi", "lib") for a in node.args)
        ):
            hits.append(f"{source}:{line} reads ffi/lib with getattr")
    return hits


def test_only_the_binding_touches_cffi() -> None:
    modules = sources()
    assert BINDING in modules
    hits = [
        hit
        for name, path in modules.items()
        if name != BINDING
        for hit in ffi_uses(name, parse(path))
    ]
    assert hits == [], "only dataset_rt/_native.py may touch ffi/lib:\n" + "\n".join(hits)


def test_the_binding_check_finds_uses() -> None:
    """The checker itself sees each way of reaching cffi (so the test above can fail)."""
    samples = [
        "from dataset_rt._native import lib",
        "from dataset_rt._native import ffi as f",
        "from dataset_rt import _ffi",
        "import dataset_rt._ffi",
        "from dataset_rt import _native\nx = _native.lib.drt_version()",
        "def f():\n    from dataset_rt import _native\n    return getattr(_native, 'ffi')",
    ]
    for sample in samples:
        assert ffi_uses("sample", ast.parse(sample)), sample
    assert ffi_uses("sample", ast.parse("from dataset_rt import _native\n_native.check(0)")) == []


# ------------------------------------------------------------------------ 2. layers


def test_every_module_has_a_layer() -> None:
    modules = set(sources())
    missing = sorted(modules - set(LAYER_OF))
    assert missing == [], f"modules without a layer (add them to LAYERS): {missing}"
    stale = sorted(set(LAYER_OF) - modules - {GENERATED})
    assert stale == [], f"LAYERS names modules that do not exist: {stale}"
    unknown = sorted({e.describe() for e in all_imports() if e.target not in LAYER_OF})
    assert unknown == [], "imports of modules without a layer:\n" + "\n".join(unknown)


def upward(edges: list[Import]) -> list[Import]:
    return [
        edge
        for edge in edges
        if edge.target in LAYER_OF
        and LAYER_OF[edge.target] > LAYER_OF[edge.source]
        and (edge.source, edge.target) not in SANCTIONED
    ]


def describe_upward(edge: Import) -> str:
    source_layer = LAYERS[LAYER_OF[edge.source]][0]
    target_layer = LAYERS[LAYER_OF[edge.target]][0]
    return f"{edge.describe()}: layer {source_layer!r} imports {target_layer!r}"


def test_imports_go_down_the_layers() -> None:
    edges = all_imports()
    bad = [describe_upward(edge) for edge in upward(edges)]
    assert bad == [], "imports that go up the layers:\n" + "\n".join(bad)


def test_the_sanctioned_import_is_lazy_and_still_needed() -> None:
    edges = all_imports()
    for (source, target), why in SANCTIONED.items():
        uses = [e for e in edges if (e.source, e.target) == (source, target)]
        assert uses, f"{source} no longer imports {target}: remove it from SANCTIONED"
        eager = [e.describe() for e in uses if e.context != "function"]
        assert eager == [], f"{why}; but found: {eager}"


def test_the_layer_check_finds_upward_imports() -> None:
    """An upward import, at module level, in a function or for type checking alone,
    is reported (so the test above can fail)."""
    samples = {
        "from dataset_rt.runtime import DatasetRuntime": "module",
        "def f():\n    from dataset_rt import runtime": "function",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dataset_rt.runtime": (
            "TYPE_CHECKING"
        ),
    }
    known = set(LAYER_OF)
    for sample, context in samples.items():
        edges = imports("dataset_rt.writer", ast.parse(sample), known)
        assert [(e.target, e.context) for e in upward(edges)] == [("dataset_rt.runtime", context)]
    relative = imports("dataset_rt.writer", ast.parse("from .runtime import DatasetRuntime"), known)
    assert [e.target for e in upward(relative)] == ["dataset_rt.runtime"]
    down = imports("dataset_rt.runtime", ast.parse("from dataset_rt import writer"), known)
    assert upward(down) == [] and [e.target for e in down] == ["dataset_rt.writer"]
    package = imports("dataset_rt", ast.parse("from . import api"), known, is_package=True)
    assert [e.target for e in package] == ["dataset_rt.api"]


# ------------------------------------------------------------------------ 3. cycles


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def import_graph(edges: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for edge in edges:
        if (edge.source, edge.target) not in SANCTIONED and edge.source != edge.target:
            graph.setdefault(edge.source, set()).add(edge.target)
    return graph


def test_import_graph_has_no_cycles() -> None:
    cycle = find_cycle(import_graph(all_imports()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


# ------------------------------------------------------------------------ 4. header


def cdef_region() -> str:
    text = HEADER.read_text(encoding="utf-8")
    region = text[text.index("/* DRT_CDEF_BEGIN */") : text.index("/* DRT_CDEF_END */")]
    return re.sub(r"/\*.*?\*/", "", region, flags=re.S)


def binding_api() -> tuple[set[str], dict[str, set[str]]]:
    """The binding's module-level functions and each class's methods (inherited from
    classes of the same module included)."""
    tree = parse(PACKAGE / "_native.py")
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    own: dict[str, set[str]] = {}
    bases: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            own[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]

    def methods(cls: str) -> set[str]:
        found = set(own.get(cls, ()))
        for base in bases.get(cls, ()):
            found |= methods(base)
        return found

    return functions, {cls: methods(cls) for cls in own}


def test_binding_wraps_every_function_under_its_name() -> None:
    functions, classes = binding_api()
    missing = []
    for name in sorted(set(re.findall(r"\b(drt_[a-z0-9_]+)\s*\(", cdef_region()))):
        prefix, _, rest = name.removeprefix("drt_").partition("_")
        if prefix in HANDLE_CLASSES and rest:
            cls = HANDLE_CLASSES[prefix]
            if rest not in classes.get(cls, set()):
                missing.append(f"{name}: {cls}.{rest}")
        elif name.removeprefix("drt_") not in functions:
            missing.append(f"{name}: {name.removeprefix('drt_')}()")
    assert missing == [], "C functions without their binding wrapper:\n" + "\n".join(missing)


def test_binding_reads_every_constant_from_the_library() -> None:
    declared = set(re.findall(r"\b(DRT_[A-Z0-9_]+)\s*=", cdef_region()))
    assert {"DRT_KIND_BOOL", "DRT_IO_URING", "DRT_STAGE_COUNT"} <= declared
    tree = parse(PACKAGE / "_native.py")
    read = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "lib"
    }
    missing = sorted(declared - read)
    assert missing == [], f"constants of the header not read from lib in _native.py: {missing}"
