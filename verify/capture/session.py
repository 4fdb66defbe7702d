"""The instrumentation around one process's training: the device set up, every generator seeded, the step recorder
and the op capture installed, the script's body run, and the final manifest written. The bootstrap
(verify/capture/bootstrap.py) runs it around the script; in ranks the script spawns itself, `CapturedRank` runs it
around the script's function.

The child's own exit status means nothing: the final manifest says how the run ended (manifest.verify_error
non-empty: verify itself failed, not the script).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import platform
import random
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verify.devices import setup as device_setup
from verify import devices
from verify.capture.ops import OpCapture, TensorSaver
from verify.capture.tensor_stats import StatBatch
from verify.capture import environment_record, project_files
from verify.capture import perturbation, precision_scopes
from verify.capture import random_streams
from verify.capture import rank_capture
from verify.capture.lifetime import die_with_parent
from verify.errors import VerifyError
from verify.record.schema import DumpMode, RunManifest, Status
from verify.capture.step_recorder import StepRecorder, StopRun
from verify.record.store import RunWriter, now_iso, read_manifest, write_manifest

_VERIFY_DIR = str(Path(__file__).resolve().parents[1]) + os.sep
# Frames that an op passes through only because the capture's TorchDispatchMode is active: a traceback without them
# reads as it would in a plain run.
_DISPATCH_PLUMBING = tuple(
    str(Path(torch.__file__).parent / name) for name in ("_compile.py", "_dynamo/eval_frame.py", "_ops.py")
)


# -- the child's main ---------------------------------------------------------------------------------------------


def _prepare_device(manifest: RunManifest) -> None:
    """The device, as verify.devices sets it up in this process; `auto` becomes what it resolved to."""
    prepared = device_setup.prepare(manifest.device)
    if prepared.device != manifest.device and devices.row(prepared.device).emulated:
        manifest.emulated, manifest.emulated_on = True, devices.emulated_on(prepared.device, devices.EmulateOn.CPU)
    manifest.device, manifest.device_name = prepared.device, prepared.name
    manifest.torch_npu_version = prepared.torch_npu_version


def _share_cores(threads: int) -> None:
    """The run's share of the cores (manifest.threads), in torch's both pools, before the script computes anything."""
    if threads:
        torch.set_num_threads(threads)
        # torch refuses a second setting, or one after its inter-op pool started (a device set-up may start it):
        # the intra-op threads, which carry eager training's work, are set all the same
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(threads)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # every device's generator, cuda and npu included


@contextlib.contextmanager
def _cuda_autocast_casts_on_cpu() -> Iterator[None]:
    """A plain CPU run under an imposed autocast takes CUDA's op lists and computes half precision as the devices do,
    as both stand-ins do (verify.devices)."""
    library = device_setup.install_autocast_casts_on_cpu()
    with device_setup.half_precision_as_devices():
        yield
    del library  # unregisters them


def _script_traceback(error: BaseException, script: str) -> str:
    """The traceback from the script's first frame on, without verify's own frames (runpy, the bootstrap, the
    capture hooks and torch's dispatch-mode plumbing that a failing call passed through): noise to the user."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    report = traceback.TracebackException(type(error), error, tb or error.__traceback__)
    report.stack = traceback.StackSummary.from_list(
        [frame for frame in report.stack if not frame.filename.startswith((_VERIFY_DIR, *_DISPATCH_PLUMBING))]
    )
    return "".join(report.format())


def _run_script(manifest: RunManifest, recorder: StepRecorder, capture: OpCapture | None,
                body: Callable[[], Any]) -> None:
    """Runs `body` (the script as `python SCRIPT ARGS` would; in a rank the script spawned, its function), and sets
    the manifest's status, message and exit code."""
    sys.argv = [manifest.script, *manifest.argv]
    sys.path.insert(0, str(Path(manifest.script).parent))  # as `python SCRIPT` does (the bootstrap runs with -P)
    with contextlib.ExitStack() as stack:
        if manifest.no_dropout:
            stack.enter_context(random_streams.dropout_disabled())
        elif manifest.align_random:
            stack.enter_context(random_streams.keyed(manifest.seed, lambda: recorder.steps_done,
                                                     manifest.random_not_aligned))
            manifest.random_keyed_by_tag = True
        device = devices.row(manifest.device)
        if manifest.autocast:
            if device.cuda_casts_under_autocast:
                stack.enter_context(_cuda_autocast_casts_on_cpu())
                manifest.extra["autocast_casts"] = "CUDA/NPU op lists (as the emulated NPU), not CPU autocast's own"
            stack.enter_context(precision_scopes.imposed(device.autocast_device_type, manifest.autocast,
                                                         manifest.autocast_follow))
        stack.enter_context(precision_scopes.recorded(device.autocast_device_type, manifest.autocast_scopes))
        stack.enter_context(perturbation.perturbed(manifest.perturbation))  # below the capture: it records the result
        if capture is not None:
            stack.enter_context(capture)
        try:
            body()
            recorder.end_open_step()
            _ended_by_itself(manifest, recorder, 0)
        except StopRun as stop:
            manifest.status, manifest.message, manifest.exit_code = stop.status.value, stop.message, 0
        except VerifyError as error:  # verify refused what the script did (more ranks than the machine holds)
            manifest.status, manifest.exit_code = Status.CRASHED.value, 1
            manifest.verify_error = manifest.message = str(error)
        except SystemExit as exit:
            try:
                recorder.end_open_step()  # its forward is complete: sys.exit() after it ends the script, not the step
            except StopRun:
                pass  # it was the last step asked for; the exit code decides the status below
            _ended_by_itself(manifest, recorder, exit.code)
        except BaseException as error:  # everything the script raised, KeyboardInterrupt included
            manifest.status, manifest.exit_code = Status.CRASHED.value, 1
            manifest.message = f"{type(error).__name__}: {error} (after {_steps(recorder.steps_done)})"
            manifest.traceback = _script_traceback(error, manifest.script)
    if manifest.status == Status.NAN.value:
        manifest.exit_code = 1


def _steps(count: int) -> str:
    return f"{count} step" if count == 1 else f"{count} steps"


def _ended_by_itself(manifest: RunManifest, recorder: StepRecorder, code: Any) -> None:
    done = recorder.steps_done
    manifest.exit_code = code if isinstance(code, int) else (0 if code is None else 1)
    if manifest.exit_code != 0:
        manifest.status = Status.CRASHED.value
        manifest.message = f"the script called sys.exit({code!r}) after {_steps(done)}"
    elif done == 0:
        manifest.status = Status.NO_STEPS.value
        manifest.message = f"the script ended without a step: {_no_step(recorder)}"
    elif done < manifest.steps_requested:
        manifest.status = Status.SHORT.value
        manifest.message = f"the script ended by itself after {done} of {manifest.steps_requested} steps"
    else:
        manifest.status, manifest.message = Status.OK.value, f"ran the {done} requested steps"


def _no_step(recorder: StepRecorder) -> str:
    """What a run without a step lacked. A step is the first optimizer's step(); without any optimizer, a forward of
    the outermost module: a model that ran but whose optimizer never stepped made no step."""
    if recorder.model_forwards == 0:
        return "no module's forward ran and no optimizer stepped"
    backward = "backward() ran" if recorder.training else "backward() was never called"
    return (f"the model's forward ran {recorder.model_forwards} time(s) and {backward}, but the "
            f"{_plural(recorder.optimizers_created, 'optimizer')} it created never stepped (no optimizer.step(): with "
            "an optimizer, its steps are the steps)")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _make_capture(manifest: RunManifest, writer: RunWriter, batch: StatBatch) -> OpCapture | None:
    dump = DumpMode(manifest.dump_mode)
    if dump == DumpMode.OFF:
        return None
    saver = None
    if dump == DumpMode.TENSOR:
        saver = TensorSaver(manifest.ops_regex or None, int(manifest.tensor_cap_mb * 2**20), writer.save_array)
    return OpCapture(dump, batch, saver, Path(manifest.script).parent)


def instrumented(run_dir: Path, manifest: RunManifest, body: Callable[[], Any]) -> Status:
    """Prepares the device, instruments this process, runs `body` and writes the final manifest into `run_dir`."""
    manifest.python_version = platform.python_version()
    manifest.torch_version = torch.__version__
    try:
        _prepare_device(manifest)
    except Exception as error:  # torch_npu missing or broken: the environment's problem, not the script's
        manifest.status, manifest.finished_at = Status.CRASHED.value, now_iso()
        reason = f"cannot use device {manifest.device}: {type(error).__name__}: {error}"
        manifest.verify_error = manifest.message = reason
        write_manifest(run_dir, manifest)
        return Status.CRASHED
    _seed_everything(manifest.seed)
    _share_cores(manifest.threads)
    writer = RunWriter(run_dir)
    batch = StatBatch()
    capture = _make_capture(manifest, writer, batch)
    recorder = StepRecorder(manifest, run_dir, writer, capture, batch)
    recorder.install()
    if capture is not None:
        capture.on_collective = rank_capture.LastCollective(run_dir).called
    with environment_record.recorded(manifest), rank_capture.process_group_recorded(manifest):
        write_manifest(run_dir, manifest)
        _run_script(manifest, recorder, capture, body)
    recorder.discard_partial_step()
    if capture is not None and capture.saver is not None and capture.saver.budget_exhausted:
        manifest.extra["tensor_cap_reached"] = True
    if computed := device_setup.ops_computed_in_fp32():  # the CPU lacked the device's kernel (an fp16 LSTM)
        manifest.extra["computed_in_fp32"] = computed
    if statistics_path := batch.device_stats.fused.note:  # which path reduced large floating tensors on CUDA
        manifest.extra["device_statistics"] = statistics_path
    manifest.modelled_numerics = device_setup.modelled_numerics()
    manifest.half_precision = device_setup.half_precision()
    manifest.project_files = project_files.imported(manifest.script)
    manifest.finished_at = now_iso()
    writer.close()
    write_manifest(run_dir, manifest)
    return Status(manifest.status)


class CapturedRank:
    """What torch.multiprocessing.spawn runs in each process it starts, in place of the script's function: that
    function under verify's capture, writing into the rank's folder. Pickled to the spawned process as the function
    itself is, by reference (the script is re-imported there as __mp_main__)."""

    def __init__(self, fn: Callable[..., Any], run_dir: Path, nprocs: int) -> None:
        self.fn, self.run_dir, self.nprocs = fn, str(run_dir), nprocs
        self.spawner = os.getpid()  # the script's process, with which each rank dies

    def __call__(self, index: int, *args: Any) -> None:
        die_with_parent(self.spawner)
        run_dir = Path(self.run_dir)
        folder, manifest = rank_capture.open_rank_dir(run_dir, read_manifest(run_dir), index, self.nprocs)
        status = instrumented(folder, manifest, lambda: self.fn(index, *args))
        sys.stdout.flush()
        sys.stderr.flush()
        # As the bootstrap ends: the script's leftover threads (a process group's) must not keep the rank alive.
        os._exit(0 if status in (Status.OK, Status.SHORT) else 1)


@contextlib.contextmanager
def spawned_ranks_captured(run_dir: Path, manifest: RunManifest) -> Iterator[None]:
    """Ranks the script starts with torch.multiprocessing.spawn (or start_processes) run its function under the
    capture, each into its folder of the run directory, without any option. Refused (VerifyError: exit 2) in a rank
    verify launched (--nproc-per-node N would make N times as many), and beyond the ranks the machine holds."""
    module = importlib.import_module("torch.multiprocessing.spawn")  # torch.multiprocessing.spawn is the function
    original = module.start_processes

    @functools.wraps(original)
    def start_processes(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1, *rest: Any, **kwargs: Any) -> Any:
        spawns = f"the script starts {nprocs} ranks of its own (torch.multiprocessing.spawn)"
        if manifest.nproc_per_node:
            raise VerifyError(f"{spawns} in each of the {manifest.nproc_per_node} ranks --nproc-per-node launched: "
                              "run it without --nproc-per-node, and verify captures each rank it spawns")
        if manifest.rank_limit and nprocs > manifest.rank_limit:
            raise VerifyError(f"{spawns}, more than the {manifest.rank_limit} this machine holds (its cores and free "
                              "memory): ask the script for fewer, or add --force to start them anyway")
        return original(CapturedRank(fn, run_dir, nprocs), args, nprocs, *rest, **kwargs)

    module.start_processes = torch.multiprocessing.start_processes = start_processes
    try:
        yield
    finally:
        module.start_processes = torch.multiprocessing.start_processes = original
