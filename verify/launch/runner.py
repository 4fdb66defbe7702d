"""Runs one training script under instrumentation in a child process and leaves a run directory.

This is the only module of verify that starts processes. The parent never imports torch: it writes the initial
manifest (which is the child's whole configuration), starts `python -P -m verify.capture.bootstrap RUNDIR PID` in a
new session in the folder verify was started in, as `python SCRIPT ARGS` would run there (in the run's view of it:
verify/launch/working_folder.py), streams the script's output into output.log and to a callback, reports progress
from the manifest, enforces the timeout, and finalises the manifest when the child could not (killed, timed out,
interrupted, died hard). The child dies with the thread that started it (PID is verify's: the bootstrap sets
PR_SET_PDEATHSIG), so run_script() belongs in a thread that outlives the run, the main thread of a command.

However the child ends (by itself, at the timeout, or because verify was stopped: errors.Stopped, which the command
raises on SIGINT, SIGTERM or SIGHUP), every process it started is stopped with it (verify/launch/process_tree.py:
DataLoader workers, ranks, a `setsid` grandchild), the run directory's lock is released, and a stopped run's
manifest says `interrupted`, naming the signal, with every step recorded before it kept.

With `nproc_per_node` N (1 or more) the bootstrap runs torch's own launcher (`torch.distributed.run --nproc-per-node N
--standalone`), which starts the bootstrap again as N ranks (each writes RUNDIR/rankK/: verify/record/run_folders.py);
the run's manifest then says how the ranks ended (verify/launch/rank_outcome.py).

Defaults that protect the machine: a run without --timeout gets `default_timeout(steps)`, and more ranks than the
machine holds (`rank_limit()`: its cores, and its free memory at RANK_MEMORY_GIB a rank) are refused, whether asked
with --nproc-per-node or spawned by the script (the child checks manifest.rank_limit), unless `force`.
"""

from __future__ import annotations

import collections
import csv
import hashlib
import importlib.metadata
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verify import devices, frameworks
from verify.launch import nodes as multi_node
from verify.launch import process_tree, rank_outcome, working_folder
from verify.record import run_folders
from verify.record.schema import (AUTOCAST_DTYPES, LOG, LOSS_COLUMNS, LOSSES, DumpMode, LossScalerPlan, Nodes,
                                  LAUNCHER_KEY, RunManifest, Status, ended_by_itself)
from verify.errors import DiskFull, EmulationError, RunDirError, Stopped, VerifyError
from verify.record.store import now_iso, read_last_collective, read_manifest, space_needed, write_manifest

_PROGRESS_POLL_S = 0.5
# The default --timeout: room to start (import torch on a busy machine, build the model), then per step asked for a
# step under the capture of a small model on a CPU, many times over. A safety net against a run that never ends,
# not a measure: --timeout S sets another, --timeout 0 none.
TIMEOUT_START_S, TIMEOUT_PER_STEP_S = 300.0, 30.0
RANK_MEMORY_GIB = 0.5  # what a rank takes at least: torch and its process group, before any model
# A pair's calibration runs go at once beside its reference, each a whole run: the envelope is a maximum over them,
# which a few runs measure; more would only fill the machine.
MAX_CALIBRATION_RUNS = 8


def default_timeout(steps: int) -> float:
    return TIMEOUT_START_S + TIMEOUT_PER_STEP_S * steps


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def core_share(runs_at_once: int) -> int:
    """The threads each of `runs_at_once` runs going together gets, so that they never oversubscribe the machine;
    0 (torch's default) where the user set OMP_NUM_THREADS: their choice, and a setting that changes the numbers."""
    if "OMP_NUM_THREADS" in os.environ:
        return 0
    return max(1, _cores() // max(1, runs_at_once))


def rank_limit() -> tuple[int, str]:
    """The most ranks this machine holds, each a training process on a core of its own with RANK_MEMORY_GIB of free
    memory, and the words that say why."""
    cores = _cores()
    free_gib = _available_memory_gib()
    if free_gib is None or cores * RANK_MEMORY_GIB <= free_gib:
        return cores, f"{cores} core{'s' if cores > 1 else ''}"
    return max(1, int(free_gib / RANK_MEMORY_GIB)), f"{free_gib:.1f} GiB of free memory, {RANK_MEMORY_GIB} GiB a rank"


def _available_memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None  # not Linux: the cores alone



class StopOrder:
    """Stops runs going in other threads as a signal stops the one in the main thread: only the main thread receives
    signals (verify/cli/exits.py raises them there as errors.Stopped), so it passes them on here, and the supervisor
    of each run raises it in its own thread."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def give(self, signum: int) -> None:
        self.signum = signum

    def check(self) -> None:
        if self.signum is not None:
            raise Stopped(self.signum)


@dataclass
class RunOptions:
    steps: int = 20
    seed: int = 1234
    device: str = devices.Device.AUTO.value
    emulate_on: str = devices.EmulateOn.CPU.value
    dump: DumpMode = DumpMode.STATS
    ops: str | None = None
    no_dropout: bool = False
    align_random: bool = True
    exact_emulation: bool = False  # emulations without the devices' modelled numerics
    autocast: str = "off"
    autocast_follow: dict[str, list] = field(default_factory=dict)  # where to impose it (manifest.autocast_follow)
    timeout: float | None = None  # seconds; None: default_timeout(steps); 0: none
    tensor_cap_mb: float = 512.0
    extra_env: dict[str, str] = field(default_factory=dict)
    loss_scaler_plan: LossScalerPlan | None = None  # a reference following the port's GradScaler
    follows: Path | None = None  # a reference run at once with its port: the port's run folder (manifest.follows)
    starts_after: Path | None = None  # the run folder whose first step this run's script waits for (manifest's)
    pair: str = ""  # the pair command's id, shared by its runs (manifest.pair)
    project_root: Path | None = None  # the folder whose files the run's project_files name (None: the script's)
    # A side of a pair of scripts in two trees of one project: (its own tree, the other); PYTHONPATH's folders of the
    # other tree are taken in its own (search_path).
    trees: tuple[Path, Path] | None = None
    perturbation: dict[str, Any] = field(default_factory=dict)  # a calibration run (manifest.perturbation)
    nproc_per_node: int = 0  # ranks launched through torch.distributed.run (0: the script as one process)
    launcher: str = ""  # a framework's launcher the ranks start as (manifest.extra[LAUNCHER_KEY]; "": torchrun's)
    devices: int = 0  # devices each emulation presents (--devices; 0: one a rank, for ranks the script spawns too)
    force: bool = False  # start more ranks than the machine holds (rank_limit())
    nodes: Nodes | None = None  # this node's place in a run across several machines (None: this machine alone)
    threads: int = 0  # the run's share of the cores (core_share()), split among its ranks; 0: torch's default

    def __post_init__(self) -> None:
        if self.launcher and not self.nproc_per_node:  # a framework's launcher starts one rank at the least
            self.nproc_per_node = 1

    @property
    def device_count(self) -> int:
        """The devices an emulation presents: --devices, else one a rank --nproc-per-node launches."""
        return self.devices or max(1, self.nproc_per_node)

    @property
    def timeout_s(self) -> float | None:
        """The timeout the run gets: --timeout, else the default for the steps asked; None for --timeout 0."""
        if self.timeout is None:
            return default_timeout(self.steps)
        return self.timeout or None


def _device_and_env(script: Path, options: RunOptions) -> tuple[str, dict[str, str]]:
    """The device to record and the environment the child needs for it (verify.devices decides both)."""
    device = devices.for_script(script, options.device)
    try:
        return device, devices.child_env(device, options.emulate_on, device_count=options.device_count,
                                         exact_emulation=options.exact_emulation)
    except EmulationError as error:
        raise VerifyError(str(error)) from None


def _tool_version() -> str:
    try:
        return importlib.metadata.version("npu-port")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was not installed
        return "0+unknown"


# The frameworks' launchers a run's ranks may start as (--launcher), besides torchrun
LAUNCHERS = tuple(sorted(frameworks.LAUNCHERS))


def check_options(options: RunOptions) -> None:
    """VerifyError naming the option where a run could not be made with these options (the bounds the command line
    checks too, for callers of run_script, and what depends on the machine); commands call it before anything runs."""
    if reason := devices.unsupported_torch():
        raise VerifyError(reason)
    if options.steps < 1:
        raise VerifyError("--steps must be at least 1")
    if not 0 <= options.seed < 2**32:  # the child's PYTHONHASHSEED: Python refuses any other
        raise VerifyError(f"--seed must be between 0 and {2**32 - 1}")
    if options.nproc_per_node < 0:
        raise VerifyError("--nproc-per-node must be at least 1")
    if options.launcher not in ("", *LAUNCHERS):
        raise VerifyError(f"--launcher {options.launcher}: verify knows {', '.join(LAUNCHERS)}")
    if options.nodes and not options.nproc_per_node:
        raise VerifyError("--nnodes needs --nproc-per-node: the ranks torch.distributed.run starts on each node")
    if options.devices < 0:
        raise VerifyError("--devices must be at least 1")
    if options.timeout is not None and options.timeout < 0:
        raise VerifyError("--timeout must be 0 (none) or more seconds")
    limit, why = rank_limit()
    if options.nproc_per_node > limit and not options.force:
        raise VerifyError(f"--nproc-per-node {options.nproc_per_node} asks for more training processes than this "
                          f"machine holds ({why}): use at most {limit}, or add --force to start them anyway")
    if options.device not in devices.DEVICES:
        raise VerifyError(f"--device must be one of {', '.join(devices.DEVICES)}")
    if options.autocast not in ("off", *AUTOCAST_DTYPES):
        raise VerifyError(f"--autocast must be one of off, {', '.join(AUTOCAST_DTYPES)}")
    if options.ops:
        try:
            re.compile(options.ops)
        except re.error as error:
            raise VerifyError(f"--ops is not a valid regular expression: {error}") from None


def _initial_manifest(script: Path, args: list[str], options: RunOptions, device: str) -> RunManifest:
    return RunManifest(
        tool_version=_tool_version(),
        script=str(script),
        script_sha256=hashlib.sha256(script.read_bytes()).hexdigest(),
        argv=list(args),
        cwd=os.getcwd(),  # where `python SCRIPT ARGS` would run: the script's relative paths lead from it
        device=device,
        emulated=devices.row(device).emulated,
        emulated_on=devices.emulated_on(device, options.emulate_on),
        seed=options.seed,
        backward_calls=0,  # counted by the child's step recorder
        dump_mode=options.dump.value,
        ops_regex=options.ops or "",
        tensor_cap_mb=options.tensor_cap_mb if options.dump == DumpMode.TENSOR else 0.0,
        no_dropout=options.no_dropout,
        align_random=options.align_random and not options.no_dropout,
        exact_emulation=options.exact_emulation and devices.row(device).exact_emulation_recorded,
        autocast="" if options.autocast == "off" else options.autocast,
        autocast_follow=dict(options.autocast_follow) if options.autocast != "off" else {},
        loss_scaler_plan=options.loss_scaler_plan.to_record() if options.loss_scaler_plan else {},
        follows=str(options.follows.resolve()) if options.follows else "",
        starts_after=str(options.starts_after.resolve()) if options.starts_after else "",
        pair=options.pair,
        project_root=str(options.project_root.resolve()) if options.project_root else "",
        perturbation=dict(options.perturbation),
        steps_requested=options.steps,
        started_at=now_iso(),
        timeout_s=options.timeout_s,
        nproc_per_node=options.nproc_per_node,
        rank_limit=0 if options.force else rank_limit()[0],
        world_size=max(1, options.nproc_per_node) * (options.nodes.nnodes if options.nodes else 1),
        node=options.nodes.node_rank if options.nodes else 0,
        nodes=options.nodes.to_record() if options.nodes else {},
        threads=max(1, options.threads // max(1, options.nproc_per_node)) if options.threads else 0,
        extra=({"devices": options.devices} if options.devices else {})
        | ({LAUNCHER_KEY: options.launcher} if options.launcher else {}),
    )


def _command(run_dir: Path) -> list[str]:
    """The bootstrap (which starts the ranks itself where the manifest asks for some), dying with this process."""
    return [sys.executable, "-P", "-m", "verify.capture.bootstrap", str(run_dir.resolve()), str(os.getpid())]


def run_script(
    script: Path,
    args: list[str],
    options: RunOptions,
    run_dir: Path | None = None,
    on_output: Callable[[str], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
    stop_order: StopOrder | None = None,
) -> Path:
    """Runs `script args` for `options.steps` steps and returns the finished run directory (read its manifest for
    the outcome). Raises VerifyError when verify cannot do the run; everything the script does ends up in the
    manifest instead. Raises errors.Stopped (a KeyboardInterrupt becomes Stopped(SIGINT)) when verify was stopped
    during the run, once the run is stopped and its manifest says so; run in another thread than the main one, it is
    stopped so by `stop_order`."""
    script = Path(script).resolve()
    if not script.is_file():
        raise VerifyError(f"{script}: no such script")
    _recordable(script)
    check_options(options)
    device, device_env = _device_and_env(script, options)
    run_dir = Path(run_dir) if run_dir is not None else run_folders.default_run_dir(script, device)
    whole = run_dir  # across several machines: the run every node writes, of which this node claims its own folder
    run_dir = run_folders.claim_node(whole, options.nodes.node_rank) if options.nodes else run_folders.claim(run_dir)
    try:
        manifest = _initial_manifest(script, args, options, device)
        view = working_folder.make((manifest.files_root, Path(manifest.cwd)), run_dir / working_folder.FOLDER)
        manifest.working_folder = view.record()
        write_manifest(run_dir, manifest)
        calibration = {devices.BLOCKS_VAR: str(options.perturbation["blocks"])} if options.perturbation else {}
        env = {**os.environ, **device_env, **calibration, **options.extra_env, "PYTHONHASHSEED": str(options.seed)}
        if options.trees is not None and "PYTHONPATH" in env:
            env["PYTHONPATH"] = search_path(env["PYTHONPATH"], *options.trees)
        if "PYTHONPATH" in env:  # the project's folders as the script sees them: in its view; verify's where it lies
            env["PYTHONPATH"] = os.pathsep.join(
                manifest.seen_by_script(os.path.abspath(entry)) if entry and not working_folder.holds_verify(entry)
                else entry for entry in env["PYTHONPATH"].split(os.pathsep))
        env["PYTHONUNBUFFERED"] = "1"  # the script's output reaches output.log and the user as it is printed
        env["PWD"] = manifest.running_cwd  # as a shell says there: a script may build its paths from $PWD
        started = time.monotonic()
        returncode, ending, stopped = _supervise(_command(run_dir), manifest.running_cwd, env, run_dir,
                                                 options.timeout_s, on_output, on_progress, stop_order)
        _finalise(run_dir, returncode, ending, options.timeout_s, time.monotonic() - started, stopped,
                  working_folder.settle(view))
    finally:
        run_folders.release(run_dir)
    if stopped is not None:
        stopped.runs.append(run_dir)
        raise stopped
    return multi_node.joined(whole, options.nodes) if options.nodes else run_dir


def _recordable(script: Path) -> None:
    """VerifyError where the script's path cannot be recorded: a run directory holds paths as UTF-8 text (the
    manifest, ops.source), and a name with a byte that is no UTF-8 (`caf\xe9.py`, written under another locale) has
    none; refused before anything runs, for verify failed at the first step's records."""
    try:
        str(script).encode("utf-8")
    except UnicodeEncodeError:
        raise VerifyError(f"{os.fsencode(script)!r}: verify records paths as UTF-8 text, and this path holds a byte "
                          "that is not UTF-8 (a name written under another locale): rename it") from None


def search_path(entries: str, own: Path, other: Path) -> str:
    """A PYTHONPATH with each folder of the `other` tree taken in the `own` one, where that has it."""
    def taken(entry: str) -> str:
        path = Path(entry).resolve() if entry else None
        if path is None or not path.is_relative_to(other) or not (own / path.relative_to(other)).is_dir():
            return entry
        return str(own / path.relative_to(other))
    return os.pathsep.join(taken(entry) for entry in entries.split(os.pathsep))


def _supervise(command, cwd, env, run_dir, timeout, on_output, on_progress,
               stop_order: StopOrder | None) -> tuple[int, str, Stopped | None]:
    """Runs the child to its end, then stops whatever it left running; returns its exit code, how it ended
    ("exited", "timeout" or "interrupted") and, when verify was stopped, the Stopped to raise once the run is
    finalised."""
    token = secrets.token_hex(8)  # every process of this run inherits it (process_tree.TOKEN_VAR)
    stopped = None
    with (run_dir / LOG).open("w", errors="replace") as log:
        try:
            with process_tree.signals_held():  # a signal while the child starts is raised once it is watched
                child = subprocess.Popen(
                    command, cwd=cwd, env={**env, process_tree.TOKEN_VAR: token}, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1,
                    start_new_session=True,  # Ctrl-C in the terminal reaches verify alone, which stops the child
                )
                pump = _LogPump(child.stdout, log, on_output)
                reader = threading.Thread(target=pump.run, daemon=True)
                reader.start()
            ending = _wait(child, run_dir, timeout, on_progress, stop_order, pump)
        except (Stopped, KeyboardInterrupt) as stop:
            ending, stopped = "interrupted", stop if isinstance(stop, Stopped) else Stopped(signal.SIGINT)
        with process_tree.signals_held():  # a signal now is raised once everything is stopped
            process_tree.stop(child, token)  # after a run that ended by itself too: what it left (a rank, a helper)
        reader.join(timeout=process_tree.GRACE_S)
    if pump.full is not None:  # the child is stopped: nothing else writes the manifest
        _record_verify_error(run_dir, pump.full)
    return child.returncode, ending, stopped


def _record_verify_error(run_dir: Path, error: DiskFull) -> None:
    manifest = read_manifest(run_dir)
    manifest.verify_error = manifest.verify_error or str(error)
    write_manifest(run_dir, manifest)


def _wait(child: subprocess.Popen, run_dir: Path, timeout: float | None, on_progress,
          stop_order: StopOrder | None, pump: "_LogPump") -> str:
    deadline = None if timeout is None else time.monotonic() + timeout
    last_steps = -1
    while child.poll() is None:
        if stop_order is not None:
            stop_order.check()
        if pump.full is not None:  # verify cannot record the run: stopped at once, and exit 2 (DiskFull)
            return "exited"
        if deadline is not None and time.monotonic() > deadline:
            return "timeout"
        last_steps = _report_progress(run_dir, last_steps, on_progress)
        try:
            child.wait(timeout=_PROGRESS_POLL_S)
        except subprocess.TimeoutExpired:
            pass
    _report_progress(run_dir, last_steps, on_progress)
    return "exited"


class _LogPump:
    """The child's output into output.log and to `on_output`, line by line. A log that cannot be written for want of
    space (`full`: the supervisor then stops the run) is written no more, and the pipe is still drained, so that the
    child never blocks on it."""

    def __init__(self, stream, log, on_output) -> None:
        self.stream, self.log, self.on_output = stream, log, on_output
        self.full: DiskFull | None = None

    def run(self) -> None:
        for line in self.stream:
            if self.full is None:
                try:
                    with space_needed(Path(self.log.name)):
                        self.log.write(line)
                        self.log.flush()
                except DiskFull as error:
                    self.full = error
            if self.on_output is not None:
                self.on_output(line.rstrip("\n"))


def _report_progress(run_dir: Path, last_steps: int, on_progress) -> int:
    if on_progress is None:
        return last_steps
    try:
        steps = read_manifest(lead_dir(run_dir)).steps_completed
    except RunDirError:  # replaced atomically, so only a vanished folder gets here
        return last_steps
    if steps != last_steps:
        on_progress(steps)
    return steps


def _finalise(run_dir: Path, returncode: int, ending: str, timeout: float | None, wall_s: float,
              stopped: Stopped | None, written: dict[str, Any] | None = None) -> None:
    """Completes the manifest when the child could not: timed out, interrupted, killed, or dead before its end; and
    says what the run wrote in its working folder (`written`: working_folder.settle)."""
    manifest = read_manifest(run_dir)
    manifest.wall_s = round(wall_s, 3)
    if manifest.status == Status.RUNNING.value:  # stopped from outside: it may have died between a step and its count
        manifest.steps_completed = max(manifest.steps_completed, _steps_with_losses(run_dir))
    done = f"{manifest.steps_completed} steps completed"
    folders = own_rank_dirs(run_dir, manifest)
    if ending == "timeout":
        manifest.status, manifest.exit_code = Status.TIMEOUT.value, returncode
        manifest.message = f"timed out after {timeout:g} s ({done})"
    elif stopped is not None:
        manifest.status, manifest.exit_code = Status.INTERRUPTED.value, returncode
        manifest.message = f"interrupted: verify was stopped by {stopped.signal_name} ({done})"
    elif manifest.status == Status.RUNNING.value and returncode == 0 and not folders:
        # the script ended its process itself (os._exit(0)) before the bootstrap could write how: ended, not crashed
        status, words = ended_by_itself(manifest.steps_completed, manifest.steps_requested,
                                        len(manifest.skipped_steps))
        manifest.status, manifest.exit_code = status.value, 0
        manifest.message = f"{words} (its process exited with code 0 before verify could record how it ended)"
    elif manifest.status == Status.RUNNING.value:
        manifest.status, manifest.exit_code = Status.CRASHED.value, returncode
        cause = f"killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"
        manifest.message = f"the process {cause} before verify could record how it ended"
    manifest.finished_at = manifest.finished_at or now_iso()
    if manifest.status == Status.NO_STEPS.value:
        manifest.message += _last_output_words(run_dir / LOG)
    if folders:
        manifest = _finalise_ranks(manifest, folders, ending, timeout, stopped)
    manifest.working_folder.update(written or {})
    write_manifest(run_dir, manifest)


def lead_dir(run_dir: Path) -> Path:
    """The folder whose records stand for the run where one is read (progress, the final loss): its lowest rank's
    (on this node, for a node's folder of a run across several machines), else the run directory itself."""
    return (own_rank_dirs(run_dir, read_manifest(run_dir)) or [Path(run_dir)])[0]


def own_rank_dirs(run_dir: Path, manifest: RunManifest) -> list[Path]:
    """The folders of the ranks this run started: all of the run's, or across several machines, those of this node
    (their manifests name it)."""
    if manifest.nodes:
        return multi_node.rank_dirs_of(run_folders.ranks_home(run_dir, True), manifest.node)
    return run_folders.rank_dirs(run_dir)


def _steps_with_losses(run_dir: Path) -> int:
    """How many steps losses.csv holds whole rows of: a child killed after writing a step's records and before its
    manifest counted it recorded that step all the same."""
    try:
        with (run_dir / LOSSES).open(newline="") as file:
            rows = list(csv.reader(file))[1:]
    except (OSError, csv.Error):
        return 0
    return len({row[0] for row in rows if len(row) == len(LOSS_COLUMNS)})


_LAST_LINES = 3
_EMULATION_BANNER = "npu-port: "  # what an emulation prints when it starts (verify/devices/emulated): not the script
# Output that speaks of devices: a script that found fewer than it wants may have stopped for it (--devices N).
_MENTIONS_DEVICES = re.compile(r"\b(gpus?|cuda|npus?|devices?|accelerators?)\b", re.IGNORECASE)


def said_last(log: Path, count: int) -> list[str]:
    """The last `count` lines of a run's output that say something: not blank, not an emulation's banner, not a
    framework's drawing (a logo, a table's rules: Lightning prints both), whose characters are mostly not letters or
    digits."""
    with log.open(errors="replace") as lines:
        return list(collections.deque((line.rstrip() for line in lines if _says_something(line)), maxlen=count))


def _says_something(line: str) -> bool:
    drawn = line.strip()
    letters = sum(character.isalnum() for character in drawn)
    return letters >= 3 and letters >= len(drawn.replace(" ", "")) / 2 and not drawn.startswith(_EMULATION_BANNER)


def _last_output_words(log: Path) -> str:
    """What a script that ended without a step said last (it may say why; "" where it said nothing), and --devices
    where it speaks of devices."""
    lines = [line.strip() for line in said_last(log, _LAST_LINES)]
    if not lines:
        return ""
    words = f"; its last output: {' | '.join(repr(line) for line in lines)}"
    if any(_MENTIONS_DEVICES.search(line) for line in lines):
        words += " (it speaks of devices: --devices N presents N emulated devices)"
    return words


def _finalise_ranks(run: RunManifest, folders: list[Path], ending: str, timeout: float | None,
                    stopped: Stopped | None) -> RunManifest:
    """Each rank's manifest completed where its process could not (killed at the timeout, or by the launcher after
    another rank failed), and the run's manifest composed from them (verify/launch/rank_outcome.py)."""
    ranks, lasts = [], []
    for folder in folders:
        try:
            manifest = read_manifest(folder)
        except RunDirError:
            continue  # a rank killed before it wrote its manifest: the reader names it
        last = read_last_collective(folder)
        manifest = rank_outcome.stop_rank(manifest, ending, timeout, last, stopped.signal_name if stopped else "")
        write_manifest(folder, manifest)
        ranks.append(manifest)
        lasts.append(last)
    return rank_outcome.run_manifest(run, ranks, lasts) if ranks else run
