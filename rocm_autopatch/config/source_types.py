"""The types a torch config module declares in its source, for releases whose config keeps
none at run time: torch before 2.6 stores only each key's default, so a key that defaults
to None (``cpp.simdlen``, ``cuda.arch``, ``trace.debug_dir`` on torch 2.4) has no type to
parse an ``INDUCTOR_*`` value by. Its source still says it: ``simdlen: Optional[int] =
None`` (torch/_inductor/config.py, release 2.4; the types were kept at run time from
pytorch/pytorch#139833, in 2.6). ``overrides.key_type`` asks here only then.

The annotations are read with ``ast``, never evaluated, and only the forms an environment
variable can carry are understood: ``int``, ``float``, ``bool``, ``str``, ``None``,
``Optional[...]``, ``Union[...]``, ``X | Y`` and ``Literal[...]`` of constants. Any other
annotation (a callable, a pass object) gives no type, and the key stays unsettable.
"""

from __future__ import annotations

import ast
import functools
import typing
from types import ModuleType
from typing import Any, Dict, List, Optional

_PLAIN = {"int": int, "float": float, "bool": bool, "str": str}
_MISSING = object()  # an annotation of a form not understood


def declared(module: ModuleType, key: str) -> Any:
    """The type ``module``'s source declares for ``key`` (dotted for a nested class's
    key), or None where it declares none this module understands."""
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return None
    try:
        return _annotations(path).get(key)
    except (OSError, SyntaxError, ValueError, RecursionError):
        return None


@functools.lru_cache(maxsize=4)
def _annotations(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read(), filename=path)
    found: Dict[str, Any] = {}
    _visit(tree.body, "", found, {})
    return found


def _visit(body: List[ast.stmt], prefix: str, found: Dict[str, Any],
           classes: Dict[str, Dict[str, Any]]) -> None:
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            kind = _kind(node.annotation)
            if kind is not _MISSING:
                found[prefix + node.target.id] = kind
        elif isinstance(node, ast.ClassDef):
            own: Dict[str, Any] = {}
            for base in node.bases:  # torch 2.13: ``class cuda(cutlass)`` inherits keys
                if isinstance(base, ast.Name) and base.id in classes:
                    own.update(classes[base.id])
            _visit(node.body, "", own, classes)
            classes[node.name] = own
            found.update({f"{prefix}{node.name}.{k}": v for k, v in own.items()})
        elif isinstance(node, (ast.If, ast.Try)):  # keys declared under a condition
            for part in (node.body, node.orelse):
                _visit(part, prefix, found, classes)


def _kind(node: ast.expr) -> Any:
    """The type an annotation names, or ``_MISSING``."""
    if isinstance(node, ast.Constant):
        if node.value is None:
            return type(None)
        if isinstance(node.value, str):  # a quoted annotation
            try:
                return _kind(ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                return _MISSING
        return _MISSING
    if isinstance(node, ast.Name):
        return _PLAIN.get(node.id, _MISSING)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([node.left, node.right])
    if isinstance(node, ast.Subscript):
        name = _name(node.value)
        items = _items(node.slice)
        if name == "Optional" and len(items) == 1:
            return _union([items[0], ast.Constant(value=None)])
        if name == "Union":
            return _union(items)
        if name == "Literal" and all(isinstance(i, ast.Constant) for i in items):
            return typing.Literal[tuple(i.value for i in items)]  # type: ignore[misc]
    return _MISSING


def _union(nodes: List[ast.expr]) -> Any:
    kinds = [_kind(n) for n in nodes]
    if any(k is _MISSING for k in kinds):
        return _MISSING
    return typing.Union[tuple(kinds)]  # type: ignore[valid-type]


def _name(node: ast.expr) -> Optional[str]:
    """``Optional`` for ``Optional`` and ``typing.Optional``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.attr if node.value.id in ("typing", "t") else None
    return None


def _items(node: ast.expr) -> List[ast.expr]:
    return list(node.elts) if isinstance(node, ast.Tuple) else [node]
