"""The options that `verify run`, the pair (`verify ORIGINAL [PORTED]`), `verify determinism` and `verify compare`
share, and every option with a range, each spelt once: its flags, its type and its bounds, which Typer checks before
anything runs (exit 2 naming the option). What depends on the machine or on other options (the rank limit, --ops's
regex) is checked by `verify/launch/runner.py` `check_options()`, which each command calls before it claims a
folder. A command names the help that says what the option does there (to one run, to each side, to both runs), so
`steps: options.steps("Optimizer steps to run.") = 20`; the default stays with the command, as Typer wants it beside
the parameter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from verify.devices import Device
from verify.launch.runner import MAX_CALIBRATION_RUNS, RANK_MEMORY_GIB, TIMEOUT_PER_STEP_S, TIMEOUT_START_S
from verify.record.schema import DumpMode

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


def timeout(help: str) -> Any:
    return Annotated[Optional[float], typer.Option(
        "--timeout", min=0, show_default=False,
        help=f"{help} Default: {TIMEOUT_START_S:g} s + {TIMEOUT_PER_STEP_S:g} s a step asked; 0: none.")]


def force(help: str = "Start more ranks than this machine holds (its cores, its free memory at "
                      f"{RANK_MEMORY_GIB:g} GiB a rank), which verify otherwise refuses.") -> Any:
    return Annotated[bool, typer.Option("--force", help=help)]


def nproc_per_node(help: str) -> Any:
    return Annotated[Optional[int], typer.Option("--nproc-per-node", min=1, help=help, show_default=False)]


def out(help: str) -> Any:
    return Annotated[Optional[Path], typer.Option("--out", "-o", help=help)]


def quiet(help: str = "Do not echo the script's output.") -> Any:
    return Annotated[bool, typer.Option("--quiet", "-q", help=help)]


def loss_rtol(help: str) -> Any:
    return Annotated[Optional[float], typer.Option("--loss-rtol", min=0, help=help, show_default=False)]


def calibration_runs(help: str) -> Any:
    return Annotated[int, typer.Option("--calibration-runs", min=0, max=MAX_CALIBRATION_RUNS, help=help)]


def max_rows(help: str) -> Any:
    return Annotated[int, typer.Option("--max-rows", min=0, help=help)]


def ops(help: str) -> Any:
    return Annotated[Optional[str], typer.Option("--ops", help=help)]


def tensor_cap_mb(help: str) -> Any:
    return Annotated[float, typer.Option("--tensor-cap-mb", min=0, help=help)]
