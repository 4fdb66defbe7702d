"""Ports a reviewer can read (issue 23): no line migrate adds passes the file's line length, and no call loses its
layout (one argument a line stays one a line, a call over several lines is never joined onto one).

Every sample (both modes, unseeded and seeded) and every rule example goes through migrate.
"""

import dataclasses
import difflib
from collections import Counter

import libcst as cst
import pytest

from migrate import Mode, Settings, migrate_source
from migrate.line_length import configured_line_length
from rules import Case, Safety, all_rules, findall, line_limit, rule_by_code
from rules.framework.layout import one_per_line
from samples_support import all_samples

SAMPLE_SETTINGS = [
    Settings(mode=mode, seed=seed, deterministic=seed is not None) for mode in Mode for seed in (None, 1234)
]
PORTS = [
    *(
        pytest.param(sample.script.read_text(encoding="utf-8"), settings, None, id=f"{sample.name}-{index}")
        for sample in all_samples()
        for index, settings in enumerate(SAMPLE_SETTINGS)
    ),
    *(
        pytest.param(
            example.source,
            dataclasses.replace(example.settings, unsafe_fixes=rule.SAFETY is Safety.UNSAFE),
            rule,
            id=f"{rule.CODE}-{index}",
        )
        for rule in all_rules()
        for index, example in enumerate(rule.EXAMPLES)
        if isinstance(example, Case)
    ),
]


def ported(source: str, settings: Settings, rule) -> str:
    return migrate_source(source, "train.py", settings, rules=None if rule is None else [rule]).code


def added_lines(original: str, port: str) -> list[str]:
    diff = difflib.unified_diff(original.splitlines(), port.splitlines(), lineterm="", n=0)
    return [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]


def call_layouts(code: str) -> Counter:
    """How many calls are laid out one argument a line, and how many span several lines."""
    module = cst.parse_module(code)
    layouts: Counter = Counter()
    for call in findall(module, cst.matchers.Call()):
        if one_per_line(call):
            layouts["one argument a line"] += 1
        if "\n" in module.code_for_node(call):
            layouts["several lines"] += 1
    return layouts


@pytest.mark.parametrize(("source", "settings", "rule"), PORTS)
def test_no_added_line_passes_the_line_length(source, settings, rule):
    limit = line_limit(source)

    too_long = [line for line in added_lines(source, ported(source, settings, rule)) if len(line) > limit]

    assert not too_long, f"added lines longer than {limit} characters:\n" + "\n".join(too_long)


@pytest.mark.parametrize(("source", "settings", "rule"), PORTS)
def test_calls_keep_their_layout(source, settings, rule):
    before, after = call_layouts(source), call_layouts(ported(source, settings, rule))

    assert all(after[layout] >= count for layout, count in before.items()), f"{dict(before)} -> {dict(after)}"


def seeded_loaders(source: str) -> str:
    return migrate_source(source, "train.py", Settings(seed=3), rules=[rule_by_code("DET004")]).code


GENERATOR = "generator=torch.Generator().manual_seed(3)"


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        pytest.param(
            "loader = DataLoader(\n    dataset,\n    batch_size=4,  # small\n)\n",
            f"loader = DataLoader(\n    dataset,\n    batch_size=4,  # small\n    {GENERATOR},\n)\n",
            id="one-a-line-trailing-comma",
        ),
        pytest.param(
            "loader = DataLoader(\n    dataset,\n    batch_size=4  # small\n)\n",
            f"loader = DataLoader(\n    dataset,\n    batch_size=4,  # small\n    {GENERATOR}\n)\n",
            id="one-a-line-comment-stays-with-its-argument",
        ),
        pytest.param(
            "loader = DataLoader(dataset, batch_size=4,\n                    shuffle=True)\n",
            f"loader = DataLoader(dataset, batch_size=4,\n                    shuffle=True, {GENERATOR})\n",
            id="aligned-appended-on-the-last-line",
        ),
        pytest.param(
            "loader = DataLoader(\n        dataset, batch_size=4, shuffle=True, sampler=some_sampler, drop_last=True,\n"
            "        pin_memory=True, persistent_workers=True, prefetch_factor=4, timeout=10)  # a reviewer's width\n",
            "loader = DataLoader(\n        dataset, batch_size=4, shuffle=True, sampler=some_sampler, drop_last=True,\n"
            "        pin_memory=True, persistent_workers=True, prefetch_factor=4, timeout=10,\n"
            f"        {GENERATOR})  # a reviewer's width\n",
            id="hanging-wrapped-as-its-continuation-lines",
        ),
        pytest.param(
            "loader = DataLoader(dataset, batch_size=4, shuffle=True, sampler=some_sampler, drop_last=True)  # width\n",
            "loader = DataLoader(dataset, batch_size=4, shuffle=True, sampler=some_sampler, drop_last=True,\n"
            f"                    {GENERATOR})  # width\n",
            id="one-line-wrapped-aligned",
        ),
        pytest.param(  # aligned under the bracket, the moved argument would pass the width (96): a hanging indent
            "the_training_data_loader_for_this_run = DataLoader(training_dataset, **training_kwargs)  # width\n",
            "the_training_data_loader_for_this_run = DataLoader(\n    training_dataset, **training_kwargs,\n"
            f"    {GENERATOR})  # width\n",
            id="one-line-wrapped-hanging-where-aligned-passes",
        ),
    ],
)
def test_an_added_argument_follows_the_call_layout(call, expected):
    source = "from torch.utils.data import DataLoader\n" + call

    assert seeded_loaders(source) == "from torch.utils.data import DataLoader\nimport torch\n\n" + expected


def test_a_statement_moved_into_a_new_block_is_wrapped_where_its_new_indentation_passes_the_limit():
    long_call = "model(images, targets, attention_mask, position_ids, token_type_ids, head_mask)"
    source = (
        "import torch\n\nfor images, targets in loader:\n    optimizer.zero_grad()\n"
        f"    loss = {long_call}\n"  # 84 characters: the file's width; 88 in the autocast block
        "    loss.backward()\n    optimizer.step()\n"
    )

    port = migrate_source(source, "train.py", Settings(), rules=[rule_by_code("AMP101")]).code

    assert max(map(len, added_lines(source, port))) <= line_limit(source)
    assert "        loss = model(images, targets, attention_mask, position_ids, token_type_ids,\n" in port


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("pyproject.toml", "[tool.ruff]\nline-length = 99\n"),
        ("pyproject.toml", "[tool.black]\nline-length = 99\n"),
        ("setup.cfg", "[flake8]\nmax-line-length = 99\n"),
        (".flake8", "[flake8]\nmax-line-length = 99\n"),
    ],
)
def test_the_line_length_is_the_project_configured_one(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    script = tmp_path / "src" / "pkg" / "train.py"
    script.write_text("import torch\n")

    assert configured_line_length(script) == 99


def test_the_line_length_is_looked_up_no_higher_than_the_project_root(tmp_path):
    (tmp_path / "setup.cfg").write_text("[flake8]\nmax-line-length = 99\n")
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    script = tmp_path / "project" / "train.py"
    script.write_text("import torch\n")

    assert configured_line_length(script) is None


def test_without_a_configured_line_length_the_file_longest_line_is_the_limit():
    assert line_limit("x = 1\n" + "y" * 90 + "\n") == 90
    assert line_limit("x = 1\n") == 120  # shorter than PEP 8's 79: says nothing of its width
    assert line_limit("x = 1\n" + "y" * 90 + "\n", configured=100) == 100


def test_a_comment_a_rule_wrote_goes_above_its_statement_where_the_line_would_pass_the_limit():
    source = (
        "import torch\n\n\ndef main(epochs):\n"
        "    for epoch in range(epochs):  # one pass over the training set, then the validation set\n"  # 90: the width
        "        train(epoch)\n"
    )

    port = migrate_source(source, "train.py", Settings(deterministic=True), rules=[rule_by_code("DET003")]).code

    assert "    # cost: slower kernels; ops lacking one raise\n    torch.use_deterministic_algorithms(True)\n" in port
    assert "    for epoch in range(epochs):  # one pass over the training set, then the validation set\n" in port
    assert max(map(len, added_lines(source, port))) <= line_limit(source)
