"""One error path: every call into the `vulkan` package that can fail goes through vkmulti._core.vkapi.

The scan reads src/vkmulti with `ast`: a reference to ``vulkan.vkXxx`` (under
any alias) is allowed only for the functions listed in VOID_CALLS, which
return void in the C API and so cannot fail; everything else must be called as
``vkapi.vkXxx``, whose failures come out of errors.raise_for_result. The list
is checked against the package itself (none of its entries can raise a
VkResult exception), so it cannot quietly grow a function that can fail.
It also refuses handlers that swallow every exception without a word
(``except Exception: pass``).
"""
from __future__ import annotations

import ast
import inspect
import pathlib

import pytest
import vulkan as vk

import vkmulti
from vkmulti._core import vkapi
from vkmulti.errors import OutOfDeviceMemoryError, TimeoutError, UnsupportedError, VulkanError

SRC = pathlib.Path(vkmulti.__file__).resolve().parent

#: vulkan-package functions that may be called directly, with the reason they cannot fail.
VOID_CALLS = {
    "vkCmd": "command recording returns void; errors surface at vkEndCommandBuffer",
    "vkDestroy": "object destruction returns void",
    "vkFreeMemory": "returns void",
    "vkFreeCommandBuffers": "returns void",
    "vkUnmapMemory": "returns void",
    "vkUpdateDescriptorSets": "returns void",
    "vkGetDeviceQueue": "a getter of a queue made with the device; returns void",
    "vkGetBufferMemoryRequirements": "a pure getter; returns void",
    "vkGetImageMemoryRequirements": "a pure getter; returns void",
    "vkGetPhysicalDeviceProperties": "a pure getter; returns void",
    "vkGetPhysicalDeviceProperties2": "a pure getter; returns void",
    "vkGetPhysicalDeviceFeatures": "a pure getter; returns void",
    "vkGetPhysicalDeviceFeatures2": "a pure getter; returns void",
    "vkGetPhysicalDeviceMemoryProperties": "a pure getter; returns void",
    "vkGetPhysicalDeviceQueueFamilyProperties": "a pure getter; returns void",
    "vkGetPhysicalDeviceFormatProperties": "a pure getter; returns void",
    "vkGetPhysicalDeviceMemoryProperties2": "a pure getter; returns void",
}
#: Queue submits: every one goes through vkapi.queue_submit, which checks the
#: device's lost flag (vkmulti.testing.lose_device, or a real VK_ERROR_DEVICE_LOST)
#: under the queue's lock, as the native core's submits do.
SUBMITS = ("vkQueueSubmit", "vkQueueSubmit2", "vkQueueSubmit2KHR")
#: Modules that talk to the package below the wrapper, and why.
EXEMPT_MODULES = {
    "_core/vkapi.py": "the wrapper itself",
}
#: (module, function) pairs that call the package's cffi `lib` directly for calls that can
#: fail other than straight inside errors.raise_for_result(...), and why.
LIB_CALLS = {
    ("device/capabilities.py", "_device_group_sizes"): "the package's wrapper leaves output sTypes unset; each "
                                                "result goes to errors.raise_for_result (VK_INCOMPLETE aside)",
}


def _allowed(name: str) -> bool:
    return any(name == k or (k in ("vkCmd", "vkDestroy") and name.startswith(k)) for k in VOID_CALLS)


def _vulkan_aliases(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names if a.name == "vulkan"}
    return names


def _lib_aliases(tree: ast.Module, aliases: set[str]) -> set[str]:
    """Names bound to the package's cffi lib: `from vulkan._vulkan import lib`, `x = vk.lib`, `x, y = vk.lib, ...`."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vulkan"):
            names |= {a.asname or a.name for a in node.names if a.name == "lib"}
        if isinstance(node, ast.Assign):
            pairs = []
            for t in node.targets:
                if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs += list(zip(t.elts, node.value.elts))
                else:
                    pairs.append((t, node.value))
            for target, value in pairs:
                if (isinstance(target, ast.Name) and isinstance(value, ast.Attribute) and value.attr == "lib"
                        and isinstance(value.value, ast.Name) and value.value.id in aliases):
                    names.add(target.id)
    return names


def _module_path(path: pathlib.Path) -> str:
    """The file's path inside the package ("device/capabilities.py"), or its name outside it."""
    return path.relative_to(SRC).as_posix() if path.is_relative_to(SRC) else path.name


def _scan(path: pathlib.Path) -> list[str]:
    name = _module_path(path)
    tree = ast.parse(path.read_text(), str(path))
    aliases = _vulkan_aliases(tree)
    libs = _lib_aliases(tree, aliases)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    bad = []
    funcs: list[tuple[int, int, str]] = [(n.lineno, n.end_lineno or n.lineno, n.name) for n in ast.walk(tree)
                                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]

    def where(line: int) -> str:
        inner = [f for f in funcs if f[0] <= line <= f[1]]
        return min(inner, key=lambda f: f[1] - f[0])[2] if inner else "<module>"

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in SUBMITS:
            bad.append(f"{name}:{node.lineno}: {node.attr} outside vkapi.queue_submit (the device's lost "
                       f"flag would not be checked)")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if node.attr.startswith("vk") and node.attr[2:3].isupper() and not _allowed(node.attr):
                bad.append(f"{name}:{node.lineno}: vulkan.{node.attr} called directly; use vkapi.{node.attr}")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vulkan"):
            for a in node.names:
                if a.name.startswith("vk") and a.name[2:3].isupper():
                    bad.append(f"{name}:{node.lineno}: imports vulkan.{a.name}; use vkapi.{a.name}")
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in libs
                and node.attr.startswith("vk") and node.attr[2:3].isupper() and not _allowed(node.attr)):
            call = parents.get(node)
            outer = parents.get(call) if isinstance(call, ast.Call) else None
            checked = (isinstance(outer, ast.Call) and isinstance(outer.func, ast.Name)
                       and outer.func.id == "raise_for_result" and outer.args and outer.args[0] is call)
            if not checked and (name, where(node.lineno)) not in LIB_CALLS:
                bad.append(f"{name}:{node.lineno}: lib.{node.attr} can fail and its result does not go "
                           f"straight to errors.raise_for_result")
        if isinstance(node, ast.ExceptHandler):
            broad = node.type is None or (isinstance(node.type, ast.Name)
                                          and node.type.id in ("Exception", "BaseException"))
            if broad and all(isinstance(s, ast.Pass) for s in node.body):
                bad.append(f"{name}:{node.lineno}: an exception is swallowed without a word")
    return bad


def test_every_failing_vulkan_call_goes_through_vkapi():
    files = [p for p in sorted(SRC.rglob("*.py")) if _module_path(p) not in EXEMPT_MODULES]
    assert len(files) > 15
    bad = [line for p in files for line in _scan(p)]
    assert not bad, "calls that bypass errors.raise_for_result:\n" + "\n".join(bad)


def test_the_scan_catches_a_bypass(tmp_path):
    p = tmp_path / "bad.py"
    p.write_text("import vulkan as v\n_lib = v.lib\n\ndef f(d, i):\n    try:\n        return v.vkCreateBuffer(d, i, None)\n"
                 "    except Exception:\n        pass\n    _lib.vkQueueWaitIdle(d)\n"
                 "    raise_for_result(_lib.vkDeviceWaitIdle(d), 'x')\n    _lib.vkCmdDispatch(d, 1, 1, 1)\n"
                 "    vkapi.vkQueueSubmit(q, 1, [i], None)\n")
    found = " | ".join(sorted(_scan(p)))
    assert "bad.py:6: vulkan.vkCreateBuffer called directly" in found
    assert "bad.py:7: an exception is swallowed" in found
    assert "bad.py:9: lib.vkQueueWaitIdle can fail" in found
    assert "bad.py:12: vkQueueSubmit outside vkapi.queue_submit" in found
    assert "vkDeviceWaitIdle" not in found and "vkCmdDispatch" not in found


@pytest.mark.parametrize("name", sorted(n for n in dir(vk) if n.startswith("vk") and _allowed(n)
                                        and callable(getattr(vk, n))))
def test_allowed_direct_calls_cannot_fail(name):
    """Every function the scan lets through is one the package never raises a VkResult from."""
    src = inspect.getsource(getattr(vk, name))
    assert "exception_codes" not in src, f"{name} can fail: call it through vkapi"


def test_vkapi_raises_vkmulti_errors(manager):
    """The package's exceptions come out as vkmulti's, named by the call, from the one table."""
    with pytest.raises(OutOfDeviceMemoryError) as err:
        vkapi.raise_from_vulkan(vk.VkErrorOutOfDeviceMemory(), "vkAllocateMemory")
    assert err.value.call == "vkAllocateMemory"
    with pytest.raises(TimeoutError):
        vkapi.raise_from_vulkan(vk.VkTimeout(), "vkWaitForFences")
    with pytest.raises(UnsupportedError):
        vkapi.device_function(manager.slot(0).device, "vkNoSuchFunctionEXT")
    assert vkapi.vkCreateBuffer.__name__ == "vkCreateBuffer"
    with pytest.raises(AttributeError):
        vkapi.vkNoSuchThing


def test_vkapi_translates_a_real_failure(manager):
    """A real driver failure through the wrapper: an image format the device refuses."""
    slot = manager.slot(0)
    with pytest.raises(VulkanError) as err:
        vkapi.vkGetPhysicalDeviceImageFormatProperties(slot.physical_device, vk.VK_FORMAT_R8G8B8_SSCALED,
                                                       vk.VK_IMAGE_TYPE_2D, vk.VK_IMAGE_TILING_OPTIMAL,
                                                       vk.VK_IMAGE_USAGE_STORAGE_BIT, 0)
    assert err.value.result == vk.VK_ERROR_FORMAT_NOT_SUPPORTED
    assert err.value.call == "vkGetPhysicalDeviceImageFormatProperties"
