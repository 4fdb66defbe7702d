from __future__ import annotations

import libcst as cst

from rules import Case, PortRule, Settings, Unchanged, attribute_chain, dotted_name
from rules.imports._project import from_module, joined

_PORTED = (("model", "model_npu"), ("pkg.layers", "pkg.layers_npu"), (".data", ".data_npu"), ("..utils", "..utils_npu"))


class PortedProjectImport(PortRule):
    """Make the ports of a project import each other's ports, not the originals.

    ## What it does
    When several files of a project are ported in one call (`migrate main.py model.py trainer.py`), each is written
    beside its original under a new name (`model_npu.py`). In each port, an import of another file of the call loads
    its port: `import model` -> `import model_npu as model`, `import model as m` -> `import model_npu as m`,
    `from model import GPT` -> `from model_npu import GPT`, `from . import data` -> `from . import data_npu as data`,
    `from .data import Loader` -> `from .data_npu import Loader`; `import pkg.layers` -> `import pkg.layers_npu`,
    with the code's `pkg.layers` references renamed. The names the file uses stay what they were.

    ## Why
    Without it, `main_npu.py` still runs `model.py` and `trainer.py`: the originals, with their cuda calls, and the
    ports of those files are never used. In explicit mode the port fails at the first cuda call.

    ## Safety
    Safe: it names only files that this call ported (migrate/project.py resolves each import to a file), and a port
    imports nothing else than it did. A second run finds only ported names and changes nothing.
    """

    CODE = "IMP003"
    CHECKLIST = ("C3",)
    EXAMPLES = (
        Case(
            """
            import model
            import model as m, os
            from model import GPT, GPTConfig
            from .data import Loader
            from . import data
            from .. import utils as u
            """,
            """
            import model_npu as model
            import model_npu as m, os
            from model_npu import GPT, GPTConfig
            from .data_npu import Loader
            from . import data_npu as data
            from .. import utils_npu as u
            """,
            lines=[1, 2, 3, 4, 5, 6],
            ported_modules=_PORTED,
        ),
        Case(
            """
            import pkg.layers

            net = pkg.layers.Block(pkg.other.SIZE)
            """,
            """
            import pkg.layers_npu

            net = pkg.layers_npu.Block(pkg.other.SIZE)
            """,
            lines=[1, 3],
            ported_modules=_PORTED,
        ),
        Unchanged(
            """
            import modelling
            from models import GPT
            from .model import Net
            import torch.nn as model
            """,
            ported_modules=_PORTED,
        ),
        Unchanged("import model\n"),  # a file ported alone: no other port to import
    )

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self._ported = dict(self.settings.ported_modules)
        self._references: dict[str, str] = {}  # `import pkg.layers` binds `pkg`: the code's `pkg.layers` follows
        self._in_import = False

    @classmethod
    def wants(cls, source: str, settings: Settings) -> bool:
        return bool(settings.ported_modules) and super().wants(source, settings)

    def visit_Import(self, node: cst.Import) -> None:
        self._in_import = True

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self._in_import = True

    def leave_Import(self, original: cst.Import, updated: cst.Import) -> cst.Import:
        self._in_import = False
        aliases = [self._ported_alias(alias) for alias in updated.names]
        if all(new is old for new, old in zip(aliases, updated.names)):
            return updated
        return self._rewrite(original, updated, updated.with_changes(names=aliases))

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
        self._in_import = False
        module = from_module(updated)
        ported = self._ported.get(module)
        if ported is not None:
            return self._rewrite(original, updated, updated.with_changes(module=attribute_chain(ported.lstrip("."))))
        if isinstance(updated.names, cst.ImportStar):
            return updated
        aliases = [self._ported_submodule(module, alias) for alias in updated.names]
        if all(new is old for new, old in zip(aliases, updated.names)):
            return updated
        return self._rewrite(original, updated, updated.with_changes(names=aliases))

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        ported = self._references.get(dotted_name(original)) if not self._in_import else None
        if ported is None or not self.refers_to(original, dotted_name(original)):
            return updated
        return self.replace(original, updated, attribute_chain(ported), f"`{dotted_name(original)}` -> `{ported}`")

    def _ported_alias(self, alias: cst.ImportAlias) -> cst.ImportAlias:
        name = dotted_name(alias.name)
        ported = self._ported.get(name)
        if ported is None:
            return alias
        asname = alias.asname
        if asname is None and "." in name:
            self._references[name] = ported
        elif asname is None:
            asname = cst.AsName(name=cst.Name(name))
        return alias.with_changes(name=attribute_chain(ported), asname=asname)

    def _ported_submodule(self, module: str, alias: cst.ImportAlias) -> cst.ImportAlias:
        name = dotted_name(alias.name)
        ported = self._ported.get(joined(module, name))
        if ported is None:
            return alias
        asname = alias.asname or cst.AsName(name=cst.Name(name))
        return alias.with_changes(name=cst.Name(ported.rpartition(".")[2]), asname=asname)

    def _rewrite(self, original: cst.CSTNode, updated: cst.CSTNode, new: cst.CSTNode) -> cst.CSTNode:
        before, after = self.file.code_for(original), cst.Module([]).code_for_node(new)
        return self.replace(
            original, updated, new, f"imports the port of a file this call ported: `{before}` -> `{after}`"
        )
