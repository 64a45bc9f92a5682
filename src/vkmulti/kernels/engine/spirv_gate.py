"""The SPIR-V gate: every kernel module passes SPIRV-Tools' validator
(`spirv-val`, for the Vulkan target environment the device takes) and the
kernel ABI's checks before a driver sees it, whichever path it came by
(launch, restore, migration, hot reload, rollback). A driver is not a
validator: malformed SPIR-V can crash it in vkCreateComputePipelines.

The validator is required, never skipped: where it is missing the gate
raises UnsupportedError saying what to install. Its verdict is cached per
module digest and target environment, so a step, a migration or a relaunch
of the same code never pays for it twice. The validator process is bounded
in time (killed past its timeout) and in output (only its first 64 KiB are
read).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from typing import Any

import vulkan as vk

from ...errors import KernelValidationError, UnsupportedError
from ...errors import TimeoutError as VkmTimeout
from .spirv import MAX_MODULE_BYTES, check_kernel_abi, reflect, spirv_env_for_api

__all__ = ["SpirvGate", "SPIRV_GATE", "validate_kernel_spirv", "target_env_of", "MAX_MODULE_BYTES",
           "VALIDATOR_TIMEOUT"]

#: Seconds the validator may run on one module unless the caller gives less.
VALIDATOR_TIMEOUT = 30.0
#: Bytes of the validator's output that are read.
_MAX_OUTPUT = 64 << 10
#: Verdicts kept (least recently used go first).
_MAX_VERDICTS = 4096
_INSTALL = "install SPIRV-Tools (Debian/Ubuntu: apt-get install spirv-tools), which provides spirv-val"


def target_env_of(slot: Any) -> str:
    """spirv-val's target environment (vulkan1.0 .. vulkan1.3) for the device of `slot`."""
    props = vk.vkGetPhysicalDeviceProperties(slot.physical_device)
    return spirv_env_for_api(int(props.apiVersion))


class SpirvGate:
    """Validates SPIR-V modules with spirv-val and remembers each verdict by
    (SHA-256 of the module, target environment); thread-safe. Timeouts and a
    missing validator are not verdicts: they are not remembered."""

    def __init__(self, executable: str = "spirv-val", max_verdicts: int = _MAX_VERDICTS):
        self._executable = executable
        self._max = max_verdicts
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[tuple[bytes, str], str | None] = OrderedDict()   # None: passed
        self.runs = 0   # validator processes started (a figure for tests and benches)

    def validator(self) -> str:
        """The validator's path; UnsupportedError when it is not installed."""
        exe = shutil.which(self._executable)
        if exe is None:
            raise UnsupportedError(f"{self._executable} is not on PATH: vkmulti validates every SPIR-V kernel with "
                                   f"it before a driver sees the module (malformed SPIR-V can crash a driver); "
                                   f"{_INSTALL}", extension="spirv-val")
        return exe

    def _verdict(self, key: tuple[bytes, str]) -> tuple[bool, str | None]:
        with self._lock:
            if key not in self._verdicts:
                return False, None
            self._verdicts.move_to_end(key)
            return True, self._verdicts[key]

    def _remember(self, key: tuple[bytes, str], verdict: str | None) -> None:
        with self._lock:
            self._verdicts[key] = verdict
            self._verdicts.move_to_end(key)
            while len(self._verdicts) > self._max:
                self._verdicts.popitem(last=False)

    def check(self, code: bytes, target_env: str, timeout: float | None = None, label: str = "SPIR-V") -> None:
        """KernelValidationError with the validator's message unless `code` is valid
        SPIR-V for `target_env`; vkmulti.TimeoutError past `timeout` s (default
        VALIDATOR_TIMEOUT); UnsupportedError where spirv-val is missing."""
        if len(code) > MAX_MODULE_BYTES:
            raise KernelValidationError(f"{label} is {len(code)} bytes; the largest module taken is "
                                        f"{MAX_MODULE_BYTES} bytes")
        key = (hashlib.sha256(code).digest(), target_env)
        known, verdict = self._verdict(key)
        if not known:
            reflect(code, label)   # header and instruction stream first: cheap, and no process for junk
            verdict = self._run(code, target_env, VALIDATOR_TIMEOUT if timeout is None else timeout)
            self._remember(key, verdict)
        if verdict is not None:
            raise KernelValidationError(f"{label} fails spirv-val ({target_env}): {verdict}")

    def _run(self, code: bytes, target_env: str, timeout: float) -> str | None:
        """Run the validator once: None when it passes, its (shortened) message when not."""
        exe = self.validator()
        if timeout <= 0:
            raise VkmTimeout("no time was left to validate the SPIR-V module (spirv-val)")
        with tempfile.TemporaryDirectory(prefix="vkmulti-spv-") as tmp:
            path = os.path.join(tmp, "module.spv")
            with open(path, "wb") as f:
                f.write(code)
            with open(os.path.join(tmp, "out.txt"), "w+b") as out:
                with self._lock:
                    self.runs += 1
                proc = subprocess.Popen([exe, "--target-env", target_env, path], stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT)
                try:
                    rc = _wait(proc, timeout)
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                if rc is None:
                    raise VkmTimeout(f"spirv-val did not finish within {timeout:.3g} s on a {len(code)}-byte "
                                     f"module")
                out.seek(0)
                text = out.read(_MAX_OUTPUT).decode("utf-8", "replace")
        if rc == 0:
            return None
        text = text.replace(path, "the module").strip()
        if rc < 0:
            return f"the validator was killed by signal {-rc}" + (f": {text[:600]}" if text else "")
        return text[:600] or f"exit status {rc}"

    def check_kernel(self, code: bytes, entry_point: str, n_state: int, push_bytes: int, target_env: str,
                     timeout: float | None = None, label: str = "SPIR-V") -> None:
        """`check`, and the kernel ABI's checks (see validate_kernel_spirv), both remembered."""
        entry = entry_point if len(entry_point) <= 256 else hashlib.sha256(
            entry_point.encode("utf-8", "surrogatepass")).hexdigest()   # (a huge name is not kept as a key)
        key = (hashlib.sha256(code).digest(), f"{target_env}/{len(entry_point)}:{entry}/{n_state}/{push_bytes}")
        known, verdict = self._verdict(key)
        if known:
            if verdict is not None:
                raise KernelValidationError(verdict)
            return
        try:
            check_kernel_abi(reflect(code, label), entry_point, n_state, push_bytes, label)
            self.check(code, target_env, timeout, label)
        except KernelValidationError as exc:
            self._remember(key, str(exc))
            raise
        self._remember(key, None)

    def clear(self) -> None:
        """Forget every verdict."""
        with self._lock:
            self._verdicts.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._verdicts)


def _wait(proc: subprocess.Popen, timeout: float) -> int | None:
    """The exit status of `proc`, or None once `timeout` s passed; waits in short
    slices so a KeyboardInterrupt gets through (the caller kills the process)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return proc.poll()
        try:
            return proc.wait(min(left, 0.1))
        except subprocess.TimeoutExpired:
            continue


#: The process-wide gate (one cache of verdicts for every runtime and reload).
SPIRV_GATE = SpirvGate()


def validate_kernel_spirv(code: bytes, entry_point: str, n_state: int, push_bytes: int, target_env: str, *,
                          timeout: float | None = None, label: str = "SPIR-V",
                          gate: SpirvGate | None = None) -> None:
    """The whole gate for a kernel module: the ABI's checks (GLCompute entry point
    `entry_point`, bindings of `n_state` state buffers, push constants of at most
    `push_bytes`) and spirv-val for `target_env`, each verdict remembered.
    KernelValidationError when it fails, UnsupportedError where spirv-val is
    missing, vkmulti.TimeoutError past `timeout` s."""
    if not isinstance(code, (bytes, bytearray)):
        raise TypeError(f"{label} must be bytes, got {type(code).__name__}")
    (SPIRV_GATE if gate is None else gate).check_kernel(bytes(code), entry_point, n_state, push_bytes,
                                                        target_env, timeout, label)
