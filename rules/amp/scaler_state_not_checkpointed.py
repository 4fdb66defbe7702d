from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules.amp._loss_scaling import SavesScalerState, existing_scaler, resume_edits
from rules.amp._step_analysis import code
from rules import Case, PortRule, StatementEdits, Unchanged, findall


class ScalerStateNotCheckpointed(SavesScalerState, StatementEdits, PortRule):
    """Save the GradScaler's state next to the optimizer's in checkpoint dictionaries, and load it back on resume.

    ## What it does
    In a file with one GradScaler (`scaler = ...GradScaler(...)`), a dictionary literal holding
    `optimizer.state_dict()` and nothing of the scaler gets `"scaler": scaler.state_dict()` right after the
    optimizer's entry (`"scaler_state_dict"` when the optimizer's key is `"optimizer_state_dict"`). Only
    dictionaries the scaler's name reaches are changed: anywhere for a module-level scaler, else in the function
    (or class, for `self.scaler`) that creates it. There too, unless the script loads the scaler's state already,
    `optimizer.load_state_dict(checkpoint["optimizer"])` (the key the optimizer is saved under) is followed by
    `if "scaler" in checkpoint: scaler.load_state_dict(checkpoint["scaler"])`.

    ## Why
    A run resumed without the scaler's state restarts at the initial scale of 65536: the first steps overflow and
    are skipped, so a resumed run and an uninterrupted one (or the GPU and NPU sides) no longer take the same steps
    (checklist C4).

    ## Safety
    Safe: it adds one key to what is saved; loading code that reads named keys is unaffected. The scaler is loaded
    back only when the checkpoint has its key, so checkpoints saved before the port still resume.

    ## References
    PyTorch AMP examples "Saving/Resuming"; torch/amp/grad_scaler.py `state_dict`.
    """

    CODE = "AMP104"
    CHECKLIST = ("C4",)
    TRIGGERS = ("GradScaler",)
    EXAMPLES = (
        Case(
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
            """,
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict()}, path)
            """,
            lines=[3],
        ),
        Case(
            """
            from torch.cuda.amp import GradScaler

            class Trainer:
                def __init__(self):
                    self.scaler = GradScaler()

                def save(self):
                    return {
                        "optimizer_state_dict": self.optimizer.state_dict(),
                    }
            """,
            """
            from torch.cuda.amp import GradScaler

            class Trainer:
                def __init__(self):
                    self.scaler = GradScaler()

                def save(self):
                    return {
                        "optimizer_state_dict": self.optimizer.state_dict(),
                        "scaler_state_dict": self.scaler.state_dict(),
                    }
            """,
            lines=[8],
        ),
        Case(
            """
            import torch
            def main(path):
                scaler = torch.amp.GradScaler("npu")
                state = torch.load(path)
                optimizer.load_state_dict(state['optimizer_state_dict'])
                train(model, optimizer, scaler)
                torch.save({'optimizer_state_dict': optimizer.state_dict()}, path)
            """,
            """
            import torch
            def main(path):
                scaler = torch.amp.GradScaler("npu")
                state = torch.load(path)
                optimizer.load_state_dict(state['optimizer_state_dict'])
                if 'scaler_state_dict' in state:  # older checkpoints have no scaler state
                    scaler.load_state_dict(state['scaler_state_dict'])
                train(model, optimizer, scaler)
                torch.save({'optimizer_state_dict': optimizer.state_dict(), 'scaler_state_dict': scaler.state_dict()}, path)
            """,
            lines=[5, 7],
        ),
        Case(
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            optimizer.load_state_dict(checkpoint["optimizer"])
            scaler.load_state_dict(torch.load("scaler.pt"))
            torch.save({"optimizer": optimizer.state_dict()}, path)
            """,
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            optimizer.load_state_dict(checkpoint["optimizer"])
            scaler.load_state_dict(torch.load("scaler.pt"))
            torch.save({"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}, path)
            """,
            lines=[5],
        ),
        Unchanged(
            """
            import torch
            def train():
                scaler = torch.amp.GradScaler("npu")
            def save():
                torch.save({"optimizer": optimizer.state_dict()}, path)
            """
        ),
        Unchanged(
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            state = {"optimizer": optimizer.state_dict(), "amp": scaler.state_dict()}
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._scaler = ""
        self._checkpoints: set[cst.Dict] = set()

    def visit_Module(self, node: cst.Module) -> None:
        scaler = existing_scaler(node, self.refers_to)
        if scaler is None:
            return
        self._scaler = scaler
        home = _home(node, scaler)
        self._checkpoints = set(findall(home, m.Dict()))  # type: ignore[arg-type]
        for block, edit in resume_edits(home, scaler):
            self.edit(block, edit)



def _home(module: cst.Module, scaler: str) -> cst.CSTNode:
    """The part of `module` where `scaler` names the scaler: the module, the creating function, or its class."""
    if any(_assigns(line, scaler) for line in module.body if not isinstance(line, (cst.FunctionDef, cst.ClassDef))):
        return module
    holders = findall(module, m.ClassDef() if scaler.startswith("self.") else m.FunctionDef())
    return next((holder for holder in holders if _assigns(holder, scaler)), cst.Module([]))


def _assigns(node: cst.CSTNode, name: str) -> bool:
    return any(code(target.target) == name for target in findall(node, m.AssignTarget()))  # type: ignore
