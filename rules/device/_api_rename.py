"""The shared body of rules that move references from one API to another by a table of qualified names."""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar, Mapping

import libcst as cst
from libcst.helpers import get_full_name_for_node

from rules import PortRule
from rules.device._rewrite import renamed_reference


class ApiRename(PortRule):
    """Rewrites each reference whose qualified name is a key of `renames()` to the value, keeping the source's
    spelling of the package (see `renamed_reference`). `from M import a, b` moves to the module `MODULES[M]` when
    every name in it moves there; otherwise the import stays and each use of a moved name is written out in full.
    """

    # Modules that can be imported from under their new name: {"torch.cuda": "torch.npu"}.
    MODULES: ClassVar[Mapping[str, str]] = {}

    @classmethod
    @abstractmethod
    def renames(cls) -> Mapping[str, str]:
        """Qualified name -> qualified name of its counterpart."""

    def describe(self, qualified: str, target: str) -> str:
        return f"`{qualified}` -> `{target}`"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._moved_imports: set[str] = set()  # local names bound by an import this rule moved
        # Every qualified name of `a.b` ends in `b`: a plain test that spares most attributes the name lookup.
        self._renamed_attributes = frozenset(name.rpartition(".")[2] for name in self.renames())

    def visit_Import(self, node: cst.Import) -> bool:
        return False  # names in import statements are not uses

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False  # an import's module path is handled as a whole in leave_ImportFrom

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if original_node.value in self._moved_imports:
            return updated_node
        return self._rename(original_node, updated_node)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if original_node.attr.value not in self._renamed_attributes:
            return updated_node
        return self._rename(original_node, updated_node)

    def _rename(self, original_node: cst.Name | cst.Attribute, updated_node: cst.BaseExpression) -> cst.BaseExpression:
        renames = self.renames()
        for qualified in sorted(self.qualified_names(original_node)):
            target = renames.get(qualified)
            if target:
                new, imports = renamed_reference(original_node, qualified, target)
                message = self.describe(qualified, target)
                return self.replace(original_node, updated_node, new, message, imports=imports)
        return updated_node

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        module = get_full_name_for_node(original_node.module) if original_node.module else None
        if module is None or original_node.relative or isinstance(original_node.names, cst.ImportStar):
            return updated_node
        renames = self.renames()
        moved = {
            alias.evaluated_name: renames[f"{module}.{alias.evaluated_name}"]
            for alias in original_node.names
            if f"{module}.{alias.evaluated_name}" in renames
        }
        if not moved:
            return updated_node
        new_module = self.MODULES.get(module)
        if len(moved) < len(original_node.names) or new_module is None:
            return updated_node  # each use is rewritten instead
        aliases = []
        for alias in updated_node.names:  # type: ignore[union-attr]
            self._moved_imports.add(alias.evaluated_alias or alias.evaluated_name)
            new_name = moved[alias.evaluated_name].rpartition(".")[2]
            if new_name == alias.evaluated_name:
                aliases.append(alias)
            else:
                kept = alias.asname or cst.AsName(name=cst.Name(alias.evaluated_name))
                aliases.append(alias.with_changes(name=cst.Name(new_name), asname=kept))
        new = updated_node.with_changes(module=cst.parse_expression(new_module), names=aliases)
        return self.replace(original_node, updated_node, new, f"`from {module} import ...` -> `from {new_module} import ...`")
