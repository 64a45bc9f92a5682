"""The inline tests of ringkernel-core's multi_gpu.rs for the kernel migrator and
hot reload, ported with the Python spelling (X::new(a) -> X(a), enum ->
UPPER_SNAKE, Duration -> float seconds, Result error -> exception), the
seed's mock kernel as a plain Python object; then what vkmulti fixes or adds
(FAILED is set and counted, history and rollback by steps, timeouts, retries)."""
from __future__ import annotations

import time

import pytest

from vkmulti import (Backend, Checkpoint, CheckpointBuilder, CheckpointableKernel, DeviceInfo, FileStorage,
                     HotReloadableKernel, HotReloadConfig, HotReloadManager, HotReloadRequest, HotReloadState,
                     KernelCodeFormat, KernelCodeSource, KernelId, KernelMigrator, MemoryStorage,
                     MigratableKernel, MigrationError, MigrationPriority, MigrationState, MigrationStats, MultiGpuBuilder,
                     VkmError)
from vkmulti.errors import KernelNotFoundError, KernelValidationError, TimeoutError as VkmTimeout


class MockCheckpointableKernel:
    """The seed's mock: a kernel id, a type, state bytes and a step."""

    def __init__(self, kernel_id: str, state_size: int):
        self.kernel_id = kernel_id
        self.kernel_type = "mock_kernel"
        self.state_data = bytes([0xAB]) * state_size
        self.step = 1000

    def create_checkpoint(self) -> Checkpoint:
        return (CheckpointBuilder(self.kernel_id, self.kernel_type).step(self.step).grid_size(64, 64, 64)
                .control_block(bytes([1, 2, 3, 4])).device_memory("state", self.state_data).build())

    def restore_from_checkpoint(self, checkpoint: Checkpoint) -> None:
        self.step = checkpoint.metadata.current_step

    def checkpoint_kernel_id(self) -> str:
        return self.kernel_id

    def checkpoint_kernel_type(self) -> str:
        return self.kernel_type


def two_gpus():
    coord = MultiGpuBuilder().build()
    coord.register_device(DeviceInfo(0, "GPU 0", Backend.CUDA))
    coord.register_device(DeviceInfo(1, "GPU 1", Backend.CUDA))
    return coord


# ---- Kernel Migrator Tests ----

def test_migrator_creation():
    coord = MultiGpuBuilder().build()
    migrator = KernelMigrator(coord)
    stats = migrator.stats()
    assert stats.successful_migrations == 0
    assert stats.failed_migrations == 0
    assert stats.bytes_transferred == 0


def test_migrator_with_custom_storage():
    coord = MultiGpuBuilder().build()
    storage = MemoryStorage()
    migrator = KernelMigrator.with_storage(coord, storage)
    assert migrator.coordinator() is coord


def test_successful_migration():
    coord = two_gpus()
    kernel_id = KernelId("migratable_kernel")
    coord.assign_kernel(kernel_id, 0)
    migrator = KernelMigrator(coord)
    kernel = MockCheckpointableKernel("migratable_kernel", 1024)
    request = coord.request_migration(kernel_id, 1)
    assert request.state == MigrationState.PENDING
    result = migrator.migrate_with_checkpoint(kernel, request)
    assert result.kernel_id.as_str() == "migratable_kernel"
    assert result.source_device == 0
    assert result.target_device == 1
    assert result.checkpoint_size > 0
    assert result.total_duration > 0.0
    assert coord.get_kernel_device(kernel_id) == 1
    stats = migrator.stats()
    assert stats.successful_migrations == 1
    assert stats.failed_migrations == 0
    assert stats.bytes_transferred > 0
    assert request.state == MigrationState.COMPLETED


def test_migration_result_fields():
    coord = two_gpus()
    kernel_id = KernelId("test_kernel")
    coord.assign_kernel(kernel_id, 0)
    migrator = KernelMigrator(coord)
    kernel = MockCheckpointableKernel("test_kernel", 4096)
    request = coord.request_migration(kernel_id, 1)
    result = migrator.migrate_with_checkpoint(kernel, request)
    assert result.checkpoint_duration >= 0.0
    assert result.transfer_duration >= 0.0
    assert result.restore_duration >= 0.0
    assert result.total_duration >= result.checkpoint_duration


def test_migration_stats_accumulate():
    coord = two_gpus()
    migrator = KernelMigrator(coord)
    k1 = KernelId("k1")
    coord.assign_kernel(k1, 0)
    migrator.migrate_with_checkpoint(MockCheckpointableKernel("k1", 1000), coord.request_migration(k1, 1))
    k2 = KernelId("k2")
    coord.assign_kernel(k2, 0)
    migrator.migrate_with_checkpoint(MockCheckpointableKernel("k2", 2000), coord.request_migration(k2, 1))
    stats = migrator.stats()
    assert stats.successful_migrations == 2
    assert stats.failed_migrations == 0
    assert stats.bytes_transferred > 0


def test_migration_priority_enum():
    assert MigrationPriority.LOW != MigrationPriority.NORMAL
    assert MigrationPriority.NORMAL != MigrationPriority.HIGH
    assert MigrationPriority.HIGH != MigrationPriority.CRITICAL
    assert MigrationPriority.LOW == MigrationPriority.LOW


# ---- Hot Reload Tests ----

def test_hot_reload_config_default():
    config = HotReloadConfig()
    assert config.enabled
    assert config.preserve_state
    assert config.validate_before_swap
    assert config.keep_fallback
    assert config.max_retries == 3
    assert config.reload_timeout == 30.0
    assert config.retry_backoff == 0.5
    assert config.max_rule_history == 5


def test_hot_reload_config_builder():
    config = HotReloadConfig.new().with_enabled(False).with_preserve_state(False).with_max_retries(5)\
        .with_timeout(60.0)
    assert not config.enabled
    assert not config.preserve_state
    assert config.max_retries == 5
    assert config.reload_timeout == 60.0


def test_kernel_code_source_ptx():
    ptx = ".version 7.0\n.target sm_80\nkernel: ret;"
    code = KernelCodeSource.from_ptx(ptx, "kernel")
    assert code.format == KernelCodeFormat.PTX
    assert code.entry_point == "kernel"
    assert code.as_str() == ptx
    assert code.size() == len(ptx)


def test_kernel_code_source_wgsl():
    wgsl = "@compute fn main() {}"
    code = KernelCodeSource.from_wgsl(wgsl, "main")
    assert code.format == KernelCodeFormat.WGSL
    assert code.entry_point == "main"
    assert code.as_str() == wgsl


def test_kernel_code_source_msl():
    msl = "kernel void my_kernel() {}"
    code = KernelCodeSource.from_msl(msl, "my_kernel")
    assert code.format == KernelCodeFormat.MSL
    assert code.entry_point == "my_kernel"
    assert code.as_str() == msl


def test_hot_reload_manager_creation():
    manager = HotReloadManager.with_defaults()
    assert manager.is_enabled()
    assert manager.list_kernels() == []


def test_hot_reload_manager_register_kernel():
    manager = HotReloadManager.with_defaults()
    kernel_id = KernelId("test_kernel")
    manager.register_kernel(kernel_id, KernelCodeSource.from_ptx(".version 7.0", "kernel"))
    assert manager.is_registered(kernel_id)
    assert not manager.is_reload_in_progress(kernel_id)
    assert manager.get_current_version(kernel_id) is not None


def test_hot_reload_request_states():
    request = HotReloadRequest(KernelId("test"), KernelCodeSource.from_ptx(".version 7.0", "kernel"))
    assert request.state == HotReloadState.IDLE
    assert not request.is_in_progress()
    assert not request.is_completed()
    assert not request.is_failed()


def test_hot_reload_disabled():
    manager = HotReloadManager(HotReloadConfig.new().with_enabled(False))
    kernel_id = KernelId("test")
    code = KernelCodeSource.from_ptx(".version 7.0", "kernel")
    manager.register_kernel(kernel_id, code)
    with pytest.raises(KernelValidationError, match="disabled"):
        manager.request_reload(kernel_id, code)


def test_hot_reload_stats():
    stats = HotReloadManager.with_defaults().stats()
    assert stats.successful_reloads == 0
    assert stats.failed_reloads == 0
    assert stats.rollbacks == 0


def test_hot_reload_code_formats():
    formats = [KernelCodeFormat.PTX, KernelCodeFormat.CUBIN, KernelCodeFormat.SPIRV, KernelCodeFormat.WGSL,
               KernelCodeFormat.MSL, KernelCodeFormat.METALLIB, KernelCodeFormat.SOURCE]
    assert len(set(formats)) == 7
    assert KernelCodeFormat.SPIR_V is KernelCodeFormat.SPIRV and KernelCodeFormat.METAL_LIB is KernelCodeFormat.METALLIB


def test_hot_reload_state_transitions():
    states = [HotReloadState.IDLE, HotReloadState.DRAINING, HotReloadState.CHECKPOINTING, HotReloadState.COMPILING,
              HotReloadState.VALIDATING, HotReloadState.SWAPPING, HotReloadState.RESTORING, HotReloadState.COMPLETED,
              HotReloadState.FAILED, HotReloadState.ROLLING_BACK]
    assert len(set(states)) == 10


def test_hot_reload_execute():
    manager = HotReloadManager.with_defaults()
    kernel_id = KernelId("test_kernel")
    manager.register_kernel(kernel_id, KernelCodeSource.from_ptx(".version 7.0\n.target sm_80", "kernel"))
    request = manager.request_reload(kernel_id, KernelCodeSource.from_ptx(".version 8.0\n.target sm_90", "kernel"))
    mock_kernel = MockCheckpointableKernel("test_kernel", 512)
    result = manager.execute_reload(request, mock_kernel)
    assert request.is_completed()
    assert result.kernel_id.as_str() == "test_kernel"
    assert result.state_preserved
    assert result.checkpoint_size > 0
    assert result.total_duration > 0.0
    assert manager.stats().successful_reloads == 1


def test_hot_reload_list_kernels():
    manager = HotReloadManager.with_defaults()
    k1, k2, k3 = KernelId("kernel1"), KernelId("kernel2"), KernelId("kernel3")
    for k, e in ((k1, "k1"), (k2, "k2"), (k3, "k3")):
        manager.register_kernel(k, KernelCodeSource.from_ptx(".version 7.0", e))
    kernels = manager.list_kernels()
    assert len(kernels) == 3
    assert k1 in kernels and k2 in kernels and k3 in kernels


# ---- beyond the seed ----

def test_a_plain_mock_satisfies_the_protocols():
    mock = MockCheckpointableKernel("m", 8)
    assert isinstance(mock, CheckpointableKernel)
    assert not isinstance(mock, MigratableKernel) and not isinstance(mock, HotReloadableKernel)


class FailingKernel(MockCheckpointableKernel):
    def create_checkpoint(self) -> Checkpoint:
        raise RuntimeError("device memory unreadable")


class BrokenStorage(MemoryStorage):
    def save(self, checkpoint, name):
        raise OSError("disk full")


@pytest.mark.parametrize("kernel,storage,phase", [
    (FailingKernel("k", 8), MemoryStorage(), "Checkpoint creation failed"),
    (MockCheckpointableKernel("k", 8), BrokenStorage(), "Checkpoint transfer failed")])
def test_failed_migration_is_counted_and_leaves_the_kernel(kernel, storage, phase):
    coord = two_gpus()
    coord.assign_kernel("k", 0)
    migrator = KernelMigrator.with_storage(coord, storage)
    request = coord.request_migration("k", 1)
    with pytest.raises(MigrationError, match=phase):
        migrator.migrate_with_checkpoint(kernel, request)
    assert request.state is MigrationState.FAILED
    assert coord.get_kernel_device("k") == 0
    s = migrator.stats()
    assert (s.successful_migrations, s.failed_migrations) == (0, 1)
    with pytest.raises(MigrationError, match="FAILED, not PENDING"):
        migrator.migrate_with_checkpoint(kernel, request)


def test_migration_with_file_storage_leaves_nothing_behind(tmp_path):
    coord = two_gpus()
    coord.assign_kernel("k/1", 0)
    fs = FileStorage(tmp_path)
    migrator = KernelMigrator.with_storage(coord, fs)
    migrator.migrate_with_checkpoint(MockCheckpointableKernel("k/1", 64), coord.request_migration("k/1", 1))
    assert fs.list() == [] and coord.get_kernel_device("k/1") == 1


class MigratableMock(MockCheckpointableKernel):
    def __init__(self, *a):
        super().__init__(*a)
        self.calls = []

    def prepare_for_migration(self):
        self.calls.append("prepare")

    def cancel_migration(self):
        self.calls.append("cancel")

    def is_quiescent(self):
        return True

    def estimated_state_size(self):
        return len(self.state_data)


def test_a_migratable_kernel_is_quiesced_and_resumed_on_failure():
    coord = two_gpus()
    coord.assign_kernel("k", 0)
    ok = MigratableMock("k", 8)
    assert isinstance(ok, MigratableKernel)
    KernelMigrator(coord).migrate_with_checkpoint(ok, coord.request_migration("k", 1))
    assert ok.calls == ["prepare"]
    coord.assign_kernel("j", 0)
    bad = MigratableMock("j", 8)
    migrator = KernelMigrator.with_storage(coord, BrokenStorage())
    with pytest.raises(MigrationError):
        migrator.migrate_with_checkpoint(bad, coord.request_migration("j", 1))
    assert bad.calls == ["prepare", "cancel"]


def test_carry_out_unregister_plans_with_mocks():
    coord = MultiGpuBuilder().build()
    for i in range(3):
        coord.register_device(DeviceInfo(i, f"GPU {i}", Backend.CUDA))
    kernels = {f"k{i}": MockCheckpointableKernel(f"k{i}", 100) for i in range(4)}
    for kid in kernels:
        coord.assign_kernel(kid, 0)
    kernels["k2"] = FailingKernel("k2", 100)
    result = coord.unregister_device(0)
    outcomes = KernelMigrator(coord).carry_out(result, kernels)
    assert [o.plan.kernel_id for o in outcomes] == ["k0", "k1", "k2", "k3"]
    assert [o.ok for o in outcomes] == [True, True, False, True]
    assert isinstance(outcomes[2].error, MigrationError)
    assert {o.plan.target_device for o in outcomes} == {1, 2}
    with pytest.raises(TypeError):
        KernelMigrator(coord).carry_out("nope", kernels)


class ReloadableMock(MockCheckpointableKernel):
    def __init__(self, *a, ready_after: float = 0.0, fail_apply: int = 0):
        super().__init__(*a)
        self.calls, self.code = [], None
        self.ready_at = time.monotonic() + ready_after
        self.fail_apply = fail_apply

    def prepare_for_reload(self):
        self.calls.append("prepare")

    def apply_code(self, code):
        if self.fail_apply:
            self.fail_apply -= 1
            raise MemoryError("transient: out of memory while swapping")
        self.calls.append(("apply", code.version_id))
        self.code = code

    def resume_after_reload(self):
        self.calls.append("resume")

    def is_ready_for_reload(self):
        return time.monotonic() >= self.ready_at


def test_reloadable_mock_gets_the_trait_calls_and_history():
    manager = HotReloadManager.with_defaults()
    manager.register_kernel("k", KernelCodeSource.from_wgsl("@compute fn main() {}", "main"))
    k = ReloadableMock("k", 32)
    assert isinstance(k, HotReloadableKernel)
    versions = []
    for i in range(3):
        r = manager.execute_reload(manager.request_reload("k", KernelCodeSource.from_wgsl(f"fn v{i}() {{}}", "main")),
                                   k)
        versions.append(r.new_version)
    assert k.calls[:3] == ["prepare", ("apply", versions[0]), "resume"]
    assert [c.version_id for c in manager.history("k")] == [1] + versions[:2]
    back = manager.rollback("k", 3, kernel=k)
    assert back.version_id == 1 and manager.get_current_version("k") == 1 and k.code.version_id == 1
    assert manager.stats().rollbacks == 1
    with pytest.raises(KernelValidationError, match="No fallback"):
        manager.rollback("k")


def test_history_is_bounded_and_off_without_fallback():
    manager = HotReloadManager(HotReloadConfig().with_max_rule_history(2))
    manager.register_kernel("k", KernelCodeSource.from_ptx(".version 7.0", "k"))
    mock = MockCheckpointableKernel("k", 8)
    for i in range(4):
        manager.execute_reload(manager.request_reload("k", KernelCodeSource.from_ptx(f".version {8 + i}.0", "k")),
                               mock)
    assert [c.as_str() for c in manager.history("k")] == [".version 9.0", ".version 10.0"]
    assert manager.rollback("k", 2).as_str() == ".version 9.0"
    plain = HotReloadManager(HotReloadConfig().with_keep_fallback(False))
    plain.register_kernel("k", KernelCodeSource.from_ptx(".version 7.0", "k"))
    plain.execute_reload(plain.request_reload("k", KernelCodeSource.from_ptx(".version 8.0", "k")), mock)
    with pytest.raises(KernelValidationError, match="No fallback"):
        plain.rollback("k")


@pytest.mark.parametrize("code,match", [
    (KernelCodeSource.from_ptx("kernel: ret;", "k"), "PTX code missing"),
    (KernelCodeSource.from_wgsl("struct S {}", "main"), "WGSL code missing"),
    (KernelCodeSource.from_msl("void f() {}", "f"), "MSL code missing"),
    (KernelCodeSource.from_ptx("", "k"), "empty"),
    (KernelCodeSource.from_ptx(".version 7.0", ""), "Entry point is empty"),
    (KernelCodeSource.from_spirv(b"\x00" * 20, "main"), "magic"),
    (KernelCodeSource.from_spirv(b"\x03\x02\x23\x07" * 3, "main"), "header"),
])
def test_validation_failure_sets_failed_and_counts(code, match):
    manager = HotReloadManager.with_defaults()
    manager.register_kernel("k", KernelCodeSource.from_ptx(".version 7.0", "k"))
    request = manager.request_reload("k", code)
    with pytest.raises(KernelValidationError, match=match):
        manager.execute_reload(request, MockCheckpointableKernel("k", 8))
    assert request.is_failed() and request.state is HotReloadState.FAILED and request.error
    assert manager.stats().failed_reloads == 1 and manager.stats().successful_reloads == 0
    assert manager.get_current_code("k").as_str() == ".version 7.0"
    assert not manager.is_reload_in_progress("k")


def test_timeout_is_enforced_for_a_kernel_that_never_drains():
    manager = HotReloadManager(HotReloadConfig().with_timeout(0.2))
    manager.register_kernel("k", KernelCodeSource.from_ptx(".version 7.0", "k"))
    k = ReloadableMock("k", 8, ready_after=60)
    request = manager.request_reload("k", KernelCodeSource.from_ptx(".version 8.0", "k"))
    t = time.monotonic()
    with pytest.raises(VkmTimeout, match="reload_timeout"):
        manager.execute_reload(request, k)
    assert time.monotonic() - t < 2
    assert request.is_failed() and manager.stats().failed_reloads == 1
    assert k.calls == ["prepare", "resume"] and manager.get_current_version("k") == 1


def test_transient_failures_are_retried_with_backoff():
    manager = HotReloadManager(HotReloadConfig().with_max_retries(3).with_retry_backoff(0.05))
    manager.register_kernel("k", KernelCodeSource.from_ptx(".version 7.0", "k"))
    k = ReloadableMock("k", 8, fail_apply=2)
    request = manager.request_reload("k", KernelCodeSource.from_ptx(".version 8.0", "k"))
    t = time.monotonic()
    result = manager.execute_reload(request, k)
    assert time.monotonic() - t >= 0.05 + 0.1   # backoff 0.05, then 0.1
    assert request.retry_count == 2 and result.attempts == 3 and request.is_completed()
    k2 = ReloadableMock("k", 8, fail_apply=5)
    r2 = manager.request_reload("k", KernelCodeSource.from_ptx(".version 9.0", "k"))
    with pytest.raises(MemoryError):
        manager.execute_reload(r2, k2)
    assert r2.retry_count == 3 and r2.is_failed() and manager.stats().failed_reloads == 1


def test_reload_of_unknown_or_busy_kernels_and_bad_arguments():
    manager = HotReloadManager.with_defaults()
    with pytest.raises(KernelNotFoundError):
        manager.request_reload("nope", KernelCodeSource.from_ptx(".version 7.0", "k"))
    manager.register_kernel("k", KernelCodeSource.from_ptx(".version 7.0", "k"))
    with pytest.raises(TypeError):
        manager.request_reload("k", ".version 8.0")
    with pytest.raises(TypeError):
        manager.register_kernel(5, KernelCodeSource.from_ptx(".version 7.0", "k"))
    with pytest.raises(TypeError):
        manager.execute_reload("req", MockCheckpointableKernel("k", 8))
    with pytest.raises(TypeError):
        manager.execute_reload(manager.request_reload("k", KernelCodeSource.from_ptx(".version 8", "k")), object())
    with pytest.raises(ValueError):
        HotReloadConfig(reload_timeout=-1)
    with pytest.raises(TypeError):
        HotReloadConfig(enabled="yes")
    manager.unregister_kernel("k")
    assert not manager.is_registered("k")


def test_code_source_hash_is_sha256_and_versions_copy():
    import hashlib
    code = KernelCodeSource.from_ptx(".version 7.0", "k")
    assert code.hash == hashlib.sha256(b".version 7.0").digest()
    v = code.with_version(7).with_metadata("by", "test")
    assert (v.version_id, v.metadata, code.version_id, code.metadata) == (7, {"by": "test"}, 0, {})
    assert KernelCodeSource.from_spirv(b"\x03\x02\x23\x07" * 5).as_str() is None
    with pytest.raises(ValueError):
        KernelCodeSource(KernelCodeFormat.PTX, b"x", "k", hash=b"0" * 32)
    with pytest.raises(TypeError):
        KernelCodeSource.from_ptx(b".version", "k")
    assert issubclass(KernelValidationError, VkmError)


def test_execute_reload_checks_neither_enabled_nor_registration_as_the_seed():
    """Seed: execute_reload reads old_version 0 for an id not registered and does not
    check `enabled` (request_reload does). Before: KernelNotFoundError and
    KernelValidationError('Hot reload is disabled'). The id is registered with the new
    code once the reload succeeds; rollback of an id never registered is the seed's
    ValidationError('No fallback available'), not KernelNotFoundError."""
    manager = HotReloadManager(HotReloadConfig().with_enabled(False))
    mock = MockCheckpointableKernel("k", 8)
    with pytest.raises(KernelValidationError, match="No fallback available"):
        manager.rollback("k")
    code = KernelCodeSource.from_ptx(".version 8.0", "k").with_version(5)
    result = manager.execute_reload(HotReloadRequest(KernelId("k"), code), mock)
    assert (result.old_version, result.new_version) == (0, 5) and result.state_preserved
    assert manager.is_registered("k") and manager.get_current_code("k") is code and manager.history("k") == []
    with pytest.raises(KernelValidationError, match="disabled"):   # making a request stays gated
        manager.request_reload("k", code)
    with pytest.raises(KernelValidationError, match="No fallback available"):
        manager.rollback("k")
    failing = HotReloadManager.with_defaults()
    bad = KernelCodeSource.from_ptx("no header", "k")
    with pytest.raises(KernelValidationError):
        failing.execute_reload(HotReloadRequest(KernelId("x"), bad), mock)
    assert not failing.is_registered("x")   # a failed reload registers nothing


def test_migration_stats_have_the_seeds_microsecond_counters():
    stats = MigrationStats()
    stats.add(checkpoint_time=0.0015, restore_time=0.25)
    stats.add(checkpoint_time=0.001)
    assert (stats.checkpoint_time_us, stats.restore_time_us) == (2500, 250000)


def test_reloads_of_an_id_not_registered_run_one_at_a_time():
    """Two execute_reloads of one id not registered share its pending entry: the second,
    while the first drains, is 'already in progress' (as for a registered id)."""
    import threading
    manager = HotReloadManager.with_defaults()
    gate = threading.Event()

    class Slow(ReloadableMock):
        def is_ready_for_reload(self):
            return gate.is_set()
    first = Slow("k", 8)
    out = []
    t = threading.Thread(target=lambda: out.append(manager.execute_reload(
        HotReloadRequest(KernelId("k"), KernelCodeSource.from_ptx(".version 8.0", "k").with_version(3)), first)))
    t.start()
    try:
        deadline = time.monotonic() + 10
        while "prepare" not in first.calls and time.monotonic() < deadline:
            time.sleep(0.001)
        with pytest.raises(KernelValidationError, match="already in progress"):
            manager.execute_reload(HotReloadRequest(KernelId("k"), KernelCodeSource.from_ptx(".version 9.0", "k")),
                                   ReloadableMock("k", 8))
        assert not manager.is_registered("k")
    finally:
        gate.set()
        t.join(10)
    assert out[0].old_version == 0 and manager.get_current_version("k") == 3


def test_reload_registry_races():
    """A reload that ends after unregister_kernel does not register the id again; a bad
    kernel argument leaves no pending entry; register_kernel during a reload of an id
    not registered takes over its entry (one reload at a time, the registry says what
    the kernel runs); is_reload_in_progress sees a reload of an id not registered."""
    import threading

    def code(v):
        return KernelCodeSource.from_ptx(f".version {v}.0", "k")

    manager = HotReloadManager.with_defaults()
    manager.register_kernel("k", code(7))
    gate = threading.Event()

    class Slow(ReloadableMock):
        def is_ready_for_reload(self):
            return gate.is_set()

    def during(run, *checks):
        kernel = Slow("k", 8)
        out = []
        t = threading.Thread(target=lambda: out.append(run(kernel)))
        t.start()
        try:
            deadline = time.monotonic() + 10
            while "prepare" not in kernel.calls and time.monotonic() < deadline:
                time.sleep(0.001)
            for check in checks:
                check()
        finally:
            gate.set()
            t.join(10)
            gate.clear()
        return out[0]

    during(lambda k: manager.reload(k, code(8), "k"), lambda: manager.unregister_kernel("k"))
    assert not manager.is_registered("k")
    with pytest.raises(TypeError):
        manager.execute_reload(HotReloadRequest(KernelId("x"), code(8)), object())
    assert not manager.is_reload_in_progress("x") and manager.list_kernels() == []

    def register_then_race():
        assert manager.is_reload_in_progress("y")
        manager.register_kernel("y", code(7))
        with pytest.raises(KernelValidationError, match="already in progress"):
            manager.execute_reload(HotReloadRequest(KernelId("y"), code(9)), ReloadableMock("y", 8))
    result = during(lambda k: manager.execute_reload(HotReloadRequest(KernelId("y"), code(8).with_version(50)), k),
                    register_then_race)
    assert result.old_version == 0 and manager.get_current_version("y") == 50
    assert [c.as_str() for c in manager.history("y")] == [".version 7.0"]
