"""Generate docs/api.md, the API reference, from the code's signatures and docstrings.

    uv run python docs/gen_api.py            # rewrite docs/api.md
    uv run python docs/gen_api.py --check    # exit 1 when docs/api.md is stale

Covers every name of ``dataset_rt.__all__`` (names not placed in ``GROUPS`` below get a
section "Other public names", so a new public name is never left out), the public members of
``CachedDataset`` and ``DatasetRuntime``, ``SampleBatch``, the fields of the config
models with their defaults and constraints, and the extra aliases and defaults of
``dataset_rt.api``, and the integration modules (``dataset_rt.fragments``, the torch
and ray adapters and ``dataset_rt.benchmarks.config``, read from their source so their
extras need not be installed). The
output depends only on the code, so it is deterministic.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import itertools
import re
import sys
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "api.md"
sys.path.insert(0, str(ROOT))

import dataset_rt  # noqa: E402
import dataset_rt.api  # noqa: E402
from dataset_rt import config, records  # noqa: E402
from dataset_rt.dataset import SampleBatch  # noqa: E402

# Sections of the page: (title, intro, names). Names are looked up in dataset_rt.api.
GROUPS: list[tuple[str, str, list[str]]] = [
    (
        "Runtime and datasets",
        "Write caches and load them; iterate, sample and steer datasets.",
        ["DatasetRuntime", "CachedDataset", "SampleBatch"],
    ),
    (
        "Configuration",
        "Frozen pydantic models: instances are immutable, hashable, compare by value and pickle.",
        ["ReaderConfig", "WriterConfig", "ShardCompression", "WriterProfilerConfig"],
    ),
    (
        "Sources and samples",
        "What a source yields and what reading returns.",
        ["CacheSource", "CacheInput", "CachedSample"],
    ),
    (
        "Write results",
        "Per-source outcomes of `write_cache` and `from_cache_sources`.",
        [
            "CacheWriteSuccess",
            "CacheWriteError",
            "CacheWriteResult",
            "CacheSourcesDatasetSuccess",
            "CacheSourcesDatasetError",
            "CacheSourcesDatasetResult",
        ],
    ),
    (
        "Manifest migration results",
        "Values returned by `CachedDataset.update_manifests`.",
        [
            "Ok",
            "Err",
            "Result",
            "ManifestUpdateEntry",
            "ManifestUpdateReport",
            "ManifestUpdateError",
            "AbsentManifestTarget",
        ],
    ),
    (
        "PyTorch",
        "The type of `CachedDataset.to_torch_iterable_dataset()`; the adapters themselves are "
        "under [Integrations](#integrations).",
        ["SizedTorchIterableDataset"],
    ),
    (
        "Diagnostics",
        "Facts about the loaded native library (an extension of dataset_rt).",
        ["native_info"],
    ),
    (
        "The C SDK",
        "Where the installed package keeps the header and the libraries for C, C++ or Rust "
        "builds (an extension of dataset_rt; see [install.md](install.md#the-c-sdk) and "
        "`dataset-rt config`).",
        ["get_include", "get_library_dir"],
    ),
]

# Names of dataset_rt.api that are not in dataset_rt.__all__.
API_EXTRAS = [
    "BytesLike",
    "CompressionAlgo",
    "Metadata",
    "MetadataValue",
    "DEFAULT_SHARD_COMPRESSION",
    "DEFAULT_WRITER_CONFIG",
    "DEFAULT_WRITER_PROFILER_CONFIG",
]

# Dunder members shown for classes (others are implementation details).
SHOWN_DUNDERS = ("__init__", "__iter__", "__len__")

# Members whose code has no docstring: what the page says instead (marked as such).
UNDOCUMENTED = {
    "CachedDataset.__iter__": (
        "Returns a generator of `CachedSample` (a `collections.abc.Generator`: `send`, "
        "`throw` and `close` work as on 0.4.8's Python generator, but "
        "`inspect.isgenerator` is false). Nothing is reserved until its first "
        "`next()`, which takes the next `len(dataset)` positions of the dataset's stream "
        "(see [Determinism](determinism.md)). Advance it from one thread at a time (one "
        "iterator per thread): a `next()` while another thread is inside one raises "
        "`ValueError: generator already executing`, as on 0.4.8, but the stream then "
        "ends for every thread (0.4.8's goes on); copying or pickling it raises "
        "`TypeError`, as for a generator."
    ),
    "CachedDataset.__len__": (
        "The epoch length: samples each new iterator yields. It starts as the number of "
        "active rows; `set_epoch_len` and `update_metadata` change it."
    ),
}


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


MODULE_PREFIXES = re.compile(
    r"\b(?:typing|collections\.abc|dataset_rt\.api|dataset_rt\.records|pathlib|os)\."
)
ROLE = re.compile(r":(?:meth|class|func|attr|data|mod|obj):`~?([^`]+)`")


class Raw:
    """An object whose repr is the given text (for signatures: annotations, defaults)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def named_defaults() -> dict[int, str]:
    return {
        id(getattr(dataset_rt.api, name)): name
        for name in API_EXTRAS
        if name.startswith("DEFAULT_")
    }


NAMED_DEFAULTS = named_defaults()


def type_text(annotation: Any) -> str:
    """An annotation as readers write it (no module prefixes, no quotes)."""
    if isinstance(annotation, str):
        text = annotation
    elif isinstance(annotation, typing.ForwardRef):
        text = annotation.__forward_arg__
    elif annotation is inspect.Parameter.empty:
        return ""
    else:
        text = inspect.formatannotation(annotation)
    return MODULE_PREFIXES.sub("", text).replace("~", "")


def default_text(value: Any) -> str:
    if id(value) in NAMED_DEFAULTS:
        return NAMED_DEFAULTS[id(value)]
    return repr(value)


def signature_text(obj: Any, name: str, *, drop_self: bool, constructor: bool = False) -> str:
    signature = inspect.signature(obj)
    params = []
    for param in signature.parameters.values():
        if drop_self and param.name in ("self", "cls") and not params:
            drop_self = False
            continue
        annotation = (
            Raw(type_text(param.annotation)) if param.annotation is not param.empty else param.empty
        )
        default = (
            Raw(default_text(param.default)) if param.default is not param.empty else param.empty
        )
        params.append(param.replace(annotation=annotation, default=default))
    returns = signature.return_annotation
    ret = Raw(type_text(returns)) if returns is not signature.empty else signature.empty
    text = str(signature.replace(parameters=params, return_annotation=ret))
    if constructor:
        text = text.removesuffix(" -> None")
    return f"{name}{text}"


def doc_text(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return ROLE.sub(r"`\1`", doc).strip()


def inherited_doc(obj: Any, owner: type) -> bool:
    """Whether obj's docstring is only inherited (e.g. from tuple or BaseModel)."""
    own = getattr(obj, "__doc__", None)
    return own is None or owner.__doc__ == own


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def code(text: str) -> str:
    return f"`{text}`" if "`" not in text else f"`` {text} ``"


def module_docs(module: Any) -> dict[str, tuple[str, str]]:
    """Module-level assignments followed by a string: name -> (value source, docstring)."""
    source = inspect.getsource(module)
    tree = ast.parse(source)
    found: dict[str, tuple[str, str]] = {}
    body = tree.body
    for node, following in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.value is not None
        ):
            name, value = node.target.id, node.value
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            name, value = node.targets[0].id, node.value
        else:
            continue
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            found[name] = (
                ast.get_source_segment(source, value) or "",
                inspect.cleandoc(following.value.value),
            )
    return found


ALIAS_DOCS = {**module_docs(records), **module_docs(config)}


# ------------------------------------------------------------------------ renderers


def is_model(obj: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(obj, type) and issubclass(obj, BaseModel)


def is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")


def is_protocol(obj: Any) -> bool:
    return isinstance(obj, type) and getattr(obj, "_is_protocol", False)


def constraint_text(metadata: list[Any]) -> str:
    parts = []
    for item in metadata:
        kind = type(item).__name__
        if kind == "Gt":
            parts.append(f"> {item.gt}")
        elif kind == "Ge":
            parts.append(f">= {item.ge}")
        elif kind == "Lt":
            parts.append(f"< {item.lt}")
        elif kind == "Le":
            parts.append(f"<= {item.le}")
        elif getattr(item, "allow_inf_nan", None) is False:
            parts.append("finite")
        else:
            parts.append(repr(item))
    return ", ".join(parts)


def render_model(name: str, cls: Any) -> list[str]:
    fields = cls.model_fields
    params = []
    for field_name, field in fields.items():
        annotation = type_text(field.annotation)
        if field.is_required():
            params.append(f"{field_name}: {annotation}")
        else:
            params.append(f"{field_name}: {annotation} = {default_text(field.default)}")
    extra = cls.model_config.get("extra")
    out = [
        f"```text\n{name}(*, {', '.join(params)})\n```",
        "",
        doc_text(cls),
        "",
    ]
    unknown_keys = "rejected (`extra_forbidden`)" if extra == "forbid" else "ignored"
    out.append(f"Frozen. Unknown keys are {unknown_keys}.")
    out += ["", "| field | type | default | constraint | description |", "|---|---|---|---|---|"]
    for field_name, field in fields.items():
        default = "required" if field.is_required() else code(default_text(field.default))
        out.append(
            "| "
            + " | ".join(
                [
                    code(field_name),
                    cell(code(type_text(field.annotation))),
                    cell(default),
                    cell(constraint_text(field.metadata)),
                    cell(field.description or ""),
                ]
            )
            + " |"
        )
    return out


def render_namedtuple(name: str, cls: Any) -> list[str]:
    hints = cls.__annotations__
    params = ", ".join(f"{field}: {type_text(hints.get(field, ''))}" for field in cls._fields)
    out = [f"```text\n{name}({params})\n```", "", doc_text(cls), ""]
    out.append("A `NamedTuple`: fields in this order, compared, hashed and matched as a tuple.")
    out += members(name, cls, skip=set(cls._fields) | {"__init__"})
    return out


def render_dataclass(name: str, cls: Any) -> list[str]:
    out = [
        f"```text\n{signature_text(cls, name, drop_self=False, constructor=True)}\n```",
        "",
        doc_text(cls),
        "",
    ]
    out.append("A frozen dataclass: compared by value, hashable when its fields are.")
    return out


def render_protocol(name: str, cls: Any) -> list[str]:
    out = [doc_text(cls), ""]
    hints = inspect.get_annotations(cls)
    lines = [f"class {name}(Protocol):"]
    for attr, annotation in hints.items():
        lines.append(f"    {attr}: {type_text(annotation)}")
    for attr, value in cls.__dict__.items():
        if callable(value) and (not attr.startswith("_") or attr in ("__iter__", "__len__")):
            lines.append(f"    def {signature_text(value, attr, drop_self=False)}: ...")
    out = ["```text\n" + "\n".join(lines) + "\n```", "", *out]
    out.append("A `typing.Protocol` (duck typed, not runtime-checkable).")
    return out


def members(owner_name: str, cls: type, *, skip: set[str] = frozenset()) -> list[str]:
    """Public methods, properties and class attributes, in definition order."""
    out: list[str] = []
    annotations = inspect.get_annotations(cls)
    if not is_namedtuple(cls):
        for attr, annotation in annotations.items():
            if attr.startswith("_") or attr in skip:
                continue
            out += ["", f"#### `{owner_name}.{attr}: {type_text(annotation)}`", "", "Attribute."]
    for attr, value in cls.__dict__.items():
        if attr in skip or (attr.startswith("_") and attr not in SHOWN_DUNDERS):
            continue
        if attr == "__init__":
            continue
        key = f"{owner_name}.{attr}"
        if isinstance(value, property):
            ret = type_text(inspect.signature(value.fget).return_annotation)
            out += ["", f"#### `{key}: {ret}` (property, read-only)", "", doc_text(value.fget)]
            continue
        kind = ""
        function = value
        if isinstance(value, classmethod):
            kind, function = " (classmethod)", value.__func__
        elif isinstance(value, staticmethod):
            kind, function = " (staticmethod)", value.__func__
        elif not inspect.isfunction(value):
            continue
        drop = not isinstance(value, staticmethod)
        out += [
            "",
            f"#### `{signature_text(function, key, drop_self=drop)}`{kind}",
            "",
        ]
        text = doc_text(function) if function.__doc__ else ""
        if not text and key in UNDOCUMENTED:
            text = f"*(No docstring in the code.)* {UNDOCUMENTED[key]}"
        out.append(text or "*(No docstring in the code.)*")
    return out


def render_class(name: str, cls: Any) -> list[str]:
    if name == "CachedDataset":
        out = [doc_text(cls)]
    else:
        out = [
            f"```text\n{signature_text(cls.__init__, name, drop_self=True, constructor=True)}\n```",
            "",
            doc_text(cls),
        ]
    return out + members(name, cls)


def render_alias(name: str) -> list[str]:
    value, doc = ALIAS_DOCS[name]
    return [f"```text\n{name} = {value}\n```", "", ROLE.sub(r"`\1`", doc)]


def render_constant(name: str) -> list[str]:
    value = getattr(dataset_rt.api, name)
    _, doc = ALIAS_DOCS.get(name, ("", ""))
    return [f"```text\n{name} = {value!r}\n```", "", doc]


def render_function(name: str, function: Any) -> list[str]:
    return [
        f"```text\n{signature_text(function, name, drop_self=False)}\n```",
        "",
        doc_text(function) or "*(No docstring in the code.)*",
    ]


def render(name: str) -> list[str]:
    if name == "SampleBatch":
        obj = SampleBatch
    else:
        obj = (
            getattr(dataset_rt.api, name, None)
            if hasattr(dataset_rt.api, name)
            else getattr(dataset_rt, name)
        )
    if name.startswith("DEFAULT_"):
        body = render_constant(name)
    elif is_model(obj):
        body = render_model(name, obj)
    elif is_namedtuple(obj):
        body = render_namedtuple(name, obj)
    elif dataclasses.is_dataclass(obj):
        body = render_dataclass(name, obj)
    elif is_protocol(obj):
        body = render_protocol(name, obj)
    elif isinstance(obj, type):
        body = render_class(name, obj)
    elif inspect.isfunction(obj):
        body = render_function(name, obj)
    else:
        body = render_alias(name)
    return [f"### {name}", "", *body, ""]


# Optional integrations, documented from their source (torch and ray are not installed
# where the docs are generated): module -> the extra it needs, or "" for none.
INTEGRATION_MODULES = {
    "dataset_rt.fragments": "",
    "dataset_rt.integrations.torch": "torch",
    "dataset_rt.integrations.ray": "ray",
    "dataset_rt.benchmarks.config": "benchmark",
}


def ast_signature(node: ast.FunctionDef, name: str, *, drop_self: bool) -> str:
    args = node.args
    if drop_self and args.args and args.args[0].arg in ("self", "cls"):
        args = ast.arguments(
            posonlyargs=args.posonlyargs,
            args=args.args[1:],
            vararg=args.vararg,
            kwonlyargs=args.kwonlyargs,
            kw_defaults=args.kw_defaults,
            kwarg=args.kwarg,
            defaults=args.defaults,
        )
    text = f"{name}({ast.unparse(args)})"
    if node.returns is not None and node.name != "__init__":
        text += f" -> {ast.unparse(node.returns)}"
    return text


def source_doc(node: Any) -> str:
    """A docstring from the AST, cleaned like ``doc_text`` does for live objects."""
    return ROLE.sub(r"`\1`", ast.get_docstring(node) or "").strip()


def integration_section(module: str, extra: str) -> list[str]:
    """``module``'s ``__all__`` rendered from its source: signatures and docstrings."""
    path = ROOT / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names = list(ast.literal_eval(node.value))
    needs = f" (needs `pip install 'dataset-rt-zig[{extra}]'`)" if extra else ""
    out = [f"### `{module}`", "", source_doc(tree).split("\n\n")[0] + needs, ""]
    for name in names:
        node = nodes[name]
        out += [f"#### `{module}.{name}`", ""]
        if isinstance(node, ast.FunctionDef):
            out += [f"```text\n{ast_signature(node, name, drop_self=False)}\n```", ""]
            out += [source_doc(node) or "*(No docstring in the code.)*"]
            out.append("")
            continue
        init = next(
            (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
            None,
        )
        bases = ", ".join(ast.unparse(b) for b in node.bases)
        heading = ast_signature(init, name, drop_self=True) if init else f"class {name}({bases})"
        out += [f"```text\n{heading}\n```", "", source_doc(node), ""]
        for member in node.body:
            if (
                isinstance(member, ast.FunctionDef)
                and not member.name.startswith("_")
                and ast.get_docstring(member)
            ):
                signature = ast_signature(member, member.name, drop_self=True)
                out += [f"- `{signature}`: " + " ".join(source_doc(member).split())]
        out.append("")
    return out


def anchor(name: str) -> str:
    return name.lower()


def groups() -> list[tuple[str, str, list[str]]]:
    """GROUPS restricted to names that exist, plus a group for public names not in GROUPS."""
    public = list(dataset_rt.__all__)
    present = [
        (title, intro, [n for n in names if n in public or n == "SampleBatch"])
        for title, intro, names in GROUPS
    ]
    listed = {name for _, _, names in present for name in names}
    others = sorted(name for name in public if name not in listed)
    if others:
        present.append(
            ("Other public names", "Public names of `dataset_rt` not described above.", others)
        )
    return [(title, intro, names) for title, intro, names in present if names]


def api_extras() -> list[str]:
    public = set(dataset_rt.__all__)
    return [
        name for name in API_EXTRAS if name in dataset_rt.api.__all__ and name not in public
    ] + sorted(set(dataset_rt.api.__all__) - public - set(API_EXTRAS))


def generate() -> str:
    sections = groups()
    extras = api_extras()

    lines = [
        "# API reference",
        "",
        "<!-- Generated by docs/gen_api.py from the code's signatures and docstrings. Do not",
        "     edit: run `uv run python docs/gen_api.py` (the docs test checks it is current). -->",
        "",
        "Every name below is importable from `dataset_rt`; the classes and aliases also from",
        "the facade `dataset_rt.api` (the same objects). Exceptions: `SampleBatch` is",
        "`dataset_rt.dataset.SampleBatch` (not re-exported), and the names of the last section",
        "are only in `dataset_rt.api`. Guides: [caching](guide-cache.md),",
        "[metadata](guide-metadata.md); semantics: [determinism](determinism.md),",
        "[format](format.md), [compatibility](compatibility.md).",
        "",
    ]
    for title, _, names in sections:
        links = ", ".join(f"[`{n}`](#{anchor(n)})" for n in names)
        lines.append(f"- {title}: {links}")
    lines.append(
        "- Also in `dataset_rt.api`: " + ", ".join(f"[`{n}`](#{anchor(n)})" for n in extras)
    )
    lines.append(
        "- [Integrations](#integrations): "
        + ", ".join(f"`{module}`" for module in INTEGRATION_MODULES)
    )
    lines.append("")
    for title, intro, names in sections:
        lines += [f"## {title}", "", intro, ""]
        for name in names:
            lines += render(name)
    lines += [
        "## Also in `dataset_rt.api`",
        "",
        "Type aliases and default objects of the facade module (not in `dataset_rt.__all__`).",
        "",
    ]
    for name in extras:
        lines += render(name)
    lines += [
        "## Integrations",
        "",
        "Modules imported on their own (`import dataset_rt` imports none of them): the",
        "fragment API for distributed cache building, the PyTorch and Ray adapters, and the",
        "benchmark's options. See [the PyTorch guide](guide-torch.md), [the cluster",
        "guide](guide-ray.md) and [the benchmark](benchmark.md).",
        "",
    ]
    for module, extra in INTEGRATION_MODULES.items():
        lines += integration_section(module, extra)
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate docs/api.md from the code.")
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/api.md is stale")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current == text:
            return 0
        diff = difflib.unified_diff(
            current.splitlines(), text.splitlines(), "docs/api.md", "generated", lineterm="", n=1
        )
        print("docs/api.md is stale; run `uv run python docs/gen_api.py`:", file=sys.stderr)
        print("\n".join(list(diff)[:60]), file=sys.stderr)
        return 1
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
