from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Case, PortRule, Positions, ReadsTheOriginal, Unchanged, called_name, findall, frameworks, \
    keyed_calls, loader_arguments, mapped_line, node_code, parsed

# The last names of the calls that seed a generator: random.seed, numpy.random.seed, torch.manual_seed,
# torch.cuda.manual_seed_all, a Generator's manual_seed, and the frameworks' helpers that seed every generator.
_SEEDERS = frozenset({"seed", "manual_seed", "manual_seed_all", "seed_all", *frameworks.SEED_EVERYTHING_NAMES})
_CALL_STATEMENT = m.SimpleStatementLine(body=[m.Expr(value=m.Call())])


def _key(outside: set[cst.Call]):
    """A seeding call's key: what it calls as written, `cuda` read as `npu` (a port may seed torch.npu where its
    original seeds torch.cuda); calls in `outside` (a DataLoader's arguments) have none."""
    def key(call: cst.Call) -> str | None:
        if call in outside or called_name(call) not in _SEEDERS:
            return None
        return node_code(call.func).replace(".cuda.", ".npu.").replace("torch_npu.npu.", "torch.npu.")
    return key


class OriginalSeed(ReadsTheOriginal, PortRule):
    """Seed the port's generators with the original's seeds, where a verify pair measured another data order.

    ## What it does
    Only under `migrate PORT --fix-from PAIR` when verify found the sides' first batch or initial weights differ
    (`data_order`; `Settings.original_source` holds the original's script): each seeding call of the port
    (`torch.manual_seed`, `random.seed`, `np.random.seed`, `torch.cuda.manual_seed_all`, a Generator's
    `manual_seed`, a framework's helper that seeds every generator, ...) gets the arguments of the original's call of the same name,
    the k-th call of a name standing for the original's k-th, where they differ. A seeding statement of the
    original that the port lacks is inserted where the original has it: before the port's line that holds the
    original's next line. Seeding calls inside a DataLoader's arguments are DATA201's; a seed the port adds that the
    original lacks is left.

    ## Why
    The seed decides a model's initial weights, the order a shuffling DataLoader draws and every random op after
    it: a port seeded otherwise trains another model on other batches, and verify's first step already differs
    (checklist C1). Made the original's, the port draws what the original draws.

    ## Safety
    Safe where it runs: only seeding calls change, to what the original passes (its expressions, `args.seed`
    included, read names the port keeps). A statement is inserted only where the original's next line is found in
    the port; the verify round after the fix shows whether the order now matches.

    ## References
    torch.manual_seed; PyTorch's reproducibility notes (docs/source/notes/randomness.rst).
    """

    CODE = "DET201"
    CHECKLIST = ("C1",)
    TRIGGERS = ("seed",)
    EXAMPLES = (
        Case(
            """
            import torch
            def main():
                torch.manual_seed(1)
                model = Net()
            """,
            """
            import torch
            def main():
                torch.manual_seed(0)
                model = Net()
            """,
            lines=[3],
            original_source="import torch\ndef main():\n    torch.manual_seed(0)\n    model = Net()\n",
        ),
        Case(
            """
            import random
            import torch
            def main(args):
                random.seed(0)
                model = Net()
            """,
            """
            import random
            import torch
            def main(args):
                random.seed(0)
                torch.manual_seed(args.seed)
                model = Net()
            """,
            lines=[5],
            original_source="import torch\ndef main(args):\n    torch.manual_seed(args.seed)\n    model = Net()\n",
        ),
        Unchanged(
            """
            import torch
            torch.manual_seed(1)
            loader = DataLoader(data, generator=torch.Generator().manual_seed(1))
            """,
            original_source="import torch\ntorch.manual_seed(1)\nloader = DataLoader(data, generator=g)\n",
        ),
        Unchanged("import torch\ntorch.manual_seed(1)\n"),
    )

    def visit_Module(self, node: cst.Module) -> None:
        original = parsed(self.settings.original_source)  # type: ignore[arg-type]
        theirs = keyed_calls(original, _key(loader_arguments(original)))
        self._mine = keyed_calls(node, _key(loader_arguments(node)))
        self._theirs = {place: call for call, place in theirs.items()}
        self._inserted = self._missing(original, set(self._mine.values()), theirs)

    def _missing(self, original: cst.Module, mine: set[tuple[str, int]],
                 theirs: dict[cst.Call, tuple[str, int]]) -> dict[int, list[cst.SimpleStatementLine]]:
        """The original's seeding statements the port lacks, by the port's line they go before."""
        inserted: dict[int, list[cst.SimpleStatementLine]] = {}
        lines = self.settings.original_source.splitlines()  # type: ignore[union-attr]
        positions = Positions(original)
        for statement in findall(original, _CALL_STATEMENT):
            place = theirs.get(statement.body[0].value)
            if place is None or place in mine:
                continue
            after = positions[statement].end.line
            following = (mapped_line(self.settings.original_source, self.file.source, line)  # type: ignore[arg-type]
                         for line in range(after + 1, len(lines) + 1) if lines[line - 1].strip())
            if (line := next(filter(None, following), None)) is not None:
                inserted.setdefault(line, []).append(statement.with_changes(leading_lines=()))
        return inserted

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        theirs = self._theirs.get(self._mine.get(original_node))  # type: ignore[arg-type]
        if theirs is None or [node_code(a.value) for a in theirs.args] == [
                node_code(a.value) for a in updated_node.args]:
            return updated_node
        new = updated_node.with_changes(args=theirs.args)
        return self.replace(original_node, updated_node, new,
                            f"seeded as the original: {node_code(new)} (was {node_code(updated_node)})")

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        seeds = self._inserted.get(self.file.position(original_node).start.line)
        if not seeds:
            return updated_node
        return self.replace(original_node, updated_node, cst.FlattenSentinel([*seeds, updated_node]),
                            f"seeded as the original: {'; '.join(node_code(s).strip() for s in seeds)} inserted (the "
                            "port lacked it)", at=original_node)
