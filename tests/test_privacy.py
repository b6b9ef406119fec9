"""No object reaches into another's private members, anywhere in ``rda/`` (issue 32).

Read over the AST: an attribute starting with one underscore may be read or called only on
``self`` or ``cls`` (``super()`` included); on a class by name inside that class's own body;
on another instance of the enclosing class when that class itself defines the member (``other._values``
in ``Data.__eq__``: the same class's representation); or on ``sys`` (``sys._getframe``,
CPython's documented API). Everything else is an offence, except the few listed in ``KNOWN``,
each with its reason. On the tree before issue 32 (566c0d8) the check finds 62 accesses, 49
of them outside what ``KNOWN`` allows: the client's mixins, the server's dispatch, the
in-memory network's plumbing, the etcd watch calling its gateway's ``_order``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The binary and text codecs are Data's wire form: they read its two dicts straight (a method
# call per Data on the hot path buys nothing, they live in the same package). The server's
# zero-copy hand-over counts references to the arrays in a reply's Data, which any accessor
# would change by holding one of its own.
KNOWN = {
    ("rda/serialization/_binary_encoder.py", "data._values"),
    ("rda/serialization/_binary_encoder.py", "data._types"),
    ("rda/serialization/_binary_decoder.py", "data._values"),
    ("rda/serialization/_binary_decoder.py", "data._types"),
    ("rda/serialization/_text.py", "data._values"),
    ("rda/serialization/_text.py", "data._types"),
    ("rda/business/server/replies.py", "data._values"),
    ("rda/business/server/replies.py", "data._types"),
    # The same hand-over asks what a get's handler passed complete() (requests.completed_with,
    # beside the class): a method would add to what a handler can call (docs/server.md).
    ("rda/business/server/requests.py", "request._argument"),
}


def _own_members(cls: ast.ClassDef) -> set[str]:
    """The private names a class defines: methods, class attributes, ``__slots__``, and what
    its methods assign on ``self``."""
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # __slots__ entries
    return {n for n in names if n.startswith("_")}


def foreign_privates(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every access to another object's private member."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, classes: tuple[ast.ClassDef, ...]) -> None:
        if isinstance(node, ast.ClassDef):
            classes = (*classes, node)
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            owner = node.value
            names = {c.name for c in classes}
            allowed = (
                isinstance(owner, ast.Name)
                and (owner.id in ("self", "cls", "sys") or owner.id in names)
            ) or (
                isinstance(owner, ast.Call)
                and isinstance(owner.func, ast.Name)
                and owner.func.id == "super"
            )
            if not allowed and classes and node.attr in _own_members(classes[-1]):
                allowed = True  # another instance of the same class
            if not allowed:
                found.append((node.lineno, ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, classes)

    visit(ast.parse(source), ())
    return found


def test_no_object_reaches_into_another_objects_privates() -> None:
    offences = []
    for path in sorted((ROOT / "rda").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for line, text in foreign_privates(path.read_text(encoding="utf-8")):
            if (relative, text) not in KNOWN:
                offences.append(f"{relative}:{line}: {text}")
    assert offences == []


def test_every_known_exception_still_exists() -> None:
    seen = set()
    for relative, text in KNOWN:
        source = (ROOT / relative).read_text(encoding="utf-8")
        if any(found == text for _, found in foreign_privates(source)):
            seen.add((relative, text))
    assert seen == KNOWN, f"no longer needed: {sorted(KNOWN - seen)}"


def test_the_check_tells_own_from_foreign() -> None:
    source = """
class Box:
    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items = []

    def same(self, other: "Box") -> bool:
        return self._items == other._items  # the same class: allowed


class Shelf:
    def peek(self, box: Box) -> list[int]:
        return box._items  # another class's private: an offence


def helper(shelf: Shelf) -> None:
    shelf._secret()  # an offence
    super()._ok()  # super(): allowed
"""
    assert foreign_privates(source) == [(14, "box._items"), (18, "shelf._secret")]
