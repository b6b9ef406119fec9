"""The client's parts talk through public methods (issue 32): no module of
``rda/business/client/`` reads or calls another object's ``_private`` member.

Checked over the syntax tree: every ``x._name`` attribute (dunders aside) must be on ``self``
or ``cls``. A private module imported by name (``from rda.serialization.data import Data``)
is an import, not an attribute, and is tests/test_layout.py's business.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rda.business.client

CLIENT = Path(rda.business.client.__file__).parent


def foreign_privates(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_check_sees_a_foreign_private() -> None:
    assert foreign_privates("def f(service):\n    service._lock.acquire()\n") == [
        "2: service._lock"
    ]
    assert foreign_privates("class A:\n    def f(self):\n        self._x = 1\n") == []


def test_no_client_module_touches_another_objects_privates() -> None:
    offences = {
        path.name: found
        for path in sorted(CLIENT.glob("*.py"))
        if (found := foreign_privates(path.read_text()))
    }
    assert offences == {}
