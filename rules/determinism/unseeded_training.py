from __future__ import annotations

from typing import Iterable, NamedTuple

import libcst as cst
import libcst.matchers as m

from rules import Case, Edit, Flag, Mode, PortRule, Severity, StatementEdits, Unchanged, findall, statement
from rules.determinism._entry_points import Entry, at_start, numpy_alias, process_entry, seeds_python_generator
from rules.determinism._script_seed import (
    ScriptSeed, bound_at_start, last_binding, script_seed, seed_anchor, seed_calls,
)

class UnseededTraining(StatementEdits, PortRule):
    """Seed every random number generator a training script uses, once, where each process starts.

    ## What it does
    - A file that seeds some generators but not all (`torch.manual_seed(s)` without `random.seed(s)`, say) gets
      the missing `random.seed`, `np.random.seed` (when numpy is imported) and `torch.manual_seed` calls right
      after its own, with the same seed expression.
    - With `--seed N` and no seeding at all, the process entry (the function `mp.spawn` starts, else `main()`,
      else the `if __name__ == "__main__":` block, else the script after its imports) starts with `random.seed(S)`,
      `np.random.seed(S)` (when numpy is imported), `torch.manual_seed(S)` and the device's `manual_seed_all(S)`
      (`torch.npu` in explicit mode; `torch.cuda`, mapped to the NPU by transfer_to_npu, in transfer mode). S is
      the script's own seed where it has one (a `--seed` option, a `seed` variable), right after the statement
      that binds it (`args = parser.parse_args()`), under `if args.seed is not None:` where the option has no
      default; else N. The report names the seed.
    - Without `--seed`, a training script that never seeds is reported.
    - An inference script (an entry script with no backward() and no optimizer step) gets seeds only for the
      generators it imports: `random.seed` only where it imports `random`. A training script gets `random.seed`
      whether or not it imports `random`: its data pipeline (torchvision's transforms, augmentation libraries)
      draws from python's generator without the script naming it.

    ## Why
    Two runs compare only when they draw the same random numbers: weight init, dropout, shuffling (checklist C1).
    Spawned workers start with fresh generators, so seeding only the parent process is not enough.

    ## Safety
    Safe: seeding changes which random numbers are drawn, not what the script computes. Files that seed through a
    framework's helper that seeds every generator (`transformers.set_seed`, Lightning's, accelerate's) are left alone.

    ## References
    PyTorch's reproducibility notes (<https://docs.pytorch.org/docs/stable/notes/randomness.html>); torch/random.py
    (`manual_seed` seeds every device).
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
            is_entry=False,  # a project's helper module: the script that trains is another file
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
        Case(  # the script's --seed option, once it is parsed
            """
            import argparse
            import torch

            def main():
                parser = argparse.ArgumentParser()
                parser.add_argument("--seed", type=int, default=1)
                args = parser.parse_args()
                loss = model(x).sum()
                loss.backward()
            """,
            """
            import argparse
            import torch
            import random

            def main():
                parser = argparse.ArgumentParser()
                parser.add_argument("--seed", type=int, default=1)
                args = parser.parse_args()
                random.seed(args.seed)
                torch.manual_seed(args.seed)
                torch.cuda.manual_seed_all(args.seed)
                loss = model(x).sum()
                loss.backward()
            """,
            lines=[7],
            seed=0,
        ),
        Case(  # an option without default: seeded where the script is given a seed
            """
            import argparse
            import torch

            parser = argparse.ArgumentParser()
            parser.add_argument("--seed", type=int)

            if __name__ == "__main__":
                args = parser.parse_args()
                loss = model(x).sum()
                loss.backward()
            """,
            """
            import argparse
            import torch
            import random

            parser = argparse.ArgumentParser()
            parser.add_argument("--seed", type=int)

            if __name__ == "__main__":
                args = parser.parse_args()
                if args.seed is not None:
                    random.seed(args.seed)
                    torch.manual_seed(args.seed)
                    torch.cuda.manual_seed_all(args.seed)
                loss = model(x).sum()
                loss.backward()
            """,
            lines=[8],
            seed=3,
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
        Unchanged(  # an inference script seeds only the generators it uses: it never imports random
            """
            import torch

            def main():
                torch.manual_seed(0)
                model = Classifier().eval()
                with torch.no_grad():
                    print(model(torch.randn(8, 3, 16, 16)).topk(5).indices)
            """
        ),
        Case(  # an inference script that draws from python's generator too
            """
            import random
            import torch

            torch.manual_seed(0)
            model = Classifier().eval()
            images = random.sample(gallery, 8)
            """,
            """
            import random
            import torch

            torch.manual_seed(0)
            random.seed(0)
            model = Classifier().eval()
            images = random.sample(gallery, 8)
            """,
            lines=[4],
        ),
        Case(  # an inference script with a --seed option it never uses: torch's generators only
            """
            import argparse
            import torch

            if __name__ == "__main__":
                parser = argparse.ArgumentParser()
                parser.add_argument("--seed", type=int, default=1)
                args = parser.parse_args()
                print(Classifier().eval()(torch.randn(8, 3, 16, 16)).argmax(1))
            """,
            """
            import argparse
            import torch

            if __name__ == "__main__":
                parser = argparse.ArgumentParser()
                parser.add_argument("--seed", type=int, default=1)
                args = parser.parse_args()
                torch.manual_seed(args.seed)
                torch.cuda.manual_seed_all(args.seed)
                print(Classifier().eval()(torch.randn(8, 3, 16, 16)).argmax(1))
            """,
            lines=[7],
            seed=0,
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
        self._generators = _Generators(random=True, numpy=None)
        self._message = ""

    def visit_Module(self, node: cst.Module) -> None:
        seeds = seed_calls(node, self)
        if any(kind == "all" for _, kind in seeds):
            return
        self._generators = _Generators(seeds_python_generator(node, self.file.inference), numpy_alias(node))
        if seeds:
            self._complete(node, seeds)
        elif self.settings.seed is not None:
            self._seed_process(node)
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

    def _seed_process(self, module: cst.Module) -> None:
        """Seed every generator where the process starts: with the script's seed once it is bound, else with N."""
        entry = process_entry(module, self.qualified_names)
        seed = script_seed(module, self)
        line_of = lambda node: self.file.position(node).start.line  # noqa: E731
        body = entry if isinstance(entry, cst.Module) else entry.body
        binding = last_binding(list(body.body), seed.names) if seed is not None else None
        if seed is not None and isinstance(body, (cst.Module, cst.IndentedBlock)) and binding is not None:
            block = self._seeding_block(seed)
            message = f"seeded every generator with {seed.described()} once it is bound"
            self.edit(body, Edit(binding, message, insert_after=tuple(block), imports=self._generators.imports()))
        elif seed is not None and bound_at_start(seed, module, entry, line_of):
            self._entry, self._block = entry, self._seeding_block(seed)
            self._message = f"seeded every generator with {seed.described()} at the start of the process"
        else:
            self._entry = entry
            self._block = _seeding(str(self.settings.seed), self._generators, self._device_module(), with_device=True)
            why = f"`{seed.text}` is not bound there" if seed is not None else "the script has no seed of its own"
            self._message = (f"seeded every generator with {self.settings.seed} at the start of the process "
                             f"(migrate --seed: {why})")

    def _seeding_block(self, seed: ScriptSeed) -> list[cst.BaseStatement]:
        """The seeding statements for the script's seed, under its test where it may be None."""
        lines = _seeding(seed.text, self._generators, self._device_module(), with_device=True)
        if seed.guard is None:
            return lines
        guarded = cst.Module([]).code_for_node(seed.guard)
        return [statement(f"if {guarded}:\n" + "".join("    " + cst.Module([]).code_for_node(line) for line in lines))]

    def _complete(self, module: cst.Module, seeds: list[tuple[cst.Call, str]]) -> None:
        kinds = {kind for _, kind in seeds}
        anchor = seed_anchor(seeds)
        if not anchor.args:
            return
        seed = cst.Module([]).code_for_node(anchor.args[0].value)
        missing = [kind for kind in self._generators.kinds() if kind not in kinds]
        if not missing:
            return
        seeding = _seeding(seed, self._generators, "", with_device=False)
        statements = [line for line in seeding if _kind(line) in missing]
        place = _statement_holding(module, anchor)
        if place is not None:
            block, index = place
            seeder = cst.Module([]).code_for_node(anchor.func)
            message = f"completed the seeding: {', '.join(missing)} seeded with `{seed}`, as the script's {seeder}(...)"
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
        new = at_start(updated, self._block)
        anchor = original.body[0] if isinstance(original, cst.Module) and original.body else original
        imports = self._generators.imports()
        return self.replace(original, updated, new, self._message, imports=imports, at=anchor)


class _Generators(NamedTuple):
    """The generators a file's seeding covers: python's (`random`), numpy's under the name the file imports it by
    (None where it does not), and torch's, always."""

    random: bool
    numpy: str | None

    def kinds(self) -> list[str]:
        return [kind for kind, used in (("random", self.random), ("numpy", self.numpy), ("torch", True)) if used]

    def imports(self) -> tuple[tuple[str, None], ...]:
        return _imports(self.kinds())


def _seeding(seed: str, generators: _Generators, device: str, with_device: bool) -> list[cst.BaseStatement]:
    lines = [f"random.seed({seed})"] if generators.random else []
    if generators.numpy:
        lines.append(f"{generators.numpy}.random.seed({seed})")
    lines.append(f"torch.manual_seed({seed})")
    if with_device:
        lines.append(f"{device}.manual_seed_all({seed})")
    return [statement(line) for line in lines]


def _kind(line: cst.BaseStatement) -> str:
    text = cst.Module([]).code_for_node(line)
    return "random" if text.startswith("random.") else "torch" if text.startswith("torch.") else "numpy"


def _imports(kinds: Iterable[str]) -> tuple[tuple[str, None], ...]:
    return tuple((kind, None) for kind in kinds if kind in ("random", "torch"))


def _statement_holding(module: cst.Module, call: cst.Call) -> tuple[cst.Module | cst.IndentedBlock, int] | None:
    """The statement list and index of the simple statement line that holds `call`."""
    for block in [module, *findall(module, m.IndentedBlock())]:
        for index, line in enumerate(block.body):  # type: ignore[attr-defined]
            if isinstance(line, cst.SimpleStatementLine) and any(found is call for found in findall(line, m.Call())):
                return block, index  # type: ignore[return-value]
    return None
