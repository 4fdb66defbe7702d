"""Running the sides of a paired command (verify ORIGINAL PORTED, verify determinism) under one rich progress
display, one at a time or several at once, each with the same share of the cores, showing of their output what the
command was asked (`Echo`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import importlib.metadata
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from verify import devices
from verify.errors import PairError, Stopped
from verify.launch.runner import RunOptions, StopOrder, core_share, run_script, said_last
from verify.record.evidence import read_side
from verify.record.schema import LOG, MANIFEST, Status, shown
from verify.record.store import Run

stderr = Console(stderr=True, highlight=False, soft_wrap=True)

RUN_ENDED_WELL = (Status.OK.value, Status.SHORT.value)  # a side that ran its steps, or ended by itself
ENDING_LINES = 20  # the lines of output.log shown of a run that did not end well (Echo.ENDINGS)


class Echo(Enum):
    """What a paired command (the pair, `verify determinism`) shows of its scripts' output, all of which each run's
    output.log keeps: nothing (-q), the last lines of a run that did not end well (the default), or every line as
    it comes (-v)."""

    NOTHING = "nothing"
    ENDINGS = "endings"
    EVERYTHING = "everything"


@dataclass(frozen=True)
class SideRun:
    label: str
    script: Path
    args: list[str]
    options: RunOptions
    run_dir: Path


class SideRunner:
    """Runs the sides under one rich progress display (stderr), showing of their output what `echo` asks: one at a
    time (`run`) or several at once (`run_together`). Every run gets the same share of the cores, that of the most
    runs the command makes at once, so that runs going together never oversubscribe the machine and the sides compute
    with the same threads (a thread count changes how a CPU sums)."""

    def __init__(self, progress: Progress, echo: Echo, runs_at_once: int) -> None:
        self.progress = progress
        self.echo = echo
        self.threads = core_share(runs_at_once)

    def run(self, label: str, script: Path, args: list[str], options: RunOptions, run_dir: Path,
            stop_order: StopOrder | None = None) -> Run:
        task = self.progress.add_task(f"{label}: {script.name}", total=options.steps)
        echo = None if self.echo != Echo.EVERYTHING else (
            lambda line: self.progress.console.print(f"[{label}] {line}", markup=False, style="dim"))
        run_script(script, args, replace(options, threads=self.threads), run_dir, on_output=echo,
                   # past the steps asked for (while its loss scale settles) the bar's total grows with the run
                   on_progress=lambda done: self.progress.update(task, completed=done, total=max(options.steps, done)),
                   stop_order=stop_order)
        run = read_side(run_dir)
        if run.manifest.verify_error:
            raise PairError(f"{label} run: {run.manifest.verify_error}")
        self.progress.update(task, description=f"{label}: {script.name} on {device_words(run)} "
                                               f"({run.manifest.status})")
        if self.echo == Echo.ENDINGS and run.manifest.status not in RUN_ENDED_WELL:
            self._show_ending(label, run_dir / LOG, run)
        return run

    def _show_ending(self, label: str, log: Path, run: Run) -> None:
        """The last lines of a run that did not end well: of its output (every rank's, in a run of ranks), which its
        output.log keeps whole, then the traceback of what the script raised, which the capture took (its
        manifest.json keeps it)."""
        console = self.progress.console
        with contextlib.suppress(OSError):
            last = said_last(log, ENDING_LINES)
            console.print(f"[{label}] {run.manifest.status}: the last {len(last)} lines that say something of {log}:",
                          markup=False)
            for line in last:
                console.print(f"[{label}] {line}", markup=False, style="dim")
        if run.manifest.traceback:
            console.print(shown(run.manifest.traceback.rstrip(), tail=True), markup=False, style="red")

    def run_side(self, side: SideRun, stop_order: StopOrder | None = None) -> Run:
        return self.run(side.label, side.script, side.args, side.options, side.run_dir, stop_order)

    def run_together(self, runs: list[SideRun], led: bool = False) -> list[Run]:
        """The runs at once, each supervised by a thread of its own; `led`: the others start once the first has
        written its manifest (a reference reads its port's run as it goes: verify/capture/followed_port.py), and not
        where it could not start, and their scripts once it has made its first step (RunOptions.starts_after). A
        signal, which only this (the main) thread receives, stops them all, each marked interrupted, and is raised
        once they are; an error of one is raised once all have ended."""
        order = StopOrder()
        with concurrent.futures.ThreadPoolExecutor(max(1, len(runs))) as pool:
            def start(side: SideRun) -> concurrent.futures.Future:
                return pool.submit(self.run_side, replace(side, options=_own_extension_builds(side)), order)
            futures = [start(runs[0])]
            if led:
                _started(futures[0], runs[0].run_dir)
                runs = [runs[0], *(replace(side, options=replace(side.options, starts_after=runs[0].run_dir))
                                   for side in runs[1:])]
            if not futures[0].done() or futures[0].exception() is None:
                futures += [start(side) for side in runs[1:]]
            try:
                while concurrent.futures.wait(futures, timeout=0.2).not_done:
                    pass
            except (Stopped, KeyboardInterrupt) as stop:
                stopped = stop if isinstance(stop, Stopped) else Stopped(signal.SIGINT)
                order.give(stopped.signum)
                concurrent.futures.wait(futures)
                stopped.runs.extend(run_dir for future in futures if isinstance(future.exception(), Stopped)
                                    for run_dir in future.exception().runs)
                raise stopped from None
        for future in futures:
            if future.exception() is not None:
                raise future.exception()
        return [future.result() for future in futures]


def _own_extension_builds(side: SideRun) -> RunOptions:
    """A run going with others builds the torch extensions its script compiles (torch.utils.cpp_extension's load,
    load_inline) in a folder of its own: two builds of one extension in one folder at once replace each other's
    library as the other loads it. The folder is kept across commands, one per run of a pair (ref, actual,
    calibration) and torch version, so that each builds an extension once; under yours where TORCH_EXTENSIONS_DIR
    is set."""
    base = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch_extensions")
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "unknown"
    folder = os.path.join(base, f"npu-port-{side.run_dir.name}-torch{torch_version}")
    return replace(side.options, extra_env={"TORCH_EXTENSIONS_DIR": folder, **side.options.extra_env})


def _started(run: concurrent.futures.Future, run_dir: Path) -> None:
    """Waits until `run` has written its first manifest, or ended (it could not start)."""
    while not (run_dir / MANIFEST).exists() and not run.done():
        time.sleep(0.01)


@contextlib.contextmanager
def side_runner(echo: Echo, runs_at_once: int = 1) -> Iterator[SideRunner]:
    """A SideRunner for a command that makes at most `runs_at_once` runs together."""
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=stderr) as progress:
        yield SideRunner(progress, echo, runs_at_once)


def device_words(run: Run) -> str:
    return devices.title(run.manifest.device, run.manifest.emulated_on)
