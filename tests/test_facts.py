"""The checklist facts are what a plain walk of every node finds, though migrate/facts.py walks only the statements that
name what it reads, and reads a port from the original's facts where the port has the original's lines."""

import ast
from pathlib import Path

import pytest

from migrate import facts
from migrate.facts import (
    _CALL_KINDS, _DERIVED_KINDS, FileFacts, SourceFacts, file_facts, framework_precision, source_facts,
)
from migrate.hyperparams import SourceText, dotted, extract
from rules import Case, all_rules
from verify.frameworks import run_time_switch

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def _walked(code: str) -> SourceFacts:
    """The facts by ast.walk over every node: what migrate/facts.py read before it skipped any."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return SourceFacts(readable=False)
    text = SourceText(code)
    found: dict[str, set[int]] = {name: set() for name in (*_CALL_KINDS, *_DERIVED_KINDS)}
    found |= {"npu_import": set(), "torch_import": set()}
    switch_on: set[tuple[int, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            if "torch_npu" in text(node):
                found["npu_import"].add(node.lineno)
            if "torch" in _roots(node):
                found["torch_import"].add(node.lineno)
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        for kind, names in _CALL_KINDS.items():
            if last in names and (last != "initialize" or "amp" in name):
                found[kind].add(node.lineno)
        if last == "autocast" and "bfloat16" in text(node):
            found["autocast_bf16"].add(node.lineno)
        if last == "backward" and name.endswith("scale.backward"):
            found["scaled_backward"].add(node.lineno)
        for kind in framework_precision(node, last, text):
            found[kind].add(node.lineno)
            if kind in ("framework_amp_option", "framework_fp32"):
                literals = [arg.value for arg in node.args if isinstance(arg, ast.Constant)]
                switch_on.add((node.lineno, run_time_switch(last, literals, text(node))))
    lines = {name: tuple(sorted(numbers)) for name, numbers in found.items()}
    return SourceFacts(**lines, hyperparameters=tuple(extract(tree, text)),  # extract walks every node itself
                       framework_amp_switch_on=tuple(sorted(switch_on)))


def _roots(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name.split(".")[0] for alias in node.names}
    return {node.module.split(".")[0]} if node.module and not node.level else set()


def _assert_as_walked(original: str, ported: str) -> None:
    assert source_facts(original) == _walked(original)
    assert file_facts(original, ported, ["X1"]) == FileFacts(_walked(original), _walked(ported), ("X1",))


SAMPLE_PORTS = [
    pytest.param(folder / "train_gpu.py", port, id=f"{folder.name}-{port.stem}")
    for folder in sorted(path.parent for path in SAMPLES.glob("*/train_gpu.py"))
    for port in sorted(folder.glob("expected_*.py"))
]


@pytest.mark.parametrize(("original", "port"), SAMPLE_PORTS)
def test_a_sample_and_its_port_have_the_facts_of_a_full_walk(original, port):
    _assert_as_walked(original.read_text(), port.read_text())


def test_every_sample_file_is_covered():
    # train_gpu_npu.py is what the README's sample command writes beside its sample (ignored by git): a new user runs
    # that command, then the tests, in the same checkout
    bundled = {path for path in SAMPLES.glob("*/*.py") if path.name != "train_gpu_npu.py"}
    assert {path for case in SAMPLE_PORTS for path in case.values} == bundled


EXAMPLES = [
    pytest.param(
        example.source, example.expected if isinstance(example, Case) else example.source, id=f"{rule.CODE}-{i}"
    )
    for rule in all_rules()
    for i, example in enumerate(rule.EXAMPLES)
]


@pytest.mark.parametrize(("original", "port"), EXAMPLES)
def test_a_rule_example_and_its_port_have_the_facts_of_a_full_walk(original, port):
    _assert_as_walked(original, port)


ORIGINAL = '''"""A trainer with something of every fact."""
import argparse
import torch
from torch.cuda.amp import GradScaler, autocast

learning_rate = 6e-4
config = {"lr": 0.1, "batch_size": 32}
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", default=10, type=int)
parser.add_argument("--seed", default=0, type=int)


@autocast()
def forward(model, batch):
    return model(batch)


def main():
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.distributed.init_process_group("nccl")
    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9) if args.sgd else torch.optim.AdamW(
        model.parameters(), lr=3e-4
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1)
    scaler = GradScaler()
    for batch in torch.utils.data.DataLoader(range(8), batch_size=4):
        with autocast(dtype=torch.bfloat16):
            loss = forward(model, batch)
        scaler.scale(loss).backward()
        if args.epochs != 0:
            scheduler.step()


a = dict(lr=1); b = dict(lr=2)
if __name__ == "__main__":
    main()
'''

CONFIG = 'config = {"lr": 0.1, "batch_size": 32}\n'


def _edited(*replacements: tuple[str, str]) -> str:
    ported = ORIGINAL
    for old, new in replacements:
        assert old in ported
        ported = ported.replace(old, new, 1)
    return ported


# Ports that differ from the original in what a shortcut could get wrong: each is read as a parse of the whole would.
EDITS = {
    "a changed line": _edited(('"nccl"', '"hccl"')),
    "an import added": _edited(("import torch\n", "import torch\nimport torch_npu\n")),
    "a block moved": _edited((CONFIG, ""), ("\n\n@autocast()", f"\n{CONFIG}\n\n@autocast()")),
    "an unclosed string": _edited(("parser = argparse", '"""\nparser = argparse')),
    "an else after a kept block": _edited(("a = dict(", "else:\n    pass\na = dict(")),
    "an indented line at the top": _edited(("learning_rate = 6e-4\n", "learning_rate = 6e-4\n    x = 1\n")),
    "a decorator over a kept def": _edited(("\ndef main", "\n@torch.no_grad()\ndef main")),
    "a backslash into a kept line": _edited(("learning_rate = 6e-4\n", "x = 1 + \\\n")),
    "an open bracket": _edited(("learning_rate = 6e-4\n", "x = (\n")),
    "a form feed": _edited(("learning_rate = 6e-4\n", "\flearning_rate = 6e-4\n")),
    "a lone carriage return": _edited(("learning_rate = 6e-4\n", "learning_rate = 6e-4\r")),
    "a name beyond ASCII": _edited(("torch.manual_seed(args.seed)", "torch.ｍａｎｕａｌ_ｓｅｅｄ(0)")),
    "ties on one line": _edited(("a = dict(lr=1); b = dict(lr=2)", "a = dict(lr=2); b = dict(lr=1); c = dict(lr=3)")),
}
PAIRS = [(ORIGINAL, ported, name) for name, ported in EDITS.items()] + [
    # A statement that starts a line yet goes on from the line before, or sits in a decorator's brackets: no cut there.
    ("x = 1; \\\ny = dict(lr=2)\n", "x = 1; \\\ndef f():\n    pass\n", "a backslash in the original"),
    (
        "x = 1\n@(\nautocast)\ndef f():\n    pass\n",
        "x = 1\n@(\nimport torch_npu\nautocast)\ndef f():\n    pass\n",
        "a decorator's brackets",
    ),
]


@pytest.mark.parametrize(("original", "ported"), [pair[:2] for pair in PAIRS], ids=[pair[2] for pair in PAIRS])
def test_an_edited_port_has_the_facts_of_a_full_walk(original, ported):
    _assert_as_walked(original, ported)


def test_a_port_is_parsed_again_only_where_it_differs(monkeypatch):
    """The facts cost mostly parsing: a port that changed one line parses little more than that line again."""
    parsed: list[str] = []
    parse = facts._parsed

    def recorded(code: str) -> ast.Module | None:
        parsed.append(code)
        return parse(code)

    monkeypatch.setattr(facts, "_parsed", recorded)
    ported = _edited(("learning_rate = 6e-4", "learning_rate = 3e-4"))
    assert file_facts(ORIGINAL, ported).ported == _walked(ported)
    assert parsed[0] == ORIGINAL and parsed[1:] == ["learning_rate = 3e-4\n"]
