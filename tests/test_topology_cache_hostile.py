"""A hostile topology cache (issue 23, M): probe_topology() reads only a regular file,
never through a link, sized before it is read; whatever else is there (a FIFO,
a link to /dev/zero, deeply nested JSON, a matrix of 100,000 devices, a
topology of 5 devices for a 2-device manager) is ignored with one warning and
the topology is measured anew."""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import pytest

from vkmulti import probe_topology
from vkmulti.kernels.coordinator import probe

PROBE = {"nbytes": 1 << 16, "reps": 1}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv(probe.CACHE_ENV, str(d))
    return d


def _true_doc(manager) -> tuple[Path, dict]:
    topo = probe_topology(manager, force=True, **PROBE)
    path = Path(topo.details["cache_file"])
    return path, json.loads(path.read_text())


def _five_devices(doc: dict) -> None:
    t = doc["topology"]
    t["device_count"] = 5
    t["numa_nodes"] = [None] * 5


def _huge(doc: dict) -> None:
    doc["topology"]["device_count"] = 100000


def _write(path: Path, how: str, doc: dict) -> None:
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    elif how == "dev-zero":
        path.symlink_to("/dev/zero")
    elif how == "link-to-true":
        real = path.with_name("elsewhere.json")
        real.write_text(json.dumps(doc))
        path.symlink_to(real)
    elif how == "nested":
        path.write_text('{"format": 1, "key": ' + "[" * 200000 + "]" * 200000 + "}")
    elif how == "too-big":
        with open(path, "wb") as f:
            f.truncate(probe.MAX_CACHE_BYTES + 1)   # sparse: costs no disk
    else:
        {"five-devices": _five_devices, "huge": _huge}[how](doc)
        path.write_text(json.dumps(doc))


CASES = ["fifo", "dev-zero", "link-to-true", "nested", "too-big", "five-devices", "huge"]


@pytest.mark.parametrize("how", CASES)
def test_a_hostile_cache_is_ignored_with_one_warning(manager, cache_dir, caplog, how):
    """Before: the FIFO hung probe_topology(), nested JSON raised RecursionError, the link
    to /dev/zero and the 100,000-device matrix raised MemoryError, the 5-device
    topology was returned for the 2-device manager."""
    path, doc = _true_doc(manager)
    _write(path, how, doc)
    out: list = []
    caplog.set_level(logging.WARNING, logger=probe.__name__)
    t = threading.Thread(target=lambda: out.append(probe_topology(manager, **PROBE)), daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "probe_topology() hangs on the cache"
    topo = out[0]
    assert topo.device_count == 2 and topo.details["source"] == "measured"
    warnings = [r for r in caplog.records if r.name == probe.__name__ and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "topology cache" in warnings[0].getMessage(), warnings
    # the measured topology replaced the entry (a link or FIFO itself, never what it pointed at)
    assert path.is_file() and not path.is_symlink()
    again = probe_topology(manager, **PROBE)
    assert again.details["source"] == "cache" and again.device_count == 2


def test_a_true_cache_is_still_read(manager, cache_dir, caplog):
    _true_doc(manager)
    caplog.set_level(logging.WARNING, logger=probe.__name__)
    assert probe_topology(manager, **PROBE).details["source"] == "cache"
    assert not [r for r in caplog.records if r.name == probe.__name__]


def test_a_cache_that_cannot_be_replaced_leaves_no_temporary_file(manager, cache_dir, caplog):
    """A folder where the cache file goes: the measurement is returned, one warning, and
    the temporary file written for it is removed (it was left behind on every probe)."""
    path = Path(probe.cache_path(manager))
    path.mkdir(parents=True)
    caplog.set_level(logging.WARNING, logger=probe.__name__)
    for _ in range(2):
        topo = probe_topology(manager, **PROBE)
        assert topo.details["source"] == "measured" and topo.details["cache_file"] is None
    assert sorted(p.name for p in cache_dir.iterdir()) == [path.name]
