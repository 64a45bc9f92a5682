"""The cross-GPU K2K router and its delivery engine."""
from .delivery import DeliveryEngine
from .landing import LandingPool, Gather, align, reached, PART_ALIGN
from .peer_delivery import PeerLanding, PeerEdges, direct_guess
from .router import CrossGpuK2KRouter
from .routing import (RoutingKind, RoutingDecision, DevicePath, PendingK2KMessage, CrossGpuRouterStats,
                      CrossGpuRouterStatsSnapshot, decide_route, RouteTrees)

__all__ = ["DeliveryEngine", "LandingPool", "Gather", "align", "reached", "PART_ALIGN", "PeerLanding", "PeerEdges",
           "direct_guess", "CrossGpuK2KRouter", "RoutingKind", "RoutingDecision", "DevicePath", "PendingK2KMessage",
           "CrossGpuRouterStats", "CrossGpuRouterStatsSnapshot", "decide_route", "RouteTrees"]
