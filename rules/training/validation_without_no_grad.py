from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from rules import Flag, PortRule, Safety, Severity, Unchanged, findall, training_step

_EVALUATION = re.compile(r"^(validate|validation|val|evaluate|evaluation|eval|test|estimate_loss)(_\w+)?$|_(val|eval)$")
_NO_GRAD = {
    "torch.no_grad",
    "torch.inference_mode",
    "torch.set_grad_enabled",
    "torch.autograd.grad_mode.no_grad",
    "torch.autograd.no_grad",
}
_LOOP = m.For() | m.While()


class ValidationWithoutNoGrad(PortRule):
    """Report validation loops run with autograd on or without model.eval(), and models never put back in train mode.

    ## What it does
    For a function whose name says it evaluates (`validate`, `evaluate`, `test`, `eval_*`, `estimate_loss`...) and
    that loops without calling backward(): reports a missing `torch.no_grad()`/`torch.inference_mode()` (as a `with`
    or a decorator) and a missing `.eval()`. When some code calls `.eval()` but the file never calls `.train()`,
    reports that training resumes in eval mode, unless the file is read as an inference script (an entry script with
    no backward() and no optimizer step): a model that never trains stays in eval mode on purpose.

    ## Why
    With autograd on, validation builds graphs it never frees until the loop ends (memory), and in train mode dropout
    and batch-norm statistics change the numbers the two sides report. A model left in eval mode after validation
    trains without dropout and with frozen batch-norm statistics from then on (checklist C8).

    ## Safety
    Report-only: where evaluation starts and ends is the author's design.

    ## References
    checklist C8.
    """

    CODE = "TRN003"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C8",)
    TRIGGERS = ("val", "eval", "test", "estimate_loss")
    EXAMPLES = (
        Flag(
            """
            import torch

            def validate(loader, model, criterion):
                for images, target in loader:
                    output = model(images)
            """,
            lines=[3],
        ),
        Flag(
            """
            import torch

            def evaluate(model, loader):
                model.eval()
                for x, y in loader:
                    out = model(x)

            def train(model, loader, opt):
                for x, y in loader:
                    opt.zero_grad()
                    model(x).sum().backward()
                    opt.step()
            """,
            lines=[3, 4],
        ),
        Unchanged(  # an inference script: its model stays in eval mode
            """
            import torch

            model = Classifier().eval()
            with torch.no_grad():
                for images in batches:
                    print(model(images).topk(5).indices)
            """
        ),
        Flag(  # a module of a project, not the script that is run: its training loop may be elsewhere
            """
            def load_for_validation(model):
                return model.eval()
            """,
            lines=[2],
            is_entry=False,
        ),
        Unchanged(
            """
            import torch

            @torch.no_grad()
            def estimate_loss(model):
                model.eval()
                for k in range(10):
                    losses[k] = model(x)
                model.train()

            def validate(loader, model):
                model.eval()
                with torch.inference_mode():
                    for x, y in loader:
                        model(x)
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._eval_calls: list[cst.Call] = []
        self._calls_train = False

    def visit_Call(self, node: cst.Call) -> None:
        method = node.func.attr.value if isinstance(node.func, cst.Attribute) else ""  # a plain test on every call
        if method == "eval" and not node.args:
            self._eval_calls.append(node)
        elif method == "train":
            self._calls_train = True

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if not _EVALUATION.search(node.name.value):
            return
        loops = [loop for loop in findall(node.body, _LOOP) if training_step(loop) is None]
        if not loops or _backward_anywhere(node):
            return
        if not self._disables_grad(node):
            self.report(
                node.name,
                f"{node.name.value}() runs the model with autograd on",
                "Decorate it with @torch.no_grad() (or wrap the loop in `with torch.inference_mode():`).",
                Severity.WARNING,
            )
        if not findall(node.body, m.Call(func=m.Attribute(attr=m.Name("eval")))):
            self.report(
                node.name,
                f"{node.name.value}() does not call model.eval(): dropout and batch norm stay in training mode",
                "Call model.eval() before the loop and model.train() when training resumes.",
                Severity.WARNING,
            )

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if self._eval_calls and not self._calls_train and not self.file.inference:
            self.report(
                self._eval_calls[0],
                "the model is put in eval mode but never back in train mode",
                "Call model.train() at the start of each training epoch.",
                Severity.WARNING,
            )
        return updated_node

    def _disables_grad(self, function: cst.FunctionDef) -> bool:
        decorators = [decorator.decorator for decorator in function.decorators]
        contexts = [item.item for with_ in findall(function.body, m.With()) for item in with_.items]  # type: ignore
        for expression in (*decorators, *contexts):
            target = expression.func if isinstance(expression, cst.Call) else expression
            if self.qualified_names(target) & _NO_GRAD:
                return True
        return False


def _backward_anywhere(function: cst.FunctionDef) -> bool:
    return bool(findall(function.body, m.Call(func=m.Attribute(attr=m.Name("backward")))))
