"""The layout is the architecture (docs/architecture.md, "Layers and sub-packages").

Computed from the source, not from what happens to be imported at run time:

* no import circle anywhere in the package: the graph of module-level imports (those under
  ``if TYPE_CHECKING:`` included, since a circle there is still a circle in the design;
  imports inside functions excluded, they are the deliberate way to load something late);
* layers import only downwards: ``rda`` -> ``admin``, ``pipeline`` -> ``business`` ->
  ``transport`` -> ``serialization``;
* inside a layer, the sub-packages keep their own direction: the client and the server never
  import each other and the modules they share import neither; the recorder reads neither the
  history nor the streams; the CLI is reached only from the facade;
* the web panel (``rda.panel``, extra ``[panel]``) and the gateways (``rda.gateway``, extra
  ``[pva]``) are reached only from ``rda._cli``.

No line cap: a module is as long as its one job needs (docs/architecture.md says why the
long ones are one job each).

``import_graph`` takes the root of a checkout so that the same check can be pointed at another
tree (how the circle check was shown to fail on the layout before this one).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def modules(root: Path) -> dict[str, Path]:
    """Every module of the ``rda`` package by dotted name."""
    found: dict[str, Path] = {}
    for folder, _dirs, files in os.walk(root / "rda"):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = Path(folder) / name
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Import statements run when the module is loaded (or seen by a type checker)."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import | ast.ImportFrom):
                out.append(node)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)

    visit(tree.body)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the rda modules it imports at module level.

    ``from rda.x import y`` is an edge to ``rda.x.y`` when ``y`` is a module and to ``rda.x``
    otherwise; the implicit import of parent packages is not an edge (every module has it).
    """
    mods = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets: set[str] = set()
        for node in _module_level_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names if alias.name in mods)
            elif node.module and node.module.split(".")[0] == "rda":
                subs = [f"{node.module}.{alias.name}" for alias in node.names]
                targets.update(s for s in subs if s in mods)
                if any(s not in mods for s in subs) and node.module in mods:
                    targets.add(node.module)
        targets.discard(name)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_circles_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]


def test_no_import_circle_anywhere() -> None:
    assert circles(import_graph(ROOT)) == []


# Who may import whom, by the longest matching prefix of the importing module. A module may
# always import inside its own group and its own sub-package.
ALLOWED: dict[str, set[str]] = {
    "rda.serialization": {"rda.serialization"},
    "rda.transport": {"rda.transport", "rda.serialization"},
    "rda.business": {"rda.business", "rda.transport", "rda.serialization"},
    "rda.admin": {"rda.admin", "rda.business", "rda.transport", "rda.serialization", "rda.demo"},
    "rda.pipeline": {
        "rda.pipeline",
        "rda.business",
        "rda.transport",
        "rda.serialization",
        "rda.admin",
    },
}
# Within a layer: prefixes a group must never import.
FORBIDDEN: dict[str, set[str]] = {
    "rda.business.client": {"rda.business.server"},
    "rda.business.server": {"rda.business.client"},
    # The shared business modules (everything in rda.business outside the two runtimes).
    "rda.business": {"rda.business.client", "rda.business.server"},
    "rda.pipeline.recorder": {"rda.pipeline.history", "rda.pipeline.stream"},
    "rda.pipeline.history": {"rda.pipeline.stream"},
    "rda.pipeline.stream": {"rda.pipeline.history"},
    "rda.admin": {"rda.admin.cli"},
    "rda.admin.cli": set(),
}


def _group(module: str, groups: dict[str, set[str]]) -> str | None:
    best = None
    for prefix in groups:
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best)
        ):
            best = prefix
    return best


def _within(target: str, prefixes: set[str]) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def _all_imports(path: Path) -> set[str]:
    """Every rda module named by an import anywhere in the file (function level included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "rda")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rda"):
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _rda_targets(path: Path, mods: dict[str, Path]) -> set[str]:
    """The rda modules (or packages) a file imports, anywhere in it."""
    return {t if t in mods else t.rsplit(".", 1)[0] for t in _all_imports(path)} & set(mods)


def test_layers_import_only_downwards() -> None:
    mods = modules(ROOT)
    bad: dict[str, list[str]] = {}
    for name, path in sorted(mods.items()):
        group = _group(name, ALLOWED)
        if group is not None:
            wrong = sorted(t for t in _rda_targets(path, mods) if not _within(t, ALLOWED[group]))
            if wrong:
                bad[name] = wrong
    assert not bad, f"modules importing upwards or through the facade: {bad}"


def test_sub_packages_keep_their_direction() -> None:
    mods = modules(ROOT)
    bad: dict[str, list[str]] = {}
    for name, path in sorted(mods.items()):
        group = _group(name, FORBIDDEN)
        if group is not None:
            wrong = sorted(t for t in _rda_targets(path, mods) if _within(t, FORBIDDEN[group]))
            if wrong:
                bad[name] = wrong
    assert not bad, f"modules importing a sibling sub-package they must not: {bad}"


@pytest.mark.parametrize("package", ["rda.panel", "rda.gateway"])
def test_only_the_console_script_reaches_the_extras_clients(package: str) -> None:
    mods = modules(ROOT)
    reaching = sorted(
        name
        for name, path in mods.items()
        if not _within(name, {package})
        and any(_within(t, {package}) for t in _rda_targets(path, mods))
    )
    assert reaching == ["rda._cli"]


def private_imports_across_packages(root: Path) -> list[str]:
    """``module -> _private module`` for every import (function-level included) of a private
    module (``_name``) from outside the package that holds it. A module used outside its
    package has a public name (or its package re-exports what others need)."""
    mods = modules(root)
    found = []
    for name, path in sorted(mods.items()):
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for target in sorted(_rda_targets(path, mods)):
            parts = target.split(".")
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:i])
                    if not _within(package, {owner}):
                        found.append(f"{name} -> {target}")
                    break
    return found


def test_private_modules_are_not_imported_across_packages() -> None:
    assert private_imports_across_packages(ROOT) == []


def test_the_private_import_check_finds_one(tmp_path: Path) -> None:
    (tmp_path / "rda" / "a").mkdir(parents=True)
    (tmp_path / "rda" / "b").mkdir()
    for package in ("rda", "rda/a", "rda/b"):
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "rda" / "a" / "_inner.py").write_text("X = 1\n")
    (tmp_path / "rda" / "a" / "friend.py").write_text("from rda.a._inner import X\n")
    (tmp_path / "rda" / "b" / "user.py").write_text("from rda.a._inner import X\n")
    assert private_imports_across_packages(tmp_path) == ["rda.b.user -> rda.a._inner"]
