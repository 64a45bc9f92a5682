"""Errors of the cluster layer (all are VkmErrors)."""
from __future__ import annotations

from ..errors import VkmError

__all__ = ["ClusterError", "RayMissingError", "ClusterAddressError", "ClusterConnectionError", "NoAgentError"]

#: What to install for the cluster layer.
INSTALL_HINT = "pip install 'vkmulti[cluster]'"


class ClusterError(VkmError):
    """The cluster layer could not do what was asked (names the node and why)."""


class RayMissingError(ClusterError, ImportError):
    """Ray is not installed: the cluster layer is an optional extra."""

    def __init__(self, what: str = "vkmulti.cluster"):
        super().__init__(f"{what} needs Ray, which is not installed in this Python ({INSTALL_HINT})")


class ClusterAddressError(ClusterError, ValueError):
    """A Ray address that is not 'auto', HOST:PORT or ray://HOST:PORT."""


class ClusterConnectionError(ClusterError, ConnectionError):
    """Nothing answered at a Ray address, or Ray refused the connection."""


class NoAgentError(ClusterError):
    """No node of the cluster can run vkmulti work (every node was skipped or lost)."""
