"""What every rule is: a libcst transformer that documents, tests and reports itself.

A rule subclasses `PortRule`, declares a stable `CODE`, a `SAFETY`, the checklist items it gives evidence for and
its `EXAMPLES`, and rewrites nodes only through `self.replace(...)` and reports only through `self.report(...)`.
Those two methods are the one place where suppression comments, the unsafe-fix switch and the findings table are
handled, so a rule never deals with them itself.
"""

from __future__ import annotations

import re
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import ClassVar, Iterable, Iterator, Mapping, Sequence

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider, QualifiedNameProvider

from rules.framework.calls import under
from rules.framework.loops import trains
from rules.framework.names import QualifiedNames
from rules.framework.positions import Positions, excerpt
from rules.framework.tree import findall
from rules.framework.types import Action, Finding, Mode, Safety, Settings, Severity

# `# npu-port: ignore` or `# npu-port: ignore[NPU101, DIST001]` on a line silences rules there.
_SUPPRESSION = re.compile(r"#\s*npu-port:\s*ignore(?:\[(?P<codes>[A-Z0-9_,\s]+)\])?")


@dataclass(frozen=True, init=False)
class Example:
    """A source snippet a rule is tested on, with the settings to run it under."""

    source: str
    settings: Settings

    def __init__(self, source: str, **options: object) -> None:
        object.__setattr__(self, "source", _dedent(source))
        object.__setattr__(self, "settings", Settings(**options))  # type: ignore[arg-type]


@dataclass(frozen=True, init=False)
class Case(Example):
    """The rule rewrites `source` into `expected`; `lines` are the 1-based source lines it must report."""

    expected: str
    lines: tuple[int, ...] | None

    def __init__(self, source: str, expected: str, *, lines: Sequence[int] | None = None, **options: object):
        super().__init__(source, **options)
        object.__setattr__(self, "expected", _dedent(expected))
        object.__setattr__(self, "lines", tuple(lines) if lines is not None else None)


@dataclass(frozen=True, init=False)
class Flag(Example):
    """The rule leaves `source` as is but reports a finding on each of `lines`."""

    lines: tuple[int, ...]

    def __init__(self, source: str, *, lines: Sequence[int], **options: object):
        super().__init__(source, **options)
        object.__setattr__(self, "lines", tuple(lines))


@dataclass(frozen=True, init=False)
class Unchanged(Example):
    """The rule neither rewrites nor reports anything in `source`."""


def _dedent(source: str) -> str:
    return textwrap.dedent(source).lstrip("\n")


_IF = m.If()
# An option parsed from the command line, as scripts name the namespace argparse returns
_OPTION = m.Attribute(value=m.Name("args") | m.Name("opt") | m.Name("opts") | m.Name("options") | m.Name("flags"))


class FileState:
    """What the rules working on one file share: its text, settings, positions, suppressions and findings."""

    def __init__(self, path: str, source: str, settings: Settings, wrapper: MetadataWrapper):
        self.path = path
        self.source = source
        self.settings = settings
        self.wrapper = wrapper
        self.findings: list[Finding] = []
        self.qualified_names = QualifiedNames(wrapper.module)
        self.positions = Positions(wrapper.module)
        self._suppressed = _suppressions(source)

    @cached_property
    def inference(self) -> bool:
        """Whether the file is read as an inference script: an entry script (named on the command line, or with a
        __main__ guard) that never trains (`trains` in rules/framework/loops.py). Training-only rules leave such a
        file alone, and only the random generators it uses are seeded. A project's other modules are never read so,
        whatever they hold: their training loop may be in another file; nor is an entry point that imports a module of
        its project that trains (`Settings.project_trains`)."""
        return (self.settings.is_entry and not self.settings.project_trains
                and not trains(self.wrapper.module, self.source))

    def position(self, node: cst.CSTNode) -> CodeRange:
        return self.positions[node]

    def option_guarding(self, span: CodeRange) -> str:
        """How the command-line option (`args.quantize`) an `if` around `span` tests is named in words, where the code
        there runs only as that option says: `args.quantize: `if args.quantize:``; or, where the `if` tests a
        parameter of its function that a call in the file passes the option (PEFT's olora: `if quantize:` in
        `train(..., quantize=args.quantize)`), `args.quantize: `if quantize:` in train()`; "" where none does."""
        for branch in findall(self.wrapper.module, _IF):
            where = self.position(branch)
            inside = (where.start.line, where.start.column) <= (span.start.line, span.start.column) and (
                (span.end.line, span.end.column) <= (where.end.line, where.end.column))
            test = branch.test  # type: ignore[attr-defined]
            if not inside or span.start.line <= self.position(test).end.line:  # in its body, not its test
                continue
            code = cst.Module([]).code_for_node
            if option := next((code(attribute) for attribute in findall(test, _OPTION)), ""):
                return f"{option}: `if {option}:`"
            if passed := self._option_passed(test, where):
                option, function = passed
                return f"{option}: `if {code(test)}:` in {function}()"
        return ""

    def _option_passed(self, test: cst.CSTNode, where: CodeRange) -> tuple[str, str] | None:
        """(the option, the function) where `test` names a parameter of the function around `where` that a call of
        that function in the file passes a command-line option as (`train(quantize=args.quantize)`)."""
        names = {name.value for name in findall(test, m.Name())}  # type: ignore[attr-defined]
        for function in findall(self.wrapper.module, m.FunctionDef()):
            around = self.position(function)
            if not (around.start.line <= where.start.line and where.end.line <= around.end.line):
                continue
            params = function.params  # type: ignore[attr-defined]
            tested = names & {param.name.value for param in (*params.params, *params.kwonly_params)}
            name = function.name.value  # type: ignore[attr-defined]
            for call in findall(self.wrapper.module, m.Call(func=m.Name(name))):
                for argument in call.args:  # type: ignore[attr-defined]
                    if (argument.keyword is not None and argument.keyword.value in tested
                            and m.matches(argument.value, _OPTION)):
                        return cst.Module([]).code_for_node(argument.value), name
        return None

    def release(self) -> None:
        """The engine, when the file is done: lets the file's trees go as soon as their last reference does."""
        self.qualified_names.release()

    def metadata(self, providers: Iterable[type]) -> dict[type, Mapping[cst.CSTNode, object]]:
        """The metadata a rule declared, each computed when first asked for: most rules on most files never ask."""
        shared = {QualifiedNameProvider: self.qualified_names, PositionProvider: self.positions}
        return {provider: shared.get(provider, _LazyMetadata(self.wrapper, provider)) for provider in providers}

    def is_suppressed(self, code: str, span: CodeRange) -> bool:
        for line in {span.start.line, span.end.line}:
            codes = self._suppressed.get(line)
            if codes is not None and (not codes or code in codes):
                return True
        return False

    def code_for(self, node: cst.CSTNode) -> str:
        return self.wrapper.module.code_for_node(node)


class _LazyMetadata(Mapping[cst.CSTNode, object]):
    """A provider's mapping, resolved on first use (the wrapper caches it, so rules share one resolution)."""

    def __init__(self, wrapper: MetadataWrapper, provider: type):
        self._wrapper = wrapper
        self._provider = provider

    @property
    def _resolved(self) -> Mapping[cst.CSTNode, object]:
        return self._wrapper.resolve(self._provider)

    def __getitem__(self, node: cst.CSTNode) -> object:
        return self._resolved[node]

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return iter(self._resolved)

    def __len__(self) -> int:
        return len(self._resolved)


def _suppressions(source: str) -> dict[int, frozenset[str]]:
    found: dict[int, frozenset[str]] = {}
    if "npu-port" not in source:
        return found
    for number, line in enumerate(source.splitlines(), start=1):
        match = _SUPPRESSION.search(line)
        if match:
            codes = match.group("codes") or ""
            found[number] = frozenset(c.strip() for c in codes.split(",") if c.strip())
    return found


class CheapMatcherScan:
    """Mixin for libcst's matcher-decoratable visitors and transformers: the same decorated methods, found cheaply.

    Each time such an object is made, libcst looks for matcher-decorated methods through `dir(self)`: about 1,600
    names (a visit_ and a leave_ method per node type), 15 ms an object, more than a small script's whole parse. Here
    `dir()` lists only the class attributes that carry attributes of their own, as matcher decorators leave on a
    function, found once per class: libcst's scan then finds exactly what it found before.
    """

    def __dir__(self) -> list[str]:
        cls = type(self)
        names = cls.__dict__.get("_decorated_names")
        if names is None:
            names = [name for name in dir(cls) if _carries_attributes(getattr(cls, name, None))]
            type.__setattr__(cls, "_decorated_names", names)
        return names


def _carries_attributes(member: object) -> bool:
    """Whether `member` holds attributes besides libcst's `_is_no_op` mark, which every stub visit_/leave_ has."""
    attributes = getattr(member, "__dict__", None)
    return bool(attributes) and attributes.keys() != {"_is_no_op"}


class PortRule(CheapMatcherScan, VisitorBasedCodemodCommand):
    """Base of every rule. The class docstring of a subclass is its manual (see tests/test_rule_contract.py)."""

    CODE: ClassVar[str]
    SAFETY: ClassVar[Safety] = Safety.SAFE
    CHECKLIST: ClassVar[tuple[str, ...]] = ()
    MODES: ClassVar[frozenset[Mode]] = frozenset(Mode)
    # The rule runs only on sources that contain one of these strings; empty means always. A cheap text test that
    # spares most files the tree walk of most rules.
    TRIGGERS: ClassVar[tuple[str, ...]] = ()
    EXAMPLES: ClassVar[tuple[Example, ...]] = ()
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self, context: CodemodContext, file: FileState) -> None:
        super().__init__(context)
        self.file = file
        self.settings = file.settings

    # ----- declaration helpers ------------------------------------------------------------------------------

    @classmethod
    def name(cls) -> str:
        return re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()

    @classmethod
    def summary(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    @classmethod
    def wants(cls, source: str, settings: Settings) -> bool:
        """Whether the rule has anything to do in this source under these settings."""
        if settings.mode not in cls.MODES:
            return False
        return not cls.TRIGGERS or any(trigger in source for trigger in cls.TRIGGERS)

    @contextmanager
    def resolve(self, wrapper: MetadataWrapper) -> Iterator[None]:
        """As libcst's, but qualified names and positions come from the file's shared, lazy providers."""
        self.metadata = self.file.metadata(self.get_inherited_dependencies())
        try:
            yield
        finally:
            self.metadata = {}

    def release(self) -> None:
        """The engine, when the file is done: drop all the rule kept of it. A rule's state may hold a bound method
        of its own (StatementEdits' wrappers), a reference cycle that would keep the file's trees alive until a
        collection walks them all."""
        vars(self).clear()

    # ----- name resolution ----------------------------------------------------------------------------------

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        """The fully qualified names `node` may refer to, through any import alias in scope."""
        return set(self.file.qualified_names.texts(node))

    def refers_to(self, node: cst.CSTNode, *names: str) -> bool:
        known = self.file.qualified_names
        if not known.may_end_with(node, _last_parts(names)):
            return False  # most calls, arguments and attributes a rule asks about: no resolution needed
        return not known.texts(node).isdisjoint(names)

    def name_under(self, node: cst.BaseExpression, *prefixes: str) -> str | None:
        """The first qualified name of `node` that is one of the dotted `prefixes` or lies below one, else None
        (`rules.under`); resolved only when a name of `node` could start so."""
        if not self.file.qualified_names.may_start_with(node, _first_parts(prefixes)):
            return None  # most calls a rule asks about
        return under(node, self.qualified_names(node), *prefixes)

    def qualified_name(self, node: cst.CSTNode) -> str | None:
        names = self.qualified_names(node)
        return min(names) if len(names) == 1 else None

    # ----- the only two ways a rule acts --------------------------------------------------------------------

    def replace(
        self,
        original: cst.CSTNode,
        updated: cst.CSTNode,
        new: cst.CSTNode,
        message: str,
        suggestion: str = "",
        *,
        imports: Iterable[tuple[str, str | None]] = (),
        severity: Severity = Severity.INFO,
        at: cst.CSTNode | None = None,
    ) -> cst.CSTNode:
        """Return `new` in place of `updated`, recording the change; keep `updated` where the change is not allowed.

        `imports` are (module, name) pairs the new code needs; they are added only if the change is applied.
        `at` is the node the finding points to when it is not `original` (an insertion into a block, say).
        """
        span = self.file.position(at or original)
        if self.file.is_suppressed(self.CODE, span):
            return updated
        applied = self.SAFETY is Safety.SAFE or (self.SAFETY is Safety.UNSAFE and self.settings.unsafe_fixes)
        action = Action.CHANGED if applied else Action.PENDING
        self._record(at or original, span, message, suggestion, severity, action, None if at else new)
        if not applied:
            return updated
        for module, obj in imports:
            AddImportsVisitor.add_needed_import(self.context, module, obj)
        return new

    def report(
        self,
        node: cst.CSTNode,
        message: str,
        suggestion: str = "",
        severity: Severity = Severity.WARNING,
    ) -> None:
        """Record a finding that needs a person: nothing is rewritten."""
        span = self.file.position(node)
        if not self.file.is_suppressed(self.CODE, span):
            self._record(node, span, message, suggestion, severity, Action.REPORTED, None)

    def _record(
        self,
        node: cst.CSTNode,
        span: CodeRange,
        message: str,
        suggestion: str,
        severity: Severity,
        action: Action,
        new: cst.CSTNode | None,
    ) -> None:
        if severity is Severity.ERROR and (option := self.file.option_guarding(span)):
            # a path the script takes only as an option says (`if args.quantize:`, off by default) is no error of
            # the port's: it warns, naming the option
            severity = Severity.WARNING
            message = f"{message} (it runs only behind the option {option})"
        if action is Action.PENDING:  # the message describes the rewrite; say that it was held back
            message = f"not applied (unsafe fix): {message}"
            suggestion = (suggestion + " " if suggestion else "") + "Unsafe fix: apply it with --unsafe-fixes."
            severity = max(severity, Severity.WARNING, key=_SEVERITY_ORDER.index)
        self.file.findings.append(
            Finding(
                path=self.file.path,
                line=span.start.line,
                column=span.start.column + 1,
                end_line=span.end.line,
                code=self.CODE,
                severity=severity,
                action=action,
                message=message,
                suggestion=suggestion,
                checklist=self.CHECKLIST,
                old_code=excerpt(self.file.wrapper.module, node),
                new_code=excerpt(_EMPTY_MODULE, new) if new is not None else "",
            )
        )

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:  # pragma: no cover - the engine drives rules
        raise NotImplementedError("rules run through migrate.engine, which shares one parse among all of them")


_SEVERITY_ORDER = [Severity.INFO, Severity.WARNING, Severity.ERROR]


@lru_cache(maxsize=1024)
def _last_parts(names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(name.rpartition(".")[2] for name in names)


@lru_cache(maxsize=1024)
def _first_parts(names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(name.partition(".")[0] for name in names)


_EMPTY_MODULE = cst.Module([])  # the layout a rule's new code is shown in


__all__ = [
    "Case",
    "CheapMatcherScan",
    "Example",
    "FileState",
    "Flag",
    "PortRule",
    "Unchanged",
]
