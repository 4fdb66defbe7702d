"""What a script compiled with torch.compile, and whether dynamo compiled anything of it, in the manifest
(extra[COMPILE_KEY]: verify/record/schema.py), so that a comparison says what it compared (verify/compare/runs.py).

Dynamo compiles no frame while a TorchDispatchMode that is not torch's own is on the stack ("non-infra torch
dispatch mode present": torch/_dynamo/convert_frame.py), and a run under verify has one: the op capture, the keyed
random draws, an emulated device's numerics. torch.compile still returns its OptimizedModule, whose calls run the
model eagerly, op by op: each op is recorded, and inductor's fused kernels, which a plain run would execute, are not
what is compared. The graphs dynamo did compile (dynamo's own count) say whether that held for the whole run.

torch.compile is wrapped, not changed: the script gets what torch.compile returns. nn.Module.compile() and
torch.compile(mode=...) used as a decorator call torch.compile with their target, and are counted so. An installed
library's functions compiled as its module is imported (DeepSpeed's Muon kernels, Megatron's MoE router methods,
decorated with torch.compile) are not: no step need ever call them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from verify.record.schema import COMPILE_KEY


def _target_name(target: Any) -> str:
    """A module by its class, a bound method (nn.Module.compile's _call_impl) by its module's class, a function by
    its qualified name."""
    owner = getattr(target, "__self__", None)
    if isinstance(target, torch.nn.Module) or isinstance(owner, torch.nn.Module):
        return type(target if owner is None else owner).__name__
    return getattr(target, "__qualname__", type(target).__name__)


_TORCH = str(Path(torch.__file__).resolve().parent)
_INSTALLED = ("site-packages", "dist-packages")
_IMPORTING = "<frozen importlib._bootstrap"  # importlib's frames: a module is being imported


def _imported_library_compiles() -> bool:
    """Whether this torch.compile call is made by an installed library (its first caller past torch's own frames,
    which its decorator form adds) while a module is being imported (importlib's frames are on the stack)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH):
        frame = frame.f_back
    if frame is None or not any(part in _INSTALLED for part in Path(frame.f_code.co_filename).parts):
        return False
    while frame is not None and not frame.f_code.co_filename.startswith(_IMPORTING):
        frame = frame.f_back
    return frame is not None


def _graphs_compiled() -> int:
    """The graphs dynamo compiled in this process (0 where dynamo was never imported)."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    return int(dynamo_utils.counters["stats"]["unique_graphs"]) if dynamo_utils is not None else 0


@contextlib.contextmanager
def counted(extra: dict[str, Any]) -> Iterator[None]:
    """torch.compile counted while the script runs: extra[COMPILE_KEY] = {"calls": how many targets it was given,
    "targets": their names, first seen first, "graphs": the graphs dynamo compiled meanwhile}, set where it was
    called."""
    compile_ = torch.compile
    graphs_before = _graphs_compiled()
    record: dict[str, Any] = {"calls": 0, "targets": [], "graphs": 0}

    def compile_counted(*args: Any, **kwargs: Any) -> Any:
        target = args[0] if args else kwargs.get("model")
        # torch.compile(mode=...) returns a decorator, which calls torch.compile again
        if target is not None and not _imported_library_compiles():
            record["calls"] += 1
            if (name := _target_name(target)) not in record["targets"]:
                record["targets"].append(name)
        return compile_(*args, **kwargs)

    torch.compile = compile_counted
    try:
        yield
    finally:
        torch.compile = compile_
        if record["calls"]:
            record["graphs"] = _graphs_compiled() - graphs_before
            extra[COMPILE_KEY] = record
