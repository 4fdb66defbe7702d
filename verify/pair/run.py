"""Running a pair's sides (verify/pair/sides.py runs each): the port first, its precision deciding the reference's
autocast and its loss scales the reference's; then the reference, its calibration runs (how far the script's own
numbers move: the noise the port is judged against) and, for --amp-effect, its fp32 run, at once. A port that starts
no ranks of its own runs at once with them (plan.together), its reference following its precision as it runs; where
that reference did not run as it would have after the port, it runs again. A reference that crashes under the port's
autocast runs again as written.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from verify import devices
from verify.compare.precision_policy import amp_dtype
from verify.launch import nodes
from verify.launch.runner import RunOptions
from verify.pair.plan import PairPlan
from verify.pair.sides import RUN_ENDED_WELL, SideRun, SideRunner
from verify.record import run_folders
from verify.record.evidence import read_calibrations, read_side
from verify.record.schema import AUTOCAST_DTYPES, LossScalerPlan, RunManifest, Status
from verify.record.store import Run, read_manifest, recorded_loss_scales

AUTOCAST_FLAGS = {dtype: flag for flag, dtype in AUTOCAST_DTYPES.items()}  # float16 -> fp16


@dataclass
class PairRuns:
    actual: Run
    ref: Run
    imposed: str  # the autocast the reference ran under: "off", "fp16", "bf16"
    port_amp: str  # the half dtype the port computed its forward in, "" for fp32
    ref_fp32: Run | None = None  # --amp-effect
    unmatched_amp: str = ""  # why the reference ran as written although the port computes in half precision
    calibrations: list[Run] = field(default_factory=list)  # the reference's calibration runs (its envelope)


def run_sides(plan: PairPlan, sides: SideRunner) -> PairRuns:
    """The port first: its precision decides the reference's autocast, imposed where the port computed under it, and
    its loss scales the reference's. Then the reference and the runs that follow it, at once. A port that starts no
    ranks (plan.together) runs at once with them, the reference following the port's precision as it runs
    (plan.follows); where that reference did not run as it would have after the port (_as_after_the_port), it runs
    again after it."""
    early: list[Run] = []
    if plan.together:
        actual, *early = sides.run_together([_port_run(plan), *_reference_runs(plan, None, "off", "")], led=True)
    else:
        actual = sides.run_side(_port_run(plan))
    port_amp = amp_dtype(actual)
    if plan.ref_run is not None:
        ref = read_side(plan.ref_run)
        return PairRuns(actual, ref, "off", port_amp, calibrations=read_calibrations(ref))
    imposed = AUTOCAST_FLAGS.get(port_amp, "off") if plan.match_amp else "off"
    if early and _as_after_the_port(early, actual, imposed, port_amp):
        ref, *followers = early
        if plan.amp_effect and imposed != "off":
            followers.append(sides.run_side(_fp32_reference_run(plan)))
    else:
        _discard(plan, early)
        ref, *followers = _run_reference(sides, actual, _reference_runs(plan, actual, imposed, port_amp))
    unmatched = _crashed_under_autocast(ref, actual) if imposed != "off" else ""
    if unmatched:  # its followers measured a comparison under an autocast the reference cannot run
        set_aside = plan.out / run_folders.REF_UNDER_AUTOCAST
        nodes.changed_once(plan.out, plan.options.nodes, "reference-set-aside",
                           lambda: (_remove(followers), ref.root.rename(set_aside)), made=set_aside)
        imposed = "off"
        ref, *followers = _run_reference(sides, actual, _reference_runs(plan, actual, imposed, port_amp))
    ref_fp32 = followers.pop() if plan.amp_effect and imposed != "off" else None
    # a calibration measures the noise of a comparison that will be made: not after a side that did not run well
    if actual.manifest.status not in RUN_ENDED_WELL or ref.manifest.status not in RUN_ENDED_WELL:
        followers = _discard(plan, followers)
    return PairRuns(actual, ref, imposed, port_amp, ref_fp32, unmatched, followers)


def _as_after_the_port(early: list[Run], actual: Run, imposed: str, port_amp: str) -> bool:
    """Whether the reference and its calibration runs, run at once with the port, ran as they would have after it:
    the port started no ranks, and the reference imposed the autocast the port's precision asks, with the twin of its
    GradScaler where it had one, and did not time out (it may have spent its time waiting for the port); its
    calibration runs round at the port's half precision only against an fp32 reference."""
    ref, *calibrations = early
    twin = _scaler_twin(actual)
    expected_twin = "" if twin is None else "scale" if twin.scales else "skip-only"
    half = "" if imposed != "off" else port_amp
    return (not actual.ranks and ref.manifest.status != Status.TIMEOUT.value
            and ref.manifest.autocast == ("" if imposed == "off" else imposed)
            and (ref.manifest.steps_completed == 0 or ref.manifest.loss_scaler.get("twin", "") == expected_twin)
            and all(run.manifest.perturbation.get("half", "") == half for run in calibrations))


def _run_reference(sides: SideRunner, actual: Run, runs: list[SideRun]) -> list[Run]:
    """The reference's runs at once; one after the other where the script starts its own ranks (as the port's run
    did), which may meet at an address of their own (a fixed MASTER_PORT): two runs at once would join one group."""
    if actual.ranks and not actual.manifest.nproc_per_node:
        return [sides.run_side(side) for side in runs]
    return sides.run_together(runs)


def _rendezvous(plan: PairPlan, options: RunOptions, side: str, number: int) -> RunOptions:
    """A side's options across several machines: a rendezvous of its own, the pair's `number`-th (Nodes.for_side),
    for sides run at once."""
    return replace(options, nodes=plan.options.nodes.for_side(side, number)) if plan.options.nodes else options


def own_ranks_ended(runs: PairRuns, node: int) -> dict[str, RunManifest]:
    """A node other than node 0, once every side is in: how its own ranks ended on each side, by the side's folder."""
    return {run.root.name: read_manifest(run_folders.node_dir(run.root, node))
            for run in (runs.actual, runs.ref, *runs.calibrations, *filter(None, [runs.ref_fp32]))}


def _port_run(plan: PairPlan) -> SideRun:
    options = replace(_rendezvous(plan, plan.options, run_folders.ACTUAL, 0), device=plan.device_actual)
    options = _in_its_tree(plan, options, port=True)
    return SideRun("actual", plan.ported, plan.args, options, plan.out / run_folders.ACTUAL)


def _in_its_tree(plan: PairPlan, options: RunOptions, port: bool) -> RunOptions:
    """A side's options where the scripts lie in two trees of one project (`migrate minGPT` writes minGPT_npu/):
    its files named from the folder holding both trees, and your PYTHONPATH's folders of the other tree taken in its
    own (runner.search_path), so that each side imports its own tree's modules: a port run on the original's
    PYTHONPATH would run the original's modules."""
    if plan.trees is None:
        return options
    own, other = reversed(plan.trees) if port else plan.trees
    return replace(options, project_root=Path(os.path.commonpath(plan.trees)), trees=(own, other))


def _reference_runs(plan: PairPlan, actual: Run | None, imposed: str, port_amp: str) -> list[SideRun]:
    """The reference, its calibration runs and, for --amp-effect, its fp32 run; only the reference after a port that
    did not run well (its crash decides the comparison: no noise to measure). Without the port's run (`actual` None:
    they run at once with it) the reference follows the port as it runs where plan.follows, else nothing of it, and
    its fp32 run waits for the port's precision (run_sides)."""
    options = replace(_in_its_tree(plan, _rendezvous(plan, plan.options, run_folders.REF, 1), port=False),
                      device=plan.device_ref, autocast=imposed,
                      autocast_follow=actual.manifest.autocast_scopes if actual else {},
                      loss_scaler_plan=_scaler_twin(actual) if actual else None,
                      follows=plan.out / run_folders.ACTUAL if actual is None and plan.follows else None)
    runs = [SideRun("ref", plan.original, plan.args, options, plan.out / run_folders.REF)]
    if actual is None or actual.manifest.status in RUN_ENDED_WELL:
        port_blocks = 0 if plan.options.exact_emulation else devices.row(plan.device_actual).summation_blocks
        runs += _calibration_runs(plan, options, "" if imposed != "off" else port_amp, port_blocks)
    if actual is not None and plan.amp_effect and imposed != "off":
        runs.append(_fp32_reference_run(plan))
    return runs


def _fp32_reference_run(plan: PairPlan) -> SideRun:
    """--amp-effect: the reference as written, in fp32."""
    options = _rendezvous(plan, plan.options, run_folders.REF_FP32, 2 + plan.calibration_runs)
    return SideRun("ref fp32", plan.original, plan.args,
                   replace(_in_its_tree(plan, options, port=False), device=plan.device_ref),
                   plan.out / run_folders.REF_FP32)


def _calibration_runs(plan: PairPlan, options: RunOptions, half: str, port_blocks: int) -> list[SideRun]:
    """The reference again, --calibration-runs times (verify/capture/perturbation.py): how far the script's own
    numbers move, which the comparison judges the port against. The first sums as the port's emulated device does
    (`port_blocks`, its summation order), with no other change: what moving the script to that device alone does to
    it, discrete flips included (a ReLU's sign, a cancelling sum), which random rounding does not reach. Each further
    run, and the first where the port's order is not known (a real device), sums in another order under random
    rounding. Against an fp32 reference, a port computing in half precision is covered by rounding at its precision
    (`half`). They compute where the port does (devices.reference_on_the_ports_hardware: a GPU reference's
    calibration runs on the CPU against a port emulated there)."""
    def plan_of(number: int) -> dict:
        in_port_order = number == 1 and port_blocks > 0
        blocks = port_blocks if in_port_order else devices.CALIBRATION_BLOCKS + number - 1
        return {"seed": plan.options.seed + number, "half": half, "of": run_folders.REF, "blocks": blocks,
                "rounding": not in_port_order}
    device = devices.reference_on_the_ports_hardware(plan.device_ref, plan.device_actual, plan.options.emulate_on)
    return [SideRun(f"calibration {number}" if plan.calibration_runs > 1 else "calibration", plan.original,
                    plan.args, replace(_rendezvous(plan, options, run_folders.calibration_run(number), 1 + number),
                                       device=device, perturbation=plan_of(number)),
                    plan.out / run_folders.calibration_run(number))
            for number in range(1, plan.calibration_runs + 1)]


def _discard(plan: PairPlan, runs: list[Run]) -> list[Run]:
    """Removes the folders of runs that went with a reference whose comparison will not be made as they measured
    (across machines node 0 alone, once every node read them: nodes.changed_once)."""
    if runs:
        nodes.changed_once(plan.out, plan.options.nodes, "runs-discarded", lambda: _remove(runs))
    return []


def _remove(runs: list[Run]) -> None:
    for run in runs:
        shutil.rmtree(run.root)


def _crashed_under_autocast(ref: Run, actual: Run) -> str:
    """The reason to run the reference again as written: it crashed under the port's autocast where the port ran.
    If it crashes as written too, the script crashes by itself and that run is the one to judge."""
    if ref.manifest.status != Status.CRASHED.value or actual.manifest.status not in RUN_ENDED_WELL:
        return ""
    return (ref.manifest.message.strip().splitlines() or [ref.manifest.status])[0]


def _scaler_twin(actual: Run) -> LossScalerPlan | None:
    """The loss-scaler twin the reference follows when the port trained under a GradScaler (LossScalerTwin): it
    scales as the port did, step by step, so that backward ops are comparable and fp16 gradients overflow alike (in
    fp32 exactly), and skips the updates the port skipped. Without a GradScaler in the port, nothing."""
    scaler = actual.manifest.loss_scaler
    if not scaler:
        return None
    # Runs recorded before skipped_updates existed name only the step: every optimizer of it was skipped.
    skipped = scaler.get("skipped_updates", [[step, index] for step in actual.manifest.skipped_steps
                                             for index in range(_optimizers(actual))])
    return LossScalerPlan.of_port(scaler, skipped, recorded_loss_scales(actual.losses))


def _optimizers(run: Run) -> int:
    return int(pd.to_numeric(run.hparams["optimizer"], errors="coerce").max()) + 1 if len(run.hparams) else 1
