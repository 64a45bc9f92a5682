"""Helpers for the cluster layer's errors (the error classes themselves live in vkmulti.errors)."""
from __future__ import annotations

import re

from ..errors import (INSTALL_HINT_CLUSTER as INSTALL_HINT, ClusterAddressError, ClusterConnectionError,
                      ClusterError, NoAgentError, RayMissingError, VkmError)

__all__ = ["ClusterError", "RayMissingError", "ClusterAddressError", "ClusterConnectionError", "NoAgentError",
           "caller_error", "short_error"]

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
