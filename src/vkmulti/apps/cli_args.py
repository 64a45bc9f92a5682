"""Argument checks and output shared by every command line of vkmulti (the CLI, its demos, the benches).

Bad input to a command ends it with exit status 2 and one line (argparse's
`parser.error`), before any GPU work starts.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import stat
import sys
import tempfile
from typing import Any, Callable

from .._core.files import replace_file
from .._core.checks import short_repr

__all__ = ["Parser", "virtual_count", "add_virtual_argument", "add_output_argument", "check_output_path",
           "check_output_paths", "default_output", "positive_int", "parse_size", "parse_devices", "parse_loss",
           "print_result", "print_figures", "write_output", "save_image"]


#: A run of 80+ characters without a space: an argument echoed back in full would flood the line.
_LONG_WORD = re.compile(r"\S{80,}")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage block): exit status 2.

    A value that starts with '-' and a digit ('--size -5x10', '--reps -3') is a
    value, not an unknown option, so the option's own check names what is wrong;
    output paths (add_output_argument) are checked as soon as the line is parsed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse reads values that look like negative numbers as values; '-5x10' is one too
        self._negative_number_matcher = re.compile(r"^-\d")

    def error(self, message: str) -> Any:   # argparse's hook; never returns
        """Print `prog: error: message (see --help)` on stderr and exit with status 2; a
        long word of the message (an argument echoed back) is cut, so the line stays short."""
        message = _LONG_WORD.sub(lambda m: m.group()[:57] + "...", message)
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        """argparse's parse, then every output path (add_output_argument) checked: a path
        that cannot be written is refused here, before any work, not after it."""
        ns, extra = super().parse_known_args(args, namespace)
        check_output_paths(self, ns)
        return ns, extra


def virtual_count(text: str) -> int:
    """argparse type of --virtual N: a count of virtual GPUs, at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of virtual GPUs, got {short_repr(text)}") from None
    if not 1 <= n <= 16:
        raise argparse.ArgumentTypeError(f"must be between 1 and 16 (leave --virtual out to use the real GPUs, or "
                                         f"the virtual pair when there are none), got {n}")
    return n


def add_virtual_argument(parser: Any) -> None:
    """--virtual N, the same in every command and bench."""
    parser.add_argument("--virtual", type=virtual_count, default=None, metavar="N",
                        help="use N virtual lavapipe GPUs instead of the real ones (without it: the real GPUs, "
                             "or the virtual pair when there is none)")


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {short_repr(text)}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def parse_size(text: str) -> tuple[int, int]:
    """argparse type: 'WxH' -> (W, H), both positive."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must look like 1280x720, got {short_repr(text)}") from None
    if w <= 0 or h <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive, got {short_repr(text)}")
    return w, h


def parse_devices(text: str) -> list[int]:
    """argparse type: '0,1' -> [0, 1] (enumeration indices; the first is the primary)."""
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"devices must be a comma-separated list of indices, got {short_repr(text)}") from None
    if not out or any(v < 0 for v in out) or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"devices must be distinct indices >= 0, got {short_repr(text)}")
    return out


def parse_loss(text: str) -> tuple[int, int]:
    """argparse type of --lose-gpu: '1@50' -> (1, 50), lose GPU 1 during frame 50 (or kernel step 50)."""
    try:
        gpu, at = (int(v) for v in text.split("@"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--lose-gpu must look like 1@50 (GPU index @ frame), got {short_repr(text)}") from None
    if gpu < 1 or at < 0:
        raise argparse.ArgumentTypeError(f"--lose-gpu: the GPU must be a secondary (>= 1) and the frame >= 0, "
                                         f"got {short_repr(text)}")
    return gpu, at


def check_output_path(parser: Any, path: str, flag: str, *, image: bool = True) -> None:
    """parser.error (exit 2, one line) unless `path` can be written: its folder
    exists and is writable, it is not a folder, and (for `image`) its extension
    names a format Pillow can write."""
    if not path:
        return
    if "\0" in path:
        parser.error(f"{flag} {path!r}: a file name cannot contain a NUL character")
    if os.path.isdir(path):
        parser.error(f"{flag} {path!r} is a folder; give a file name such as {os.path.join(path, 'out.png')!r}")
    why = output_problem(path)
    if why is not None:
        parser.error(f"{flag} {path!r} {why}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        parser.error(f"{flag} {path!r}: folder {folder!r} does not exist")
    if not os.access(folder, os.W_OK):
        parser.error(f"{flag} {path!r}: folder {folder!r} is not writable")
    if image:
        ext = os.path.splitext(path)[1].lower()
        try:
            from PIL import Image
        except ImportError:
            parser.error(f"{flag} needs Pillow to write images: pip install 'vkmulti[demo]'")
        Image.init()
        fmt = Image.registered_extensions().get(ext)
        if fmt is None or fmt not in Image.SAVE:
            parser.error(f"{flag} {path!r}: {'no file extension' if not ext else repr(ext) + ' is no image format'}"
                         f"; use .png")


_OUTPUTS = "_vkmulti_outputs"


def add_output_argument(parser: Any, flag: str, *, image: bool, **kwargs: Any) -> Any:
    """Add an option naming a file the command writes (`image`: a picture Pillow
    saves, else any file such as JSON); a Parser checks it when the line is parsed."""
    action = parser.add_argument(flag, **kwargs)
    outputs = getattr(parser, _OUTPUTS, None)
    if outputs is None:
        outputs = {}
        setattr(parser, _OUTPUTS, outputs)
    outputs[action.dest] = (flag, image)
    return action


def check_output_paths(parser: Any, args: argparse.Namespace) -> None:
    """check_output_path for every output option of `parser` (add_output_argument): one
    check for all, so that no command finds out at the end that it cannot write."""
    for dest, (flag, image) in getattr(parser, _OUTPUTS, {}).items():
        check_output_path(parser, getattr(args, dest, None), flag, image=image)  # type: ignore[arg-type]


def default_output(name: str) -> str:
    """Where a command writes `name` unless told otherwise: the temporary folder
    ($TMPDIR, else /tmp), never the current folder (often a source checkout)."""
    return os.path.join(tempfile.gettempdir(), name)


def print_result(r: dict[str, Any], as_json: bool, show: Callable[[dict[str, Any]], None]) -> None:
    """A demo's or drill's figures: JSON on stdout (--json, the same keys), else `show(r)`, its text report."""
    if as_json:
        json.dump(r, sys.stdout, indent=2)
        print()
    else:
        show(r)


def print_figures(res: Any, path: str | None) -> None:
    """A bench's figures: JSON on stdout, and the same text in `path` when given (--json)."""
    text = json.dumps(res, indent=2)
    print(text)
    if path:
        write_output(path, (text + "\n").encode())


def output_problem(path: str) -> str | None:
    """Why an output must not replace what is at `path`, or None: a regular file, a
    link to one, nothing, or a FIFO or socket planted there (not a link) are replaced;
    a device, or a link to anything but a regular file (/dev/stdout, /dev/null), never
    is (replacing it would break it for everyone)."""
    try:
        st = os.stat(path)   # (through a link: what it points to)
    except OSError:
        return None   # nothing there, or a dangling link: a new file
    if stat.S_ISREG(st.st_mode):
        return None
    if not os.path.islink(path) and (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)):
        return None
    return "is a device, a folder or a link to one (such as /dev/stdout), not a file to write; give a file name"


def write_output(path: str, data: bytes) -> None:
    """Write a command's output file atomically: whatever is at `path` (a file, a link
    to one, a FIFO; the default outputs are in the shared temporary folder) is replaced,
    never written through or waited on. OSError when it cannot be written, or when
    `path` is a device or a link to one (output_problem)."""
    why = output_problem(path)
    if why is not None:
        raise OSError(f"{short_repr(path)} {why}")
    replace_file(path, data, mode=0o666)


def save_image(image: Any, path: str) -> None:
    """Save a Pillow image to `path` (write_output) in the format its extension names."""
    from PIL import Image

    Image.init()
    fmt = Image.registered_extensions().get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise ValueError(f"{short_repr(path)}: its extension names no image format; use .png")
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    write_output(path, buf.getvalue())
