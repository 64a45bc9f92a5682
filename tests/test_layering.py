"""The package's layering, enforced (docs/explanation/architecture.md, "Rules").

Read with `ast` from src/vkmulti, every import counted: module level, inside
functions and under TYPE_CHECKING alike.

1. Imports point down the layer order, never up: errors < _core < device <
   memory < transfer < {offload, kernels} < cluster < the package face <
   apps; inside kernels: ids, messages < {checkpoint, coordinator} < engine <
   reload < lifecycle < runtime < k2k < the kernels face. Peers (offload and
   kernels; checkpoint and coordinator) do not import each other.
2. No import circles anywhere, inside a subpackage either.
3. No module imports another module's underscore names (`_core` is the
   private territory of the package: its modules may be imported, their
   underscore names may not).
4. No state created outside `__init__` through `__dict__`, no mixin classes.
5. No folder holds more than 15 modules; no module is longer than 600 lines.
6. Library code never imports vkmulti.testing (the apps' drills use its fault hook).
"""
from __future__ import annotations

import ast
import pathlib

import pytest

import vkmulti

SRC = pathlib.Path(vkmulti.__file__).resolve().parent
PKG = "vkmulti"

#: Rank of each top-level part of the package (module or subpackage); "" is the package face.
TOP = {"errors": 0, "_version": 0, "_core": 1, "device": 2, "memory": 3, "transfer": 4, "offload": 5,
       "kernels": 5, "cluster": 6, "testing": 7, "images": 8, "buffers": 8, "": 9, "apps": 10, "__main__": 11}
#: Rank of each part of vkmulti.kernels; "" is the kernels face.
KERNELS = {"ids": 0, "messages": 1, "checkpoint": 2, "coordinator": 2, "engine": 3, "reload": 4,
           "lifecycle": 5, "runtime": 6, "k2k": 7, "reference": 8, "stencil": 9, "": 10}
MAX_MODULES = 15
MAX_LINES = 600


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


MODULES = _modules()
KNOWN = set(MODULES) | {f"{PKG}._core._native"}


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[:-(level - 1)]
    return ".".join(base + ([name] if name else []))


def _imports() -> list[tuple[str, str, str, int]]:
    """(importing module, imported module, imported name or '', line) for every vkmulti import."""
    out = []
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(mod, is_pkg, node.level, node.module)
                if target != PKG and not target.startswith(PKG + "."):
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in KNOWN:
                        out.append((mod, sub, "", node.lineno))
                    else:
                        out.append((mod, target, alias.name, node.lineno))
            elif isinstance(node, ast.Import):
                out += [(mod, a.name, "", node.lineno) for a in node.names if a.name.startswith(PKG)]
    return out


IMPORTS = _imports()


def _rank(module: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(rank, group) of a module: modules of one group may import each other (circles aside)."""
    parts = module.split(".")[1:]
    top = parts[0] if parts else ""
    if top != "kernels":
        return (TOP[top],), (top,)
    sub = parts[1] if len(parts) > 1 else ""
    return (TOP[top], KERNELS[sub]), (top, sub)


def test_every_module_has_a_rank():
    unranked = [m for m in MODULES if m != PKG and _rank_or_none(m) is None]
    assert not unranked, f"modules outside the layer table (add them to TOP/KERNELS): {unranked}"


def _rank_or_none(module: str):
    try:
        return _rank(module)
    except KeyError:
        return None


def test_imports_point_down():
    up = []
    for mod, target, _name, line in IMPORTS:
        if target == mod or target not in KNOWN:
            continue
        (rm, gm), (rt, gt) = _rank(mod), _rank(target)
        if gm == gt:
            continue
        level = 0 if gm[0] != gt[0] else 1   # the first level where the two differ
        if rt[level] >= rm[level]:
            up.append(f"{mod}:{line} imports {target}")
    assert not up, "imports that run up (or sideways) the layering:\n" + "\n".join(up)


def test_no_import_circles():
    graph: dict[str, set[str]] = {m: set() for m in KNOWN}
    for mod, target, _name, _line in IMPORTS:
        if target in KNOWN and target != mod:
            graph[mod].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles = []

    def visit(v: str) -> None:   # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_no_private_names_across_modules():
    private = [f"{mod}:{line} imports {name} from {target}" for mod, target, name, line in IMPORTS
               if name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and target != mod]
    private += [f"{mod}:{line} imports the private module {target}" for mod, target, name, line in IMPORTS
                if not name and target.rsplit(".", 1)[-1].startswith("_") and target != mod
                and not target.startswith(f"{PKG}._core") and target != f"{PKG}._version"]
    assert not private, "underscore names imported from another module:\n" + "\n".join(private)


def test_library_never_imports_testing():
    users = [f"{mod}:{line}" for mod, target, name, line in IMPORTS
             if (target == f"{PKG}.testing" or (target == PKG and name == "testing"))
             and _rank(mod)[0][0] < TOP["testing"]]
    assert not users, f"library modules that import vkmulti.testing: {users}"


_NOT_MIXINS = {"Protocol", "Exception", "BaseException", "Enum", "IntEnum", "IntFlag", "NamedTuple", "ABC",
               "TypedDict", "ValueError", "TypeError", "RuntimeError"}


def _mixins() -> list[str]:
    """Classes written to be mixed into a host: no __init__ of their own, yet their methods use
    attributes of `self` that neither they nor their own bases make, and another class inherits them."""
    classes: dict[str, tuple[str, ast.ClassDef]] = {}
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, (mod, node))
    def base_names(node: ast.ClassDef) -> list[str]:
        return [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases]
    inherited = {b for _, node in classes.values() for b in base_names(node)}
    def made(node: ast.ClassDef, seen: set[str]) -> set[str]:
        names = set()
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(item.name)
            elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                if isinstance(item, ast.AnnAssign) and item.value is None:
                    continue   # an annotation alone declares a host's attribute, it makes nothing
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) \
                    and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                names.add(sub.attr)
        for b in base_names(node):
            if b in classes and b not in seen:
                names |= made(classes[b][1], seen | {b})
        return names
    out = []
    for name, (mod, node) in classes.items():
        if name not in inherited or set(base_names(node)) & _NOT_MIXINS or node.decorator_list:
            continue
        if any(isinstance(i, ast.FunctionDef) and i.name == "__init__" for i in node.body):
            continue
        used = {sub.attr for sub in ast.walk(node) if isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Name) and sub.value.id == "self"}
        foreign = sorted(used - made(node, {name}) - {"__class__", "__dict__"})
        if foreign:
            out.append(f"{mod}:{node.lineno} class {name} uses self.{', self.'.join(foreign[:4])} it never makes")
    return out


def test_no_state_outside_init_and_no_mixins():
    bad = []
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "__dict__" \
                    and isinstance(node.value, ast.Name) and node.value.id == "self":
                bad.append(f"{mod}:{node.lineno} self.__dict__")
    bad += _mixins()
    assert not bad, "state made outside __init__, or mixins:\n" + "\n".join(bad)


def test_folder_and_file_sizes():
    too_many = {}
    for folder in [SRC, *[p for p in SRC.rglob("*") if p.is_dir() and p.name != "__pycache__"]]:
        mods = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if len(mods) > MAX_MODULES:
            too_many[str(folder.relative_to(SRC))] = len(mods)
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not too_many, f"folders of more than {MAX_MODULES} modules: {too_many}"
    assert not long, f"modules longer than {MAX_LINES} lines (two concepts): {long}"
