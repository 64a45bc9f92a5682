"""The command lines: every --help exits 0, bad input exits 2 with one line and no
traceback (checked before any GPU work), the one no-GPU rule, and the bench scripts."""
from __future__ import annotations

import contextlib
import io
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import vkmulti
from vkmulti.apps import cli
from vkmulti.apps.demo import print_report

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "bench").glob("*.py")) + sorted((ROOT / "bench" / "probes").glob("*.py"))


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    """cli.main in this process: (exit status, stdout, stderr). Any exception but
    SystemExit fails the test (a traceback)."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_top_level_help_in_a_fresh_process():
    r = subprocess.run([sys.executable, "-m", "vkmulti", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "info" in r.stdout and "bench" in r.stdout and not r.stderr


@pytest.mark.parametrize("argv", [["--help"], ["info", "--help"], ["demo", "--help"], ["demo", "stencil", "--help"],
                                  ["topology", "--help"], ["bench", "--help"], ["bench", "transfer", "--help"],
                                  ["--version"]])
def test_every_help_exits_0(argv, capsys):
    code, out, err = run_main(argv, capsys)
    assert code == 0 and out.strip() and not err


BAD = [
    (["bench"], "required"),
    (["bench", "teleport"], "invalid choice"),
    (["nosuch"], "invalid choice"),
    (["demo", "--output", "/nonexistent/x.png"], "does not exist"),
    (["demo", "--output", "/tmp"], "is a folder"),
    (["demo", "--output", "frame.nosuchformat"], "no image format"),
    (["demo", "--virtual", "0"], "--virtual"),
    (["demo", "--srus", "0"], "--srus"),
    (["demo", "--frames", "-1"], "--frames"),
    (["demo", "--size", "3x3"], "too small"),
    (["demo", "--devices", "0,9", "--output", ""], "out of range"),
    (["demo", "stencil", "--virtual", "0"], "--virtual"),
    (["demo", "stencil", "--output", "/nonexistent/x.png"], "does not exist"),
    (["info", "--virtual", "-2"], "--virtual"),
    (["topology", "--bytes", "6"], "multiple of 4"),
    (["topology", "--bytes", str(1 << 64)], "at most 2**62"),
    (["topology", "--reps", "0"], "--reps"),
    (["bench", "transfer", "--reps", "0"], "--reps"),
    (["bench", "transfer", "--plot", "/tmp"], "is a folder"),
    (["bench", "transfer", "--virtual", "0"], "--virtual"),
    (["bench", "transfer", "--json", "/nonexistent/dir/x.json"], "does not exist"),
    (["bench", "transfer", "--json", "/tmp"], "is a folder"),
    (["bench", "transfer", "--reps", "-3"], "--reps must be >= 1, got -3"),
    (["bench", "transfer", "--slot-count", "0"], "--slot-count must be >= 1, got 0"),
    (["bench", "transfer", "--slot-count", "5000"], "slot_count must be in [1, 1024]"),
    (["bench", "transfer", "--slot-size", "99999999999"], "slot_size must be in"),
    (["bench", "transfer", "--slot-size", "4096", "--slot-count", "32"], "exceeds"),
    (["demo", "--size", "-5x10"], "size must be positive, got '-5x10'"),
    (["demo", "stencil", "--size", "-5x10"], "size must be positive, got '-5x10'"),
    (["demo", "--lose-gpu", "-1@5"], "must be a secondary"),
    (["demo", "--lose-gpu", "1@5", "--output", "/nonexistent/x.png"], "does not exist"),
    (["demo", "--plot", "/nonexistent/x.png"], "does not exist"),
    (["demo", "stencil", "--lose-gpu", "1@5", "--output", "/nonexistent/x.png"], "does not exist"),
]


@pytest.mark.parametrize("argv, what", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_with_one_line(argv, what, capsys):
    code, out, err = run_main(argv, capsys)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and what in lines[0] and "Traceback" not in err, err


def test_demo_output_is_checked_before_any_gpu_work(monkeypatch, capsys):
    def no_gpu_work(*a, **k):
        raise AssertionError("the demo started GPU work before checking --output")
    monkeypatch.setattr(vkmulti.MultiDeviceManager, "create", no_gpu_work)
    monkeypatch.setattr(vkmulti.testing, "use_virtual_if_no_gpu", no_gpu_work)
    for path in ("/nonexistent/x.png", "/tmp", "out.txt"):
        code, _, err = run_main(["demo", "--output", path], capsys)
        assert code == 2 and err.count("\n") == 1


@pytest.mark.parametrize("argv", [
    ["bench", "transfer", "--quick", "--json", "/nonexistent/dir/x.json"],
    ["bench", "transfer", "--quick", "--plot", "/nonexistent/dir/x.png"],
    ["demo", "--lose-gpu", "1@1", "--output", "/nonexistent/x.png"],
    ["demo", "stencil", "--output", "/nonexistent/x.png"],
    ["demo", "stencil", "--lose-gpu", "1@1", "--output", "/nonexistent/x.png"],
], ids=lambda a: " ".join(a))
def test_every_output_path_is_checked_before_any_gpu_work(argv, monkeypatch, capsys):
    """One check for all output options (add_output_argument): refused when the line is
    parsed, so that a bench does not run to the end and then fail to write."""
    def no_gpu_work(*a, **k):
        raise AssertionError(f"{' '.join(argv)} started GPU work before checking its output path")
    monkeypatch.setattr(vkmulti.MultiDeviceManager, "create", no_gpu_work)
    code, out, err = run_main(argv, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "does not exist" in err and not out, err


def test_bench_transfer_help_explains_every_option(capsys):
    code, out, _ = run_main(["bench", "transfer", "--help"], capsys)
    assert code == 0
    import re
    for opt in ("--src I", "--dst J", "--no-torch", "--slot-count N", "--slot-size MiB", "--reps REPS"):
        assert re.search(rf"^  {re.escape(opt)}\s+\S", out, re.M) or \
            re.search(rf"^  {re.escape(opt)}\n\s{{8,}}\S", out, re.M), f"{opt} has no help text:\n{out}"


def test_default_outputs_land_outside_the_current_folder(capsys):
    """The demos write their PNG to the temporary folder unless told otherwise (never into a checkout)."""
    import tempfile
    from vkmulti.apps import stencil
    parser = cli.build_parser()
    args = parser.parse_args(["demo"])
    assert os.path.dirname(args.output) == tempfile.gettempdir() and args.output.endswith("vkmulti-demo.png")
    _, sargs = stencil.parse_arguments([])
    assert os.path.dirname(sargs.output) == tempfile.gettempdir() and sargs.output.endswith("vkmulti-stencil.png")


def test_lose_gpu_drill_honours_output(tmp_path, capsys):
    png = tmp_path / "drill.png"
    code, out, err = run_main(["demo", "--lose-gpu", "1@1", "--frames", "2", "--srus", "4", "--size", "64x48",
                               "--output", str(png)], capsys)
    assert code == 0, err
    from PIL import Image as PILImage
    with PILImage.open(png) as im:
        assert im.size == (64, 48)
    assert f"wrote {png}" in out
    import re
    line = next(ln for ln in out.splitlines() if "rendered again" in ln)
    assert not re.search(r"GPU 0\s+\d", line), line     # the count is not read as part of "GPU 0"


def test_a_bad_output_in_a_fresh_process_prints_no_traceback():
    r = subprocess.run([sys.executable, "-m", "vkmulti", "demo", "--output", "/nonexistent/x.png"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and not r.stdout


def test_gpu_grammar(capsys):
    report = {"srus": 2, "size": [64, 32], "devices": [{"index": 0, "name": "GPU", "srus": [0, 1], "cost_share": 1.0}],
              "frames": 1, "heavy": False, "note": None, "virtual": False, "fallbacks": [], "frame_ms_offload": 1.0,
              "frame_ms_single": 1.0, "speedup": 1.0, "transfers": {}, "offloaded_bytes_per_frame": 0,
              "identical": True}
    print_report(report)
    text = capsys.readouterr().out
    assert "1 GPU," in text and "with offload (1 GPU)" in text and "GPUs" not in text and "GPU(s)" not in text


def test_no_gpu_rule_in_a_process_without_virtual_gpus(tmp_path):
    """With Vulkan listing only lavapipe (a machine without a GPU), create() and the
    commands switch to the virtual pair and say so in one line; VKMULTI_VIRTUAL_FALLBACK=0
    keeps what Vulkan lists."""
    env = {k: v for k, v in os.environ.items() if k not in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")}
    if vkmulti.testing.find_lavapipe_icd() is None or os.environ.get("VKMULTI_REAL_GPUS") == "1":
        pytest.skip("needs lavapipe and no real GPU")
    env["VK_DRIVER_FILES"] = vkmulti.testing.find_lavapipe_icd()    # one CPU device: what a GPU-less machine has
    code = ("import vkmulti\n"
            "with vkmulti.MultiDeviceManager.create() as mgr:\n"
            "    print(mgr.device_count)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "2", r.stderr
    assert r.stderr.strip().splitlines() == [f"vkmulti: {vkmulti.testing.NO_GPU_NOTE}"]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(env, VKMULTI_VIRTUAL_FALLBACK="0"))
    assert r.returncode == 0 and r.stdout.strip() == "1" and not r.stderr.strip(), r.stderr
    r = subprocess.run([sys.executable, "-m", "vkmulti", "info", "--json"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and '"note": "no GPU found' in r.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(p.relative_to(ROOT)) for p in SCRIPTS])
def test_every_bench_script_answers_help(script, monkeypatch):
    """--help prints usage and exits 0 without running the bench."""
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.setattr(vkmulti.MultiDeviceManager, "create",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("--help ran the bench")))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        runpy.run_path(str(script), run_name="__main__")
    assert e.value.code in (0, None) and "usage:" in out.getvalue()


def test_a_command_never_tells_a_user_to_call_destroy(monkeypatch, capsys):
    """A teardown that timed out ends the command with one line that does not give a program's advice."""
    from vkmulti.apps import cli
    from vkmulti.errors import TimeoutError as VkmTimeout

    def slow_teardown(*_):
        raise VkmTimeout("Buffer(GPU 1) still used by the GPU after 10.0 s; it was not destroyed "
                         "(call destroy() again later)")
    assert cli._guarded("demo", slow_teardown) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "destroy()" not in err and "still running when the command ended" in err
    assert cli._for_a_user("no such hint") == "no such hint"
