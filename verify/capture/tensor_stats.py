"""A tensor's statistics (verify/record/statistics.py STATISTICS) as verify's capture takes them, cheaply. The rows
marked one_pass (min, max, mean, L2 norm, NaN and inf counts): one pass by the optional C extension
verify.capture._stats on the CPU, torch's reductions otherwise; small CPU tensors reduced many at a time; on an
accelerator, kept on the device until the step ends and shipped to the host in one copy per step (StatBatch), a
large floating tensor on CUDA in one pass by Triton kernels (FusedReduction, verify/capture/triton_stats.py). Every
other row: its torch functions, tensor by tensor, on the same batch. Each path names the statistics it gives, and
they are placed into the table's order by name (`_Placement`). Handles and PendingStats stand for numbers still on
their way.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verify.capture.sharded_stats import ShardedStats, describes_the_whole, is_dtensor, local_part
from verify.record.schema import STAT_COLUMNS
from verify.record.statistics import STATISTICS, Statistic


try:  # built by `pip install` where a C compiler is found (verify/capture/_stats.c)
    from verify.capture import _stats as native_stats
except ImportError:
    native_stats = None

_DTYPE_NAMES: dict[torch.dtype, str] = {}
_SHAPE_NAMES: dict[tuple[int, ...], str] = {}  # a training step makes the same few shapes over and over

Handle = tuple[Any, int, int]

_dispatch_modes, _pop_dispatch_mode = torch._C._len_torch_dispatch_stack, torch._C._pop_torch_dispatch_stack
_push_dispatch_mode = torch._C._push_on_torch_dispatch_stack


class BelowDispatchModes:
    """The device path's own torch ops (copies, reductions, the step's ship) run below every TorchDispatchMode on the
    stack: they compute statistics, which no mode of the run (the keyed random streams, a perturbation) is meant to
    see or change, and each mode would add its Python to each of them, several microseconds of host time per op on
    the critical path of an accelerator's step. Inside the op capture's own handler the stack holds the modes below
    it. A class rather than a generator: it is entered once per recorded tensor, and costs a C call where the stack
    is empty."""

    __slots__ = ("_modes",)

    def __enter__(self) -> None:
        self._modes = [_pop_dispatch_mode(None) for _ in range(_dispatch_modes())]

    def __exit__(self, *exc_info: object) -> None:
        for mode in reversed(self._modes):
            _push_dispatch_mode(mode)


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
        self.sharded = ShardedStats(self.add_rows, DeviceStats._point)
        self.before_fetch(self.sharded.combine_all)

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
        with BelowDispatchModes():
            return self._ship()

    def _ship(self) -> Shipment:
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
        with BelowDispatchModes():
            for key, (device, start, size) in self._places.items():
                host = self._copies[device][0]
                values[key] = host[start : start + size].clone().view(key[1]).tolist()  # clone: aligned for the view
        return lambda handle: values[handle[0]][handle[1] : handle[1] + handle[2]]


class StatisticsMismatch(RuntimeError):
    """verify/record/statistics.py marks a statistic one_pass that a one-pass path of the capture does not compute."""


_BY_TORCH: tuple[Statistic, ...] = tuple(statistic for statistic in STATISTICS if not statistic.one_pass)
"""The statistics computed by their torch functions, tensor by tensor (`queue_by_torch`), in the table's order."""
_BY_TORCH_TYPES = tuple(int if statistic.dtype == "int64" else float for statistic in _BY_TORCH)
# What the batched torch paths give (queue_reductions, DeviceStats, SmallTensorStats), in the order
# PendingStats._batched returns it.
_BATCHED = ("min", "max", "mean", "l2_norm", "nan_count", "inf_count")


class _Placement:
    """Puts the values of one one-pass path (named `given`, in its order) and those computed by torch into the
    table's order (STAT_COLUMNS), by name. `place` is None where the path's order is the table's and torch computes
    nothing: its values are taken as they are, at no cost."""

    def __init__(self, given: Sequence[str], path: str) -> None:
        self._places: list[int | None] = []
        for statistic in STATISTICS:
            if statistic.one_pass and statistic.column not in given:
                raise StatisticsMismatch(f"{statistic.column} is marked one_pass in verify/record/statistics.py, but "
                                         f"{path} computes only {', '.join(given)}")
            self._places.append(given.index(statistic.column) if statistic.one_pass else None)
        in_order = not _BY_TORCH and self._places == list(range(len(given)))
        self.place: Callable[[Sequence[Any], Sequence[Any]], tuple[Any, ...]] | None = None if in_order else self._place

    def _place(self, one_pass: Sequence[Any], by_torch: Sequence[Any]) -> tuple[Any, ...]:
        by_torch = iter(by_torch)
        return tuple(one_pass[place] if place is not None else next(by_torch) for place in self._places)


def _native_placement() -> _Placement | None:
    """Where the C extension's values go; None (the extension unused) where it names no statistics: a build older
    than its source, whose values could only be read by position."""
    given = getattr(native_stats, "STATISTICS", None)
    return None if given is None else _Placement(given, "verify/capture/_stats.c")


_FROM_BATCHED = _Placement(_BATCHED, "verify/capture/tensor_stats.py's batched reductions")
_FROM_NATIVE = _native_placement()
if _FROM_NATIVE is None:
    native_stats = None
_NOT_COMPUTED = (None,) * len(_BY_TORCH)


@dataclass(slots=True)
class PendingStats:
    """A tensor's summary whose numbers still sit on the device (handles into a StatBatch), or are already known."""

    dtype: str
    shape: str
    numel: int
    extremes_and_sums: Handle | None = None  # (min, max, sum, l2 norm)
    nonfinite_counts: Handle | None = None  # (nan, inf); None: known to be 0, or not applicable
    known: tuple[Any, ...] | None = None  # the C extension's values (named by its STATISTICS), taken at once
    torch_values: Handle | None = None  # the values of _BY_TORCH, in its order

    def resolve(self, fetched: Callable[[Handle], list[float]]) -> dict[str, Any]:
        """The schema's statistic columns (STAT_COLUMNS), by name."""
        return dict(zip(STAT_COLUMNS, self.values(fetched), strict=True))

    def values(self, fetched: Callable[[Handle], list[float]]) -> tuple[Any, ...]:
        """The statistics as plain numbers, in STAT_COLUMNS order (None where they do not apply)."""
        if self.known is not None:
            one_pass, placement = self.known, _FROM_NATIVE
        else:
            one_pass, placement = self._batched(fetched), _FROM_BATCHED
        if placement.place is None:
            return one_pass
        by_torch = _NOT_COMPUTED if self.torch_values is None else [
            kind(value) for kind, value in zip(_BY_TORCH_TYPES, fetched(self.torch_values), strict=True)]
        return placement.place(one_pass, by_torch)

    def _batched(self, fetched: Callable[[Handle], list[float]]) -> tuple[Any, ...]:
        """The batched torch paths' statistics, named by _BATCHED."""
        low = high = mean = norm = None
        if self.extremes_and_sums is not None:
            low, high, total, norm = fetched(self.extremes_and_sums)
            low, high, mean = float(low), float(high), total / self.numel
        if self.nonfinite_counts is None:
            return low, high, mean, norm, 0, 0
        nan, inf = fetched(self.nonfinite_counts)
        return low, high, mean, norm, int(nan), int(inf)


def dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def has_readable_data(tensor: torch.Tensor) -> bool:
    return tensor.layout == torch.strided and not tensor.is_meta and tensor.numel() > 0


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
    tensors the same way) by `batch.device_stats`, on the CPU by verify.capture._stats, else by torch's reductions
    (small CPU tensors by `small` when given); a DTensor's, of the whole logical tensor, by `batch.sharded`
    (verify/capture/sharded_stats.py). Callers outside the dispatch mode hold torch.no_grad()."""
    if type(tensor) not in _PLAIN_TENSORS and is_dtensor(tensor):
        return _summarize_sharded(tensor, batch, small)
    stats = describe(tensor)
    if not has_statistics(tensor):
        return stats
    if batch.keeps_on_device(tensor):
        with BelowDispatchModes():
            if _BY_TORCH:
                queue_by_torch(tensor, stats, batch)
            batch.device_stats.add(tensor, stats)
        return stats
    if _BY_TORCH:
        queue_by_torch(tensor, stats, batch)
    kind = native_kind(tensor)
    if kind is not None:
        summarize_natively(tensor, kind, stats)
    elif small is not None and small.takes(tensor, stats.numel):
        small.add(tensor, stats)
    else:
        queue_reductions(tensor, stats, batch)
    return stats


def summarize_all(tensors: Sequence[torch.Tensor], batch: StatBatch,
                  small: SmallTensorStats | None = None) -> list[PendingStats]:
    """`summarize` of each tensor, the same numbers; the small floating tensors of the device path (a model's
    parameters after their update, their gradients: dozens to hundreds a step) copied together, one cat per device
    and dtype, not one copy each (DeviceStats.add_together)."""
    summaries: list[PendingStats] = []
    together: dict[tuple[torch.device, torch.dtype], tuple[list[torch.Tensor], list[PendingStats]]] = {}
    for tensor in tensors:
        if not _BY_TORCH and type(tensor) in _PLAIN_TENSORS and batch.device_stats.copies(tensor, tensor.numel()) \
                and has_statistics(tensor) and batch.keeps_on_device(tensor):
            stats = describe(tensor)
            kept = together.get((tensor.device, tensor.dtype))
            if kept is None:
                kept = together[tensor.device, tensor.dtype] = ([], [])
            kept[0].append(tensor)
            kept[1].append(stats)
        else:
            stats = summarize(tensor, batch, small)
        summaries.append(stats)
    with BelowDispatchModes():
        for group, owners in together.values():
            batch.device_stats.add_together(group, owners)
    return summaries


def _summarize_sharded(tensor: torch.Tensor, batch: StatBatch, small: SmallTensorStats | None) -> PendingStats:
    """A DTensor's statistics, combined across its mesh when the step ships; a pending sum's (Partial), this rank's
    local tensor's."""
    if not describes_the_whole(tensor):
        return summarize(tensor._local_tensor, batch, small)
    stats = describe(tensor)
    if has_statistics(tensor):
        with BelowDispatchModes():
            batch.sharded.add(tensor, stats)
    return stats


def queue_reductions(tensor: torch.Tensor, stats: PendingStats, batch: StatBatch) -> None:
    """The reductions of one tensor, left where they are computed. On the host path, a large tensor's NaN and inf
    counts are taken only where its sum is not finite (any NaN or inf makes it so; reading it there is no sync);
    on the device path they are always queued, as reading the sum would wait for the device."""
    values = reductions(tensor, None)
    stats.extremes_and_sums = batch.add(*values)
    if tensor.is_floating_point() and (batch.keeps_on_device(tensor) or not math.isfinite(values[2].item())):
        stats.nonfinite_counts = batch.add(tensor.isnan().sum(), tensor.isinf().sum())


def _torch_function(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """torch's function of a dotted name in its namespace ("linalg.vector_norm")."""
    return functools.reduce(getattr, name.split("."), torch)


def by_torch(statistic: Statistic, tensor: torch.Tensor) -> torch.Tensor:
    """A statistic of a tensor as its row says torch computes it: its functions in turn, on the tensor in its
    accumulation dtype; a 0-d tensor."""
    values = tensor if tensor.is_floating_point() else tensor.to(torch.float64)
    values = values.to(accumulation_dtype(values.dtype))
    for name in statistic.torch:
        values = _torch_function(name)(values)
    return values


def queue_by_torch(tensor: torch.Tensor, stats: PendingStats, batch: StatBatch) -> None:
    """The statistics that no one-pass path computes (_BY_TORCH), computed now (an in-place op may change the tensor
    later in the step) and left where they are, in float64, one row of the batch."""
    row = torch.stack([by_torch(statistic, tensor).to(torch.float64) for statistic in _BY_TORCH])
    key, offset = batch.add_rows(row.view(1, -1))
    stats.torch_values = (key, offset, len(_BY_TORCH))


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

    def _keep(self, key: Any, copy: torch.Tensor, stats: PendingStats | Sequence[PendingStats]) -> None:
        """Keeps `copy`, the values of `stats` (or of several tensors' stats, end to end in their order)."""
        kept = self._copies.get(key)
        if kept is None:  # not setdefault: its default would be two new lists at every call
            kept = self._copies[key] = ([], [])
        copies, owners = kept
        copies.append(copy)
        if isinstance(stats, PendingStats):
            owners.append(stats)
        else:
            owners += stats
        self._elements += copy.numel()
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
    no host sync. A large floating tensor is reduced at once, while the op that wrote it may have left it in cache:
    on CUDA by one fused pass (`FusedReduction`, two launches), elsewhere by torch (`queue_reductions`, ~10 launches
    and ~6 passes over the data); integer and bool ones by torch too (their extremes, sum and norm in float64). A
    small floating tensor, whose reductions would cost mostly their launches, costs one: a copy in its accumulation
    dtype. At ship time, or once the copies hold MAX_ELEMENTS, the copies of one (device,
    dtype) are laid end to end and torch.segment_reduce reduces all of them at once, a few kernels for the lot."""

    LARGEST = 1 << 16  # elements
    MAX_ELEMENTS = 1 << 22

    def __init__(self, batch: StatBatch) -> None:
        super().__init__(batch)
        self.fused = FusedReduction()

    @classmethod
    def copies(cls, tensor: torch.Tensor, numel: int) -> bool:
        """Whether `add` keeps a copy of the tensor (small and floating), not reducing it at once."""
        return numel <= cls.LARGEST and tensor.is_floating_point()

    def add(self, tensor: torch.Tensor, stats: PendingStats) -> None:
        if not self.copies(tensor, stats.numel):
            self._reduce_now(tensor, stats)
            return
        accumulate = accumulation_dtype(tensor.dtype)
        # flattened at the reduce; clone where the dtype is already right: to(copy=True) parses its arguments in
        # Python's slow path, ~2 us more per tensor on the host, for the same copy kernel
        copy = (tensor.clone(memory_format=torch.contiguous_format) if tensor.dtype == accumulate else
                tensor.to(accumulate, memory_format=torch.contiguous_format))
        self._keep((tensor.device, accumulate), copy, stats)

    def add_together(self, tensors: Sequence[torch.Tensor], owners: Sequence[PendingStats]) -> None:
        """`add` of small floating tensors of one device and dtype (`copies`), their copies one tensor laid end to
        end as `reduce` lays them: one cat, and one cast where they are not in their accumulation dtype."""
        values = torch.cat([tensor.reshape(-1) for tensor in tensors])
        accumulate = accumulation_dtype(values.dtype)
        self._keep((values.device, accumulate), values if values.dtype == accumulate else values.to(accumulate), owners)

    def _reduce_now(self, tensor: torch.Tensor, stats: PendingStats) -> None:
        row = self.fused.row(tensor)
        if row is None:
            queue_reductions(tensor, stats, self._batch)
            return
        key, offset = self._batch.add_rows(row.view(1, -1))
        self._point(stats, key, offset)

    def reduce(self) -> None:
        """Adds one row of statistics per copy to the batch, still on the device, and drops the copies."""
        for (device, _), (copies, owners) in self._take().items():
            lengths = _on_device([stats.numel for stats in owners], device)
            rows = self._rows(torch._utils._flatten_dense_tensors(copies), lengths)  # one op for the lot's views
            key, offset = self._batch.add_rows(rows)
            width = rows.shape[1]
            for position, stats in enumerate(owners):
                self._point(stats, key, offset + position * width)

    @staticmethod
    def _point(stats: PendingStats, key: Any, first: int) -> None:
        """`stats` reads its numbers from the row that starts at `first` in the batch's group `key` (_rows' order)."""
        stats.extremes_and_sums = (key, first, 4)
        stats.nonfinite_counts = (key, first + 4, 2)

    @staticmethod
    def _rows(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """One row per tensor: min, max, sum, L2 norm (PendingStats.extremes_and_sums), NaN and inf counts."""

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


class FusedReduction:
    """The one-pass statistics of a large float32, float16 or bfloat16 tensor on a CUDA device in one pass over its
    data, two launches (verify/capture/triton_stats.py's Triton kernels): a row in DeviceStats._rows' order, float64,
    left on the device. torch's reductions (`queue_reductions`) keep every other tensor: float64 (accumulated in
    float64), integers, subclasses (which may hold no real data), lazily negated views, those above
    triton_stats.LARGEST elements, and everything from the first failure on: triton that does not import (imported
    at the first tensor taken, not with verify.capture), or a kernel that fails to compile or launch. A failure is
    told once on stderr, never retried. `note` says which path ran, once a tensor was offered: the manifest keeps it."""

    DTYPES = (torch.float32, torch.float16, torch.bfloat16)
    _SUBJECT = "statistics of large float32/float16/bfloat16 tensors on CUDA"
    _UNUSABLE = "unusable"  # _kernels after a failure

    def __init__(self, devices: tuple[str, ...] | None = None) -> None:
        """`devices`: the device types whose tensors it takes; by default CUDA, and the CPU where Triton's
        interpreter runs the kernels on CPU tensors (TRITON_INTERPRET=1, as the tests set it)."""
        if devices is None:
            devices = ("cuda", "cpu") if os.environ.get("TRITON_INTERPRET") == "1" else ("cuda",)
        self._devices = devices
        self._kernels: Any = None  # verify.capture.triton_stats once imported, _UNUSABLE after a failure
        self.note: str | None = None

    def row(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The queued row of `tensor`'s statistics, or None where torch's reductions are to take it."""
        if self._kernels is self._UNUSABLE or not self._takes(tensor):
            return None
        if self._kernels is None and not self._import_kernels():
            return None
        if tensor.numel() > self._kernels.LARGEST:
            return None
        values = tensor if _fills_from_data_pointer(tensor) else tensor.contiguous()  # a slice: one copy more
        try:
            with torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext():
                return self._kernels.one_pass_row(values)  # Triton launches on the current device
        except Exception as error:  # noqa: BLE001  (any failure of Triton's compiler or launcher: torch takes over)
            self._give_up(f"from the first tensor whose Triton kernel failed on ({_one_line(error)})")
            return None

    def _takes(self, tensor: torch.Tensor) -> bool:
        return (tensor.dtype in self.DTYPES and tensor.device.type in self._devices
                and type(tensor) in _PLAIN_TENSORS and not tensor.is_neg())

    def _import_kernels(self) -> bool:
        try:
            from verify.capture import triton_stats
        except Exception as error:  # noqa: BLE001  (missing, or too broken to import: torch's reductions serve)
            self._give_up(f"as triton does not import ({_one_line(error)})")
            return False
        self._kernels = triton_stats
        self.note = f"{self._SUBJECT}: one fused pass, Triton kernels (triton {triton_stats.triton.__version__})"
        return True

    def _give_up(self, reason: str) -> None:
        self._kernels = self._UNUSABLE
        self.note = f"{self._SUBJECT}: torch's reductions, {reason}"
        print(f"npu-port: {self.note}", file=sys.stderr, flush=True)


def _one_line(error: Exception) -> str:
    """An error as one line: its type and the first line of its message (a compiler's can run to pages)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def _fills_from_data_pointer(tensor: torch.Tensor) -> bool:
    """Whether the tensor's elements are exactly the `numel` elements from its data pointer, in some order of its
    dimensions (contiguous, channels-last, a transpose): its statistics can be taken from memory as it lies."""
    expected = 1
    for size, stride in sorted(zip(tensor.shape, tensor.stride()), key=lambda dimension: dimension[1]):
        if size == 1:
            continue
        if stride != expected:
            return False
        expected *= size
    return True


def _on_device(numbers: list[int], device: torch.device) -> torch.Tensor:
    """An int64 tensor on `device`, copied from pinned memory without waiting (torch keeps the pinned block until
    the copy is done)."""
    if device.type == "cpu":
        return torch.tensor(numbers, dtype=torch.int64)
    return torch.tensor(numbers, dtype=torch.int64, pin_memory=True).to(device, non_blocking=True)


# What verify.capture._stats reads each dtype as (bool is one byte, 0 or 1).
_NATIVE_KINDS = {
    torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.int64: "int64", torch.int32: "int32", torch.uint8: "uint8", torch.bool: "uint8",
}


def native_kind(tensor: torch.Tensor) -> str | None:
    """How verify.capture._stats reads this tensor, or None where it cannot: no extension, not a plain dense CPU tensor
    (a subclass may hold no real data, a sparse one no plain array), a dtype it does not know (complex ones among
    them), or a lazily negated view."""
    if native_stats is None or type(tensor) not in _PLAIN_TENSORS or not tensor.is_cpu:
        return None
    kind = _NATIVE_KINDS.get(tensor.dtype)
    if kind is None or tensor.layout is not torch.strided or tensor.is_neg():
        return None
    return kind


def summarize_natively(tensor: torch.Tensor, kind: str, stats: PendingStats) -> None:
    """The statistics of a CPU tensor in one pass of verify.capture._stats, named by its STATISTICS."""
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    stats.known = native_stats.summarize(tensor.data_ptr(), stats.numel, kind)


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
        # inf + -inf is NaN, as in torch's sums (an fp16 overflow): no warning of verify's in the script's output
        with np.errstate(invalid="ignore", over="ignore"):
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


def sample_fingerprints(tensor: torch.Tensor) -> str:
    """A 16-hex-digit hash of each sample (row along the first dimension) of a batch, comma-separated: hashed as
    float64 values, so that the same sample hashes alike in float32 and float16 where its values are equal, on any
    device. The batch is brought to the host (a sync on an accelerator, once per outermost forward)."""
    if not has_readable_data(tensor):
        return ""
    rows = tensor.detach().to("cpu", torch.float64).reshape(tensor.shape[0] if tensor.dim() else 1, -1).numpy()
    return ",".join(hashlib.blake2b(row.tobytes(), digest_size=8).hexdigest() for row in rows)


def md5_of(tensor: torch.Tensor) -> str:
    """Hash of the tensor's bytes in logical order: equal hashes mean bit-identical values (same dtype)."""
    if not has_readable_data(tensor):
        return ""
    raw = local_part(tensor).detach().contiguous().reshape(-1).view(torch.uint8).cpu()  # a DTensor: this rank's
    return hashlib.md5(raw.numpy().tobytes()).hexdigest()
