"""The seed's kernel traits on runtime kernels: `Kernel` implements
CheckpointableKernel, MigratableKernel and HotReloadableKernel through its runtime."""
from __future__ import annotations

import time
from typing import Any

__all__ = ["KernelTraits"]

_MIGRATION = "prepared for migration"
_RELOAD = "prepared for reload"


class KernelTraits:
    """Mixed into Kernel (see the module docstring)."""

    runtime: Any
    id: str
    kernel_type: str
    last_value: int
    ctx: Any
    states: list
    control: Any
    inbox: Any

    # -- CheckpointableKernel ------------------------------------------------------------

    def create_checkpoint(self) -> Any:
        """runtime.checkpoint(self)."""
        return self.runtime.checkpoint(self)

    def restore_from_checkpoint(self, checkpoint: Any) -> None:
        """runtime.restore(checkpoint, into=self): this kernel takes the checkpoint's state."""
        self.runtime.restore(checkpoint, into=self)

    def checkpoint_kernel_id(self) -> str:
        return self.id

    def checkpoint_kernel_type(self) -> str:
        return self.kernel_type

    def supports_incremental(self) -> bool:
        return True

    def create_incremental_checkpoint(self, base: Any) -> Any:
        """The chunks that changed since `base` (Checkpoint.delta_from)."""
        from ..checkpoint.format import Checkpoint

        if not isinstance(base, Checkpoint):
            raise TypeError(f"base must be a Checkpoint, got {type(base).__name__}")
        return Checkpoint.delta_from(base, self.create_checkpoint())

    # -- MigratableKernel ----------------------------------------------------------------

    def _quiesce(self, why: str, timeout: float = 60.0) -> None:
        self.runtime._hold(self, why)
        try:
            if self.last_value:
                self.runtime._wait_points([self.ctx.point(self.last_value)], timeout)
        except BaseException:
            self.runtime._release(self, why)
            raise

    def _done(self) -> bool:
        return not self.last_value or self.ctx.completed() >= self.last_value

    def prepare_for_migration(self) -> None:
        """Hold the kernel back from stepping and wait for its submitted steps."""
        self._quiesce(_MIGRATION)

    def cancel_migration(self) -> None:
        """Let it step again."""
        self.runtime._release(self, _MIGRATION)

    def is_quiescent(self) -> bool:
        """Held back and with no step in flight."""
        return self.runtime._is_held_now(self) and self._done()

    def estimated_state_size(self) -> int:
        """Bytes a migration moves: state buffers, control block and inbox."""
        return sum(s.size for s in self.states) + self.control.size + self.inbox.size

    # -- HotReloadableKernel -------------------------------------------------------------

    def prepare_for_reload(self) -> None:
        self._quiesce(_RELOAD)

    def apply_code(self, code: Any, timeout: float = 30.0) -> None:
        """Run `code` (a SPIR-V KernelCodeSource) from the next step on, state kept
        (checked, built and swapped as a hot reload does)."""
        from ..reload.swap import check_for_kernels, compile_on_devices, swap

        deadline = time.monotonic() + timeout

        def left() -> float:
            rest = deadline - time.monotonic()
            if rest <= 0:
                from ...errors import TimeoutError as VkmTimeout
                raise VkmTimeout(f"apply_code on {self.id!r} did not finish within {timeout} s")
            return rest
        check_for_kernels(code, [self], spirv_val=True, timeout=left)
        swap([self], compile_on_devices(code, [self], left), code, left)

    def resume_after_reload(self) -> None:
        self.runtime._release(self, _RELOAD)

    def is_ready_for_reload(self) -> bool:
        return self._done()
