"""Error messages stay bounded on the virtual GPU pair (test_error_bounds.py has the rules).

The entry points of the manager, buffers, images, transfers, the SRU coordinator,
renderer and compositor, and the kernel runtime, router and migrator, each called
with its good arguments and one position at a time replaced by a hostile value;
and caller text the runtime keeps and names later (a kernel id, the reason given
for a lost GPU).
"""
from __future__ import annotations

import shutil
import tempfile
from typing import Any, Callable

import numpy as np
import pytest

import vkmulti
import vkmulti.kernels
from vkmulti import (Buffer, CrossDeviceTransfer, HotReloadManager, Image, InterGpuTransfer, KernelCodeSource,
                     MemoryStorage, MigrationRequest, MultiDeviceManager, MultiGpuCoordinator, ReferenceRenderer,
                     ReferenceSRU, SRUOffloadCoordinator, select_transfer_method)

import test_fuzz_host
import test_fuzz_runtime
from hostile_values import MESSAGE_LIMIT, MB, TYPED, Answer, check_positions

SPIRV = test_fuzz_host.SPIRV

# -- the entry points on the virtual GPU pair -----------------------------------------------------


class World(test_fuzz_runtime.World):
    """test_fuzz_runtime's manager, runtime, router, migrator and kernels, plus buffers, images,
    transfers, an SRU coordinator, a renderer and a compositor on the same manager."""

    def __init__(self) -> None:
        super().__init__()
        self.slot0, self.slot1 = self.mgr.slot(0), self.mgr.slot(1)
        self.buf0, self.buf1 = Buffer(self.slot0, 4096), Buffer(self.slot1, 4096)
        self.img0, self.img1 = Image(self.slot0, 8, 8), Image(self.slot1, 8, 8)
        self.tile0 = Image(self.slot0, 4, 4)
        self.pixels = np.zeros((8, 8, 8), np.uint8)
        self.xfer = InterGpuTransfer(self.mgr)
        self.cdt = CrossDeviceTransfer(self.slot1, self.slot0, select_transfer_method(self.slot1, self.slot0))
        self.sruc = SRUOffloadCoordinator(self.mgr, secondary_renderer_factory=lambda ctx: ReferenceRenderer(ctx.slot))
        self.sru = ReferenceSRU(1, 8, 8, iterations=2)
        self.routes = self.sruc.plan([self.sru, ReferenceSRU(2, 8, 8, iterations=2)])
        self.renderer = ReferenceRenderer(self.slot0)
        self.compositor = vkmulti.Compositor(self.slot0)
        self.ticket = self.cdt.submit(src_buffer=self.buf1, dst_buffer=self.buf0, size=64)
        self.ticket.wait(30)
        self.pds = self.mgr.instance.physical_devices()
        self.cache = tempfile.mkdtemp(prefix="vkmulti-error-bounds-")

    def destroy(self) -> None:
        for obj in (self.compositor, self.renderer, self.sruc, self.cdt, self.xfer, self.tile0, self.img0, self.img1,
                    self.buf0, self.buf1):
            obj.destroy()
        shutil.rmtree(self.cache, ignore_errors=True)
        super().destroy()


@pytest.fixture(scope="module")
def gpu_world():
    w = World()
    try:
        yield w
    finally:
        w.destroy()


def _noop(*args: Any) -> None:
    return None


def _made(obj: Any) -> None:
    """Destroy what a call made (it took its arguments)."""
    obj.destroy()


def _manager(w: World, families: Any, device: Any, queue: Any, pds: Any, extensions: Any) -> None:
    _made(MultiDeviceManager(primary_physical_device=pds[0], primary_queue_families=families, primary_device=device,
                             primary_graphics_queue=queue, primary_present_queue=queue, physical_devices=pds,
                             enabled=False, primary_extensions=extensions))


def _router(w: World, ml: Any, mp: Any, st: Any, tm: Any) -> None:
    _made(vkmulti.CrossGpuK2KRouter(w.rt.coordinator, None, max_landings=ml, max_pending=mp, submit_timeout=st,
                                    transfer_methods=tm))


def _batch(w: World, d: Any, b: Any, o: Any, s: Any, hops: Any, slots: Any) -> None:
    w.rt.withdraw_batch(w.rt.accept_batch(d, b, o, s, hops=hops, direct_slots=slots))


def _reload_kernel(w: World, k: Any, kid: Any) -> None:
    m = HotReloadManager()
    m.unregister_kernel(m.register_runtime_kernel(k, kid))


#: Cases whose good call is itself refused (a device without that extension, an index out of
#: range, a kernel that is not there or was destroyed, a buffer it did not make): the hostile
#: values must get a bounded typed error too.
REFUSED = {"create_logical_device", "destroy_kernel", "manager.report_device_lost", "migrate_with_checkpoint",
           "InterGpuTransfer.detach"}

#: (case, position) of timeouts where no limit waits for what never comes (no message is sent to "b").
UNBOUNDED_WAITS = {("receive", 1)}

#: name -> (the call on the world, its good arguments; a str "@x" stands for the world's attribute x).
GPU_CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    **test_fuzz_runtime.CASES,
    "destroy_kernel": (lambda w, k, t: w.rt.destroy_kernel(k, timeout=t), ("nobody", 30.0)),
    "kernel_queries": (lambda w, k: (w.rt.pending_receives(k), w.rt.is_held(k), w.rt.latest_checkpoint(k)), ("a",)),
    "accept_batch": (_batch, (0, "@buf0", 0, 368, 0, None)),
    "step_listener": (lambda w, f, r, p, q: (w.rt.add_step_listener(f, retain=r, prepare=p, quiet=q),
                                             w.rt.remove_step_listener(f)), (_noop, False, None, None)),
    "set_outbox_feed": (lambda w, f: w.rt.set_outbox_feed(f), (None,)),
    "synchronize": (lambda w, t: w.rt.synchronize(t), (30.0,)),
    "apply_code": (lambda w, k, c, t: w.rt.apply_code(k, c, t), ("@w", "@code", 30.0)),
    "kernel.methods": (lambda w, p, s: (w.w.set_params(*p), w.rt.step(w.a).wait(30), w.a.outbox_batch(s)),
                       ((1, 2), None)),
    "kernel.restore_from_checkpoint": (lambda w, cp: w.b.restore_from_checkpoint(cp), ("@cp",)),
    "KernelRuntime": (lambda w, ps, f, m, h, k: _made(vkmulti.kernels.KernelRuntime(
        w.rt.coordinator, w.mgr, payload_size=ps, in_flight=f, max_kernels=m, h2k_capacity=h, k2h_capacity=k)),
                      (256, 2, 8, 16, 16)),
    "CrossGpuK2KRouter": (_router, (None, 64, 5.0, None)),
    "router.attach_device_lost": (lambda w, r, i: (w.router.attach(r), w.router.device_lost(i)), ("@rt", 9)),
    "KernelMigrator": (lambda w, c, s: (vkmulti.KernelMigrator(c, s), vkmulti.KernelMigrator.with_storage(c, s)),
                       ("@coordinator", MemoryStorage())),
    "migrate_with_checkpoint": (lambda w, k, r, t, v: w.migrator.migrate_with_checkpoint(k, r, timeout=t, verify=v),
                                ("@dead", MigrationRequest("dead", 1, 0, [1, 0], 1.0, 1.0), 30.0, True)),
    "register_runtime_kernel": (_reload_kernel, ("@w", "w-reload")),
    "manager.create": (lambda w, e, d: _made(MultiDeviceManager.create(e, device_indices=d)), (False, [0])),
    "manager.slot": (lambda w, i: (w.mgr.slot(i), w.mgr.device_lost(i)), (1,)),
    "manager.report_device_lost": (lambda w, i, r: w.mgr.report_device_lost(i, r), (7, "gone")),
    "manager.listeners": (lambda w, f: (w.mgr.add_loss_listener(f), w.mgr.remove_loss_listener(f)), (_noop,)),
    "manager.attach_renderer": (lambda w, i: w.mgr.attach_renderer(i, None), (1,)),
    "MultiDeviceManager": (_manager, ("@families", "@device", "@queue", "@pds", None)),
    "Buffer": (lambda w, s, n, u, h: _made(Buffer(s, n, usage=u, host_visible=h)), ("@slot0", 256, 0x3, False)),
    "Buffer.upload": (lambda w, d, o, t: w.buf0.upload(d, o, timeout=t), (b"abcd", 8, 30.0)),
    "Buffer.download": (lambda w, n, o, t: w.buf0.download(n, o, timeout=t), (16, 8, 30.0)),
    "Image": (lambda w, s, wd, h, f, u, l, t: _made(Image(s, wd, h, f, usage=u, layout=l, timeout=t)),
              ("@slot0", 8, 8, 97, 7, 5, 30.0)),
    "Image.upload": (lambda w, p, t: w.img0.upload(p, timeout=t), ("@pixels", 30.0)),
    "Image.download": (lambda w, ws, t: w.img0.download(waits=ws, timeout=t), ((), 30.0)),
    "CrossDeviceTransfer": (lambda w, s, d, m, wd, b, ss, sc: _made(CrossDeviceTransfer(
        s, d, m, width=wd, height=wd, bytes_per_pixel=b, slot_size=ss, slot_count=sc)),
                            ("@slot1", "@slot0", "staging_copy", 8, 8, 65536, 2)),
    "CrossDeviceTransfer.submit": (lambda w, a, b, so, do, n, sw, dw: w.cdt.submit(
        src_buffer=a, dst_buffer=b, src_offset=so, dst_offset=do, size=n, src_wait=sw, dst_wait=dw).wait(30),
                                   ("@buf1", "@buf0", 0, 64, 64, None, None)),
    "CrossDeviceTransfer.submit_images": (lambda w, a, b, sl, dl, sf, df: w.cdt.submit(
        src_image=a, dst_image=b, src_layout=sl, dst_layout=dl, src_final_layout=sf, dst_final_layout=df).wait(30),
                                          ("@img1", "@img0", None, None, None, None)),
    "CrossDeviceTransfer.ensure_staging": (lambda w, a, b: w.cdt.ensure_staging(a, b), (None, None)),
    "TransferTicket": (lambda w, i, t: (w.ticket.gpu_done(i), w.ticket.gpu_wait(i, t), w.ticket.wait(t)), (0, 30.0)),
    "InterGpuTransfer": (lambda w, h, p, ss, sc, mw: _made(InterGpuTransfer(
        w.mgr, host_import=h, prefer_dmabuf=p, slot_size=ss, slot_count=sc, max_workers=mw)), (None, True, 65536, 2, 2)),
    "InterGpuTransfer.copy": (lambda w, s, d, data, b, o, t: w.xfer.copy_buffer_blocking(
        s, d, data, dst_buffer=b, dst_offset=o, timeout=t), (0, 1, b"abcd", "@buf1", 8, 30.0)),
    "InterGpuTransfer.broadcast": (lambda w, data, s, b, t: w.xfer.broadcast_blocking(
        data, src_device=s, dst_buffers=b, timeout=t), (b"abcd", 0, None, 30.0)),
    "InterGpuTransfer.register": (lambda w, i, b, n, r: (w.xfer.set_device_buffer(i, b, n, ready=r),
                                                         w.xfer.registered(i)), (1, "@buf1", 64, None)),
    "InterGpuTransfer.gather": (lambda w, d, o, r, t: (w.xfer.set_device_buffer(1, w.buf1, 64),
                                                       w.xfer.gather_blocking(d, out=o, reuse=r, timeout=t)),
                                (0, None, False, 30.0)),
    "InterGpuTransfer.gather_to_device": (lambda w, d, b, t: (w.xfer.set_device_buffer(1, w.buf1, 64),
                                                              w.xfer.gather_to_device_blocking(d, dst_buffer=b, timeout=t)),
                                          (0, None, 30.0)),
    "InterGpuTransfer.transfer_method": (lambda w, s, d: w.xfer.transfer_method(s, d), (0, 1)),
    "InterGpuTransfer.detach": (lambda w, b: w.xfer.detach(b), ("@buf0",)),
    "SRUOffloadCoordinator": (lambda w, c, p, cs, f, d, wt, h, t, a, ad: _made(SRUOffloadCoordinator(
        w.mgr, c, prefer_dmabuf=p, content_scale=cs, secondary_renderer_factory=f, devices=d, weights=wt, hysteresis=h,
        timeout=t, adaptive=a, adaptive_damping=ad)), (None, True, (1.0, 1.0), None, [0, 1], [1.0, 1.0], 0.1, 30.0,
                                                       False, 0.5)),
    "SRUOffloadCoordinator.plan": (lambda w, s, i, c, t, o: w.sruc.plan(s, sru_id=i, cost=c, transfer_cost=t,
                                                                        offloadable=o),
                                   ("@srus", None, None, None, None)),
    "SRUOffloadCoordinator.plan_answers": (lambda w, i, c, t, o: w.sruc.plan([w.sru], sru_id=i, cost=c,
                                                                             transfer_cost=t, offloadable=o),
                                           (Answer(1), Answer(1.0), Answer(0.5), Answer(True))),
    "SRUOffloadCoordinator.queries": (lambda w, i, r, wd, t: (w.sruc.route_for(i), w.sruc.ticket_for(i),
                                                               _made(w.sruc.transfer_for(r, width=wd, height=wd)),
                                                               w.sruc.wait_frame(t)), (1, "@route", 8, 30.0)),
    "SRUOffloadCoordinator.restore_device": (lambda w, i: w.sruc.restore_device(i), (1,)),
    "SRUOffloadCoordinator.render_frame": (lambda w, s, f, c: w.sruc.render_frame(s, f, clear=c),
                                           ("@srus", "@frame", (0.0, 0.0, 0.0, 1.0))),
    "ReferenceRenderer": (lambda w, s, q, n: _made(ReferenceRenderer(s, queue=q, slowdown=n)), ("@slot0", None, 1)),
    "ReferenceRenderer.render": (lambda w, s, tg, wt, t: w.renderer.wait(w.renderer.render(s, tg, wait=wt), t),
                                 ("@sru", "@img0", None, 30.0)),
    "ReferenceRenderer.make_target": (lambda w, s: _made(w.renderer.make_target(s)), ("@sru",)),
    "Compositor": (lambda w, s, cs, q: _made(vkmulti.Compositor(s, content_scale=cs, queue=q)),
                   ("@slot0", (1.0, 1.0), None)),
    "Compositor.composite": (lambda w, f, p, wt, c: w.compositor.wait(w.compositor.composite(f, p, wait=wt, clear=c)),
                             ("@frame", "@placements", None, (0.0, 0.0, 0.0, 1.0))),
    "probe_device": (lambda w, pd, peers: (vkmulti.probe_device(pd), vkmulti.device_requirements(pd, peers)),
                     ("@pd0", ())),
    "create_logical_device": (lambda w, pd, qf, c, t, e: vkmulti.create_logical_device(
        pd, qf, compute_qf=c, transfer_qf=t, extensions=e), ("@pd0", None, None, None, ("VK_vkmulti_absent",))),
    "Instance": (lambda w, v, a, e: _made(vkmulti.Instance(validation=v, app_name=a, extensions=e)),
                 (False, "vkmulti", ())),
    "pair_methods": (lambda w, a, b: (vkmulti.pair_methods(a, b), vkmulti.cuda_peer_reason(a, b)),
                     ("@slot0", "@slot1")),
    "supported_methods": (lambda w, a, b, ea, eb: vkmulti.supported_methods(a, b, ea, eb),
                          ("@caps0", "@caps1", None, None)),
    "probe_topology": (lambda w, f, c, d, n, r, s: vkmulti.probe_topology(w.mgr, force=f, cache=c, cache_directory=d,
                                                                         nbytes=n, reps=r, sysfs_root=s),
                       (False, True, "@cache", 4096, 1, "/sys")),
    "coordinator.from_manager": (lambda w, m, c: MultiGpuCoordinator.from_manager(m, c), ("@mgr", None)),
}

#: what the "@x" names stand for, apart from the world's own attributes
_DERIVED: dict[str, Callable[[World], Any]] = {
    "families": lambda w: w.mgr.primary.queue_families,
    "device": lambda w: w.mgr.primary.device,
    "queue": lambda w: w.mgr.primary.graphics_queue,
    "pd0": lambda w: w.pds[0],
    "caps0": lambda w: w.slot0.capabilities,
    "caps1": lambda w: w.slot1.capabilities,
    "coordinator": lambda w: w.rt.coordinator,
    "srus": lambda w: [w.sru, ReferenceSRU(2, 8, 8, iterations=2)],
    "route": lambda w: w.routes[0],
    "frame": lambda w: w.img0,
    "placements": lambda w: [(w.tile0, 0, 0)],
    "code": lambda w: KernelCodeSource.from_spirv(w.spec.spirv),
}


def _resolve(w: World, value: Any) -> Any:
    if isinstance(value, str) and value.startswith("@"):
        name = value[1:]
        return _DERIVED[name](w) if name in _DERIVED else getattr(w, name)
    return value


def _gpu_call(w: World, name: str, args: list[Any]) -> Any:
    fn = GPU_CASES[name][0]
    return fn(w, *(_resolve(w, a) for a in args))


@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_gpu_cases_take_their_good_arguments(gpu_world, name):
    """Each case's good call works, so each hostile value is what its call trips on."""
    if name in REFUSED:
        with pytest.raises(TYPED):
            _gpu_call(gpu_world, name, list(GPU_CASES[name][1]))
    else:
        _gpu_call(gpu_world, name, list(GPU_CASES[name][1]))


@pytest.mark.parametrize("name,pos", [(n, p) for n in sorted(GPU_CASES) for p in range(len(GPU_CASES[n][1]))])
def test_gpu_entry_points_keep_errors_bounded(gpu_world, name, pos):
    check_positions(name, GPU_CASES[name][1], pos, lambda args: _gpu_call(gpu_world, name, args),
                    waits_for_ever=(name, pos) in UNBOUNDED_WAITS)
    if name not in REFUSED:
        _gpu_call(gpu_world, name, list(GPU_CASES[name][1]))   # (and the world still works)


# -- caller text the runtime keeps and names again later ---------------------------------------------


def test_a_kernel_with_a_1MB_id_keeps_its_repr_and_errors_short(gpu_world):
    """A kernel id is whatever str the caller chose: the kernel's repr and the errors
    that name it later (used after destroy, an outbox batch it never made) stay short."""
    w = gpu_world
    k = w.launch("k" * MB, 0)
    try:
        assert len(repr(k)) < 200
        with pytest.raises(ValueError) as info:
            k.outbox_batch()
        assert len(str(info.value)) <= MESSAGE_LIMIT
    finally:
        w.rt.destroy_kernel(k)
    for fn in (k.check, lambda: w.rt.read_state(k)):
        with pytest.raises(vkmulti.DestroyedError) as info:
            fn()
        assert len(str(info.value)) <= MESSAGE_LIMIT


def test_the_reason_a_caller_gave_for_a_lost_primary_stays_short():
    """report_device_lost(0, reason) with a 1 MB reason: the PrimaryDeviceLostError
    every later step raises names it, cut short."""
    mgr = MultiDeviceManager.create()
    rt = vkmulti.kernels.KernelRuntime(MultiGpuCoordinator.from_manager(mgr), mgr)
    try:
        rt.launch(vkmulti.kernels.counter_kernel(max_sources=4), "c", device=0)
        mgr.report_device_lost(0, "r" * MB)
        with pytest.raises(vkmulti.PrimaryDeviceLostError) as info:
            rt.step()
        assert len(str(info.value)) <= MESSAGE_LIMIT and "rrr" in str(info.value)
    finally:
        rt.destroy()
        mgr.destroy()
