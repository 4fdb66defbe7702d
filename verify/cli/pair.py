"""`verify ORIGINAL [PORTED] [options] [-- SCRIPT ARGS]`: both runs and their comparison in one go, the original
(cuda, else EMULATED CUDA) against the port (npu, else the EMULATED NPU), same seed, steps and args; verdict; reports.
(`verify determinism` is verify/cli/determinism.py; both run their sides through verify/cli/side_runs.py.)

Typer cannot mix a default command with subcommands, so `route()` (called by verify/cli/'s main) sends a command
line whose first word is neither a command nor an option to the hidden `pair` command.

Each side is a `verify run` (verify/launch/runner.py) and the comparison is `verify compare`'s (verify/compare/runs.py,
verify/report/writers.py): this module only decides what to run, runs it with progress, and adds what the pair knows to
the reports: how the precision of the two sides was matched, and the AMP effect when asked. `verify determinism` runs
one script twice with the same pieces (verify/cli/determinism.py).

Mixed precision on one side only: `migrate` usually gives the port an fp16 autocast that the original lacks. When
the port's forward computes in fp16/bf16, the reference computes under the same autocast where the port does, module
call by module call (verify/capture/precision_scopes.py; on the CPU with the emulated NPU's op casts), so the comparison
isolates the port; a reference that still cannot run so runs as written, judged fp32 against AMP. A port that starts
no ranks runs at once with its reference and calibration runs, which follow its autocast and GradScaler as the port
writes them (verify/capture/followed_port.py); where that was not what they would have run after the port (the port
computed in half precision without autocast, an original with its own autocast), they run again after it.
`--amp-effect` also runs the reference in fp32 and compares it with the reference under autocast: the AMP effect
alone, judged with the documented fp32-vs-AMP tolerances (verify/compare/tolerances.py). `--no-match-amp` compares
fp32 with AMP directly, with the same wider tolerances.
"""

from __future__ import annotations

import io
import os
import re
import secrets
import shutil
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Optional

import pandas as pd
import typer

from verify.report.adaptation import write_adaptation
from verify.contract.files import AMP_EFFECT, port_name, project_trees, report_folder
from verify.compare.runs import ComparisonResult, compare_runs
from verify.compare.precision_policy import CompareOptions, amp_dtype
from verify.report.terminal import print_summary
from verify.cli.compare_cmd import (OpMappingOption, adaptation_or_why_not, compare_options, read_calibrations,
                                    read_side)
from verify import devices
from verify.record import provenance, run_folders
import verify.cli.options as options  # `from verify.cli import` would import the package, which imports this module
from verify.cli.options import Echo, command_line, echo_asked
from verify.cli.exits import exit_with
from verify.launch.runner import RunOptions, check_options, search_path
from verify.cli.side_runs import RUN_ENDED_WELL, SideRun, SideRunner, side_runner, stderr, stdout, write_reports
from verify.errors import PairError
from verify.launch import nodes
from verify.record.store import Run, read_manifest, recorded_loss_scales
from verify.record.schema import AUTOCAST_DTYPES, DumpMode, LossScalerPlan, Status

PAIR_COMMAND = "pair"
_AUTOCAST_FLAGS = {dtype: flag for flag, dtype in AUTOCAST_DTYPES.items()}  # float16 -> fp16


# --- command-line routing ----------------------------------------------------------------------------------------


def route(argv: Sequence[str], group: Any) -> list[str]:
    """`verify ORIGINAL ...` -> `verify pair ORIGINAL ...`; and where `--` follows ORIGINAL alone, the default PORTED is
    spelled out, since the parser would otherwise take the first script argument for PORTED. `group` is the click
    group Typer built for the app (its commands and their options)."""
    argv = list(argv)
    if not argv or argv[0].startswith("-"):
        return argv
    if argv[0] not in group.commands:
        argv.insert(0, PAIR_COMMAND)
    if argv[0] == PAIR_COMMAND and "--" in argv:
        before = argv[1:argv.index("--")]
        positions = _positional_indexes(before, _options_with_values(group.commands[PAIR_COMMAND]))
        if len(positions) == 1:
            argv.insert(argv.index("--"), str(default_port(Path(before[positions[0]]))))
    return argv


def _options_with_values(command: Any) -> set[str]:
    return {name for param in command.params if param.param_type_name == "option" and not param.is_flag
            for name in param.opts}


def _positional_indexes(tokens: list[str], valued: set[str]) -> list[int]:
    positions, skip = [], False
    for index, token in enumerate(tokens):
        if skip:
            skip = False
        elif token.startswith("-"):
            skip = token in valued  # `--steps 3`; `--steps=3` carries its value
        else:
            positions.append(index)
    return positions


# --- shared pieces -----------------------------------------------------------------------------------------------


def default_port(original: Path) -> Path:
    """What `migrate ORIGINAL` writes beside it (contract.files.port_name: <stem>_npu.py)."""
    return port_name(original)


# --- the pair ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairPlan:
    original: Path
    ported: Path
    args: list[str]
    options: RunOptions  # what both sides share: steps, seed, dump, dropout, timeout
    device_ref: str
    device_actual: str
    match_amp: bool
    amp_effect: bool
    ref_run: Path | None
    out: Path
    compare: CompareOptions = CompareOptions()  # --loss-rtol, --op-mapping
    adaptation: bool = False  # --adaptation-report
    calibration_runs: int = 1  # --calibration-runs: the reference again under another rounding, measuring its noise
    command: tuple[str, ...] = ()  # the command line, as the adaptation report gives it (options.command_line)
    # The port runs at once with its reference and calibration runs: its text starts no ranks of its own
    # (runs_with_its_reference); the reference follows the port's precision as the port runs (`follows`) where the
    # original's text computes in full precision, as the pair compares a port that gained mixed precision.
    together: bool = False
    follows: bool = False
    trees: tuple[Path, Path] | None = None  # the original's and the port's trees of one project (project_trees)


@dataclass
class PairRuns:
    actual: Run
    ref: Run
    imposed: str  # the autocast the reference ran under: "off", "fp16", "bf16"
    port_amp: str  # the half dtype the port computed its forward in, "" for fp32
    ref_fp32: Run | None = None  # --amp-effect
    unmatched_amp: str = ""  # why the reference ran as written although the port computes in half precision
    calibrations: list[Run] = field(default_factory=list)  # the reference's calibration runs (its envelope)


def runs_at_once(plan: PairPlan) -> int:
    """The most runs the pair makes together: the reference, its calibration runs and its fp32 run, and the port
    where it runs with them."""
    return 1 if plan.ref_run is not None else 1 + plan.calibration_runs + plan.amp_effect + plan.together


# What in a script's text starts ranks (two runs at once would meet at one address), and computes in half precision.
_STARTS_RANKS = re.compile(r"spawn|Process\b|init_process_group|elastic|distributed\.run|torchrun")
_HALF_PRECISION = re.compile(r"autocast|GradScaler|\.half\(|float16|bfloat16|\bamp\b")


def _code(script: Path) -> str:
    """A script's text without its comments: a comment that reads "# Process features" starts no process."""
    text = script.read_text(errors="replace")
    lines = text.splitlines(keepends=True)
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                row, column = token.start
                lines[row - 1] = lines[row - 1][:column] + "\n"
    except (tokenize.TokenError, SyntaxError):
        return text
    return "".join(lines)


def runs_with_its_reference(ported: Path, options: RunOptions, ref_run: Path | None) -> bool:
    """Whether the port can run at once with its reference: it starts no ranks, by its text and by verify. A port
    that starts them after all (in a module its text imports) is run first, and its reference again after it
    (run_sides). Never across machines (--nnodes needs --nproc-per-node): no node reruns a reference for that."""
    return (ref_run is None and not options.nproc_per_node
            and not _STARTS_RANKS.search(_code(ported)))


def follows_its_port(original: Path, device_ref: str, match_amp: bool, together: bool) -> bool:
    """Whether a reference running at once with its port follows the port's autocast and GradScaler as they run
    (verify/capture/followed_port.py): the port's precision is matched, the original computes in full precision (one
    with an autocast of its own runs as written where the port computes in fp32, which following would change), and
    the reference is not one that takes the devices' autocast casts itself (the plain CPU: it computes half
    precision as the devices do only under an autocast it knows of before it starts, and an fp32 pair would pay for
    it)."""
    casts = device_ref in devices.DEVICE_TABLE and devices.row(device_ref).cuda_casts_under_autocast
    return together and match_amp and not casts and not _HALF_PRECISION.search(_code(original))


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
    imposed = _AUTOCAST_FLAGS.get(port_amp, "off") if plan.match_amp else "off"
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


def _own_ranks_ended(plan: PairPlan, runs: PairRuns, node: int) -> int:
    """A node other than node 0, once every side is in: how its own ranks ended on each side, and its exit code."""
    ended = {run.root.name: read_manifest(run_folders.node_dir(run.root, node))
             for run in (runs.actual, runs.ref, *runs.calibrations, *filter(None, [runs.ref_fp32]))}
    for side, manifest in ended.items():
        stdout.print(f"node {node}, {side}: {manifest.status}  {manifest.message}", markup=False)
    stderr.print(f"node 0 compares the runs: reports in {plan.out}")
    return 0 if all(manifest.status in RUN_ENDED_WELL for manifest in ended.values()) else 1


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


def judge_pair(plan: PairPlan, runs: PairRuns) -> int:
    """Compares and reports as `verify compare -o` does, plus the comparison made and the AMP effect. The verdict is
    printed first; the report files take their time after it."""
    result = compare_runs(runs.ref, runs.actual, plan.compare, runs.calibrations)
    how = _comparison_made(plan, runs)
    result.notes.insert(0, how["description"])
    result.notes += _search_path_notes(plan)
    if plan.amp_effect and runs.ref_fp32 is None:
        result.notes.append("--amp-effect: nothing to measure, the port computes in fp32")
    effect = compare_runs(runs.ref_fp32, runs.ref) if runs.ref_fp32 else None
    amp_effect = _amp_effect(effect) if effect is not None else None
    print_summary(result, stdout)
    if amp_effect is not None:
        colour = "green" if amp_effect["passed"] else "yellow"
        stdout.print(f"[bold {colour}]AMP effect (fp32 vs {runs.imposed} reference, not part of the verdict): "
                     f"{amp_effect['reason']}[/]")
    # migrate writes its checklist into <port>_report/ beside the port (its default report folder).
    migrate_reports = report_folder(plan.ported)
    made_by = {"command": list(plan.command), "ran_in": str(Path.cwd())}  # adaptation.md, made again, says the same
    if plan.adaptation:
        write_adaptation(result, plan.out, **made_by)
    write_reports(result, plan.out, plan.out, migrate_reports, plan.original.parent,
                  summary={"pair": how | {"amp_effect": amp_effect} | made_by})
    if effect is not None:
        write_reports(effect, plan.out / AMP_EFFECT)
    stderr.print(f"reports in {plan.out}")
    return result.verdict.exit_code


def _search_path_notes(plan: PairPlan) -> list[str]:
    """What each side's PYTHONPATH was where it took your folders of the other tree in its own (_in_its_tree)."""
    if plan.trees is None:
        return []
    yours = os.environ.get("PYTHONPATH", "")
    original, port = plan.trees
    return [f"{label} ran with PYTHONPATH={changed}: your PYTHONPATH's folders of {other} taken in {own}, so that it "
            "imports its own tree's modules"
            for label, own, other in (("the port", port, original), ("the reference", original, port))
            if (changed := search_path(yours, own, other)) != yours]


def _fp32_twin_words(twin: dict[str, Any]) -> str:
    """What the loss-scaler twin of an fp32 reference did, in words."""
    scaled = ("; the reference's loss was scaled as the port's GradScaler scaled it (exactly, in fp32)"
              if twin.get("twin") == "scale" else "")
    skipped = (f"; the updates the port's GradScaler skipped{_skipped_words(twin)} were skipped on the reference too, "
               "so both trained on the same updates" if twin.get("followed") else "")
    return scaled + skipped


def _comparison_made(plan: PairPlan, runs: PairRuns) -> dict[str, Any]:
    """Which comparison the pair made, for summary.json and the notes of every report."""
    twin = runs.ref.manifest.loss_scaler if "twin" in runs.ref.manifest.loss_scaler else {}
    if runs.imposed != "off":
        mode = "same-amp-imposed"
        scales = runs.ref.losses["loss_scale"].dropna()
        scaled = (f", its loss scaled by {scales.iloc[0]:g} and on as the port's GradScaler scaled it, step for step, "
                  f"skipping the updates the port skipped{_skipped_words(twin)}"
                  if twin.get("twin") == "scale" and len(scales) else "")
        description = (f"the port computes in {runs.port_amp}, so the reference ran under {runs.imposed} autocast "
                       f"imposed from outside {_where_imposed(runs.ref)} (on the CPU with the NPU's op casts)"
                       f"{scaled}: the comparison isolates the port")
    elif plan.ref_run is not None:
        mode = "given-reference"
        description = f"the reference is the given run {plan.ref_run}, compared as it is"
    elif runs.port_amp:
        mode = "amp-vs-fp32-unmatched" if runs.unmatched_amp else "amp-vs-fp32"
        why = (f"the reference could not run under the port's {_AUTOCAST_FLAGS[runs.port_amp]} autocast "
               f"({runs.unmatched_amp}; that run is kept in {run_folders.REF_UNDER_AUTOCAST}/), so it"
               if runs.unmatched_amp else "--no-match-amp: the reference")
        description = (f"{why} ran as written against a port computing in {runs.port_amp}; "
                       f"AMP noise and porting errors are judged together with the wider fp32-vs-AMP tolerances"
                       f"{_fp32_twin_words(twin)}")
    else:
        mode = "as-written"
        description = f"both scripts ran as written (the port computes in fp32){_fp32_twin_words(twin)}"
    return {"mode": mode, "description": description, "ref_autocast": "" if runs.imposed == "off" else runs.imposed}


def _where_imposed(ref: Run) -> str:
    """Where the reference's autocast was: the port's scopes it followed (verify/capture/precision_scopes.py)."""
    follow = ref.manifest.autocast_follow
    if not follow:
        return "around the whole script"
    outside = sorted(path for path, calls in follow.items() if any(state == "off" for state, _ in calls))
    shown = ", ".join(outside[:4]) + (f" and {len(outside) - 4} more" if len(outside) > 4 else "")
    exceptions = f" (not in some or all calls of {shown}, as in the port)" if outside else ""
    return "where the port computed under it" + exceptions


def _skipped_words(twin: dict[str, Any]) -> str:
    steps = twin.get("followed", [])
    return f" (step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))})" if steps else ""


def _amp_effect(effect: ComparisonResult) -> dict[str, Any]:
    """The reference in fp32 against the reference under autocast (compared by judge_pair): what AMP alone does to the
    loss curve, judged by compare's documented fp32-vs-AMP tolerances (verify/compare/tolerances.py), since one side
    computes in half precision. Its reports go into the pair's AMP_EFFECT folder."""
    loss = effect.summary()["loss"]
    return {"passed": effect.verdict.passed, "reason": effect.verdict.reason, "comparison": effect.policy.description,
            "loss_rtol": effect.loss.rtol, "max_rel_diff": loss["max_rel_diff"], "mean_rel_diff": loss["mean_rel_diff"],
            "reports": AMP_EFFECT}


def pair(
    context: typer.Context,
    original: Annotated[Path, typer.Argument(help="The original GPU script (the reference).", show_default=False)],
    ported: Annotated[Optional[Path], typer.Argument(
        help="The ported script (default: <stem>_npu.py beside ORIGINAL).", show_default=False)] = None,
    script_args: options.script_args("Both scripts' own arguments, after `--`.") = None,
    steps: options.steps("Optimizer steps each side runs.") = 20,
    seed: options.seed("The seed both sides get.") = 1234,
    device_ref: Annotated[devices.Device, typer.Option(
        help="auto: cuda when available, else EMULATED CUDA (the script's GPU code path on the CPU); cpu: the "
             "script's CPU path.")] = devices.Device.AUTO,
    device_actual: Annotated[devices.Device, typer.Option(
        help="auto: the real npu when torch_npu works here, else emulated-npu.")] = devices.Device.AUTO,
    dump: options.dump("Per-op capture on both sides.") = DumpMode.STATS,
    no_dropout: options.no_dropout("Turn every dropout off on both sides.") = False,
    no_align_random: options.no_align_random(
        "Each side's dropout masks from its device's own generator (as on real hardware without verify), not from "
        "the keyed stream both draw alike.") = False,
    exact_emulation: options.exact_emulation(
        "Emulated devices compute as the CPU does: no modelled summation order or own generator, so a faithful CPU "
        "pair agrees bit for bit (debugging).") = False,
    timeout: options.timeout("Kill a side after this many seconds.") = None,
    nproc_per_node: options.nproc_per_node(
        "Run each side as N ranks through torch.distributed.run, compared rank by rank; without it, as one "
        "process.") = None,
    emulated_devices: options.emulated_devices() = None,
    nnodes: options.nnodes() = None,
    node_rank: options.node_rank() = None,
    rdzv_endpoint: options.rdzv_endpoint(
        "HOST:PORT of torch.distributed.run's rendezvous, the same on every node: each side run at once takes a "
        "port of its own from PORT on (the port's PORT, the reference's PORT+1, each calibration run the next; "
        "default: $MASTER_ADDR:$MASTER_PORT).") = None,
    rdzv_id: options.rdzv_id() = None,
    rdzv_backend: options.rdzv_backend() = "c10d",
    rdzv_timeout: options.rdzv_timeout() = None,
    force: options.force() = False,
    loss_rtol: options.loss_rtol("Relative loss tolerance per step (default 0.01; 0.05 for fp32 against AMP).") = None,
    match_amp: Annotated[bool, typer.Option(
        help="When the port computes in fp16/bf16, run the reference under the same autocast.")] = True,
    amp_effect: Annotated[bool, typer.Option(
        "--amp-effect", help="Also run the reference in fp32 and report the AMP effect (not part of the verdict).")] = (
        False),
    ref_run: Annotated[Optional[Path], typer.Option(
        help="A reference run directory (`verify run`, an earlier pair) to use instead of running ORIGINAL.")] = (
        None),
    out: options.out("Folder for the runs and the reports (default: verify-out/STEM-TIME-RANDOM beside ORIGINAL).") = (
        None),
    quiet: options.quiet(options.QUIET_PAIRED) = False,
    verbose: options.verbose() = False,
    adaptation_report: Annotated[bool, typer.Option(
        "--adaptation-report", help="Also write adaptation.md, the report published with a ported model.")] = False,
    op_mapping: OpMappingOption = None,
    calibration_runs: options.calibration_runs(
        "Runs of the reference under another, equally valid rounding: the noise each record of the port is judged "
        "against (0: none, judged by fixed tolerances alone).") = 1,
) -> None:
    """Run ORIGINAL and PORTED for N steps each and compare them: `verify ORIGINAL [PORTED] [OPTIONS] [-- ARGS]`.

    Exit codes: 0 PASS, 1 FAIL (the reason is the verdict line), 2 usage or verify's own error, or a pair that proves
    nothing (a reference that could not run, both sides stopped before their first step); 130/143/129 stopped by
    SIGINT/SIGTERM/SIGHUP (the side running is stopped, status interrupted).
    """
    command = tuple(command_line(context, command_typed=False))  # `verify ORIGINAL PORTED`: no `pair`
    echo = echo_asked(quiet, verbose)
    out = out or run_folders.default_pair_dir(original)
    options = RunOptions(steps=steps, seed=seed, dump=dump, no_dropout=no_dropout, align_random=not no_align_random,
                         exact_emulation=exact_emulation, timeout=timeout, nproc_per_node=nproc_per_node or 0,
                         devices=emulated_devices or 0, force=force, pair=secrets.token_hex(8))
    def across_nodes() -> int:
        options.nodes = nodes.asked(nnodes, node_rank, rdzv_endpoint, rdzv_id, rdzv_backend, rdzv_timeout, out)
        return _pair(original, ported, script_args, options, device_ref.value, device_actual.value,
                     compare_options(loss_rtol, op_mapping), match_amp, amp_effect, ref_run, out, echo,
                     adaptation_report, calibration_runs, command)
    exit_with(across_nodes, f"verify {original} against {ported or default_port(original)}", out)


def _pair(original: Path, ported: Path | None, script_args: list[str] | None, options: RunOptions, device_ref: str,
          device_actual: str, compare: CompareOptions, match_amp: bool, amp_effect: bool, ref_run: Path | None,
          out: Path, echo: Echo, adaptation: bool, calibration_runs: int, command: tuple[str, ...]) -> int:
    ported = ported or default_port(original)
    for role, script in (("ORIGINAL", original), ("PORTED", ported)):
        if not script.is_file():
            raise PairError(f"{role} {script}: no such file" + (" (run `migrate` first)" if role == "PORTED" else ""))
    if amp_effect and (not match_amp or ref_run is not None):
        raise PairError("--amp-effect needs the reference run here under the port's autocast: drop "
                        + ("--no-match-amp" if not match_amp else "--ref-run"))
    check_options(options)
    if ref_run is not None:
        provenance.check_reference(ref_run, original, ported, script_args or [], options.seed, options.steps)
    together = runs_with_its_reference(ported, options, ref_run)
    if options.nodes:  # each node claims its own folder of the pair's (node 0 writes the reports beside them)
        run_folders.claim_node(out, options.nodes.node_rank)
    else:
        run_folders.claim(out)
    plan = PairPlan(original, ported, list(script_args or []), options, device_ref, devices.port_device(device_actual),
                    match_amp, amp_effect, ref_run, out, compare, adaptation, calibration_runs,
                    command, together, follows_its_port(original, device_ref, match_amp, together),
                    project_trees(original, ported))
    with adaptation_or_why_not(adaptation):
        with side_runner(echo, runs_at_once(plan)) as sides:
            runs = run_sides(plan, sides)
        if options.nodes and options.nodes.node_rank:  # node 0 compares, once every node's ranks were in
            return _own_ranks_ended(plan, runs, options.nodes.node_rank)
        return judge_pair(plan, runs)


# --- determinism (checklist C1) ------------------------------------------------------------------------------------


