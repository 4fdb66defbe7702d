"""The environment a run computed in, and what differs between the two sides of a comparison.

Two runs of one model differ for reasons outside the model: library versions, a TF32/HF32 switch, determinism, an
environment variable, a DataLoader that shuffles on one side only. msprobe's `config_check` compares these between
two machines as a separate step; here every run records them and every comparison lists the differences.

The child (verify/capture/bootstrap.py) calls verify.capture.environment_record.recorded(manifest) around the script: it
records the DataLoaders the script builds and, when the script ends, the settings in effect then, into
manifest.extra["environment"] (verify/record/schema.py). This module holds what a record holds and compares two
(`differences`; which of them explain an op's divergence is verify/compare/findings.py's `explaining`): pure, it
reads two manifests and never imports torch, so a report can be made on any laptop.

Environment variables are recorded by an allow-list of names, never wholesale: a variable that may hold a secret
(a name containing KEY, TOKEN, SECRET, PASSWORD or CREDENTIAL) is never recorded, whatever its prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from verify import devices, frameworks
from verify.devices import HF32, TF32

ENVIRONMENT_KEY = "environment"  # the manifest.extra key
MAX_LOADERS = 8  # a script that builds loaders in a loop would otherwise record one per iteration

# Variables that change numerics, determinism, devices or threads, by exact name or prefix.
RECORDED_NAMES = frozenset({
    "CLOSE_MATMUL_K_SHIFT", "INF_NAN_MODE_ENABLE", "TASK_QUEUE_ENABLE", "ASCEND_LAUNCH_BLOCKING",
    "ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG", "PYTORCH_NPU_ALLOC_CONF",
    "PYTORCH_CUDA_ALLOC_CONF", "CUDA_LAUNCH_BLOCKING", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONHASHSEED", "TORCH_DETERMINISTIC", "LCCL_DETERMINISTIC",
    *frameworks.ENVIRONMENT,  # a framework's launcher chooses its precision so: ACCELERATE_MIXED_PRECISION
})
RECORDED_PREFIXES = ("HCCL_", "NCCL_", "ACL_", "ATB_")
SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)

FULL_FP32 = "fp32"  # what fp32 matmuls/convolutions compute in where no reduced mode (devices.ReducedFp32) is on
# TF32 on a GPU and HF32 on an NPU round fp32 matmul and convolution inputs to the same 10-bit mantissa: one setting
# under two names, so a GPU reference in TF32 and an NPU port in HF32 do not differ in it.
_SAME_NUMERICS = {HF32.name: TF32.name}

# --- the comparison: pure, no torch ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    setting: str  # "precision.fp32_conv", "environment.HCCL_DETERMINISTIC", "data_loaders.0.shuffle", ...
    ref: Any  # None: not set (or not recorded) on that side
    actual: Any

    @property
    def text(self) -> str:
        return f"{self.setting}: ref {_shown(self.ref)}, actual {_shown(self.actual)}"


def _shown(value: Any) -> str:
    """How a setting reads in the diff: a variable set to "" (CUDA_VISIBLE_DEVICES="" hides every GPU) is not unset."""
    if value is None:
        return "unset"
    return '""' if value == "" else str(value)


def record_of(manifest: Any) -> dict[str, Any] | None:
    record = manifest.extra.get(ENVIRONMENT_KEY)
    return record if isinstance(record, dict) else None


def differences(ref_manifest: Any, actual_manifest: Any) -> list[Difference]:
    """Every recorded setting whose value differs between the sides; [] when either side recorded none (a run by
    an older verify, an msprobe dump)."""
    ref, actual = record_of(ref_manifest), record_of(actual_manifest)
    if ref is None or actual is None:
        return []
    ref_flat, actual_flat = _flat(ref), _flat(actual)
    names = sorted((set(ref_flat) | set(actual_flat)) - VERIFYS_OWN, key=_setting_order)
    if _own_fp32_switch(ref_manifest.device) and _own_fp32_switch(actual_manifest.device):
        names = [name for name in names if name != TORCH_MATMUL_PRECISION]
    return [Difference(name, ref_flat.get(name), actual_flat.get(name)) for name in names
            if _numerics(ref_flat.get(name)) != _numerics(actual_flat.get(name))]


# What verify set, not the script: the autocast a reference ran under to match a port that computes in half precision
# (the comparison's policy and its note say so); listed as an environment difference it read as one to mend.
VERIFYS_OWN = frozenset({"amp.imposed_autocast"})

# torch.get_float32_matmul_precision(): on a GPU the TF32 switch under another name (allow_tf32 = True reads "high"),
# on an NPU no switch of torch_npu's (HF32 is torch.npu.matmul.allow_hf32). Between two devices that each have a
# reduced-fp32 switch of their own, their precision.fp32_matmul says what fp32 matmuls compute in, and this setting
# is not compared: nanoGPT's allow_tf32 = True, ported to allow_hf32 = True, reads "high" on the GPU only.
TORCH_MATMUL_PRECISION = "precision.float32_matmul_precision"


def _own_fp32_switch(device: str) -> bool:
    known = devices.DEVICE_TABLE.get(device)
    return known is not None and known.reduced_fp32 is not None


def _numerics(value: Any) -> Any:
    return _SAME_NUMERICS.get(value, value) if isinstance(value, str) else value


def _setting_order(name: str) -> tuple[int, str]:
    """Numerics first (what explains a divergence), versions last."""
    groups = ("precision", "amp", "determinism", "data_loaders", "environment", "versions")
    group = name.split(".", 1)[0]
    return (groups.index(group) if group in groups else len(groups), name)


def _flat(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flat(value, f"{name}."))
        elif isinstance(value, list):
            flat.update(_flat({str(index): item for index, item in enumerate(value)}, f"{name}."))
        else:
            flat[name] = value
    return flat
