"""The model's parameters and buffers that `Module.to_empty` allocated and nothing wrote before the first forward: the
script trains them, or computes with them, from whatever the device's memory held.

Building a large model on the meta device, sharding it (FSDP2's fully_shard) and then calling
`model.to_empty(device=...)` followed by the script's own initialization (`model.reset_parameters()`, an `init_weights`
applied to every module, a checkpoint loaded) is how sharded training starts. A `reset_parameters` that forgets a
submodule leaves its parameters as the allocator gave them: zeros on an emulated device (its memory is read as
fresh device memory), any values on a real one. Such a model trains, its loss goes down; but the layers computed from
those parameters compute what their memory says (pytorch/examples' FSDP2 example: every transformer block's weights
are zeros, so each block adds nothing, and a change to a block's arithmetic changes no number). A comparison of them
proves nothing, and on two real devices the two sides start from different values.

Buffers are allocated alike: a rotary embedding's frequencies or a causal mask computed in `__init__` on the meta
device hold nothing after the `to_empty`, unless the script computes them again (torchtitan's init_weights assigns
freqs_cis anew); a norm's running statistics unless its reset_parameters ran.

A parameter or buffer counts as written when any in-place write reached it (its version counter, and its local
shard's for a DTensor, moved), when its storage changed (`param.data = ...`), or when the module holds another tensor
under its name (`load_state_dict(assign=True)`, a buffer assigned anew). The check runs once, at the first forward
after the `to_empty`, before any module's own hook (FSDP2's lazy init): what the script did to its model before it
trained is done by then.

The manifest's extra[UNWRITTEN_KEY] names them: {"where": "train.py:87", "count": N, "of": M, "names": the first
NAMES} for the parameters, and where buffers were left, "buffers": {"count", "of", "names"} alike.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from verify.capture.source_lines import SourceLines
from verify.record.schema import UNWRITTEN_KEY

NAMES = 8  # the parameters (and buffers) the manifest names; `count` says how many there are


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank; any other tensor itself."""
    return getattr(tensor, "_local_tensor", tensor)


def _trace(tensor: torch.Tensor) -> tuple[int, int, int]:
    """What a write to `tensor` changes: its version, its local shard's, and where its memory is."""
    local = _local(tensor)
    return tensor._version, local._version, local.untyped_storage().data_ptr()


KINDS = ("parameters", "buffers")


class _Allocated:
    """The parameters and buffers one `to_empty` call allocated, as it left them."""

    def __init__(self, module: torch.nn.Module, where: str) -> None:
        self.where = where
        self.tensors = {kind: [(name, weakref.ref(tensor), _trace(tensor))
                               for name, tensor in getattr(module, f"named_{kind}")()] for kind in KINDS}
        self.module = weakref.ref(module)

    def unwritten(self, kind: str) -> list[str]:
        module = self.module()
        if module is None:
            return []
        held = dict(getattr(module, f"named_{kind}")())
        return [name for name, allocated, trace in self.tensors[kind]
                if (tensor := allocated()) is not None and held.get(name) is tensor and _trace(tensor) == trace]

    def record(self) -> dict[str, Any] | None:
        """extra[UNWRITTEN_KEY] of this call; None where it left nothing unwritten."""
        left = {kind: self.unwritten(kind) for kind in KINDS}
        if not any(left.values()):
            return None
        parameters = left["parameters"]
        record: dict[str, Any] = {"where": self.where, "count": len(parameters),
                                  "of": len(self.tensors["parameters"]), "names": parameters[:NAMES]}
        if left["buffers"]:
            record["buffers"] = {"count": len(left["buffers"]), "of": len(self.tensors["buffers"]),
                                 "names": left["buffers"][:NAMES]}
        return record


@contextlib.contextmanager
def watched(extra: dict[str, Any], *roots: Path) -> Iterator[None]:
    """Module.to_empty noted while the script runs; at the first forward after it, the parameters and buffers
    nothing wrote go into `extra`."""
    to_empty = torch.nn.Module.to_empty
    sources = SourceLines(*roots)
    allocated: list[_Allocated] = []
    hook: list[Any] = []

    def check_at_first_forward(*_: Any) -> None:
        hook.pop().remove()
        for calls in allocated:
            if record := calls.record():
                extra[UNWRITTEN_KEY] = record
                break  # the first to_empty that left some: one finding is what the user acts on
        allocated.clear()

    def noted_to_empty(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        module = to_empty(self, *args, **kwargs)
        allocated.append(_Allocated(self, sources.here()))
        if not hook:
            hook.append(torch.nn.modules.module.register_module_forward_pre_hook(check_at_first_forward))
        return module

    torch.nn.Module.to_empty = noted_to_empty
    try:
        yield
    finally:
        torch.nn.Module.to_empty = to_empty
        for handle in hook:
            handle.remove()
