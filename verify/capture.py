"""Per-operator capture: a TorchDispatchMode that summarises every aten op's tensors, with the module path and
phase from ModuleTracker, at a cost close to the plain run.

Why it is cheap:
- statistics are a few reductions per tensor, left on the device; they are stacked and fetched once per step
  (`StatBatch.fetch`), so there is no host sync per op;
- NaN/inf counting needs two extra passes that are slow on CPU; there, where reading a number is not a device sync,
  the counts are taken only when min or max is not finite (NaN propagates through aminmax), else they are 0;
- view and bookkeeping ops, and ops that return uninitialised memory, are not recorded (as FlopCounterMode does);
- per-op Python work is a few dict lookups: names and skip decisions are cached per OpOverload.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.module_tracker import ModuleTracker

from verify.schema import DumpMode, Phase, TENSORS_DIR, step_file

aten = torch.ops.aten

_NOT_RECORDED = {
    # uninitialised memory: its contents differ from run to run and mean nothing
    aten.empty,
    aten.empty_like,
    aten.empty_strided,
    aten.new_empty,
    aten.new_empty_strided,
    # storage bookkeeping
    aten.resize_,
    aten.set_,
}

Handle = tuple[tuple[Any, ...], int, int]


class StatBatch:
    """0-d statistic tensors left on their device until the step ends, then fetched with one stack per
    (device, dtype): one transfer per step instead of one per tensor, and no per-tensor stack either."""

    def __init__(self) -> None:
        self._groups: dict[tuple[Any, ...], list[torch.Tensor]] = {}

    def add(self, *scalars: torch.Tensor) -> Handle:
        key = (scalars[0].device, scalars[0].dtype)
        group = self._groups.setdefault(key, [])
        group.extend(scalars)
        return key, len(group) - len(scalars), len(scalars)

    def fetch(self) -> Callable[[Handle], list[float]]:
        groups, self._groups = self._groups, {}
        values = {key: torch.stack(group).tolist() for key, group in groups.items()}
        return lambda handle: values[handle[0]][handle[1] : handle[1] + handle[2]]


@dataclass(slots=True)
class PendingStats:
    """A tensor's summary whose numbers still sit on the device (handles into a StatBatch)."""

    dtype: str
    shape: str
    numel: int
    extremes_and_sums: Handle | None = None  # float: (min, max, sum, l2 norm); integer/bool: (min, max)
    nonfinite_counts: Handle | None = None  # (nan, inf); None: known to be 0, or not applicable

    def resolve(self, fetched: Callable[[Handle], list[float]]) -> dict[str, Any]:
        """The schema's statistic columns (min, max, mean, l2_norm, nan_count, inf_count) as plain numbers."""
        low = high = mean = norm = None
        if self.extremes_and_sums is not None:
            values = fetched(self.extremes_and_sums)
            low, high = float(values[0]), float(values[1])
            if len(values) == 4:
                mean, norm = values[2] / self.numel, values[3]
        nan, inf = (int(count) for count in fetched(self.nonfinite_counts)) if self.nonfinite_counts else (0, 0)
        return {"min": low, "max": high, "mean": mean, "l2_norm": norm, "nan_count": nan, "inf_count": inf}


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def has_readable_data(tensor: torch.Tensor) -> bool:
    return tensor.layout == torch.strided and not tensor.is_meta and tensor.numel() > 0


def summarize(tensor: torch.Tensor, batch: StatBatch) -> PendingStats:
    """Queues a tensor's statistics on its device. Sparse, meta, empty and complex tensors get dtype, shape and
    numel only; integer and bool tensors min and max. Callers outside the dispatch mode hold torch.no_grad()."""
    stats = PendingStats(dtype_name(tensor.dtype), "x".join(map(str, tensor.shape)), tensor.numel())
    if not has_readable_data(tensor) or tensor.is_complex():
        return stats
    if not tensor.is_floating_point():
        stats.extremes_and_sums = batch.add(*torch.aminmax(tensor))
        return stats
    accumulate = torch.float64 if tensor.dtype == torch.float64 else torch.float32
    low, high = torch.aminmax(tensor)
    if tensor.dtype != accumulate:
        low, high = low.to(accumulate), high.to(accumulate)
    total, norm = tensor.sum(dtype=accumulate), torch.linalg.vector_norm(tensor, dtype=accumulate)
    stats.extremes_and_sums = batch.add(low, high, total, norm)
    if tensor.device.type != "cpu" or not (math.isfinite(low.item()) and math.isfinite(high.item())):
        stats.nonfinite_counts = batch.add(tensor.isnan().sum(), tensor.isinf().sum())
    return stats


def host_array(tensor: torch.Tensor) -> np.ndarray:
    """A numpy copy of a tensor; bfloat16 (which numpy lacks) becomes float32, which holds it exactly."""
    tensor = tensor.detach().resolve_conj().resolve_neg()
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.cpu().numpy()


def md5_of(tensor: torch.Tensor) -> str:
    """Hash of the tensor's bytes in logical order: equal hashes mean bit-identical values (same dtype)."""
    if not has_readable_data(tensor):
        return ""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
    return hashlib.md5(raw.numpy().tobytes()).hexdigest()


STAT_COLUMNS = ("min", "max", "mean", "l2_norm", "nan_count", "inf_count")
_ROW_COLUMNS = ("seq", "phase", "module", "op", "call_index", "io", "md5", "tensor_file")
_PENDING_COLUMNS = ("dtype", "shape", "numel")


@dataclass(slots=True)
class OpRow:
    seq: int
    phase: str
    module: str
    op: str
    call_index: int
    io: str
    stats: PendingStats
    md5: str = ""
    tensor_file: str = ""


class TensorSaver:
    """Tensor mode: saves the tensors of ops whose "phase/module/op" matches a regex, until a byte budget is spent."""

    def __init__(self, pattern: str | None, budget_bytes: int, save: Callable[[str, np.ndarray], str]) -> None:
        self._pattern = re.compile(pattern) if pattern else None
        self._budget = budget_bytes
        self._save = save
        self.budget_exhausted = False

    def wants(self, phase: str, module: str, op: str) -> bool:
        return self._pattern is None or self._pattern.search(f"{phase}/{module}/{op}") is not None

    def save(self, tensor: torch.Tensor, relative: str) -> str:
        size = tensor.numel() * tensor.element_size()
        if not has_readable_data(tensor) or size > self._budget:
            self.budget_exhausted = self.budget_exhausted or size > self._budget
            return ""
        self._budget -= size
        return self._save(relative, host_array(tensor))


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Tensors of an op's outputs or arguments: a tensor, or a tuple/list of tensors (and of lists, for foreach)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in tensors_in(item)]
    return []


class _OpRecorder(TorchDispatchMode):
    """Records a summary of each op's outputs (and inputs, in tensor mode) into `capture.rows`."""

    def __init__(self, capture: OpCapture) -> None:
        super().__init__()
        self.capture = capture
        self._names: dict[torch._ops.OpOverload, str | None] = {}

    def _name(self, func: torch._ops.OpOverload) -> str | None:
        if func not in self._names:
            recorded = not func.is_view and func.namespace != "profiler" and func._overloadpacket not in _NOT_RECORDED
            self._names[func] = str(func._overloadpacket) if recorded else None
        return self._names[func]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        capture = self.capture
        name = self._name(func) if capture.recording else None
        if name is None:
            return func(*args, **kwargs)
        call = capture.begin_call(name)
        if capture.with_inputs:
            capture.record(call, "in", tensors_in(args) + tensors_in(list(kwargs.values())))
        out = func(*args, **kwargs)
        outputs = tensors_in(out)
        if not outputs:  # in-place ops that return nothing (foreach): their results are the written arguments
            outputs = tensors_in(self._written(func, args, kwargs))
        capture.record(call, "out", outputs)
        return out

    @staticmethod
    def _written(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[Any]:
        """The arguments an op writes to: the results of in-place ops that return nothing (the foreach ones)."""
        written = []
        for position, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            if argument.name in kwargs:
                written.append(kwargs[argument.name])
            elif position < len(args):
                written.append(args[position])
        return written


@dataclass(slots=True)
class _Call:
    seq: int
    phase: str
    module: str
    op: str
    call_index: int
    save_tensors: bool


class OpCapture:
    """Context manager that records op summaries for the current step; `take_step` hands them over as columns.

    `in_optimizer` is set by whoever watches optimizer.step() (the bootstrap's step hooks), since only it knows.
    `paused()` keeps the instrumentation's own tensor work out of the records.
    """

    def __init__(self, dump: DumpMode, batch: StatBatch, saver: TensorSaver | None = None) -> None:
        self.dump = dump
        self.batch = batch
        self.saver = saver
        self.with_inputs = dump == DumpMode.TENSOR
        self.tracker = ModuleTracker()
        self.recording = True
        self.in_optimizer = False
        self.rows: list[OpRow] = []
        self._seq = 0
        self._call_counts: dict[tuple[str, str, str], int] = {}
        self._step = 0
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> OpCapture:
        self._stack.enter_context(self.tracker)
        self._stack.enter_context(_OpRecorder(self))
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        previous, self.recording = self.recording, False
        try:
            yield
        finally:
            self.recording = previous

    def module_path(self) -> str:
        """The innermost module running (its forward or its backward); "" outside modules."""
        innermost = ""
        for name in self.tracker.parents:
            if name != "Global" and len(name) > len(innermost):  # a child's path extends its parent's
                innermost = name
        return innermost

    def phase(self, module: str) -> str:
        if self.in_optimizer:
            return Phase.OPTIMIZER.value
        if self.tracker.is_bw:
            return Phase.BACKWARD.value
        return Phase.FORWARD.value if module else Phase.OTHER.value

    def begin_call(self, op: str) -> _Call:
        module = self.module_path()
        phase = self.phase(module)
        counter = (phase, module, op)
        call_index = self._call_counts.get(counter, 0)
        self._call_counts[counter] = call_index + 1
        self._seq += 1
        save = self.saver is not None and self.saver.wants(phase, module, op)
        return _Call(self._seq - 1, phase, module, op, call_index, save)

    def record(self, call: _Call, io: str, tensors: Sequence[torch.Tensor]) -> None:
        for position, tensor in enumerate(tensors):
            row = OpRow(call.seq, call.phase, call.module, call.op, call.call_index, f"{io}{position}",
                        summarize(tensor, self.batch))
            if self.dump == DumpMode.MD5:
                row.md5 = md5_of(tensor)
            if call.save_tensors:
                relative = f"{TENSORS_DIR}/{step_file(self._step, '')}/{call.seq:06d}-{row.io}.npy"
                row.tensor_file = self.saver.save(tensor, relative)
            self.rows.append(row)

    def take_step(self, step: int, fetched: Callable[[Handle], list[float]]) -> dict[str, list[Any]]:
        """The rows of `step` as OP_COLUMNS lists (statistics resolved from `fetched`); starts the next step."""
        rows = self.rows
        statistics = [row.stats.resolve(fetched) for row in rows]
        columns: dict[str, list[Any]] = {
            "step": [step] * len(rows),
            "key": [f"{step}/{row.phase}/{row.module}/{row.op}#{row.call_index}" for row in rows],
            **{name: [getattr(row, name) for row in rows] for name in _ROW_COLUMNS},
            **{name: [getattr(row.stats, name) for row in rows] for name in _PENDING_COLUMNS},
            **{name: [values[name] for values in statistics] for name in STAT_COLUMNS},
        }
        self.discard_step(step + 1)
        return columns

    def discard_step(self, next_step: int) -> None:
        self.rows = []
        self._seq = 0
        self._call_counts = {}
        self._step = next_step
