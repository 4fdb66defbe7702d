"""The emulated `transfer_to_npu` follows the real one: every name the real torch_npu's transfer_to_npu.py patches
is patched by the emulation, or named in its docstring as not reproduced.

The real module is read statically from the torch_npu wheel (pip downloads it, about 44 MB; nothing of it is
imported or installed): the names it assigns in `_init()` and the helpers it calls, and those its `_device_wrapper`
wraps. The emulation is asked dynamically, in a child process as verify runs it: which of those names does importing
it change."""

import ast
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from verify import devices

TORCH_NPU = "torch_npu==2.14.0"  # the newest at the time of writing; a newer one is checked by bumping this
MODULE = "torch_npu/contrib/transfer_to_npu.py"
EMULATED = devices.STAND_IN_DIR / "torch_npu" / "contrib" / "transfer_to_npu.py"

_CHANGED_BY_IMPORT = """
import json, sys
import torch
import torch.distributed
names = json.loads(sys.stdin.read())
def resolve(name):
    value = sys.modules.get(name.split(".")[0])
    for part in name.split(".")[1:]:
        value = getattr(value, part, None)
    return value
before = {name: id(resolve(name)) for name in names}
import torch_npu
from torch_npu.contrib import transfer_to_npu
print(json.dumps(sorted(name for name in names if id(resolve(name)) != before[name])))
"""


@pytest.fixture(scope="module")
def real_module(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("torch_npu")
    download = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
         "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "-d", str(folder), TORCH_NPU],
        capture_output=True, text=True)
    wheels = list(folder.glob("torch_npu-*.whl"))
    if download.returncode != 0 or not wheels:
        pytest.skip(f"the {TORCH_NPU} wheel could not be downloaded here: {download.stderr.strip()[-200:]}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        return wheel.read(MODULE).decode()


def patched_names(source: str) -> set[str]:
    """The torch names the real module's `_init()` (and the helpers it calls) assigns or wraps."""
    tree = ast.parse(source)
    lists = {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
             if isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
             and isinstance(node.targets[0], ast.Name)}
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    names: set[str] = set()
    pending, seen = ["_init"], set()
    while pending:
        function = pending.pop()
        if function in seen or function not in functions:
            continue
        seen.add(function)
        for node in ast.walk(functions[function]):
            if isinstance(node, ast.Assign):
                names.update(name for name in map(_dotted, node.targets) if name.startswith("torch"))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                pending.append(node.func.id)
                if node.func.id == "_device_wrapper":
                    owner, wrapped = _dotted(node.args[0]), node.args[1]
                    wrapped = lists[wrapped.id] if isinstance(wrapped, ast.Name) else ast.literal_eval(wrapped)
                    names.update(f"{owner}.{name}" for name in wrapped)
    return names


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def changed_by_the_emulation(names: set[str], tmp_path: Path) -> set[str]:
    env = {**os.environ, **devices.emulation_env("cpu")}
    done = subprocess.run([sys.executable, "-c", _CHANGED_BY_IMPORT], input=json.dumps(sorted(names)), env=env,
                          cwd=tmp_path, capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def listed_as_not_reproduced() -> tuple[str, ...]:
    docstring = ast.get_docstring(ast.parse(EMULATED.read_text()))
    return tuple(re.findall(r"`([\w.]+)`", docstring.split("Not reproduced", 1)[1]))


def test_every_name_the_real_transfer_to_npu_patches_is_patched_or_listed(real_module, tmp_path):
    names = patched_names(real_module)
    assert {"torch.Tensor.cuda", "torch.distributed.init_process_group", "torch.randn"} <= names  # the reader works
    listed = listed_as_not_reproduced()
    missing = sorted(name for name in names - changed_by_the_emulation(names, tmp_path)
                     if not any(name == entry or name.startswith(f"{entry}.") for entry in listed))
    assert not missing, f"patched by the real transfer_to_npu, neither patched nor listed by the emulation: {missing}"
