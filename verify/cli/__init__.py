"""`verify`: prove that a ported training script trains the same as the original.

`verify ORIGINAL [PORTED] [OPTIONS] [-- SCRIPT ARGS]` (no command name: the hidden `pair` command, see
`verify pair --help`) runs the original (cuda, else EMULATED CUDA) and the port (npu, else the EMULATED NPU) for a
few steps with the same seed and args, compares them and prints the verdict: exit 0 PASS, 1 FAIL, 2 error.

Exit codes of `verify run`: 0 the requested steps ran, or the script ended by itself after at least one step
(status "short"); 1 the script failed: crashed, timed out, produced a NaN/inf loss, or made no step; 2 usage error
or verify's own error (bad option, unusable device, run directory in the way, more ranks than the machine holds).
Every command stopped by a signal stops what it started and exits 128 + its number: 130 SIGINT, 143 SIGTERM, 129
SIGHUP (its runs' status "interrupted").
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

from verify.record.schema import DumpMode, Status
from verify.errors import EXIT_ERROR, EXIT_FAILED, EXIT_OK, VerifyFailure

# Every way in (`python -m verify`, `python -m verify.cli`, a `verify` script, old ones too) imports this module: an
# interpreter without npu-port's dependencies gets one line and exit 2 here, not a traceback and exit 1, FAIL's code.
try:
    import typer
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from verify.cli import compare_cmd as compare_cli
    from verify.cli import determinism, options
    from verify.cli import pair
    from verify.devices import Device, EmulateOn
    from verify.cli.exits import exit_with
    from verify.launch import nodes
    from verify.record import run_folders
    from verify.launch.runner import RunOptions, lead_dir, run_script
    from verify.record.store import read_losses, read_manifest
    from verify.report.terminal import print_run_ended
except ModuleNotFoundError as missing:
    if (missing.name or "verify").partition(".")[0] == "verify":
        raise  # a module of verify's own: a bug, not an install step
    print(f"verify: error: {missing.name} is not installed for {sys.executable}: install npu-port with its "
          "dependencies (pip install -e . in its folder)", file=sys.stderr)
    raise SystemExit(EXIT_ERROR) from None

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

app = typer.Typer(
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_show_locals=False,
    no_args_is_help=True,
    help=__doc__,
)

_SUCCESS = {Status.OK.value, Status.SHORT.value}


class Autocast(str, Enum):
    OFF = "off"
    FP16 = "fp16"
    BF16 = "bf16"


@app.callback()
def verify() -> None:
    """Run training scripts under instrumentation and compare the runs."""


@app.command(no_args_is_help=True)
def run(
    script: Annotated[Path, typer.Argument(help="The training script, run unmodified.", show_default=False)],
    script_args: options.script_args() = None,
    steps: options.steps("Optimizer steps to run.") = 20,
    seed: options.seed("Seed for python, numpy, torch (every device) and PYTHONHASHSEED.") = 1234,
    device: options.device("auto: npu (real, else emulated) for a script importing torch_npu, else cuda (real, else "
                           "EMULATED CUDA on the CPU).") = Device.AUTO,
    emulate_on: Annotated[EmulateOn, typer.Option(help="Where the emulated NPU computes.")] = EmulateOn.CPU,
    dump: options.dump("Per-op capture: statistics, +tensors, +md5 hashes, or none.") = DumpMode.STATS,
    ops: options.ops("Tensor mode: save tensors of ops whose 'phase/module/op' matches this regex.") = None,
    tensor_cap_mb: options.tensor_cap_mb("Tensor mode: total size of saved tensors.") = 512.0,
    no_dropout: options.no_dropout() = False,
    no_align_random: options.no_align_random(
        "Dropout masks from the device's own generator, not the keyed stream every device draws alike.") = False,
    exact_emulation: options.exact_emulation(
        "An emulated device computes as the CPU does, without its device's modelled summation order and generator "
        "(bit-exact debugging).") = False,
    autocast: Annotated[Autocast, typer.Option(help="Run the whole script under torch.autocast with this dtype.")] = (
        Autocast.OFF
    ),
    timeout: options.timeout("Kill the run after this many seconds (status timeout).") = None,
    nproc_per_node: options.nproc_per_node(
        "Run the script as N ranks through torch.distributed.run (each writes RUNDIR/rankK/); without it, as one "
        "process.") = None,
    launcher: options.launcher() = None,
    emulated_devices: options.emulated_devices() = None,
    nnodes: options.nnodes() = None,
    node_rank: options.node_rank() = None,
    rdzv_endpoint: options.rdzv_endpoint() = None,
    rdzv_id: options.rdzv_id() = None,
    rdzv_backend: options.rdzv_backend() = "c10d",
    rdzv_timeout: options.rdzv_timeout() = None,
    force: options.force() = False,
    out: options.out("Run directory (default: verify-runs/SCRIPT-DEVICE-TIME-RANDOM; across nodes, one every node "
                     "sees: RUNDIR/rankR/ each rank, RUNDIR/node-K/ each node's log).") = None,
    quiet: options.quiet() = False,
) -> None:
    """Run SCRIPT for N steps under instrumentation and write a run directory.

    Exit codes: 0 ok or short (the script ended by itself after at least one step); 1 the script crashed, timed
    out, produced a NaN loss or made no step; 2 usage or verify's own error; 130/143/129 stopped by SIGINT/SIGTERM/
    SIGHUP (the run is stopped, status interrupted).
    """
    options = RunOptions(
        steps=steps, seed=seed, device=device.value, emulate_on=emulate_on.value, dump=dump, ops=ops,
        no_dropout=no_dropout, align_random=not no_align_random, exact_emulation=exact_emulation,
        autocast=autocast.value, timeout=timeout, tensor_cap_mb=tensor_cap_mb,
        nproc_per_node=nproc_per_node or 0, launcher=launcher.value if launcher else "",
        devices=emulated_devices or 0, force=force,
    )
    def across_nodes() -> int:
        options.nodes = nodes.asked(nnodes, node_rank, rdzv_endpoint, rdzv_id, rdzv_backend, rdzv_timeout, out)
        return _run(script, list(script_args or []), options, out, quiet)
    exit_with(across_nodes, f"run {script}", out)


def _run(script: Path, args: list[str], options: RunOptions, out: Path | None, quiet: bool) -> int:
    with Progress(
        TextColumn("[bold]verify run[/] {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=stderr, transient=True,
    ) as progress:
        task = progress.add_task(script.name, total=options.steps)
        run_dir = run_script(
            script, args, options, run_dir=out,
            on_output=None if quiet else lambda line: progress.console.print(line, markup=False, style="dim"),
            on_progress=lambda done: progress.update(task, completed=done, total=max(options.steps, done)),
        )
    manifest = read_manifest(run_dir)
    if manifest.verify_error:  # verify's own failure: one line, exit 2 (verify/cli/exits.py)
        raise VerifyFailure(f"{run_dir}: {manifest.verify_error}")
    print_run_ended(manifest, run_dir, _final_loss(run_dir), stderr)
    # every node shows the whole run; each exits with how its own ranks ended
    own = read_manifest(run_folders.node_dir(run_dir, options.nodes.node_rank)) if options.nodes else manifest
    return EXIT_OK if own.status in _SUCCESS else EXIT_FAILED


def _final_loss(run_dir: Path) -> str:
    losses = read_losses(lead_dir(run_dir))
    return f"{losses['loss'].iloc[-1]:.6g}" if len(losses) else "-"


# The offline commands: no torch needed (verify/cli/compare_cmd.py).
app.command("compare")(compare_cli.compare)
app.command("report")(compare_cli.report)
app.command("export")(compare_cli.export)
# The paired commands (verify/cli/pair.py, verify/cli/determinism.py); `pair` is what `verify ORIGINAL [PORTED]` runs
# (see main).
app.command(pair.PAIR_COMMAND, hidden=True, no_args_is_help=True)(pair.pair)
app.command("determinism", no_args_is_help=True)(determinism.determinism)


def main() -> None:
    app(args=pair.route(sys.argv[1:], typer.main.get_command(app)))


__all__ = ["app", "main"]
