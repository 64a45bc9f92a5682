"""Errors of the cluster layer (all are VkmErrors)."""
from __future__ import annotations

import re

from ..errors import VkmError

__all__ = ["ClusterError", "RayMissingError", "ClusterAddressError", "ClusterConnectionError", "NoAgentError",
           "caller_error", "short_error"]

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


def caller_error(exc: BaseException) -> BaseException | None:
    """The ValueError/TypeError an agent raised about its input (a Ray task error's cause), or None.
    Such an error is the caller's to see; it says nothing about the node's health."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, (ValueError, TypeError)) and not isinstance(cause, VkmError):
        return cause
    return None


def short_error(exc: BaseException) -> str:
    """One line for an error: a remote exception's own type and message (Ray wraps it with the
    whole remote traceback), else the first line of Ray's error."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
