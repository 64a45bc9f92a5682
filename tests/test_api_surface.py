"""The public surface: docstrings on every public name, one-line reprs, exports, errors.

(Every public object any test builds also has its repr checked by the watch in
repr_watch.py; this file builds the ones that matter on purpose, large and
destroyed ones included.)
"""
from __future__ import annotations

import asyncio
import enum
import inspect

import numpy as np
import pytest

import vkmulti
import vkmulti.cluster
import vkmulti.errors
import vkmulti.kernels
from repr_watch import check_repr, public_classes
from vkmulti.kernels.reference import counter_initial_state


def _missing_docstrings() -> list[str]:
    out = []
    for mod in (vkmulti, vkmulti.kernels, vkmulti.cluster):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and not (obj.__doc__ or "").strip():
                out.append(f"{mod.__name__}.{name}")
            if inspect.isclass(obj) and issubclass(obj, enum.Enum) and obj.__doc__ == enum.Enum.__doc__:
                out.append(f"{mod.__name__}.{name} (enum without its own docstring)")
    for cls in public_classes():
        for attr, val in vars(cls).items():
            if attr.startswith("_"):
                continue
            fn = val.fget if isinstance(val, property) else getattr(val, "__func__", val)
            if inspect.isfunction(fn) and not (fn.__doc__ or "").strip():
                out.append(f"{cls.__module__}.{cls.__name__}.{attr}")
    return sorted(set(out))


def test_every_public_name_has_a_docstring():
    """Public functions, classes, and the public methods and properties of public classes."""
    missing = _missing_docstrings()
    assert not missing, f"{len(missing)} public names without a docstring: {missing}"


def test_exports():
    assert vkmulti.Image is vkmulti.images.Image and vkmulti.Buffer is vkmulti.buffers.Buffer
    from vkmulti import InterGpuTransfer as old_path   # the name buffers.py held before
    from vkmulti import Buffer as old_buffer_path
    assert old_path is vkmulti.InterGpuTransfer and old_buffer_path is vkmulti.Buffer
    assert vkmulti.testing.install_virtual_gpus   # importable after a plain `import vkmulti`
    from vkmulti.offload import RendererMissingError
    assert RendererMissingError is vkmulti.errors.RendererMissingError
    for mod in (vkmulti, vkmulti.kernels, vkmulti.cluster):
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                assert obj.__module__ == "vkmulti.errors", f"{name} is defined in {obj.__module__}, not errors.py"
                assert issubclass(obj, vkmulti.VkmError)


def _reprs_ok(*objs):
    for obj in objs:
        why = check_repr(obj)
        assert why is None, why


def test_reprs_of_live_large_and_destroyed_objects(manager):
    s, d = manager.slot(1), manager.primary
    coord = vkmulti.MultiGpuCoordinator.from_manager(manager)
    _reprs_ok(manager, s, d, s.capabilities, manager.capabilities, s.graphics_queue, coord,
              coord.get_device_status(0), coord.stats(), coord.topology(), coord.device(0),
              vkmulti.device_requirements(s.physical_device), vkmulti.MultiGpuConfig(preferred_devices=list(range(99))),
              vkmulti.LaunchOptions(), vkmulti.ReferenceSRU(1, 64, 64))
    with vkmulti.Image(s, 64, 64) as a, vkmulti.Image(d, 64, 64) as b, vkmulti.Buffer(s, 1 << 20) as buf:
        x = vkmulti.CrossDeviceTransfer(s, d, vkmulti.select_transfer_method(s, d), width=64, height=64)
        t = x.submit(src_image=a, dst_image=b)
        _reprs_ok(a, b, buf, x, t, t.dst_ready)
        t.wait(30)
        x.destroy()
        _reprs_ok(x, t)
    _reprs_ok(a, b, buf)
    with vkmulti.InterGpuTransfer(manager) as ig:
        _reprs_ok(ig)
    _reprs_ok(ig)
    rt = vkmulti.KernelRuntime(coord)
    try:
        k = rt.launch(vkmulti.kernels.counter_kernel(), "k", state=[counter_initial_state()])
        msg = vkmulti.K2KMessage("host", "k", bytes(4096), tag=1)
        _reprs_ok(rt, k, k.spec, k.stats, msg, msg.envelope(1, 2), rt.step(k))
    finally:
        rt.destroy()
    _reprs_ok(rt, k)


def test_reprs_of_a_destroyed_manager_and_its_slots():
    mgr = vkmulti.MultiDeviceManager.create()
    slots = mgr.slots
    mgr.destroy()
    _reprs_ok(mgr, *slots)


def test_transfer_ticket_can_be_awaited(manager):
    s, d = manager.slot(1), manager.primary
    data = np.arange(1 << 16, dtype=np.uint8)

    async def go():
        with vkmulti.Buffer(s, data.nbytes) as a, vkmulti.Buffer(d, data.nbytes) as b, \
                vkmulti.CrossDeviceTransfer(s, d, vkmulti.select_transfer_method(s, d)) as x:
            a.upload(data)
            ticket = x.submit(src_buffer=a, dst_buffer=b)
            await asyncio.wait_for(ticket, 30)
            assert ticket.done()
            await ticket        # a finished ticket: at once
            return b.download()
    assert np.array_equal(asyncio.run(go()), data)


def test_error_messages_name_values_not_objects(manager):
    """A slot passed where an assignment belongs: the message names types, never a dump."""
    with pytest.raises(TypeError) as info:
        vkmulti.select_transfer_method(manager.slot(1), manager.capabilities)
    assert len(str(info.value)) < 200 and "0x" not in str(info.value)
    with pytest.raises(TypeError) as info:
        vkmulti.select_transfer_method(object(), None)
    assert "object" in str(info.value) and len(str(info.value)) < 200
