"""Statistics of a DTensor (FSDP2's sharded parameters, their gradients, updates and optimizer states; tensor and
sequence parallel weights) that describe the whole logical tensor, without ever gathering it.

Each rank reduces its own shard to a few partial statistics (count, sum, sum of squares, min, max, NaN and inf
counts: PARTIALS), left on its device. When the step's statistics are shipped (StatBatch.ship, at the step's end,
which every rank of an SPMD program reaches in the same order), the partials of each mesh are combined across the
mesh dimensions on which the tensors are sharded: one all_gather of PARTIALS numbers a record, per (mesh, sharded
dimensions) and sharded dimension, a few scalars each. Dimensions on which a tensor is replicated hold the same
values on every rank and are not combined. The combined row takes the place of a plain tensor's statistics
(DeviceStats' row order), so that the records of a sharded port compare with a sharded original's, and a sharded
parameter's with the same parameter unsharded.

A DTensor with a Partial placement (a sum still pending across ranks) has no statistics its shards could give
without the reduction the script has not done: its record describes this rank's local tensor, a per-rank record as a
local op's.

Bounds: per rank and step, a shard-sized temporary at most while one shard is reduced (its NaN mask), 7 float64 per
DTensor record kept until the step ends, and one all_gather of 7 float64 a record per group of ranks sharing a
mesh dimension; nothing scales with a parameter's size.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

PARTIALS = ("count", "sum", "sum_of_squares", "min", "max", "nan_count", "inf_count")
_SUMMED = [PARTIALS.index(name) for name in ("count", "sum", "sum_of_squares", "nan_count", "inf_count")]
_EMPTY = (0.0, 0.0, 0.0, math.inf, -math.inf, 0.0, 0.0)  # an empty shard (uneven sharding) changes nothing


# DTensor's module: public from torch 2.5; torch 2.4 has it only as torch.distributed._tensor (2.5+ keeps that alias)
_DTENSOR_MODULES = ("torch.distributed.tensor", "torch.distributed._tensor")


def dtensor_type() -> type | None:
    """DTensor's class, where the script imported it (a DTensor exists only then); None otherwise."""
    found = (getattr(sys.modules.get(name), "DTensor", None) for name in _DTENSOR_MODULES)
    return next((cls for cls in found if cls is not None), None)


def is_dtensor(tensor: torch.Tensor) -> bool:
    cls = dtensor_type()
    return cls is not None and isinstance(tensor, cls)


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """The rank's own shard of a DTensor (a plain tensor, read without autograd or communication); a plain tensor
    itself."""
    return tensor._local_tensor if is_dtensor(tensor) else tensor


def describes_the_whole(tensor: torch.Tensor) -> bool:
    """Whether the DTensor's shards give the logical tensor's statistics: none of its placements is a pending sum."""
    return not any(placement.is_partial() for placement in tensor.placements)


def splits(placement: Any) -> bool:
    """Whether ranks along a mesh dimension of this placement hold different parts of the tensor: neither replicated
    nor a pending sum. Shard, and the strided shard of FSDP2 over tensor parallel (torch 2.13's _StridedShard, which
    says is_shard() False)."""
    return not (placement.is_replicate() or placement.is_partial())


def partials(local: torch.Tensor) -> torch.Tensor:
    """One shard's PARTIALS, float64, on its device."""
    if local.numel() == 0:
        return torch.tensor(_EMPTY, dtype=torch.float64, device=local.device)
    values = local if local.is_floating_point() else local.to(torch.float64)
    low, high = torch.aminmax(values)
    return torch.stack([
        torch.tensor(float(local.numel()), dtype=torch.float64, device=local.device),
        values.sum(dtype=torch.float64),
        torch.linalg.vector_norm(values, dtype=torch.float64).square(),
        low.to(torch.float64),
        high.to(torch.float64),
        values.isnan().sum().to(torch.float64),
        values.isinf().sum().to(torch.float64),
    ])


def combine(gathered: torch.Tensor) -> torch.Tensor:
    """The PARTIALS of shards taken together: `gathered` holds one (records, PARTIALS) table a shard, stacked."""
    combined = gathered.sum(0)
    combined[:, PARTIALS.index("min")] = gathered[:, :, PARTIALS.index("min")].amin(0)
    combined[:, PARTIALS.index("max")] = gathered[:, :, PARTIALS.index("max")].amax(0)
    return combined


def statistics_rows(combined: torch.Tensor) -> torch.Tensor:
    """Rows of min, max, sum, L2 norm, NaN and inf counts (tensor_stats.DeviceStats' order) from PARTIALS."""
    column = {name: combined[:, index] for index, name in enumerate(PARTIALS)}
    return torch.stack([column["min"], column["max"], column["sum"], column["sum_of_squares"].sqrt(),
                        column["nan_count"], column["inf_count"]], dim=1)


def gathered_over(partials_table: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's table of `group`, stacked: the one collective of a mesh dimension at a ship."""
    import torch.distributed as dist

    tables = [torch.empty_like(partials_table) for _ in range(dist.get_world_size(group))]
    dist.all_gather(tables, partials_table, group=group)
    return torch.stack(tables)


class ShardedStats:
    """The partial statistics of this step's DTensors, by (mesh, sharded dimensions), combined across their mesh
    when the batch ships (`combine_all`, a producer of the batch) into rows the records read (`point`)."""

    def __init__(self, add_rows, point) -> None:
        """`add_rows(rows) -> (key, offset)` queues rows of statistics; `point(stats, key, first)` makes a record
        read its row."""
        self._add_rows = add_rows
        self._point = point
        self._waiting: dict[tuple[int, tuple[int, ...]], tuple[Any, list[torch.Tensor], list[Any]]] = {}

    def add(self, tensor: torch.Tensor, stats: Any) -> None:
        """Queues a DTensor's partials (now: an in-place op may change it later in the step) for `stats`."""
        mesh = tensor.device_mesh
        dims = tuple(dim for dim, placement in enumerate(tensor.placements) if splits(placement))
        _, rows, owners = self._waiting.setdefault((id(mesh), dims), (mesh, [], []))
        rows.append(partials(tensor._local_tensor))
        owners.append(stats)

    def combine_all(self) -> None:
        """Combines every waiting group across its sharded mesh dimensions, one all_gather each, in the order the
        groups first appeared (the same on every rank)."""
        waiting, self._waiting = self._waiting, {}
        for (_, dims), (mesh, rows, owners) in waiting.items():
            table = torch.stack(rows)
            for dim in dims:
                table = combine(gathered_over(table, mesh.get_group(dim)))
            statistics = statistics_rows(table)
            key, offset = self._add_rows(statistics)
            for position, stats in enumerate(owners):
                self._point(stats, key, offset + position * statistics.shape[1])

    def discard(self) -> None:
        """Drops what waits (a run's end, where no other rank may reach a collective)."""
        self._waiting = {}
