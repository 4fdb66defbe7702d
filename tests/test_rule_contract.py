"""Every rule keeps the declaration contract; RULES.md is current; `import rules` is ours."""

import re
from pathlib import Path

import pytest

import rules
from rules import all_rules
from rules import Case, Flag, Safety, Unchanged
from rules.catalog import RULES_MD, render

RULES = [pytest.param(rule, id=rule.CODE) for rule in all_rules()]
SECTIONS = ("## What it does", "## Why", "## Safety")


@pytest.mark.parametrize("rule", RULES)
def test_docstring_has_summary_and_sections(rule):
    doc = rule.__doc__ or ""
    assert rule.summary(), f"{rule.CODE} has no one-line summary"
    assert len(rule.summary()) <= 120, f"{rule.CODE}: the summary should fit on one line"
    for section in SECTIONS:
        assert section in doc, f"{rule.CODE} docstring lacks {section!r}"


@pytest.mark.parametrize("rule", RULES)
def test_examples_cover_what_the_rule_does(rule):
    kinds = {type(example) for example in rule.EXAMPLES}
    assert Unchanged in kinds, f"{rule.CODE} needs at least one Unchanged example"
    if rule.SAFETY is Safety.REPORT:
        assert Flag in kinds and Case not in kinds, f"{rule.CODE} is report-only: Flag examples, no Case"
    else:
        assert Case in kinds, f"{rule.CODE} rewrites code: it needs at least one Case example"


@pytest.mark.parametrize("rule", RULES)
def test_rule_lives_alone_in_a_module_named_after_it(rule):
    module = rule.__module__.rsplit(".", 1)[-1]
    assert module == re.sub(r"(?<!^)(?=[A-Z])", "_", rule.__name__).lower()
    assert not rule.__name__.endswith("Rule"), "no Rule suffix: the class names the pattern found"
    assert all(item in {f"C{i}" for i in range(1, 10)} for item in rule.CHECKLIST)


def test_codes_are_unique():
    codes = [rule.CODE for rule in all_rules()]
    assert len(codes) == len(set(codes))


def test_rules_md_is_current():
    assert RULES_MD.read_text(encoding="utf-8") == render(), "run `python -m rules.catalog` and commit RULES.md"


def test_import_rules_is_this_project():
    assert Path(rules.__file__).resolve().parent == Path(__file__).resolve().parent.parent / "rules"
