"""Checks a rule against its own EXAMPLES (Fixit's VALID/INVALID idea); the test suite runs it for every rule."""

from __future__ import annotations

import dataclasses
import difflib

from migrate.engine import migrate_source
from rules import Action, Case, Example, Flag, PortRule, Safety


class ExampleFailure(AssertionError):
    pass


def check_example(rule: type[PortRule], example: Example) -> None:
    """Raise ExampleFailure unless `rule` does to `example` exactly what the example says."""
    settings = example.settings
    if rule.SAFETY is Safety.UNSAFE and isinstance(example, Case):
        settings = dataclasses.replace(settings, unsafe_fixes=True)
    result = migrate_source(example.source, "example.py", settings, rules=[rule])
    expected = example.expected if isinstance(example, Case) else example.source
    if result.code != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), result.code.splitlines(True), "expected", "got"))
        raise ExampleFailure(f"{rule.CODE}: output differs from the example:\n{diff}")
    lines = sorted({f.line for f in result.findings})
    wanted = _expected_lines(example)
    if wanted is not None and lines != wanted:
        raise ExampleFailure(f"{rule.CODE}: findings on lines {lines}, the example expects {wanted}")
    if isinstance(example, Case):
        again = migrate_source(result.code, "example.py", settings, rules=[rule])
        if again.code != result.code:
            raise ExampleFailure(f"{rule.CODE}: not idempotent, a second run changed:\n{again.code}")
        if any(f.action is Action.CHANGED for f in again.findings):
            raise ExampleFailure(f"{rule.CODE}: a second run recorded changes it did not make")
        if rule.SAFETY is Safety.UNSAFE:
            _check_held_back(rule, example)


def _expected_lines(example: Example) -> list[int] | None:
    if isinstance(example, (Case, Flag)) and example.lines is not None:
        return sorted(set(example.lines))
    if isinstance(example, Case):
        return None
    return []  # Unchanged: nothing at all


def _check_held_back(rule: type[PortRule], example: Case) -> None:
    """Without --unsafe-fixes an unsafe rule must leave the code alone and say what it would do."""
    settings = dataclasses.replace(example.settings, unsafe_fixes=False)
    result = migrate_source(example.source, "example.py", settings, rules=[rule])
    if result.code != example.source:
        raise ExampleFailure(f"{rule.CODE}: an unsafe rule rewrote code without --unsafe-fixes")
    if not any(f.action is Action.PENDING for f in result.findings):
        raise ExampleFailure(f"{rule.CODE}: an unsafe rule held back its fix without reporting it")
