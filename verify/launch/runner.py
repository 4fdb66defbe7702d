"""Runs one training script under instrumentation in a child process and leaves a run directory.

This is the only module of verify that starts processes. The parent never imports torch: it writes the initial
manifest (which is the child's whole configuration), starts `python -P -m verify.capture.bootstrap RUNDIR` in the
script's folder in a new process group, streams the script's output into output.log and to a callback, reports progress
from the manifest, enforces the timeout by killing the whole group, and finalises the manifest when the child
could not (killed, timed out, died hard).

With `nproc_per_node` N (1 or more) the child is torch's own launcher, `python -m torch.distributed.run --nproc-per-node N
--standalone`, which starts the bootstrap as N ranks (each writes RUNDIR/rankK/: verify/record/run_folders.py). The
launcher puts each rank in a session of its own, so the timeout stops each rank's group too (the pid each rank records);
the run's manifest then says how the ranks ended (verify/launch/rank_outcome.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verify import devices
from verify.launch import rank_outcome
from verify.record import run_folders
from verify.record.schema import AUTOCAST_DTYPES, LOG, DumpMode, LossScalerPlan, RunManifest, Status
from verify.errors import EmulationError, VerifyError
from verify.record.store import now_iso, read_last_collective, read_manifest, write_manifest
from verify.errors import RunDirError

_KILL_GRACE_S = 5.0
_PROGRESS_POLL_S = 0.5




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
    timeout: float | None = None
    tensor_cap_mb: float = 512.0
    extra_env: dict[str, str] = field(default_factory=dict)
    loss_scaler_plan: LossScalerPlan | None = None  # a reference following the port's GradScaler
    perturbation: dict[str, Any] = field(default_factory=dict)  # a calibration run (manifest.perturbation)
    nproc_per_node: int = 0  # ranks launched through torch.distributed.run (0: the script as one process)


def _device_and_env(script: Path, options: RunOptions) -> tuple[str, dict[str, str]]:
    """The device to record and the environment the child needs for it (verify.devices decides both)."""
    device = devices.for_script(script, options.device)
    try:
        return device, devices.child_env(device, options.emulate_on, ranks=max(1, options.nproc_per_node),
                                         exact_emulation=options.exact_emulation)
    except EmulationError as error:
        raise VerifyError(str(error)) from None


def _tool_version() -> str:
    try:
        return importlib.metadata.version("npu-port")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was not installed
        return "0+unknown"


def _check_inputs(script: Path, options: RunOptions) -> None:
    if not script.is_file():
        raise VerifyError(f"{script}: no such script")
    if options.steps < 1:
        raise VerifyError("--steps must be at least 1")
    if options.nproc_per_node < 0:
        raise VerifyError("--nproc-per-node must be at least 1")
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
        cwd=str(script.parent),
        device=device,
        emulated=devices.row(device).emulated,
        emulated_on=devices.emulated_on(device, options.emulate_on),
        seed=options.seed,
        dump_mode=options.dump.value,
        ops_regex=options.ops or "",
        tensor_cap_mb=options.tensor_cap_mb if options.dump == DumpMode.TENSOR else 0.0,
        no_dropout=options.no_dropout,
        align_random=options.align_random and not options.no_dropout,
        exact_emulation=options.exact_emulation and devices.row(device).exact_emulation_recorded,
        autocast="" if options.autocast == "off" else options.autocast,
        autocast_follow=dict(options.autocast_follow) if options.autocast != "off" else {},
        loss_scaler_plan=options.loss_scaler_plan.to_record() if options.loss_scaler_plan else {},
        perturbation=dict(options.perturbation),
        steps_requested=options.steps,
        started_at=now_iso(),
        timeout_s=options.timeout,
        nproc_per_node=options.nproc_per_node,
        world_size=max(1, options.nproc_per_node),
    )


def _command(run_dir: Path, nproc_per_node: int) -> list[str]:
    """The bootstrap, as one process or as N ranks started by torch's own launcher on this node."""
    bootstrap = [sys.executable, "-P", "-m", "verify.capture.bootstrap", str(run_dir.resolve())]
    if not nproc_per_node:
        return bootstrap
    return [sys.executable, "-P", "-m", "torch.distributed.run", "--nproc-per-node", str(nproc_per_node),
            "--standalone", "--no-python", *bootstrap]


def run_script(
    script: Path,
    args: list[str],
    options: RunOptions,
    run_dir: Path | None = None,
    on_output: Callable[[str], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> Path:
    """Runs `script args` for `options.steps` steps and returns the finished run directory (read its manifest for
    the outcome). Raises VerifyError when verify cannot do the run; everything the script does ends up in the
    manifest instead."""
    script = Path(script).resolve()
    _check_inputs(script, options)
    device, device_env = _device_and_env(script, options)
    run_dir = Path(run_dir) if run_dir is not None else run_folders.default_run_dir(script, device)
    run_folders.claim(run_dir)
    manifest = _initial_manifest(script, args, options, device)
    write_manifest(run_dir, manifest)
    calibration = {devices.BLOCKS_VAR: str(options.perturbation["blocks"])} if options.perturbation else {}
    env = {**os.environ, **device_env, **calibration, **options.extra_env, "PYTHONHASHSEED": str(options.seed)}
    env["PYTHONUNBUFFERED"] = "1"  # the script's output reaches output.log and the user as it is printed
    started = time.monotonic()
    returncode, ending = _supervise(
        _command(run_dir, options.nproc_per_node), script.parent, env, run_dir, options.timeout, on_output, on_progress,
    )
    _finalise(run_dir, returncode, ending, options.timeout, time.monotonic() - started)
    run_folders.release(run_dir)
    if ending == "interrupted":
        raise KeyboardInterrupt
    return run_dir


def _supervise(command, cwd, env, run_dir, timeout, on_output, on_progress) -> tuple[int, str]:
    """Runs the child to its end; returns its exit code and how it ended: "exited", "timeout" or "interrupted"."""
    with (run_dir / LOG).open("w", errors="replace") as log:
        child = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", bufsize=1, start_new_session=True,  # a group: the timeout kills workers too
        )
        reader = threading.Thread(target=_pump, args=(child.stdout, log, on_output), daemon=True)
        reader.start()
        try:
            ending = _wait(child, run_dir, timeout, on_progress)
        except KeyboardInterrupt:  # the child has its own session, so Ctrl-C reaches only us: end it too
            ending = "interrupted"
        if ending != "exited":
            _kill_groups(child, run_dir)
        _kill_groups(child, run_dir, ranks_only=True)  # a rank the launcher left behind
        reader.join(timeout=_KILL_GRACE_S)
    return child.returncode, ending


def _wait(child: subprocess.Popen, run_dir: Path, timeout: float | None, on_progress) -> str:
    deadline = None if timeout is None else time.monotonic() + timeout
    last_steps = -1
    while child.poll() is None:
        if deadline is not None and time.monotonic() > deadline:
            return "timeout"
        last_steps = _report_progress(run_dir, last_steps, on_progress)
        try:
            child.wait(timeout=_PROGRESS_POLL_S)
        except subprocess.TimeoutExpired:
            pass
    _report_progress(run_dir, last_steps, on_progress)
    return "exited"


def _pump(stream, log, on_output) -> None:
    for line in stream:
        log.write(line)
        log.flush()
        if on_output is not None:
            on_output(line.rstrip("\n"))


def _report_progress(run_dir: Path, last_steps: int, on_progress) -> int:
    if on_progress is None:
        return last_steps
    try:
        steps = read_manifest(run_folders.lead_dir(run_dir)).steps_completed
    except RunDirError:  # replaced atomically, so only a vanished folder gets here
        return last_steps
    if steps != last_steps:
        on_progress(steps)
    return steps


def _rank_groups(run_dir: Path) -> list[int]:
    """The process groups of the ranks still alive: torch.distributed.run starts each rank in a session of its own,
    which signalling the launcher's group does not reach."""
    groups = []
    for folder in run_folders.rank_dirs(run_dir):
        try:
            groups.append(os.getpgid(int(read_manifest(folder).extra.get("pid", 0)) or -1))
        except (RunDirError, ProcessLookupError, ValueError, TypeError):
            continue  # no pid recorded, or the rank is gone
    return groups


def _kill_groups(child: subprocess.Popen, run_dir: Path, ranks_only: bool = False) -> None:
    """SIGTERM to the child's whole group (DataLoader workers included) and to each rank's, SIGKILL if they
    linger."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        groups = _rank_groups(run_dir) + ([] if ranks_only else [child.pid])
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, sig)
        if not groups or _all_gone(child, groups):
            return


def _all_gone(child: subprocess.Popen, groups: list[int]) -> bool:
    """Whether the child has exited and no process of `groups` is left, waiting up to the grace period."""
    deadline = time.monotonic() + _KILL_GRACE_S
    while time.monotonic() < deadline:
        if child.poll() is not None and not any(_group_alive(group) for group in groups):
            return True
        time.sleep(0.05)
    return False


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _finalise(run_dir: Path, returncode: int, ending: str, timeout: float | None, wall_s: float) -> None:
    """Completes the manifest when the child could not: timed out, interrupted, killed, or dead before its end."""
    manifest = read_manifest(run_dir)
    manifest.wall_s = round(wall_s, 3)
    done = f"{manifest.steps_completed} steps completed"
    if ending == "timeout":
        manifest.status, manifest.exit_code = Status.TIMEOUT.value, returncode
        manifest.message = f"timed out after {timeout:g} s ({done})"
    elif ending == "interrupted":
        manifest.status, manifest.exit_code = Status.CRASHED.value, returncode
        manifest.message = f"interrupted by the user ({done})"
    elif manifest.status == Status.RUNNING.value:
        manifest.status, manifest.exit_code = Status.CRASHED.value, returncode
        cause = f"killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"
        manifest.message = f"the process {cause} before verify could record how it ended"
    manifest.finished_at = manifest.finished_at or now_iso()
    if folders := run_folders.rank_dirs(run_dir):
        manifest = _finalise_ranks(manifest, folders, ending, timeout)
    write_manifest(run_dir, manifest)


def _finalise_ranks(run: RunManifest, folders: list[Path], ending: str, timeout: float | None) -> RunManifest:
    """Each rank's manifest completed where its process could not (killed at the timeout, or by the launcher after
    another rank failed), and the run's manifest composed from them (verify/launch/rank_outcome.py)."""
    ranks, lasts = [], []
    for folder in folders:
        try:
            manifest = read_manifest(folder)
        except RunDirError:
            continue  # a rank killed before it wrote its manifest: the reader names it
        last = read_last_collective(folder)
        manifest = rank_outcome.stop_rank(manifest, ending, timeout, last)
        write_manifest(folder, manifest)
        ranks.append(manifest)
        lasts.append(last)
    return rank_outcome.run_manifest(run, ranks, lasts) if ranks else run
