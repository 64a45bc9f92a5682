"""Count `Any` in the public signatures of vkmulti.

Public callables: every name tests/public_api.json lists that is a function, and
for every class it lists: `__init__` (or a NamedTuple's fields), `__call__`, the
public methods (classmethods and staticmethods too) and the properties
(their getter's return), over the class and its vkmulti bases; each function
is counted once however many modules or subclasses export it.

For each parameter (`self`/`cls` aside) and each return, the annotation is read
as written (the package's modules use `from __future__ import annotations`, so
it is the source text) and parsed:

  bare       the annotation is `Any` itself
  nested     it contains `Any` somewhere else (`list[Any]`, `Any | None`, ...),
             or a generic without its parameters (`dict`, `list`, `Callable`),
             which means the same
  missing    no annotation at all (a return of `__init__` is not required)
  justified  Any on purpose: matched by a rule in JUSTIFIED below, which gives
             the reason (counted here instead of under bare/nested)

Run from the repository root, with vkmulti importable:

    python tools/count_any.py            # totals, then each remaining Any
    python tools/count_any.py --json     # the totals as JSON
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import pathlib
import re
import sys
from typing import Any, ForwardRef, Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
API_FILE = ROOT / "tests" / "public_api.json"

#: (pattern over "module.qualname:parameter" (":return" for the return), why Any is right there).
JUSTIFIED: list[tuple[str, str]] = [
    (r"\.(to_dict|as_dict|describe|gpu_links):return$|\.from_dict:d$|\.NodeAgent\.render:return$|"
     r"\.CrossDeviceTransfer\.ensure_staging:return$|\.NodeInfo\.__init__:topology$|"
     r"\.StencilRun\.__init__:(nodes|restarts)$",
     "a JSON-ready dict of mixed values (what json.loads gives back; what the cluster's agents send)"),
    (r"\.CrossDeviceTransfer\.run(_staging_copy|_host_shared|_dmabuf)?:options$|"
     r"\.InterGpuTransfer\.(copy_buffer|broadcast|gather|gather_to_device):kw$|"
     r"\.ClusterManager\.connect:options$|\.MultiGpuCoordinator\.probe_topology:options$|"
     r"\.KernelSpec\.from_file:fields$",
     "**kwargs handed on unchanged to a typed callable (submit(), the blocking form, ClusterManager(), "
     "probe_topology(), KernelSpec())"),
    (r"\.LaunchOptions\.(__init__:scheduler_config|with_scheduler:config)$",
     "the seed's scheduler configuration: an opaque value kept for the caller, never read"),
    (r"\.CrossDeviceTransfer\.__init__:extra$",
     "the seed's free-form extras (the caller's own keys beside vkmulti's 'staging')"),
    (r"\.KernelRuntime\.settle_injected:(taken|returned)$",
     "the K2K router's own tokens for its messages, handed back to it untouched (OutboxFeed.settle)"),
]

#: Generics that mean their Any-parameterised form when written bare.
_GENERICS = {"dict", "list", "tuple", "set", "frozenset", "type", "deque", "Callable", "Iterable", "Iterator",
             "Sequence", "Mapping", "MutableMapping", "Generator", "Awaitable", "Coroutine"}


def _justification(where: str) -> str | None:
    for pattern, why in JUSTIFIED:
        if re.search(pattern, where):
            return why
    return None


@dataclasses.dataclass
class Slot:
    """One parameter or return of a public callable."""

    where: str          # module.qualname:name
    annotation: str     # as written ('' when missing)
    kind: str           # bare, nested, missing, justified, typed


@dataclasses.dataclass
class Totals:
    callables: int = 0
    parameters: int = 0
    returns: int = 0
    bare: int = 0
    nested: int = 0
    missing: int = 0
    justified: int = 0

    @property
    def slots(self) -> int:
        return self.parameters + self.returns


def _text(annotation: object) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    if isinstance(annotation, str):
        return annotation
    if annotation is Any:
        return "Any"
    if isinstance(annotation, ForwardRef):
        return annotation.__forward_arg__
    return inspect.formatannotation(annotation)


def _any_kind(text: str) -> str:
    """bare, nested or typed (text is an annotation's source)."""
    if not text:
        return "missing"
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return "typed"
    def is_any(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "Any") or \
            (isinstance(node, ast.Attribute) and node.attr == "Any")
    if is_any(tree) or (isinstance(tree, ast.Constant) and tree.value == "Any"):
        return "bare"
    subscripted = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Subscript)}
    for node in ast.walk(tree):
        if is_any(node):
            return "nested"
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name in _GENERICS and id(node) not in subscripted:
            return "nested"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _any_kind(node.value) in ("bare", "nested"):
            return "nested"   # a quoted forward reference inside the annotation
    return "typed"


def _public_objects() -> Iterator[tuple[str, object]]:
    api = json.loads(API_FILE.read_text())
    for module in sorted(api):
        mod = importlib.import_module(module)
        for name in sorted(api[module]):
            yield f"{module}.{name}", getattr(mod, name)


def _own(func: object) -> bool:
    return getattr(func, "__module__", "") is not None and str(getattr(func, "__module__", "")).startswith("vkmulti")


def _class_callables(cls: type) -> Iterator[tuple[str, Any, bool, type]]:
    """(name, function, is_property, defining class) of the public callables of `cls` and its vkmulti bases."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("vkmulti"):
            continue
        for name, raw in sorted(vars(klass).items()):
            if name in seen:
                continue
            if name.startswith("_") and name not in ("__init__", "__call__"):
                continue
            func = raw.fget if isinstance(raw, property) else getattr(raw, "__func__", getattr(raw, "func", raw))
            if name == "__init__" and not _own(func):
                continue   # a Protocol's placeholder __init__ (typing's)
            seen.add(name)
            if isinstance(raw, property):
                if raw.fget is not None:
                    yield name, raw.fget, True, klass
            elif isinstance(raw, (classmethod, staticmethod)):
                yield name, raw.__func__, False, klass
            elif inspect.isfunction(raw):
                yield name, raw, False, klass
            elif hasattr(raw, "func") and type(raw).__name__ == "cached_property":
                yield name, raw.func, True, klass


def _slots_of(func: Any, owner: str, is_property: bool, skip_first: bool) -> Iterator[Slot]:
    try:
        sig = inspect.signature(func, eval_str=False)
    except (TypeError, ValueError):
        return
    # Ray's tracing adds this keyword to actor classes' methods once Ray runs in the process
    params = [p for p in sig.parameters.values() if p.name != "_ray_trace_ctx"]
    if skip_first and params:
        params = params[1:]
    where = f"{owner}"
    if not is_property:
        for p in params:
            text = _text(p.annotation)
            yield Slot(f"{where}:{p.name}", text, _any_kind(text))
    text = _text(sig.return_annotation)
    kind = _any_kind(text)
    if kind == "missing" and func.__name__ == "__init__":
        return
    yield Slot(f"{where}:return", text, kind)


def collect() -> tuple[Totals, list[Slot]]:
    """The totals and every slot counted, in a stable order."""
    totals = Totals()
    slots: list[Slot] = []
    done: set[str] = set()
    for _public, obj in _public_objects():
        if inspect.isclass(obj):
            if not obj.__module__.startswith("vkmulti"):
                continue
            funcs = list(_class_callables(obj))
            if issubclass(obj, tuple) and hasattr(obj, "_fields") and all(f[0] != "__init__" for f in funcs):
                key = f"{obj.__module__}.{obj.__qualname__}.__new__"
                if key not in done:
                    done.add(key)
                    totals.callables += 1
                    hints = getattr(obj, "__annotations__", {})
                    for field in obj._fields:
                        text = _text(hints.get(field, inspect.Parameter.empty))
                        slots.append(Slot(f"{key}:{field}", text, _any_kind(text)))
            for name, func, is_prop, klass in funcs:
                key = f"{klass.__module__}.{klass.__qualname__}.{name}"
                if key in done:
                    continue
                done.add(key)
                if is_prop and not hasattr(func, "__code__"):
                    # a property made by a factory (operator.attrgetter): its type is the class's annotation
                    text = _text(vars(klass).get("__annotations__", {}).get(name, inspect.Parameter.empty))
                    totals.callables += 1
                    slots.append(Slot(f"{key}:return", text, _any_kind(text)))
                    continue
                static = isinstance(inspect.getattr_static(obj, name), staticmethod)
                new = list(_slots_of(func, key, is_prop, skip_first=not static))
                totals.callables += 1
                slots += new
        elif callable(obj) and _own(obj) and (inspect.isfunction(obj) or inspect.isbuiltin(obj)):
            key = f"{obj.__module__}.{obj.__qualname__}"
            if key in done:
                continue
            done.add(key)
            totals.callables += 1
            slots += list(_slots_of(obj, key, False, skip_first=False))
    for s in slots:
        if s.where.endswith(":return"):
            totals.returns += 1
        else:
            totals.parameters += 1
        if s.kind in ("bare", "nested") and _justification(s.where):
            s.kind = "justified"
        if s.kind != "typed":
            setattr(totals, s.kind, getattr(totals, s.kind) + 1)
    slots.sort(key=lambda s: s.where)
    return totals, slots


def main(argv: list[str]) -> int:
    totals, slots = collect()
    figures = dataclasses.asdict(totals) | {"slots": totals.slots}
    if "--json" in argv:
        print(json.dumps(figures, indent=1, sort_keys=True))
        return 0
    print(f"{totals.callables} public callables, {totals.parameters} parameters, {totals.returns} returns")
    print(f"bare Any: {totals.bare}   contains Any: {totals.nested}   unannotated: {totals.missing}   "
          f"Any on purpose: {totals.justified}")
    for s in slots:
        if s.kind in ("bare", "nested", "missing"):
            print(f"  {s.kind:8} {s.where}  {s.annotation}")
    for s in slots:
        if s.kind == "justified":
            print(f"  justified {s.where}  {s.annotation}  ({_justification(s.where)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
