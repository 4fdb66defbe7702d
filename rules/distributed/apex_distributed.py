from __future__ import annotations

import libcst as cst
from libcst.codemod.visitors import RemoveImportsVisitor

from rules import Case, Flag, PortRule, Safety, Severity, Unchanged, attribute_chain

# apex name -> (torch replacement, apex-only keywords with the value torch behaves as; any other value blocks the port)
_PORTS = {
    "apex.parallel.DistributedDataParallel": (
        "torch.nn.parallel.DistributedDataParallel",
        {
            "delay_allreduce": "False",
            "message_size": None,
            "allreduce_trigger_params": "None",
            "retain_allreduce_buffers": "False",
        },
    ),
    "apex.parallel.convert_syncbn_model": (
        "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
        {"channel_last": "False"},
    ),
}
_TORCH_KEYWORDS = {
    "apex.parallel.DistributedDataParallel": set(),  # apex's other keywords do not exist in torch's DDP
    "apex.parallel.convert_syncbn_model": {"module", "process_group"},
}


class ApexDistributed(PortRule):
    """Replace apex's DistributedDataParallel and convert_syncbn_model with their torch equivalents.

    ## What it does
    `apex.parallel.DistributedDataParallel(model, ...)` becomes `torch.nn.parallel.DistributedDataParallel(model)`
    and `apex.parallel.convert_syncbn_model(model)` becomes `torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)`,
    whatever the import alias; the apex import is removed once unused. apex-only keywords are dropped when they hold
    the value torch behaves as (`delay_allreduce=False`, `message_size=...`); any other keyword or extra positional
    argument stops the rewrite and the call is reported instead.

    ## Why
    apex.parallel is built on CUDA kernels and NCCL and is not part of Ascend's apex; torch's DDP and SyncBatchNorm
    run on HCCL.

    ## Safety
    Unsafe: bucketing and overlap differ from apex's implementation (`delay_allreduce`, `message_size`), and torch's
    DDP must be created after the model is on its device.

    ## References
    MindStudio "Replace Unsupported APIs" (apex DDP):
    <https://www.hiascend.com/doc_center/source/zh/mindstudio/500/msug/msug_000049.html>.
    """

    CODE = "DIST008"
    SAFETY = Safety.UNSAFE
    CHECKLIST = ("C3",)
    TRIGGERS = ("apex",)
    EXAMPLES = (
        Case(
            """
            import torch
            from apex.parallel import DistributedDataParallel as DDP, convert_syncbn_model
            model = convert_syncbn_model(model)  # BN stats across ranks
            model = DDP(model, delay_allreduce=False, message_size=250000)
            """,
            """
            import torch
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # BN stats across ranks
            model = torch.nn.parallel.DistributedDataParallel(model)
            """,
            lines=[3, 4],
        ),
        Case(
            """
            import apex
            model = apex.parallel.DistributedDataParallel(model)
            model, optimizer = apex.amp.initialize(model, optimizer)
            """,
            """
            import apex
            import torch

            model = torch.nn.parallel.DistributedDataParallel(model)
            model, optimizer = apex.amp.initialize(model, optimizer)
            """,
            lines=[2],
        ),
        Flag(
            """
            from apex.parallel import DistributedDataParallel
            model = DistributedDataParallel(model, delay_allreduce=True)
            """,
            lines=[2],
        ),
        Unchanged(
            """
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(model, device_ids=[rank])
            """
        ),
    )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self.refers_to(original_node.func, *_PORTS):  # most calls: known without resolving their names
            return updated_node
        name = min(self.qualified_names(original_node.func) & set(_PORTS))
        target, apex_only = _PORTS[name]
        args = _kept_arguments(updated_node, apex_only, _TORCH_KEYWORDS[name])
        if args is None:
            self.report(
                original_node,
                f"{name} uses options torch's replacement does not have",
                f"port it by hand to {target}",
                severity=Severity.ERROR,
            )
            return updated_node
        if args:
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        new = updated_node.with_changes(func=attribute_chain(target), args=args)
        result = self.replace(
            original_node, updated_node, new, f"{name} -> {target}", imports=[("torch", None)], severity=Severity.WARNING
        )
        if result is new:
            RemoveImportsVisitor.remove_unused_import_by_node(self.context, original_node.func)
        return result


def _kept_arguments(
    call: cst.Call, apex_only: dict[str, str | None], torch_keywords: set[str]
) -> list[cst.Arg] | None:
    """The arguments torch accepts: the module plus known keywords, without apex-only ones; None if one must stay."""
    if not call.args or call.args[0].keyword is not None or call.args[0].star:
        return None
    kept = [call.args[0]]
    for arg in call.args[1:]:
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword in torch_keywords:
            kept.append(arg)
        elif keyword not in apex_only:
            return None
        elif apex_only[keyword] is not None and cst.Module([]).code_for_node(arg.value) != apex_only[keyword]:
            return None
    return kept
