"""vkmulti across machines, on Ray: one node agent per node, two-level placement by measured cost.

Optional extra: ``pip install 'vkmulti[cluster]'`` (Ray). Importing this
package does not need Ray; using it does (RayMissingError says how to get it).

    from vkmulti.cluster import ClusterManager
    with ClusterManager.connect("HEAD:6379") as cm:      # or "auto": a local Ray
        frame = cm.render_frame(srus, 1280, 720)         # frame.pixels: (720, 1280, 8) RGBA16F

Nodes offer their Vulkan GPUs as the custom resource ``vk_gpu`` (see
connection.py); see docs/explanation/cluster.md for the cost model and measured overheads.
"""
from .agent import NodeAgent
from .connection import VK_GPU, Connection, RayAddress, connect, node_resources, parse_address, require_ray, \
    vk_gpu_count
from .errors import (ClusterAddressError, ClusterConnectionError, ClusterError, NoAgentError, RayMissingError)
from .frames import ClusterFrame, NodeFrameReport
from .manager import ClusterManager
from .planner import LinkInfo, NodeInfo, NodePlan, composite_frame, plan_nodes, sru_image_bytes
from .stencil import StencilSlab, split_rows_weighted
from .stencil_run import StencilRun

__all__ = [
    "ClusterManager", "ClusterFrame", "NodeFrameReport", "NodeAgent",
    "connect", "Connection", "RayAddress", "parse_address", "require_ray", "vk_gpu_count", "node_resources",
    "VK_GPU", "LinkInfo", "NodeInfo", "NodePlan", "plan_nodes", "composite_frame", "sru_image_bytes",
    "StencilRun", "StencilSlab", "split_rows_weighted",
    "ClusterError", "RayMissingError", "ClusterAddressError", "ClusterConnectionError", "NoAgentError",
]
