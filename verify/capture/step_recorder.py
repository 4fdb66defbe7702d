"""Counting a run's steps and recording what each did, in verify's child process: losses, hyperparameters, gradient
statistics, op records and inference outputs, written to the run directory step by step.

Steps. A step ends when the *lead* optimizer (the first one ever to call step()) finishes step(). With several
optimizers (a GAN) the others' steps fall into whichever step they run in, identically on both sides of a
comparison. A step that a loss scaler skips (inf/NaN gradients: optimizer.step() is never called) still counts, or
the run would never end; it is listed in manifest.skipped_steps, and the run goes on by one step for each, at most
SETTLING_STEPS more: a dynamic loss scale halves through its first steps until the gradients fit (its warm-up), and
the steps asked for are steps that train. Without an optimizer, a step runs from one forward of the model to the
next (or to the script's end): inference when no backward() was ever called, else training that updates the
parameters by hand (pytorch/examples word_language_model's `p.data.add_`). The model is the outermost module the
lead optimizer trains, else the first with a parameter that requires a gradient: a frozen network beside it (a
perceptual loss's VGG, a teacher, a diffusion fine-tune's VAE) is recorded as frozen (manifest.extra[FROZEN_KEY]),
and its calls before the training loop start no step. After the steps `StopRun` (a BaseException, so the script's
`except Exception` cannot swallow it) unwinds the script.

Loss: the tensor backward() is called on, unscaled when GradScaler.scale() produced it; one losses.csv row per
backward() (micro-steps of gradient accumulation). Hyperparameters of every optimizer and per-parameter gradient
statistics are taken just before each optimizer step. Nothing is recorded in forked children (DataLoader workers).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import sys
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._pytree import tree_flatten

from verify.capture.ops import sample_columns, step_columns, tensors_in
from verify.capture.module_scopes import unwrapped
from verify.capture.tensor_stats import Handle, has_readable_data, host_array, summarize, summarize_all
from verify.record.schema import (ACCUMULATION, DROPOUT_RATE, FROZEN_KEY, GRAD_STATISTIC_NAMES, GRADS_DIR,
                                   INITIAL_LOSS_SCALE, MODEL_KEY, MODULE_HPARAMS, OPS_DIR, OUTPUTS_DIR, SAMPLES_DIR,
                                   SETTLING_STEPS, STAT_COLUMNS, LossScalerPlan, RunManifest, Status,
                                   ran_requested_steps, step_file)
from verify.capture.loss_scaler_twin import LossScalerTwin, script_scaler
from verify.capture.followed_port import followed
from verify.capture.gradient_resets import GradientResets
from verify.errors import CaptureFailed, VerifyFailure
from verify.frameworks import LOSS_SCALERS, LossScaler, fsdp, when_imported
from verify.record.store import RunWriter, write_manifest


OUTPUT_ARRAY_CAP_BYTES = 4 << 20  # inference outputs are saved for top-k agreement; logits of a batch fit easily
# What a param_group holds that is no setting: its parameters, and the update count that DeepSpeed's FusedAdam and
# FusedLamb keep there (a side whose loss scaler skipped more updates counts fewer)
_NOT_SETTINGS = {"params", "step"}


class StopRun(BaseException):
    """Ends the script from inside a hook. A BaseException: `except Exception` in user code must not swallow it."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@contextlib.contextmanager
def verifys_own() -> Iterator[None]:
    """Work of verify's own (statistics, records): an exception in it is CaptureFailed, naming where it was raised,
    so that the run ends as verify's error (exit 2), not as the script's crash."""
    try:
        yield
    except VerifyFailure:  # already verify's (DiskFull); StopRun, a BaseException, passes too
        raise
    except Exception as error:
        where = traceback.extract_tb(error.__traceback__)[-1]
        raise CaptureFailed(f"verify's capture failed at {Path(where.filename).name}:{where.lineno}: "
                            f"{type(error).__name__}: {error}") from error


def _json_value(value: Any) -> Any:
    """Hyperparameters as JSON: numbers, strings, lists; tensors (a tensor lr) as numbers; anything else as text."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, (tuple, list)):
        return [_json_value(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _same_gradient(key: int, grad: torch.Tensor, version: int, parameters: list[Any]) -> bool:
    """Whether the parameter `key` still holds `grad`, unchanged since `version` (backward added nothing to it)."""
    parameter = next(p for p in parameters if id(p) == key)
    return parameter.grad is grad and grad._version == version


class StepRecorder:
    """Counts steps and records losses, hyperparameters, gradient statistics, op records and inference outputs."""

    def __init__(self, manifest: RunManifest, run_dir: Path, writer: RunWriter, capture, batch) -> None:
        self.manifest = manifest
        self.run_dir = run_dir
        self.writer = writer
        self.capture = capture  # OpCapture, or None with --dump off
        self.batch = batch
        self.enabled = True
        self.steps_done = 0
        self.training = False
        self.optimizers_created = 0
        self.model_forwards = 0  # forwards of an outermost module: what a run without a step did run
        self._optimizer_index: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._optimizer_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._optimizers: weakref.WeakSet = weakref.WeakSet()  # every optimizer the script made
        self._roots: list[weakref.ref] = []
        self._root_depth = 0
        # Without an optimizer: the open step's model (a weak reference), which began it with a forward; the step
        # ends at the model's next forward. None: no step is open.
        self._step_model: weakref.ref | None = None
        self._in_backward = False
        self._last_scaled: tuple[Any, Any, float] | None = None  # (scaled loss, loss, scale) from GradScaler.scale
        self._script_scaler: dict[str, Any] = {}  # the script's own GradScaler (script_scaler), where it has one
        plan = manifest.loss_scaler_plan  # a reference following the port's GradScaler
        self.twin = LossScalerTwin(LossScalerPlan.from_record(plan)) if plan else None
        self.followed = followed(manifest)  # the port this reference follows while both run; its twin comes from it
        # Without an optimizer: whether this step's first backward() found earlier gradients (their norm, on its way)
        self._carried_grads: Handle | None = None
        self._resets = GradientResets()  # with optimizers: whether one read gradients it had read before, not reset
        self._step_started = time.perf_counter()
        self._losses: list[tuple[int, Any, float | None, float]] = []
        self._hparams: list[tuple[int, Any, str, Any, int]] = []
        self._grads: list[tuple[str, Any]] = []
        self._stepping: list[tuple[str, Any]] = []  # (name, parameter) of the optimizer whose step() is running
        self._withheld: list[tuple[Any, Any]] = []  # (parameter, gradient) kept from a step the twin skips
        self._unscaled_by_port: set[int] = set()  # ids of parameters whose gradients an optimizer step has seen
        self._outputs: list[tuple[str, Any, str]] = []
        self._unwritten: tuple | None = None  # an ended step whose statistics were still on their way

    # -- installation -------------------------------------------------------------------------------------------

    def install(self) -> None:
        register_optimizer_step_pre_hook(self._before_optimizer_step)
        register_optimizer_step_post_hook(self._after_optimizer_step)
        register_module_forward_pre_hook(self._before_forward)
        register_module_forward_hook(self._after_forward, always_call=True)
        os.register_at_fork(after_in_child=self._disable)
        self._wrap(torch.Tensor, "backward", self._backward)
        self._wrap(torch.autograd, "backward", self._backward)
        self._wrap(torch.amp.GradScaler, "scale", self._scale)
        self._wrap(torch.amp.GradScaler, "step", self._scaler_step)
        self._wrap(torch.amp.GradScaler, "unscale_", self._scaler_bookkeeping)
        self._wrap(torch.amp.GradScaler, "update", self._scaler_bookkeeping)
        self._wrap(torch.optim.Optimizer, "__init__", self._optimizer_init)
        self._wrap(torch.utils.data.dataloader._BaseDataLoaderIter, "__next__", self._next_batch)
        for scaler in LOSS_SCALERS:
            self._follow_when_imported(scaler)

    def _follow_when_imported(self, scaler: LossScaler) -> None:
        """A framework's own loss scaler, followed as a GradScaler is once the script imports it: the loss it scales
        is recorded unscaled, and a step whose update its optimizer skipped is a skipped update."""
        module, name = scaler.scaler
        patches = {module: functools.partial(self._wrap_class, name, scaler.scales,
                                             functools.partial(self._framework_scale, scaler))}
        for module, name in scaler.steppers:
            patches[module] = functools.partial(self._wrap_class, name, "step",
                                                functools.partial(self._framework_step, scaler.inner))
        when_imported(patches)

    def _wrap_class(self, name: str, method: str, replacement: Callable[..., Any], module: Any) -> None:
        self._wrap(getattr(module, name), method, replacement)

    @staticmethod
    def _wrap(owner: Any, name: str, replacement: Callable[..., Any]) -> None:
        """owner.name = a function calling replacement(original, *args); as a plain function it binds as a method."""
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return replacement(original, *args, **kwargs)

        setattr(owner, name, wrapper)

    def _disable(self) -> None:
        self.enabled = False
        if self.capture is not None:
            self.capture.recording = False

    @contextlib.contextmanager
    def _own_work(self) -> Iterator[None]:
        """The recorder's tensor work: not recorded as ops, no autograd graph; what fails in it is verify's."""
        with torch.no_grad(), (self.capture.paused() if self.capture else contextlib.nullcontext()), verifys_own():
            yield

    # -- hooks ----------------------------------------------------------------------------------------------------

    def _optimizer_init(self, original, optimizer, *args, **kwargs) -> None:
        self.optimizers_created += 1
        original(optimizer, *args, **kwargs)
        self._optimizers.add(optimizer)

    def _backward(self, original, tensors, *args, **kwargs):
        if self._in_backward or not self.enabled:  # Tensor.backward calls torch.autograd.backward
            return original(tensors, *args, **kwargs)
        self.training = True
        self.manifest.inference = False
        self.manifest.backward_calls = (self.manifest.backward_calls or 0) + 1
        with self._own_work():
            self._follow_scaler()
            if not self._losses and not self._optimizers:
                self._check_gradients_reset()
            parameters = self._trained_parameters()
            self._resets.before_backward(parameters)
            self._record_loss(tensors)
        self._in_backward = True
        try:
            if self._imposes_loss_scale(tensors, args, kwargs):
                return self._scaled_backward(original, tensors, *args, **kwargs)
            return original(tensors, *args, **kwargs)
        finally:
            self._in_backward = False
            self._resets.after_backward(parameters, [parameter for _, parameter in self._stepping])

    def _follow_scaler(self) -> None:
        """A reference run at once with its port: the twin of the port's GradScaler as far as this step (none while
        the port has none; followed_port waits for the port to write the step)."""
        if self.followed is None:
            return
        plan = self.followed.scaler_plan(self.steps_done)
        if plan is None:
            return
        if self.twin is None:
            self.twin = LossScalerTwin(plan)
        self.twin.follow(plan, not self.followed.ended)

    def _imposes_loss_scale(self, tensors, args, kwargs) -> bool:
        """The twin scales a loss the script does not scale itself (a scalar, no gradient given)."""
        scaled_by_script = self._last_scaled is not None and tensors is self._last_scaled[0]
        return (self.twin is not None and self.twin.scaling and isinstance(tensors, torch.Tensor)
                and tensors.numel() == 1 and not scaled_by_script and not args and kwargs.get("gradient") is None)

    def _trained_parameters(self) -> list[Any]:
        """The parameters of the outermost modules and of every optimizer the script made: a model whose layers the
        script calls through .forward(), never as modules (pytorch/examples' mnist_forward_forward), has no outermost
        module, and its optimizers hold its parameters."""
        modules = (p for ref in self._roots if ref() is not None for p in ref().parameters())
        optimized = (p for optimizer in list(self._optimizers) for group in optimizer.param_groups
                     for p in group["params"])
        return list({id(p): p for p in itertools.chain(modules, optimized)}.values())

    def _scaled_backward(self, original, loss, *args, **kwargs):
        """Backward of loss * the twin's scale, then the gradients unscaled (LossScalerTwin). Gradients held from
        earlier micro-steps are scaled first, so that backward accumulates into scaled gradients as under the port's
        GradScaler (the same in-place adds); the scales are powers of two, so nothing is rounded by it. Gradients an
        optimizer step has seen since their last backward stay as they are: the port's GradScaler unscaled them in
        place at that step, skipped or not, and its next backward adds scaled gradients to them."""
        scale = self.twin.scale_at(self.steps_done, len(self._losses) - 1)  # this backward's loss is recorded
        parameters = [parameter for parameter in self._trained_parameters() if parameter.grad is not None]
        with self._own_work():
            seen = {id(p): (p.grad, p.grad._version) for p in parameters if id(p) in self._unscaled_by_port}
            held = [p.grad for p in parameters if id(p) not in seen]
            if held:
                torch._foreach_mul_(held, scale)
        with self._paused_capture():  # as a GradScaler's scale() is
            scaled = loss * scale
        result = original(scaled, *args, **kwargs)
        with self._own_work():
            untouched = {key for key, (grad, version) in seen.items() if _same_gradient(key, grad, version, parameters)}
            self._unscaled_by_port = untouched  # a gradient backward wrote is scaled again, in the port as here
            self.twin.unscale_([p.grad for p in self._trained_parameters()
                                if p.grad is not None and id(p) not in untouched])
        return result

    def _check_gradients_reset(self) -> None:
        """A script without an optimizer (updating by hand): at a step's first backward(), gradients left from an
        earlier step mean nothing reset them in between (read when the step ends, with the step's other statistics:
        no sync here). With optimizers, GradientResets watches what each reads."""
        gradients = [p.grad for p in self._trained_parameters() if p.grad is not None]
        if gradients:
            norms = torch._foreach_norm(gradients)
            device = norms[0].device
            self._carried_grads = self.batch.add(torch.stack([norm.float().to(device) for norm in norms]).sum())

    def _record_loss(self, tensors) -> None:
        scaling = self.twin is not None and self.twin.scaling
        scale = self.twin.scale_at(self.steps_done, len(self._losses)) if scaling else None
        losses = tensors_in(tensors)
        if self._last_scaled is not None and losses and losses[0] is self._last_scaled[0]:
            _, unscaled, scale = self._last_scaled
            losses = [unscaled]
        value = torch.stack([loss.detach().float().mean() for loss in losses]).sum()
        wall_ms = (time.perf_counter() - self._step_started) * 1e3
        self._losses.append((len(self._losses), self.batch.add(value), scale, wall_ms))

    def _paused_capture(self):
        return self.capture.paused() if self.capture else contextlib.nullcontext()

    def _scaler_bookkeeping(self, original, scaler, *args, **kwargs):
        """A GradScaler's own arithmetic (unscaling, inf checks, scale updates) is not the model's: unrecorded, or a
        port that gained a GradScaler would show ops that its reference cannot have."""
        with self._paused_capture():
            return original(scaler, *args, **kwargs)

    def _next_batch(self, original, iterator):
        """A DataLoader making its next batch: the dataset's transforms and the collation are data, not the model's
        computation, and run in the main process only without workers (num_workers=0): unrecorded, or a port that
        loads with other workers than its original pairs a fraction of its ops (the batch is recorded where a model
        reads it)."""
        with self._paused_capture():
            return original(iterator)

    def _scale(self, original, scaler, outputs):
        with self._paused_capture():
            scaled = original(scaler, outputs)
        # A disabled GradScaler (GradScaler(enabled=False), as bf16 scripts make one) scales nothing: no scale to
        # record (its get_scale() says 1.0, which would read as a collapsed scale).
        if self.enabled and hasattr(outputs, "detach") and scaler.is_enabled():
            self._last_scaled = (scaled, outputs, scaler.get_scale())
            self._script_scaler = self._script_scaler or script_scaler(scaler)
            self.manifest.loss_scaler = self.manifest.loss_scaler or self._script_scaler
        return scaled

    def _framework_scale(self, row: LossScaler, original, scaler, loss, *args, **kwargs):
        with self._paused_capture():
            scaled = original(scaler, loss, *args, **kwargs)
        scale = float(getattr(scaler, row.scale))
        # a static scaler's (fixed scale) settings are only its scale; one that multiplies by 1 (DeepSpeed in fp32)
        # scales nothing, as a disabled GradScaler
        settings = {word: getattr(scaler, attribute) for word, attribute in row.settings.items()
                    if hasattr(scaler, attribute)}
        if self.enabled and hasattr(loss, "detach") and (scale != 1.0 or settings.get("dynamic", True)):
            self._last_scaled = (scaled, loss, scale)
            if not self._script_scaler:
                growth = settings.get("growth_factor", 1.0)
                self._script_scaler = {"init_scale": scale, "growth_factor": growth, "backoff_factor": 1 / growth,
                                       "dynamic": False} | settings
                self.manifest.loss_scaler = self.manifest.loss_scaler or self._script_scaler
        return scaled

    def _scaler_step(self, original, scaler, optimizer, *args, **kwargs):
        steps_before = self._optimizer_steps.get(optimizer, 0)
        result = original(scaler, optimizer, *args, **kwargs)
        self._skipped_unless_stepped(optimizer, steps_before)
        return result

    def _framework_step(self, inner: str, original, stepper, *args, **kwargs):
        """The step() of a framework's optimizer holding a torch optimizer as `inner` (DeepSpeed's ZeRO)."""
        optimizer = getattr(stepper, inner, None)
        steps_before = self._optimizer_steps.get(optimizer, 0)
        result = original(stepper, *args, **kwargs)
        if isinstance(optimizer, torch.optim.Optimizer):
            self._skipped_unless_stepped(optimizer, steps_before)
        return result

    def _skipped_unless_stepped(self, optimizer, steps_before: int) -> None:
        """A loss scaler that had `optimizer` step skipped it (inf/NaN gradients): the step is a skipped update, and
        an overflow of this side's, which the twin of a reference with a scaler of its own may not see (DeepSpeed's
        inner optimizer holds no gradients of the model)."""
        if self.enabled and self._optimizer_steps.get(optimizer, 0) == steps_before:
            if self.twin is not None:
                self.twin.overflow_at(self.steps_done)
            index = self._optimizer_index.setdefault(optimizer, len(self._optimizer_index))
            self.manifest.loss_scaler.setdefault("skipped_updates", []).append([self.steps_done, index])
            if self.steps_done not in self.manifest.skipped_steps:
                self.manifest.skipped_steps.append(self.steps_done)
            self._before_optimizer_step(optimizer, (), {})
            self._after_optimizer_step(optimizer, (), {})

    def _before_optimizer_step(self, optimizer, args, kwargs) -> tuple[tuple, dict] | None:
        """Records what the step starts from; a step(closure) gets its closure back recorded (_recorded_closure)."""
        if not self.enabled:
            return None
        self.training = True
        self._optimizer_steps[optimizer] = self._optimizer_steps.get(optimizer, 0) + 1
        index = self._optimizer_index.setdefault(optimizer, len(self._optimizer_index))
        self._stepping = self._named_parameters(optimizer)
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args: step()'s own, self first
        with self._own_work():
            self._follow_scaler()
            self._record_hparams(optimizer, index)
            if not callable(closure):
                self._gradients_computed(index)
        if self.capture is not None:
            self.capture.optimizer_step_begins()
        if not callable(closure):
            return None
        recorded = self._recorded_closure(closure, index)
        if "closure" in kwargs:
            return args, {**kwargs, "closure": recorded}
        return (optimizer, recorded, *args[2:]), kwargs

    def _gradients_computed(self, index: int) -> None:
        """The gradients the update reads are there: recorded, and withheld where the twin skips the update."""
        self._record_grads()
        if self.twin is not None and self.twin.skips(self.steps_done, index, self._stepping_gradients()):
            self._skip_update()
        if self.twin is not None and self.twin.scaling:
            self._unscaled_by_port |= {id(parameter) for _, parameter in self._stepping}

    def _recorded_closure(self, closure, index: int):
        """`closure` as step() evaluates it: Lightning's training_step and backward run inside optimizer.step(closure),
        as do LBFGS's loss evaluations. Its ops are the step's forward and backward, recorded as those of a step
        without a closure (the optimizer's own ops around it stay unrecorded), and the gradients its first evaluation
        leaves are the step's gradients."""
        evaluations = 0

        def evaluated(*args, **kwargs):
            nonlocal evaluations
            with self.capture.closure_evaluated() if self.capture is not None else contextlib.nullcontext():
                result = closure(*args, **kwargs)
            evaluations += 1
            if evaluations == 1:
                with self._own_work():
                    self._gradients_computed(index)
            return result

        return evaluated

    def _stepping_gradients(self) -> list[torch.Tensor]:
        return [parameter.grad for _, parameter in self._stepping if parameter.grad is not None]

    def _skip_update(self) -> None:
        """The twin skips this step's update, as the port's GradScaler did: without gradients, optimizer.step() leaves
        the parameters and their state as they are. The gradients come back after it, as a skipping GradScaler leaves
        them (a GAN's next backward through this model adds to them)."""
        self._withheld = [(parameter, parameter.grad) for _, parameter in self._stepping if parameter.grad is not None]
        for parameter, _ in self._withheld:
            parameter.grad = None
        if self.steps_done not in self.manifest.skipped_steps:
            self.manifest.skipped_steps.append(self.steps_done)

    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        if not self.enabled:
            return
        for parameter, gradient in self._withheld:
            parameter.grad = gradient
        self._withheld = []
        self._resets.read([parameter for _, parameter in self._stepping])
        if self.capture is not None:
            self.capture.optimizer_step_ends(self._stepping)
        self._stepping = []  # a backward() from here on runs outside any optimizer's step()
        if self._optimizer_index.get(optimizer) == 0:
            if self.steps_done == 0:
                self._record_model()  # the lead optimizer now says which module it trains
            self._end_step()

    def _before_forward(self, module, args) -> None:
        if self._root_depth == 0 and self.enabled:
            if not any(ref() is module for ref in self._roots):
                self._roots.append(weakref.ref(module))
                self._record_model()
            if self._step_model is not None and self._model() is module:
                if self._step_model() is module:
                    self.end_open_step()
                else:  # the trained model's first call: the step a frozen network's call opened before it goes on
                    self._step_model = weakref.ref(module)
            if self.capture is not None:
                self.capture.record_inputs(module, args, _keyword_arguments(module))
        self._root_depth += 1

    def _after_forward(self, module, args, output) -> None:
        self._root_depth -= 1
        if self._root_depth == 0 and self.enabled:
            self.model_forwards += 1
            if self.capture is not None:
                self.capture.note_outputs(output)
        if self._root_depth or not self.enabled or self.optimizers_created:
            return
        if not self.training:
            self.manifest.inference = True  # until a backward() says otherwise
            with self._own_work():
                self._record_outputs(output)
        if self._step_model is None:
            self._step_model = weakref.ref(self._model())

    def end_open_step(self) -> None:
        """Ends the step that a forward began without an optimizer (at the model's next forward, or when the script
        ends)."""
        if self._step_model is not None:
            self._end_step()

    # -- the model ------------------------------------------------------------------------------------------------

    def _outermost(self) -> list[torch.nn.Module]:
        return [module for module in (ref() for ref in self._roots) if module is not None]

    def _model(self) -> torch.nn.Module | None:
        """The model the script trains: the first outermost module holding a parameter of the lead optimizer, else
        the first with a parameter that requires a gradient, else the first (an inference script's, frozen or not),
        never a frozen network beside it."""
        roots = self._outermost()
        lead = next((optimizer for optimizer, index in self._optimizer_index.items() if index == 0), None)
        if lead is not None:
            trained = {id(p) for group in lead.param_groups for p in group["params"]}
            holder = next((root for root in roots if any(id(p) in trained for p in root.parameters())), None)
            if holder is not None:
                return holder
        return next((root for root in roots if _trainable(root)), roots[0] if roots else None)

    def _record_model(self) -> None:
        """manifest.extra: the model (MODEL_KEY) and the frozen networks beside it (FROZEN_KEY), as known so far.
        A dataset's transform that is a module (torchvision's Normalize) holds no parameters, and is neither."""
        model = self._model()
        with_parameters = [root for root in self._outermost() if next(root.parameters(), None) is not None]
        if model is not None and (model in with_parameters or not with_parameters):
            self.manifest.extra[MODEL_KEY] = _model_record(model)
        frozen = [_model_record(root) for root in with_parameters if root is not model and not _trainable(root)]
        if frozen:
            self.manifest.extra[FROZEN_KEY] = frozen

    # -- records --------------------------------------------------------------------------------------------------

    def _record_hparams(self, optimizer, index: int) -> None:
        step = self.steps_done
        self._hparams.append((step, "", "optimizer", type(optimizer).__name__, index))
        for group_index, group in enumerate(optimizer.param_groups):
            for name, value in group.items():
                if name not in _NOT_SETTINGS:
                    self._hparams.append((step, group_index, name, _json_value(value), index))
        if index == 0:
            self._hparams.append((step, "", ACCUMULATION, len(self._losses), index))
            if self._script_scaler:
                self._hparams.append((step, "", INITIAL_LOSS_SCALE, self._script_scaler["init_scale"], index))
            self._record_module_settings(step)

    def _record_module_settings(self, step: int) -> None:
        """Settings that live in the model's modules, each named by its module's path in its model (the model itself:
        "the model"), in one walk of the modules: the rate of every dropout module that trains (a config's rate,
        LoRA's lora_dropout: a changed rate moves every op after it, which names no cause by itself), and the
        MixedPrecisionPolicy dtypes of every module fully_shard made (verify/frameworks/fsdp.py)."""
        sharded = tuple(found for module, name in fsdp.MODULE_CLASSES
                        if (found := getattr(sys.modules.get(module), name, None)) is not None)
        for root in self._outermost():
            for path, module in unwrapped(root).named_modules():
                if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.training:
                    self._hparams.append((step, path, DROPOUT_RATE, float(module.p), MODULE_HPARAMS))
                state = getattr(module, "_get_fsdp_state", None) if sharded and isinstance(module, sharded) else None
                policy = getattr(state(), "_mp_policy", None) if state is not None else None
                if policy is not None:
                    self._hparams.extend((step, path or "the model", setting, str(getattr(policy, name, None)),
                                          MODULE_HPARAMS) for name, setting in zip(fsdp.POLICY_DTYPES,
                                                                                   fsdp.POLICY_SETTINGS))

    def _parameter_names(self) -> dict[int, str]:
        names: dict[int, str] = {}
        model = self._model()
        for root in sorted(self._outermost(), key=lambda root: root is not model):  # the model's names are plain
            for name, parameter in unwrapped(root).named_parameters():  # "conv1.weight", wrapped or not
                if id(parameter) not in names:  # two models with the same layout: the later one gets its class name
                    names[id(parameter)] = name if name not in names.values() else f"{type(root).__name__}.{name}"
        return names

    def _named_parameters(self, optimizer) -> list[tuple[str, Any]]:
        """The optimizer's parameters with their names in the model (group<i>.<j> for one outside every model)."""
        names = self._parameter_names()
        return [
            (names.get(id(parameter), f"group{group_index}.{position}"), parameter)
            for group_index, group in enumerate(optimizer.param_groups)
            for position, parameter in enumerate(group["params"])
        ]

    def _record_grads(self) -> None:
        named = [(name, parameter.grad) for name, parameter in self._stepping if parameter.grad is not None]
        self._grads += zip((name for name, _ in named), summarize_all([grad for _, grad in named], self.batch))

    def _record_outputs(self, output) -> None:
        tensors = [leaf for leaf in tree_flatten(output)[0] if isinstance(leaf, torch.Tensor)]
        for position, tensor in enumerate(tensors):
            name = f"out{position}"
            saved = ""
            if has_readable_data(tensor) and tensor.numel() * tensor.element_size() <= OUTPUT_ARRAY_CAP_BYTES:
                relative = f"{OUTPUTS_DIR}/{step_file(self.steps_done, f'-{name}.npy')}"
                saved = self.writer.save_array(relative, host_array(tensor))
            self._outputs.append((name, summarize(tensor, self.batch), saved))

    def _end_step(self) -> None:
        """Ends the step and writes it once its statistics are on the host. They are shipped (one copy per device,
        off the compute stream); where the copy is not done yet (a GPU still running the step), the step is written
        at the end of the next one, by when it is, so the device never waits for the host. The last step asked for
        is written at once; one a run ends after, by discard_partial_step (a run killed loses it)."""
        step = self.steps_done
        self._step_model = None  # a step an optimizer ends closes one a forward before the loop opened
        with self._own_work():
            shipment = self.batch.ship()
            samples = self.capture.samples if self.capture is not None else []
            ops = self.capture.close_step(step) if self.capture is not None else None
        outputs = self._outputs if self.manifest.inference else None
        ended = (step, shipment, ops, samples, self._losses, self._hparams, self._grads, outputs,
                 self._resets.take() or self._carried_grads)
        self._carried_grads = None
        if self.twin is not None:  # a script scaling by itself as well keeps saying so: it would skip by itself
            self.manifest.loss_scaler = self.twin.record() | ({"script_scaler": self._script_scaler}
                                                              if self._script_scaler else {})
        self._losses, self._hparams, self._grads, self._outputs = [], [], [], []
        self.steps_done += 1
        self.manifest.steps_completed = self.steps_done
        self.manifest.step_wall_s.append(round(time.perf_counter() - self._step_started, 6))
        previous, self._unwritten = self._unwritten, ended
        if previous is not None:
            self._write_step(*previous)
        last = self.steps_done >= self._steps_to_run()
        if last or shipment.arrived():
            self._write_unwritten()
        write_manifest(self.run_dir, self.manifest)
        self._step_started = time.perf_counter()
        if last:
            raise StopRun(Status.OK, ran_requested_steps(self.steps_done, self.manifest.steps_requested,
                                                         len(self.manifest.skipped_steps)))

    def _steps_to_run(self) -> int:
        """The steps asked for, and one more for each update a loss scaler skipped, at most SETTLING_STEPS more: its
        warm-up (it halves until the gradients fit) is no training step, and a run that ends inside it compares no
        update. A reference that follows its port's scaler skips the port's steps, so both make the same steps."""
        return self.manifest.steps_requested + min(len(self.manifest.skipped_steps), SETTLING_STEPS)

    def _write_unwritten(self) -> None:
        unwritten, self._unwritten = self._unwritten, None
        if unwritten is not None:
            self._write_step(*unwritten)

    def _write_step(self, step: int, shipment, ops, samples, losses, hparams, grads, outputs, carried_grads) -> None:
        """Writes an ended step's records; a NaN or inf loss stops the run there (a step ended after it is not kept)."""
        with self._own_work():
            fetched = shipment.read()
        # != 0, not > 0: gradients that overflowed and were never reset have a nan norm, and are carried too
        if carried_grads is True or (carried_grads is not None and fetched(carried_grads)[0] != 0):
            self.manifest.grads_carried_steps.append(step)
        losses = [
            (step, micro, fetched(handle)[0], scale, round(wall_ms, 3)) for micro, handle, scale, wall_ms in losses
        ]
        self.writer.append_losses(losses)
        self.writer.append_hparams(hparams)
        self._write_stats(GRADS_DIR, step, "param", grads, fetched)
        if outputs is not None:
            named = [(name, stats) for name, stats, _ in outputs]
            saved = [saved for _, _, saved in outputs]
            self._write_stats(OUTPUTS_DIR, step, "output", named, fetched, tensor_file=saved)
        if ops is not None:
            self.writer.write_step_table(OPS_DIR, step, step_columns(step, ops, fetched))
        if samples:
            self.writer.write_step_table(SAMPLES_DIR, step, sample_columns(samples))
        bad = [loss for _, _, loss, _, _ in losses if not math.isfinite(loss)]
        if bad:
            self._unwritten = None
            self.steps_done = self.manifest.steps_completed = step + 1
            del self.manifest.step_wall_s[step + 1 :]
            write_manifest(self.run_dir, self.manifest)
            raise StopRun(Status.NAN, f"loss is {bad[0]} at step {step}")

    def _write_stats(self, folder: str, step: int, label: str, named, fetched, **extra: list[Any]) -> None:
        """One row per (name, PendingStats) of `named`, the name in column `label` (grads: "param", outputs:
        "output"). Grads name some statistics their own way (GRAD_STATISTIC_NAMES); the writer keeps the columns its
        table has."""
        resolved = [stats.resolve(fetched) for _, stats in named]
        columns = {
            "step": [step] * len(named),
            label: [name for name, _ in named],
            **{field: [getattr(stats, field) for _, stats in named] for field in ("dtype", "shape", "numel")},
            **{column: [values[column] for values in resolved] for column in STAT_COLUMNS},
            **{grads_name: [values[name] for values in resolved] for name, grads_name in GRAD_STATISTIC_NAMES.items()},
            **extra,
        }
        self.writer.write_step_table(folder, step, columns)

    def discard_partial_step(self) -> None:
        """Writes the last completed step, where the run ended without writing it, and drops the work after it (a
        validation loop, say), which belongs to no step."""
        try:
            self._write_unwritten()
        except StopRun as stop:  # that step's loss is NaN: the run stopped there, whatever came after
            self.manifest.status, self.manifest.message, self.manifest.exit_code = stop.status.value, stop.message, 1
        self.batch.sharded.discard()  # no collective here: another rank may have ended elsewhere
        with verifys_own():
            self.batch.fetch()
        if self.capture is not None:
            self.capture.discard_step(self.steps_done)


_MODULE_CALL_FILE = torch.nn.Module._call_impl.__code__.co_filename  # torch/nn/modules/module.py


def _keyword_arguments(module: torch.nn.Module) -> dict[str, Any]:
    """The keyword arguments of the call of `module` whose global forward pre-hooks run now: torch hands such a hook
    only the positional ones (register_module_forward_pre_hook has no with_kwargs), and a Hugging Face model is
    called as `model(**batch)`. Read from the frame of torch's Module call that runs the hook (`_call_impl`, or the
    `inner` it defines where hooks are registered); {} where none does."""
    frame = sys._getframe(2)  # _keyword_arguments <- StepRecorder._before_forward <- the module call
    for _ in range(3):
        if frame is None:
            break
        if frame.f_code.co_filename == _MODULE_CALL_FILE and frame.f_locals.get("self") is module:
            return frame.f_locals.get("kwargs") or {}
        frame = frame.f_back
    return {}


def _trainable(module: torch.nn.Module) -> bool:
    return any(parameter.requires_grad for parameter in module.parameters())


def _model_record(module: torch.nn.Module) -> dict[str, Any]:
    """manifest.extra[MODEL_KEY]: the model's class and parameter count (inside its wrappers), as the adaptation
    report names it, and whether its parameters are in shared memory (processes that update them without locks:
    hogwild)."""
    module = unwrapped(module)
    parameters = list(module.parameters())
    return {"class": type(module).__name__, "parameters": sum(parameter.numel() for parameter in parameters),
            "shared_memory": any(parameter.is_shared() for parameter in parameters)}
