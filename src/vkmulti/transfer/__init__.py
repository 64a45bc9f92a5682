"""Bytes between two devices: the methods and their selection, links and tickets, CrossDeviceTransfer,
exported and imported peer memory, device requirements, and oxigdal's InterGpuTransfer."""
from .._core.timeline import TimelinePoint
from .cross_device import CrossDeviceTransfer
from .inter_gpu import InterGpuTransfer, Gathered
from .link import TransferTicket, DEFAULT_SLOT_SIZE, DEFAULT_SLOT_COUNT
from .methods import (TransferMethod, select_transfer_method, pair_methods, pair_problem, supported_methods,
                      method_support, method_problem, MethodProblem, CudaProbe)
from .peer import ExportedBuffer, ImportedBuffer, TimelineRelay, RelayTicket, shares_memory
from .requirements import DeviceRequirements, device_requirements, FEATURE_STRUCTS, REQUIRED_FEATURES

__all__ = ["TransferMethod", "select_transfer_method", "pair_methods", "pair_problem", "CrossDeviceTransfer",
           "TransferTicket", "TimelinePoint", "DEFAULT_SLOT_SIZE", "DEFAULT_SLOT_COUNT", "InterGpuTransfer",
           "Gathered", "supported_methods", "method_support", "method_problem", "MethodProblem", "CudaProbe",
           "ExportedBuffer", "ImportedBuffer", "TimelineRelay", "RelayTicket", "shares_memory",
           "DeviceRequirements", "device_requirements", "FEATURE_STRUCTS", "REQUIRED_FEATURES"]
