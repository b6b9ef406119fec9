"""The docs name only what exists: every code name in backticks resolves against the source.

docs/architecture.md is the design of record and names files and functions; the how-tos
beside it do too. A rename that forgets the doc fails here. What is checked, for each span
of inline code (`` `...` ``, a span may cross a line break) outside fenced blocks:

* **Paths.** A span with a ``/`` that ends with ``/`` or a file extension or starts with a
  folder of the repository or of ``rda/`` (``transport/zmq_client.py``, ``business/client/``,
  ``tests/test_layout.py``, ``ops/``), or a bare file name ending ``.py``/``.pyx``/``.md``
  (``runtime.py``, ``_cbinary.pyx``). It resolves when it exists relative to the repository
  root (``tests/``, ``benchmarks/``, ``examples/``, ``ops/``, ``docs/``, ``rda/_cli.py``) or
  to ``rda/`` (the layers: ``transport/...`` is ``rda/transport/...``); else relative to the
  folder of a path named earlier in the same section, nearest first, or one of that folder's
  parents (``server/replies.py`` after ``business/server/requests.py``); else, for a bare name,
  by being the only file or folder of that name in the repository. ``*`` is a glob and must
  match something. Not paths: spans with a space, ``:`` (URLs, ``history:DEV/PROP``), ``<`` or
  ``{``, or starting ``/``, ``~``, ``.`` or ``$`` (files on a user's machine), or with an
  upper-case first part (``PS1/Acquisition``, ``DIR/server.key_secret``: devices, placeholders).
* **Dotted names.** The leading dotted name of a span (``Server.stop`` of
  ``Server.stop(timeout=2.0)``; the span may go on with ``(``, ``[`` or `` = ``, anything
  else means it is not code). ``rda.x.y``: the longest importable module prefix is imported
  and the rest walked with ``getattr`` (an instance attribute of a class is looked up in its
  source as below). Otherwise, by the first part: a class of the repository's Python source
  (``ClientService._on_connected``): the next part is defined in its body (def, class,
  assignment, annotation), assigned as ``self.part`` in one of its methods, or found on a base
  class (named in the source, or, for a class of ``rda``, on the imported class); a module or
  package of that name (``_zmq_common.send_frames``, ``relay.Relay._stand_by``): the next
  part is a top-level name of one of them or a sub-module, then as for a class; an importable
  module (``asyncio.to_thread``, ``np.shares_memory``): imported and walked. Any other first
  part is a variable (``sub.close``, ``request.complete``): it must be bound somewhere in the
  source (assignment, argument, import), its last part defined somewhere (def, class,
  assignment, annotation, ``self.`` attribute, keyword argument), and a CamelCase part on the
  way must be a class that has the part after it; a CamelCase first part that is no class
  fails. Not dotted names: file names (``rda.toml``, ``etcd.log``: the last part is a file
  extension) and selectors (``CPS.USER.ALL``: every part upper-case).
* **Plain identifiers**, leniently: one that starts with ``_`` (``_SCALAR_STRUCTS``,
  ``_drain_router``), is CamelCase (``GroupTaskScheduler``) or is snake_case with a lower-case
  letter (``send_hwm``, ``held_only_by_the_handler``) must occur as a word of the code of the
  repository's Python or Cython source (identifiers and the words of string constants;
  docstrings and comments do not count), or of the alert rules in ``ops/``.
  ALL_CAPS (``FIRST``, ``ROUTER_MANDATORY``: wire and libzmq names, often not Python names)
  and single lower-case words (``get``, ``close``) are not checked.
* Spans starting with a shell word (``rda``, ``make``, ``python``, ``pip``, ``import``, ...),
  and everything in fenced blocks, are not checked, except: in a fenced block, words that are
  clearly repository paths (starting ``rda/``, ``tests/``, ``benchmarks/``, ``examples/``,
  ``ops/`` or ``docs/``); and the layout tree of architecture.md (the fenced block opening with
  ``rda/``), whose every file and folder name resolves in the folder its indentation puts it
  in, whose ``rda.`` names resolve, and which names every module of the ``rda`` package (a
  file missing from the tree fails: the tree is where a newcomer looks).

``ALLOWED`` is the short list of true exceptions, each with its reason.

Pages checked: every page of docs/ (architecture, transport, server, client, protocol,
serialization, security, config, admin, cli, metrics, history, panel, deployment, tutorial),
except performance.md: a dated record whose sections name the code as it was on the day each
figure was measured (later commits rename those names on purpose; its headings are what the
code and the other pages cite). Names a page defines in its own code blocks (the tutorial's
``ps_server.py``, its ``class``/``def`` lines) are the page's, not the repository's. Metric
names (``rda_*``, and the ``_suffix`` shorthand written after one in the same paragraph) are
built by the collectors from parts, so they are not looked up here. A dotted span that is a
string constant of the source (a logger's name ``rda.server``, a metadata key ``rda.keys``)
resolves.

The source's own prose is held to the same standard: no docstring or comment of ``rda/``
cites a file outside the repository (``STYLE.md``, ``DESIGN.md``, the seed documents, the
first design), and none carries a microsecond figure (``NOT_MEASUREMENTS`` lists the two
files whose figures are chosen values or examples of output); ``PENDING`` lists the files
another change of issue 32 is rewriting, until their fixes land.

How it was shown to fail: ``test_the_checker_tells_a_good_name_from_a_bad_one`` and
``test_the_recipe_before_issue_32_fails`` below; and every checked name of architecture.md,
transport.md, client.md, server.md, protocol.md and serialization.md was mutated in turn (a
suffix on each part of a dotted name, on a file's name, on an identifier), each mutation
failing the check except three spans ``arr.flags.writeable``, a variable's attribute chain
(``flags`` is numpy's), which only the last part's existence can check.
"""

from __future__ import annotations

import ast
import builtins
import functools
import glob
import importlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: Pages not checked, with the reason.
SKIPPED_PAGES = {
    # A dated record: each section names the code as it was when the figure was measured.
    "performance.md",
}

#: Spans that look like code but name something outside the repository on purpose.
ALLOWED: dict[str, str] = {
    "a_first": "client.md's notation for the stamp of the first live update",
    "name_len": "a field of the byte layout in serialization.md, not a Python name",
    "root/_journal": "a folder of a history store on disk, made at run time",
    "_schemas/": "a folder of a history store on disk, made at run time",
    "sbin/start-*.sh": "Spark's scripts",
    "fs.s3a.endpoint.region": "a Hadoop setting",
    "spark.sql.session.timeZone": "a Spark setting",
    "PyFileSystem": "pyarrow's class",
    "Upgrade": "the HTTP header",
}

#: Folders of the repository searched for files and sources (build output and caches skipped).
_TOP = ("rda", "tests", "benchmarks", "examples", "ops", "docs")
_SKIP_DIRS = {"__pycache__", ".git", "build", ".venv", ".mypy_cache", ".ruff_cache", "dist"}
_REPO_PREFIXES = ("rda/", "tests/", "benchmarks/", "examples/", "ops/", "docs/")
_FILE_SUFFIXES = (".py", ".pyx", ".pxd", ".md")
#: A dotted span whose last part is one of these is a file name, not code.
_FILE_EXTENSIONS = {
    "toml", "json", "yml", "yaml", "log", "txt", "csv", "parquet", "html", "js", "css",
    "sh", "cfg", "ini", "key", "secret", "pem", "service", "arrow", "so", "c", "whl",
    "gz", "zip", "jsonl", "md", "py", "pyx", "in", "d", "lock", "pid", "key_secret", "png",
    "svg",
}  # fmt: skip
#: First words of spans that are commands, not names.
_SHELL_WORDS = {
    "rda", "make", "python", "python3", "pip", "import", "from", "cd", "export", "git",
    "pytest", "mypy", "ruff", "etcd", "etcdctl", "curl", "sudo", "apt-get", "docker",
    "kill", "promtool", "uvicorn", "spark-submit", "PY", "env", "with", "for", "return",
    "def", "class", "await", "async", "lambda", "not", "if", "pkill",
}  # fmt: skip

#: Conventional import names of libraries the docs write them with.
_ALIASES = {"np": "numpy", "pa": "pyarrow", "pq": "pyarrow.parquet", "pd": "pandas"}

_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
_HEADING = re.compile(r"#{1,6}\s")
_FENCE = re.compile(r"\s*(```|~~~)")
_REPO_PATH = re.compile(r"(?<![\w/.~$-])((?:rda|tests|benchmarks|examples|ops|docs)/[\w./*-]*)")


# -- the index of the source ---------------------------------------------------------------


@dataclass
class ClassInfo:
    name: str
    path: Path
    members: set[str] = field(default_factory=set)
    bases: list[str] = field(default_factory=list)


@dataclass
class ModuleInfo:
    path: Path
    names: set[str] = field(default_factory=set)


@dataclass
class Index:
    files: set[str]  # repository-relative posix paths, folders end with "/"
    by_basename: dict[str, list[str]]
    classes: dict[str, list[ClassInfo]]
    modules: dict[str, list[ModuleInfo]]  # by stem; a package by its folder name
    defined: set[str]  # every name defined anywhere
    words: set[str]  # every word of the source: identifiers, strings, ops/ files
    strings: set[str]  # every string constant of the Python source


def _walk(top: Path) -> Iterator[Path]:
    for folder, dirs, names in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
        here = Path(folder)
        yield here
        for name in sorted(names):
            yield here / name


def _targets(node: ast.expr) -> Iterator[ast.expr]:
    if isinstance(node, ast.Tuple | ast.List):
        for element in node.elts:
            yield from _targets(element)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)
    else:
        yield node


def _class_info(node: ast.ClassDef, path: Path) -> ClassInfo:
    info = ClassInfo(node.name, path)
    for base in node.bases:
        text = ast.unparse(base).split("[")[0]
        info.bases.append(text.rsplit(".", 1)[-1])
    for statement in node.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            info.members.add(statement.name)
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                info.members.update(t.id for t in _targets(target) if isinstance(t, ast.Name))
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            info.members.add(statement.target.id)
    for inner in ast.walk(node):
        targets: list[ast.expr] = []
        if isinstance(inner, ast.Assign):
            targets = [t for target in inner.targets for t in _targets(target)]
        elif isinstance(inner, ast.AnnAssign | ast.AugAssign):
            targets = [inner.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id in ("self", "cls")
            ):
                info.members.add(target.attr)
    return info


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    names.update(t.id for t in _targets(target) if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return names


_PYX_DEFINITION = re.compile(
    r"^(?:cp?def|def|class|cdef\s+class)\s+(?:[\w\[\]*, ]+\s+)?(\w+)\s*[(:]", re.M
)


def _pyx_names(text: str) -> set[str]:
    """Top-level names of a Cython file, read with a pattern (it is not Python syntax)."""
    return set(_PYX_DEFINITION.findall(text)) | set(re.findall(r"^(\w+)\s*=", text, re.M))


def _code_words(tree: ast.Module) -> set[str]:
    """Identifiers and the words of strings; docstrings and comments left out."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    words: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            words.add(node.name)
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:
            words.add(node.arg)
        elif isinstance(node, ast.alias):
            words.update(re.findall(r"\w+", node.asname or node.name))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            words.update(re.findall(r"\w+", node.value))
    return words


@functools.cache
def index() -> Index:
    files: set[str] = set()
    by_basename: dict[str, list[str]] = {}
    classes: dict[str, list[ClassInfo]] = {}
    modules: dict[str, list[ModuleInfo]] = {}
    defined: set[str] = set()
    words: set[str] = set()
    strings: set[str] = set()
    tops = [ROOT / t for t in _TOP] + [p for p in ROOT.iterdir() if p.is_file()]
    for top in tops:
        for path in _walk(top) if top.is_dir() else [top]:
            relative = path.relative_to(ROOT).as_posix() + ("/" if path.is_dir() else "")
            files.add(relative)
            by_basename.setdefault(path.name, []).append(relative)
            if relative.startswith("ops/") and path.suffix in (".yml", ".yaml", ".json"):
                words.update(re.findall(r"\w+", path.read_text()))
            if path.suffix == ".pyx":
                text = path.read_text()
                words.update(re.findall(r"\w+", text))
                names = _pyx_names(text)
                defined.update(names)
                modules.setdefault(path.stem, []).append(ModuleInfo(path, names))
            if path.suffix != ".py":
                continue
            if path == Path(__file__).resolve():
                continue  # this page's own examples of bad names
            tree = ast.parse(path.read_text())
            words.update(_code_words(tree))
            words.add(path.stem)
            strings.update(
                n.value
                for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and len(n.value) < 80
            )
            module = ModuleInfo(path, _top_level_names(tree))
            stem = path.parent.name if path.stem == "__init__" else path.stem
            if path.stem == "__init__":
                module.names.update(
                    p.stem if p.is_file() else p.name
                    for p in path.parent.iterdir()
                    if p.suffix in (".py", ".pyx") or (p / "__init__.py").exists()
                )
            modules.setdefault(stem, []).append(module)
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    info = _class_info(node, path)
                    classes.setdefault(node.name, []).append(info)
                    defined.update(info.members)
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    defined.add(node.name)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    defined.add(node.id)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                    defined.add(node.attr)
                elif isinstance(node, ast.arg | ast.keyword) and node.arg:
                    defined.add(node.arg)
                elif isinstance(node, ast.alias):
                    defined.add(node.asname or node.name.split(".")[0])
    return Index(files, by_basename, classes, modules, defined, words, strings)


# -- resolving one name ----------------------------------------------------------------------


def _dotted_module(path: Path) -> str | None:
    relative = path.relative_to(ROOT)
    if relative.parts[0] != "rda":
        return None
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _class_has(name: str, member: str, seen: set[str] | None = None) -> bool:
    seen = set() if seen is None else seen
    if name in seen:
        return False
    seen.add(name)
    for info in index().classes.get(name, []):
        if member in info.members:
            return True
        if any(_class_has(base, member, seen) for base in info.bases):
            return True
        dotted = _dotted_module(info.path)
        if dotted is not None:
            try:
                cls = getattr(importlib.import_module(dotted), name)
            except (ImportError, AttributeError):
                continue
            if hasattr(cls, member):
                return True
    return False


def _walk_members(first_class: str, rest: list[str]) -> bool:
    """``Class.a.b``: ``a`` on the class; beyond a nested class the parts are not typed, so
    only their last is looked up among the defined names."""
    if not rest:
        return True
    if not _class_has(first_class, rest[0]):
        return False
    if len(rest) == 1:
        return True
    if rest[0] in index().classes:
        return _walk_members(rest[0], rest[1:])
    return rest[-1] in index().defined


def _resolve_imported(parts: list[str]) -> bool | None:
    """Import the longest module prefix and walk the rest; None when nothing imports."""
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for i, part in enumerate(parts[cut:], start=cut):
            if hasattr(obj, part):
                obj = getattr(obj, part)
                continue
            # An instance attribute, set in the class's methods: look in its source.
            if isinstance(obj, type):
                return _walk_members(obj.__name__, parts[i:])
            return False
        return True
    return None


def _resolve_in_source(parts: list[str]) -> bool:
    """``rda.x.y.Name`` read from the source (a module whose optional dependency is absent)."""
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if not path.exists():
                continue
            rest = parts[cut:]
            if not rest:
                return True
            stem = path.parent.name if path.stem == "__init__" else path.stem
            module = next(m for m in index().modules[stem] if m.path == path)
            if rest[0] not in module.names:
                return False
            return len(rest) == 1 or _walk_members(rest[0], rest[1:])
    return False


def resolve_dotted(name: str) -> bool:
    parts = name.split(".")
    ix = index()
    if name in ix.strings:
        return True  # a logger's name, a metadata key
    if parts[0] == "rda":
        imported = _resolve_imported(parts)
        return imported if imported is not None else _resolve_in_source(parts)
    if parts[0] in ix.classes:
        return _walk_members(parts[0], parts[1:])
    if parts[0] in ix.modules:
        for module in ix.modules[parts[0]]:
            if parts[1] not in module.names:
                continue
            if len(parts) == 2 or parts[1] not in ix.classes:
                return len(parts) == 2 or parts[-1] in ix.defined
            if _walk_members(parts[1], parts[2:]):
                return True
        # Also a variable's name (``transport.close``, ``client.history``): as below.
    if parts[0] not in ("self", "cls"):
        imported = _resolve_imported([_ALIASES.get(parts[0], parts[0]), *parts[1:]])
        if imported is not None:
            return imported
    return _resolve_variable(parts)


def _resolve_variable(parts: list[str]) -> bool:
    """``sub.close``, ``request.complete``: a name bound somewhere, an attribute defined
    somewhere; a class named on the way must exist and have the next part."""
    ix = index()
    if parts[0].lstrip("_")[0].isupper() or parts[0] not in ix.defined:
        return False  # a class by its name, and no class has it; or bound nowhere
    for i, part in enumerate(parts[1:], start=1):
        if part.lstrip("_")[:1].isupper() and part not in ix.classes and part not in ix.defined:
            return False
        if part in ix.classes:
            return _walk_members(part, parts[i + 1 :])
    return parts[-1] in ix.defined


def resolve_path(token: str, context: list[str]) -> str | None:
    """The repository-relative path a doc's path names, or None."""
    ix = index()
    folder = token.endswith("/")
    bare = token.rstrip("/")
    bases = ["", "rda/"]
    for earlier in context:
        parent = earlier.rstrip("/").rsplit("/", 1)[0] if "/" in earlier.rstrip("/") else ""
        while True:
            candidate = parent + "/" if parent else ""
            if candidate not in bases:
                bases.append(candidate)
            if not parent:
                break
            parent = parent.rsplit("/", 1)[0] if "/" in parent else ""
    for base in bases:
        if "*" in bare:
            hits = glob.glob(str(ROOT / (base + bare)))
            if hits:
                return base + bare
            continue
        for candidate in (base + bare + "/",) if folder else (base + bare, base + bare + "/"):
            if candidate in ix.files:
                return candidate
    if "/" not in bare:
        found = [p for p in ix.by_basename.get(bare, []) if p.endswith("/") == folder]
        if len(found) == 1:
            return found[0]
    return None


# -- reading a page --------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    line: int
    span: str
    why: str

    def __str__(self) -> str:
        return f"line {self.line}: `{self.span}` {self.why}"


def _is_path(span: str) -> bool:
    if any(c in span for c in " :<>{}()|,;=@\"'") or span.startswith(("/", "~", ".", "$", "-")):
        return False
    if "/" in span:
        if not re.fullmatch(r"[\w./*-]+", span) or span.split("/")[0].isupper():
            return False  # a device name (PS1/Acquisition), a placeholder (DIR/...)
        first = span.split("/")[0]
        return (
            span.endswith("/")
            or bool(re.search(r"\.\w+$", span))
            or first in _TOP
            or (ROOT / "rda" / first).is_dir()
        )
    return span.endswith(_FILE_SUFFIXES) and bool(re.fullmatch(r"[\w.-]+", span))


def _checked_identifier(name: str) -> bool:
    if name.startswith("_"):
        return True
    if name[0].isupper() and any(c.islower() for c in name):
        return name not in vars(builtins)
    return "_" in name and any(c.islower() for c in name)


class _Checker:
    def __init__(self, own: set[str]) -> None:
        self.problems: list[Problem] = []
        self.context: list[str] = []
        self.own = own  # files and names the page defines in its own code blocks
        self.metrics = False  # a metric name was seen in this paragraph
        self.checked: list[str] = []  # what was looked up, for a reader of this test

    def path(self, line: int, token: str) -> None:
        if token in ALLOWED or token in self.own:
            return
        self.checked.append(token)
        found = resolve_path(token, self.context)
        if found is None:
            self.problems.append(Problem(line, token, "names no file or folder"))
        else:
            self.context.insert(0, found)

    def span(self, line: int, span: str) -> None:
        span = " ".join(span.split())
        if span in ALLOWED:
            return
        if _is_path(span):
            self.path(line, span)
            return
        match = _NAME.match(span)
        if match is None:
            return
        name, rest = match.group(), span[match.end() :]
        first = name.split(".")[0]
        if first in _SHELL_WORDS and (rest.startswith(" ") or rest == "") and "." not in name:
            return
        if rest and not (rest[0] in "([" or rest.startswith((" = ", "=", " -> "))):
            return
        if rest.startswith("=") and "." not in name:
            return  # a setting written as name=value
        if name.startswith("rda_") or (self.metrics and name.startswith("_")):
            self.metrics = True  # metric names, and suffixes written after one: not code
            return
        if name in self.own:
            return
        if "." in name:
            if name.rsplit(".", 1)[-1] in _FILE_EXTENSIONS or name.replace(".", "").isupper():
                return  # a file name; a selector (CPS.USER.ALL)
            self.checked.append(name)
            if name not in ALLOWED and not resolve_dotted(name):
                self.problems.append(Problem(line, span, f"({name}) resolves to nothing"))
            return
        if not _checked_identifier(name) or name in ALLOWED:
            return
        self.checked.append(name)
        if name not in index().words:
            self.problems.append(Problem(line, span, f"({name}) occurs nowhere in the source"))

    def tree(self, first_line: int, lines: list[str]) -> None:
        """The layout tree: ``rda/admin/`` at the margin, its entries indented by two, their
        descriptions further; names in a description belong to the entry's folder."""
        top = ""
        entry_dir = ""
        for offset, text in enumerate(lines):
            line = first_line + offset
            stripped = text.lstrip(" ")
            indent = len(text) - len(stripped)
            if not stripped:
                continue
            words = re.findall(r"[\w./*-]+", stripped)
            if indent == 0:
                head = stripped.split()[0]
                found = resolve_path(head, [])
                if found is None:
                    self.problems.append(Problem(line, head, "(layout tree) names no folder"))
                    top = entry_dir = ""
                    continue
                top = entry_dir = found
                words = words[1:]
            elif indent == 2:
                entries = re.match(r"((?:[\w.-]+/?(?:, )?)+)", stripped)
                heads = entries.group(1).split(", ") if entries else []
                entry_dir = top
                for head in heads:
                    found = resolve_path(top + head, [])
                    if found is None:
                        self.problems.append(Problem(line, head, f"(layout tree) not in {top}"))
                    elif found.endswith("/"):
                        entry_dir = found
                words = re.findall(
                    r"[\w./*-]+", stripped[len(entries.group(1)) if entries else 0 :]
                )
            for word in words:
                word = word.rstrip(".,")
                if word.startswith("rda.") and _NAME.fullmatch(word):
                    if word.rsplit(".", 1)[-1] not in _FILE_EXTENSIONS and not resolve_dotted(word):
                        self.problems.append(
                            Problem(line, word, "(layout tree) resolves to nothing")
                        )
                elif (
                    re.fullmatch(r"[\w-]+(?:/[\w.-]+)*(?:\.pyx?|/)", word)
                    and resolve_path(word, [entry_dir + "x", top + "x"]) is None
                ):
                    self.problems.append(
                        Problem(line, word, f"(layout tree) not in {entry_dir} or {top}")
                    )

    def fenced(self, first_line: int, lines: list[str]) -> None:
        for offset, text in enumerate(lines):
            for token in _REPO_PATH.findall(text):
                token = token.rstrip(".")
                if resolve_path(token, []) is None:
                    self.problems.append(Problem(first_line + offset, token, "names no file"))


def layout_tree(markdown: str) -> list[str]:
    """The lines of the layout tree (the fenced block that opens with ``rda/``)."""
    blocks: list[str] = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, re.S | re.M)
    for block in blocks:
        if block.startswith("rda/"):
            return block.splitlines()
    return []


def _own_names(markdown: str) -> set[str]:
    """Files a page's code blocks are saved as (``title="client.py"``) and the classes and
    functions its Python blocks define: the page's own, not the repository's."""
    own = set(re.findall(r'^```\w*\s+title="([^"]+)"', markdown, re.M))
    for block in re.findall(r"^```python[^\n]*\n(.*?)^```", markdown, re.S | re.M):
        own.update(re.findall(r"^\s*(?:class|def|async def)\s+(\w+)", block, re.M))
    return own


def check(markdown: str, *, tree: bool = False) -> list[Problem]:
    """Every problem of one page; ``tree``: the page holds the layout tree."""
    checker = _Checker(_own_names(markdown))
    lines = markdown.splitlines()
    i = 0
    paragraph: list[str] = []
    paragraph_start = 0

    def flush() -> None:
        text = "\n".join(paragraph)
        for match in _SPAN.finditer(text):
            line = paragraph_start + text.count("\n", 0, match.start()) + 1
            checker.span(line, match.group(2).strip())
        paragraph.clear()
        checker.metrics = False

    while i < len(lines):
        text = lines[i]
        fence = _FENCE.match(text)
        if fence:
            flush()
            end = i + 1
            while end < len(lines) and not lines[end].lstrip().startswith(fence.group(1)):
                end += 1
            block = lines[i + 1 : end]
            if tree and block and block[0].startswith("rda/"):
                checker.tree(i + 2, block)
            else:
                checker.fenced(i + 2, block)
            i = end + 1
            paragraph_start = i
            continue
        if _HEADING.match(text):
            flush()
            checker.context.clear()
            paragraph_start = i + 1
        elif not text.strip():
            flush()
            paragraph_start = i + 1
        else:
            if not paragraph:
                paragraph_start = i
            paragraph.append(text)
        i += 1
    flush()
    return checker.problems


def missing_from_tree(markdown: str) -> list[str]:
    """Modules of the ``rda`` package the layout tree does not name."""
    words = set(re.findall(r"[\w.-]+\.pyx?", "\n".join(layout_tree(markdown))))
    missing = []
    for path in sorted((ROOT / "rda").rglob("*.py*")):
        if path.suffix not in (".py", ".pyx") or path.name == "__init__.py":
            continue
        if any(part in _SKIP_DIRS for part in path.parts):
            continue
        if path.name not in words:
            missing.append(path.relative_to(ROOT).as_posix())
    return missing


# -- the tests -------------------------------------------------------------------------------

PAGES = sorted(p.name for p in DOCS.glob("*.md") if p.name not in SKIPPED_PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_every_name_in_the_page_resolves(page: str) -> None:
    problems = check((DOCS / page).read_text(), tree=page == "architecture.md")
    assert not problems, f"docs/{page}:\n" + "\n".join(map(str, problems))


def test_the_layout_tree_names_every_module() -> None:
    missing = missing_from_tree((DOCS / "architecture.md").read_text())
    assert not missing, "docs/architecture.md's layout tree omits " + ", ".join(missing)


def test_the_checker_tells_a_good_name_from_a_bad_one() -> None:
    page = (
        "# A page\n\n"
        "`transport/state.py` holds `HeartbeatTracker` and `state.next_state`;\n"
        "`rda.ClientService.close` is public, `Server._start` and `Server._no_such` are not.\n\n"
        "```\nrda/transport/no_such.py\n```\n"
    )
    problems = check(page)
    assert [p.span for p in problems] == ["Server._no_such", "rda/transport/no_such.py"]
    assert [p.line for p in problems] == [4, 7]


def test_the_recipe_before_issue_32_fails() -> None:
    """The "new value type" recipe named tables of ``binary.py`` that had moved to
    ``_binary_format.py`` under other names: the check finds them, and passes the fix."""
    before = (
        "2. `serialization/binary.py`: `_SCALAR_STRUCTS` and the tag-indexed `_SCALAR_TYPES`,\n"
        "   `_ARRAY_TYPES`, `_ARRAY_DTYPES`, `_encode_into`, `_read_data` / `_read_other`\n"
    )
    # _SCALAR_TYPES passes: a plain identifier is looked up anywhere in the source (the
    # recorder's readback has one), as far as a lenient check of a bare name goes.
    assert [p.span for p in check(before)] == ["_SCALAR_STRUCTS", "_ARRAY_TYPES", "_ARRAY_DTYPES"]
    after = (
        "2. `serialization/_binary_format.py`: `SCALAR_STRUCTS` and the tag-indexed\n"
        "   `SCALAR_TYPES`, `_binary_encoder.py` `_encode_into`, `_binary_decoder._read_data`\n"
    )
    assert check(after) == []


def test_paths_resolve_by_folder_context_or_uniqueness() -> None:
    assert check("`business/server/runtime.py` then `builder.py`, `relay.py`, `ops/`") == []
    # Two files are called replies.py: a bare one needs a path before it in the section.
    assert [p.span for p in check("`replies.py`")] == ["replies.py"]
    assert check("`business/client/access.py`, then `replies.py`") == []
    assert [p.span for p in check("# A\n`business/client/access.py`\n# B\n`replies.py`")] == [
        "replies.py"
    ]


def test_the_layout_tree_is_read_by_its_indentation() -> None:
    tree = "```\nrda/business/           the layer\n  server/               runtime.py (Server), nope.py\n```\n"
    assert [p.span for p in check(tree, tree=True)] == ["nope.py"]


# -- the source's own prose ------------------------------------------------------------------
#
# Docstrings and comments cite no file outside the repository (STYLE and seed documents, the
# first design: a reader of the code cannot open them) and carry no microsecond figures (a
# measurement is dated and belongs in docs/performance.md, which the comment cites by heading).

_OUTSIDE = re.compile(r"STYLE\.md|DESIGN\.md|\bseeds?[ /]0\d\d|\bseeds/|first design", re.I)
_MICROSECONDS = re.compile(r"\d(?:\.\d+)?(?:\s*-\s*\d+(?:\.\d+)?)?\s*(?:us|µs|μs|microseconds?)\b")
_EXAMPLE = re.compile(r"``.*?``")

#: A microsecond figure that is not a measurement, with the reason.
NOT_MEASUREMENTS = {
    "rda/business/histogram.py": "the lowest latency bucket's bound, a chosen value",
    "rda/admin/format.py": "examples of its own output",
}

#: Files whose prose fixes are pending (none now: the rewrites of issue 32 applied them all).
#: Remove an entry once it is fixed: the test fails on an entry that no longer finds anything.
PENDING: dict[str, set[str]] = {}


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every docstring and comment of a Python file; a Cython file whole."""
    text = path.read_text()
    if path.suffix == ".pyx":
        yield from enumerate(text.splitlines(), start=1)
        return
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0].lineno
                yield from enumerate(doc.splitlines(), start=first)
    for number, line in enumerate(text.splitlines(), start=1):
        code, hash_, comment = line.partition("#")
        if hash_ and code.count('"') % 2 == 0 and code.count("'") % 2 == 0:
            yield number, comment


def prose_problems(path: Path) -> list[tuple[str, int, str]]:
    """(kind, line, text): ``outside`` for a citation of a file not in the repository,
    ``figure`` for a microsecond figure."""
    found = []
    relative = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    for number, line in prose(path):
        if _OUTSIDE.search(line):
            found.append(("outside", number, line.strip()))
        if relative not in NOT_MEASUREMENTS and _MICROSECONDS.search(_EXAMPLE.sub("", line)):
            found.append(("figure", number, line.strip()))
    return found


def _sources() -> list[Path]:
    return sorted(
        p
        for p in (ROOT / "rda").rglob("*")
        if p.suffix in (".py", ".pyx") and not (_SKIP_DIRS & set(p.parts))
    )


def test_docstrings_and_comments_cite_only_the_repository_and_carry_no_figures() -> None:
    unexpected = []
    still_pending: dict[str, set[str]] = {}
    for path in _sources():
        relative = path.relative_to(ROOT).as_posix()
        for kind, number, line in prose_problems(path):
            if kind in PENDING.get(relative, set()):
                still_pending.setdefault(relative, set()).add(kind)
            else:
                unexpected.append(f"{relative}:{number}: {kind}: {line}")
    assert not unexpected, "\n".join(unexpected)
    fixed = {
        f"{path} {kind}"
        for path, kinds in PENDING.items()
        for kind in kinds - still_pending.get(path, set())
    }
    assert not fixed, f"fixed, remove from PENDING: {sorted(fixed)}"


def test_the_prose_check_finds_a_citation_and_a_figure(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""A module (STYLE.md 12).\n\n``420 µs`` is an example of output."""\n'
        "x = 1  # 2.3 us of a request's path\n"
        'y = "# not a comment: 5 us"\n'
    )
    found = [(kind, line) for kind, line, _ in prose_problems(sample)]
    assert found == [("outside", 1), ("figure", 4)]
