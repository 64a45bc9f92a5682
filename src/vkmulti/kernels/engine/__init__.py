"""One device's share of the kernel runtime: kernels, the device context, command recording,
the stepper and its harvest, the step gate."""
from .gate import RuntimeGate, gate_of, gated, gated_unheld
from .gpu_jobs import GpuJobs
from .harvest import StepHarvest
from .kernel import Batch, CodeSwapper, Kernel, OutboxBatch, InboundBatch
from .stats import KernelStats
from .spec import KernelSpec
from .spirv import SPIRV_MAGIC, SpirvModule, SpirvBinding, reflect, check_kernel_abi, run_spirv_val, spirv_env_for_api

__all__ = ["RuntimeGate", "gate_of", "gated", "gated_unheld", "GpuJobs", "StepHarvest", "Batch", "CodeSwapper",
           "KernelSpec", "Kernel", "KernelStats", "OutboxBatch", "InboundBatch", "SPIRV_MAGIC", "SpirvModule",
           "SpirvBinding", "reflect", "check_kernel_abi", "run_spirv_val", "spirv_env_for_api"]
