from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from rules import Case, Mode, PortRule, Safety, Unchanged

# Variables that hold a device index in training scripts.
_INDEX_NAMES = frozenset(
    {"local_rank", "rank", "gpu", "gpu_id", "gpu_idx", "gpu_index", "local_gpu", "device_id", "device_idx",
     "device_index", "LOCAL_RANK"}
)


class IntegerDevice(PortRule):
    """Name the `npu` device where `.to(...)` or `device=` get a bare device index.

    ## What it does
    In explicit mode, turns a device index in `.to(0)`, `.to(local_rank)`, `device=0`, `device=args.gpu` into an
    explicit NPU device: `"npu:0"`, `f"npu:{local_rank}"`. An index is an integer literal, `int(...)`, or a variable
    or attribute named like one (`local_rank`, `rank`, `gpu`, `gpu_id`, `device_id` ...).

    ## Why
    A bare index means "cuda:N" to torch before 2.5 and to the eyes of a reader; torch 2.5+ resolves it to the
    current accelerator, so on torch 2.13 with torch_npu it already lands on the NPU. The rewrite makes the device
    explicit and keeps older torch working.

    ## Safety
    Unsafe: whether a variable holds an index is guessed from its name; one holding a `torch.device` or a string
    would be broken by the f-string.

    ## References
    torch_npu/contrib/transfer_to_npu.py (`to`/`to_empty` with int devices);
    <https://github.com/Ascend/pytorch/issues/16>.
    """

    CODE = "DEV005"
    SAFETY = Safety.UNSAFE
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.EXPLICIT})
    TRIGGERS = (".to(", "device=")
    EXAMPLES = (
        Case(
            """
            model = model.to(local_rank)  # this process's card
            x = x.to(0, non_blocking=True)
            y = torch.ones(2, device=args.gpu)
            z = w.to(device=int(os.environ["LOCAL_RANK"]))
            """,
            """
            model = model.to(f"npu:{local_rank}")  # this process's card
            x = x.to("npu:0", non_blocking=True)
            y = torch.ones(2, device=f"npu:{args.gpu}")
            z = w.to(device=f'npu:{int(os.environ["LOCAL_RANK"])}')
            """,
            lines=[1, 2, 3, 4],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            x = x.to(device)
            y = y.to(torch.float16)
            z = torch.zeros(3, device=dev)
            q = q.to(epoch)
            r = torch.device(0)
            """,
            mode=Mode.EXPLICIT,
        ),
        Unchanged("x = x.to(0)\n"),
    )

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._device_args: set[cst.Arg] = set()

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "to":
            positional = [arg for arg in node.args if arg.keyword is None and not arg.star]
            self._device_args.update(positional[:1])
        self._device_args.update(arg for arg in node.args if arg.keyword and arg.keyword.value == "device")

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        if original_node not in self._device_args or not _is_index(original_node.value):
            return updated_node
        value = updated_node.value
        if isinstance(value, cst.Integer):
            device: cst.BaseExpression = cst.SimpleString(f'"npu:{value.value}"')
        else:
            code = cst.Module([]).code_for_node(value)
            quote = next((q for q in ('"', "'") if q not in code), None)
            if quote is None:
                return updated_node  # an f-string cannot hold this expression as it is written
            device = cst.parse_expression(f"f{quote}npu:{{{code}}}{quote}")
        before = cst.Module([]).code_for_node(value)
        return self.replace(
            original_node,
            updated_node,
            updated_node.with_changes(value=device),
            f"device index `{before}` -> `{cst.Module([]).code_for_node(device)}`",
        )


def _is_index(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.Integer):
        return True
    if isinstance(value, cst.Call):
        return isinstance(value.func, cst.Name) and value.func.value == "int"
    name = get_full_name_for_node(value) if isinstance(value, (cst.Name, cst.Attribute)) else None
    return name is not None and name.rpartition(".")[2] in _INDEX_NAMES
