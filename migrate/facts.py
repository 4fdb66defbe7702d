"""Checklist facts: what one source states, read cheaply by name from the original and the ported text (where
autocast, a GradScaler, seeds, torch_npu imports, process groups and hyperparameters are). migrate/checklist.py
judges the items from them.

Cheaply: a real script is a few hundred thousand `ast` nodes, and a look at each of them in Python costs more than
parsing them. The facts walk only the statements that name what they read, somewhere on their lines. And a port
changes a few lines of a file: its facts are the original's where both have the same top-level statements, and only
the rest of it is parsed again.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import json
import re
from collections import deque
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

from migrate import hyperparams
import verify.frameworks as frameworks


@dataclass(frozen=True)
class SourceFacts:
    """What one source states, found by name (cheap, no scope analysis): lines of each kind of call. `readable` is
    False when Python's own parser could not read the source, so every fact is unknown rather than absent."""

    readable: bool = True
    torch_import: tuple[int, ...] = ()
    autocast: tuple[int, ...] = ()
    autocast_bf16: tuple[int, ...] = ()
    grad_scaler: tuple[int, ...] = ()
    scaled_backward: tuple[int, ...] = ()
    npu_import: tuple[int, ...] = ()
    process_group: tuple[int, ...] = ()
    seeds: tuple[int, ...] = ()
    framework_amp: tuple[int, ...] = ()  # a framework's mixed precision switched on (fp16 or bf16)
    framework_bf16: tuple[int, ...] = ()  # of those, bf16
    framework_amp_option: tuple[int, ...] = ()  # a framework's mixed precision chosen at run time
    framework_amp_off: tuple[int, ...] = ()  # a framework's mixed precision that its config file turns off
    framework_fp32: tuple[int, ...] = ()  # a framework's precision switch left out: it trains in fp32
    # of those two, (line, how it is switched on where the script runs: the option, variable or config key)
    framework_amp_switch_on: tuple[tuple[int, str], ...] = ()
    hyperparameters: tuple[hyperparams.Hyperparameter, ...] = ()


@dataclass(frozen=True)
class FileFacts:
    """Facts of the original and of the ported text of one file, and the codes of the rules that looked at it."""

    original: SourceFacts
    ported: SourceFacts
    rules_run: tuple[str, ...] = ()

    @property
    def readable(self) -> bool:
        return self.original.readable and self.ported.readable


_CALL_KINDS = {
    "autocast": ("autocast", "initialize"),  # torch.autocast, torch.amp.autocast, apex amp.initialize
    "grad_scaler": ("GradScaler", "scale_loss"),
    "process_group": ("init_process_group",),
    "seeds": ("manual_seed", "manual_seed_all", "seed", *sorted(frameworks.SEED_EVERYTHING_NAMES)),
}
_BACKWARD = "backward"  # scaler.scale(loss).backward(), whose dotted name ends with scale.backward
# What the facts read: calls, by a name their dotted name holds, and imports, by their keyword. The frameworks'
# mixed precision is read from the calls that build their objects or parse their options (verify/frameworks).
_NAMES_READ = {*chain(*_CALL_KINDS.values()), _BACKWARD, "import", *hyperparams.CALL_NAMES, *frameworks.AMP_NAMES,
               "add_argument"}


def source_facts(code: str) -> SourceFacts:
    """The facts of one source. Read-only, so Python's `ast` (line numbers for free) rather than libcst."""
    tree = _parsed(code)
    return _facts(tree, code) if tree else SourceFacts(readable=False)


def file_facts(original: str, ported: str, rules_run: Iterable[str] = (), folder: Path | None = None) -> FileFacts:
    """The facts of one file; `rules_run` are the codes of the rules that had something to look at in it; config
    files its framework calls name (DeepSpeed's ds_config.json) are read from `folder`, where given."""
    token = _CONFIG_FOLDER.set(folder)
    try:
        return _file_facts(original, ported, rules_run)
    finally:
        _CONFIG_FOLDER.reset(token)


def _file_facts(original: str, ported: str, rules_run: Iterable[str]) -> FileFacts:
    tree = _parsed(original)
    facts = _facts(tree, original) if tree else SourceFacts(readable=False)
    if ported == original:
        return FileFacts(facts, facts, tuple(rules_run))
    ported_facts = tree and _edited_facts(original, tree, facts, ported)
    return FileFacts(facts, ported_facts or source_facts(ported), tuple(rules_run))


def _parsed(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):  # newer syntax than this Python reads: libcst parsed it, the facts stay empty
        return None


def _facts(tree: ast.Module, code: str) -> SourceFacts:
    text = hyperparams.SourceText(code)
    lines: dict[str, set[int]] = {kind: set() for kind in (*_CALL_KINDS, *_DERIVED_KINDS)}
    imports, calls = _named_nodes(tree, _lines_naming(code))
    npu_imports = {node.lineno for node in imports if "torch_npu" in text(node)}
    torch_imports = {node.lineno for node in imports if "torch" in _import_roots(node)}
    switch_on: set[tuple[int, str]] = set()
    for node in calls:
        name = hyperparams.dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        for kind, names in _CALL_KINDS.items():
            if last in names and (last != "initialize" or "amp" in name):
                lines[kind].add(node.lineno)
        if last == "autocast" and "bfloat16" in text(node):
            lines["autocast_bf16"].add(node.lineno)
        if last == _BACKWARD and name.endswith(f"scale.{_BACKWARD}"):
            lines["scaled_backward"].add(node.lineno)
        for kind in framework_precision(node, last, text):
            lines[kind].add(node.lineno)
            if kind in ("framework_amp_option", "framework_fp32"):
                switch_on.add((node.lineno, frameworks.run_time_switch(last, _literals(node), text(node))))
    return SourceFacts(
        **{kind: tuple(sorted(found)) for kind, found in lines.items()},
        framework_amp_switch_on=tuple(sorted(switch_on)),
        npu_import=tuple(sorted(npu_imports)),
        torch_import=tuple(sorted(torch_imports)),
        hyperparameters=tuple(hyperparams.extract(tree, text, calls)),
    )


_DERIVED_KINDS = ("autocast_bf16", "scaled_backward", "framework_amp", "framework_bf16", "framework_amp_option",
                  "framework_amp_off", "framework_fp32")


def framework_precision(call: ast.Call, last: str, text: hyperparams.SourceText) -> list[str]:
    """The framework mixed-precision facts of one call (named `last`): `framework_amp` (and `framework_bf16`) where
    a literal switches it on, `framework_amp_option` where it is chosen at run time (a value computed, an option
    parsed, a launcher's choice where the call leaves the switch out), `framework_fp32` where a call that is the
    framework's own (AmpSwitch.fp32_when_left_out) leaves the switch out, or a literal chooses full precision
    (AmpSwitch.full_precision): L.Trainer(), L.Trainer(precision="32-true"), TrainingArguments() train in fp32."""
    if (parses := frameworks.precision_parser(last)) is not None:
        return ["framework_amp_option"] if parses in text(call) else []
    if last == "add_argument":
        chosen = any(flag in frameworks.PRECISION_OPTIONS for flag in _literals(call))
        return ["framework_amp_option"] if chosen else []
    switch = frameworks.amp_switch(last, text(call))
    if switch is None:
        return []
    given = [keyword for keyword in call.keywords if keyword.arg in switch.keywords]
    if not given:  # accelerate launch --mixed_precision, fabric run --precision
        if switch.launcher_chooses:
            return ["framework_amp_option"]
        return ["framework_fp32"] if switch.fp32_when_left_out(hyperparams.dotted(call.func)) else []
    kinds = []
    for keyword in given:
        # a literal, or a dtype named as torch names it (torch.bfloat16)
        value = keyword.value.value if isinstance(keyword.value, ast.Constant) else hyperparams.dotted(keyword.value)
        if (in_config := _config_precision(switch, value)) is not None:
            kinds += {"": ["framework_amp_off"], frameworks.BF16: ["framework_amp", "framework_bf16"]}.get(
                in_config, ["framework_amp"])
        # a value computed, or a literal that is no precision (DeepSpeed's config: a file not read)
        elif not (isinstance(keyword.value, ast.Constant) or value.startswith("torch.")) or not switch.mixed:
            kinds.append("framework_amp_option")
        elif (dtype := switch.precision(keyword.arg, value)) is not None:
            kinds += ["framework_amp", "framework_bf16"] if dtype == frameworks.BF16 else ["framework_amp"]
        elif switch.chooses_fp32(keyword.arg, value):
            kinds.append("framework_fp32")
    return kinds


# The folder a port's config files are read from (file_facts' `folder`): None, read none
_CONFIG_FOLDER: ContextVar[Path | None] = ContextVar("config_folder", default=None)


def _config_precision(switch: frameworks.AmpSwitch, value: object) -> str | None:
    """The precision a config file named by the literal `value` switches on (DeepSpeed's JSON beside the script:
    FP16, BF16, "" for none), where the switch reads one and the file is there; else None."""
    folder = _CONFIG_FOLDER.get()
    if folder is None or switch.config_precision is None or not isinstance(value, str) or not value.endswith(".json"):
        return None
    try:
        config = json.loads((folder / value).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return switch.config_precision(config) if isinstance(config, dict) else None


def _literals(call: ast.Call) -> list[object]:
    """A call's positional literals: add_argument's option names."""
    return [arg.value for arg in call.args if isinstance(arg, ast.Constant)]


def _import_roots(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name.split(".")[0] for alias in node.names}
    return {node.module.split(".")[0]} if node.module and not node.level else set()


def _fewest(words: set[str]) -> set[str]:
    """The words that hold none of the others: a text that has `manual_seed` has `seed`."""
    return {word for word in words if not any(other != word and other in word for other in words)}


def _one_of(words: Iterable[str]) -> str:
    """A regular expression for any of `words` (none the start of another) that shares their common starts: `re`
    tries the words of a flat alternation one by one at every position."""
    rests: dict[str, list[str]] = {}
    for word in sorted(words):
        rests.setdefault(word[0], []).append(word[1:])
    branches = [re.escape(first) + (_one_of(rest) if rest != [""] else "") for first, rest in rests.items()]
    return branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"


# A statement holds a call or an import the facts read only if one of its lines has one of _NAMES_READ, as text (an
# identifier sits on one line), or a character beyond ASCII (the parser folds an identifier in fullwidth letters, or
# any other compatibility form, to ASCII: NFKC).
_NAMED = re.compile(_one_of(_fewest(_NAMES_READ)))


def _lines_naming(code: str) -> list[int]:
    """The lines, numbered as the parser numbers them, that may name what the facts read."""
    lines = code.replace("\r\n", "\n").replace("\r", "\n").split("\n")  # the parser ends a line at each of them
    return [number for number, line in enumerate(lines, 1) if not line.isascii() or _NAMED.search(line)]


def _named_nodes(tree: ast.Module, named: list[int]) -> tuple[list[ast.stmt], list[ast.Call]]:
    """The imports and the calls, in ast.walk's order, of the statements with one of the `named` lines: each
    statement that holds a call or an import the facts read has its name on one of its lines. Statements only: their
    lines are their first and last tokens', where the positions of an f-string's expressions are worked out after the
    fact before Python 3.12. The walk is ast.walk's, less the other statements and the expression contexts (Load,
    Store), written out: it is much of what the facts cost."""
    imports: list[ast.stmt] = []
    calls: list[ast.Call] = []
    todo: deque[ast.AST] = deque([tree])
    while todo:
        node = todo.popleft()
        if isinstance(node, ast.stmt):
            if not _has_line_between(named, _first_line(node), node.end_lineno or node.lineno):
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.append(node)
        elif isinstance(node, ast.Call):
            calls.append(node)
        for field in node._fields:
            child = getattr(node, field, None)
            if isinstance(child, list):
                todo.extend([item for item in child if isinstance(item, ast.AST)])
            elif isinstance(child, ast.AST) and field != "ctx":
                todo.append(child)
    return imports, calls


def _first_line(statement: ast.stmt) -> int:
    decorators = getattr(statement, "decorator_list", None)  # above a def's or a class's own line
    return decorators[0].lineno if decorators else statement.lineno


def _has_line_between(lines: list[int], first: int, last: int) -> bool:
    at = bisect.bisect_left(lines, first)
    return at < len(lines) and lines[at] <= last


def _edited_facts(original: str, tree: ast.Module, facts: SourceFacts, ported: str) -> SourceFacts | None:
    """The facts of `ported`, an edit of the original (parsed as `tree`, with these `facts`): the original's facts for
    the runs of its top-level statements that the port has verbatim, moved to where the port has them, and the facts of
    the port's other lines, parsed on their own. None where that might not read what a parse of the whole port reads.

    Exact: a run starts and ends, in either file, where the tokenizer starts afresh (a logical line in column 0), so
    the port parses as the statements of its pieces: other lines that parse on their own start in column 0, leave no
    bracket, string or backslash open for the next piece, and end with no decorator or block that it could go on with
    (`else:` alone does not parse). Every node of a statement is on the statement's lines, so a run's facts are the
    original's on its lines."""
    old, new = _parser_lines(original), _parser_lines(ported)
    if old is None or new is None:
        return None
    pieces, done = [], 0
    for run, at in _runs(_kept(_blocks(tree, old), old, new)):
        if done < at:
            pieces.append(_part(source_facts("".join(new[done:at])), range(at - done), done))
        pieces.append(_part(facts, run, at))
        done = at + len(run)
    if done < len(new):
        pieces.append(_part(source_facts("".join(new[done:])), range(len(new) - done), done))
    return _joined(pieces) if all(piece.readable for piece in pieces) else None


def _parser_lines(code: str) -> list[str] | None:
    r"""The source's lines, or None where one ends otherwise than with \n or \r\n: SourceText numbers lines as
    str.splitlines does, which ends one at a form feed too, where the parser does not."""
    lines = code.splitlines(keepends=True)
    return lines if len(lines) == code.count("\n") + (not code.endswith("\n")) else None


def _blocks(tree: ast.Module, lines: list[str]) -> list[range]:
    """The original's lines (indices of `lines`) cut where the tokenizer starts afresh: where a top-level statement's
    first token (a decorator's @, or the statement's own) is in column 0, so that no earlier statement has a token on
    that line, and no backslash on the line before goes on into it (`a = 1; \\`)."""
    cuts = [0]
    for statement in tree.body:
        first = _first_line(statement)
        if getattr(statement, "decorator_list", None):
            in_column_0 = lines[first - 1].startswith("@")  # the decorator's own line, not a bracket's inside
        else:
            in_column_0 = statement.col_offset == 0
        if first > 1 and in_column_0 and not lines[first - 2].rstrip("\r\n").endswith("\\"):
            cuts.append(first - 1)
    return [range(start, stop) for start, stop in zip(cuts, [*cuts[1:], len(lines)])]


def _kept(blocks: list[range], old: list[str], new: list[str]) -> Iterator[tuple[range, int]]:
    """The blocks of the original that the port has verbatim, each with the index of the port's line it starts at, in
    the port's order: the block after the last one found if it is there, else any that starts with the port's line."""
    starting: dict[str, list[int]] = {}
    for index, block in enumerate(blocks):
        starting.setdefault(old[block.start], []).append(index)
    at, following = 0, 0
    while at < len(new):
        candidates = (following, *starting.get(new[at], ()))
        found = next((i for i in candidates if i < len(blocks) and _has_at(new, at, old, blocks[i])), None)
        if found is None:
            at += 1
            continue
        yield blocks[found], at
        at, following = at + len(blocks[found]), found + 1


def _has_at(new: list[str], at: int, old: list[str], block: range) -> bool:
    # The first line alone first: copying a long function's lines to compare them at every line of a gap adds up.
    return new[at] == old[block.start] and new[at : at + len(block)] == old[block.start : block.stop]


def _runs(kept: Iterable[tuple[range, int]]) -> Iterator[tuple[range, int]]:
    """Kept blocks that follow each other in both files, joined into runs: fewer pieces to move."""
    run, run_at = range(0), 0
    for block, at in kept:
        if run and block.start == run.stop and at == run_at + len(run):
            run = range(run.start, block.stop)
            continue
        if run:
            yield run, run_at
        run, run_at = block, at
    if run:
        yield run, run_at


# The fields of SourceFacts that are line numbers.
_LINED_FIELDS = ("hyperparameters", "framework_amp_switch_on")  # of items each on a line: (line, ...) or .line
_LINE_FIELDS = [
    field.name for field in dataclasses.fields(SourceFacts) if field.name not in ("readable", *_LINED_FIELDS)
]


def _part(facts: SourceFacts, lines: range, to: int) -> SourceFacts:
    """The facts on `lines` (0-based, as the indices of a list of lines), moved to start at index `to`."""
    by = to - lines.start

    def on_lines(numbers: tuple[int, ...]) -> tuple[int, ...]:
        return numbers[bisect.bisect_right(numbers, lines.start) : bisect.bisect_right(numbers, lines.stop)]

    def items_on_lines(items: tuple, line_of) -> tuple:
        return items[bisect.bisect_right(items, lines.start, key=line_of) : bisect.bisect_right(items, lines.stop,
                                                                                               key=line_of)]

    return dataclasses.replace(
        facts,
        **{name: tuple(number + by for number in on_lines(getattr(facts, name))) for name in _LINE_FIELDS},
        hyperparameters=tuple(dataclasses.replace(h, line=h.line + by)
                              for h in items_on_lines(facts.hyperparameters, _line)),
        framework_amp_switch_on=tuple((line + by, how)
                                      for line, how in items_on_lines(facts.framework_amp_switch_on, _first)),
    )


def _line(hyperparameter: hyperparams.Hyperparameter) -> int:
    return hyperparameter.line


def _first(pair: tuple[int, str]) -> int:
    return pair[0]


def _joined(pieces: list[SourceFacts]) -> SourceFacts:
    """One source's facts from its pieces' facts, in line order: each field stays in line order."""
    fields = [*_LINE_FIELDS, *_LINED_FIELDS]
    return SourceFacts(
        **{name: tuple(chain.from_iterable(getattr(piece, name) for piece in pieces)) for name in fields}
    )
