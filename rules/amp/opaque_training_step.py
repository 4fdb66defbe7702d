from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules.amp._loss_scaling import manages_precision
from rules.amp._step_analysis import Problem, analyse, autocast_bans, plan_autocast, scopes
from rules import AmpPolicy, Flag, PortRule, Safety, Settings, Severity, Unchanged, findall


class OpaqueTrainingStep(PortRule):
    """Report fp32 training steps that mixed precision cannot be added to automatically.

    ## What it does
    In a file without mixed precision, with `--amp fp16|bf16`, reports each step AMP101 leaves alone, with what to do
    instead: `optimizer.step(closure)` (GradScaler has no closure support), gradients taken with `torch.autograd`
    (`backward`/`grad`, e.g. gradient penalties), non-scalar or `create_graph` backward calls, a backward whose loss
    is computed in another function, a backward with no optimizer step in the same function, and a loss through
    `binary_cross_entropy`/`nn.BCELoss` (which autocast refuses to run) computed in the same expression as its inputs
    or inside a helper function, where AMP101 cannot move it after autocast, and a forward inside a `for`/`if`/`try`
    that also loads data, moves it to the device, logs or leaves the loop (the autocast block would wrap those, and
    splitting them out would move code), and a training loop that never clears its gradients (TRN001's), whose
    gradients, summed over steps at different loss scales, no GradScaler can unscale. With `--amp bf16`
    only what blocks autocast is reported (no scaler is needed). A file that casts by hand (`.half()`, `float16`)
    is reported once.

    ## Why
    Checklist C2 and C4 ask for mixed precision and loss scaling in the port; these shapes need a person to place
    the scaler's calls, and a wrong guess would silently train differently.

    ## Safety
    Report-only.

    ## References
    PyTorch "Automatic Mixed Precision examples" (gradient penalty, closures):
    <https://docs.pytorch.org/docs/stable/notes/amp_examples.html>.
    """

    CODE = "AMP105"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C2", "C4")
    TRIGGERS = (".backward(", "autograd.grad(")
    EXAMPLES = (
        Flag(
            """
            def closure():
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                return loss
            optimizer.step(closure)
            """,
            lines=[4, 6],
        ),
        Flag(
            """
            import torch
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                grads = torch.autograd.grad(loss, model.parameters(), create_graph=True)
                penalty = sum(g.pow(2).sum() for g in grads)
                (loss + penalty).backward()
                optimizer.step()
            """,
            lines=[5],
        ),
        Flag(
            """
            def apply(loss, optimizer):
                loss.backward()
                optimizer.step()
            """,
            lines=[2],
        ),
        Flag(
            """
            model = Net().half()
            for x, y in loader:
                loss = criterion(model(x.half()), y)
                loss.backward()
                optimizer.step()
            """,
            lines=[1],
        ),
        Flag(
            """
            import torch
            criterion = torch.nn.BCELoss().to("cuda")
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            lines=[4],
            amp=AmpPolicy.BF16,
        ),
        Flag(  # micro-batches moved to the device inside the loop that runs the forward
            """
            for batch in loader:
                loss = 0.0
                for chunk in batch.split(4):
                    chunk = chunk.to(device)
                    loss = loss + model(chunk).mean()
                loss.backward()
                optimizer.step()
            """,
            lines=[3],
            amp=AmpPolicy.BF16,
        ),
        Unchanged(
            """
            def closure():
                loss = criterion(model(x), y)
                loss.backward()
                return loss
            optimizer.step(closure)
            """,
            amp=AmpPolicy.BF16,
        ),
        Flag(  # pytorch/examples' tensor-parallel toys: gradients summed over every step, never cleared
            """
            for i in range(num_iters):
                output = model(torch.rand(20, 10))
                output.sum().backward()
                optimizer.step()
            """,
            lines=[1],
        ),
        Flag(  # the loop that steps never clears what its micro-batches' backward calls sum
            """
            for step in range(steps):
                for x in batch.split(4):
                    loss = model(x).pow(2).mean()
                    loss.backward()
                optimizer.step()
            """,
            lines=[1],
        ),
        Unchanged(  # bf16 autocast needs no scaler: AMP101 adds it whether or not the loop clears its gradients
            """
            for i in range(num_iters):
                output = model(torch.rand(20, 10))
                output.sum().backward()
                optimizer.step()
            """,
            amp=AmpPolicy.BF16,
        ),
        Unchanged(
            """
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """
        ),
    )

    @classmethod
    def wants(cls, source: str, settings: Settings) -> bool:
        if settings.amp is AmpPolicy.OFF or not super().wants(source, settings):
            return False
        marker = manages_precision(source)
        return marker is None or marker in (".half()", "float16")

    def visit_Module(self, node: cst.Module) -> None:
        marker = manages_precision(self.file.source)
        if marker is not None:
            cast = m.Call(func=m.Attribute(attr=m.Name("half"))) | m.Attribute(attr=m.Name("float16"))
            found = findall(node, cast)
            self.report(
                found[0] if found else node.body[0],
                f"the script sets its own precision ({marker}): mixed precision not inserted",
                "replace hand casts with `torch.autocast(device_type=\"npu\", dtype=torch.float16)` around the forward "
                "and a `torch.amp.GradScaler(\"npu\")` around backward and step",
                severity=Severity.WARNING,
            )
            return
        bans = autocast_bans(node, self.refers_to)
        for scope in scopes(node):
            step = analyse(scope, self.qualified_names, clears_gradients=self.settings.unsafe_fixes)
            if step.backwards and not self._blocking(step.problems):
                plan_autocast(step, bans)
            for problem in self._blocking(step.problems):
                self.report(problem.node, problem.message, problem.suggestion)

    def _blocking(self, problems: list[Problem]) -> list[Problem]:
        """The problems that stop AMP101 under the policy: all with fp16, only autocast's with bf16."""
        return [p for p in problems if self.settings.amp is AmpPolicy.FP16 or not p.scaling_only]
