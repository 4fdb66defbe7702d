"""What the child records of its environment (verify/record/environment.py says what a record holds and compares two):
versions, the precision and determinism switches in effect, allow-listed variables and the DataLoaders the script
builds. Runs only in the child, which imports torch.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any, Iterator

from verify import devices
from verify.record.environment import (ENVIRONMENT_KEY, FULL_FP32, MAX_LOADERS, RECORDED_NAMES, RECORDED_PREFIXES,
                                       SECRET)


@contextlib.contextmanager
def recorded(manifest: Any) -> Iterator[None]:
    """Records the DataLoaders built inside the block and, at its end, the environment, into `manifest.extra`.

    A record is written at the start too, so a run that never ends still says which versions and variables it had.
    """
    import torch.utils.data

    loaders: list[dict[str, Any]] = []
    original_init = torch.utils.data.DataLoader.__init__

    @functools.wraps(original_init)  # its signature stays DataLoader's: Lightning rebuilds a loader from it
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if len(loaders) < MAX_LOADERS:
            loaders.append(_loader_settings(self))

    manifest.extra[ENVIRONMENT_KEY] = collect(manifest, loaders)
    torch.utils.data.DataLoader.__init__ = init
    try:
        yield
    finally:
        torch.utils.data.DataLoader.__init__ = original_init
        manifest.extra[ENVIRONMENT_KEY] = collect(manifest, loaders)


def collect(manifest: Any, loaders: list[dict[str, Any]]) -> dict[str, Any]:
    """The record: versions, precision, determinism and AMP settings, variables, data loaders."""
    import torch

    return {
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "torch_npu": _torch_npu_version(), "cann": _cann_version()},
        "precision": _precision(manifest.device),
        "determinism": {
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "fill_uninitialized_memory": bool(torch.utils.deterministic.fill_uninitialized_memory),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        },
        "amp": {"imposed_autocast": manifest.autocast or "off", **_npu_options()},
        "environment": recorded_variables(os.environ),
        "data_loaders": list(loaders),
    }


def recorded_variables(environ: Any) -> dict[str, str]:
    """The allow-listed variables of `environ`, never one whose name suggests a secret."""
    return {name: environ[name] for name in sorted(environ)
            if (name in RECORDED_NAMES or name.startswith(RECORDED_PREFIXES)) and not SECRET.search(name)}


def _torch_npu_version() -> str:
    """torch_npu's version ("" without it); the emulated NPU's says "+emulated"."""
    return str(getattr(sys.modules.get("torch_npu"), "__version__", ""))


def _cann_version() -> str:
    """The CANN toolkit's version, from its install folder's version file; "" without CANN."""
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or os.environ.get("ASCEND_HOME_PATH")
    if not home:
        return ""
    for name in ("version.cfg", "compiler/version.info", "runtime/version.info"):
        try:
            text = (Path(home) / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        match = re.search(r"(?:Version|version)\s*[=:]\s*([\w.\-]+)", text)
        if match:
            return match.group(1)
    return ""


def _precision(device: str) -> dict[str, Any]:
    """What fp32 matmuls and convolutions compute in on this run's device: the switches its row of the device table
    names (a CPU computes fp32 as fp32 whatever the CUDA switches say)."""
    import torch

    reduced = devices.row(device).reduced_fp32
    matmul = _fp32_mode(reduced, reduced.matmul_switch) if reduced else FULL_FP32
    conv = _fp32_mode(reduced, reduced.conv_switch) if reduced else FULL_FP32
    return {"fp32_matmul": matmul, "fp32_conv": conv,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def _fp32_mode(reduced: devices.ReducedFp32, switch: str) -> str:
    """`reduced`'s name where its switch is on; full fp32 where it is off or this torch lacks it (torch.npu before
    torch_npu is imported)."""
    import torch

    try:
        return reduced.name if operator.attrgetter(switch)(torch) else FULL_FP32
    except AttributeError:
        return FULL_FP32


def _npu_options() -> dict[str, Any]:
    """ACL_PRECISION_MODE as set through torch_npu.npu.set_option (implicit fp16 on Atlas training series)."""
    npu = getattr(sys.modules.get("torch_npu"), "npu", None)
    options = getattr(npu, "_settings", {}).get("options", {}) if npu is not None else {}
    return {"acl_precision_mode": options["ACL_PRECISION_MODE"]} if "ACL_PRECISION_MODE" in options else {}


def _loader_settings(loader: Any) -> dict[str, Any]:
    sampler = loader.sampler
    shuffle = type(sampler).__name__ == "RandomSampler" or bool(getattr(sampler, "shuffle", False))
    return {
        "batch_size": loader.batch_size,
        "shuffle": shuffle,
        "num_workers": loader.num_workers,
        "sampler": type(sampler).__name__,
        "drop_last": loader.drop_last,
        "seeded_generator": loader.generator is not None,
    }
