from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Case, Edit, Flag, Mode, PortRule, Severity, StatementEdits, Unchanged, findall, statement
from rules.determinism._entry_points import Entry, at_start, numpy_alias, process_entry

# What seeds each random number generator a training script uses, by qualified name.
_SEEDS = {
    "random.seed": "random",
    "numpy.random.seed": "numpy",
    "torch.manual_seed": "torch",
    "torch.random.manual_seed": "torch",
    "torch.cuda.manual_seed": "device",
    "torch.cuda.manual_seed_all": "device",
    "torch.npu.manual_seed": "device",
    "torch.npu.manual_seed_all": "device",
    "torch_npu.npu.manual_seed": "device",
    "torch_npu.npu.manual_seed_all": "device",
}
# Helpers that seed every generator at once.
_SEED_EVERYTHING = frozenset(
    {"transformers.set_seed", "lightning.seed_everything", "pytorch_lightning.seed_everything",
     "lightning.pytorch.seed_everything", "accelerate.utils.set_seed"}
)


class UnseededTraining(StatementEdits, PortRule):
    """Seed every random number generator a training script uses, once, where each process starts.

    ## What it does
    - A file that seeds some generators but not all (`torch.manual_seed(s)` without `random.seed(s)`, say) gets
      the missing `random.seed`, `np.random.seed` (when numpy is imported) and `torch.manual_seed` calls right
      after its own, with the same seed expression.
    - With `--seed N` and no seeding at all, the process entry (the function `mp.spawn` starts, else `main()`,
      else the `if __name__ == "__main__":` block, else the script after its imports) starts with `random.seed(N)`,
      `np.random.seed(N)` (when numpy is imported), `torch.manual_seed(N)` and the device's `manual_seed_all(N)`
      (`torch.npu` in explicit mode; `torch.cuda`, mapped to the NPU by transfer_to_npu, in transfer mode).
    - Without `--seed`, a training script that never seeds is reported.

    ## Why
    Two runs compare only when they draw the same random numbers: weight init, dropout, shuffling (checklist C1).
    Spawned workers start with fresh generators, so seeding only the parent process is not enough.

    ## Safety
    Safe: seeding changes which random numbers are drawn, not what the script computes. Files that seed through
    `transformers.set_seed`/`seed_everything` are left alone.

    ## References
    rules-catalogue DET-01; PyTorch "Reproducibility" notes; torch/random.py (`manual_seed` seeds every device).
    """

    CODE = "DET001"
    CHECKLIST = ("C1",)
    TRIGGERS = ("seed", ".backward(")
    EXAMPLES = (
        Case(
            """
            import numpy as np
            import torch

            def set_seed(seed):
                torch.manual_seed(seed)  # the model's init
                torch.cuda.manual_seed_all(seed)
            """,
            """
            import numpy as np
            import torch
            import random

            def set_seed(seed):
                torch.manual_seed(seed)  # the model's init
                random.seed(seed)
                np.random.seed(seed)
                torch.cuda.manual_seed_all(seed)
            """,
            lines=[5],
        ),
        Case(
            """
            import torch

            def main():
                \"\"\"Train.\"\"\"
                model = Net()
                loss = model(x).sum()
                loss.backward()

            if __name__ == "__main__":
                main()
            """,
            """
            import torch
            import random

            def main():
                \"\"\"Train.\"\"\"
                random.seed(0)
                torch.manual_seed(0)
                torch.npu.manual_seed_all(0)
                model = Net()
                loss = model(x).sum()
                loss.backward()

            if __name__ == "__main__":
                main()
            """,
            lines=[3],
            seed=0,
            mode=Mode.EXPLICIT,
        ),
        Flag(
            """
            for x, y in loader:
                criterion(model(x), y).backward()
                optimizer.step()
            """,
            lines=[2],
        ),
        Unchanged(
            """
            import random, numpy as np, torch
            random.seed(1); np.random.seed(1); torch.manual_seed(1)
            for x, y in loader:
                criterion(model(x), y).backward()
            """
        ),
        Unchanged(
            """
            from transformers import set_seed
            set_seed(42)
            loss.backward()
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._entry: Entry | None = None
        self._block: list[cst.BaseStatement] = []

    def visit_Module(self, node: cst.Module) -> None:
        calls = [call for call in findall(node, m.Call()) if isinstance(call, cst.Call)]
        if any(not self.qualified_names(call.func).isdisjoint(_SEED_EVERYTHING) for call in calls):
            return
        seeds = [(call, _SEEDS[name]) for call in calls for name in self.qualified_names(call.func) if name in _SEEDS]
        numpy = numpy_alias(node)
        if seeds:
            self._complete(node, seeds, numpy)
        elif self.settings.seed is not None:
            self._entry = process_entry(node, self.qualified_names)
            self._block = _seeding(str(self.settings.seed), numpy, self._device_module(), with_device=True)
        elif self.settings.is_entry:
            backward = findall(node, m.Call(func=m.Attribute(attr=m.Name("backward"))))
            if backward:
                self.report(
                    backward[0],
                    "this script trains without seeding any random number generator: two runs differ (C1)",
                    "port with --seed N, or call random.seed, np.random.seed and torch.manual_seed at the start",
                    severity=Severity.WARNING,
                )

    def _device_module(self) -> str:
        return "torch.npu" if self.settings.mode is Mode.EXPLICIT else "torch.cuda"

    def _complete(self, module: cst.Module, seeds: list[tuple[cst.Call, str]], numpy: str | None) -> None:
        kinds = {kind for _, kind in seeds}
        anchor = next((call for call, kind in seeds if kind == "torch"), seeds[-1][0])
        if not anchor.args:
            return
        seed = cst.Module([]).code_for_node(anchor.args[0].value)
        missing = [kind for kind in ("random", "numpy", "torch") if kind not in kinds and (kind != "numpy" or numpy)]
        if not missing:
            return
        statements = [line for line in _seeding(seed, numpy, "", with_device=False) if _kind(line) in missing]
        place = _statement_holding(module, anchor)
        if place is not None:
            block, index = place
            message = "completed the seeding: " + ", ".join(missing)
            self.edit(block, Edit(index, message, insert_after=tuple(statements), imports=_imports(missing)))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        return self._seed_entry(original_node, updated_node)

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        return self._seed_entry(original_node, updated_node)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        updated_node = super().leave_Module(original_node, updated_node)
        return self._seed_entry(original_node, updated_node)

    def _seed_entry(self, original: Entry, updated: Entry):
        if original is not self._entry:
            return updated
        message = f"seeded every generator with {self.settings.seed} at the start of the process"
        new = at_start(updated, self._block)
        anchor = original.body[0] if isinstance(original, cst.Module) and original.body else original
        return self.replace(original, updated, new, message, imports=_imports(["random", "torch"]), at=anchor)


def _seeding(seed: str, numpy: str | None, device: str, with_device: bool) -> list[cst.BaseStatement]:
    lines = [f"random.seed({seed})"]
    if numpy:
        lines.append(f"{numpy}.random.seed({seed})")
    lines.append(f"torch.manual_seed({seed})")
    if with_device:
        lines.append(f"{device}.manual_seed_all({seed})")
    return [statement(line) for line in lines]


def _kind(line: cst.BaseStatement) -> str:
    text = cst.Module([]).code_for_node(line)
    return "random" if text.startswith("random.") else "torch" if text.startswith("torch.") else "numpy"


def _imports(kinds: list[str]) -> tuple[tuple[str, None], ...]:
    return tuple((kind, None) for kind in kinds if kind in ("random", "torch"))


def _statement_holding(module: cst.Module, call: cst.Call) -> tuple[cst.Module | cst.IndentedBlock, int] | None:
    """The statement list and index of the simple statement line that holds `call`."""
    for block in [module, *findall(module, m.IndentedBlock())]:
        for index, line in enumerate(block.body):  # type: ignore[attr-defined]
            if isinstance(line, cst.SimpleStatementLine) and any(found is call for found in findall(line, m.Call())):
                return block, index  # type: ignore[return-value]
    return None
