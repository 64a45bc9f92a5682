"""Hostile folders and outputs around the files vkmulti reads and writes.

A cache folder others can change (group- or world-writable, another user's,
or a symbolic link) is not trusted: the pipeline and topology caches in it are
neither read nor written (one warning). A pipeline cache header whose length
is not the spec's 32 bytes is refused. KernelSpec.from_file reads a bounded
regular file only. The command lines' outputs replace a link, FIFO or file at
their path instead of writing through it.
"""
from __future__ import annotations

import json
import logging
import os
import threading

import numpy as np
import pytest

from vkmulti import probe_topology
from vkmulti.kernels.coordinator import probe
from vkmulti.kernels.engine.pipeline_cache import HEADER, PipelineCacheFiles, check_header, identity_of

LOGGER = "vkmulti.kernels.engine.pipeline_cache"
PROBE = {"nbytes": 1 << 16, "reps": 1}
NOBODY = 65534


@pytest.fixture
def ident(manager):
    return identity_of(manager.slot(0).physical_device)


def blob(ident, extra=b"", size=None):
    vendor, device, uuid = ident
    return HEADER.pack(HEADER.size if size is None else size, 1, vendor, device, uuid) + extra


def _untrusted(tmp_path, how):
    """A cache folder made untrusted in the way `how` names; returns the path vkmulti is given."""
    real = tmp_path / "cache"
    real.mkdir(mode=0o700)
    if how == "world-writable":
        real.chmod(0o777)
    elif how == "group-writable":
        real.chmod(0o770)
    elif how == "other-owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give a folder to another user")
        os.chown(real, NOBODY, NOBODY)
    elif how == "link":
        link = tmp_path / "link"
        link.symlink_to(real, target_is_directory=True)
        return real, link
    return real, real


HOW = ["world-writable", "group-writable", "other-owner", "link"]


def _warnings(caplog, name):
    return [r for r in caplog.records if r.name == name and r.levelno == logging.WARNING]


@pytest.mark.parametrize("how", HOW)
def test_a_pipeline_cache_in_an_untrusted_folder_is_ignored(tmp_path, ident, caplog, how):
    """Before: a valid blob another user planted in a shared cache folder went to the driver."""
    real, given = _untrusted(tmp_path, how)
    files = PipelineCacheFiles(str(given))
    planted = blob(ident, b"\x07" * 64)
    (real / os.path.basename(files.path(ident))).write_bytes(planted)
    caplog.set_level(logging.WARNING, LOGGER)
    assert files.load(ident) is None
    assert files.load(ident) is None
    warned = _warnings(caplog, LOGGER)
    assert len(warned) == 1 and "cache folder" in warned[0].getMessage(), warned
    assert not files.save(ident, blob(ident, b"\x08" * 64))   # nor written there
    assert (real / os.path.basename(files.path(ident))).read_bytes() == planted
    assert sorted(os.listdir(real)) == [os.path.basename(files.path(ident))]


def test_a_trusted_folder_still_works_and_a_new_one_is_private(tmp_path, ident):
    files = PipelineCacheFiles(str(tmp_path / "new" / "cache"))
    data = blob(ident, b"\x01" * 32)
    assert files.save(ident, data) and files.load(ident) == data
    assert os.stat(tmp_path / "new" / "cache").st_mode & 0o777 == 0o700
    assert os.stat(files.path(ident)).st_mode & 0o077 == 0


def test_a_pipeline_cache_header_length_other_than_32_is_refused(ident):
    """Before: a header claiming 40 bytes (VkPipelineCacheHeaderVersionOne is 32) passed."""
    assert check_header(blob(ident, b"\x00" * 64), ident) is None
    for size in (HEADER.size + 1, HEADER.size + 8, 64):
        why = check_header(blob(ident, b"\x00" * 64, size=size), ident)
        assert why is not None and "header length" in why


@pytest.mark.parametrize("how", ["world-writable", "link"])
def test_a_topology_cache_in_an_untrusted_folder_is_ignored(manager, tmp_path, monkeypatch, caplog, how):
    """Before: a topology cache in a world-writable or linked folder was returned as this machine's."""
    trusted = tmp_path / "trusted"
    monkeypatch.setenv(probe.CACHE_ENV, str(trusted))
    first = probe_topology(manager, force=True, **PROBE)
    doc = json.loads(open(first.details["cache_file"]).read())
    real, given = _untrusted(tmp_path, how)
    name = os.path.basename(first.details["cache_file"])
    (real / name).write_text(json.dumps(doc))
    monkeypatch.setenv(probe.CACHE_ENV, str(given))
    caplog.set_level(logging.WARNING, logger=probe.__name__)
    topo = probe_topology(manager, **PROBE)
    assert topo.details["source"] == "measured" and topo.details["cache_file"] is None
    warned = _warnings(caplog, probe.__name__)
    assert len(warned) == 1 and "cache folder" in warned[0].getMessage(), warned
    assert sorted(os.listdir(real)) == [name]


def _unblock(path):
    """Open the FIFO at `path` for writing and close it, so a reader blocked on it returns."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    os.close(fd)


def test_kernel_spec_from_file_refuses_a_fifo_without_blocking(tmp_path):
    """Before: KernelSpec.from_file of a FIFO waited for a writer forever."""
    from vkmulti.kernels.engine.spec import KernelSpec

    fifo = tmp_path / "k.spv"
    os.mkfifo(fifo)
    out: list = []

    def load():
        try:
            KernelSpec.from_file("t", fifo)
        except Exception as exc:   # (the test asserts which one below)
            out.append(exc)
    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():
        _unblock(fifo)
        t.join(30)
        pytest.fail("KernelSpec.from_file blocked on a FIFO")
    assert isinstance(out[0], ValueError) and "not a regular file" in str(out[0])
    (tmp_path / "d.spv").mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        KernelSpec.from_file("t", tmp_path / "d.spv")


def test_a_named_file_that_is_a_terminal_is_refused_without_becoming_the_controlling_terminal():
    """KernelSpec.from_file / KernelCodeSource.from_spirv_file of a terminal device, in a process
    without a controlling terminal (a service, a session leader): before, the file was
    opened to be checked, and the open made that terminal the process's controlling
    terminal (its hang-up then sends SIGHUP, its Ctrl-C SIGINT, to the service). Now a
    path that is not a regular file is refused before it is opened (O_NOCTTY besides)."""
    import sys
    import textwrap

    from child_runs import printed_in_order, run_script

    script = textwrap.dedent("""
        import os
        from vkmulti.kernels.engine.spec import KernelSpec
        from vkmulti import KernelCodeSource
        os.setsid()   # (a session of its own, no controlling terminal: as a service)
        master, slave = os.openpty()
        name = os.ttyname(slave)
        os.close(slave)

        def controlling_terminal():
            try:
                os.close(os.open("/dev/tty", os.O_RDONLY))
                return True
            except OSError:
                return False
        print("BEFORE", controlling_terminal(), flush=True)
        for load in (lambda: KernelSpec.from_file("t", name), lambda: KernelCodeSource.from_spirv_file(name)):
            try:
                load()
                print("LOADED", flush=True)
            except ValueError as exc:
                print("REFUSED", exc, flush=True)
        print("AFTER", controlling_terminal(), flush=True)
    """)
    p = run_script(script, "terminal", 60, os.path.dirname(os.path.abspath(__file__)))
    printed_in_order(p, ["BEFORE False", "REFUSED", "not a regular file", "REFUSED", "not a regular file",
                         "AFTER False"], "terminal")


def test_kernel_spec_from_file_is_bounded(tmp_path):
    """Before: a sparse file of any size was read whole into memory."""
    from vkmulti.kernels.engine.spec import KernelSpec
    from vkmulti.kernels.engine.spirv_gate import MAX_MODULE_BYTES

    big = tmp_path / "big.spv"
    with open(big, "wb") as f:
        f.truncate(MAX_MODULE_BYTES + 1)
    with pytest.raises(ValueError, match=f"at most {MAX_MODULE_BYTES}"):
        KernelSpec.from_file("t", big)


def _outputs():
    from vkmulti.apps.charts import bar_chart
    from vkmulti.apps.cli_args import print_figures
    from vkmulti.apps.scenes import write_png

    return {
        "json": lambda p: print_figures({"a": 1}, p),
        "png": lambda p: write_png(np.zeros((4, 4, 3), np.uint8), p),
        "chart": lambda p: bar_chart(["g"], ["s"], {("g", "s"): 1.0}, title="t", ylabel="y", xlabel="x", path=p,
                                     machine="m"),
    }


@pytest.mark.parametrize("what", ["json", "png", "chart"])
def test_an_output_replaces_a_link_at_its_path(tmp_path, what, capsys):
    """Before: a link planted at an output path (the default ones are in the shared
    temporary folder) made the command overwrite the link's target."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    path = tmp_path / ("out.json" if what == "json" else "out.png")
    path.symlink_to(victim)
    _outputs()[what](str(path))
    assert victim.read_bytes() == b"precious"
    assert path.is_file() and not path.is_symlink() and path.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([victim.name, path.name])


@pytest.mark.parametrize("what", ["json", "png"])
def test_an_output_never_blocks_on_a_fifo(tmp_path, what, capsys):
    """Before: a FIFO at an output path blocked the command at its end."""
    path = tmp_path / ("out.json" if what == "json" else "out.png")
    os.mkfifo(path)
    t = threading.Thread(target=_outputs()[what], args=(str(path),), daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)   # lets the blocked writer's open return
        t.join(30)
        os.close(fd)
        pytest.fail("writing the output blocked on a FIFO")
    assert path.is_file() and path.stat().st_size > 0


def test_a_numa_node_entry_that_is_a_fifo_or_huge_is_unknown(tmp_path):
    """Before: numa_node() under a sysfs_root whose numa_node is a FIFO waited for a writer forever."""
    from vkmulti.kernels.coordinator.device_facts import numa_node

    folder = tmp_path / "bus" / "pci" / "devices" / "0000:06:00.0"
    folder.mkdir(parents=True)
    (folder / "numa_node").write_text("1\n")
    assert numa_node("0000:06:00.0", str(tmp_path)) == 1
    (folder / "numa_node").unlink()
    os.mkfifo(folder / "numa_node")
    out: list = []
    t = threading.Thread(target=lambda: out.append(numa_node("0000:06:00.0", str(tmp_path))), daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():
        _unblock(folder / "numa_node")
        t.join(30)
        pytest.fail("numa_node() blocked on a FIFO")
    assert out == [None]
    (folder / "numa_node").unlink()
    with open(folder / "numa_node", "wb") as f:
        f.truncate(1 << 30)   # (sparse)
    assert numa_node("0000:06:00.0", str(tmp_path)) is None


@pytest.mark.parametrize("what", ["json", "png"])
def test_an_output_never_replaces_a_device_or_a_link_to_one(tmp_path, what, capsys):
    """A link to /dev/null (as /dev/stdout is to a pipe or a terminal) is no file to
    replace: as root, replacing /dev/stdout would break it for every program."""
    import argparse

    from vkmulti.apps.cli_args import check_output_path

    link = tmp_path / ("out.json" if what == "json" else "out.png")
    link.symlink_to("/dev/null")
    with pytest.raises(OSError, match="device"):
        _outputs()[what](str(link))
    assert link.is_symlink() and os.readlink(link) == "/dev/null"

    class Refused(Exception):
        pass

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise Refused(message)
    for path in (str(link), "/dev/null"):
        with pytest.raises(Refused, match="device"):
            check_output_path(Parser(), path, "--json", image=False)


@pytest.mark.parametrize("what", ["json", "png"])
def test_an_output_with_a_long_name_of_multibyte_characters_is_written(tmp_path, what, capsys):
    """A valid file name of 245 bytes in 125 characters (é is two bytes): the new file
    written beside it was named after its first 200 characters (here all 245 bytes) and
    19 more bytes, past the 255 a name may have: the output failed with ENAMETOOLONG."""
    path = tmp_path / ("é" * 120 + (".json" if what == "json" else ".png"))
    assert len(os.fsencode(path.name)) <= 255
    _outputs()[what](str(path))
    assert path.is_file() and path.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_ctrl_c_as_the_new_file_is_opened_leaves_nothing_beside_the_output(tmp_path, monkeypatch):
    """A Ctrl-C that arrives while the new file beside an output is being opened is raised
    as the open returns, before the write's cleanup covered it: the half-made file
    (.name.xxxx.tmp) was left in the folder. Now it is removed; the old output stays."""
    from vkmulti.apps.cli_args import write_output

    path = tmp_path / "out.json"
    path.write_bytes(b"old")
    real_open, opened = os.open, []

    def open_then_ctrl_c(name, flags, *args, **kwargs):
        fd = real_open(name, flags, *args, **kwargs)
        if os.fsdecode(name).endswith(".tmp"):
            opened.append(fd)
            raise KeyboardInterrupt   # (the signal handler's exception, raised as the call returns)
        return fd
    monkeypatch.setattr(os, "open", open_then_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            write_output(str(path), b"new")
    finally:
        monkeypatch.undo()
        for fd in opened:
            os.close(fd)
    assert opened and [p.name for p in tmp_path.iterdir()] == ["out.json"]
    assert path.read_bytes() == b"old"
