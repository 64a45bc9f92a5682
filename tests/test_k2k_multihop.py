"""Multi-hop forwarding on three devices: the virtual pair plus a third lavapipe
device, in a subprocess (the session's loader already lists two). A topology
0 -NVLink- 1 -PCIe- 2 with no P2P between 0 and 2 forces every 0 <-> 2 message
through device 1, hop by hop (k2k_three_devices.py does the work)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.virtual


@pytest.fixture(scope="module")
def seen():
    env = {k: v for k, v in os.environ.items() if k not in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")}
    script = Path(__file__).with_name("k2k_three_devices.py")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])   # (an editable install may log a rebuild first)


def test_three_devices_and_no_validation_errors(seen):
    assert seen["devices"] == 3 and seen["validation_errors"] == []


def test_messages_are_forwarded_hop_by_hop_exactly_once_in_order(seen):
    assert seen["decision_a_c"] == {"kind": "MULTI_HOP", "path": [0, 1, 2], "total_hops": 2}
    assert seen["decision_2_0"] == {"kind": "MULTI_HOP", "path": [2, 1, 0]}
    c, f, m = seen["c"], seen["f"], seen["m"]
    assert (c["count"], c["sum"], c["fifo_errors"]) == (35, seen["expected_c_sum"], 0)   # 30 forwarded + 5 routed
    assert (f["count"], f["sum"], f["fifo_errors"]) == (30, seen["expected_f_sum"], 0)   # 2 -> 1 -> 0
    assert (m["count"], m["sum"], m["fifo_errors"]) == (30, seen["expected_m_sum"], 0)   # 0 -> 1, one hop
    assert (c["hops_sum"], c["max_hops"]) == (70, 2) and (f["hops_sum"], f["max_hops"]) == (60, 2)
    assert (m["hops_sum"], m["max_hops"]) == (30, 1)
    assert seen["stats"] == {"routed": 95, "pending": 0, "failures": 0}
    assert seen["edges"] == ["0->1", "1->0", "1->2", "2->1"]          # never 0 <-> 2 directly


def test_a_relay_device_without_kernels_forwards(seen):
    c = seen["relay_c"]
    assert (c["count"], c["sum"], c["fifo_errors"], c["hops_sum"]) == (20, 210, 0, 40)
    assert "0->1" in seen["relay_edges"] and "1->2" in seen["relay_edges"]


def test_host_mediated_pairs_go_through_the_host(seen):
    assert seen["host_decision"] == {"kind": "HOST_MEDIATED", "source": 0, "dest": 2}
    c = seen["host_c"]
    assert (c["count"], c["sum"], c["fifo_errors"], c["max_hops"]) == (11, 62, 0, 2)   # the seed counts 2 hops
    assert seen["host_method"] in ("host_shared", "staging_copy")


def test_stencil_over_three_devices_matches_numpy(seen):
    assert seen["stencil_identical"] == {"[0]": True, "[0, 1, 2]": True, "[0, 2, 1]": True,
                                         "[2, 0, 1, 2, 0]": True}
