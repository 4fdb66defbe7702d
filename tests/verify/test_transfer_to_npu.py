"""The emulated `transfer_to_npu` follows the real one: every name the real torch_npu's transfer_to_npu.py patches
is patched by the emulation, or named in its docstring as not reproduced.

The real module is read statically from the wheel of the torch_npu that matches the installed torch, as an Ascend
user pairs them (pip downloads it, 10 to 50 MB; nothing of it is imported or installed): the names it assigns in
`_init()` and the helpers it calls, and those its `_device_wrapper` wraps. The emulation is asked dynamically, on the
installed torch, in a child process as verify runs it: which of those names does importing it change. Each torch CI
proves (.ci/run) so checks the transfer_to_npu of its own torch_npu."""

import ast
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from verify import devices

MODULE = "torch_npu/contrib/transfer_to_npu.py"
# torch_npu before 2.7.1 has manylinux2014 wheels only; pip takes the --platform tags it is given literally
PLATFORMS = ("--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64")
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
def identity(name):  # a class counts as patched where its __init__ is (torch_npu 2.4 wraps torch.autocast itself)
    value = resolve(name)
    return id(value), id(value.__init__) if isinstance(value, type) else None
before = {name: identity(name) for name in names}
import torch_npu
from torch_npu.contrib import transfer_to_npu
print(json.dumps(sorted(name for name in names if identity(name) != before[name])))
"""


def matching_torch_npu(torch_version: str) -> list[str]:
    """The torch_npu releases an Ascend user pairs with this torch, best first: those made for its exact version
    (torch_npu 2.9.0.post9 for torch 2.9.0), then the newest of its minor series (torch_npu 2.4.0.post4 for torch
    2.4.1, which has none of its own)."""
    major, minor, patch = torch_version.split("+")[0].split(".")[:3]
    return [f"torch_npu=={major}.{minor}.{patch}.*", f"torch_npu=={major}.{minor}.*"]


def test_the_matching_torch_npu_is_the_one_made_for_this_torch_else_its_minor_series():
    assert matching_torch_npu("2.9.0+cu128") == ["torch_npu==2.9.0.*", "torch_npu==2.9.*"]
    assert matching_torch_npu("2.14.1") == ["torch_npu==2.14.1.*", "torch_npu==2.14.*"]


@pytest.fixture(scope="module")
def real_module(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("torch_npu")
    for requirement in matching_torch_npu(torch.__version__):
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
             "3.11", "--implementation", "cp", *PLATFORMS, "-d", str(folder), requirement],
            capture_output=True, text=True, check=False)
        if wheels := list(folder.glob("torch_npu-*.whl")):
            print(f"checked against {wheels[0].name} (torch {torch.__version__})")
            with zipfile.ZipFile(wheels[0]) as wheel:
                return wheel.read(MODULE).decode()
    pytest.skip(f"no torch_npu for torch {torch.__version__} could be downloaded: {download.stderr.strip()[-200:]}")


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
