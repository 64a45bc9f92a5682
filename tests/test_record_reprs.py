"""The public records keep a one-line repr under 200 characters, whatever their fields hold.

Each public data class, named tuple and small record type of vkmulti, vkmulti.kernels
and the layer packages is built with each field in turn holding a hostile value of
the field's own type (by its annotation): a 1 MB str, a str of escapes and line
breaks, an int of 5000 digits (Python refuses its str()), 1 MB of bytes, a list of a
million items, an object whose repr is 1 MB or has a line break. A value the
constructor refuses with a typed error makes no record and is passed over; a record
that is made must have a repr of one line under 200 characters, which never raises.
"""
from __future__ import annotations

import dataclasses
import enum
import inspect
from typing import Any

import pytest

import vkmulti
import vkmulti.cluster
import vkmulti.device
import vkmulti.kernels
import vkmulti.memory
import vkmulti.offload
import vkmulti.transfer
from vkmulti import DeviceInfo, KernelMigrationPlan, PlanOutcome, QueueFamilies, TimelinePoint
from vkmulti.kernels import DevicePath, KernelId

from hostile_values import MB, TYPED, ReprHuge
from repr_watch import check_repr
from test_error_bounds import RECORDS

#: The packages whose `__all__` names the public records.
PACKAGES = (vkmulti, vkmulti.kernels, vkmulti.cluster, vkmulti.device, vkmulti.memory, vkmulti.transfer,
            vkmulti.offload)


class _MultiLine:
    def __repr__(self) -> str:
        return "first line\nsecond line"


#: Hostile values by the type a field is annotated with.
HOSTILE_BY_TYPE: dict[str, list[Any]] = {
    "str": ["x" * MB, "\U000e0000\x00\n" * (MB // 3), "\n" * MB],
    "int": [10 ** 5000, -10 ** 5000],
    "bytes": [b"\0" * MB],
    "list": [list(range(MB)), ["s" * MB], [10 ** 5000] * 3],
    "tuple": [tuple(range(MB)), ("s" * MB,)],
    "dict": [{i: i for i in range(MB // 10)}, {"k" * MB: "v" * MB}, {"k": _MultiLine()}],
    "frozenset": [frozenset(range(MB // 10)), frozenset({"s" * MB})],
    "object": [ReprHuge(), _MultiLine(), "x" * MB, list(range(MB))],
}

#: Records that do not check their fields (no __post_init__): the required fields of each,
#: by class name (the classes RECORDS of test_error_bounds.py has are taken from there).
MORE_RECORDS: dict[str, dict[str, Any]] = {
    "DeviceStatus": dict(info=DeviceInfo(0, "GPU 0", vkmulti.Backend.VULKAN), kernel_count=0),
    "FrameReport": dict(routes=[], rendered_on={}, fallbacks=[], done=TimelinePoint(1, 1, 0), transferred_bytes=0),
    "SruEntry": dict(sru_id=1, device_index=0, width=1, height=1),
    "HotReloadResult": dict(kernel_id=KernelId("k"), old_version=1, new_version=2, state_preserved=True,
                            checkpoint_size=0, drain_duration=0.0, checkpoint_duration=0.0, compile_duration=0.0,
                            swap_duration=0.0, restore_duration=0.0, total_duration=0.0, devices=[0], attempts=1),
    "MigrationResult": dict(kernel_id=KernelId("k"), source_device=0, target_device=1, checkpoint_size=0,
                            checkpoint_duration=0.0, transfer_duration=0.0, restore_duration=0.0, total_duration=0.0),
    "DeviceRequirements": dict(device="d", extensions=("e",), features=("f",), queue_families=QueueFamilies(0, 0),
                               feature_structs={}, uses={}),
    "Connection": dict(address="a", started_local=False, joined=False),
    "RayAddress": dict(kind="k", host=None, port=None),
    "LinkInfo": dict(source="a", destination="b", bandwidth=1.0, latency=1.0),
    "NodeInfo": dict(node_id="n", address="a", hostname="h", devices=("d",), gpu_throughput=(1.0,)),
    "NodeFrameReport": dict(node_id="n", srus=[1], gpu={1: 0}),
    "MethodProblem": dict(reason="r", extension="e", device="d"),
    "Gathered": dict(buffer=None, offsets={0: 0}, sizes={0: 4}),
}

def _record_classes() -> dict[str, type]:
    """Every public data class and named tuple of PACKAGES, by name (kernels' twin of a
    vkmulti name as name@kernels)."""
    out: dict[str, type] = {}
    for mod in PACKAGES:
        for name in mod.__all__:
            cls = getattr(mod, name)
            if not inspect.isclass(cls) or issubclass(cls, (BaseException, enum.Enum)):
                continue
            if dataclasses.is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, "_fields")):
                key = name if out.get(name, cls) is cls else f"{name}@{mod.__name__.rsplit('.', 1)[-1]}"
                out[key] = cls
    return out


CLASSES = _record_classes()
ALL_RECORDS = {**RECORDS, **MORE_RECORDS}
#: Public records not built here, and why.
NOT_BUILT = {
    "DeviceCapabilities": "read from a device (its name through short_text: test_short_text_*)",
    "RenderCapabilities": "read from the devices",
    "LogicalDevice": "made with a VkDevice (test_api_surface builds it)",
    "DeviceSlot": "made with a VkDevice (test_api_surface builds it)",
    "CrossDeviceTransfer": "made between two live devices (test_api_surface builds it)",
    "ClusterFrame": "a frame of a cluster run (test_cluster)",
    "NodePlan": "a planner's output (test_cluster)",
    "StencilRun": "a cluster stencil run (test_cluster)",
}


def _fields(cls: type) -> list[tuple[str, str]]:
    """(name, annotation text) of each field a caller passes."""
    if dataclasses.is_dataclass(cls):
        return [(f.name, str(f.type)) for f in dataclasses.fields(cls) if f.init]
    hints = getattr(cls, "__annotations__", {})   # (a NamedTuple's are ForwardRefs under postponed annotations)
    return [(name, getattr(hints.get(name), "__forward_arg__", str(hints.get(name, "object"))))
            for name in cls._fields]   # type: ignore[attr-defined]


def _hostile(annotation: str) -> list[Any]:
    """Hostile values of the type `annotation` names (`X | None` as X; nothing for bools,
    floats, enums and other records, whose reprs are bounded)."""
    out: list[Any] = []
    for part in annotation.replace(" ", "").split("|"):
        base = part.split("[", 1)[0]
        if base in ("str", "KernelId", "SruId"):
            out += HOSTILE_BY_TYPE["str"] + ([10 ** 5000] if base == "SruId" else [])
        elif base in HOSTILE_BY_TYPE:
            out += HOSTILE_BY_TYPE[base]
        elif base in ("Any", "Iterable"):
            out += HOSTILE_BY_TYPE["object"]
    return out


def test_every_public_record_is_built_here():
    missing = sorted(set(CLASSES) - set(ALL_RECORDS) - set(NOT_BUILT))
    assert not missing, f"public records with no case here: {missing}"


def _build(cls: type, kwargs: dict[str, Any]) -> Any:
    try:
        return cls(**kwargs)
    except TYPED:
        return None


@pytest.mark.parametrize("name", sorted(set(ALL_RECORDS) & set(CLASSES)))
def test_public_records_keep_a_short_one_line_repr(name):
    cls = CLASSES[name]
    base = ALL_RECORDS[name]
    assert _build(cls, base) is not None, f"{name}'s good arguments are refused"
    failures = []
    for field, annotation in _fields(cls):
        for value in _hostile(annotation):
            obj = _build(cls, {**base, field: value})
            why = None if obj is None else check_repr(obj)
            if why:
                failures.append(f"{field}={type(value).__name__} of {len(value) if hasattr(value, '__len__') else '?'}: {why}")
    assert not failures, f"{name}:\n" + "\n".join(failures)


@pytest.mark.parametrize("make", [
    lambda: KernelId("k" * MB),
    lambda: KernelId("\U000e0000\n" * MB),
    lambda: DevicePath(range(MB)),
    lambda: PlanOutcome(KernelMigrationPlan("\U000e0000\n" * MB, 0, 1)),
], ids=["KernelId-1MB", "KernelId-escapes", "DevicePath-1M", "PlanOutcome-escapes"])
def test_small_public_types_keep_a_short_one_line_repr(make):
    assert check_repr(make()) is None


@pytest.mark.parametrize("name", ["x" * MB, "\U000e0000\x00" * MB, "GPU\n" * 50])
def test_device_records_keep_a_short_repr_whatever_the_device_is_named(manager, name):
    """A device's name (the driver's text, or a caller's in a record it builds) is shown
    through short_text: cut, and at most 42 characters however many escapes it needs."""
    slot = manager.slot(0)
    caps = dataclasses.replace(slot.capabilities, name=name)
    render = dataclasses.replace(manager.capabilities, devices=(caps,) * 5)
    assert check_repr(caps) is None and check_repr(render) is None
    old = slot.name
    slot.name = name
    try:
        assert check_repr(slot) is None
    finally:
        slot.name = old


def test_a_step_tickets_repr_stays_short_however_many_kernels_it_launched():
    """StepTicket listed every launched and deferred kernel id: 1000 kernels made a repr of
    thousands of characters."""
    from types import SimpleNamespace

    from vkmulti.kernels.runtime.stepping import StepTicket

    ks = [SimpleNamespace(id=f"kernel-{i:04d}") for i in range(1000)]
    ticket = StepTicket(None, {}, ks, [(k, "held") for k in ks], [])
    text = repr(ticket)
    assert len(text) < 200 and "\n" not in text and "kernel-0000" in text
