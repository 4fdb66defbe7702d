from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Case, PortRule, Unchanged, dotted_name, matches

_LOADER = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
_SAMPLER = {"torch.utils.data.distributed.DistributedSampler", "torch.utils.data.DistributedSampler"}


class ShuffleWithSampler(PortRule):
    """Set `shuffle=False` on a DataLoader that is given a DistributedSampler: the sampler shuffles.

    ## What it does
    In `DataLoader(..., sampler=<DistributedSampler>, shuffle=True)`, where the sampler is a `DistributedSampler(...)`
    call or a variable assigned one in the same file, rewrites `shuffle=True` to `shuffle=False`.

    ## Why
    DataLoader raises "sampler option is mutually exclusive with shuffle" at run time; the shuffling of a distributed
    run belongs to the sampler, seeded and split per rank (checklist C7).

    ## Safety
    Safe: the call cannot run as written. `shuffle=(sampler is None)` and other expressions are left alone.

    ## References
    torch/utils/data/dataloader.py (the ValueError).
    """

    CODE = "DATA004"
    CHECKLIST = ("C7",)
    TRIGGERS = ("DistributedSampler",)
    EXAMPLES = (
        Case(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            sampler = DistributedSampler(train_set)
            loader = DataLoader(train_set, batch_size=32, shuffle=True, sampler=sampler)
            other = DataLoader(val_set, sampler=DistributedSampler(val_set), shuffle=True)
            """,
            """
            from torch.utils.data import DataLoader, DistributedSampler
            sampler = DistributedSampler(train_set)
            loader = DataLoader(train_set, batch_size=32, shuffle=False, sampler=sampler)
            other = DataLoader(val_set, sampler=DistributedSampler(val_set), shuffle=False)
            """,
            lines=[3, 4],
        ),
        Unchanged(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            sampler = DistributedSampler(train_set) if distributed else None
            loader = DataLoader(train_set, shuffle=(sampler is None), sampler=sampler)
            plain = DataLoader(train_set, shuffle=True, sampler=my_sampler)
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._samplers: set[str] = set()  # names assigned a DistributedSampler(...) call

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Call) and self.refers_to(node.value.func, *_SAMPLER):
            self._samplers.update(dotted_name(target.target) for target in node.targets)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self.refers_to(original_node.func, *_LOADER):
            return updated_node
        arguments = {arg.keyword.value: arg for arg in original_node.args if arg.keyword is not None}
        sampler, shuffle = arguments.get("sampler"), arguments.get("shuffle")
        if sampler is None or shuffle is None or not matches(shuffle.value, m.Name("True")):
            return updated_node
        if not (self._is_sampler_call(sampler.value) or dotted_name(sampler.value) in self._samplers):
            return updated_node
        new = updated_node.with_changes(
            args=[
                arg.with_changes(value=cst.Name("False")) if arg.keyword and arg.keyword.value == "shuffle" else arg
                for arg in updated_node.args
            ]
        )
        return self.replace(original_node, updated_node, new, "shuffle=False: the DistributedSampler shuffles")

    def _is_sampler_call(self, value: cst.BaseExpression) -> bool:
        return isinstance(value, cst.Call) and self.refers_to(value.func, *_SAMPLER)
