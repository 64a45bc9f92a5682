"""SRUs on one machine: the partitioner, adaptive weights, the reference renderer and compositor,
scene helpers (make_srus), SRUOffloadCoordinator and its collaborators (frame failover, the per-SRU cache)."""
from .adaptive import AdaptivePlanner, SpeedMeter
from .cache import SruCache
from .compositor import Compositor
from .coordinator import SRUOffloadCoordinator
from .failover import FrameFailover
from .partition import (SRUAssignment, assign_srus, assign_srus_array, assign_srus_reference, reference_devices,
                        makespan, seed_top_n_minus_1)
from .render import ReferenceSRU, ReferenceRenderer, SRU_IMAGE_USAGE, SRU_FORMAT
from .scenes import make_srus
from .types import OffloadRoute, RendererMissingError, SecondaryRenderContext, FrameReport, SruEntry

__all__ = ["SpeedMeter", "AdaptivePlanner", "OffloadRoute", "SRUOffloadCoordinator", "SecondaryRenderContext",
           "FrameReport", "RendererMissingError", "FrameFailover", "SruCache", "SRUAssignment", "assign_srus",
           "assign_srus_array", "assign_srus_reference", "reference_devices", "makespan", "seed_top_n_minus_1",
           "ReferenceSRU", "ReferenceRenderer", "Compositor", "SRU_IMAGE_USAGE", "SRU_FORMAT",
           "SruEntry", "make_srus"]
