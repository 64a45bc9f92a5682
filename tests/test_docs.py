"""Every code block of README.md, README.pypi.md and docs/**/*.md, run so that examples cannot rot.

- ```python blocks run as pasted, each on its own in a fresh namespace (in
  this process, on the virtual GPU pair, in a temporary folder). A block that
  cannot run here says why in a comment line just above its fence,
  `<!-- doc-test: not run: REASON -->`; it is compiled only. A block that
  needs a tool beyond the set-up's says so the same way,
  `<!-- doc-test: needs TOOL -->`: it runs where TOOL is on PATH (`lavapipe`:
  where Mesa's lavapipe is installed), else skips.
- ```sh blocks are never run (they install packages or start clusters); every
  `python -m vkmulti ...` and `python bench/NAME.py ...` command in them is
  checked instead: its --help exits 0 and lists every --option the block uses.
- ```text blocks are diagrams and formulas. A fence without a language fails.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import os
import re
import runpy
import shlex
import shutil
import sys
import types
from pathlib import Path

import pytest

import vkmulti.testing

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "README.pypi.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(?P<lang>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)
MARK = re.compile(r"<!--\s*doc-test:\s*(?P<mark>.*?)\s*-->\s*$")
LANGS = {"python", "sh", "text"}


def _blocks() -> list[tuple[str, str, str, str]]:
    """(id, language, code, mark) for every fenced block of the docs."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = MARK.search(before)
            out.append((f"{path.relative_to(ROOT)}:{line}", m["lang"].strip(), m["code"],
                        mark["mark"] if mark else ""))
    return out


BLOCKS = _blocks()


def test_every_block_has_a_known_language():
    bad = [bid for bid, lang, _, _ in BLOCKS if lang not in LANGS]
    assert not bad, f"code blocks without a language out of {sorted(LANGS)}: {bad}"


def test_readme_keeps_its_two_setup_commands():
    """README's first two sh blocks are the set-up commands (.ci/run runs the second); any
    later sh block belongs to the section on wheels, after both."""
    text = (ROOT / "README.md").read_text()
    sh = [(bid, code) for bid, lang, code, _ in BLOCKS if bid.startswith("README.md:") and lang == "sh"]
    assert len(sh) >= 2, "README.md's first two sh blocks: install + demo, install + tests"
    assert sh[0][1].rstrip().endswith("/opt/vkmulti/bin/python -m vkmulti demo")
    assert sh[1][1].rstrip().endswith("/opt/vkmulti/bin/python -m pytest -q tests")
    wheels = text.count("\n", 0, text.index("## Building and installing a wheel")) + 1
    assert all(int(bid.rsplit(":", 1)[1]) > wheels for bid, _ in sh[2:]), \
        "README.md: a third sh block only in 'Building and installing a wheel'"


def test_long_description_links_work_outside_the_repository():
    """The package index shows the long description away from the repository: no relative links."""
    import tomllib
    readme = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["readme"]
    text = (ROOT / readme).read_text()
    relative = [t for t in re.findall(r"\]\(([^)]+)\)", text) if "://" not in t and not t.startswith("#")]
    assert not relative, f"{readme}: relative links break on the package index: {relative}"


def test_readme_links_stay_in_the_repository():
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#]+)", path.read_text()):
            if "://" in target:
                continue
            assert (path.parent / target).resolve().is_relative_to(ROOT), f"{path.name} links outside: {target}"
            assert (path.parent / target).exists(), f"{path.name} links to a missing file: {target}"


@pytest.mark.parametrize("bid,code,mark", [(b, c, m) for b, lang, c, m in BLOCKS if lang == "python"],
                         ids=[b for b, lang, _, _ in BLOCKS if lang == "python"])
def test_python_block_runs_as_pasted(bid, code, mark, tmp_path, monkeypatch):
    compiled = compile(code, bid, "exec")
    if mark.startswith("needs "):
        need = mark.split()[1]
        if need == "lavapipe":
            if vkmulti.testing.find_lavapipe_icd() is None:
                pytest.skip(f"{bid}: needs Mesa's lavapipe (virtual GPUs)")
        elif shutil.which(need) is None:
            pytest.skip(f"{bid}: needs {need} on PATH")
    elif mark:
        assert mark.startswith("not run: ") and len(mark) > len("not run: ") + 5, \
            f"{bid}: a block that is not run says why (<!-- doc-test: not run: REASON -->), got {mark!r}"
        return
    monkeypatch.chdir(tmp_path)
    saved_env = dict(os.environ)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compiled, {"__name__": "__docs__"})
    finally:
        os.environ.clear()
        os.environ.update(saved_env)


def _commands(code: str) -> list[list[str]]:
    """The vkmulti and bench commands of a shell block, as argument lists."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0]
        for part in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(part)
            except ValueError:
                continue
            for i, w in enumerate(words):
                if w.endswith("python") or w.endswith("python3") or re.search(r"python3?\.\d+$", w):
                    rest = words[i + 1:]
                    if rest[:2] == ["-m", "vkmulti"]:
                        out.append(["vkmulti", *rest[2:]])
                    elif rest and rest[0].startswith("bench/") and rest[0].endswith(".py"):
                        out.append(rest)
                    break
                if w == "vkmulti" and i == 0:
                    out.append(["vkmulti", *words[1:]])
                    break
    return out


def _help(argv: list[str]) -> str:
    """The --help text of a vkmulti command or bench script (run in this process)."""
    out = io.StringIO()
    if argv[0] == "vkmulti":
        from vkmulti.apps.cli import main
        path = list(itertools.takewhile(lambda a: not a.startswith("-"), argv[1:]))   # the subcommand
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
            main([*path, "--help"])
    else:
        saved = sys.argv
        sys.argv = [str(ROOT / argv[0]), "--help"]
        try:
            with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
                runpy.run_path(str(ROOT / argv[0]), run_name="__main__")
        finally:
            sys.argv = saved
    assert e.value.code in (0, None), f"{' '.join(argv)} --help exited {e.value.code}"
    return out.getvalue()


SH_COMMANDS = [(bid, cmd) for bid, lang, code, _ in BLOCKS if lang == "sh" for cmd in _commands(code)]


@pytest.mark.parametrize("bid,argv", SH_COMMANDS, ids=[f"{b}:{' '.join(c)[:40]}" for b, c in SH_COMMANDS])
def test_shell_command_exists_with_its_options(bid, argv):
    text = _help(argv)
    for opt in (a.split("=", 1)[0] for a in argv if a.startswith("--")):
        assert opt in text, f"{bid}: {' '.join(argv)} uses {opt}, which its --help does not list"


def test_environment_doc_lists_every_variable():
    """docs/reference/environment.md names every VKMULTI_* variable the code, tests, benches and CI use."""
    used: set[str] = set()
    for folder in ("src", "native", "tests", "bench", ".ci"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in ("", ".py", ".pyx", ".pxi", ".c", ".h", ".sh"):
                used |= set(re.findall(r"\bVKMULTI_[A-Z][A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    documented = set(re.findall(r"`(VKMULTI_[A-Z0-9_]+)`", (ROOT / "docs" / "reference" / "environment.md").read_text()))
    assert used - documented == set(), f"not in docs/reference/environment.md: {sorted(used - documented)}"


def test_seed_defect_rows_name_tests_that_exist():
    """Each test docs/explanation/seed-defects.md names (`file.py::test_x`, or `test_x` after it) is defined there."""
    sources = {p.name: p.read_text() for p in (ROOT / "tests").glob("test_*.py")}
    rows = [ln for ln in (ROOT / "docs" / "explanation" / "seed-defects.md").read_text().splitlines() if ln.startswith("| ")]
    checked = 0
    for row in rows[2:]:
        test_cell = row.rstrip(" |").rsplit("|", 1)[-1]
        current = None
        for file, name_in_file, bare in re.findall(r"`(?:(test_\w+\.py)(?:::(\w+))?|(test_\w+))", test_cell):
            file, name = file or None, name_in_file or bare
            current = file or current
            if not name:
                continue
            where = [current] if current else list(sources)
            assert any(re.search(rf"def {name}\b", sources.get(f, "")) for f in where), \
                f"docs/explanation/seed-defects.md names {name} ({current or 'any test file'}), which does not exist"
            checked += 1
    assert checked >= len(rows) - 2


def _block_with(path: str, marker: str) -> str:
    found = [code for bid, lang, code, _ in BLOCKS if bid.startswith(path + ":") and lang == "python" and marker in code]
    assert len(found) == 1, f"{path}: expected one python block with {marker!r}"
    return found[0]


@pytest.mark.parametrize("path, marker, expected", [
    ("README.md", "device_requirements(gpus[0]", ["no GPU found", "2 devices:", "staging_copy"]),
    ("docs/tutorials/engine-integration.md", "primary_extensions=()", ["VK_EXT_external_memory_host llvmpipe", " 0"]),
], ids=["readme-engine", "engine-missing-extension"])
def test_block_shows_something_on_a_machine_without_a_gpu(path, marker, expected, tmp_path):
    """Run as pasted where Vulkan lists only one CPU device (a machine without a GPU): the
    block applies the no-GPU rule itself and prints what it is about."""
    import subprocess

    import vkmulti
    icd = vkmulti.testing.find_lavapipe_icd()
    if icd is None or os.environ.get("VKMULTI_REAL_GPUS") == "1":
        pytest.skip("needs lavapipe and no real GPU")
    env = {k: v for k, v in os.environ.items() if k not in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")}
    env["VK_DRIVER_FILES"] = icd
    r = subprocess.run([sys.executable, "-c", _block_with(path, marker)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    for text in expected:
        assert text in r.stdout, f"{path}: {text!r} not in what the block printed:\n{r.stdout}"


def test_help_vkmulti_opens_with_an_overview_and_where_to_read_next():
    """help(vkmulti) starts with the package docstring: what it is, a first program that
    runs, the main names by task and where to read next, before the long listing."""
    import pydoc
    import textwrap

    import vkmulti
    text = pydoc.render_doc(vkmulti, renderer=pydoc.plaintext)
    head = text[:text.index("PACKAGE CONTENTS")]
    for part in ("A first program", "MultiDeviceManager", "CrossDeviceTransfer", "vkmulti.kernels",
                 "Where to read next", "tutorials/first-program.md", "python -m vkmulti --help"):
        assert part in head, f"help(vkmulti) does not open with {part!r}"
    doc = vkmulti.__doc__
    program = doc.split("A first program::\n", 1)[1].split("\n\n", 1)[0]
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(textwrap.dedent(program), "vkmulti.__doc__", "exec"), {})
    names = set(re.findall(r"\b([A-Z][a-z]+[A-Z][A-Za-z]*)\b", doc.split("The main names", 1)[1])) - {"VkDevice"}
    assert len(names) >= 12
    for name in sorted(names):
        assert hasattr(vkmulti, name) or hasattr(vkmulti.kernels, name), \
            f"the docstring names {name}, which neither vkmulti nor vkmulti.kernels has"


PAGES = sorted((ROOT / "docs").rglob("*.md"))
MAX_LINES = 300


def test_no_docs_page_is_over_300_lines():
    long = {str(p.relative_to(ROOT)): n for p in PAGES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"docs pages over {MAX_LINES} lines (split them by purpose): {long}"


def _nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav lists (docs/-relative), in order."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:"):]
    return re.findall(r"^\s*-\s*(?:[^\n:]+:\s*)?([\w./-]+\.md)\s*$", nav, re.M)


def test_mkdocs_nav_lists_every_page_once():
    nav = _nav_pages()
    pages = [str(p.relative_to(ROOT / "docs")) for p in PAGES]
    assert len(nav) == len(set(nav)), f"mkdocs.yml lists a page twice: {sorted(p for p in nav if nav.count(p) > 1)}"
    assert sorted(set(pages) - set(nav)) == [], "docs pages missing from mkdocs.yml's nav"
    assert sorted(set(nav) - set(pages)) == [], "mkdocs.yml's nav lists pages that do not exist"


def _documented() -> dict[str, object]:
    """What the `::: path` lines of docs/reference/api/ document: path -> object (a module
    documents every name of its __all__ too)."""
    import importlib

    def resolve(path: str) -> object:
        obj = importlib.import_module("vkmulti")
        for i, part in enumerate(path.split(".")[1:], 2):
            obj = getattr(obj, part) if hasattr(obj, part) else importlib.import_module(".".join(path.split(".")[:i]))
        return obj

    out: dict[str, object] = {}
    for page in sorted((ROOT / "docs" / "reference" / "api").glob("*.md")):
        for path in re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), re.M):
            obj = out[path] = resolve(path)
            if isinstance(obj, types.ModuleType):
                out.update({f"{path}.{n}": getattr(obj, n) for n in getattr(obj, "__all__", [])})
    return out


PUBLIC_MODULES = ["vkmulti", "vkmulti.device", "vkmulti.memory", "vkmulti.transfer", "vkmulti.offload",
                  "vkmulti.kernels", "vkmulti.kernels.reference", "vkmulti.kernels.stencil", "vkmulti.cluster",
                  "vkmulti.errors", "vkmulti.testing", "vkmulti.images", "vkmulti.buffers"]


def _public_names() -> list[tuple[str, str, object]]:
    import importlib
    import json

    api = json.loads((ROOT / "tests" / "public_api.json").read_text())
    out = []
    for module in PUBLIC_MODULES:
        mod = importlib.import_module(module)
        for name in getattr(mod, "__all__", None) or api[module]:
            if name != "__version__":
                out.append((module, name, getattr(mod, name)))
    return out


def test_the_api_reference_documents_every_public_name():
    """Each name of the public modules (public_api.json, the layer faces) is on a page of
    docs/reference/api/: under its own path, or the same object under the same name elsewhere
    (vkmulti.KernelRuntime is documented as vkmulti.kernels.KernelRuntime)."""
    documented = _documented()
    by_name: dict[str, list[object]] = {}
    for path, obj in documented.items():
        by_name.setdefault(path.rsplit(".", 1)[1], []).append(obj)
    missing = [f"{m}.{n}" for m, n, obj in _public_names()
               if f"{m}.{n}" not in documented and not any(o is obj for o in by_name.get(n, []))]
    assert not missing, f"public names on no page of docs/reference/api/: {missing}"


def test_the_cli_reference_lists_every_command_and_option():
    """docs/reference/cli.md has a section per command and names every option its --help lists."""
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for command in (["info"], ["demo"], ["demo", "stencil"], ["topology"], ["bench", "transfer"]):
        assert f"\n## {' '.join(command)}\n" in text, f"docs/reference/cli.md: no section for {command}"
        options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", _help(["vkmulti", *command])))
        missing = sorted(o for o in options - {"--help"} if f"`{o}" not in text)
        assert not missing, f"docs/reference/cli.md does not name {' '.join(command)}'s {missing}"
    for bench in sorted((ROOT / "bench").glob("*.py")):
        assert f"`bench/{bench.name}" in text, f"docs/reference/cli.md does not list bench/{bench.name}"


def test_build_the_docs_installs_the_docs_extra():
    import tomllib
    reqs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    text = (ROOT / "docs" / "how-to" / "build-the-docs.md").read_text()
    assert all(f"'{r}'" in text for r in reqs), f"docs/how-to/build-the-docs.md does not install {reqs}"


def test_mkdocs_builds_strictly(tmp_path):
    """`mkdocs build --strict` (warnings are errors) succeeds, and every documented public
    name has its anchor in the built API pages."""
    import subprocess
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    if not (ROOT / "src" / "vkmulti").is_dir():
        pytest.skip("needs the source tree (mkdocstrings reads src/)")
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                        str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    anchors = set()
    for page in (site / "reference" / "api").rglob("*.html"):
        anchors |= set(re.findall(r'id="(vkmulti[\w.]*)"', page.read_text()))
    missing = sorted(set(_documented()) - anchors)
    assert not missing, f"documented but not rendered: {missing[:20]}"
