"""Error messages stay bounded, and stay the intended error, whatever a caller passes.

Each public entry point is called with its good arguments, one position at a time
replaced by a hostile value (hostile_values.py: a 1 MB str, a list of a million ints,
an object whose __repr__ raises, one whose __repr__ returns 1 MB, a dict with a 1 MB
key, ints of 5000 digits). In a callable's place (a custom selector, an sru_id or
cost function) the callable answers the hostile value; the public records are built
with each hostile field in turn. The call may do its job; if it raises, the error
must be a typed one (ValueError, TypeError, IndexError, KeyError or a VkmError) with
a message of at most 2000 characters, and neither the __repr__'s own error nor the
int's refusal may have replaced it or be in its chain. Here the host-side entry
points and records; test_error_bounds_gpu.py has those on the virtual GPU pair.

Also here: short_repr and short_str themselves, and the wrong types and huge
numbers that got AttributeError or OverflowError instead of a typed error.
"""
from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest

import vkmulti
import vkmulti.kernels
from vkmulti import (Backend, Checkpoint, CheckpointBuilder, CheckpointMetadata, ChunkHeader, ChunkType, DataChunk,
                     DeviceInfo, FileStorage, GpuConnection, GpuTopology, HlcTimestamp, HotReloadConfig,
                     HotReloadManager, InterconnectType, K2KMessage, KernelCodeFormat, KernelCodeSource,
                     KernelMigrationPlan, LaunchOptions, MemoryStorage, MigrationRequest, MultiGpuBuilder,
                     MultiGpuConfig, MultiGpuCoordinator, QueueFamilies, ReferenceRenderer, ReferenceSRU,
                     SRUOffloadCoordinator, TimelinePoint, assign_srus, assign_srus_array, select_transfer_method)
from vkmulti._core.checks import short_repr, short_str, short_text
from vkmulti.cluster import split_rows_weighted
from vkmulti.kernels import DevicePath, KernelSpec, format_topology

import test_fuzz_host
from hostile_values import HOSTILE, MB, MESSAGE_LIMIT, TYPED, Answer, ReprError, ReprRaises, check_positions


# -- what the cases share ---------------------------------------------------------------------------

SPIRV = test_fuzz_host.SPIRV
coordinator = test_fuzz_host.coordinator


def _checkpoint() -> Checkpoint:
    return CheckpointBuilder("k", "t").device_memory("m", b"abcd").build()


def _topology() -> GpuTopology:
    t = GpuTopology(2)
    t.set_connection(GpuConnection(0, 1, InterconnectType.PCIE))
    return t


def _hot_reload() -> HotReloadManager:
    m = HotReloadManager()
    m.register_kernel("r", SPIRV)
    return m


def _file_storage(path: Any) -> FileStorage:
    return FileStorage(path)


# -- short_repr itself ------------------------------------------------------------------------------


class _NotStr:
    def __repr__(self) -> Any:
        return 7


class _StrRepr(str):
    def __repr__(self) -> str:
        return "s" * MB


@pytest.mark.parametrize("value", [*HOSTILE.values(), _NotStr(), _StrRepr("a"), b"b" * MB, bytearray(MB),
                                   {i: str(i) for i in range(10 ** 5)}, set(range(10 ** 5)), frozenset(range(10 ** 5)),
                                   tuple(range(10 ** 5)), [ReprRaises()], {"a": ReprRaises()}, [[[[[[[[[[[[]]]]]]]]]]]],
                                   -(10 ** 5000)], ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("limit", [60, 200, 2000])
def test_short_repr_is_bounded_and_never_raises(value, limit):
    text = short_repr(value, limit)
    assert isinstance(text, str) and 0 < len(text) <= limit


def test_short_repr_shows_values_as_repr_does():
    loop: list[Any] = [1]
    loop.append(loop)
    for v in ["abc", 'q"\'', b"\x00", bytearray(b"ab"), 12, -3, 10 ** 50, 1.5, None, True, [1, "a", (2,)], (), (1,),
              {"a": [1, {2}]}, set(), {3}, frozenset(), frozenset({4}), loop, np.int64(5), LaunchOptions(),
              vkmulti.KernelId("k")]:
        assert short_repr(v, 200) == repr(v)
    assert short_repr("x" * 100) == repr("x" * 100)[:57] + "..."
    assert short_repr(list(range(100))) == repr(list(range(100)))[:57] + "..."
    assert short_repr({"k" * 100: 1}) == repr({"k" * 100: 1})[:57] + "..."
    assert "ReprRaises" in short_repr(ReprRaises()) and "ReprError" in short_repr(ReprRaises(), 200)
    assert short_repr(10 ** 5000) == "<int of 16610 bits>"


def test_short_str_is_bounded_and_never_raises():
    class StrRaises:
        def __str__(self) -> str:
            raise ReprError("__str__ of a caller's object raised")

    assert short_str("x" * MB) == "x" * 197 + "..." and short_str(ValueError("boom")) == "boom"
    assert short_str(StrRaises(), 80).startswith("<StrRaises object") and len(short_str(ReprRaises())) <= 200
    assert len(short_str(ValueError("e" * MB), 2000)) == 2000


def test_short_text_quotes_a_name_within_its_limit():
    assert short_text("llvmpipe") == "'llvmpipe'" and short_text("x" * 100) == repr("x" * 37 + "...")
    assert short_text(7) == "'7'"
    for value in ("\U000e0000\x00" * MB, "\n" * MB, 10 ** 5000, ReprRaises()):
        assert len(short_text(value)) <= 42 and len(short_text(value, 24)) <= 26 and "\n" not in short_text(value)


def test_a_record_holding_a_callers_object_keeps_a_short_repr():
    """compact_repr (the public records' repr) shows a field through short_repr: a
    field whose repr raises or runs to 1 MB leaves the record's repr short."""
    for field in (ReprRaises(), HOSTILE["repr-1MB"], HOSTILE["list-1M"]):
        text = repr(vkmulti.CudaDevice(0, field, "n"))
        assert len(text) < 200 and text.startswith("CudaDevice(ordinal=0, uuid=")


# -- wrong types and huge numbers ---------------------------------------------------------------------

#: Calls that raised AttributeError or OverflowError (or allocated the number it was given)
#: where a wrong type or a number out of range should get a TypeError or ValueError.
TYPED_CASES: dict[str, tuple[Callable[[], Any], type[Exception]]] = {
    "Checkpoint.delta_from(base=1)": (lambda: Checkpoint.delta_from(1, _checkpoint()), TypeError),
    "Checkpoint.applied_with_delta(delta='x')": (lambda: Checkpoint.applied_with_delta(_checkpoint(), "x"), TypeError),
    "Checkpoint.get_device_memory(5)": (lambda: _checkpoint().get_device_memory(5), TypeError),
    "format_topology(3)": (lambda: format_topology(3), TypeError),
    "pair_methods(0, 1)": (lambda: vkmulti.pair_methods(0, 1), TypeError),
    "KernelCodeSource(hash=10**5000)": (lambda: KernelCodeSource(KernelCodeFormat.SPIRV, SPIRV.code, hash=10 ** 5000),
                                        TypeError),
    "KernelCodeSource(hash=2**40)": (lambda: KernelCodeSource(KernelCodeFormat.SPIRV, SPIRV.code, hash=1 << 40),
                                     TypeError),   # (bytes(2**40): a TiB allocated to compare with the digest)
    "assign_srus(cost=10**400)": (lambda: assign_srus([ReferenceSRU(1, 8, 8)], 2, cost=lambda s: 10 ** 400), ValueError),
    "assign_srus(weights=[10**400, 1])": (lambda: assign_srus([ReferenceSRU(1, 8, 8)], 2, weights=[10 ** 400, 1]),
                                          ValueError),
    "ReferenceSRU(color_a=10**400)": (lambda: ReferenceSRU(1, 8, 8, color_a=(10 ** 400, 0, 0)), TypeError),
    "GpuTopology.transfer_seconds(nbytes=10**400)": (lambda: _topology().transfer_seconds(0, 1, 10 ** 400), ValueError),
    "split_rows_weighted(10**400)": (lambda: split_rows_weighted(10 ** 400, [1.0]), ValueError),
}


@pytest.mark.parametrize("name", sorted(TYPED_CASES))
def test_wrong_types_and_huge_numbers_get_typed_errors(name):
    call, error = TYPED_CASES[name]
    with pytest.raises(error):
        call()


def test_wrong_types_and_huge_numbers_get_typed_errors_on_devices(manager):
    """The same on the virtual pair: a renderer's target, a compositor's scale, an SRU
    coordinator's weights and damping, a runtime's apply_code and run."""
    slot = manager.slot(0)
    renderer, compositor = ReferenceRenderer(slot), None
    rt = vkmulti.kernels.KernelRuntime(MultiGpuCoordinator.from_manager(manager), manager)
    try:
        with pytest.raises(TypeError):
            renderer.make_target(3)
        with pytest.raises(TypeError):
            compositor = vkmulti.Compositor(slot, content_scale=(10 ** 400, 1.0))
        for kw in (dict(weights=[10 ** 400, 1.0]), dict(adaptive_damping=10 ** 400)):
            with pytest.raises(TypeError):
                SRUOffloadCoordinator(manager, **kw)
        spec = vkmulti.kernels.counter_kernel(max_sources=4)
        k = rt.launch(spec, "c", device=0)
        for bad in (3, "nobody"):
            with pytest.raises((TypeError, vkmulti.KernelNotFoundError)):
                rt.apply_code(bad, KernelCodeSource.from_spirv(spec.spirv))
        with pytest.raises(TypeError):
            rt.apply_code(k, 3)
        with pytest.raises(ValueError):
            rt.run(1 << 64, k)
    finally:
        rt.destroy()
        renderer.destroy()
        if compositor is not None:
            compositor.destroy()


# -- the host-side entry points (no GPU) ------------------------------------------------------------

#: Cases whose good call is itself refused (a lookup of what is not there): the hostile values
#: must get a bounded typed error too.
REFUSED = {"FileStorage.name", "MemoryStorage.name", "HotReloadManager.rollback"}

#: name -> (make the object or None, the call on it, its good arguments); a position whose good
#: argument is an Answer takes a callable answering the hostile value.
HOST_CASES: dict[str, tuple[Callable[[], Any] | None, Callable[..., Any], tuple[Any, ...]]] = {
    **test_fuzz_host.CASES,
    "coordinator.custom_selector": (coordinator, lambda c, a: (c.set_custom_selector(a), c.select_device()),
                                    (Answer(0),)),
    "coordinator.request_migration": (coordinator, lambda c, k, d: (c.assign_kernel("m", 0),
                                                                    c.request_migration(k, d)), ("m", 1)),
    "coordinator.complete_migration": (coordinator, lambda c, r: (c.assign_kernel("m", 0), c.complete_migration(r)),
                                       (MigrationRequest("m", 0, 1, [0, 1], 1.0, 1.0),)),
    "coordinator.set_topology": (coordinator, lambda c, t: c.set_topology(t), (_topology(),)),
    "coordinator.listeners": (coordinator, lambda c, f: (c.add_listener(f), c.remove_listener(f)), (print,)),
    "coordinator.assign_twice": (coordinator, lambda c, k: (c.assign_kernel(k, 0), c.assign_kernel(k, 1)), ("d",)),
    "MultiGpuCoordinator": (None, lambda cfg: MultiGpuCoordinator(cfg), (MultiGpuConfig(),)),
    "GpuTopology": (None, lambda n: GpuTopology(n), (2,)),
    "GpuTopology.queries": (_topology, lambda t, s, d: (t.get_connection(s, d), t.best_path(s, d), t.hop_count(s, d),
                                                        t.transfer_seconds(s, d, 64)), (0, 1)),
    "GpuTopology.device": (_topology, lambda t, d, n: (t.neighbors(d), t.numa_neighbors(d), t.set_numa_node(d, n)),
                           (1, 0)),
    "GpuTopology.path_figures": (_topology, lambda t, p: t.path_figures(p), ([0, 1],)),
    "GpuTopology.set_connection": (_topology, lambda t, c: t.set_connection(c),
                                   (GpuConnection(1, 0, InterconnectType.PCIE),)),
    "GpuTopology.transfer_seconds": (_topology, lambda t, n: t.transfer_seconds(0, 1, n), (64,)),
    "GpuTopology.from_dict": (None, lambda d: GpuTopology.from_dict(d), (_topology().to_dict(),)),
    "format_topology": (None, lambda t, n: format_topology(t, n), (_topology(), ["a", "b"])),
    "DevicePath": (None, lambda d: DevicePath(d), ([0, 1],)),
    "LaunchOptions.more": (LaunchOptions, lambda o, m, i, out, k, c, b: o.with_mode(m).with_input_queue_capacity(i)
                           .with_output_queue_capacity(out).with_k2k(k).with_cooperative(c)
                           .single_block(b), (vkmulti.KernelMode.PERSISTENT, 8, 8, True, False, 64)),
    "MultiGpuBuilder.flags": (MultiGpuBuilder, lambda b, a, p, s: b.auto_select_device(a).enable_p2p(p).strict(s)
                              .build(), (True, True, False)),
    "HotReloadConfig.flags": (HotReloadConfig, lambda c, e, p, v, k: c.with_enabled(e).with_preserve_state(p)
                              .with_validate_before_swap(v).with_keep_fallback(k), (True, True, True, True)),
    "HotReloadManager.unregister": (_hot_reload, lambda m, k: m.unregister_kernel(k), ("r",)),
    "HotReloadManager.rollback": (_hot_reload, lambda m, k, n: (m.request_reload("r", SPIRV.with_version(2)),
                                                                m.rollback(k, n)), ("r", 1)),
    "HotReloadManager.with_rule_backend": (None, lambda c, b: HotReloadManager.with_rule_backend(c, b),
                                           (HotReloadConfig(), print)),
    "KernelCodeSource.from_spirv": (None, lambda d, e: KernelCodeSource.from_spirv(d, e), (SPIRV.code, "main")),
    "KernelCodeSource.text": (None, lambda src, e: (KernelCodeSource.from_wgsl(src, e), KernelCodeSource.from_msl(src, e),
                                                    KernelCodeSource.from_ptx(src, e)), ("fn main() {}", "main")),
    "KernelCodeSource.from_spirv_file": (None, lambda p, e: KernelCodeSource.from_spirv_file(p, e),
                                         (str(Path(vkmulti.__file__).parent / "shaders" / "kernel_counter.comp.spv"),
                                          "main")),
    "Checkpoint.from_bytes": (None, lambda d: Checkpoint.from_bytes(d), (_checkpoint().to_bytes(),)),
    "Checkpoint.new": (None, lambda m: Checkpoint.new(m), (CheckpointMetadata("k", "t"),)),
    "Checkpoint.add": (_checkpoint, lambda c, n, d, ch: (c.add_device_memory(n, d), c.add_chunk(ch)),
                       ("n", b"ab", DataChunk(ChunkHeader(ChunkType.CUSTOM.value), b"x"))),
    "Checkpoint.get": (_checkpoint, lambda c, t, i, n: (c.get_chunk(t), c.get_chunks(t), c.get_custom(i),
                                                        c.get_device_memory(n)), (ChunkType.DEVICE_MEMORY, 0, "m")),
    "Checkpoint.delta": (_checkpoint, lambda c, new: Checkpoint.applied_with_delta(c, Checkpoint.delta_from(c, new)),
                         (_checkpoint(),)),
    "Checkpoint.write_to": (_checkpoint, lambda c, w: c.write_to(w), (len,)),
    "CheckpointBuilder.more": (None, lambda k, t, ck, cv, h, ts: CheckpointBuilder(k, t).custom(ck, cv).hlc(h)
                               .tile_size(*ts).control_block(b"c").build(),
                               ("k", "t", "key", "value", HlcTimestamp(1, 0), (1, 1, 1))),
    "MemoryStorage.name": (MemoryStorage, lambda m, n: (m.exists(n), m.load(n)), ("absent",)),
    "FileStorage": (None, lambda p: FileStorage(p).list(), ("/nonexistent-vkmulti-dir",)),
    "FileStorage.name": (lambda: _file_storage("/tmp"), lambda f, n: (f.checkpoint_path(n), f.exists(n), f.load(n)),
                         ("absent-vkmulti",)),
    "KernelSpec": (None, lambda t, s, st, i, o, g, e: KernelSpec(t, s, st, i, o, g, e),
                   ("plain", SPIRV.code, (256,), 8, 8, (1, 1, 1), "main")),
    "counter_kernel": (None, lambda m, i, o: vkmulti.kernels.counter_kernel(max_sources=m, inbox_capacity=i,
                                                                            outbox_capacity=o), (4, 8, 8)),
    "pingpong_kernel": (None, lambda i, o: vkmulti.kernels.pingpong_kernel(inbox_capacity=i, outbox_capacity=o),
                        (8, 8)),
    "stencil_kernel": (None, lambda w, h, p: vkmulti.kernels.stencil_kernel(w, h, p), (16, 8, 256)),
    "assign_srus": (None, lambda s, n, w, p, h: assign_srus(s, n, weights=w, previous=p, hysteresis=h),
                    ([ReferenceSRU(1, 8, 8), ReferenceSRU(2, 8, 8)], 2, [1.0, 1.0], {1: 0}, 0.0)),
    "assign_srus.callables": (None, lambda i, c, t, o: assign_srus([ReferenceSRU(1, 8, 8)], 2, sru_id=i, cost=c,
                                                                   transfer_cost=t, offloadable=o),
                              (Answer(1), Answer(1.0), Answer(0.0), Answer(True))),
    "assign_srus.ids": (None, lambda a, b: assign_srus([SimpleNamespace(sru_id=a), SimpleNamespace(sru_id=b)], 2),
                        (1, 2)),
    "assign_srus_array.more": (None, lambda i, t, p, pr, lc: assign_srus_array([1.0, 2.0], 2, ids=i, transfer=t,
                                                                               pinned=p, previous=pr, link_costs=lc),
                               ([1, 2], [0.0, 0.0], [-1, -1], [0, 1], None)),
    "select_transfer_method": (None, lambda a, c, d: select_transfer_method(SimpleNamespace(device_index=a), c,
                                                                            dst_index=d), (1, None, 0)),
    "QueueFamilies": (None, lambda g, p, c, t: QueueFamilies(g, p, c, t), (0, 0, None, None)),
    "TimelinePoint": (None, lambda s, v, d: TimelinePoint(s, v, d), (1, 0, 0)),
    "HybridLogicalClock": (None, lambda c: vkmulti.kernels.HybridLogicalClock(c).tick(), (Answer(1000),)),
}


@pytest.mark.parametrize("name", sorted(HOST_CASES))
def test_host_cases_take_their_good_arguments(name):
    """Each case's good call works, so each hostile value is what its call trips on."""
    make, fn, good = HOST_CASES[name]
    call = lambda: fn(*good) if make is None else fn(make(), *good)   # noqa: E731
    if name in REFUSED:
        with pytest.raises(TYPED):
            call()
    else:
        call()


@pytest.mark.parametrize("name,pos", [(n, p) for n in sorted(HOST_CASES) for p in range(len(HOST_CASES[n][2]))])
def test_host_entry_points_keep_errors_bounded(name, pos):
    make, fn, good = HOST_CASES[name]
    check_positions(name, good, pos, lambda args: fn(*args) if make is None else fn(make(), *args))


# -- constructing the public records -----------------------------------------------------------------

_META = CheckpointMetadata("k", "t")
#: class name -> keyword arguments for its required fields (the optional ones keep their defaults).
RECORDS: dict[str, dict[str, Any]] = {
    "QueueFamilies": dict(graphics=0, present=0),
    "SRUAssignment": dict(sru_id=1, device_index=0),
    "TimelinePoint": dict(semaphore=1, value=0, device_index=0),
    "CudaDevice": dict(ordinal=0, uuid="u", name="n"),
    "OffloadRoute": dict(sru_id=1, device_index=0, transfer="none"),
    "ReferenceSRU": dict(sru_id=1, width=8, height=8),
    "LaunchOptions": {},
    "MultiGpuConfig": {},
    "CoordinatorEvent": dict(kind=vkmulti.CoordinatorEventKind.DEVICE_REGISTERED, device_index=0),
    "DeviceInfo": dict(index=0, name="GPU 0", backend=Backend.VULKAN),
    "DeviceStatus": dict(info=DeviceInfo(0, "GPU 0", Backend.VULKAN), kernel_count=0),
    "MultiGpuStats": {},
    "DeviceUnregisterResult": dict(device_index=0),
    "KernelMigrationPlan": dict(kernel_id="k", source_device=0, target_device=1),
    "MigrationRequest": dict(kernel_id="k", source_device=0, target_device=1, path=[0, 1], estimated_bandwidth_gbps=1.0,
                             estimated_latency_us=1.0),
    "GpuConnection": dict(source=0, destination=1, interconnect=InterconnectType.PCIE),
    "KernelSpec": dict(kernel_type="plain", spirv=SPIRV.code),
    "K2KMessage": dict(source_kernel="a", dest_kernel="b"),
    "MessageEnvelope": dict(source_address=1, dest_address=2, sequence=0, timestamp=HlcTimestamp(1), payload_len=0),
    "HlcTimestamp": dict(physical_us=1),
    "CrossGpuRouterStatsSnapshot": {},
    "PendingK2KMessage": dict(source_kernel="a", dest_kernel="b", message=K2KMessage("a", "b")),
    "RoutingDecision": dict(kind=vkmulti.RoutingKind.SAME_DEVICE),
    "Checkpoint": dict(metadata=_META),
    "CheckpointHeader": {},
    "CheckpointMetadata": {},
    "ChunkHeader": dict(chunk_type=ChunkType.CUSTOM.value),
    "DataChunk": dict(header=ChunkHeader(ChunkType.CUSTOM.value)),
    "CheckpointPolicy": {},
    "KernelCodeSource": dict(format=KernelCodeFormat.SPIRV, code=SPIRV.code),
    "HotReloadConfig": {},
    "HotReloadRequest": dict(kernel_id="k", new_code=SPIRV),
    "HotReloadStatsSnapshot": {},
    "MigrationStatsSnapshot": {},
    "PlanOutcome": dict(plan=KernelMigrationPlan("k", 0, 1)),
    "FailoverStats": {},
    "Recovery": dict(device=0, what="w", seconds=1.0),
    "CrossDeviceTransfer@kernels": dict(source_device=0, dest_device=1, size=64),
    "KernelStats": {},
}


def _record_class(name: str) -> type:
    return getattr(vkmulti.kernels, name.split("@")[0]) if "@" in name or not hasattr(vkmulti, name) \
        else getattr(vkmulti, name)


def test_every_public_record_that_validates_is_covered():
    """Each public data class with a __post_init__ (it checks its fields) is in RECORDS,
    apart from those built around live devices (checked through their entry points)."""
    covered = {_record_class(n) for n in RECORDS}
    live = {vkmulti.CrossDeviceTransfer, vkmulti.DeviceSlot, vkmulti.LogicalDevice}
    for mod in (vkmulti, vkmulti.kernels):
        for name in mod.__all__:
            cls = getattr(mod, name)
            if inspect.isclass(cls) and dataclasses.is_dataclass(cls) and hasattr(cls, "__post_init__"):
                assert cls in covered or cls in live, f"{mod.__name__}.{name} is not in RECORDS"


@pytest.mark.parametrize("name,field", [(n, f.name) for n in sorted(RECORDS)
                                        for f in dataclasses.fields(_record_class(n)) if f.init])
def test_public_records_keep_errors_bounded(name, field):
    cls = _record_class(name)
    check_positions(f"{name}({field}=...)", (RECORDS[name].get(field),), 0,
                    lambda args: cls(**{**RECORDS[name], field: args[0]}))


# -- caller text the library keeps and names again later ---------------------------------------------


def test_kernel_message_errors_show_a_few_problems_cut_short():
    """KernelMessageError names the sender and what went wrong with its messages;
    with a long id and many long problems its message stays short (all are kept)."""
    problems = [f"problem {i}: " + "p" * MB for i in range(1000)]
    exc = vkmulti.KernelMessageError("k" * MB, problems)
    assert len(str(exc)) <= MESSAGE_LIMIT and "and 997 more" in str(exc)
    assert exc.problems == problems and exc.kernel_id == "k" * MB
    assert str(vkmulti.KernelMessageError("a", ["x", "y"])) == "kernel 'a': x; y"
