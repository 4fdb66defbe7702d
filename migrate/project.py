"""The files of one project ported by name in one call (`migrate main.py model.py trainer.py`): which imports which,
which are the entry points, and what each file's port must import instead of the originals (issue 35).

Read with Python's `ast` before anything is ported. Each import of a named file is resolved to a file as Python would
find it from the entry point's folder: an absolute name under the importing file's folder or any named file's, a
relative one from the importing file's package. The rules get, in each file's settings, the imports that load another
named file (IMP003 rewrites them to its port, where the port is written beside it under another name) and those that
load a file of the project left out of the call (IMP004 warns). The checklist reads only the files the entry points
reach (migrate/checklist.py).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from migrate.files import Job, has_main_guard, read_source, shown_path
from migrate.parsing import parse, python_tree
from migrate.types import SourceError


@dataclass(frozen=True)
class ProjectImport:
    """`importer` loads `file`, a Python file of the project, by `name` as the importer writes it (`.model`)."""

    importer: Path
    line: int
    name: str
    file: Path

    @property
    def shown_file(self) -> str:
        """The file's path as the importer's was given (`model.py`, `mingpt/model.py`)."""
        return shown_path(self.importer.parent / os.path.relpath(self.file, self.importer.resolve().parent))

    def __str__(self) -> str:
        return f"{shown_path(self.importer)}:{self.line}: imports {self.shown_file}"


@dataclass(frozen=True)
class Project:
    named: dict[Path, Job]  # resolved path -> its job, for each Python file named in the call
    imports: tuple[ProjectImport, ...]
    entries: frozenset[Path]  # resolved paths

    @classmethod
    def read(cls, paths: Sequence[Path], jobs: Sequence[Job]) -> Project:
        named_paths = {path.resolve() for path in paths if path.is_file() and path.suffix == ".py"}
        named = {job.source.resolve(): job for job in jobs if job.port and job.source.resolve() in named_paths}
        roots = list(dict.fromkeys(path.parent for path in named))
        imports = tuple(found for job in named.values() for found in _project_imports(job.source, roots))
        return cls(named, imports, _entry_points(named, imports))

    @property
    def reachable(self) -> frozenset[Path]:
        """The named files an entry point runs: the entry points and what they import, transitively."""
        return self._reached_from(*self.entries)

    def _reached_from(self, *starts: Path) -> frozenset[Path]:
        """`starts` and the named files they import, transitively."""
        seen, todo = set(starts), list(starts)
        while todo:
            importer = todo.pop()
            for found in self._imports_of(importer):
                if found.file in self.named and found.file not in seen:
                    seen.add(found.file)
                    todo.append(found.file)
        return frozenset(seen)

    def is_entry(self, source: str) -> bool:
        """Whether `source` (as FileResult.source shows it) is a named file that is an entry point."""
        return any(shown_path(self.named[path].source) == source for path in self.entries)

    def counts(self, source: str) -> bool:
        """Whether the checklist reads the result of `source` (as FileResult.source shows it): a named file no entry
        point reaches does not count; a file of a folder's port does."""
        named = {shown_path(job.source): path for path, job in self.named.items()}
        return source not in named or named[source] in self.reachable

    def left_out(self) -> list[ProjectImport]:
        """The imports, in the files an entry point reaches, of project files that the call did not port."""
        reachable = self.reachable
        return [found for found in self.imports
                if found.importer.resolve() in reachable and found.file not in self.named]

    def settle(self, jobs: Sequence[Job]) -> list[Job]:
        """The jobs with each named file's settings: whether it is an entry point (a module of the project is never
        read as an inference script), and the imports its port rewrites or warns about."""
        return [self._settled(job) if job.source.resolve() in self.named and job.port else job for job in jobs]

    def _settled(self, job: Job) -> Job:
        own = job.source.resolve()
        imports = self._imports_of(own)
        ported = {found.name: self._ported_name(found) for found in imports if found.file in self.named}
        settings = replace(
            job.settings,
            is_entry=own in self.entries,
            project_trains=own in self.entries and any(map(_trains, self._reached_from(own) - {own})),
            ported_modules=tuple((name, new) for name, new in ported.items() if new is not None),
            unported_modules=tuple(
                dict.fromkeys((found.name, found.shown_file) for found in imports if found.file not in self.named)
            ),
        )
        return replace(job, settings=settings)

    def _ported_name(self, found: ProjectImport) -> str | None:
        """`name` with its last part the port's module name, where the port is beside the original under another."""
        target = self.named[found.file].target
        if target.parent.resolve() != found.file.parent or target.stem == found.file.stem:
            return None
        head, dot, _ = found.name.rpartition(".")
        return head + dot + target.stem

    def _imports_of(self, importer: Path) -> list[ProjectImport]:
        return [found for found in self.imports if found.importer.resolve() == importer]


def _entry_points(named: dict[Path, Job], imports: Sequence[ProjectImport]) -> frozenset[Path]:
    """The named files with a `__main__` guard (as in a folder's port); where none has one, those that no other named
    file imports. The other files are modules of the project."""
    guarded = frozenset(path for path in named if has_main_guard(path))
    if guarded:
        return guarded
    imported = {found.file for found in imports if found.importer.resolve() != found.file}
    return frozenset(path for path in named if path not in imported)


def _project_imports(source: Path, roots: Sequence[Path]) -> Iterator[ProjectImport]:
    try:
        tree = python_tree(read_source(source).text, shown_path(source))
    except (OSError, ValueError, SourceError):
        return  # its port reports why it cannot be read
    for node in _import_statements(tree.body):
        for name in _names(node):
            file = _resolve(source.resolve(), name, roots)
            if file is not None and file != source.resolve():
                yield ProjectImport(source, node.lineno, name, file)


def _import_statements(body: Sequence[ast.AST]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of a block and of the blocks in it: statements only, never their expressions (ast.walk
    would visit every node of the file, several times the parse's cost)."""
    for statement in body:
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            yield statement
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(statement, block, ())
            if isinstance(inner, list):  # a lambda's or an expression's `body` is one node, not a block
                yield from _import_statements(inner)


def _names(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import may load, spelled as rules/imports/_project.py `imported_names` spells them."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    module = "." * node.level + (node.module or "")
    joined = [module + a.name if module.endswith(".") else f"{module}.{a.name}" for a in node.names if a.name != "*"]
    return [module, *joined]


def _resolve(importer: Path, name: str, roots: Sequence[Path]) -> Path | None:
    """The module file (`NAME.py`, not a package's `__init__.py`) that `name` loads in `importer`, if in the project."""
    dots = len(name) - len(name.lstrip("."))
    parts = name[dots:].split(".") if name[dots:] else []
    if not parts:
        return None
    if dots > len(importer.parents):
        return None  # above the file system's root: Python refuses it too
    bases = [importer.parents[dots - 1]] if dots else [importer.parent, *roots]
    for base in dict.fromkeys(bases):
        file = base.joinpath(*parts[:-1], parts[-1] + ".py")
        if file.is_file():
            return file.resolve()
    return None


def _trains(source: Path) -> bool:
    """Whether a project file trains (rules.trains: backward(), an optimizer step, a trainer's fit); an unreadable one
    does not (its own port reports why)."""
    import rules

    try:
        text = read_source(source).text
        return rules.trains(parse(text, shown_path(source)), text)
    except (OSError, SourceError, RecursionError):
        return False
