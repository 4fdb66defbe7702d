"""Per-operator capture: a TorchDispatchMode that summarises every aten op's tensors, with the module path and
phase that torch.utils.module_tracker.ModuleTracker would report, at a cost close to the plain run.

Why it is cheap:
- on the CPU, a tensor's statistics are taken in one pass by the optional C extension `verify._stats` (torch needs
  three: aminmax, sum and vector_norm); without it, by torch's reductions below;
- on an accelerator (CUDA, or the NPU through the same torch.get_device_module code) statistics stay on the device
  until the step ends (`DeviceStats`: small tensors cost one copy and are reduced together by segment_reduce, large
  ones by a few reductions at once); `StatBatch.ship` copies a step's statistics to pinned host memory once per
  device, on a side stream, and the bootstrap reads them a step later where the copy is not done yet: no host sync
  per op, nor per step. `StatBatch(device_path_on_cpu=True)` runs that code on CPU tensors, for tests;
- ops are seen by a dispatch mode, not by module and autograd-node hooks, which see modules and not the aten ops
  inside them (a functional call, the loss's arithmetic): hooks would give other records;
- on the CPU without the C extension, a small tensor's reductions cost mostly the fixed overhead of each call, so small
  tensors are copied (one call) and reduced many at a time (`SmallTensorStats`); only large tensors are reduced one
  by one, while still in cache;
- NaN/inf counting needs two extra passes that are slow on CPU; there, where reading a number is not a device sync,
  a large tensor's counts are taken only when its sum is not finite, else they are 0;
- view and bookkeeping ops, and ops that return uninitialised memory, are not recorded (as FlopCounterMode does);
- module paths come from two global module hooks and plain tensor hooks (`ModuleScopes`), not ModuleTracker's
  pytree walks and multi-grad hooks; per-op Python work is a few dict lookups, cached per OpOverload.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import operator
import re
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode, _pop_mode_temporarily
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle

from verify.schema import INPUT_OP, STAT_COLUMNS, UPDATE_OP, DumpMode, Phase, TENSORS_DIR, op_key, step_file

try:  # built by `pip install` where a C compiler is found (verify/_stats.c)
    from verify import _stats as native_stats
except ImportError:
    native_stats = None

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

Handle = tuple[Any, int, int]
_DEAD = lambda: None  # noqa: E731  (a weak reference whose tensor is gone)
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


class StatBatch:
    """Statistics left on their devices until the step ends, then shipped to the host with one copy per device
    (`ship`), read later (`Shipment.read`): no host sync per op, nor per (device, dtype).

    On an accelerator the copy runs on a side stream into pinned memory, so a caller that reads a step's numbers
    only once the next step is queued (the bootstrap writes step N's records at the end of step N+1) never makes the
    device wait for the host. Tensors on an accelerator are reduced there (`DeviceStats`); CPU tensors on the host
    (the C extension, `SmallTensorStats`), unless `device_path_on_cpu`, which sends them through the accelerator's
    code (tests drive it on CPU tensors). Numbers already on the host (`add_numbers`) come back through the same
    handles."""

    _NUMBERS = "numbers"  # the group of host numbers
    _ROWS = "rows"  # keys (device, dtype, _ROWS): groups of 1-d tensors (DeviceStats' per-tensor rows)

    def __init__(self, device_path_on_cpu: bool = False) -> None:
        self.device_path_on_cpu = device_path_on_cpu
        self._groups: dict[Any, list[Any]] = {}
        self._sizes: dict[Any, int] = {}
        self._producers: list[Callable[[], None]] = []
        self._side_copies: dict[torch.device, _SideCopy] = {}
        self.device_stats = DeviceStats(self)

    def keeps_on_device(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor`'s statistics are reduced by torch on its device and read only after the step's copy."""
        return not tensor.is_cpu or self.device_path_on_cpu

    def add(self, *scalars: torch.Tensor) -> Handle:
        """0-d tensors of one device and dtype."""
        return self._extend((scalars[0].device, scalars[0].dtype), scalars, len(scalars))

    def add_rows(self, rows: torch.Tensor) -> tuple[Any, int]:
        """A 2-d tensor of statistics, one row per tensor; returns (key, offset of its first element): the handle of
        row i is (key, offset + i * width, width)."""
        key = (rows.device, rows.dtype, self._ROWS)
        return key, self._extend(key, [rows.reshape(-1)], rows.numel())[1]

    def add_numbers(self, *numbers: float) -> Handle:
        return self._extend(self._NUMBERS, numbers, len(numbers))

    def _extend(self, key: Any, values: Sequence[Any], size: int) -> Handle:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = []
            self._sizes[key] = 0
        group.extend(values)
        start = self._sizes[key]
        self._sizes[key] = start + size
        return key, start, size

    def before_fetch(self, producer: Callable[[], None]) -> None:
        """`producer` runs at the start of every ship, to add what its owner computes in batches."""
        self._producers.append(producer)

    def ship(self) -> Shipment:
        """Starts the copy of everything added so far (one per device, the groups' bytes end to end) and starts
        the next batch. Queued on the device's current stream: call it where the step's work is queued."""
        for producer in self._producers:
            producer()
        groups, self._groups, self._sizes = self._groups, {}, {}
        numbers = groups.pop(self._NUMBERS, [])
        on_devices: dict[torch.device, list[tuple[Any, torch.Tensor]]] = {}
        for key, group in groups.items():
            flat = torch.cat(group) if key[2:] == (self._ROWS,) else torch.stack(group)
            on_devices.setdefault(key[0], []).append((key, flat))
        places: dict[Any, tuple[torch.device, int, int]] = {}  # key: (device, first byte, bytes)
        copies: dict[torch.device, tuple[torch.Tensor, Any]] = {}
        for device, flats in on_devices.items():
            start = 0
            for key, flat in flats:
                places[key] = (device, start, flat.numel() * flat.element_size())
                start += places[key][2]
            as_bytes = torch.cat([flat.view(torch.uint8) for _, flat in flats])
            side = self._side_copies.get(device) or self._side_copies.setdefault(device, _SideCopy(device))
            copies[device] = side.start(as_bytes)
        return Shipment(numbers, places, copies)

    def fetch(self) -> Callable[[Handle], list[float]]:
        """ship() and read at once (a sync: for callers that need the numbers now)."""
        return self.ship().read()


class _SideCopy:
    """The per-step copy of one device's statistics to the host, on a side stream into pinned memory, so that the
    device's compute stream goes on at once. Written once for every accelerator through torch.get_device_module:
    CUDA, and the NPU, whose torch.npu streams and events mirror torch.cuda's. On the CPU (the device path forced
    in tests) torch.cpu's stand-ins, where the copy is done when it returns."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._module = torch.get_device_module(device.type)
        self._accelerator = device.type != "cpu"
        self._stream = self._module.Stream(device=device) if self._accelerator else self._module.Stream()

    def start(self, values: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Queues the copy of `values` after the work queued so far; returns (host tensor, event of its end)."""
        self._stream.wait_stream(self._module.current_stream(self._device))
        with self._module.stream(self._stream):
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=self._accelerator)
            host.copy_(values, non_blocking=self._accelerator)
            done = self._module.Event()
            done.record(self._stream)
        if self._accelerator:  # made on the compute stream, read on the side one: not to be reused before
            values.record_stream(self._stream)
        return host, done


class Shipment:
    """One step's statistics on their way to the host; `read` waits for the copies (long done, where it is called
    a step later) and hands back the numbers by handle."""

    def __init__(self, numbers: list[float], places: dict[Any, tuple[torch.device, int, int]],
                 copies: dict[torch.device, tuple[torch.Tensor, Any]]) -> None:
        self._numbers = numbers
        self._places = places
        self._copies = copies

    def arrived(self) -> bool:
        """Whether every copy is done (on the CPU at once), so that `read` would not wait."""
        return all(done.query() for _, done in self._copies.values())

    def read(self) -> Callable[[Handle], list[float]]:
        for _, done in self._copies.values():
            done.synchronize()
        values: dict[Any, list[float]] = {StatBatch._NUMBERS: self._numbers}
        for key, (device, start, size) in self._places.items():
            host = self._copies[device][0]
            values[key] = host[start : start + size].clone().view(key[1]).tolist()  # clone: aligned for the view
        return lambda handle: values[handle[0]][handle[1] : handle[1] + handle[2]]


@dataclass(slots=True)
class PendingStats:
    """A tensor's summary whose numbers still sit on the device (handles into a StatBatch), or are already known."""

    dtype: str
    shape: str
    numel: int
    extremes_and_sums: Handle | None = None  # float: (min, max, sum, l2 norm); integer/bool: (min, max)
    nonfinite_counts: Handle | None = None  # (nan, inf); None: known to be 0, or not applicable
    known: tuple[Any, ...] | None = None  # the numbers of `values`, where they were taken on the host at once

    def resolve(self, fetched: Callable[[Handle], list[float]]) -> dict[str, Any]:
        """The schema's statistic columns (STAT_COLUMNS: min, max, mean, l2_norm, nan_count, inf_count)."""
        return dict(zip(STAT_COLUMNS, self.values(fetched)))

    def values(self, fetched: Callable[[Handle], list[float]]) -> tuple[Any, ...]:
        """The statistics as plain numbers, in STAT_COLUMNS order (None where they do not apply)."""
        if self.known is not None:
            return self.known
        low = high = mean = norm = None
        if self.extremes_and_sums is not None:
            values = fetched(self.extremes_and_sums)
            low, high = float(values[0]), float(values[1])
            if len(values) == 4:
                mean, norm = values[2] / self.numel, values[3]
        nan, inf = (int(count) for count in fetched(self.nonfinite_counts)) if self.nonfinite_counts else (0, 0)
        return low, high, mean, norm, nan, inf


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def has_readable_data(tensor: torch.Tensor) -> bool:
    return tensor.layout == torch.strided and not tensor.is_meta and tensor.numel() > 0


_SHAPE_NAMES: dict[tuple[int, ...], str] = {}  # a training step makes the same few shapes over and over


def shape_name(shape: tuple[int, ...]) -> str:
    name = _SHAPE_NAMES.get(shape)
    if name is None:
        if len(_SHAPE_NAMES) > 100_000:  # shapes that never repeat (a growing sequence, say) must not fill memory
            _SHAPE_NAMES.clear()
        name = _SHAPE_NAMES[shape] = "x".join(map(str, shape))
    return name


def describe(tensor: torch.Tensor) -> PendingStats:
    """A tensor's dtype, shape and numel; its statistics are still to be queued."""
    return PendingStats(dtype_name(tensor.dtype), shape_name(tensor.shape), tensor.numel())


def has_statistics(tensor: torch.Tensor) -> bool:
    """Sparse, meta, empty and complex tensors get dtype, shape and numel only."""
    return has_readable_data(tensor) and not tensor.dtype.is_complex


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """What floating statistics are computed and kept in: float64 for float64, float32 for every other dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def reductions(values: torch.Tensor, dim: int | None) -> list[torch.Tensor]:
    """min, max, sum and L2 norm over `dim` (None: the whole tensor), all in the accumulation dtype (float32, float64
    for float64 and for integers), so that they stack together. Integers (indices, token ids, labels) get their sum
    and norm too, exact in float64: two index tensors with the same extremes are still told apart."""
    low, high = torch.aminmax(values, dim=dim)
    if not values.is_floating_point():
        values = values.to(torch.float64)
    accumulate = accumulation_dtype(values.dtype)
    if low.dtype != accumulate:
        low, high = low.to(accumulate), high.to(accumulate)
    total = values.sum(dim, dtype=accumulate)
    return [low, high, total, torch.linalg.vector_norm(values, dim=dim, dtype=accumulate)]


def summarize(tensor: torch.Tensor, batch: StatBatch, small: SmallTensorStats | None = None) -> PendingStats:
    """A tensor's dtype, shape and numel, with its statistics queued: on an accelerator (or where the batch sends CPU
    tensors the same way) by `batch.device_stats`, on the CPU by verify._stats, else by torch's reductions (small
    CPU tensors by `small` when given). Callers outside the dispatch mode hold torch.no_grad()."""
    stats = describe(tensor)
    if not has_statistics(tensor):
        return stats
    if batch.keeps_on_device(tensor):
        batch.device_stats.add(tensor, stats)
        return stats
    kind = native_kind(tensor)
    if kind is not None:
        summarize_natively(tensor, kind, stats)
    elif small is not None and small.takes(tensor, stats.numel):
        small.add(tensor, stats)
    else:
        queue_reductions(tensor, stats, batch)
    return stats


def queue_reductions(tensor: torch.Tensor, stats: PendingStats, batch: StatBatch) -> None:
    """The reductions of one tensor, left where they are computed. On the host path, a large tensor's NaN and inf
    counts are taken only where its sum is not finite (any NaN or inf makes it so; reading it there is no sync);
    on the device path they are always queued, as reading the sum would wait for the device."""
    values = reductions(tensor, None)
    stats.extremes_and_sums = batch.add(*values)
    if tensor.is_floating_point() and (batch.keeps_on_device(tensor) or not math.isfinite(values[2].item())):
        stats.nonfinite_counts = batch.add(tensor.isnan().sum(), tensor.isinf().sum())


class _PendingCopies:
    """Copies of small tensors waiting to be reduced together, grouped by a key (dtype, or device and dtype): a copy
    because an in-place op may overwrite the tensor later in the step. The copies are reduced (`reduce`, by each
    subclass) at the batch's next fetch or ship, or once they hold MAX_ELEMENTS."""

    MAX_ELEMENTS = 1 << 20

    def __init__(self, batch: StatBatch) -> None:
        self._batch = batch
        self._copies: dict[Any, tuple[list[torch.Tensor], list[PendingStats]]] = {}
        self._elements = 0
        batch.before_fetch(self.reduce)

    def _keep(self, key: Any, copy: torch.Tensor, stats: PendingStats) -> None:
        copies, owners = self._copies.setdefault(key, ([], []))
        copies.append(copy)
        owners.append(stats)
        self._elements += stats.numel
        if self._elements >= self.MAX_ELEMENTS:
            self.reduce()

    def _take(self) -> dict[Any, tuple[list[torch.Tensor], list[PendingStats]]]:
        """The copies waiting, which are the caller's to reduce from now on."""
        waiting, self._copies, self._elements = self._copies, {}, 0
        return waiting

    def discard(self) -> None:
        self._copies, self._elements = {}, 0

    def reduce(self) -> None:
        raise NotImplementedError


class DeviceStats(_PendingCopies):
    """Statistics of tensors that stay on their device until the step is shipped (`StatBatch.keeps_on_device`), with
    no host sync. A large floating tensor is reduced at once, while the op that wrote it may have left it in cache
    (`queue_reductions`, a handful of kernels); integer and bool ones too (their extremes, sum and norm in float64). A
    small floating tensor, whose reductions would cost mostly their launches, costs one: a copy in its accumulation
    dtype. At ship time, or once the copies hold MAX_ELEMENTS, the copies of one (device,
    dtype) are laid end to end and torch.segment_reduce reduces all of them at once, a few kernels for the lot."""

    LARGEST = 1 << 16  # elements
    MAX_ELEMENTS = 1 << 22
    _WIDTH = 6  # a row: min, max, sum, L2 norm, NaN count, inf count

    def add(self, tensor: torch.Tensor, stats: PendingStats) -> None:
        if stats.numel > self.LARGEST or not tensor.is_floating_point():
            queue_reductions(tensor, stats, self._batch)
            return
        accumulate = accumulation_dtype(tensor.dtype)
        copy = tensor.to(accumulate, memory_format=torch.contiguous_format, copy=True).view(-1)
        self._keep((tensor.device, accumulate), copy, stats)

    def reduce(self) -> None:
        """Adds one row of statistics per copy to the batch, still on the device, and drops the copies."""
        for (device, _), (copies, owners) in self._take().items():
            lengths = _on_device([stats.numel for stats in owners], device)
            key, offset = self._batch.add_rows(self._rows(torch.cat(copies), lengths))
            for position, stats in enumerate(owners):
                first = offset + position * self._WIDTH
                stats.extremes_and_sums = (key, first, 4)
                stats.nonfinite_counts = (key, first + 4, 2)

    @staticmethod
    def _rows(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        def per_tensor(data: torch.Tensor, reduction: str) -> torch.Tensor:
            # unsafe: no check of the lengths, which would read them back to the host (a sync)
            return torch.segment_reduce(data, reduction, lengths=lengths, unsafe=True)

        columns = [
            per_tensor(values, "min"),
            per_tensor(values, "max"),
            per_tensor(values, "sum"),
            per_tensor(values * values, "sum").sqrt(),
            per_tensor(values.isnan().to(values.dtype), "sum"),
            per_tensor(values.isinf().to(values.dtype), "sum"),
        ]
        return torch.stack(columns, dim=1)


def _on_device(numbers: list[int], device: torch.device) -> torch.Tensor:
    """An int64 tensor on `device`, copied from pinned memory without waiting (torch keeps the pinned block until
    the copy is done)."""
    if device.type == "cpu":
        return torch.tensor(numbers, dtype=torch.int64)
    return torch.tensor(numbers, dtype=torch.int64, pin_memory=True).to(device, non_blocking=True)


# What verify._stats reads each dtype as (bool is one byte, 0 or 1).
_NATIVE_KINDS = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.uint8: "uint8", torch.bool: "uint8",
}


def native_kind(tensor: torch.Tensor) -> str | None:
    """How verify._stats reads this tensor, or None where it cannot: no extension, not a plain dense CPU tensor (a
    subclass may hold no real data, a sparse one no plain array), a dtype it does not know (complex ones among
    them), or a lazily negated view."""
    if native_stats is None or type(tensor) not in _PLAIN_TENSORS or not tensor.is_cpu:
        return None
    kind = _NATIVE_KINDS.get(tensor.dtype)
    if kind is None or tensor.layout is not torch.strided or tensor.is_neg():
        return None
    return kind


def summarize_natively(tensor: torch.Tensor, kind: str, stats: PendingStats) -> None:
    """The statistics of a CPU tensor in one pass of verify._stats; NaN makes min and max NaN, as torch.aminmax
    does."""
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    low, high, total, squares, nan, inf = native_stats.summarize(tensor.data_ptr(), stats.numel, kind)
    if nan:
        low = high = math.nan
    stats.known = (low, high, total / stats.numel, math.sqrt(squares), nan, inf)


class SmallTensorStats(_PendingCopies):
    """Statistics of small CPU tensors, computed many at a time. Reducing a small tensor costs mostly the fixed
    overhead of the calls (four reductions and a read of the sum, ~25 us on CPU) whatever its size, and batching them
    in torch keeps most of it (reductions along a dimension and the foreach ops are slow on CPU). Here a small tensor
    costs one call, a copy (an in-place op may overwrite it later in the step); at the next fetch, or once the copies
    hold MAX_ELEMENTS, the copies of one dtype are laid end to end and numpy's `ufunc.reduceat` reduces all of them
    in one call per statistic."""

    LARGEST = 8192  # elements; larger tensors are cheaper to reduce at once, while they are still in cache

    @classmethod
    def takes(cls, tensor: torch.Tensor, numel: int) -> bool:
        """Small plain CPU tensors (numpy reads them without a copy; subclasses may not allow that)."""
        return numel <= cls.LARGEST and tensor.is_cpu and type(tensor) in _PLAIN_TENSORS

    def add(self, tensor: torch.Tensor, stats: PendingStats) -> None:
        self._keep(tensor.dtype, tensor.clone(memory_format=torch.contiguous_format), stats)

    def reduce(self) -> None:
        """Adds the statistics of every copy to the batch, as host numbers, and drops the copies."""
        for dtype, (copies, owners) in self._take().items():
            values = torch.cat([copy.view(-1) for copy in copies])
            if dtype == torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
                values = values.float()
            self._reduce_segments(values.numpy(), owners)

    def _reduce_segments(self, values: np.ndarray, owners: list[PendingStats]) -> None:
        starts = np.cumsum([0] + [stats.numel for stats in owners[:-1]])
        lows, highs = np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)
        sums = np.add.reduceat(values, starts, dtype=np.float64)
        norms = np.sqrt(np.add.reduceat(np.square(values, dtype=np.float64), starts))
        for stats, *numbers in zip(owners, lows.tolist(), highs.tolist(), sums.tolist(), norms.tolist()):
            stats.extremes_and_sums = self._batch.add_numbers(*numbers)
        # Any NaN or inf makes the sum NaN or inf, so a finite sum means no NaN and no inf.
        if not np.isfinite(sums).all():
            nans, infs = np.add.reduceat(np.isnan(values), starts), np.add.reduceat(np.isinf(values), starts)
            for stats, nan, inf in zip(owners, nans.tolist(), infs.tolist()):
                stats.nonfinite_counts = self._batch.add_numbers(nan, inf)


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


_ROW_COLUMNS = ("seq", "phase", "module", "op", "call_index", "io", "md5", "tensor_file", "inputs")
_PENDING_COLUMNS = ("dtype", "shape", "numel")
_ROW_FIELDS, _PENDING_FIELDS = operator.attrgetter(*_ROW_COLUMNS), operator.attrgetter(*_PENDING_COLUMNS)


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
    inputs: str = ""  # the seqs of the recorded calls whose outputs this call read


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


def _storage_address(tensor: torch.Tensor) -> int:
    """Where a tensor's data lives, shared by its views; 0 for tensors without storage (a subclass, a meta tensor)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Tensors of an op's outputs or arguments: a tensor, or a tuple/list of tensors (and of lists, for foreach)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in tensors_in(item)]
    return []


def _leaves(value: Any) -> Sequence[Any]:
    """The pytree leaves of a module's inputs or output, without walking pytree for a tensor or tuple of tensors."""
    if isinstance(value, torch.Tensor):
        return (value,)
    if type(value) is tuple and all(isinstance(item, torch.Tensor) for item in value):
        return value
    return tree_flatten(value)[0]


# Modules that wrap a model without computing anything of their own, and the attribute holding the model.
_WRAPPERS = {"DataParallel": "module", "DistributedDataParallel": "module", "OptimizedModule": "_orig_mod"}


def _wrapped(module: torch.nn.Module) -> torch.nn.Module | None:
    attribute = _WRAPPERS.get(type(module).__name__)
    inner = getattr(module, attribute, None) if attribute else None
    return inner if isinstance(inner, torch.nn.Module) else None


def unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside any wrappers (DataParallel(model).module, DDP, torch.compile's _orig_mod)."""
    while (inner := _wrapped(module)) is not None:
        module = inner
    return module


class ModuleScopes:
    """The module an op runs in, forward or backward, as torch.utils.module_tracker.ModuleTracker reports it: its
    names, its events (in backward a module is entered when the gradients of its outputs are ready and left when
    those of its inputs are; the end of a backward leaves them all) and its innermost module (the longest active
    name), for a small part of its cost. ModuleTracker walks every module's inputs and outputs with pytree and puts a
    multi-grad hook on them, and keeps every hook until it exits. Here pytree walks only nested inputs and outputs
    (a walk costs 15 us), only the hooks on leaf tensors, which outlive the step, are kept (until
    `release_leaf_hooks`), and the innermost module is found when the active set changes instead of on every op."""

    # ModuleTracker's set holds this name too; kept so that the set, whose order decides between active names of
    # equal length, iterates as ModuleTracker's does.
    _GLOBAL = "Global"

    def __init__(self) -> None:
        self.innermost = ""  # the path of the innermost active module; "" outside modules
        self._active = {self._GLOBAL}
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._named_children: weakref.WeakSet = weakref.WeakSet()
        self._end_of_backward_queued = False
        self._module_hooks: list[RemovableHandle] = []
        self._leaf_hooks: list[RemovableHandle] = []

    def __enter__(self) -> ModuleScopes:
        self._module_hooks = [
            register_module_forward_pre_hook(self._forward_starts),
            register_module_forward_hook(self._forward_ends),
        ]
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in self._module_hooks:
            handle.remove()
        self.release_leaf_hooks()

    @staticmethod
    def in_backward() -> bool:
        return torch._C._current_graph_task_id() != -1

    def release_leaf_hooks(self) -> None:
        for handle in self._leaf_hooks:
            handle.remove()
        self._leaf_hooks = []

    def name(self, module: torch.nn.Module) -> str:
        """The outermost module is named after its class; a module seen for the first time names its children (and
        theirs) after itself. A wrapper (DataParallel, DDP, torch.compile's) and the model it wraps share the model's
        name, so that a script wrapping its model on one device and not on another still pairs op for op."""
        name = self._names.get(module)
        if name is None:
            name = self._names[module] = type(unwrapped(module)).__name__
        if module not in self._named_children:
            inner = _wrapped(module)
            for child_name, child in module.named_children():
                self._names[child] = name if child is inner else f"{name}.{child_name}"
                self.name(child)
            self._named_children.add(module)
        return name

    def _forward_starts(self, module: torch.nn.Module, args: Any) -> None:
        name = self.name(module)
        self._enter(name)
        self._when_gradients_ready(args, lambda: self._leave(name))

    def _forward_ends(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        name = self.name(module)
        self._leave(name)
        self._when_gradients_ready(output, lambda: self._enter_backward(name))

    def _when_gradients_ready(self, value: Any, action: Callable[[], None]) -> None:
        """Runs `action` once the gradients of the tensors in `value` that require one are computed (as ModuleTracker,
        never for the tensor that backward() starts from)."""
        tensors = [leaf for leaf in _leaves(value) if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
        if not tensors:
            return
        if len(tensors) == 1:
            handle = self._when_gradient_ready(tensors[0], action)
        else:
            handle = register_multi_grad_hook(tensors, lambda gradients: action())
        if any(tensor.grad_fn is None for tensor in tensors):
            self._leaf_hooks.append(handle)

    @staticmethod
    def _when_gradient_ready(tensor: torch.Tensor, action: Callable[[], None]) -> RemovableHandle:
        """register_multi_grad_hook for one tensor (most module inputs and outputs) at half its cost, and like it
        never for the tensor backward() starts from: the engine does not "execute" that tensor's node."""
        node = tensor.grad_fn  # None for a leaf, whose gradient is computed only when it is part of the graph

        def hook(gradient: torch.Tensor) -> None:
            if node is None or torch._C._will_engine_execute_node(node):
                action()

        return tensor.register_hook(hook)

    def _enter_backward(self, name: str) -> None:
        if not self._end_of_backward_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)
            self._end_of_backward_queued = True
        self._enter(name)

    def _backward_ended(self) -> None:
        self._active = {self._GLOBAL}
        self._end_of_backward_queued = False
        self._find_innermost()

    def _enter(self, name: str) -> None:
        self._active.add(name)
        self._find_innermost()

    def _leave(self, name: str) -> None:
        self._active.discard(name)
        self._find_innermost()

    def _find_innermost(self) -> None:
        innermost = ""
        for name in self._active:
            if name != self._GLOBAL and len(name) > len(innermost):  # a child's path extends its parent's
                innermost = name
        self.innermost = innermost


class _OpRecorder(TorchDispatchMode):
    """Records a summary of each op's outputs (and inputs, in tensor mode) into `capture.rows`."""

    def __init__(self, capture: OpCapture) -> None:
        super().__init__()
        self.capture = capture
        self._names: dict[torch._ops.OpOverload, str | None] = {}

    def _name(self, func: torch._ops.OpOverload) -> str | None:
        name = self._names.get(func, self)  # self: not seen yet (OpOverload's hash is Python code, so hash once)
        if name is self:
            recorded = not func.is_view and func.namespace != "profiler" and func._overloadpacket not in _NOT_RECORDED
            name = self._names[func] = str(func._overloadpacket) if recorded else None
        return name

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        capture = self.capture
        name = self._name(func) if capture.recording else None
        if name is None:
            return func(*args, **kwargs)
        call = capture.begin_call(name)
        arguments = tensors_in(args) + tensors_in(list(kwargs.values()))
        call.inputs = capture.producers(arguments)
        if capture.with_inputs:
            capture.record(call, "in", arguments)
        out = func(*args, **kwargs)
        outputs = tensors_in(out)
        if not outputs:  # in-place ops that return nothing (foreach): their results are the written arguments
            outputs = tensors_in(self._written(func, args, kwargs))
        capture.record(call, "out", outputs)
        capture.produced(call, outputs)
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


_OPTIMIZER, _BACKWARD, _FORWARD, _OTHER = (phase.value for phase in (Phase.OPTIMIZER, Phase.BACKWARD, Phase.FORWARD,
                                                                     Phase.OTHER))


@dataclass(slots=True)
class _Call:
    seq: int
    phase: str
    module: str
    op: str
    call_index: int
    save_tensors: bool
    inputs: str = ""


class OpCapture:
    """Context manager that records op summaries for the current step; `take_step` hands them over as columns.

    `paused()` keeps the instrumentation's own tensor work out of the records. Whoever watches optimizer.step() (the
    bootstrap's step hooks) calls `optimizer_step_begins` and `optimizer_step_ends` around it.
    """

    # A step's records are held until the step ends. Work after the last optimizer step (an evaluation over a whole
    # dataset, say) never ends its step, and without a bound its records filled 24 GiB on a real script.
    MAX_ROWS_PER_STEP = 200_000

    def __init__(self, dump: DumpMode, batch: StatBatch, saver: TensorSaver | None = None) -> None:
        self.dump = dump
        self.batch = batch
        self.saver = saver
        self.with_inputs = dump == DumpMode.TENSOR
        self.modules = ModuleScopes()
        self.small_tensors = SmallTensorStats(batch)
        self.recording = True
        self.rows: list[OpRow] = []
        self._computed: dict[int, weakref.ref] = {}  # note_outputs
        self._writers: dict[int, int] = {}  # storage address -> seq of this step's last recorded call writing it
        self.truncated = False  # this step reached MAX_ROWS_PER_STEP
        self._seq = 0
        self._call_counts: dict[tuple[str, str, str], int] = {}
        self._step = 0
        self._stack = contextlib.ExitStack()
        self._optimizer_pause = contextlib.ExitStack()
        self._recorder: _OpRecorder | None = None

    def __enter__(self) -> OpCapture:
        self._stack.enter_context(self.modules)
        self._recorder = self._stack.enter_context(_OpRecorder(self))
        return self

    def __exit__(self, *exc_info: object) -> None:
        # An optimizer.step() that raised never reached optimizer_step_ends: put the recorder back first, or leaving
        # would pop a mode that is not there and hide the script's own error.
        self._optimizer_pause.close()
        self._stack.close()
        self._recorder = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Records nothing in the block. Where the recorder is the innermost mode, it is also taken off the stack: an
        op that passes through it costs 10 to 20 us even when it records nothing."""
        previous, self.recording = self.recording, False
        ours = self._recorder is not None and _get_current_dispatch_mode() is self._recorder
        try:
            with _pop_mode_temporarily() if ours else contextlib.nullcontext():
                yield
        finally:
            self.recording = previous

    def optimizer_step_begins(self) -> None:
        """optimizer.step() starts. Its ops are not recorded one by one: they are a few elementwise ops per parameter
        (30 of the 98 ops of a small CNN's step under SGD with momentum), each paying the dispatch mode's cost, while
        what they compute is the updated parameters, which `optimizer_step_ends` records."""
        self._optimizer_pause.enter_context(self.paused())

    def optimizer_step_ends(self, parameters: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Records each (name, parameter) after its update: op UPDATE_OP in the optimizer phase, the parameter's name
        as the module column (so keys read `step/optimizer/fc1.weight/update#0`)."""
        self._optimizer_pause.close()
        if not self.recording:
            return
        with self.paused(), torch.no_grad():  # the statistics of a device tensor are torch ops of our own
            for name, parameter in parameters:
                self.record(self._call(_OPTIMIZER, name, UPDATE_OP), "out", [parameter.detach()])

    def note_outputs(self, output: Any) -> None:
        """An outermost module's outputs: what a later outermost module (a loss) receives of them is computed, not
        data, and record_inputs leaves it out. Kept by id with a weak reference (a tensor's == is elementwise)."""
        for leaf in _leaves(output):
            if isinstance(leaf, torch.Tensor):
                self._computed[id(leaf)] = weakref.ref(leaf)

    def _is_data(self, tensor: torch.Tensor) -> bool:
        """Read from a dataset rather than computed in this step: no autograd history, and no outermost module's
        output (nor a view of one)."""
        if tensor.grad_fn is not None:
            return False
        return not any(candidate is not None and self._computed.get(id(candidate), _DEAD)() is candidate
                       for candidate in (tensor, tensor._base))

    def record_inputs(self, module: torch.nn.Module, args: Any) -> None:
        """The data an outermost module's forward receives (op INPUT_OP, io in0, in1...): the batch each side read,
        which the comparison checks before any operator; a loss module's labels too, not the predictions it gets
        (note_outputs). Integer tensors (token ids, labels) are summarised as float64 values, so that their mean and
        norm, not only their min and max, tell two batches apart."""
        tensors = [leaf for leaf in _leaves(args) if isinstance(leaf, torch.Tensor) and self._is_data(leaf)]
        if not tensors or not self.recording:
            return
        with self.paused(), torch.no_grad():
            call = self._call(_FORWARD, self.modules.name(module), INPUT_OP)
            for position, tensor in enumerate(tensors):
                exact = not tensor.is_floating_point() and has_statistics(tensor)
                stats = summarize(tensor.double() if exact else tensor, self.batch, self.small_tensors)
                stats.dtype = dtype_name(tensor.dtype)
                md5 = md5_of(tensor) if self.dump == DumpMode.MD5 else ""
                self.rows.append(OpRow(call.seq, call.phase, call.module, call.op, call.call_index, f"in{position}",
                                       stats, md5))

    def producers(self, tensors: Sequence[torch.Tensor]) -> str:
        """The recorded calls of this step that wrote the storage of `tensors` (views included), as "seq,seq"."""
        writers = self._writers  # (address 0, no storage, is never written: see produced)
        seqs = [writers[address] for address in map(_storage_address, tensors) if address in writers]
        if len(seqs) < 2:  # most calls: one producer or none, at the cost of a lookup
            return str(seqs[0]) if seqs else ""
        return ",".join(map(str, sorted(set(seqs))))

    def produced(self, call: _Call, outputs: Sequence[torch.Tensor]) -> None:
        for tensor in outputs:
            address = _storage_address(tensor)
            if address:
                self._writers[address] = call.seq

    def begin_call(self, op: str) -> _Call:
        module = self.modules.innermost
        if self.modules.in_backward():
            phase = _BACKWARD
        else:
            phase = _FORWARD if module else _OTHER
        return self._call(phase, module, op)

    def _call(self, phase: str, module: str, op: str) -> _Call:
        counter = (phase, module, op)
        call_index = self._call_counts.get(counter, 0)
        self._call_counts[counter] = call_index + 1
        self._seq += 1
        save = self.saver is not None and self.saver.wants(phase, module, op)
        return _Call(self._seq - 1, phase, module, op, call_index, save)

    def record(self, call: _Call, io: str, tensors: Sequence[torch.Tensor]) -> None:
        if len(self.rows) >= self.MAX_ROWS_PER_STEP:
            self._stop_recording_this_step()
            return
        for position, tensor in enumerate(tensors):
            row = OpRow(call.seq, call.phase, call.module, call.op, call.call_index, f"{io}{position}",
                        summarize(tensor, self.batch, self.small_tensors), inputs=call.inputs)
            if self.dump == DumpMode.MD5:
                row.md5 = md5_of(tensor)
            if call.save_tensors:
                relative = f"{TENSORS_DIR}/{step_file(self._step, '')}/{call.seq:06d}-{row.io}.npy"
                row.tensor_file = self.saver.save(tensor, relative)
            self.rows.append(row)

    def _stop_recording_this_step(self) -> None:
        if not self.truncated:
            self.truncated = True
            print(f"npu-port: op capture stopped at {self.MAX_ROWS_PER_STEP} records in step {self._step}; the rest of "
                  "this step is not recorded (work after the last optimizer step, such as a long evaluation, stays "
                  "in one step)", file=sys.stderr, flush=True)

    def take_step(self, step: int, fetched: Callable[[Handle], list[float]]) -> dict[str, list[Any]]:
        """The rows of `step` as OP_COLUMNS lists (statistics resolved from `fetched`); starts the next step."""
        return step_columns(step, self.close_step(step), fetched)

    def close_step(self, step: int) -> list[OpRow]:
        """The rows of `step`, whose statistics may still be on their way (`step_columns` resolves them once read);
        starts the next step."""
        rows = self.rows
        self.discard_step(step + 1)
        return rows

    def discard_step(self, next_step: int) -> None:
        self.small_tensors.discard()
        self._computed = {}
        self._writers = {}
        self.modules.release_leaf_hooks()
        self.rows = []
        self.truncated = False
        self._seq = 0
        self._call_counts = {}
        self._step = next_step


def step_columns(step: int, rows: list[OpRow], fetched: Callable[[Handle], list[float]]) -> dict[str, list[Any]]:
    """A step's rows as OP_COLUMNS lists, their statistics resolved from `fetched`."""
    records = [(*_ROW_FIELDS(row), *_PENDING_FIELDS(row.stats), *row.stats.values(fetched)) for row in rows]
    names = (*_ROW_COLUMNS, *_PENDING_COLUMNS, *STAT_COLUMNS)
    return {
        "step": [step] * len(rows),
        "key": [op_key(step=step, phase=row.phase, module=row.module, op=row.op, call_index=row.call_index)
                for row in rows],
        **{name: list(column) for name, column in zip(names, zip(*records))},
        **({} if records else {name: [] for name in names}),
    }
