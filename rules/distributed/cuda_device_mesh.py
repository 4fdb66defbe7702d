from __future__ import annotations

import libcst as cst

from rules import Case, Mode, PortRule, Unchanged, argument, replace_argument_value, same_quotes, string_value

_NAMES = (
    "torch.distributed.init_device_mesh",
    "torch.distributed.DeviceMesh",
    "torch.distributed.device_mesh.init_device_mesh",
    "torch.distributed.device_mesh.DeviceMesh",
)


class CudaDeviceMesh(PortRule):
    """Build device meshes on "npu" where the script builds them on "cuda".

    ## What it does
    Explicit mode: the `device_type` of `init_device_mesh(...)` and `DeviceMesh(...)` (first argument or keyword),
    `"cuda"` becomes `"npu"`.

    ## Why
    A mesh of type "cuda" creates its process groups with the cuda default backend (NCCL). `transfer_to_npu` patches
    both functions at run time, so transfer mode needs nothing here.

    ## Safety
    Safe.

    ## References
    torch_npu/contrib/transfer_to_npu.py (init_device_mesh, DeviceMesh.__init__).
    """

    CODE = "DIST006"
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.EXPLICIT})
    TRIGGERS = ("DeviceMesh", "init_device_mesh")
    EXAMPLES = (
        Case(
            """
            from torch.distributed.device_mesh import init_device_mesh, DeviceMesh
            mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))  # 8 ranks
            flat = DeviceMesh(device_type='cuda', mesh=[0, 1])
            """,
            """
            from torch.distributed.device_mesh import init_device_mesh, DeviceMesh
            mesh = init_device_mesh("npu", (2, 4), mesh_dim_names=("dp", "tp"))  # 8 ranks
            flat = DeviceMesh(device_type='npu', mesh=[0, 1])
            """,
            lines=[2, 3],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import torch.distributed as dist
            mesh = dist.init_device_mesh("cuda", (8,))
            """
        ),
        Unchanged(
            """
            import torch.distributed as dist
            mesh = dist.init_device_mesh("cpu", (8,))
            other = dist.init_device_mesh(device_type, (8,))
            """,
            mode=Mode.EXPLICIT,
        ),
    )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self.refers_to(original_node.func, *_NAMES):
            return updated_node
        device = argument(updated_node, 0, "device_type")
        if device is None or string_value(device.value) != "cuda":
            return updated_node  # not "cuda", or already rewritten by a device rule
        new = replace_argument_value(updated_node, device, same_quotes(device.value, "npu"))  # type: ignore[arg-type]
        return self.replace(original_node, updated_node, new, 'device mesh "cuda" -> "npu"')
