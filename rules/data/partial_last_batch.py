from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Flag, PortRule, Safety, Severity, Unchanged, dotted_name, has_star_args, matches
from rules.data._loaders import (
    LOADER,
    LOADER_POSITIONS,
    assigned_calls,
    description,
    flag_value,
    is_true,
    names_evaluation_split,
    names_training_split,
)

_NO_BATCHING = m.Name("None") | m.Integer("1")  # no batches, or batches of one: no partial last batch


class PartialLastBatch(PortRule):
    """Note a training DataLoader that keeps a partial last batch, whose new shape the NPU compiles again.

    ## What it does
    Reports, at info level, a `DataLoader(...)` with a `batch_size` other than 1 or None and without
    `drop_last=True`, when it is a training loader: it shuffles, or its name, dataset or sampler says train. Loaders
    whose names say val, eval or test are left alone, as are loaders with a `batch_sampler=`, with a sampler built
    with `drop_last=True`, or with `**options` that may set it. One finding per DataLoader call.

    ## Why
    The last batch of each epoch has fewer samples than the others. On the NPU a new input shape means operators
    are compiled again for that shape, a one-step stall each epoch and extra compiled kernels held in memory; GPU
    kernels take any shape, so the original does not show it.

    ## Safety
    Report-only: `drop_last=True` skips up to `batch_size - 1` samples per epoch, a training change to make on both
    sides or not at all.

    ## References
    torch/utils/data/dataloader.py (drop_last); Huawei's migration tool README on dynamic shapes:
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>.
    """

    CODE = "DATA008"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C6",)
    TRIGGERS = ("DataLoader",)
    EXAMPLES = (
        Flag(
            """
            import torch
            from torch.utils.data import DataLoader
            train_loader = torch.utils.data.DataLoader(
                train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
                num_workers=args.workers, pin_memory=True, sampler=train_sampler)
            loader = DataLoader(dataset, 64, True, drop_last=False)
            """,
            lines=[3, 6],
        ),
        Unchanged(
            """
            from torch.utils.data import BatchSampler, DataLoader, DistributedSampler
            val_loader = DataLoader(val_dataset, batch_size=256, shuffle=False, sampler=val_sampler)
            whole = DataLoader(train_dataset, batch_size=64, shuffle=True, drop_last=True)
            single = DataLoader(train_dataset, shuffle=True)
            batched = DataLoader(train_dataset, batch_sampler=BatchSampler(sampler, 64, drop_last=False))
            sampler = DistributedSampler(train_dataset, drop_last=True)
            sharded = DataLoader(train_dataset, batch_size=64, sampler=sampler)
            unknown = DataLoader(dataset, batch_size=64)
            options = DataLoader(train_dataset, batch_size=64, shuffle=True, **loader_options)
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._assigned_to: dict[cst.Call, str] = {}
        self._dropping_samplers: set[str] = set()  # names assigned a sampler built with drop_last=True

    def visit_Assign(self, node: cst.Assign) -> None:
        calls = assigned_calls(node)
        self._assigned_to.update(calls)
        self._dropping_samplers.update(targets for call, targets in calls.items() if _drops_last(call))

    def visit_Call(self, node: cst.Call) -> None:
        if self.refers_to(node.func, *LOADER) and self._keeps_partial_batch(node) and self._trains(node):
            self.report(
                node,
                "training DataLoader keeps the last, partial batch (drop_last=False): on the NPU its new shape "
                "makes operators compile again each epoch",
                "Pass drop_last=True, in the original script too, so both sides train on the same batches.",
                Severity.INFO,
            )

    def _keeps_partial_batch(self, loader: cst.Call) -> bool:
        batch_size = flag_value(loader, LOADER_POSITIONS, "batch_size")
        drop_last = flag_value(loader, LOADER_POSITIONS, "drop_last")
        sampler = flag_value(loader, LOADER_POSITIONS, "sampler")
        return not (
            batch_size is None
            or matches(batch_size, _NO_BATCHING)
            or (drop_last is not None and not matches(drop_last, m.Name("False")))
            or flag_value(loader, LOADER_POSITIONS, "batch_sampler") is not None
            or has_star_args(loader)
            or (sampler is not None and self._sampler_drops_last(sampler))
        )

    def _sampler_drops_last(self, sampler: cst.BaseExpression) -> bool:
        if isinstance(sampler, cst.Call):
            return _drops_last(sampler)
        return dotted_name(sampler) in self._dropping_samplers

    def _trains(self, loader: cst.Call) -> bool:
        """It shuffles, or its name, dataset or sampler says train; and none of them says val/eval/test."""
        text = description(loader, LOADER_POSITIONS, self._assigned_to.get(loader, ""), "dataset", "sampler")
        if names_evaluation_split(text):
            return False
        shuffle = flag_value(loader, LOADER_POSITIONS, "shuffle")
        return names_training_split(text) or (shuffle is not None and not matches(shuffle, m.Name("False")))


def _drops_last(call: cst.Call) -> bool:
    return any(arg.keyword is not None and arg.keyword.value == "drop_last" and is_true(arg.value) for arg in call.args)
