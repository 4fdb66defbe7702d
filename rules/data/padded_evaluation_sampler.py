from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Flag, PortRule, Safety, Severity, Unchanged, dotted_name, has_star_args, matches
from rules.data._loaders import (
    DISTRIBUTED_SAMPLER,
    LOADER,
    LOADER_POSITIONS,
    SAMPLER_POSITIONS,
    assigned_calls,
    description,
    flag_value,
    names_evaluation_split,
)


class PaddedEvaluationSampler(PortRule):
    """Report a DistributedSampler over a validation or test set that pads it with repeated samples.

    ## What it does
    Reports `DistributedSampler(...)` without `drop_last=True` when it serves an evaluation split: the dataset it is
    given, the name it is assigned to, or the DataLoader it is passed to (and that loader's name and dataset) says
    val, valid, eval or test (`val_sampler`, `DistributedSampler(test_set)`, `val_loader = DataLoader(ds,
    sampler=sampler)`).

    ## Why
    With `drop_last=False` the sampler makes the dataset divisible by the number of ranks by repeating samples from
    its start. Those samples are counted twice in the metric, and how many are repeated depends on the world size:
    the GPU run and the NPU run, on different device counts, report different accuracies for the same model.

    ## Safety
    Report-only: `drop_last=True` alone would skip the last `len(dataset) % world_size` samples. Evaluate those
    separately (the PyTorch ImageNet example's `aux_val_loader`), or evaluate on one rank without a sampler.

    ## References
    torch/utils/data/distributed.py (drop_last and the padding in `__iter__`).
    """

    CODE = "DATA005"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C7",)
    TRIGGERS = ("DistributedSampler",)
    EXAMPLES = (
        Flag(
            """
            import torch
            from torch.utils.data import DataLoader, DistributedSampler
            val_sampler = DistributedSampler(val_dataset, shuffle=False) if distributed else None
            test_loader = DataLoader(ds, sampler=torch.utils.data.distributed.DistributedSampler(ds))
            sampler = DistributedSampler(dataset, drop_last=False)
            eval_loader = DataLoader(dataset, batch_size=64, sampler=sampler)
            """,
            lines=[3, 4, 5],
        ),
        Unchanged(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            train_sampler = DistributedSampler(train_dataset)
            val_sampler = DistributedSampler(val_dataset, shuffle=False, drop_last=True)
            interval_sampler = DistributedSampler(latest_values)
            loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._assigned_to: dict[cst.Call, str] = {}  # call -> source of the names its value is assigned to
        self._padding: list[cst.Call] = []  # samplers that repeat samples
        self._evaluation_samplers: set[str] = set()  # sampler names passed to an evaluation DataLoader

    def visit_Assign(self, node: cst.Assign) -> None:
        self._assigned_to.update(assigned_calls(node))

    def visit_Call(self, node: cst.Call) -> None:
        if self.refers_to(node.func, *DISTRIBUTED_SAMPLER) and _pads(node):
            self._padding.append(node)
        elif self.refers_to(node.func, *LOADER):
            sampler = flag_value(node, LOADER_POSITIONS, "sampler")
            if sampler is not None and dotted_name(sampler) and self._serves_evaluation(node, LOADER_POSITIONS):
                self._evaluation_samplers.add(dotted_name(sampler))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        for sampler in self._padding:
            passed_to_evaluation = self._assigned_to.get(sampler) in self._evaluation_samplers
            if passed_to_evaluation or self._serves_evaluation(sampler, SAMPLER_POSITIONS):
                self.report(
                    sampler,
                    "DistributedSampler on an evaluation set pads it with repeated samples (drop_last=False): "
                    "the metric counts them twice, and how many depends on the number of ranks",
                    "Pass drop_last=True and evaluate the remaining len(dataset) % world_size samples separately, "
                    "or evaluate on one rank without a sampler.",
                    Severity.WARNING,
                )
        return updated_node

    def _serves_evaluation(self, call: cst.Call, positions: dict[str, int]) -> bool:
        """The call's dataset argument or the name its value is assigned to says val/eval/test."""
        return names_evaluation_split(description(call, positions, self._assigned_to.get(call, ""), "dataset"))


def _pads(sampler: cst.Call) -> bool:
    """drop_last is left at False (absent or the literal); `**options` may set it, so those calls are skipped."""
    drop_last = flag_value(sampler, SAMPLER_POSITIONS, "drop_last")
    return not has_star_args(sampler) and (drop_last is None or matches(drop_last, m.Name("False")))
