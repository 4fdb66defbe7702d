"""What to do about each finding: a rule table (finding code + condition -> message), evaluated in order.

Messages are templates over the finding's `detail` (op, dtype, side, name...). Checklist ids are
verify/contract/checklist_items.py's (C1..C9).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from verify.compare.findings import OP_CHANGED_PHASES, Finding, FindingCode
from verify.compare.op_catalogue import BUILT_IN, FUSED, NONDETERMINISTIC, OpCatalogue
from verify.record.schema import HALF_DTYPES

@dataclass(frozen=True)
class AdviceRule:
    code: FindingCode
    message: str  # a template over the finding's detail
    checklist: tuple[str, ...] = ()
    applies: Callable[[Finding], bool] = lambda finding: True
    # Whether it is for a port that computes another op where the original computes the finding's op (not another
    # kernel of it: op_catalogue's families); None: either.
    changed_op: bool | None = None
    # Whether it is said only where an operator may be the first cause: an op that diverges after other data or a
    # dropped zero_grad is their symptom, and operator-accuracy advice misleads there
    operator_first: bool = False


def _half(finding: Finding) -> bool:
    return finding.detail.get("dtype") in HALF_DTYPES


def _both_sides(finding: Finding) -> bool:
    """An overflow both sides made under the port's autocast (curves._under_imposed_autocast)."""
    return finding.detail.get("side") == "both"


def _skipped_update(finding: Finding) -> bool:
    """An overflow seen as a loss scaler's skipped step on one side only (curves._one_sided_skips)."""
    return "scale" in finding.detail


def _changed_op(finding: Finding, catalogue: OpCatalogue) -> bool:
    """The port calls another op where the original called this one, not another kernel of it."""
    op, actual_op = finding.detail.get("op"), finding.detail.get("actual_op")
    return bool(op and actual_op) and not catalogue.same_computation(op, actual_op)


def _float64_lost(finding: Finding) -> bool:
    """The reference computed the op in float64 and the port in another dtype (the NPU's float32, say)."""
    return finding.detail.get("dtype") == "float64" and finding.detail.get("actual_dtype") not in ("float64", None)


def _update_by_hand(finding: Finding) -> bool:
    """The divergent op is the script's own parameter update (findings._updates_by_hand)."""
    return bool(finding.detail.get("update_by_hand"))


def _rewritten(finding: Finding) -> bool:
    """The op was made on a line of a hunk migrate made (verify/compare/code_lines.py)."""
    return bool(finding.detail.get("lines", {}).get("rewrites"))


def _edited(finding: Finding) -> bool:
    """The op was made on a line the user edited after migrate wrote the port."""
    return bool(finding.detail.get("lines", {}).get("user_edit"))


def _scheduled_lr(finding: Finding) -> bool:
    """A learning rate equal at the first step and other from a later one: what a scheduler sets."""
    return finding.detail.get("name") in ("lr", "learning_rate") and "from_step" in finding.detail


def _follows_hparams(finding: Finding) -> bool:
    """The op diverges after a differing hyperparameter took effect (findings._hparams_behind): not evidence of a
    numerical issue, since the runs no longer compute on the same values."""
    return bool(finding.detail.get("follows_hparams"))


ADVICE_RULES: tuple[AdviceRule, ...] = (
    *(rule for code in (FindingCode.OP_CHANGED, FindingCode.OP_DIVERGES) for rule in (
        AdviceRule(code, (
            "{op} is made at {lines[port]} (original {lines[original]}), a line migrate rewrote: "
            "{lines[rewrites][0]}. Try, one at a time: keep {op} out of autocast (compute it under "
            "torch.autocast(device_type=..., enabled=False) on .float() inputs); port again without that rule "
            "(migrate --ignore {lines[codes][0]}, or --select only the rules you want); port in the explicit mode "
            "(migrate --mode explicit); then compare again."), ("C2",), _rewritten),
        AdviceRule(code, (
            "{op} is made at {lines[port]} (original {lines[original]}), a line you edited after migrate wrote the "
            "port (it differs from migrate's port): check that edit first."), (), _edited))),
    AdviceRule(FindingCode.RUN_FAILED, (
        "The {side} run ended '{status}': read the traceback in its manifest.json and its output.log. The comparison "
        "covers only the steps it recorded."), ("C3",)),
    AdviceRule(FindingCode.NO_BACKWARD, (
        "The port steps its optimizer without calling backward() (the original calls it {original_calls} time(s)): a "
        "line lost or commented out in the port, or a loss.backward() moved under a condition the port never meets. "
        "Restore it as in the original."), ("C3",)),
    AdviceRule(FindingCode.STEPS_DIFFER, (
        "The scripts' loops end after different numbers of steps (ref {ref_steps}, actual {actual_steps} of "
        "{steps_requested} asked for): the port reads another amount of data per epoch or runs other epochs. Make "
        "the dataset, batch size, drop_last and epoch count equal on both sides."), ("C5", "C9")),
    AdviceRule(FindingCode.HPARAM_MISMATCH, (
        "Make {name} equal on both sides (an argparse default, a config file or a literal the port changed), then "
        "compare again: differences further down follow from it."), ("C9",),
        lambda finding: not _scheduled_lr(finding)),
    AdviceRule(FindingCode.HPARAM_MISMATCH, (
        "{name} starts equal and differs from step {from_step}: the port schedules it otherwise. Call the "
        "learning-rate scheduler's step() where the original does, as often (once per optimizer step or per epoch, "
        "as there; a dropped or moved lr_scheduler.step() shows so), and build it with the original's settings "
        "(warm-up, total steps, decay), then compare again: differences further down follow from it."), ("C9",),
        _scheduled_lr),
    AdviceRule(FindingCode.ENVIRONMENT_DIFFERS, (
        "{op} (step {step}) diverges with a cause outside the model: the environments differ in {explains}. Make "
        "that setting equal on both sides ({how}) and compare again: the operator findings below follow from it."),
        ("C3",),
        lambda finding: bool(finding.detail.get("explains"))),
    AdviceRule(FindingCode.ORIGINAL_MODULE, (
        "The {side} side ran {file} where {instead} belongs: the port must run the ports of the project's modules, "
        "the reference their originals. Port the project's files in one call (`migrate main.py model.py ...`: the "
        "ports import each other's ports) or its folder (`migrate FOLDER/`), then compare again."), ("C3",)),
    AdviceRule(FindingCode.UNINITIALIZED, (
        "Initialize every parameter and buffer after to_empty ({where}): {names} hold whatever the device's memory "
        "held (zeros on an emulated device, any values on a real one), so the layers computed from them train from "
        "no initialization, the ops computed from them prove nothing, and two real devices start them differently. "
        "Call each submodule's reset_parameters (a model's reset_parameters that skips its layers leaves them so), "
        "compute the buffers anew (a rotary embedding's frequencies, a mask), or load a checkpoint, before the first "
        "forward."), ("C8",)),
    AdviceRule(FindingCode.INIT_DIFFERS, (
        "Initialize the parameters and buffers after to_empty ({where}) as the other script does: {names} hold "
        "whatever the device's memory held in one script only, and every difference computed from them follows from "
        "it."),
        ("C8",)),
    AdviceRule(FindingCode.SHARDING, (
        "Share the data out to the ranks as the original does: each rank of the port must read what the same rank of "
        "the original reads. Pass the port's DataLoader to accelerator.prepare where the original does, or give it "
        "the original's DistributedSampler (and call its set_epoch(epoch) each epoch), and seed the ranks as the "
        "original does; the differences after it follow from the other data."), ("C7",)),
    AdviceRule(FindingCode.DATA_ORDER, (
        "The first step's inputs already differ: make the data order identical. Seed the DataLoader (generator=, "
        "worker_init_fn), do not derive num_workers or shuffling from cpu/device counts, sort listdir/glob results "
        "before sharding, call sampler.set_epoch; check both runs used the same seed and initial weights."),
        ("C6", "C7")),
    AdviceRule(FindingCode.OVERFLOW, (
        "{op} overflows in {dtype} on the {side} side only: keep it in fp32 (exclude it from autocast, or run it "
        "under torch.autocast(enabled=False) on .float() inputs) and check loss scaling: a dynamic GradScaler around "
        "backward and the optimizer step, unscale_ before gradient clipping."), ("C2", "C4"),
        lambda finding: _half(finding) and not _skipped_update(finding) and not _both_sides(finding)),
    AdviceRule(FindingCode.OVERFLOW, (
        "{op} at {source} overflows in {dtype} under the autocast the port added: keep it in fp32 in the port "
        "(run it under torch.autocast(enabled=False) on .float() inputs, as Ascend's mixed-precision block list "
        "does); `migrate PORT --fix-from PAIR` writes that fix and verifies it."), ("C2",), _both_sides),
    AdviceRule(FindingCode.OVERFLOW, (
        "Under the same loss scale {scale:g}, the {side} side's gradients overflowed at step {step} and the other "
        "side's did not: the two compute the backward pass differently near fp16's limit. Dump that step in tensor "
        "mode (verify run --dump tensor --ops 'backward/.*') to find the op whose gradient reaches inf, and keep it in "
        "fp32."), ("C2", "C4"), _skipped_update),
    AdviceRule(FindingCode.OVERFLOW, (
        "{op} produces inf/nan in {dtype} on the {side} side only: check its inputs at that step, then dump it in "
        "tensor mode to see which elements overflow."), (), lambda finding: not _half(finding)),
    AdviceRule(FindingCode.GRADS_NOT_RESET, (
        "Reset the gradients once per optimizer step on the {side} side: call optimizer.zero_grad() (or "
        "model.zero_grad()) after optimizer.step() or before the step's first backward(), as the other side does, for "
        "each optimizer (a GAN's two), and at the start of the closure an optimizer's step(closure) evaluates (LBFGS). "
        "Without it every backward() adds its gradients to all earlier ones."), ("C9",)),
    AdviceRule(FindingCode.UNSCALED_HALF, (
        "Scale the loss on the {side} side as on the other: under float16 autocast make a GradScaler "
        "(torch.amp.GradScaler(\"npu\") on the NPU) and call scaler.scale(loss).backward(), scaler.step(optimizer) "
        "and scaler.update(). Check the condition the script makes its scaler under: one that asks for CUDA "
        "(timm's train.py: `device.type in ('cuda',)`) makes none on the NPU; add \"npu\" to it."), ("C4",)),
    AdviceRule(FindingCode.SCALE_STUCK, (
        "The {side} loss scale never grows: a static scale (GradScaler(dynamic=False), a fixed loss-scale value) or "
        "a growth interval longer than the run. A static scale that is too low lets fp16 gradients underflow; use "
        "a dynamic GradScaler."), ("C4",)),
    AdviceRule(FindingCode.SCALE_COLLAPSE, (
        "The {side} loss scale fell {drops} times after its first applied step: gradients overflow at most steps and "
        "those steps are skipped. "
        "Find the op that first produces inf/nan (above), keep it in fp32; a scale that reaches 1 no longer protects "
        "fp16 gradients from underflow."), ("C4",)),
    AdviceRule(FindingCode.UPDATES_SKIPPED, (
        "A GradScaler backs off by halving its scale at each skipped step, and none of this run's steps fit: start it "
        "at a scale the gradients fit, GradScaler(init_scale=2.0**k) with 2**k below {lowest_scale} (`migrate "
        "PORT --fix-from PAIR` settles it from this run), or verify more steps. A loss summed over a batch "
        "(reduction='sum') makes gradients that need a low scale."), ("C4",),
        lambda finding: not finding.detail.get("grads_carried")),
    AdviceRule(FindingCode.UPDATES_SKIPPED, (
        "Reset the port's gradients once per optimizer step: call optimizer.zero_grad() after scaler.step() and "
        "scaler.update() (or before the step's first backward()). A GradScaler skips a step whose gradients hold an "
        "inf, and gradients never reset keep the first overflow's inf for good: no scale helps. The original, "
        "without a loss scaler, adds each step's gradients to the last ones: reset them there too (migrate flags it, "
        "its fix held back as unsafe: --unsafe-fixes)."), ("C4", "C9"),
        lambda finding: bool(finding.detail.get("grads_carried"))),
    AdviceRule(FindingCode.NO_UPDATE_COMPARED, (
        "Both scripts' loss scalers were still backing off when the run ended, so no optimizer update was compared: "
        "give the scripts more steps (an epoch of more batches, --steps), or start both scalers at a scale the "
        "gradients fit, GradScaler(init_scale=2.0**k) with 2**k below {lowest_scale}, the same in the original and "
        "the port."), ("C4",)),
    AdviceRule(FindingCode.OP_DIVERGES, (
        "{op} in {module} diverges although its inputs agree: an operator accuracy issue. Run it in fp32 (exclude it "
        "from autocast), disable fusion (call the unfused eager ops instead of a torch_npu fused kernel; "
        "torch_npu.npu.set_compile_mode(jit_compile=False)), and dump it in tensor mode for cosine/error figures."),
        (), lambda finding: not (_follows_hparams(finding) or _float64_lost(finding) or _update_by_hand(finding)),
        changed_op=False, operator_first=True),
    *(AdviceRule(code, (
        "{op} ({phase}, step {step}) is the script's own parameter update (it trains without an optimizer, so no "
        "learning rate is recorded): make the learning rate and the update rule of the two scripts equal (an "
        "argparse default, a config value or a literal the port changed)."), ("C9",), _update_by_hand)
      for code in (FindingCode.OP_CHANGED, FindingCode.OP_DIVERGES)),
    AdviceRule(FindingCode.OP_DIVERGES, (
        "{op} ran in float64 on the reference and in {actual_dtype} on the port ({module} {phase}, step {step}): the "
        "lost precision is the cause, not the operator. Ascend NPUs support float64 partly (transfer_to_npu even maps "
        "torch.cuda.DoubleTensor to float32): compute the reference in float32 too, or keep this computation on the "
        "CPU in float64 on both sides (migrate reports each float64 use, UNS004)."), ("C3",), _float64_lost),
    AdviceRule(FindingCode.OP_DIVERGES, (
        "{op} ({phase}, step {step}) and the ops after it diverge because {follows_hparams} differs: what uses it (the "
        "optimizer's update, a dropout, the gradients accumulated) and the steps after start from another value, so "
        "they are consequences of that difference, not an operator accuracy issue. Make {follows_hparams} equal "
        "first."), ("C9",),
        _follows_hparams),
    AdviceRule(FindingCode.OP_DIVERGES, (
        "The port computes {actual_op} where the original computes {op} ({module} {phase}, step {step}): a changed "
        "layer or function, not a numerical issue. Port the original's op unless the change is intended."), (),
        lambda finding: finding.detail.get("phase") not in OP_CHANGED_PHASES, changed_op=True),  # OP_CHANGED's
    AdviceRule(FindingCode.OP_CHANGED, (
        "The port computes {port_call} where the original computes {original_call} ({module} {phase}, step "
        "{step}): a changed layer or function, not a numerical issue, and every difference after it may follow from "
        "it. Port the original's op unless the change is intended."), (), lambda finding: not _update_by_hand(finding)),
    AdviceRule(FindingCode.OP_DIVERGES, (
        "{op} is a fused kernel of {fuses}: the ops it fuses compute below it, unrecorded, so which of them differs "
        "is not named. Verify again with {unfused_by} in both scripts: its parts are then recorded one by one."), (),
        lambda finding: finding.detail.get("op") in FUSED),
    AdviceRule(FindingCode.OP_DIVERGES, (
        "{op} is nondeterministic on GPUs (atomic accumulation): first check that the reference is constant "
        "(`verify determinism`), with torch.use_deterministic_algorithms(True) on both sides."), ("C1",),
        lambda finding: finding.detail.get("op") in NONDETERMINISTIC and not _follows_hparams(finding)),
    AdviceRule(FindingCode.NONDETERMINISM, (
        "The same script on the same device gives different results from {op} on: the benchmark is not constant. "
        "Call torch.use_deterministic_algorithms(True) (torch_npu honours it; set HCCL_DETERMINISTIC=true for "
        "collectives), set cudnn.deterministic=True and benchmark=False on GPUs, seed every generator, and disable "
        "dropout for the comparison."), ("C1",)),
    AdviceRule(FindingCode.AMP_ONE_SIDE, (
        "Mixed precision runs on one side only (ref {ref_amp}, actual {actual_amp}): rerun the reference under the "
        "same autocast (verify run --autocast) so the comparison isolates the port from the expected AMP noise."),
        ("C2",)),
    AdviceRule(FindingCode.LOSS_DIVERGES, (
        "The loss leaves its tolerance at step {step}: start from the first divergent operator and the findings "
        "above; with none of them, compare in tensor mode around the first step that differs."), ()),
    AdviceRule(FindingCode.GRAD_DIVERGES, (
        "The gradient of {param} differs first: look at the backward ops of its module in ops.csv."), ()),
    AdviceRule(FindingCode.OUTPUT_DIVERGES, (
        "The inference outputs differ: follow the first divergent operator; check eval() mode and that dropout "
        "and batch-norm statistics are identical on both sides."), ("C8",)),
    AdviceRule(FindingCode.LOW_MATCH, (
        "Few operators pair up: check that both runs are of the same model and configuration (script, model size, "
        "batch size, dump mode)."), ()),
)


@dataclass(frozen=True)
class Advice:
    code: FindingCode
    message: str
    checklist: tuple[str, ...]


# Causes in the script that every op after them follows from, whatever its inputs show: a rank's share of the data,
# gradients never reset, no backward, other steps, a float16 backward left unscaled; and other data where the batch
# itself was seen to differ. (A hyperparameter is the op finding's own follows_hparams: only the ops after it took
# effect follow from it.)
_SCRIPT_CAUSES = frozenset({FindingCode.SHARDING, FindingCode.GRADS_NOT_RESET, FindingCode.NO_BACKWARD,
                            FindingCode.STEPS_DIFFER, FindingCode.UNSCALED_HALF})


def _operator_first(findings: list[Finding]) -> bool:
    """Whether an operator may be the first cause: no cause in the script that the ops follow from (a changed operator
    among them, where it comes no later than the step the ops diverge at: Lightning's backbone with gelu for relu,
    whose next relu then differs although its inputs agree)."""
    diverging = [finding.detail.get("step") for finding in findings if finding.code is FindingCode.OP_DIVERGES]
    first_step = min((step for step in diverging if step is not None), default=None)
    return not any(finding.code in _SCRIPT_CAUSES or _other_batch(finding) or _changed_before(finding, first_step)
                   for finding in findings)


def _changed_before(finding: Finding, step: int | None) -> bool:
    """A changed operator (gelu for relu) at or before `step`, the first step an op diverges at."""
    return finding.code is FindingCode.OP_CHANGED and (step is None or finding.detail.get("step", 0) <= step)


def _other_batch(finding: Finding) -> bool:
    return finding.code is FindingCode.DATA_ORDER and finding.detail.get("source") == "inputs"


def advise(findings: list[Finding], catalogue: OpCatalogue = BUILT_IN) -> list[Advice]:
    """Advice for each finding in the order of the findings (causes first: findings.causes_first, so a FAIL's first
    advice is about the cause its reason names, not the loss it moved), without repeating a message; `catalogue` (the
    comparison's) says which ops compute the same thing."""
    advice: list[Advice] = []
    operator_first = _operator_first(findings)
    for finding in findings:
        changed_op = _changed_op(finding, catalogue)
        for rule in ADVICE_RULES:
            if (rule.code is finding.code and rule.changed_op in (None, changed_op) and rule.applies(finding)
                    and (operator_first or not rule.operator_first)):
                detail = {**finding.detail, "module": finding.detail.get("module") or "the top level (no module)",
                          **dict(zip(("fuses", "unfused_by"), FUSED.get(finding.detail.get("op"), ())))}
                text = rule.message.format_map(defaultdict(lambda: "?", detail))
                if all(existing.message != text for existing in advice):
                    advice.append(Advice(finding.code, text, rule.checklist))
    return advice
