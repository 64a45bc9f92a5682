"""Operations on runtime kernels: checkpoints, live migration, restore, the CRC check,
the replay log and the failover of a lost GPU's kernels."""
from .crc import CHOICES, check_choice, crc_engine
from .crc_math import zero_tables, shift, crc32_finish, crc32_combine, raw_crc
from .failover import RuntimeFailover
from .gpu_crc import GpuCrc, CrcJob, crc32_finish, check_ranges, LANES
from .host_crc import HostCrc, HostCrcJob, PIECE_BYTES, crc32
from .image import SPIRV_CHUNK, INBOX_CHUNK, KernelImage, to_checkpoint, from_checkpoint, local_size
from .lifecycle import KernelLifecycle, CheckpointPolicy, gated_step, SPIRV_CHUNK, INBOX_CHUNK
from .live_migration import migrate_live, build_twin, destroy_engines
from .migrator import KernelMigrator, MigrationResult, MigrationStats, MigrationStatsSnapshot, PlanOutcome
from .policy import CheckpointPolicy
from .protocols import (CheckpointableKernel, MigratableKernel, HotReloadableKernel, supports_incremental,
                        create_incremental_checkpoint)
from .replay import restore_lost_kernels, RECOVERY_TIMEOUT
from .replay_log import ReplayLog, KernelLog
from .restore import restore_into, restore_new

__all__ = ["CHOICES", "check_choice", "crc_engine", "zero_tables", "shift", "crc32_finish", "crc32_combine",
           "raw_crc", "RuntimeFailover", "GpuCrc", "CrcJob", "check_ranges", "LANES", "HostCrc", "HostCrcJob",
           "PIECE_BYTES", "crc32", "SPIRV_CHUNK", "INBOX_CHUNK", "KernelImage", "to_checkpoint", "from_checkpoint",
           "local_size", "KernelLifecycle", "CheckpointPolicy", "gated_step", "migrate_live", "build_twin",
           "destroy_engines", "KernelMigrator", "MigrationResult", "MigrationStats", "MigrationStatsSnapshot",
           "PlanOutcome", "CheckpointableKernel", "MigratableKernel", "HotReloadableKernel", "supports_incremental",
           "create_incremental_checkpoint", "restore_lost_kernels", "RECOVERY_TIMEOUT", "ReplayLog", "KernelLog",
           "restore_into", "restore_new"]
