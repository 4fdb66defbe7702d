"""The options that `verify run`, the pair (`verify ORIGINAL [PORTED]`), `verify determinism` and `verify compare`
share, and every option with a range, each spelt once: its flags, its type and its bounds, which Typer checks before
anything runs (exit 2 naming the option). What depends on the machine or on other options (the rank limit, --ops's
regex) is checked by `verify/launch/runner.py` `check_options()`, which each command calls before it claims a
folder. A command names the help that says what the option does there (to one run, to each side, to both runs), so
`steps: options.steps("Optimizer steps to run.") = 20`; the default stays with the command, as Typer wants it beside
the parameter.
"""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from verify.devices import Device
from verify.pair.sides import Echo
from verify.launch.runner import (LAUNCHERS, MAX_CALIBRATION_RUNS, RANK_MEMORY_GIB, TIMEOUT_PER_STEP_S,
                                  TIMEOUT_START_S)
from verify.record.schema import DEFAULT_JOIN_TIMEOUT_S, DumpMode

def script_args(help: str = "The script's own arguments, after `--`.") -> Any:
    return Annotated[Optional[list[str]], typer.Argument(help=help, show_default=False)]


def steps(help: str) -> Any:
    return Annotated[int, typer.Option("--steps", "-n", min=1, help=help)]


# The child takes the seed as PYTHONHASHSEED too, which Python accepts from 0 to 2**32 - 1 only: a seed outside it is
# refused here, before anything runs, rather than read as the script's crash.
SEED_RANGE = (0, 2**32 - 1)


def seed(help: str) -> Any:
    return Annotated[int, typer.Option("--seed", min=SEED_RANGE[0], max=SEED_RANGE[1], help=help)]


def device(help: str) -> Any:
    return Annotated[Device, typer.Option("--device", help=help)]


def dump(help: str) -> Any:
    return Annotated[DumpMode, typer.Option("--dump", help=help)]


def no_dropout(help: str = "Turn every dropout off.") -> Any:
    return Annotated[bool, typer.Option("--no-dropout", help=help)]


def no_align_random(help: str) -> Any:
    return Annotated[bool, typer.Option("--no-align-random", help=help)]


def exact_emulation(help: str) -> Any:
    return Annotated[bool, typer.Option("--exact-emulation", help=help)]


def _a_number(value: float | None) -> float | None:
    """NaN is no bound: the click of typer's lowest version lets it through min=0 (it compares False both ways)."""
    if value is not None and math.isnan(value):
        raise typer.BadParameter("nan is not a number of seconds or a tolerance")
    return value


def timeout(help: str) -> Any:
    return Annotated[Optional[float], typer.Option(
        "--timeout", min=0, show_default=False, callback=_a_number,
        help=f"{help} Default: {TIMEOUT_START_S:g} s + {TIMEOUT_PER_STEP_S:g} s a step asked; 0: none.")]


def force(help: str = "Start more ranks than this machine holds (its cores, its free memory at "
                      f"{RANK_MEMORY_GIB:g} GiB a rank), which verify otherwise refuses.") -> Any:
    return Annotated[bool, typer.Option("--force", help=help)]


def nproc_per_node(help: str) -> Any:
    return Annotated[Optional[int], typer.Option("--nproc-per-node", min=1, help=help, show_default=False)]


Launcher = Enum("Launcher", {name: name for name in LAUNCHERS}, type=str)  # --launcher's choices


def launcher(help: str = "Start the ranks as this framework's launcher does: `deepspeed` adds --local_rank=K to each "
                          "rank's arguments, as `deepspeed --num_gpus N SCRIPT ARGS` does (default: as torchrun "
                          "does; implies --nproc-per-node 1 where it is not given).") -> Any:
    return Annotated[Optional[Launcher], typer.Option("--launcher", help=help, show_default=False)]


def nnodes(help: str = "Run across N machines (nodes), each running this command with its own --node-rank and the "
                        "same -o on a filesystem they all share (default: $SLURM_NNODES, else this machine alone).") -> Any:
    return Annotated[Optional[int], typer.Option("--nnodes", min=1, help=help, show_default=False)]


def node_rank(help: str = "This node's number, from 0 (default: $SLURM_NODEID); node 0 writes the run's manifest "
                          "once every node's ranks are in.") -> Any:
    return Annotated[Optional[int], typer.Option("--node-rank", min=0, help=help, show_default=False)]


def rdzv_endpoint(help: str = "HOST:PORT of torch.distributed.run's rendezvous, the same on every node (default: "
                              "$MASTER_ADDR:$MASTER_PORT).") -> Any:
    return Annotated[Optional[str], typer.Option("--rdzv-endpoint", help=help, show_default=False)]


def rdzv_id(help: str = "The rendezvous's id, the same on every node (default: $SLURM_JOB_ID, else the -o folder's "
                        "name).") -> Any:
    return Annotated[Optional[str], typer.Option("--rdzv-id", help=help, show_default=False)]


def rdzv_backend(help: str = "The rendezvous's backend (torchrun's c10d store).") -> Any:
    return Annotated[str, typer.Option("--rdzv-backend", help=help)]


def rdzv_timeout(help: str = "Seconds to wait for every node to join (torchrun's join_timeout), and for every node "
                             f"to end once this one did: a node that never does is named, exit 2. Default: "
                             f"{DEFAULT_JOIN_TIMEOUT_S:g}.") -> Any:
    return Annotated[Optional[float], typer.Option("--rdzv-timeout", min=0, help=help, show_default=False,
                                                   callback=_a_number)]


def emulated_devices(help: str = (
        "Each emulated device presents N devices, all computing on the CPU (device_count(), set_device(i), cuda:i/"
        "npu:i), for a script that checks for N GPUs and starts its own ranks (mp.spawn, mp.Process), each captured "
        "into RUNDIR/rankK/. Default: one, or one a rank --nproc-per-node launches.")) -> Any:
    return Annotated[Optional[int], typer.Option("--devices", min=1, help=help, show_default=False)]


def out(help: str) -> Any:
    return Annotated[Optional[Path], typer.Option("--out", "-o", help=help)]


def quiet(help: str = "Do not echo the script's output.") -> Any:
    return Annotated[bool, typer.Option("--quiet", "-q", help=help)]


QUIET_PAIRED = "Show nothing of the scripts' output, not even the last lines of a run that did not end well."


def verbose(help: str = "Echo the scripts' output as they run (by default each run's goes to its output.log, and "
                        "a run that did not end well shows its last lines).") -> Any:
    return Annotated[bool, typer.Option("--verbose", "-v", help=help)]


def echo_asked(quiet: bool, verbose: bool) -> Echo:
    if quiet and verbose:
        raise typer.BadParameter("--quiet and --verbose say the opposite: give one of them")
    return Echo.NOTHING if quiet else Echo.EVERYTHING if verbose else Echo.ENDINGS


def loss_rtol(help: str) -> Any:
    return Annotated[Optional[float], typer.Option("--loss-rtol", min=0, help=help, show_default=False,
                                                   callback=_a_number)]


def calibration_runs(help: str) -> Any:
    return Annotated[int, typer.Option("--calibration-runs", min=0, max=MAX_CALIBRATION_RUNS, help=help)]


def max_rows(help: str) -> Any:
    return Annotated[int, typer.Option("--max-rows", min=0, help=help)]


def ops(help: str) -> Any:
    return Annotated[Optional[str], typer.Option("--ops", help=help)]


def tensor_cap_mb(help: str) -> Any:
    return Annotated[float, typer.Option("--tensor-cap-mb", min=0, help=help)]


def command_line(context: typer.Context, command_typed: bool = True) -> list[str]:
    """The running command as a person would type it again (for a report): `verify`, the command's name where it is
    typed (the pair's is not), its arguments, each option that differs from its default, then `--` and the script's
    arguments, as the parser read them."""
    words, script_args = ["verify", context.info_name] if command_typed else ["verify"], []
    for param in context.command.params:
        value = context.params.get(param.name)
        if param.name == "script_args":
            script_args = [str(arg) for arg in value or ()]
        elif value is None or value == () or value == param.default:
            continue
        elif param.param_type_name == "argument":
            words.append(_word(value))
        elif isinstance(value, bool):
            words.append(param.opts[0] if value else param.secondary_opts[0])
        else:  # an option given several times (--op-mapping) once per value
            for item in value if isinstance(value, (list, tuple)) else [value]:
                words += [param.opts[0], _word(item)]
    return words + (["--", *script_args] if script_args else [])


def _word(value: Any) -> str:
    return str(value.value if isinstance(value, Enum) else value)
