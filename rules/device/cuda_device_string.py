from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node

from rules import Case, Mode, PortRule, Unchanged, findall, frameworks
from rules.device._cuda_api import SHARED
from rules.device._rewrite import is_device_name, retarget

# Callables whose first positional argument is a device (or a device type).
_DEVICE_FIRST = frozenset(
    {
        "torch.device",
        "torch.Generator",
        "torch.autocast",
        "torch.amp.autocast",
        "torch.set_default_device",
        "torch.get_device_module",
        "torch.is_autocast_enabled",
        "torch.get_autocast_dtype",
        "torch.set_autocast_dtype",
        "torch.set_autocast_enabled",
    }
)
# Device meshes are DIST006's.
_MESHES = frozenset(
    {
        "torch.distributed.init_device_mesh",
        "torch.distributed.DeviceMesh",
        "torch.distributed.device_mesh.init_device_mesh",
        "torch.distributed.device_mesh.DeviceMesh",
    }
)
# Keywords that take a device besides the `device`-like names (`device`, `device_type`, `pin_memory_device` ...),
# torch's and the frameworks' (Hugging Face's `device_map=`: a device, or a dict of modules to devices).
_DEVICE_KEYWORDS = frozenset({"map_location", "device_id", "device_ids", "output_device",
                              *frameworks.transformers.DEVICE_KEYWORDS})
# Tensor/Module methods whose first positional argument may be a device.
_DEVICE_METHODS = frozenset({"to", "pin_memory"})


class CudaDeviceString(PortRule):
    """Name the `npu` device where a device argument, default or setting says `"cuda"`.

    ## What it does
    In explicit mode, turns `"cuda"`, `"cuda:N"`, `f"cuda:{i}"` and `"cuda:%d" % i`-style values into their `npu`
    form, but only in device positions: the first argument of `torch.device`, `torch.Generator`, `torch.autocast`
    and of the `torch.cuda` functions torch_npu provides, `.to(...)` and `.pin_memory(...)`, the second argument of
    `torch.load`; the keywords `device=`, `device_type=`, `map_location=` (dict values; keys name where the
    checkpoint was saved and stay), `device_id(s)=`, `output_device=`, `pin_memory_device=`, Hugging Face's
    `device_map=` (`from_pretrained(..., device_map="cuda")`, dict values too); the default and choices
    of an argparse `--device` option; values assigned to a variable, attribute, parameter or dict key named like a
    device; and both branches of `"cuda" if torch.cuda.is_available() else "cpu"`.

    ## Why
    Without `transfer_to_npu` nothing translates the device at run time: `torch.device("cuda")` needs a CUDA
    build. Strings elsewhere (log messages, help texts) are not devices and stay as they are.

    ## Safety
    Safe: only values in device positions change. Comparisons with "cuda" are DEV006's, device meshes DIST006's.

    ## References
    torch_npu/contrib/transfer_to_npu.py (which keywords it translates at run time); torch/utils/data/dataloader.py
    (pin_memory_device).
    """

    CODE = "DEV004"
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.EXPLICIT})
    TRIGGERS = ("cuda",)
    EXAMPLES = (
        Case(
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model.to("cuda:0")  # first card
            x = torch.zeros(3, device=f"cuda:{rank}")
            print("using cuda")
            """,
            """
            import torch
            device = torch.device("npu" if torch.cuda.is_available() else "cpu")
            model.to("npu:0")  # first card
            x = torch.zeros(3, device=f"npu:{rank}")
            print("using cuda")
            """,
            lines=[2, 3, 4],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cuda or cpu")
            parser.add_argument("--backend", default="cuda")
            """,
            """
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="npu", choices=["npu", "cpu"], help="cuda or cpu")
            parser.add_argument("--backend", default="cuda")
            """,
            lines=[3],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            import torch
            ckpt = torch.load(path, map_location={"cuda:1": "cuda:0"})
            state = torch.load(path, "cuda")
            loader = DataLoader(ds, pin_memory=True, pin_memory_device="cuda")
            g = torch.Generator(device="cuda").manual_seed(0)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                pass
            model = AutoModelForCausalLM.from_pretrained(name, device_map={"": "cuda:0"})
            """,
            """
            import torch
            ckpt = torch.load(path, map_location={"cuda:1": "npu:0"})
            state = torch.load(path, "npu")
            loader = DataLoader(ds, pin_memory=True, pin_memory_device="npu")
            g = torch.Generator(device="npu").manual_seed(0)
            with torch.autocast("npu", dtype=torch.bfloat16):
                pass
            model = AutoModelForCausalLM.from_pretrained(name, device_map={"": "npu:0"})
            """,
            lines=[2, 3, 4, 5, 6, 8],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            import torch
            DEVICE = "cuda"
            self.device = "cuda:%d" % local_rank
            cfg = {"device": "cuda:{}".format(gpu), "name": "cuda"}

            def train(model, device="cuda" + ":" + str(rank), steps=10):
                torch.cuda.set_device("cuda:1")
            """,
            """
            import torch
            DEVICE = "npu"
            self.device = "npu:%d" % local_rank
            cfg = {"device": "npu:{}".format(gpu), "name": "cuda"}

            def train(model, device="npu" + ":" + str(rank), steps=10):
                torch.cuda.set_device("npu:1")
            """,
            lines=[2, 3, 4, 6, 7],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            import torch as th
            dev = "cuda" if th.cuda.is_available() and not args.cpu else "cpu"
            model = DDP(model, device_ids=["cuda:0"], output_device="cuda:0")
            """,
            """
            import torch as th
            dev = "npu" if th.cuda.is_available() and not args.cpu else "cpu"
            model = DDP(model, device_ids=["npu:0"], output_device="npu:0")
            """,
            lines=[2, 3],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import torch
            device = torch.device("cuda")
            """
        ),
        Unchanged(
            """
            import logging
            logging.info("cuda")
            backend = "cuda"
            name = f"cuda:{rank}"
            parser.add_argument("--device", help="cuda or cpu")
            x = y.to(torch.float16)
            msg = "cuda" if ok else "cpu"
            """,
            mode=Mode.EXPLICIT,
        ),
    )

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._device_args: set[cst.Arg] = set()

    def visit_Call(self, node: cst.Call) -> None:
        callee = self.qualified_names(node.func)
        if not callee.isdisjoint(_MESHES):
            return
        method = node.func.attr.value if isinstance(node.func, cst.Attribute) else None
        positional = [arg for arg in node.args if arg.keyword is None and not arg.star]
        if not callee.isdisjoint(_DEVICE_FIRST) or method in _DEVICE_METHODS:
            self._device_args.update(positional[:1])
        if any(name.rpartition(".")[0] == "torch.cuda" and name.rpartition(".")[2] in SHARED for name in callee):
            self._device_args.update(positional)
        if "torch.load" in callee:
            self._device_args.update(positional[1:2])
        device_option = method == "add_argument" and any(_is_device_option(arg.value) for arg in positional)
        for arg in node.args:
            keyword = arg.keyword.value if arg.keyword else None
            if keyword is None:
                continue
            if is_device_name(keyword) or keyword in _DEVICE_KEYWORDS:
                self._device_args.add(arg)
            elif keyword == "type" and "torch.device" in callee:
                self._device_args.add(arg)
            elif device_option and keyword in ("default", "choices"):
                self._device_args.add(arg)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if original_node not in self._device_args:
            return updated_node
        return self._retarget(original_node.value, updated_node, "value")

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if not any(_names_device(target.target) for target in original_node.targets):
            return updated_node
        return self._retarget(original_node.value, updated_node, "value")

    def leave_AnnAssign(self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign) -> cst.AnnAssign:
        if original_node.value is None or not _names_device(original_node.target):
            return updated_node
        return self._retarget(original_node.value, updated_node, "value")

    def leave_Param(self, original_node: cst.Param, updated_node: cst.Param) -> cst.Param:
        if original_node.default is None or not is_device_name(original_node.name.value):
            return updated_node
        return self._retarget(original_node.default, updated_node, "default")

    def leave_DictElement(self, original_node: cst.DictElement, updated_node: cst.DictElement) -> cst.DictElement:
        if not _names_device(original_node.key):
            return updated_node
        return self._retarget(original_node.value, updated_node, "value")

    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        """`"cuda" if torch.cuda.is_available() else "cpu"` is a device wherever it stands."""
        checks = findall(original_node.test, m.Call())
        if not any(self.refers_to(call.func, "torch.cuda.is_available") for call in checks):  # type: ignore[attr-defined]
            return updated_node
        new = retarget(updated_node)
        if new is None:
            return updated_node
        return self.replace(original_node, updated_node, new, "device `cuda` -> `npu` in the availability idiom")

    def _retarget(self, original: cst.BaseExpression, updated: cst.CSTNode, field: str) -> cst.CSTNode:
        new = retarget(getattr(updated, field))
        if new is None:
            return updated
        before, after = (cst.Module([]).code_for_node(node) for node in (getattr(updated, field), new))
        return self.replace(original, updated, updated.with_changes(**{field: new}), f"device `{before}` -> `{after}`")


def _names_device(target: cst.BaseExpression) -> bool:
    """Whether an assignment target or dict key is named like a device: `device`, `self.device`, `cfg["dev"]`."""
    if isinstance(target, cst.Subscript) and len(target.slice) == 1:
        index = target.slice[0].slice
        return isinstance(index, cst.Index) and _names_device(index.value)
    if isinstance(target, cst.SimpleString):
        value = target.evaluated_value
        return isinstance(value, str) and is_device_name(value)
    name = get_full_name_for_node(target)
    return name is not None and is_device_name(name.rpartition(".")[2])


def _is_device_option(flag: cst.BaseExpression) -> bool:
    """Whether an argparse option string names a device: `"--device"`, `"--train-device"`."""
    if not isinstance(flag, cst.SimpleString):
        return False
    value = flag.evaluated_value
    return isinstance(value, str) and value.startswith("-") and is_device_name(value.lstrip("-").replace("-", "_"))
