from __future__ import annotations

from enum import Enum

import libcst as cst
from libcst.helpers import get_full_name_for_node
import libcst.matchers as m
from libcst.metadata import Assignment, QualifiedNameProvider

from rules import Case, Flag, Mode, PortRule, Severity, Unchanged, findall
from rules.device._device_option import NPU_DEVICE, DeviceOptions, strings
from rules.device._rewrite import is_device_name, retarget

_EQUALITY = (cst.Equal, cst.NotEqual, cst.In, cst.NotIn)
_COMPARING = m.Comparison() | m.Call(func=m.Attribute(attr=m.Name("startswith")))
# Receivers whose `.device` is a setting the script chose, not a tensor's device.
_SETTINGS = frozenset({"self", "args", "opt", "opts", "config", "cfg", "conf", "hparams", "flags", "params", "options"})


class _Origin(Enum):
    TENSOR = "the device of a tensor or model"  # torch reports "npu" for it on an NPU, whatever the mode
    SETTING = "a device setting of the script"  # "cuda" still, under transfer_to_npu; "npu" once ported
    DEVICE = "a device"  # named like one, but which of the two kinds is unknown


class CudaDeviceComparison(PortRule):
    """Compare with `"npu"` where the script compares a device with `"cuda"`.

    ## What it does
    Rewrites the `"cuda"` literal (`"cuda:N"`, or in a tuple) in `==`, `!=`, `in`, `not in` and `.startswith(...)`
    when the other side is clearly a device: the device of a tensor or model (`x.device.type == "cuda"`,
    `"cuda" in str(batch.device)`), or, in explicit mode, a device setting of the script (`args.device == "cuda"`,
    a variable or parameter whose values are `torch.device(...)`, device strings or `args.device`), or a variable
    named like a device whose values cannot be traced (explicit mode; reported in transfer mode, where it matters
    which kind it is). In transfer mode, where the port defaults the script's device option to "npu" (DEV020), a
    setting or untraced device is compared with both: `device.type in ("cuda", "npu")`. A test of an `if`/`elif`
    chain that also compares with "npu" is left as it is: the script handles both. Other comparisons with "cuda"
    are reported.

    ## Why
    `transfer_to_npu` translates device arguments, not comparisons: on an NPU `x.device.type` is "npu", so a
    `== "cuda"` check silently takes the other branch. Under transfer mode the script's own settings keep saying
    "cuda", so their comparisons stay, unless the port defaults the device option to "npu": then a CUDA-only
    branch, such as timm's `if device.type in ('cuda',) and amp_dtype == torch.float16:` that makes its loss scaler,
    would silently be skipped, so it takes "npu" too. In explicit mode those settings become "npu" (DEV004) and so
    must the checks.

    ## Safety
    Safe: the literal changes only where the other side is known to be a device; anything else is reported. A
    comparison that takes "npu" beside "cuda" still takes "cuda", so `--device cuda` runs as before.

    ## References
    torch_npu/contrib/transfer_to_npu.py (`_wrapper_cuda` translates device strings in call arguments, never in
    comparisons).
    """

    CODE = "DEV006"
    CHECKLIST = ("C3",)
    TRIGGERS = ("cuda",)
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)
    EXAMPLES = (
        Case(
            """
            if x.device.type == "cuda":  # fast path
                torch.cuda.synchronize()
            on_gpu = "cuda" in str(batch.device)
            same = str(out.device).startswith("cuda")
            kind = model.device.type in ("cuda", "xpu")
            """,
            """
            if x.device.type == "npu":  # fast path
                torch.cuda.synchronize()
            on_gpu = "npu" in str(batch.device)
            same = str(out.device).startswith("npu")
            kind = model.device.type in ("npu", "xpu")
            """,
            lines=[1, 3, 4, 5],
        ),
        Case(
            """
            import torch
            device = torch.device(args.device)
            use_amp = args.device == "cuda"
            if device.type != "cuda:0":
                pass

            def run(dev="cuda"):
                return dev in ("cuda", "mps")
            """,
            """
            import torch
            device = torch.device(args.device)
            use_amp = args.device == "npu"
            if device.type != "npu:0":
                pass

            def run(dev="cuda"):
                return dev in ("npu", "mps")
            """,
            lines=[3, 4, 8],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import torch
            device = torch.device(args.device)
            use_amp = args.device == "cuda"
            if device.type == "cuda":
                pass
            """
        ),
        Flag(
            """
            def step(dev, name):
                if dev == "cuda":
                    pass
                return name.startswith("cuda")
            """,
            lines=[2, 4],
        ),
        Case(
            """
            parser.add_argument("--device", default="cuda")
            device = init_distributed_device(parser.parse_args())
            if device.type in ('cuda',) and amp_dtype == torch.float16:
                loss_scaler = NativeScaler(device=device.type)
            pin = device.type == "cuda"
            if device.type == "cuda":
                torch.cuda.synchronize()
            elif device.type == "npu":
                torch.npu.synchronize()
            """,
            """
            parser.add_argument("--device", default="cuda")
            device = init_distributed_device(parser.parse_args())
            if device.type in ('cuda', 'npu') and amp_dtype == torch.float16:
                loss_scaler = NativeScaler(device=device.type)
            pin = device.type in ("cuda", "npu")
            if device.type == "cuda":
                torch.cuda.synchronize()
            elif device.type == "npu":
                torch.npu.synchronize()
            """,
            lines=[3, 5],
        ),
        Case(
            """
            def step(dev, name):
                return dev.type == "cuda" or name.startswith("cuda")
            """,
            """
            def step(dev, name):
                return dev.type == "npu" or name.startswith("cuda")
            """,
            lines=[2],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            print("cuda" == "cuda")
            if backend == "nccl":
                pass
            label = "running on cuda"
            """
        ),
    )

    def visit_If(self, node: cst.If) -> None:
        chain = [node]
        while isinstance(chain[-1].orelse, cst.If):
            chain.append(chain[-1].orelse)
        tests = [branch.test for branch in chain]
        if any(NPU_DEVICE.match(value) for value in strings(tests)):
            self._with_npu_arm.update(id(found) for test in tests for found in findall(test, _COMPARING))

    def leave_Comparison(self, original_node: cst.Comparison, updated_node: cst.Comparison) -> cst.Comparison:
        if len(original_node.comparisons) != 1 or not isinstance(original_node.comparisons[0].operator, _EQUALITY):
            return updated_node
        target = updated_node.comparisons[0]
        literal_right = retarget(target.comparator)
        if literal_right is not None:
            new = updated_node.with_changes(comparisons=[target.with_changes(comparator=literal_right)])
            return self._port(original_node, updated_node, new, original_node.left)
        literal_left = retarget(updated_node.left)
        if literal_left is not None:
            new = updated_node.with_changes(left=literal_left)
            return self._port(original_node, updated_node, new, original_node.comparisons[0].comparator)
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        func = original_node.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "startswith" or not updated_node.args:
            return updated_node
        prefix = retarget(updated_node.args[0].value)
        if prefix is None:
            return updated_node
        args = [updated_node.args[0].with_changes(value=prefix), *updated_node.args[1:]]
        return self._port(original_node, updated_node, updated_node.with_changes(args=args), func.value)

    def _port(self, original: cst.CSTNode, updated: cst.CSTNode, new: cst.CSTNode, subject: cst.BaseExpression):
        if _is_string(subject):
            return updated  # two literals: nothing runs on a device here
        if id(original) in self._with_npu_arm:
            return updated  # `if dev == "cuda": ... elif dev == "npu": ...`: the script's own NPU branch runs
        origin = self._origin(subject)
        if origin is None:
            self.report(
                original,
                'compares with "cuda", against a value not known to be a device',
                'if it is a device, compare with "npu": torch reports the NPU as "npu"',
                severity=Severity.WARNING,
            )
            return updated
        if self.settings.mode is Mode.TRANSFER and origin is not _Origin.TENSOR:
            both = _with_npu(updated) if self._device_option_says_npu() else None
            if both is not None:
                return self.replace(
                    original,
                    updated,
                    both,
                    f'"npu" beside "cuda" in a comparison with {origin.value}: the port defaults the device option '
                    'to "npu" (DEV020), so a CUDA-only branch would be skipped on the NPU',
                )
            if origin is _Origin.DEVICE:
                self.report(
                    original,
                    'compares a device with "cuda": a tensor\'s device says "npu" under transfer_to_npu, a setting not',
                    'compare with "npu" where the value is the device of a tensor or model',
                )
            return updated
        return self.replace(original, updated, new, f'"cuda" -> "npu" in a comparison with {origin.value}')

    def _origin(self, subject: cst.BaseExpression, depth: int = 0) -> _Origin | None:
        """Where the compared value comes from, when that is clearly a device; None when unknown."""
        if depth > 4:
            return None
        if retarget(subject) is not None or _is_string(subject):
            return _Origin.SETTING
        if isinstance(subject, cst.IfExp):
            branches = {self._origin(subject.body, depth + 1), self._origin(subject.orelse, depth + 1)}
            return branches.pop() if len(branches) == 1 else None
        if isinstance(subject, cst.Call):
            if self.refers_to(subject.func, "torch.device"):
                return _Origin.SETTING
            if isinstance(subject.func, cst.Name) and subject.func.value in ("str", "repr") and subject.args:
                return self._origin(subject.args[0].value, depth + 1)
            return None
        if isinstance(subject, cst.Attribute):
            if subject.attr.value in ("type", "index"):
                return self._origin(subject.value, depth + 1)
            if subject.attr.value == "device":
                receiver = (get_full_name_for_node(subject.value) or "").rpartition(".")[2]
                return _Origin.SETTING if receiver in _SETTINGS else _Origin.TENSOR
            return _Origin.SETTING if is_device_name(subject.attr.value) else None
        if isinstance(subject, cst.Name):
            origin = self._assigned_origin(subject, depth)
            return _Origin.DEVICE if origin is None and is_device_name(subject.value) else origin
        return None

    def _assigned_origin(self, name: cst.Name, depth: int) -> _Origin | None:
        """The common origin of every value assigned to `name` in its scope; None if any is unknown."""
        origins: set[_Origin | None] = set()
        for referent in self.file.qualified_names.referents(name):
            value = self._assigned_value(referent) if isinstance(referent, Assignment) else None
            if value is None:
                return None
            origins.add(self._origin(value, depth + 1))
        return origins.pop() if len(origins) == 1 else None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._values: dict[cst.CSTNode, cst.BaseExpression | None] | None = None  # see _assigned_value
        self._with_npu_arm: set[int] = set()  # ids of the comparisons in if/elif chains that test "npu" too
        self._says_npu: bool | None = None  # see _device_option_says_npu

    def _device_option_says_npu(self) -> bool:
        if self._says_npu is None:
            self._says_npu = DeviceOptions(self.file.wrapper.module).any_defaults_to_npu()
        return self._says_npu

    def _assigned_value(self, assignment: Assignment) -> cst.BaseExpression | None:
        if isinstance(assignment.node, cst.Param):
            return assignment.node.default  # `def f(device="cuda")`: a caller may pass another, of the same kind
        if self._values is None:  # the value of each `target = value` and `target: T = value`, by its target
            statements = findall(self.file.wrapper.module, m.Assign() | m.AnnAssign())
            self._values = {
                target: statement.value
                for statement in statements
                for target in (
                    [assign_target.target for assign_target in statement.targets]
                    if isinstance(statement, cst.Assign)
                    else [statement.target]
                )
            }
        return self._values.get(assignment.node)


def _with_npu(node: cst.CSTNode) -> cst.CSTNode | None:
    """The comparison `node` (`== "cuda"`, `in ("cuda",)`, `.startswith("cuda")`) made to take "npu" as well; None
    where it cannot be (the literal on the left, or "npu" there already)."""
    if isinstance(node, cst.Comparison):
        target = node.comparisons[0]
        values = _with_npu_values(target.comparator)
        if values is None:
            return None
        operator = target.operator
        if isinstance(operator, (cst.Equal, cst.NotEqual)):
            operator = cst.In() if isinstance(operator, cst.Equal) else cst.NotIn()
        return node.with_changes(comparisons=[target.with_changes(operator=operator, comparator=values)])
    values = _with_npu_values(node.args[0].value)  # `.startswith(...)`
    return None if values is None else node.with_changes(args=[node.args[0].with_changes(value=values)])


def _with_npu_values(values: cst.BaseExpression) -> cst.Tuple | None:
    """`"cuda"` as `("cuda", "npu")`, `("cuda", "xpu")` as `("cuda", "xpu", "npu")`; None where "npu" is there."""
    elements = list(values.elements) if isinstance(values, (cst.Tuple, cst.List, cst.Set)) else [cst.Element(values)]
    if any(NPU_DEVICE.match(value) for value in strings([values])):
        return None
    added = [cst.Element(new) for element in elements if (new := retarget(element.value)) is not None]
    if not added:
        return None
    return cst.Tuple([element.with_changes(comma=cst.MaybeSentinel.DEFAULT) for element in [*elements, *added]])


def _is_string(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.IfExp):
        return _is_string(value.body) and _is_string(value.orelse)
    return isinstance(value, (cst.SimpleString, cst.FormattedString))
