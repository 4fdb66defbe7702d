"""What a comparison found, as findings on one timeline, causes before symptoms: each finding's code, its one-line
message and the detail advice and reports read; how the runs ended (a crash is never a verdict: CompareError where
the runs prove nothing); and the rank that decides which finding the verdict names first. No torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from verify.record import environment
from verify.compare.align import MATCHED_STATUSES, AlignStatus
from verify.compare.code_lines import CodeLines, Placement
from verify.compare.crashes import crash_identity, escaped_exception
from verify.compare.metrics import TOP_K
from verify.compare.op_catalogue import CARRIERS, CHANGED_BY_SETTING, OpCatalogue
from verify.compare.curves import LossComparison, never_updated
from verify.compare.op_verdicts import MODEL_PHASES, one_sided_producers, op_label, source_text
from verify.compare.precision_policy import PrecisionPolicy
from verify.record.store import Run
from verify.record.schema import INPUT_OP, RECORDED_SETTINGS, SETTLING_STEPS, UNWRITTEN_KEY, Phase, Status
from verify.errors import CompareError
from verify.contract.files import port_name, project_trees
from verify.contract.finding_codes import FindingCode


# How few matched ops make two runs look like different scripts rather than a port of one script.
LOW_MATCH_SHARE = 0.5


# Findings that fail the verdict, causes before symptoms: the one-line reason names the first that is present. The
# first divergent operator comes before the loss it moves.
FAILING = (FindingCode.RUN_FAILED, FindingCode.NO_BACKWARD, FindingCode.STEPS_DIFFER, FindingCode.RANKS_DIFFER,
           FindingCode.SHARDING,
           FindingCode.RANKS_DISAGREE, FindingCode.HPARAM_MISMATCH, FindingCode.INIT_DIFFERS, FindingCode.DATA_ORDER,
           FindingCode.GRADS_NOT_RESET, FindingCode.OP_CHANGED, FindingCode.UNSCALED_HALF, FindingCode.OVERFLOW,
           FindingCode.OP_DIVERGES,
           FindingCode.UPDATES_SKIPPED, FindingCode.NO_UPDATE_COMPARED, FindingCode.NONDETERMINISM,
           FindingCode.OUTPUT_DIVERGES, FindingCode.LOSS_DIVERGES, FindingCode.GRAD_DIVERGES, FindingCode.LOW_MATCH)


@dataclass
class Finding:
    code: FindingCode
    message: str  # one line, with the numbers
    detail: dict[str, Any] = field(default_factory=dict)  # what advice rules and reports need (op, dtype, side...)


def how_runs_ended(ref: Run, actual: Run) -> tuple[list[Finding], str]:
    """The findings from how the two scripts ended, and the ending they share ("" when both ran every step).

    A pair proves something only where the reference ran: a reference that stopped (crashed, timed out, lost its
    loss to NaN, made no step) is CompareError (exit 2), and so are two sides that both stopped before their first
    step. Two sides that ended alike (the same status and error after the same number of steps: a short epoch, a bug
    the port faithfully keeps) are judged on the steps they made. Otherwise a port that stopped is a failed run, and
    ending by itself after another number of steps than the reference is a finding."""
    ref_ran, actual_ran = (run.manifest.status in _RAN_THROUGH for run in (ref, actual))
    if ref_ran and actual_ran:
        return [], ""
    where = f"(runs: {ref.root}, {actual.root})"
    same_ending = _ending(ref) == _ending(actual)
    if not (ref_ran or actual_ran) and ref.manifest.steps_completed == actual.manifest.steps_completed == 0:
        errors = _error_words(ref) if same_ending else f"ref {_error_words(ref)}; actual {_error_words(actual)}"
        raise CompareError(f"both sides stopped before their first step: {errors} {where}")
    if same_ending:
        return [], _shared_ending(ref)
    if ref.manifest.status not in _ENDED_BY_ITSELF:
        port = "" if actual_ran else f"; the port {_stop_words(actual)}: {_error_words(actual)}"
        raise CompareError(f"the reference {_stop_words(ref)}: {_error_words(ref)}{port}; a reference that cannot "
                           f"run proves nothing {where}")
    if actual.manifest.status not in _ENDED_BY_ITSELF:
        status = actual.manifest.status
        return [Finding(FindingCode.RUN_FAILED, f"actual run {status}: {actual.manifest.message or _error(actual)}",
                        {"side": "actual", "status": status})], ""
    return [Finding(FindingCode.STEPS_DIFFER, (
        f"the scripts ran different numbers of steps: ref {_steps_made(ref)}, actual {_steps_made(actual)}"),
        {"ref_steps": ref.manifest.steps_completed, "actual_steps": actual.manifest.steps_completed,
         "steps_requested": ref.manifest.steps_requested})], ""


# Statuses of a script that ran every step asked for ("": an msprobe dump, which records no status), and of one that
# ran as far as it could: its loop ended before the steps asked for (Status.SHORT).
_RAN_THROUGH = (Status.OK.value, "")


_ENDED_BY_ITSELF = (*_RAN_THROUGH, Status.SHORT.value)


# The variables torchrun sets for each process; a script reading one of them was written for a launcher.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")


def _ending(run: Run) -> tuple[str, int, tuple]:
    """How a run ended, equal for one behaviour whatever the launcher (verify/compare/crashes.py)."""
    return run.manifest.status, run.manifest.steps_completed, crash_identity(run.manifest)


def _error(run: Run) -> str:
    """What stopped a run: the exception's first line (its type and the start of its message: a message of many
    lines, torch.load's refusal of a pickled numpy array, ends with a pointer to documentation), else the manifest's
    message."""
    exception = escaped_exception(run.manifest.traceback)
    return exception[0] if exception else run.manifest.message or run.manifest.status


def _error_words(run: Run) -> str:
    error = _error(run)
    if any(error == f"KeyError: '{name}'" for name in TORCHRUN_VARIABLES):
        return f"{error}; the script expects a launcher such as torchrun"
    return error


def _no_backward_findings(ref: Run, actual: Run) -> list[Finding]:
    """A port that never calls backward() against a trainer that does: its steps compute no gradient, and the first
    op that differs (the update's) would hide the cause."""
    calls = ref.manifest.backward_calls, actual.manifest.backward_calls
    if actual.manifest.steps_completed == 0 or calls[1] != 0 or not calls[0]:
        return []
    return [Finding(FindingCode.NO_BACKWARD, (
        f"the port never calls backward(): it made {actual.manifest.steps_completed} step(s) without a gradient, where "
        f"the original called backward() {calls[0]} time(s)"), {"side": "actual", "original_calls": calls[0]})]


def _stop_words(run: Run) -> str:
    """'crashed after 3 of 10 steps', 'made no step'."""
    manifest = run.manifest
    if manifest.status == Status.NO_STEPS.value:
        return "made no step"
    return f"{manifest.status} after {manifest.steps_completed} of {manifest.steps_requested} steps"


def _steps_made(run: Run) -> str:
    manifest = run.manifest
    if manifest.status in _RAN_THROUGH:
        return f"all {manifest.steps_completed}"
    return f"{manifest.steps_completed} of {manifest.steps_requested} (it ended by itself)"


def _shared_ending(run: Run) -> str:
    """The note and verdict words for two sides that ended alike after the same steps."""
    manifest = run.manifest
    done, asked = manifest.steps_completed, manifest.steps_requested
    if manifest.status == Status.SHORT.value:
        return f"both scripts ended by themselves after {done} of {asked} steps; judged on those {done}"
    return (f"both scripts stopped ({manifest.status}) after {done} of {asked} steps with the same error, "
            f"{_error(run)}; judged on those {done}")


def _environment_finding(ref: Run, actual: Run, first: dict[str, Any] | None) -> list[Finding]:
    found = environment.differences(ref.manifest, actual.manifest)
    if not found:
        return []
    explains = explaining(found, first)
    message = f"environments differ in {len(found)} setting(s): " + "; ".join(d.text for d in found[:6]) + (
        f"; and {len(found) - 6} more (summary.json)" if len(found) > 6 else "")
    return [Finding(FindingCode.ENVIRONMENT_DIFFERS, message, {
        "explains": "; ".join(d.text for d in explains), "how": how_to_equal(explains), "op": (first or {}).get("op"),
        "step": (first or {}).get("step")})]


def how_to_equal(explains: list[environment.Difference]) -> str:
    """Where the settings that explain the divergence are set: a data loader's in the script's DataLoader call, a
    precision switch in torch's TF32 (GPU) and HF32 (NPU) switches."""
    where = []
    if any(d.setting.startswith("data_loaders.") for d in explains):
        where.append("the port's DataLoader arguments (shuffle=, sampler=, batch_size=, drop_last=) as the original "
                     "passes them")
    if any(not d.setting.startswith("data_loaders.") for d in explains):
        where.append("TF32 on the GPU: torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32; "
                     "HF32 on the NPU: torch.npu.matmul.allow_hf32 and torch.npu.conv.allow_hf32")
    return "; ".join(where)


def explaining(found: list[environment.Difference],
               first_divergent: dict[str, Any] | None) -> list[environment.Difference]:
    """The differences that by themselves change the first divergent op's values: a matmul/convolution precision
    switch for a matmul/convolution (op_catalogue.CHANGED_BY_SETTING), a data loader setting for an op of the first
    step (its batch)."""
    if first_divergent is None:
        return []
    ops = {first_divergent.get("op"), first_divergent.get("actual_op")}
    explained = []
    for difference in found:
        if difference.setting.startswith("data_loaders."):
            if first_divergent.get("step") == 0 and not difference.setting.endswith(".num_workers"):
                explained.append(difference)
        elif difference.setting in CHANGED_BY_SETTING and not ops.isdisjoint(CHANGED_BY_SETTING[difference.setting]):
            explained.append(difference)
    return explained


def _module_findings(ref: Run, actual: Run) -> list[Finding]:
    """The port ran an original module of the project where that module's port is beside it (its imports name the
    originals: the files were ported one by one), or the reference ran a port where its original is beside it. The
    port's name is the original's with the suffix the scripts' names differ by (main.py, main_npu.py: _npu); where
    the scripts lie in two trees of one project (minGPT/, minGPT_npu/), a module of the other tree is named so too."""
    ref_script, port_script = Path(ref.manifest.script), Path(actual.manifest.script)
    findings = _tree_findings(ref, actual, project_trees(ref_script, port_script))
    suffix = port_script.stem.removeprefix(ref_script.stem)
    if suffix == port_script.stem or not suffix:
        return findings
    for name in actual.manifest.project_files:
        original = actual.manifest.files_root / name
        port = port_name(original, suffix)
        if not original.stem.endswith(suffix) and port.is_file():
            findings.append(_other_module("actual", name, port.name, _NAMED_BY_IMPORTS))
    for name in ref.manifest.project_files:
        port = ref.manifest.files_root / name
        original = port.with_name(port.stem.removesuffix(suffix) + port.suffix)
        if port.stem.endswith(suffix) and original.is_file():
            findings.append(_other_module("ref", name, original.name, ""))
    return findings


def _tree_findings(ref: Run, actual: Run, trees: tuple[Path, Path] | None) -> list[Finding]:
    """Modules a side ran from the other side's tree where its own tree has them."""
    if trees is None:
        return []
    findings = []
    for side, run, own, other in (("ref", ref, *trees), ("actual", actual, *reversed(trees))):
        for name in run.manifest.project_files:
            path = (run.manifest.files_root / name).resolve()
            instead = own / path.relative_to(other) if path.is_relative_to(other) else None
            if instead is not None and instead.is_file():
                shown = instead.relative_to(run.manifest.files_root) if instead.is_relative_to(
                    run.manifest.files_root) else instead
                findings.append(_other_module(side, name, shown.as_posix(), _FROM_THE_OTHER_TREE))
    return findings


def _uninitialized_findings(ref: Run, actual: Run) -> list[Finding]:
    """Parameters a side's Module.to_empty allocated and its script never wrote before the first forward: where
    both sides leave them, the original's own bug, which the port keeps (UNINITIALIZED); else a cause of the
    differences (INIT_DIFFERS)."""
    left = {side: run.manifest.extra[UNWRITTEN_KEY] for side, run in (("ref", ref), ("actual", actual))
            if UNWRITTEN_KEY in run.manifest.extra}
    if not left:
        return []
    side = "both" if len(left) == 2 else next(iter(left))
    unwritten = left.get("actual") or left["ref"]
    who = {"both": "both scripts leave", "actual": "the port leaves", "ref": "the original leaves"}[side]
    other = {"both": "", "actual": "; the original writes them", "ref": "; the port writes them"}[side]
    code = FindingCode.UNINITIALIZED if side == "both" else FindingCode.INIT_DIFFERS
    return [Finding(code, f"{who} {unwritten_words(unwritten)}{other}",
                    {"side": side, "where": unwritten["where"], "names": _unwritten_names(unwritten)})]


def unwritten_words(unwritten: dict[str, Any]) -> str:
    """'120 of 125 parameters unwritten after Module.to_empty (example.py:85): layers.0.attention_norm.weight, ...'
    from a manifest's extra[UNWRITTEN_KEY]; its buffers too, where it names some ('... and 2 of 2 buffers ...')."""
    counted = " and ".join(f"{left['count']} of {left['of']} {kind}" for kind, left in _unwritten_kinds(unwritten))
    return f"{counted} unwritten after Module.to_empty ({unwritten['where']}): {_unwritten_names(unwritten)}"


def _unwritten_kinds(unwritten: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(kind, its count, of and names) for the parameters and the buffers a record names any of."""
    kinds = [("parameters", unwritten), ("buffers", unwritten.get("buffers") or {"count": 0})]
    return [(kind, left) for kind, left in kinds if left["count"]]


def _unwritten_names(unwritten: dict[str, Any]) -> str:
    return ", ".join(", ".join(left["names"]) + (", ..." if left["count"] > len(left["names"]) else "")
                     for _, left in _unwritten_kinds(unwritten))


_NAMED_BY_IMPORTS = "its imports name the original"
_FROM_THE_OTHER_TREE = "it found it first on its search path (PYTHONPATH, an installed package)"


def _other_module(side: str, name: str, instead: str, why: str) -> Finding:
    message = (f"the port ran {name}, the original module, not its port {instead}" if side == "actual"
               else f"the reference ran {name}, a port, not the original {instead}")
    return Finding(FindingCode.ORIGINAL_MODULE, f"{message}: {why}" if why else message,
                   {"side": side, "file": name, "instead": instead})


def _overflow_findings(overflow: dict[str, Any], actual: Run) -> list[Finding]:
    findings = []
    for side in ("ref", "actual"):
        first = overflow[f"{side}_first"]
        if first and overflow["one_sided"]:
            findings.append(Finding(FindingCode.OVERFLOW, (
                f"{side} only: first inf/nan from {first['op']} ({first['module'] or 'top level'}, {first['phase']}, "
                f"step {first['step']}, {first['dtype']}: {first['nan_count']} nan, {first['inf_count']} inf)"),
                {"side": side, **first}))
    if overflow.get("under_imposed_autocast"):
        first = overflow["actual_first"]
        findings.append(Finding(FindingCode.OVERFLOW, (
            f"{first['op']} ({first['module'] or 'top level'}, {_at(first)}step {first['step']}) overflows in "
            f"{first['dtype']} under the port's autocast ({first['inf_count']} inf, {first['nan_count']} nan), and "
            "the loss with it: the reference, run under the same autocast, overflows alike, so the port's half "
            "precision does it, not its device; the original computes it in fp32 (--amp-effect runs it so)"),
            {"side": "both", **first}))
    for skip in overflow["one_sided_skips"]:
        findings.append(Finding(FindingCode.OVERFLOW, (
            f"{skip['side']} only: gradients overflowed at step {skip['step']} under the same loss scale "
            f"{skip['scale']:g} (the other side's did not), so that side's update was skipped"),
            {**skip, "op": "the backward pass", "dtype": "float16"}))
    for side in ("ref", "actual"):
        trace = overflow[f"{side}_scale"]
        if trace["collapsed"] or trace["frequent"]:
            findings.append(Finding(FindingCode.SCALE_COLLAPSE, (
                f"{side} loss scale fell {trace['drops']} times after calibration, to {trace['scales'][-1]:g}"
                + (" (collapsed: it reached 1)" if trace["collapsed"] else "")), {"side": side, **trace}))
        if trace["stuck"]:
            findings.append(Finding(FindingCode.SCALE_STUCK, (
                f"{side} loss scale never grows ({trace['scales'][0]:g}): a static scale, or no growth over more steps "
                "without overflow than its growth interval"), {"side": side, **trace}))
    never = never_updated(overflow)
    trace = overflow["actual_scale"]
    if never == "actual":
        first, carried = overflow.get("actual_first_skipped"), _inf_carried(actual, len(trace["scales"]))
        how = (f"its fp16 gradients overflowed at its first step{_where_gradients_overflow(first)}, and nothing resets "
               "them (no optimizer.zero_grad()): each later backward() adds to the inf they hold and every step "
               "overflows whatever the scale" if carried else
               f"its fp16 gradients overflowed at every scale{_where_gradients_overflow(first)}")
        findings.append(Finding(FindingCode.UPDATES_SKIPPED, (
            f"the port's GradScaler skipped the update of each of its {len(trace['scales'])} steps (loss scale "
            f"{_scales_words(trace['scales'])}{_settling_words(actual)}): {how}, so the port never trained in this "
            "run, where the original, which has no loss scaler, updates at each step"),
            {"side": "actual", **trace, "lowest_scale": f"{min(trace['scales']):g}", "first_overflow": first,
             "grads_carried": carried}))
    if never == "both":
        findings.append(Finding(FindingCode.NO_UPDATE_COMPARED, (
            f"no update was compared: each side's own loss scaler skipped the update of each of its "
            f"{len(trace['scales'])} steps (loss scale {_scales_words(trace['scales'])}{_settling_words(actual)}), "
            "so neither side trained in this run and nothing proves the port's training"),
            {"side": "both", **trace, "lowest_scale": f"{min(trace['scales']):g}"}))
    return findings


def _unscaled_half_findings(ref: Run, actual: Run, policy: PrecisionPolicy,
                            first: dict[str, Any] | None) -> list[Finding]:
    """One side trains under float16 autocast with no loss scale where the other scales its loss: its float16
    gradients below float16's smallest number (6e-8) become 0, which the first divergent op of the backward or the
    update shows (timm's train.py makes its GradScaler for CUDA only, so its NPU port trains unscaled). Said only
    where such an op diverges: elsewhere the missing scale changed nothing this run shows."""
    if first is None or first["phase"] not in ("backward", "optimizer"):
        return []
    scales = {side: _first_scale(run) for side, run in (("ref", ref), ("actual", actual))}
    amps = {"ref": policy.ref_amp, "actual": policy.actual_amp}
    for side, other in (("actual", "ref"), ("ref", "actual")):
        if amps[side] == "float16" and scales[side] is None and scales[other] is not None:
            named, scaling = _SIDE_NAMES[side], _SIDE_NAMES[other]
            return [Finding(FindingCode.UNSCALED_HALF, (
                f"{named} trains under float16 autocast without a loss scaler where {scaling} scales its loss "
                f"({scales[other]:g} at its first step): {named}'s small float16 gradients become 0, and the first "
                f"divergent operator {op_label(first)} is in its {first['phase']}"),
                {"side": side, "scale": scales[other], "op": first["op"], "step": first["step"],
                 "seq": first["seq"], "phase": first["phase"]})]
    return []


_SIDE_NAMES = {"ref": "the original", "actual": "the port"}


def _first_scale(run: Run) -> float | None:
    """The loss scale of a run's first recorded step; None for a run without a loss scaler."""
    scales = pd.to_numeric(run.losses["loss_scale"], errors="coerce").dropna()
    return float(scales.iloc[0]) if len(scales) else None


def _inf_carried(run: Run, steps: int) -> bool:
    """Whether every step after the first carried its gradients (verify/capture/gradient_resets.py): a run whose loss
    scaler skipped each step then holds its first overflow's inf in them at every later one."""
    return steps > 1 and set(range(1, steps)) <= set(run.manifest.grads_carried_steps)


def _where_gradients_overflow(first: dict[str, Any] | None) -> str:
    """Where the scaled gradients first overflowed: the backward op, and the forward line it differentiates."""
    if not first:
        return ""
    at = ", ".join(str(part) for part in (first.get("module"), first.get("source")) if part)
    return f" (first in {first['op']} of the backward pass{f' of {at}' if at else ''}, step {first['step']})"


def _settling_words(run: Run) -> str:
    """Why a run that skipped every update ended there: the script ended while its scale still fell, or the steps
    it made past those asked for reached their bound."""
    if run.manifest.steps_completed < run.manifest.steps_requested + SETTLING_STEPS:
        return "; the script ended while it still fell"
    return f"; {SETTLING_STEPS} steps past the {run.manifest.steps_requested} asked for, it never settled"


def _at(record: dict[str, Any]) -> str:
    return f"{record['source']}, " if record.get("source") else ""


def _scales_words(scales: list[float]) -> str:
    return f"{scales[0]:g}" if len(set(scales)) == 1 else f"{scales[0]:g} down to {scales[-1]:g}"


def _grads_reset_findings(ref: Run, actual: Run) -> list[Finding]:
    """A side whose optimizer applies gradients holding what it applied before (manifest.grads_carried_steps,
    verify/capture/gradient_resets.py: per optimizer, a GAN's two included, and per evaluation of LBFGS's closure)
    accumulates them."""
    common = set(ref.losses["step"]) & set(actual.losses["step"])
    carried = [set(run.manifest.grads_carried_steps) & common for run in (ref, actual)]
    findings = []
    for side, mine, theirs in (("ref", carried[0], carried[1]), ("actual", carried[1], carried[0])):
        only_here = sorted(mine - theirs)
        if only_here:
            findings.append(Finding(FindingCode.GRADS_NOT_RESET, (
                f"the {side} side does not reset gradients between steps: from step {only_here[0]}, its backward() "
                "adds to gradients its optimizer already applied (optimizer.zero_grad() missing or misplaced)"),
                {"side": side, "step": only_here[0], "steps": only_here}))
    return findings


def _op_findings(first: dict[str, Any] | None, ref: Run, actual: Run, hparams: pd.DataFrame,
                 inputs_differ: bool, lines: CodeLines) -> list[Finding]:
    if first is None:
        return []
    follows = ", ".join(_hparams_behind(first, hparams))
    same_script = bool(ref.manifest.script_sha256) and ref.manifest.script_sha256 == actual.manifest.script_sha256
    same_device = ref.manifest.device == actual.manifest.device
    # Same script and device but other hyperparameters (its arguments) is not a repeat of one run.
    code = FindingCode.NONDETERMINISM if same_script and same_device and not follows else FindingCode.OP_DIVERGES
    by_hand = _updates_by_hand(first, ref, actual)
    weighed = _against_noise(first["stats_error"], first.get("envelope"), first["tolerance"], ".3g", "stats error")
    if first.get("calibrated_error", np.nan) > first.get("calibrated_tolerance", np.nan):
        weighed = (f"the port differs by {first['calibrated_error']:.3g} from the reference's calibration run that "
                   f"computes as the port's device does (tolerance {first['calibrated_tolerance']:.3g}), and by "
                   f"{first['stats_error']:.3g} from the reference, which differs from itself by "
                   f"{first['envelope']:.3g} (tolerance {first['tolerance']:.3g})")
    elif not pd.isna(first.get("calibrated_error", np.nan)):
        weighed += (f", and by {first['calibrated_error']:.3g} from the reference's calibration run that computes as "
                    "the port's device does")
    placed = lines.place(first["ref_source"], first["actual_source"])
    message = (f"first divergent operator: {op_label(first)}{placed.words if placed else ''}, {weighed}; "
               f"{first['inputs_evidence']}"
               + (f"; it follows from the {follows} difference" if follows else "")
               + (_BY_HAND if by_hand else "") + (placed.origin_words if placed else ""))
    findings = [Finding(code, message, {**first, "follows_hparams": follows, "update_by_hand": by_hand,
                                        **_lines_detail(placed)})]
    if first["step"] == 0 and (first["first_of_step"] or _before_first_forward(first, ref.ops)) and not inputs_differ:
        findings.append(Finding(FindingCode.DATA_ORDER, (
            f"{op_label(first)} runs before the first forward of step 0 and already differs: the batch or the "
            "initial weights differ"), first))
    return findings


_BY_HAND = "; it is the script's own parameter update (no optimizer): its learning rate or rule differs"


def _updates_by_hand(op: dict[str, Any], ref: Run, actual: Run) -> bool:
    """An in-place op at the top level after the step's backward, in runs without an optimizer: the script updates
    its parameters itself (`p.data.add_(p.grad, alpha=-lr)`), so a learning rate there is no recorded hyperparameter
    and the update is where a different one shows first."""
    if op["phase"] != "other" or not op["op"].endswith("_") or not (ref.hparams.empty and actual.hparams.empty):
        return False
    backward = ref.ops.loc[(ref.ops["step"] == op["step"]) & (ref.ops["phase"] == "backward"), "seq"]
    return bool(len(backward)) and op["seq"] > backward.min()


def _input_findings(table: pd.DataFrame) -> list[Finding]:
    """A batch an outermost module received at step 0 differs, and it was read, not computed: the sides read
    different data, which explains every difference after it, so it is named before any operator."""
    inputs = table.loc[(table["ref_op"] == INPUT_OP) & (table["step"] == 0) & (table["passed"] == False)]  # noqa: E712
    read = [index for index, seq in zip(inputs.index, inputs["ref_seq"]) if _read_not_computed(table, int(seq))]
    if not read:
        return []
    row = inputs.loc[read[0]]
    forward = "first forward" if row["ref_call_index"] == 0 else f"forward #{int(row['ref_call_index']) + 1}"
    return [Finding(FindingCode.DATA_ORDER, (
        f"the sides read different data: the {row['io']} input of {row['module']}'s {forward} differs at step 0 "
        f"({row['ref_dtype']} {row['ref_shape']}: mean {row['ref_mean']:.6g} vs {row['actual_mean']:.6g}, min "
        f"{row['ref_min']:.6g} vs {row['actual_min']:.6g}, max {row['ref_max']:.6g} vs {row['actual_max']:.6g})"),
        {"step": 0, "module": str(row["module"]), "io": str(row["io"]), "source": "inputs"})]


def _read_not_computed(table: pd.DataFrame, batch_seq: int) -> bool:
    """Whether a differing batch record of step 0 (the reference's call `batch_seq`) differs because different data
    was read, not because a model computed it otherwise (a GAN's discriminator input, made by its generator). Up the
    reference's data flow (ops.inputs) from the batch, through the calls that differ or carry values (casts, copies,
    unpaired calls): computed where an op of a module's forward or backward differs although no call that produced
    its inputs does; read where each path ends at the top level (a batch collated or transformed there from other
    samples, whose recorded producer is the whole dataset) or at a call that read no recorded call's output (runs
    recorded without the batch's producers: the batch itself)."""
    calls = table.loc[(table["step"] == 0) & table["ref_seq"].notna(),
                      ["ref_seq", "ref_op", "phase", "ref_inputs", "passed"]]
    by_call = calls.groupby(calls["ref_seq"].astype("int64"))
    differs = by_call["passed"].agg(lambda passed: bool((passed == False).any()))  # noqa: E712
    agrees = by_call["passed"].agg(lambda passed: bool((passed == True).all()))  # noqa: E712
    producers = by_call["ref_inputs"].first().fillna("").astype(str)
    in_a_model = by_call.first().pipe(lambda first: first["phase"].astype(str).isin(MODEL_PHASES)
                                      & (first["ref_op"] != INPUT_OP))
    pending, seen = [batch_seq], set()
    while pending:
        seq = pending.pop()
        if seq in seen:
            continue
        seen.add(seq)
        unsettled = [int(part) for part in producers.get(seq, "").split(",")
                     if part and not agrees.get(int(part), False)]
        if differs.get(seq, False) and in_a_model.get(seq, False) and not unsettled:
            return False
        pending += unsettled
    return True


def _lines_detail(placed: Placement | None) -> dict[str, Any]:
    """A finding's detail about the lines behind it (verify/compare/code_lines.py), under "lines"; none without."""
    return {"lines": placed.as_detail()} if placed else {}


# The phases whose changed ops an OP_CHANGED finding names (a module's forward, and the loss's arithmetic outside any).
OP_CHANGED_PHASES = (Phase.FORWARD.value, Phase.OTHER.value)


def _changed_op_findings(table: pd.DataFrame, catalogue: OpCatalogue, lines: CodeLines, ref: Run,
                         actual: Run) -> list[Finding]:
    """The first forward record paired with another computation (gelu where the original calls relu) or with the
    same op under other settings (ops.attrs: gelu's tanh approximation, a layer norm's epsilon): a changed layer or
    function, which every numeric difference after it may follow from, and which the devices' noise may hide. Forward
    only, in a module's forward or outside any (an activation or loss the script computes at top level): a backward
    is derived from its forward, and devices decompose backward ops differently (a GPU's native_dropout_backward is a
    plain mul where the mask was made apart)."""
    paired = table.loc[table["status"].isin(MATCHED_STATUSES) & table["phase"].isin(OP_CHANGED_PHASES)
                       & ~table["ref_op"].isin(list(CARRIERS))]
    ops = paired[["ref_op", "actual_op"]].astype(str)
    pairs = ops.loc[ops["ref_op"] != ops["actual_op"]].drop_duplicates()
    computing_apart = {(op, other) for op, other in zip(pairs["ref_op"], pairs["actual_op"])
                       if not catalogue.same_computation(op, other)}
    other_op = np.fromiter(((op, other) in computing_apart for op, other in zip(ops["ref_op"], ops["actual_op"])),
                           bool, len(ops))
    settings = _settings(paired, "ref"), _settings(paired, "actual")
    other_settings = ((ops["ref_op"] == ops["actual_op"]).to_numpy() & settings[0].notna().to_numpy()
                      & settings[1].notna().to_numpy() & (settings[0] != settings[1]).to_numpy(bool, na_value=False))
    changed = paired.index[other_op | other_settings]
    if changed.empty:
        return []
    row, port_row = _first_call_of_change(table, table.loc[changed[0]])
    detail = {"op": str(row["ref_op"]), "actual_op": str(port_row["actual_op"]), "module": str(row["module"]),
              "phase": str(row["phase"]), "step": int(row["step"]), "seq": int(row["ref_seq"])}
    original, port = detail["op"], detail["actual_op"]
    if original == port:
        detail["attrs"], detail["actual_attrs"] = settings[0][changed[0]], settings[1][changed[0]]
        original, port = f"{original}({detail['attrs']})", f"{port}({detail['actual_attrs']})"
    detail["original_call"], detail["port_call"] = original, port  # with its settings where only they changed
    where = f"{detail['module']} {detail['phase']}" if detail["module"] else "the top level"
    detail["update_by_hand"] = _updates_by_hand(detail, ref, actual)
    meaning = "a changed operator" + (_BY_HAND if detail["update_by_hand"] else "")
    placed = lines.place(row.get("ref_source"), port_row.get("actual_source"))
    if placed is None:
        return [Finding(FindingCode.OP_CHANGED, (
            f"the port computes {port} where the original computes {original} ({where}, step {detail['step']}): "
            f"{meaning}"), detail)]
    return [Finding(FindingCode.OP_CHANGED, (
        f"the port computes {port} where the original computes {original}{placed.words}, in {where}, step "
        f"{detail['step']}: {meaning}{placed.origin_words}"),
        {**detail, **_lines_detail(placed)})]


def _first_call_of_change(table: pd.DataFrame, row: pd.Series) -> tuple[pd.Series, pd.Series]:
    """The rows of the first call of the change `row` pairs: where a step's alignment left the two ops unpaired (the
    original's op only_ref, the port's only_actual, in the same module's forward) at an earlier step than the first
    that paired them (Lightning's backbone with gelu for relu: unpaired at step 0, paired from step 1), that step's
    rows, which the ops tables show; else `row` for both sides."""
    earlier = (table["step"] < row["step"]) & (table["phase"] == row["phase"]) & (table["module"] == row["module"])
    originals = table.loc[earlier & (table["status"] == AlignStatus.ONLY_REF.value)
                          & (table["ref_op"] == row["ref_op"])]
    ports = table.loc[earlier & (table["status"] == AlignStatus.ONLY_ACTUAL.value)
                      & (table["actual_op"] == row["actual_op"])]
    steps = sorted(set(originals["step"]) & set(ports["step"]))
    if not steps:
        return row, row
    return originals.loc[originals["step"] == steps[0]].iloc[0], ports.loc[ports["step"] == steps[0]].iloc[0]


def _one_sided_findings(table: pd.DataFrame, first: dict[str, Any] | None, catalogue: OpCatalogue,
                        lines: CodeLines) -> list[Finding]:
    """Calls only one side makes in the data flow of the first divergent op (op_verdicts.one_sided_producers): the
    op that changed, which no record pairs (relu for a tanh GELU of eight ops, chosen through a config), where the op
    after it is the first to differ. A kernel of a catalogue family among them (a fused NPU kernel for the
    reference's unfused ops) is a known replacement, not a change; casts and copies are passed through."""
    if first is None:
        return []
    rows = one_sided_producers(table, first, CARRIERS | frozenset(catalogue.one_sided))
    ops = {side: [str(table.at[row, f"{side}_op"]) for row in side_rows] for side, side_rows in rows.items()}
    if not any(ops.values()) or any(op in catalogue.families for side_ops in ops.values() for op in side_ops):
        return []
    made = {side: _calls_words(table, side, side_rows) for side, side_rows in rows.items()}
    port, original = made["actual"], made["ref"]
    message = (f"the port computes {port} where the original computes {original}" if port and original
               else f"the port computes {port}, which the original does not" if port
               else f"the original computes {original}, which the port does not")
    lasts = {side: table.loc[side_rows[-1]] if side_rows else None for side, side_rows in rows.items()}
    shown = lasts["actual"] if lasts["actual"] is not None else lasts["ref"]
    detail = {"op": ", ".join(dict.fromkeys(ops["ref"])) or "nothing", "step": int(first["step"]),
              "actual_op": ", ".join(dict.fromkeys(ops["actual"])) or "nothing", "module": str(shown["module"]),
              "phase": str(shown["phase"]), "seq": int(first["seq"]), "one_sided": True}
    detail["original_call"], detail["port_call"] = detail["op"], detail["actual_op"]
    placed = lines.place(*(row.get(f"{side}_source") if row is not None else None
                           for side, row in lasts.items())) if lasts["actual"] is not None else None
    return [Finding(FindingCode.OP_CHANGED, (
        f"{message}: a changed operator, computed on one side only, before the first divergent operator "
        f"{op_label(first)}"), {**detail, **_lines_detail(placed)})]


def _calls_words(table: pd.DataFrame, side: str, rows: list[int]) -> str:
    """'aten.relu (Net.block.act forward, train.py:17)'; of several calls their ops each once and how many calls;
    "" for none."""
    if not rows:
        return ""
    ops = list(dict.fromkeys(str(op) for op in table.loc[rows, f"{side}_op"]))
    last = table.loc[rows[-1]]
    where = ", ".join(part for part in (f"{last['module']} {last['phase']}".strip(),
                                        source_text(last.get(f"{side}_source"))) if part)
    calls = f"{len(rows)} calls, " if len(rows) > 1 else ""
    return f"{', '.join(ops)} ({calls}{where})"


def _settings(table: pd.DataFrame, side: str) -> pd.Series:
    """A side's ops.attrs of each row as strings, missing where its run recorded none (schema before 4, msprobe)."""
    column = f"{side}_attrs"
    if column not in table:
        return pd.Series(pd.NA, index=table.index, dtype="string")
    return table[column].astype("string")


def _hparams_behind(op: dict[str, Any], hparams: pd.DataFrame) -> list[str]:
    """The differing hyperparameters that already changed this op's values. A step's hyperparameters are recorded
    just before its optimizer step, so one that differs from step s changes the update of step s and, through the
    weights, every op of later steps; the forward and backward of step s ran before it and owe it nothing."""
    steps = hparams["step"]
    # the settings verify reads off the run (a dropout's rate, the backward() calls of the step) act from the step's
    # start, the optimizer's at its update
    from_start = hparams["name"].isin(RECORDED_SETTINGS)
    behind = (steps < op["step"]) | ((steps == op["step"]) & ((op["phase"] == "optimizer") | from_start))
    return list(dict.fromkeys(hparams.loc[behind, "name"].astype(str)))


def _before_first_forward(op: dict[str, Any], ops: pd.DataFrame) -> bool:
    """A top-level op of step 0 that runs before any module's forward: data loading, preprocessing, weight init.
    Model construction usually comes first, so the batch is rarely the first recorded op itself."""
    forward = ops.loc[(ops["step"] == 0) & (ops["phase"] == "forward"), "seq"]
    return op["phase"] == "other" and (forward.empty or op["seq"] < forward.min())


def _loss_finding(loss: LossComparison) -> list[Finding]:
    if loss.first_step_past_tolerance is None:
        return []
    row = loss.frame.loc[~loss.frame["passed"]].iloc[0]
    return [Finding(FindingCode.LOSS_DIVERGES, (
        f"loss differs by {row['rel_diff']:.2%} at step {int(row['step'])} ({row['ref_loss']:.6g} vs "
        f"{row['actual_loss']:.6g}; {_against_noise(row['rel_diff'], row.get('envelope'), row['tolerance'], '.2%')})"
        f"; max {loss.max_rel_diff:.2%} over {loss.steps_compared} steps"),
        {"step": int(row["step"]), "rel_diff": float(row["rel_diff"]), "envelope": row.get("envelope")})]


def _grad_finding(grads: pd.DataFrame) -> list[Finding]:
    failing = grads.loc[~grads["passed"]]
    if failing.empty:
        return []
    row = failing.iloc[0]
    return [Finding(FindingCode.GRAD_DIVERGES, (
        f"gradient norm of {row['param']} differs by {row['rel_diff']:.2%} at step {int(row['step'])} "
        f"({row['ref_norm']:.6g} vs {row['actual_norm']:.6g}; "
        f"{_against_noise(row['rel_diff'], row.get('envelope'), row['tolerance'], '.2%')}); "
        f"{len(failing)} of {len(grads)} parameter-steps past tolerance"), {"param": row["param"]})]


def _against_noise(difference: float, envelope: float | None, tolerance: float, form: str, fixed: str = "") -> str:
    """A difference as the verdict weighs it: against the reference's own, where its calibration measured one;
    else against the fixed tolerance (`fixed`: the difference's name, where the message has not said it)."""
    if envelope is None or pd.isna(envelope):
        return f"{fixed} {difference:{form}} > {tolerance:{form}}" if fixed else f"tolerance {tolerance:{form}}"
    return (f"the port differs by {difference:{form}} where the reference differs from itself by {envelope:{form}} "
            f"(tolerance {tolerance:{form}})")


def _output_finding(outputs: pd.DataFrame) -> list[Finding]:
    failing = outputs.loc[~outputs["passed"].astype(bool)]
    if failing.empty:
        return []
    row = failing.iloc[0]
    return [Finding(FindingCode.OUTPUT_DIVERGES, (
        f"inference output {row['output']} differs at step {int(row['step'])}: {output_figures(row)}"), {})]


def output_figures(figures: Any) -> str:
    """'cosine 0.999998, max abs 0.0012, mean abs 4e-05, top-1 100.00%, top-5 100.00%' of an output (or all); an
    output of fewer than 5 classes has its top-k over all of them, named so: 'top-3 (all 3 classes) 100.00%'."""
    k = int(figures.get("top_k", TOP_K))
    top_k = "top-5" if k == TOP_K else f"top-{k} (all {k} classes)"
    return (f"cosine {figures['cosine']:.6f}, max abs {figures['max_abs_error']:.3g}, mean abs "
            f"{figures['mean_abs_error']:.3g}, top-1 {figures['top1_agreement']:.2%}, {top_k} "
            f"{figures['top5_agreement']:.2%}")


def _match_finding(table: pd.DataFrame) -> list[Finding]:
    # Only steps both runs recorded: the steps after one side stopped early (a crash, a NaN) pair nothing by nature.
    common = set(table.loc[table["ref_op"].notna(), "step"]) & set(table.loc[table["actual_op"].notna(), "step"])
    table = table.loc[table["step"].isin(common)]
    if table.empty:
        return []
    share = float(table["status"].isin(MATCHED_STATUSES).mean())
    if share >= LOW_MATCH_SHARE:
        return []
    return [Finding(FindingCode.LOW_MATCH, (
        f"only {share:.0%} of operator records could be paired: the runs may come from different scripts or "
        "models"), {"share": share})]


def _cause_rank(finding: Finding, first: dict[str, Any] | None) -> float:
    """Causes before symptoms: FAILING's order, except that an overflow after the first divergent operator on the
    timeline of the run (a later step, or later in the same step) follows from that divergence and ranks after it,
    and a port stopped by a NaN or inf loss ranks after the causes its steps show."""
    rank = FAILING.index(finding.code)
    if finding.code is FindingCode.OVERFLOW and _happens_after(finding.detail, first):
        return FAILING.index(FindingCode.OP_DIVERGES) + 0.5
    if finding.code is FindingCode.RUN_FAILED and finding.detail.get("status") == Status.NAN.value:
        # A loss gone NaN or inf is what the steps computed: a cause found in them (gradients never reset, a changed
        # op, a hyperparameter) comes first, symptoms (a first divergent op, the loss) after.
        return FAILING.index(FindingCode.OP_CHANGED) + 0.5
    return rank


def _happens_after(detail: dict[str, Any], first: dict[str, Any] | None) -> bool:
    """Whether what `detail` names comes after the op `first` in execution order: its step, then its seq; a finding
    without a seq (a skipped update) happens at the end of its step, after every op of it."""
    step = detail.get("step")
    if first is None or step is None or step != first["step"]:
        return first is not None and step is not None and step > first["step"]
    seq = detail.get("seq")
    return seq is None or seq > first["seq"]


@dataclass
class Verdict:
    passed: bool
    reason: str  # one line: PASS/FAIL and why

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


def verdict(findings: list[Finding], loss: LossComparison, table: pd.DataFrame, policy: PrecisionPolicy,
             first: dict[str, Any] | None, ops_not_compared: str, shared_ending: str,
             outputs: dict[str, Any]) -> Verdict:
    failing = [finding for finding in findings if finding.code in FAILING]  # causes first (collect_findings)
    if failing:
        return Verdict(False, f"FAIL: {failing[0].message}")
    if loss.steps_compared == 0 and table.empty:
        return Verdict(False, "FAIL: nothing to compare (no common loss steps and no operator records)")
    loss_text = _loss_words(loss) if loss.steps_compared else "no loss recorded"
    if outputs:  # inference: the outputs are what an adaptation report states
        loss_text = (f"{outputs['overall']['outputs']} inference output(s) within the criterion at every step: "
                     f"{output_figures(outputs['overall'])}")
    within = "within the reference's own noise" if "envelope" in table else "within tolerance"
    if "calibrated_tolerance" in table:
        within += (" and the accuracy standard of the reference's calibration run that computes as the port's device "
                   "does")
    ops_text = (f"operators not compared: {ops_not_compared}" if ops_not_compared else
                f"{int(table['status'].isin(MATCHED_STATUSES).sum())} op records matched, all {within}")
    ending = f"; {shared_ending.split(';')[0]}" if shared_ending else ""
    return Verdict(True, f"PASS: {loss_text}; {ops_text} ({policy.description.split(':')[0]}){ending}")


def _loss_words(loss: LossComparison) -> str:
    """How close the losses were, against what they were judged by: the fixed tolerance, or the reference's own
    noise where that was wider at some step."""
    frame = loss.frame
    if "envelope" in frame and (frame["tolerance"] > loss.rtol).any():
        return (f"loss within {loss.rtol:.2%} or the reference's own noise at all {loss.steps_compared} steps (max "
                f"{loss.max_rel_diff:.3%}; the reference differs from itself by up to {frame['envelope'].max():.3%})")
    return f"loss within {loss.rtol:.2%} at all {loss.steps_compared} steps (max {loss.max_rel_diff:.3%})"


def collect_findings(ended: list[Finding], ref: Run, actual: Run, table: pd.DataFrame, first: dict[str, Any] | None,
                     loss: LossComparison, hparams: pd.DataFrame, grads: pd.DataFrame, outputs: pd.DataFrame,
                     overflow: dict[str, Any], policy: PrecisionPolicy, catalogue: OpCatalogue,
                     lines: CodeLines) -> list[Finding]:
    """Every finding of a comparison, from how the runs ended to the share of ops that paired; `catalogue` says
    which ops compute the same thing, `lines` where in the scripts an op finding's op was made."""
    inputs = _input_findings(table)
    findings = [
        *ended,
        *_module_findings(ref, actual),
        *_no_backward_findings(ref, actual),
        *(Finding(FindingCode.HPARAM_MISMATCH, f"hyperparameter differs: {message}",
                  {"name": name, **({"from_step": int(step)} if message.endswith(f" from step {step}") else {})})
          for message, name, step in zip(hparams["message"], hparams["name"], hparams["step"])),
        *_grads_reset_findings(ref, actual),
        *_environment_finding(ref, actual, first),
        *_uninitialized_findings(ref, actual),
        *_overflow_findings(overflow, actual),
        *_unscaled_half_findings(ref, actual, policy, first),
        *_loss_finding(loss),
        *_output_finding(outputs),
        *inputs,
        *(_changed_op_findings(table, catalogue, lines, ref, actual)
          or _one_sided_findings(table, first, catalogue, lines)),
        *_op_findings(first, ref, actual, hparams, bool(inputs), lines),
        *_grad_finding(grads),
        *_match_finding(table),
    ]
    if policy.mixed:
        findings.append(Finding(FindingCode.AMP_ONE_SIDE, policy.description,
                                {"ref_amp": policy.ref_amp, "actual_amp": policy.actual_amp}))
    return causes_first(findings, first)


def causes_first(findings: list[Finding], first: dict[str, Any] | None) -> list[Finding]:
    """The findings in the order a reader acts on them, which the reports list and advise: an environment
    difference that explains a divergence (HF32 matmuls), then the failing findings causes before symptoms
    (_cause_rank: the first divergent operator before the loss it moved), then the others in the order found."""
    def rank(finding: Finding) -> float:
        if finding.code is FindingCode.ENVIRONMENT_DIFFERS and finding.detail.get("explains"):
            return -1
        return _cause_rank(finding, first) if finding.code in FAILING else len(FAILING)

    return sorted(findings, key=rank)
