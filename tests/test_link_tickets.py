"""A link asked about a ticket it never issued (or with a dst_ready value that ticket
cannot have) says so at once with a ValueError, and stays usable: such a wait
used to run to its timeout, forever with none, or return as if the job were done."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from vkmulti import Buffer
from vkmulti._core import _native

N = 4096


@pytest.fixture
def link_job(manager):
    """A native link from slot 1 to slot 0 with one finished job: (link, ticket, dst_ready, run)."""
    src, dst = manager.slot(1), manager.slot(0)
    a, b = Buffer(src, N), Buffer(dst, N)
    a.upload(np.arange(N, dtype=np.uint8))
    link = _native.Link(src.native, src.copy_queue.lock, dst.native, dst.copy_queue.lock, _native.RING_STAGING,
                        1 << 16, 2)
    ends = _native.Endpoint(buffer=a.handle_int), _native.Endpoint(buffer=b.handle_int)

    def run():
        ticket, _, dready = link.submit(*ends, N)
        link.wait(ticket, dready, 30)
        return ticket, dready
    try:
        ticket, dready = run()
        yield link, ticket, dready, run
        np.testing.assert_array_equal(b.download(), np.arange(N, dtype=np.uint8))
    finally:
        link.destroy()
        a.destroy()
        b.destroy()


def _wait_in_thread(fn, *args):
    """fn(*args) in a thread: what it raised (None if it returned); fails if it has not ended in 10 s."""
    out: list = []

    def call():
        try:
            fn(*args)
            out.append(None)
        except BaseException as exc:   # the test asserts on it
            out.append(exc)
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)}{args} still blocked after 10 s"
    return out[0]


@pytest.mark.parametrize("timeout", [None, 5.0, 0.0])
@pytest.mark.parametrize("submitted_only", [False, True])
def test_a_ticket_never_issued_is_a_value_error_at_once(link_job, timeout, submitted_only):
    link, ticket, dready, run = link_job
    for bad, value in ((ticket + 1, dready + 1), (ticket + 1000, dready + 1000), (0, 0), (0, dready)):
        exc = _wait_in_thread(link.wait, bad, value, timeout, submitted_only)
        assert isinstance(exc, ValueError), (bad, value, exc)
        assert "never issued" in str(exc)
    assert link.poll(ticket, dready, 0.0)
    run()


@pytest.mark.parametrize("timeout", [None, 5.0])
def test_a_dst_ready_the_ticket_cannot_have_is_a_value_error(link_job, timeout):
    link, ticket, dready, run = link_job
    for value in (dready + 1, 1 << 63, ticket - 1):
        exc = _wait_in_thread(link.wait, ticket, value, timeout)
        assert isinstance(exc, ValueError), (value, exc)
    with pytest.raises(ValueError, match="never issued"):
        link.poll(ticket + 1, dready + 1)
    assert link.poll(ticket, dready, 0.0)
    run()


def test_a_transfer_ticket_for_a_job_never_queued_is_a_value_error(manager):
    """The public ticket over the same link: a ValueError at once, not recorded as the
    job's outcome (the real ticket and the transfer go on working)."""
    from vkmulti import CrossDeviceTransfer, TransferTicket

    with Buffer(manager.slot(1), N) as s, Buffer(manager.slot(0), N) as d:
        with CrossDeviceTransfer(manager.slot(1), manager.slot(0), "staging_copy") as x:
            real = x.submit(src_buffer=s, dst_buffer=d)
            real.wait(30)
            bogus = TransferTicket(real._link, real.ticket + 7, real.src_done, real.dst_ready)
            for call in (bogus.wait, bogus.wait_submitted, bogus.done):
                exc = _wait_in_thread(call)
                assert isinstance(exc, ValueError) and "never issued" in str(exc), (call, exc)
            assert real.done()
            x.submit(src_buffer=s, dst_buffer=d).wait(30)
