"""The public API is typed: no Any slips back into its signatures, mypy passes on
the package, and user code type-checks with `mypy --strict` (and a wrong
argument is caught, so the types are real ones, not Any).

tools/count_any.py counts Any over every public callable; RATCHET holds what
this tree reached, so the counts may only go down. The mypy checks run where
mypy is installed (the `test` and `typecheck` extras; .ci/typecheck runs the
package check in CI too)."""
from __future__ import annotations

import importlib.util
import pathlib
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "count_any.py"
if not (TOOL.is_file() and (ROOT / "src" / "vkmulti").is_dir()):
    pytest.skip("needs the source tree", allow_module_level=True)

#: Any in public signatures, at most: none outside the ones count_any.py lists with their reason.
RATCHET = {"bare": 0, "nested": 0, "missing": 0, "justified": 35}


def _count_any():
    spec = importlib.util.spec_from_file_location("count_any", TOOL)
    mod = sys.modules.get("count_any")
    if mod is None:
        mod = importlib.util.module_from_spec(spec)
        sys.modules["count_any"] = mod   # its dataclasses look their module up
        spec.loader.exec_module(mod)
    return mod


def test_no_new_any_in_public_signatures():
    totals, slots = _count_any().collect()
    assert totals.callables > 600 and totals.parameters > 1000, "the count lost the public API"
    got = {k: getattr(totals, k) for k in RATCHET}
    worse = {k: (got[k], RATCHET[k]) for k in RATCHET if got[k] > RATCHET[k]}
    offenders = [f"{s.kind} {s.where}: {s.annotation or '(none)'}" for s in slots
                 if s.kind in ("bare", "nested", "missing")]
    assert not worse, f"Any in public signatures went up (now, allowed): {worse}\n" + "\n".join(offenders)


def test_the_count_sees_any():
    """The counter itself: bare, nested, implicit (bare generics) and missing."""
    kind = _count_any()._any_kind
    assert kind("Any") == "bare" and kind("typing.Any") == "bare"
    assert kind("list[Any]") == "nested" and kind("Any | None") == "nested" and kind("dict") == "nested"
    assert kind("Callable[[int], Any]") == "nested" and kind("Callable") == "nested"
    assert kind("dict[str, int]") == "typed" and kind("DeviceSlot") == "typed" and kind("") == "missing"


mypy_api = pytest.importorskip("mypy.api", reason="mypy is not installed (pip install '.[typecheck]')")

#: User code as the README writes it, with the types it must get (checked by assignment).
USER_CODE = '''
from __future__ import annotations

import asyncio

import numpy as np
from numpy.typing import NDArray

import vkmulti
from vkmulti.kernels import KernelRuntime, MultiGpuCoordinator, counter_kernel
from vkmulti.kernels.reference import read_counter


def first_steps() -> None:
    with vkmulti.MultiDeviceManager.create() as mgr:
        names: list[str] = [s.name for s in mgr.slots]
        pixels = np.zeros((64, 64, 8), dtype=np.uint8)
        for src in mgr.secondaries:
            dst: vkmulti.DeviceSlot = mgr.primary
            method: str = vkmulti.select_transfer_method(src, dst)
            with vkmulti.Image(src, 64, 64) as a, vkmulti.Image(dst, 64, 64) as b:
                a.upload(pixels)
                with vkmulti.CrossDeviceTransfer(src, dst, method) as x:
                    ticket: vkmulti.TransferTicket = x.submit(src_image=a, dst_image=b)
                    ticket.wait(timeout=10.0)
                    ready: vkmulti.TimelinePoint = ticket.dst_ready
                back: NDArray[np.uint8] = b.download(waits=ready)
                assert np.array_equal(back, pixels), names


async def buffers() -> None:
    with vkmulti.MultiDeviceManager.create() as mgr, vkmulti.InterGpuTransfer(mgr) as t:
        data = np.arange(1 << 10, dtype=np.uint32).view(np.uint8)
        copies: list[vkmulti.Buffer] = t.broadcast_blocking(data)
        for i, buf in enumerate(copies):
            t.set_device_buffer(i, buf)
        back: list[np.ndarray] = t.gather_blocking(0)
        one: vkmulti.Buffer = await t.copy_buffer(0, 0, data)
        raw: NDArray[np.uint8] = one.download()
        g: vkmulti.Gathered = t.gather_to_device_blocking(0)
        assert back and raw.size and g.buffer.size


def kernels() -> None:
    with vkmulti.MultiDeviceManager.create() as mgr:
        rt = KernelRuntime(MultiGpuCoordinator.from_manager(mgr), mgr)
        k: vkmulti.Kernel = rt.launch(counter_kernel(), "counter")
        rt.step([k]).wait()
        state: NDArray[np.uint8] = rt.read_state(k)
        cp: vkmulti.Checkpoint = rt.checkpoint(k)
        print(read_counter(state), cp)
        rt.destroy_kernel("counter")


def plan() -> None:
    class SRU:
        def __init__(self, sru_id: int) -> None:
            self.sru_id = sru_id
    plan = vkmulti.assign_srus([SRU(i) for i in range(8)], 2, sru_id=lambda s: s.sru_id)
    print(plan)


asyncio.run(buffers())
'''

#: Wrong arguments a type checker must reject (they were Any before).
WRONG_CODE = '''
import vkmulti
import numpy as np

with vkmulti.MultiDeviceManager.create() as mgr:
    vkmulti.Buffer("GPU 0", 1024)                              # a str is not a DeviceSlot
    vkmulti.Image(mgr.primary, 8, 8).upload(3.5)               # a float is not host data
    vkmulti.InterGpuTransfer(mgr.primary)                      # a slot is not a manager
    vkmulti.select_transfer_method(mgr.primary, 7)             # nor is an int a slot
'''


def _mypy(tmp_path: pathlib.Path, code: str, *, strict: bool) -> tuple[str, int]:
    """mypy on `code` with vkmulti found in src/ and its own modules silenced, as an installed
    package's are (mypy does not follow the editable install's import hook)."""
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(code))
    cfg = tmp_path / "mypy.ini"
    cfg.write_text("[mypy]\npython_version = 3.11\n"
                   + ("strict = True\n" if strict else "")
                   + f"mypy_path = {ROOT / 'src'}\ncache_dir = {tmp_path / 'cache'}\n"
                   "[mypy-vkmulti.*]\nfollow_imports = silent\n"
                   "[mypy-vulkan.*,ray.*,matplotlib.*,rich.*,tqdm.*,zlib_ng.*,pynvml,PIL.*]\n"
                   "ignore_missing_imports = True\n")
    out, err, rc = mypy_api.run(["--config-file", str(cfg), str(prog)] + (
        [str(ROOT / "examples")] if strict else []))
    return out + err, rc


def test_user_code_passes_mypy_strict(tmp_path):
    out, rc = _mypy(tmp_path, USER_CODE, strict=True)
    assert rc == 0, out


def test_wrong_arguments_are_caught(tmp_path):
    out, rc = _mypy(tmp_path, WRONG_CODE, strict=False)
    assert rc == 1, out
    for line in (6, 7, 8, 9):
        assert f"prog.py:{line}: error" in out, out


def test_the_package_passes_mypy():
    """What .ci/typecheck runs: mypy with pyproject.toml's [tool.mypy] over src/vkmulti."""
    out, err, rc = mypy_api.run(["--config-file", str(ROOT / "pyproject.toml"), str(ROOT / "src" / "vkmulti")])
    assert rc == 0, out + err
