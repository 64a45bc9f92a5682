"""Test set-up: the virtual lavapipe GPU pair and the validation-layer guard.

Unless VKMULTI_REAL_GPUS=1 (the GPU host), the loader is pointed at two copies
of the lavapipe ICD before anything creates an instance. Every Instance the
tests create has VK_LAYER_KHRONOS_validation on; any validation message of
severity error fails the test that produced it.
"""
from __future__ import annotations

import faulthandler
import os
import threading

import pytest

REAL_GPUS = os.environ.get("VKMULTI_REAL_GPUS") == "1"

os.environ["VKMULTI_VALIDATION"] = "1"
if not REAL_GPUS:
    from vkmulti.testing import install_virtual_gpus

    install_virtual_gpus(2)


def _one_gpu_seen_twice() -> bool:
    """Whether the real devices are fewer physical GPUs than logical ones (one GPU
    listed by two copies of its driver manifest: a functional pair, no second GPU)."""
    from vkmulti import probe_device
    from vkmulti import Instance

    inst = Instance(validation=False)
    try:
        uuids = [probe_device(p).device_uuid for p in inst.physical_devices()]
    finally:
        inst.destroy()
    return len(set(uuids)) < len(uuids)


#: A test whose set-up, call and teardown together run this long is a hang: every
#: thread's stack goes to the terminal and the run ends (exit 1), instead of waiting
#: out CI's limit with nothing to show (VKMULTI_TEST_HANG_S; 0: no guard).
HANG_S = float(os.environ.get("VKMULTI_TEST_HANG_S", "900"))
_hang_dump: dict[str, object] = {}


def pytest_configure(config):
    """Keep a file on the terminal's stderr, outside pytest's capture, for the hang dump."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        _hang_dump["file"] = os.fdopen(os.dup(2), "w")
        return
    with capman.global_and_fixture_disabled():
        _hang_dump["file"] = os.fdopen(os.dup(2), "w")


@pytest.fixture(autouse=True)
def hang_guard(request):
    """Arm the hang dump for this test (its fixtures' set-up and teardown included)."""
    out = _hang_dump.get("file")
    if HANG_S <= 0 or out is None:
        yield
        return
    faulthandler.dump_traceback_later(HANG_S, exit=True, file=out)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_collection_modifyitems(config, items):
    skips: dict[str, pytest.MarkDecorator] = {}
    if REAL_GPUS:
        skips["virtual"] = pytest.mark.skip(reason="checks facts of the virtual lavapipe pair")
        from vkmulti.testing import find_lavapipe_icd

        if find_lavapipe_icd() is None:
            skips["lavapipe"] = pytest.mark.skip(reason="makes virtual lavapipe devices: Mesa's lavapipe is not "
                                                        "installed here")
        if any("two_gpus" in item.keywords for item in items) and _one_gpu_seen_twice():
            skips["two_gpus"] = pytest.mark.skip(reason="needs two physical GPUs: these devices are one GPU "
                                                        "listed twice")
    else:
        skips["gpu"] = pytest.mark.skip(reason="needs two real GPUs (set VKMULTI_REAL_GPUS=1 on a GPU host)")
        skips["two_gpus"] = skips["gpu"]
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)
                break


from repr_watch import install as _install_repr_watch, take_problems as _repr_problems  # noqa: E402

_install_repr_watch()


@pytest.fixture(autouse=True)
def repr_guard():
    """Fail the test if a public object it built has a repr of 200+ characters (or
    several lines), or a VkmError it raised embeds an object dump (repr_watch.py)."""
    _repr_problems()
    yield
    found = _repr_problems()
    if found:
        pytest.fail("long reprs or object dumps:\n" + "\n".join(dict.fromkeys(found)))


import lock_order  # noqa: E402

lock_order.install()   # (before any fixture makes a runtime or a device slot)


@pytest.fixture(autouse=True)
def lock_order_guard():
    """Fail the test if a thread took locks in an order that closes a cycle of lock classes,
    or a device lock while holding a higher device's (lock_order.py: the edges persist
    across tests, so the test that closes a cycle fails, with both orders' stacks)."""
    del lock_order.problems[:]
    yield
    if lock_order.problems:
        found = lock_order.problems[:2]
        del lock_order.problems[:]
        pytest.fail("locks taken out of order (a deadlock waiting to happen):\n" + "\n".join(found))


@pytest.fixture(autouse=True)
def validation_guard(request):
    """Fail the test if the validation layer reported an error during it."""
    from vkmulti.device.instance import drain_all_validation_messages

    drain_all_validation_messages()
    yield
    errors = [text for sev, text in drain_all_validation_messages() if sev == "error"]
    if errors and "allow_validation_errors" not in request.keywords:
        pytest.fail("validation layer reported %d error(s):\n%s" % (len(errors), "\n".join(errors[:5])))


@pytest.fixture
def manager():
    """A MultiDeviceManager over both GPUs (virtual pair by default); destroyed after."""
    from vkmulti import MultiDeviceManager

    mgr = MultiDeviceManager.create(enabled=True)
    try:
        yield mgr
    finally:
        mgr.destroy()


@pytest.fixture
def run_threads():
    """run_threads(worker, n=4): worker(k) for k in range(n), in n threads at once;
    returns the exceptions they raised."""
    def run(worker, n=4):
        errors = []

        def guarded(k):
            try:
                worker(k)
            except Exception as exc:   # the caller asserts on them
                errors.append(exc)
        threads = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return errors
    return run
