"""The engine's cheap walk and name resolution agree with libcst's own, on every rule example and sample."""

import gc
import io
import tokenize
from pathlib import Path

import libcst as cst
import libcst.matchers as m
import pytest
from libcst._nodes.base import CSTCodegenError
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider

from migrate.engine import _add_imports, migrate_source
from rules import all_rules
from rules.amp._loss_scaling import _without_comments_and_strings as without_comments_and_strings
from rules import Walk, findall, matches
from rules.framework.names import QualifiedNames
from rules.framework.positions import Positions, excerpt
from rules.framework.tree import preorder

ROOT = Path(__file__).resolve().parent.parent

SCOPES = '''
import torch
import torch.cuda as tc
import torch.nn.functional as F
from torch.cuda import amp as cuda_amp, is_available
from . import sibling
from .pkg import thing as other
import os.path
x = torch.cuda.is_available()
def f(torch, y=tc.current_device(), *args, **kw) -> tc.Stream:
    global G
    G = 1
    z = torch.cuda.foo()
    lam = lambda tc: tc.bar()
    return [tc.baz(i) for i in range(3) if is_available()]
@tc.decorate
class C(torch.nn.Module, metaclass=type):
    tc = 1
    def m(self):
        return tc.x(), self.y.cuda(), print(len([]))
    q = tc
for a, (b, *c) in enumerate([]):
    a.cuda(); b.x
with torch.no_grad() as ng, open("f") as fh:
    ng.y
try:
    pass
except Exception as err:
    err.args
if (w := torch.randn(1)).is_cuda:
    w.cuda()
def g():
    import torch_npu as tn
    shared = 1
    def h():
        nonlocal shared
        shared = tn.npu
    return {k: v for k, v in os.path.__dict__.items()}
match x:
    case {"a": tc, **rest}:
        tc.y(rest)
    case [torch, *others] if others:
        torch.z
'''


def corpus() -> list:
    sources = {"scopes": SCOPES}
    for rule in all_rules():
        for index, example in enumerate(rule.EXAMPLES):
            sources[f"{rule.CODE}-{index}"] = example.source
    for sample in sorted(ROOT.glob("samples/*/*.py")):
        sources[str(sample.relative_to(ROOT))] = sample.read_text(encoding="utf-8")
    return [pytest.param(source, id=name) for name, source in sources.items()]


class _Everything(cst.CSTVisitor):
    def __init__(self):
        self.nodes: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.nodes.append(node)
        return True


@pytest.mark.parametrize("source", corpus())
def test_qualified_names_equal_libcst(source: str):
    module = cst.parse_module(source)
    theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(QualifiedNameProvider)
    ours = QualifiedNames(module)
    everything = _Everything()
    module.visit(everything)
    for node in everything.nodes:
        expected = theirs.get(node, set())
        expected = expected() if callable(expected) else expected  # libcst stores lazy values
        assert {q.name for q in ours.get(node, set())} == {q.name for q in expected}, module.code_for_node(node)
        last_parts = frozenset(q.name.rpartition(".")[2] for q in expected)
        assert not last_parts or ours.may_end_with(node, last_parts), module.code_for_node(node)
        first_parts = frozenset(q.name.partition(".")[0] for q in expected)
        assert not first_parts or ours.may_start_with(node, first_parts), module.code_for_node(node)


@pytest.mark.parametrize("source", corpus() + [pytest.param("x = 1\r\nif x:\r\n\ty = (1,\r\n  2)\r\n", id="crlf-tabs")])
def test_positions_equal_libcst(source: str):
    module = cst.parse_module(source)
    theirs = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    ours = Positions(module)
    assert len(ours) == len(theirs)
    for node, expected in theirs.items():
        assert ours[node] == expected, module.code_for_node(node)
    one_statement_at_a_time = Positions(module)  # as rules ask: a node, then another, never the whole module first
    for node in reversed(list(preorder(module))):
        assert one_statement_at_a_time[node] == theirs[node], module.code_for_node(node)


@pytest.mark.parametrize("source", corpus()[::7] + ["x = 1", "", "# only a comment\n", "import os\n\n# end\n"])
def test_ported_code_reuses_the_statements_it_shares(source: str):
    """The ported module's code, built from the kept text of each statement no rule changed, is its whole code."""
    module = cst.parse_module(source)
    positions = Positions(module)
    if module.body:
        positions[module.body[-1]]  # lays the statements out
    changed = module.with_changes(body=[cst.parse_statement("import torch_npu\n"), *module.body[1:]])
    assert positions.code(module) == module.code
    assert positions.code(changed) == changed.code


class _Recorder(cst.CSTTransformer):
    """Records every call, and rewrites a little: removes `pass` lines, splits `x = y = 1`, renames `cuda`."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.calls.append(("visit", type(node).__name__))
        return not isinstance(node, cst.Lambda)  # a subtree skipped on purpose

    def on_leave(self, original_node, updated_node):
        self.calls.append(("leave", type(original_node).__name__))
        if isinstance(updated_node, cst.SimpleStatementLine) and m_is_pass(updated_node):
            return cst.RemoveFromParent()
        if isinstance(updated_node, cst.Assign) and len(updated_node.targets) == 2:
            return cst.FlattenSentinel([updated_node.with_changes(targets=[t]) for t in updated_node.targets])
        if isinstance(updated_node, cst.Name) and updated_node.value == "cuda":
            return updated_node.with_changes(value="npu")
        if isinstance(updated_node, cst.Arg) and m_is_default(updated_node):
            return cst.RemoveFromParent()
        return updated_node


def m_is_pass(line: cst.SimpleStatementLine) -> bool:
    return all(isinstance(statement, cst.Pass) for statement in line.body)


def m_is_default(arg: cst.Arg) -> bool:
    return isinstance(arg.value, cst.Name) and arg.value.value == "DEFAULT"


WALKED = '''
import torch  # keep
def f(a, b=lambda cuda: cuda, *, c: "torch.cuda" = None):
    pass
    x.cuda(DEFAULT, 1)
    if a:
        pass
    u = v = torch.cuda.device_count()
@decorator(cuda)
class K(Base):
    def m(self): pass
'''


def test_walk_calls_rules_in_libcst_order_and_rewrites_the_same():
    module = cst.parse_module(WALKED)
    theirs, ours = _Recorder(), _Recorder()
    expected = module.visit(theirs)
    got = Walk(ours.on_visit, ours.on_leave, wants=lambda _: True).run(module)
    assert ours.calls == theirs.calls
    assert got.code == expected.code


def test_walk_rebuilds_only_what_changed():
    module = cst.parse_module("import torch\nx = 1\ny = torch.cuda\n")
    recorder = _Recorder()
    got = Walk(recorder.on_visit, recorder.on_leave, wants=lambda _: True).run(module)
    assert got.code == "import torch\nx = 1\ny = torch.npu\n"
    assert got.body[0] is module.body[0] and got.body[1] is module.body[1]
    assert got.body[2] is not module.body[2]


MATCHERS = [
    m.Call(),
    m.Import() | m.ImportFrom(),
    m.Call(func=m.Attribute(attr=m.Name("cuda"))),
    m.Name(),
    m.SimpleString(),
    m.Comment(),
    m.MatchIfTrue(lambda node: isinstance(node, cst.Attribute)),
    m.AssignTarget() | m.AugAssign() | m.AnnAssign(),
]


# Indexed ids: a repr holds a lambda's address, which differs between pytest-xdist workers and breaks collection.
@pytest.mark.parametrize("matcher", MATCHERS, ids=[f"matcher{i}" for i in range(len(MATCHERS))])
def test_findall_finds_what_libcst_finds(matcher):
    for param in corpus():
        module = cst.parse_module(param.values[0])
        assert findall(module, matcher) == m.findall(module, matcher)


HEADS = [
    '"""Doc."""\nimport os\nfrom torch.cuda import amp\n\n# a comment\ndef main():\n    pass\n',
    "from __future__ import annotations\n__strict__ = True\nimport torch\nx = 1\n",
    "x = 1\nimport torch\n",
    '"""Only a docstring."""\n',
    "import torch\nfrom torch_npu.contrib import other\n",
    "import os\n# a comment right above\ndef f():\n    pass\n",
    "import os\ndef f():\n    pass\n",
    "import os\n",
    "from os import sep\nx = 1\n",
]


@pytest.mark.parametrize("source", corpus()[::5] + HEADS)
def test_imports_added_to_the_head_as_to_the_whole_module(source: str):
    """The engine runs AddImportsVisitor on the module's head only: the result is the whole module's."""
    module = cst.parse_module(source)
    results = []
    for add in (AddImportsVisitor(_context()).transform_module, lambda tree: _add_imports(_context(), tree)):
        results.append(add(module).code)
    assert results[0] == results[1]


def _context() -> CodemodContext:
    context = CodemodContext()
    wanted = [("torch_npu", None), ("torch_npu.contrib", "transfer_to_npu"), ("torch", None), ("os", "path")]
    for module, name in wanted:
        AddImportsVisitor.add_needed_import(context, module, name)
    return context


MATCHERS = [
    m.Call(),
    m.Call(func=m.Name() | m.Attribute()),
    m.Call(func=m.Attribute(attr=m.Name("cuda"))),
    m.Attribute(value=m.Name("torch"), attr=m.Name("cuda") | m.Name("device")),
    m.Name("torch") | m.Attribute(attr=m.Name("to")),
    m.Arg(keyword=m.Name("device"), value=m.SimpleString()),
    m.Arg(keyword=None),
    m.Call(args=[m.Arg(), m.ZeroOrMore()]),
    m.Call(args=m.MatchIfTrue(lambda args: len(args) == 2)),
    m.Call(func=m.Attribute(attr=m.Name("double")), args=[]),
    m.ClassDef(bases=()),
    m.Name(value=m.MatchIfTrue(lambda value: value.startswith("c"))),
    m.SimpleStatementLine(body=[m.Expr(value=m.Call())]),
    m.Assign(value=m.Call(func=m.Attribute(value=m.Name("nn")))),
    m.AllOf(m.Call(), m.Call(func=m.Name())),
    m.Param(star=""),
    m.DoesNotMatch(m.Name("torch")),
    m.Call(func=m.SaveMatchedNode(m.Name(), "f")),
]


@pytest.mark.parametrize("source", corpus()[::3])
def test_compiled_matchers_agree_with_libcst(source: str):
    """rules.tree compiles the matchers rules test thousands of nodes with; libcst's answer is the reference."""
    module = cst.parse_module(source)
    everything = _Everything()
    module.visit(everything)
    for matcher in MATCHERS:
        for node in everything.nodes:
            assert matches(node, matcher) == m.matches(node, matcher), (matcher, module.code_for_node(node))


@pytest.mark.parametrize("source", corpus()[::4])
def test_excerpts_are_the_clipped_code(source: str):
    """Findings quote a node through `excerpt`, which stops generating code past the limit: same text."""
    module = cst.parse_module(source)
    for node in preorder(module):
        try:
            code = module.code_for_node(node).strip()
        except CSTCodegenError:  # a node that has no code of its own (a Param's default without its `=`)
            continue
        for limit in (20, 200):
            expected = code if len(code) <= limit else code[: limit - 1] + "…"
            assert excerpt(module, node, limit) == expected


TRICKY_STRINGS = '''x = f"a{b}" + rb'\\'' + """doc ' # not a comment
" still"""  # a comment with "quotes" and 'apostrophes'
y = 'it''s' or"z"  # if"float16"
z = "a\\
b" + r"\\" + u''
'''


@pytest.mark.parametrize("source", corpus() + [pytest.param(TRICKY_STRINGS, id="tricky-strings")])
def test_comments_and_strings_are_blanked_as_tokenize_finds_them(source: str):
    """The loss-scaling rules look for precision markers in code only: a regular expression finds the comments and
    strings, as the tokenizer would, at a tenth of its cost."""
    expected = [list(line) for line in source.splitlines(keepends=True)]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            (start_row, start_column), (end_row, end_column) = token.start, token.end
            for row in range(start_row, end_row + 1):
                line = expected[row - 1]
                first = start_column if row == start_row else 0
                last = end_column if row == end_row else len(line)
                line[first:last] = " " * (last - first)
    assert without_comments_and_strings(source) == "".join("".join(line) for line in expected)


@pytest.mark.parametrize("sample", sorted(ROOT.glob("samples/*/*_gpu.py")), ids=lambda path: path.parent.name)
def test_a_port_leaves_its_trees_to_reference_counting(sample: Path):
    """A tree held by a reference cycle (libcst's scopes, a rule's bound method in its own state) stays alive until a
    collection walks all of it: a tenth of a second of a long script's port, after the port is done."""
    gc.collect()
    gc.disable()
    try:
        migrate_source(sample.read_text(encoding="utf-8"), str(sample))
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        nodes = [type(o).__name__ for o in gc.garbage if isinstance(o, cst.CSTNode)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not nodes
