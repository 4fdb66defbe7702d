"""Every rule's own EXAMPLES, each a test of its own (id CODE-i), collected from the registry."""

import pytest

from migrate.testing import check_example
from rules import all_rules

CASES = [
    pytest.param(rule, example, id=f"{rule.CODE}-{index}")
    for rule in all_rules()
    for index, example in enumerate(rule.EXAMPLES)
]


@pytest.mark.parametrize(("rule", "example"), CASES)
def test_example(rule, example):
    check_example(rule, example)
