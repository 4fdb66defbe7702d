from __future__ import annotations

import os

import libcst as cst

from rules import Flag, Mode, PortRule, Safety, Settings, Unchanged
from rules.imports._project import imported_names

_LEFT_OUT = (("model", "mingpt/model.py"), (".data", "mingpt/pkg/data.py"))


class UnportedProjectImport(PortRule):
    """Report imports of a file of the project that the call did not port.

    ## What it does
    When files are ported by name (`migrate main.py trainer.py`), reports each import of a Python file of the same
    project that was not named (`model.py` beside them, which `import model` loads), naming the file, and advises the
    folder's port (`migrate mingpt/`), which ports every file and keeps their names.

    ## Why
    The port runs that original module as it is: in explicit mode its cuda calls stay, and the port fails at the
    first of them on an NPU. In transfer mode transfer_to_npu patches them at run time, but the module is not
    checked for what migrate checks (mixed precision, seeding, sharding...). The accuracy checklist's C3 is Failed
    while an entry point imports such a module in explicit mode.

    ## Safety
    Report-only: the fix is to port the file, which only the user can ask for.
    """

    CODE = "IMP004"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    METADATA_DEPENDENCIES = ()
    EXAMPLES = (
        Flag(
            """
            import os
            from model import GPT
            from . import data
            """,
            lines=[2, 3],
            unported_modules=_LEFT_OUT,
            mode=Mode.EXPLICIT,
        ),
        Unchanged("from modelling import GPT\nimport torch\n", unported_modules=_LEFT_OUT),
        Unchanged("from model import GPT\n"),  # no file of the project was left out
    )

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self._left_out = dict(self.settings.unported_modules)

    @classmethod
    def wants(cls, source: str, settings: Settings) -> bool:
        return bool(settings.unported_modules) and super().wants(source, settings)

    def visit_Import(self, node: cst.Import) -> None:
        self._check(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self._check(node)

    def _check(self, node: cst.Import | cst.ImportFrom) -> None:
        files = list(dict.fromkeys(self._left_out[name] for name in imported_names(node) if name in self._left_out))
        if not files:
            return
        named = ", ".join(files)
        stays = " with its cuda calls" if self.settings.mode is Mode.EXPLICIT else ""
        folders = " ".join(f"{os.path.dirname(file) or '.'}/" for file in dict.fromkeys(files))
        self.report(
            node,
            f"imports {named}, a file of this project that this call did not port: the port runs the "
            f"original{stays}",
            f"port it in the same call, or port the folder, which ports every file and keeps their names: "
            f"`migrate {folders}`",
        )
