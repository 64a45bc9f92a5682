"""The seed's kernel traits as Python protocols: CheckpointableKernel,
MigratableKernel and HotReloadableKernel (method names in snake_case, as in
ringkernel). Runtime kernels (`vkmulti.kernels.Kernel`) implement all three;
any object with these methods works with KernelMigrator and
HotReloadManager (the seed's own tests use such a mock).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..checkpoint.format import Checkpoint
    from ..reload.code_source import KernelCodeSource

__all__ = ["CheckpointableKernel", "MigratableKernel", "HotReloadableKernel", "supports_incremental",
           "create_incremental_checkpoint"]


@runtime_checkable
class CheckpointableKernel(Protocol):
    """A kernel whose state can be saved and restored. Optional (the seed's
    defaults): `supports_incremental() -> bool` (False) and
    `create_incremental_checkpoint(base)` (a full checkpoint)."""

    def create_checkpoint(self) -> "Checkpoint":
        """A checkpoint of the kernel's current state."""

    def restore_from_checkpoint(self, checkpoint: "Checkpoint") -> None:
        """Take the state of a checkpoint."""

    def checkpoint_kernel_id(self) -> str:
        """The kernel's id, for its checkpoints."""

    def checkpoint_kernel_type(self) -> str:
        """The kernel's type, for its checkpoints."""


@runtime_checkable
class MigratableKernel(CheckpointableKernel, Protocol):
    """A kernel that can be quiesced for a move to another device."""

    def prepare_for_migration(self) -> None:
        """Quiesce: stop taking work, let what is in flight land."""

    def cancel_migration(self) -> None:
        """Resume after a migration that did not happen."""

    def is_quiescent(self) -> bool:
        """Whether it is quiesced."""

    def estimated_state_size(self) -> int:
        """Bytes a migration would move."""


@runtime_checkable
class HotReloadableKernel(CheckpointableKernel, Protocol):
    """A kernel whose code can be swapped while it keeps its state."""

    def prepare_for_reload(self) -> None:
        """Pause for a code swap."""

    def apply_code(self, code: "KernelCodeSource") -> None:
        """Run `code` from now on."""

    def resume_after_reload(self) -> None:
        """Go on after the swap."""

    def is_ready_for_reload(self) -> bool:
        """Whether the code can be swapped now."""


def supports_incremental(kernel: Any) -> bool:
    """kernel.supports_incremental() where it exists, else False (the seed's default)."""
    fn = getattr(kernel, "supports_incremental", None)
    return bool(fn()) if callable(fn) else False


def create_incremental_checkpoint(kernel: Any, base: "Checkpoint") -> "Checkpoint":
    """kernel.create_incremental_checkpoint(base) where it exists, else a full checkpoint."""
    fn = getattr(kernel, "create_incremental_checkpoint", None)
    return fn(base) if callable(fn) else kernel.create_checkpoint()
