"""Engines that own their device: device_requirements(), primary_extensions/primary_features,
and examples/engine_device.py (an engine-style script) moving an image by every method."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import vulkan as vk

import vkmulti
from vkmulti import Instance, TransferMethod, UnsupportedError
from vkmulti import probe_device
from vkmulti.device.capabilities import EXT_MEMORY_FD, EXT_MEMORY_HOST
from vkmulti import supported_methods
from script_support import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "engine_device.py"


def _example():
    return load_script(SCRIPT, "engine_device")


@pytest.fixture
def engine_device():
    """(physical devices, a make(**overrides) that builds the engine's device and its
    manager keywords from device_requirements' answer alone); everything destroyed after."""
    inst = Instance()
    gpus = inst.physical_devices()
    made = []

    def make(**overrides):
        device, keywords, req = _example().create_engine_device(gpus[0], gpus[1:])
        made.append(device)
        keywords.update(overrides)
        return keywords, req
    try:
        yield gpus, make
    finally:
        for device in made:
            vk.vkDestroyDevice(device, None)
        inst.destroy()


def test_the_engine_script_moves_an_image_by_every_method_pixel_exact():
    """The script builds its own VkInstance and VkDevice with the `vulkan` package from
    device_requirements() alone; every method the pair supports, both ways, pixel-exact,
    under the validation layer."""
    env = dict(os.environ, VK_INSTANCE_LAYERS="VK_LAYER_KHRONOS_validation")
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Validation Error" not in run.stdout + run.stderr
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("GPU ")]
    with Instance(validation=False) as inst:
        a, b = (probe_device(p) for p in inst.physical_devices()[:2])
    expected = supported_methods(a, b)    # what two devices vkmulti made itself would get
    assert len(lines) == 2 * len(expected) and all(ln.endswith("identical") for ln in lines)
    assert {ln.split()[5] for ln in lines} == set(expected)


def test_the_engine_device_gets_every_method_a_vkmulti_device_gets(engine_device):
    gpus, make = engine_device
    keywords, req = make()
    with vkmulti.MultiDeviceManager(physical_devices=gpus, enabled=True, **keywords) as mgr:
        assert mgr.primary.enabled_extensions == frozenset(req.extensions)
        both = [vkmulti.pair_methods(mgr.slot(1), mgr.primary), vkmulti.pair_methods(mgr.primary, mgr.slot(1))]
        caps = mgr.capabilities.devices
        assert both[0] == supported_methods(caps[1], caps[0]) and both[1] == supported_methods(caps[0], caps[1])
        assert TransferMethod.HOST_SHARED in both[0]


def test_an_engine_that_does_not_say_what_it_enabled_gets_the_floor_and_one_line(engine_device, caplog,
                                                                                 monkeypatch):
    from vkmulti.transfer import methods
    monkeypatch.setattr(methods, "_reported", set())   # once per process: an earlier test may have said it
    gpus, make = engine_device
    keywords, _ = make(primary_extensions=None)
    with vkmulti.MultiDeviceManager(physical_devices=gpus, enabled=True, **keywords) as mgr:
        src, dst = mgr.slot(1), mgr.primary
        assert vkmulti.pair_methods(src, dst) == [TransferMethod.STAGING_COPY]
        with caplog.at_level(logging.WARNING, logger="vkmulti.transfer.methods"):
            assert vkmulti.select_transfer_method(src, dst) == TransferMethod.STAGING_COPY
            assert vkmulti.select_transfer_method(src, dst) == TransferMethod.STAGING_COPY   # said once
        lines = [r.getMessage() for r in caplog.records if r.name == "vkmulti.transfer.methods"]
        assert lines and len(lines) == len(set(lines))
        for line in lines:
            assert "\n" not in line and "device_requirements()" in line and "GPU 0" in line
        assert any(EXT_MEMORY_HOST in ln for ln in lines) and any(EXT_MEMORY_FD in ln for ln in lines)
        with pytest.raises(UnsupportedError, match="created without it") as info:
            vkmulti.CrossDeviceTransfer(src, dst, TransferMethod.HOST_SHARED)
        assert info.value.device_index == 0 and info.value.extension == EXT_MEMORY_HOST
        assert str(info.value).endswith("this pair supports ['staging_copy']")


def test_features_must_include_timeline_semaphores(engine_device):
    gpus, make = engine_device
    keywords, _ = make(primary_features=["synchronization2"])
    with pytest.raises(UnsupportedError, match="timelineSemaphore"):
        vkmulti.MultiDeviceManager(physical_devices=gpus, enabled=True, **keywords)
    keywords["primary_features"] = "timelineSemaphore"
    with pytest.raises(TypeError, match="primary_features must be an iterable of names"):
        vkmulti.MultiDeviceManager(physical_devices=gpus, enabled=True, **keywords)
    keywords["primary_features"] = None
    keywords["primary_extensions"] = [EXT_MEMORY_HOST, 7]
    with pytest.raises(TypeError, match="primary_extensions must hold str names, got int 7"):
        vkmulti.MultiDeviceManager(physical_devices=gpus, enabled=True, **keywords)


def test_device_requirements_answer(engine_device):
    gpus, _ = engine_device
    req = vkmulti.device_requirements(gpus[0])
    caps = probe_device(gpus[0])
    assert req.features == ("timelineSemaphore",) and req.queue_families.graphics == caps.graphics_family
    assert all(caps.has(e) for e in req.extensions) and EXT_MEMORY_HOST in req.extensions
    assert set(req.uses) == set(req.extensions) and req.family_indices[0] == caps.graphics_family
    assert len(repr(req)) < 200
    chain = req.feature_chain()
    assert chain.timelineSemaphore == vk.VK_TRUE
    with_peers = vkmulti.device_requirements(gpus[0], peers=gpus[1:])
    assert set(with_peers.extensions) <= set(req.extensions)
    with pytest.raises(TypeError, match="peers must be a list"):
        vkmulti.device_requirements(gpus[0], peers="gpu")
    with pytest.raises(TypeError):
        vkmulti.device_requirements("not a device")
    with pytest.raises(ValueError):
        vkmulti.device_requirements(0)
