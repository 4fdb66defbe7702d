from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Flag, PortRule, Safety, Severity, Unchanged, argument, matches, string_value


class SeedArgumentWithoutDefault(PortRule):
    """Report a `--seed` command-line option whose default is None.

    ## What it does
    Reports `parser.add_argument("--seed", ...)` calls with no `default=` or `default=None`.

    ## Why
    Scripts usually seed only `if args.seed is not None`: run without the flag, the benchmark and the port train from
    different random numbers and their losses cannot be compared step by step (checklist C1).

    ## Safety
    Report-only: the default is the author's choice.

    ## References
    PyTorch's reproducibility notes (<https://docs.pytorch.org/docs/stable/notes/randomness.html>).
    """

    CODE = "DET009"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C1",)
    TRIGGERS = ("seed",)
    METADATA_DEPENDENCIES = ()
    EXAMPLES = (
        Flag(
            """
            parser.add_argument("--seed", type=int, default=None, help="random seed")
            parser.add_argument("--manual-seed", type=int)
            """,
            lines=[1, 2],
        ),
        Unchanged('parser.add_argument("--seed", type=int, default=42)\n'),
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func  # plain tests first: this runs on every call
        if not (isinstance(func, cst.Attribute) and func.attr.value == "add_argument") or not node.args:
            return
        flag = string_value(node.args[0].value) or ""
        if not flag.startswith("--") or "seed" not in flag:
            return
        default = argument(node, None, "default")
        if default is None or matches(default.value, m.Name("None")):
            self.report(
                node,
                f"{flag} defaults to None: runs without the flag are not seeded (C1)",
                f"give {flag} a default (e.g. default=42), or pass {flag} to every run: the seeds migrate adds "
                "follow it",
                Severity.INFO,
            )
