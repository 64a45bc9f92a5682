"""Reading back a completed step of one device (DeviceStepper's harvest):
delivery results, batch surveys (and the router's guesses from them), the
kernels' reports, host messages for `receive`, errors for the senders."""
from __future__ import annotations

import logging
from typing import Any

from .device_context import MAX_LOCAL_KERNELS, SURVEY_RECORD
from .kernel import Batch, Kernel, OutboxBatch
from .step_recorder import InFlight
from ..messages import ENVELOPE_BYTES, HOST_KERNEL_ID, RING_HEADER_BYTES, HlcTimestamp, K2KMessage, MessageEnvelope

log = logging.getLogger(__name__)

_QUIET_SURVEY = [0] * SURVEY_RECORD

__all__ = ["StepHarvest"]


class StepHarvest:
    """Reads back what one completed step of a DeviceContext did (its ctx lock held)."""

    def __init__(self, runtime: Any, ctx: Any):
        self.rt, self.ctx = runtime, ctx

    def read(self, rec: InFlight) -> None:
        """Apply the step `rec`: its surveys, delivery results and the kernels' reports."""
        status = self.ctx.status.words
        for b, off in rec.surveys:
            self._apply_survey(b, status[off:off + SURVEY_RECORD].tolist())
        directs = set(rec.directs) if rec.directs else ()   # (batch, kernel) pairs
        for b, k, off in rec.delivers:  # type: ignore[assignment]
            if b is None:
                continue
            taken, left, rejected, count = status[off:off + 4].tolist()
            if directs and (b, k) in directs:   # no survey was made: the pass's outcome stands for one
                if taken == count and not rejected:
                    b.pending = set()
                    b.count = b.local = count
                elif b.pending is None:
                    b.surveyed = False   # others' messages in it: the next step surveys it
            b.delivered += taken
            if rejected:
                b.rejected += rejected
                self._fail(b.source, f"{rejected} message(s) rejected by kernel {k.id!r} of tenant {k.tenant}: "
                                     f"a message may not cross tenants", "rejected", rejected)
            if left == 0:
                b.cleared.add(k)
                if b.pending is not None:
                    b.pending.discard(k)
        for k, j, step in rec.kernels:
            self._harvest_report(k, j, step)

    def read_reports(self, rec: InFlight) -> None:
        """Apply the kernels' reports of the step `rec` alone (host messages, counts), from
        their host-visible regions: a step of a lost device that ran to its end (drained),
        whose device is not asked any more."""
        for k, j, step in rec.kernels:
            self._harvest_report(k, j, step)

    def read_quiet(self, rec: InFlight, clocks: dict[Kernel, tuple[int, int, int]]) -> None:
        """Apply the step `rec`, a quiet one (StepRecorder.quiet_template's shape) that the
        native run found done and quiet (every survey and report word it checks read 0)
        and whose regions later steps reused: as `read` would with those words, each
        kernel's clock from `clocks` (the latest quiet step's; every kernel of the step)."""
        for b, _ in rec.surveys:
            self._apply_survey(b, _QUIET_SURVEY)
        for k, j, step in rec.kernels:
            self._report(k, j, step, [0] * 6 + list(clocks[k]))

    def _apply_survey(self, b: Batch, w: list[int]) -> None:
        """Apply a survey record (its SURVEY_RECORD words) to batch b."""
        if isinstance(b, OutboxBatch):   # what the sender's batches hold: the router's guesses
            k = b.kernel
            b.single_dest = w[14] if w[14] == w[15] and w[13] else None   # (all its messages: one kernel)
            if w[13]:
                k.dest_hint = (b.single_dest, w[13])
                k.quiet_batches = 0
            else:
                k.quiet_batches += 1
        local: set[Kernel] = set()
        gone: list[int] = []
        for j, bits in enumerate(w[:MAX_LOCAL_KERNELS // 32]):   # the mask of local slots addressed
            while bits:
                low = bits & -bits
                i = 32 * j + low.bit_length() - 1
                bits ^= low
                k = self.ctx.local[i]
                if k is not None and not k.destroyed:
                    local.add(k)
                else:
                    gone.append(i)
        if gone:
            self._fail(b.source, f"message(s) addressed to kernel(s) destroyed before delivery "
                                 f"(local slots {gone} of GPU {self.ctx.index})", "undeliverable", len(gone))
        b.count, b.remote_devices, b.remote, b.local = w[13], w[8], w[10], w[9]
        b.pending = local - b.cleared
        unknown = b.unknown = w[12]
        if unknown and b.report_unknown:
            if self.rt.lost_kernels:   # (probably) to kernels lost with their GPU: not the sender's error
                self.rt.record_dead_letters(f"{unknown} message(s) addressed to kernels that do not exist (lost "
                                            f"with their GPU: {sorted(self.rt.lost_kernels)})", unknown)
            else:
                self._fail(b.source, f"{unknown} message(s) addressed to kernels that do not exist (destroyed, or "
                                     f"never launched)", "undeliverable", unknown)
        if b.remote and not self.rt.has_router():
            devices = [i for i in range(32) if b.remote_devices >> i & 1]
            self._fail(b.source, f"{b.remote} message(s) addressed to kernels on GPU(s) {devices} and no router "
                                 f"is attached to the runtime to move them", "undeliverable", b.remote)

    def _fail(self, kernel: Kernel | None, text: str, counter: str, n: int) -> None:
        """Tell the sending kernel (its next step() raises), or count dead letters."""
        if kernel is None or kernel.destroyed:
            self.rt.record_dead_letters(text, n)
            return
        setattr(kernel.stats, counter, getattr(kernel.stats, counter) + n)
        kernel.errors.append(text)
        log.warning("kernel %r: %s", kernel.id, text)

    def _harvest_report(self, k: Kernel, j: int, step: int) -> None:
        k.region_harvested[j] = True
        base = j * k.k2h_region
        if k.injecting is not None and k.injecting[0] == step:
            items, k.injecting = k.injecting[1], None
            taken = 0 if k.destroyed else int(k.k2h.words[base // 4 + 10])
            self.rt.settle_injected(k, k.outbox_batches[j], items[:taken], items[taken:])
        if k.destroyed:
            return
        self._report(k, j, step, k.k2h.words[base // 4:base // 4 + 9].tolist())

    def _report(self, k: Kernel, j: int, step: int, words: list[int]) -> None:
        """Apply kernel k's report of `step` (the first 9 words of its K2H region `j`)."""
        k.region_harvested[j] = True
        base = j * k.k2h_region
        host, out, overflow, consumed = words[:4]
        st = k.stats
        st.steps_completed = step + 1
        st.messages_consumed += consumed
        st.messages_sent += out
        st.messages_to_host += host
        if overflow:
            st.outbox_overflow += overflow
            k.errors.append(f"step {step}: {overflow} message(s) did not fit the outbox of "
                            f"{k.spec.outbox_capacity} slots (check vkm_emit's result, keep them for the next step)")
        if host:
            raw = k.k2h.bytes[base + RING_HEADER_BYTES:base + RING_HEADER_BYTES + host * k.slot_size].tobytes()
            latest = None
            for i in range(host):
                env = MessageEnvelope.unpack(raw[i * k.slot_size:i * k.slot_size + ENVELOPE_BYTES])
                length = min(env.payload_len, k.payload_size)
                start = i * k.slot_size + ENVELOPE_BYTES
                k.received.append(K2KMessage(k.id, HOST_KERNEL_ID, raw[start:start + length], env.tag,
                                             env.sequence, env.timestamp, env.tenant, env.hops, env.priority))
                latest = env.timestamp
            if latest is not None:
                self.rt.hlc.update(latest)
        st.clock = HlcTimestamp.from_words(words[6], words[7], words[8])   # (read with the counts: the step is done)
