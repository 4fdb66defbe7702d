"""ARCHITECTURE.md stays a map: every module named once in its generated module map, which is current
(`python tests/architecture_map.py` rewrites it), and no line longer than 100 characters."""

from __future__ import annotations

import re
from collections import Counter

import architecture_map
from architecture_map import ARCHITECTURE_MD, BEGIN, END, WIDTH

MAP_ITEM = re.compile(r"^- `([\w/.]+)`: ")


def _map_lines() -> list[str]:
    text = ARCHITECTURE_MD.read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "ARCHITECTURE.md holds the module map's markers once"
    return text[text.index(BEGIN):text.index(END)].splitlines()


def test_every_module_appears_in_the_map_exactly_once():
    named = Counter(match[1] for line in _map_lines() if (match := MAP_ITEM.match(line)))
    on_disk = {path.relative_to(architecture_map.ROOT).as_posix() for package in architecture_map.PACKAGES
               for path in (architecture_map.ROOT / package).rglob("*.py")}
    expected = {path for path in on_disk if not path.startswith(f"{architecture_map.EMULATED}/")}
    expected.add(f"{architecture_map.EMULATED}/")  # the emulations are data: one item
    assert not {path for path, count in named.items() if count > 1}, "named more than once"
    missing, gone = sorted(expected - set(named)), sorted(set(named) - expected)
    assert not missing and not gone, f"run `python tests/architecture_map.py`: missing {missing}, gone {gone}"


def test_every_module_says_what_it_holds():
    undocumented = [path for path in architecture_map.modules() if architecture_map.summary(path) == "NO DOCSTRING"]
    assert not undocumented, f"give each a one-line module docstring: {undocumented}"


def test_the_module_map_is_current():
    text = ARCHITECTURE_MD.read_text(encoding="utf-8")
    assert architecture_map.rewrite(text) == text, "run `python tests/architecture_map.py` and commit ARCHITECTURE.md"


def test_no_line_is_longer_than_100_characters():
    long = [f"line {number}: {len(line)} characters"
            for number, line in enumerate(ARCHITECTURE_MD.read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > WIDTH]
    assert not long, "\n".join(long)
