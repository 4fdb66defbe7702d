"""`verify ORIGINAL [PORTED] [options] [-- SCRIPT ARGS]`: both runs and their comparison in one go, the original
(cuda, else EMULATED CUDA) against the port (npu, else the EMULATED NPU), same seed, steps and args; verdict; reports.

Typer cannot mix a default command with subcommands, so `route()` (called by verify/cli/'s main) sends a command
line whose first word is neither a command nor an option to the hidden `pair` command.

This module parses the command line and prints; the pair itself (what it runs, in which order, and how its precision
is matched) is verify/pair/'s.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from verify import devices
import verify.cli.options as options  # `from verify.cli import` would import the package, which imports this module
from verify.cli.compare_cmd import OpMappingOption, compare_options
from verify.cli.exits import exit_with
from verify.cli.options import command_line, echo_asked
from verify.contract.files import port_name
from verify.launch import nodes
from verify.launch.runner import RunOptions
from verify.pair.judge import compare_pair, write_pair_reports
from verify.pair.plan import PairPlan, planned, runs_at_once
from verify.pair.run import PairRuns, own_ranks_ended, run_sides
from verify.pair.sides import RUN_ENDED_WELL, Echo, side_runner
from verify.record import run_folders
from verify.record.schema import DumpMode
from verify.report.adaptation import adaptation_or_why_not
from verify.report.terminal import print_summary

PAIR_COMMAND = "pair"

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


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


def default_port(original: Path) -> Path:
    """What `migrate ORIGINAL` writes beside it (contract.files.port_name: <stem>_npu.py)."""
    return port_name(original)


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
    launcher: options.launcher() = None,
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
                         exact_emulation=exact_emulation, timeout=timeout,
                         nproc_per_node=nproc_per_node or 0,
                         launcher=launcher.value if launcher else "",
                         devices=emulated_devices or 0, force=force, pair=secrets.token_hex(8))
    def across_nodes() -> int:
        options.nodes = nodes.asked(nnodes, node_rank, rdzv_endpoint, rdzv_id, rdzv_backend, rdzv_timeout, out)
        return _pair(PairPlan(original, ported or default_port(original), list(script_args or []), options,
                              device_ref.value, device_actual.value, match_amp, amp_effect, ref_run, out,
                              compare_options(loss_rtol, op_mapping), adaptation_report, calibration_runs, command),
                     echo)
    exit_with(across_nodes, f"verify {original} against {ported or default_port(original)}", out)


def _pair(asked: PairPlan, echo: Echo) -> int:
    """The pair planned, run and judged (by node 0 across machines: another node says how its own ranks ended)."""
    plan = planned(asked)
    with adaptation_or_why_not(plan.adaptation):
        with side_runner(echo, runs_at_once(plan)) as sides:
            runs = run_sides(plan, sides)
        if plan.options.nodes and plan.options.nodes.node_rank:  # node 0 compares, once every node's ranks were in
            return _own_ranks_ended(plan, runs, plan.options.nodes.node_rank)
        return judge_pair(plan, runs)


def judge_pair(plan: PairPlan, runs: PairRuns) -> int:
    """Compares and reports as `verify compare -o` does, plus the comparison made and the AMP effect. The verdict is
    printed first; the report files take their time after it."""
    compared = compare_pair(plan, runs)
    print_summary(compared.result, stdout)
    if compared.amp_effect is not None:
        colour = "green" if compared.amp_effect["passed"] else "yellow"
        stdout.print(f"[bold {colour}]AMP effect (fp32 vs {runs.imposed} reference, not part of the verdict): "
                     f"{compared.amp_effect['reason']}[/]")
    write_pair_reports(plan, compared)
    stderr.print(f"reports in {plan.out}")
    return compared.result.verdict.exit_code


def _own_ranks_ended(plan: PairPlan, runs: PairRuns, node: int) -> int:
    """A node other than node 0, once every side is in: how its own ranks ended on each side, and its exit code."""
    ended = own_ranks_ended(runs, node)
    for side, manifest in ended.items():
        stdout.print(f"node {node}, {side}: {manifest.status}  {manifest.message}", markup=False)
    stderr.print(f"node 0 compares the runs: reports in {plan.out}")
    return 0 if all(manifest.status in RUN_ENDED_WELL for manifest in ended.values()) else 1
