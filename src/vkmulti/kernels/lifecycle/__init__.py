"""Operations on runtime kernels: checkpoints, live migration, restore, the CRC check,
the replay log and the failover of a lost GPU's kernels."""
from .failover import Failover
from .gpu_crc import GpuCrc, CrcJob, zero_tables, shift, crc32_finish, crc32_combine, raw_crc, check_ranges, LANES
from .host_crc import HostCrc, HostCrcJob, PIECE_BYTES, crc32
from .image import SPIRV_CHUNK, INBOX_CHUNK, KernelImage, to_checkpoint, from_checkpoint, local_size
from .lifecycle import Lifecycle, CheckpointPolicy, CHOICES, check_choice, SPIRV_CHUNK, INBOX_CHUNK
from .live_migration import migrate_live, switch_at_step_boundary
from .migrator import KernelMigrator, MigrationResult, MigrationStats, MigrationStatsSnapshot, PlanOutcome
from .policy import CheckpointPolicy, PolicyState
from .protocols import (CheckpointableKernel, MigratableKernel, HotReloadableKernel, supports_incremental,
                        create_incremental_checkpoint)
from .replay import restore_lost_kernels, RECOVERY_TIMEOUT
from .replay_log import ReplayLog, KernelLog
from .restore import restore_into, restore_new
from .ready_twins import ReadyTwins
from .twin import MigrationPool, MoveEngines, Retired, Twin, build_twin

__all__ = ["CHOICES", "check_choice", "zero_tables", "shift", "crc32_finish", "crc32_combine",
           "raw_crc", "Failover", "GpuCrc", "CrcJob", "check_ranges", "LANES", "HostCrc", "HostCrcJob",
           "PIECE_BYTES", "crc32", "SPIRV_CHUNK", "INBOX_CHUNK", "KernelImage", "to_checkpoint", "from_checkpoint",
           "local_size", "Lifecycle", "CheckpointPolicy", "PolicyState", "migrate_live", "switch_at_step_boundary",
           "build_twin", "MigrationPool", "MoveEngines", "Retired", "Twin", "KernelMigrator", "MigrationResult",
           "MigrationStats", "MigrationStatsSnapshot", "PlanOutcome", "CheckpointableKernel", "MigratableKernel",
           "HotReloadableKernel", "supports_incremental", "create_incremental_checkpoint", "restore_lost_kernels",
           "RECOVERY_TIMEOUT", "ReplayLog", "KernelLog", "restore_into", "restore_new", "ReadyTwins"]
