"""Write src/vkmulti/**/meson.build: one install list per folder of the package.

Run from the repository root after adding, removing or renaming a module:
    python tools/meson_lists.py
tests/test_packaging.py fails when a list and its folder disagree.
"""
import pathlib
root = pathlib.Path("src/vkmulti")
def gen(d: pathlib.Path):
    rel = d.relative_to(root.parent).as_posix()
    files = sorted(p.name for p in d.iterdir() if p.is_file() and (p.suffix in (".py", ".pyi", ".spv") or p.name == "py.typed"))
    subs = sorted(p for p in d.iterdir() if p.is_dir() and p.name != "__pycache__" and (any(p.glob("*.py")) or any(p.glob("*.spv"))))
    out = [f"# {rel}: written by tools/meson_lists.py; tests/test_packaging.py checks it against the folder."]
    out.append("py.install_sources(")
    out += [f"  '{f}'," for f in files]
    if d.name == "shaders":
        out.append("  # the kernel ABI header, so KernelCodeSource.from_glsl finds its #include in an installed package")
        out.append("  files('../../../native/shaders/vkm_kernel_abi.glsl'),")
    out.append(f"  subdir: '{rel}',")
    out.append(")")
    if subs:
        out.append("")
        out += [f"subdir('{s.name}')" for s in subs]
    (d / "meson.build").write_text("\n".join(out) + "\n")
    for s in subs: gen(s)
if __name__ == "__main__":
    gen(root)
