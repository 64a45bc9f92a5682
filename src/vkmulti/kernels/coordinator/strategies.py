"""The load-balancing strategies of MultiGpuCoordinator (mixed into it; they
read its state under its lock). Rules and ties: see MultiGpuCoordinator."""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING

from ...errors import BackendUnavailableError, DeviceNotAvailableError, InvalidConfigError
from .config import LaunchOptions, LoadBalancingStrategy

if TYPE_CHECKING:
    from .coordinator import MultiGpuCoordinator as _Base
else:
    _Base = object

__all__ = ["StrategyMixin"]


class StrategyMixin(_Base):
    """Selection: the five built-in pickers, the custom selector and its checks."""

    def _select_locked(self) -> int:
        if not self._infos:
            raise BackendUnavailableError("No GPU devices available: no device is registered")
        if not self._candidates:
            raise BackendUnavailableError(f"No suitable GPU device available: none of the preferred devices "
                                          f"{sorted(self._preferred)} is registered ({len(self._infos)} slot(s))")
        i = self._pick()   # type: ignore[misc]
        return i if i >= 0 else self._nothing_fits_locked()

    def _pick_first_available(self) -> int:
        counts, mx = self._counts, self._max
        for i in self._live:
            if counts[i] < mx:
                return i
        return -1

    def _pick_least_loaded(self) -> int:
        counts, mx = self._counts, self._max
        best, best_load = -1, float("inf")
        if self._uniform_speed:
            for i in self._live:
                c = counts[i]
                if c < mx and c < best_load:
                    best, best_load = i, c
        else:
            speed = self._speed
            for i in self._live:
                c = counts[i]
                if c < mx and c / speed[i] < best_load:
                    best, best_load = i, c / speed[i]
        return best

    def _pick_round_robin(self) -> int:
        counts, mx = self._counts, self._max
        ready = [i for i in self._live if counts[i] < mx]
        if not ready:
            return -1
        i = ready[self._rr % len(ready)]
        self._rr += 1
        return i

    def _pick_memory(self) -> int:
        counts, mx, infos = self._counts, self._max, self._infos
        best, most = -1, -1
        for i in self._live:
            if counts[i] < mx and infos[i].available_memory > most:
                best, most = i, infos[i].available_memory
        return best

    def _pick_compute(self) -> int:
        counts, mx, infos = self._counts, self._max, self._infos
        best, top = -1, (-1, -1)
        for i in self._live:
            if counts[i] < mx:
                cc = infos[i].compute_capability or (0, 0)
                if cc > top:
                    best, top = i, cc
        return best

    def _nothing_fits_locked(self) -> int:
        """No candidate can take a kernel: the error, or (strict=False) the seed's answer."""
        if not self._strict:
            s = self._strategy
            seed = self._candidates[0] if s in (LoadBalancingStrategy.FIRST_AVAILABLE,
                                                LoadBalancingStrategy.ROUND_ROBIN) else 0
            if seed < len(self._infos) and self._registered[seed] and self._online[seed]:
                return seed
        raise DeviceNotAvailableError(f"no device can take a kernel ({self._strategy.name}): "
                                      f"{self._describe_candidates_locked()}")

    def _describe_candidates_locked(self) -> str:
        parts = []
        for i in self._candidates[:8]:
            if not self._registered[i]:
                parts.append(f"device {i} is a placeholder")
            elif not self._online[i]:
                parts.append(f"device {i} is offline")
            else:
                parts.append(f"device {i} is full ({self._counts[i]}/{self._max} kernels)")
        more = len(self._candidates) - 8
        return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")

    def _select_custom(self, options: LaunchOptions | None) -> int:
        with self._lock:
            if not self._infos:
                raise BackendUnavailableError("No GPU devices available: no device is registered")
            selector = self._selector
            if selector is None:
                if self._strict:
                    raise InvalidConfigError("load_balancing is CUSTOM but no selector is set; call "
                                             "set_custom_selector(fn) first")
                return self._nothing_fits_locked()
            statuses = self._statuses_locked()
        name = getattr(selector, "__qualname__", type(selector).__name__)
        try:
            answer = selector(statuses, options if options is not None else LaunchOptions())
        except Exception as exc:
            raise DeviceNotAvailableError(f"the custom selector {name} raised {type(exc).__name__}: {exc}") from exc
        if isinstance(answer, bool):
            raise DeviceNotAvailableError(f"the custom selector {name} returned {answer!r}, not a device index")
        try:
            idx = operator.index(answer)
        except TypeError:
            raise DeviceNotAvailableError(f"the custom selector {name} returned {type(answer).__name__} "
                                          f"{answer!r:.60}, not a device index") from None
        with self._lock:
            self._check_takes_kernel_locked(idx, f"the custom selector {name}'s answer")
        return idx

    def _check_takes_kernel_locked(self, idx: int, what: str) -> None:
        if not 0 <= idx < len(self._infos):
            raise DeviceNotAvailableError(f"{what} is device {idx}, which does not exist "
                                          f"({len(self._infos)} slot(s))")
        if not (self._registered[idx] and self._online[idx]):
            raise DeviceNotAvailableError(f"{what} is device {idx}, which is "
                                          f"{'a placeholder' if not self._registered[idx] else 'offline'}")
        if self._strict and self._counts[idx] >= self._max:
            raise DeviceNotAvailableError(f"{what} is device {idx}, which is full "
                                          f"({self._counts[idx]}/{self._max} kernels)")

    def _least_loaded_of(self, targets: list[int]) -> int:
        best, best_load = -1, float("inf")
        for i in targets:
            c = self._counts[i]
            if c < self._max and c / self._speed[i] < best_load:
                best, best_load = i, c / self._speed[i]
        return best
