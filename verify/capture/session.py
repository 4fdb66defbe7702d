"""The instrumentation around one process's training: the device set up, every generator seeded, the step recorder
and the op capture installed, the script's body run, and the final manifest written. The bootstrap
(verify/capture/bootstrap.py) runs it around the script; in ranks the script spawns itself, `CapturedRank` runs it
around the script's function.

The child's own exit status means nothing: the final manifest says how the run ended (manifest.verify_error
non-empty: verify itself failed, not the script).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import inspect
import multiprocessing.process
import multiprocessing.spawn
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
from torch.utils._python_dispatch import TorchDispatchMode

from verify.devices import setup as device_setup
from verify import devices
from verify.capture.ops import OpCapture, TensorSaver, dispatch_path
from verify.capture.tensor_stats import StatBatch
from verify.capture import environment_record, project_files
from verify.capture import perturbation, precision_scopes
from verify.capture import listing_order, private_files, random_streams, whole_saves
from verify.capture import compile_calls, followed_port, initialization, rank_capture
from verify.capture.lifetime import die_with_parent
from verify.errors import CaptureFailed, DiskFull, VerifyError, VerifyFailure
from verify.frameworks import LAUNCHERS
from verify.record.schema import LAUNCHER_KEY, DumpMode, RunManifest, Status, ended_by_itself
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


def _import_dynamo_before_any_group() -> None:
    """The capture's first op imports torch._dynamo (torch wraps every __torch_dispatch__ so). Imported once the
    script's gloo process group exists, dynamo keeps the group alive past destroy_process_group, and at the exit the
    group's threads abort the process ("terminate called without an active exception"; torchrun then stops the other
    ranks, which may be writing their manifests). Imported before the script, it holds no group; after the device's
    set-up, whose emulations patch the FSDP modules dynamo imports before any other module binds their names."""
    import torch._dynamo  # noqa: F401


def _share_cores(threads: int) -> None:
    """The run's share of the cores (manifest.threads), in torch's both pools, before the script computes anything."""
    if threads:
        torch.set_num_threads(threads)
        # torch refuses a second setting, or one after its inter-op pool started (a device set-up may start it):
        # the intra-op threads, which carry eager training's work, are set all the same
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(threads)


def _seed_generators(seed: int) -> None:
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


def _summation_order_set(stack: contextlib.ExitStack, manifest: RunManifest, device: devices.DeviceRow) -> bool:
    """Whether this run sums in the order its calibration plan names (manifest.perturbation["blocks"]): an emulated
    face reads it from its environment (devices.BLOCKS_VAR), except under --exact-emulation; on a real device (the
    CPU, a CUDA GPU) a mode entered here below the capture sums so, where the plan asks for no rounding (the port's
    own order: random rounding never flips a sign, which another order does)."""
    plan = manifest.perturbation
    if device.summation_blocks:
        return not manifest.exact_emulation
    if device.emulated or not plan or plan.get("rounding", True):
        return False
    stack.enter_context(device_setup.summed_in_blocks(int(plan["blocks"])))
    return True


def _script_traceback(error: BaseException, manifest: RunManifest) -> str:
    """The traceback from the script's first frame on, without verify's own frames (runpy, the bootstrap, the
    capture hooks and torch's dispatch-mode plumbing that a failing call passed through): noise to the user. The
    files of the run's view are named as the user's own (the original folder)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != manifest.running_script:
        tb = tb.tb_next
    report = traceback.TracebackException(type(error), error, tb or error.__traceback__)
    report.stack = traceback.StackSummary.from_list(
        [frame for frame in report.stack if not frame.filename.startswith((_VERIFY_DIR, *_DISPATCH_PLUMBING))]
    )
    text = "".join(report.format())
    if view := manifest.working_folder.get("view"):  # rstrip: the view of `/` holds /x at VIEW/x
        text = text.replace(f'File "{view}', f'File "{manifest.working_folder["root"].rstrip(os.sep)}')
    return text


def _launchers_arguments(manifest: RunManifest) -> list[str]:
    """What a framework's launcher adds to the arguments of the rank it starts (--launcher deepspeed: --local_rank=K),
    before the script's own; the manifest keeps the script's arguments as given."""
    launcher = manifest.extra.get(LAUNCHER_KEY)
    if not launcher or "LOCAL_RANK" not in os.environ:
        return []
    return [argument.format(local_rank=os.environ["LOCAL_RANK"]) for argument in LAUNCHERS[launcher]]


def _run_script(manifest: RunManifest, recorder: StepRecorder, watch: TorchDispatchMode | None,
                body: Callable[[], Any]) -> None:
    """Runs `body` (the script as `python SCRIPT ARGS` would; in a rank the script spawned, its function) under the
    outermost mode that watches its ops (the op capture; with --dump off in a rank, the collective watch), and sets
    the manifest's status, message and exit code."""
    if manifest.starts_after:
        followed_port.after_first_step(Path(manifest.starts_after))
    private = private_files.of(manifest)
    sys.argv = [manifest.running_script, *_launchers_arguments(manifest),
                *(private.argv(manifest.argv) if private else manifest.argv)]
    sys.path.insert(0, str(Path(manifest.running_script).parent))  # as `python SCRIPT` does (the bootstrap runs -P)
    with contextlib.ExitStack() as stack:
        stack.enter_context(listing_order.sorted_listings(manifest.extra))
        stack.enter_context(whole_saves.saved_whole(manifest.extra))
        stack.enter_context(compile_calls.counted(manifest.extra))
        stack.enter_context(initialization.watched(manifest.extra, manifest.running_root, manifest.files_root))
        if private is not None:  # around the whole saves: a save replaces the link, never the original file
            stack.enter_context(private_files.kept_private(private))
        if manifest.no_dropout:
            stack.enter_context(random_streams.dropout_disabled())
        elif manifest.align_random:
            stack.enter_context(random_streams.keyed(lambda: recorder.steps_done, manifest.random_not_aligned))
            manifest.random_keyed_by_tag = True
        device = devices.row(manifest.device)
        if manifest.autocast or recorder.followed:
            if device.cuda_casts_under_autocast:
                stack.enter_context(_cuda_autocast_casts_on_cpu())
                manifest.extra["autocast_casts"] = "CUDA/NPU op lists (as the emulated NPU), not CPU autocast's own"
            follow = recorder.followed.scopes_of if recorder.followed else precision_scopes.following(
                manifest.autocast_follow)
            stack.enter_context(precision_scopes.imposed(device.autocast_device_type, manifest.autocast, follow))
        stack.enter_context(precision_scopes.recorded(device.autocast_device_type, manifest.autocast_scopes))
        order_set = _summation_order_set(stack, manifest, device)
        if manifest.perturbation:
            manifest.perturbation["rounded"] = perturbation.rounds(manifest.perturbation, order_set)
        stack.enter_context(perturbation.perturbed(manifest.perturbation, order_set))  # below the capture
        if watch is not None:
            stack.enter_context(watch)
        stack.enter_context(_argument_errors_kept())
        try:
            body()
            recorder.end_open_step()
            _ended_by_itself(manifest, recorder, 0)
        except StopRun as stop:
            manifest.status, manifest.message, manifest.exit_code = stop.status.value, stop.message, 0
        except VerifyFailure as error:  # verify refused what the script did (more ranks than the machine holds), or
            # could not record it (DiskFull)
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
            manifest.traceback = _script_traceback(error, manifest)
            manifest.verify_error = _emulations_limit(error)
    if manifest.status == Status.NAN.value:
        manifest.exit_code = 1


def _emulations_limit(error: BaseException, emulations: Path = devices.STAND_IN_DIR) -> str:
    """What an emulation could not do, as verify's error naming the emulation; "" for the script's own errors. Its
    NotEmulated (the script used a name of the real device's API it lacks); and an AttributeError, or a RuntimeError
    or NotImplementedError it raises itself, in its own code (a file under `emulations`), unless it raised it as the
    real device would (device_errors.as_the_device). A RuntimeError torch raises in a kernel the emulation called (the
    script's shapes) is the script's."""
    target = sys.modules.get("npu_port_emulation.target")  # loaded in an emulated process only
    if target is None:
        return ""
    if isinstance(error, target.NotEmulated):
        return str(error)
    as_the_device = sys.modules["npu_port_emulation.device_errors"].raised_as_the_device(error)
    where = traceback.extract_tb(error.__traceback__)[-1:]
    if (not isinstance(error, (AttributeError, RuntimeError, NotImplementedError)) or as_the_device or not where
            or not where[0].filename.startswith(str(emulations) + os.sep)):
        return ""
    if not isinstance(error, AttributeError) and not (where[0].line or "").lstrip().startswith("raise"):
        return ""
    place = f"{Path(where[0].filename).relative_to(emulations)}:{where[0].lineno}"
    return (f"{target.EMULATION} failed in its own code ({place}), not in the script: {type(error).__name__}: "
            f"{error}. This is verify's limit; run the script on a real device, or report it")


def _steps(count: int) -> str:
    return f"{count} step" if count == 1 else f"{count} steps"


_ARGUMENT_ERRORS: list[str] = []  # what the script's argument parser refused, in its words


@contextlib.contextmanager
def _argument_errors_kept() -> Iterator[None]:
    """argparse's refusal of the script's arguments, kept for the manifest: it exits with 2 after printing it."""
    error = argparse.ArgumentParser.error

    @functools.wraps(error)
    def kept(parser: argparse.ArgumentParser, message: str) -> Any:
        _ARGUMENT_ERRORS.append(message)
        return error(parser, message)

    argparse.ArgumentParser.error = kept
    try:
        yield
    finally:
        argparse.ArgumentParser.error = error


def _refused_arguments() -> str:
    """The script's argument error, and the launcher that passes an argument it found missing (--local_rank)."""
    if not _ARGUMENT_ERRORS:
        return ""
    message = _ARGUMENT_ERRORS[-1]
    launchers = [f"the {name} launcher passes {argument.split('=')[0]}: verify --launcher {name}"
                 for name, arguments in LAUNCHERS.items() for argument in arguments
                 if argument.split("=")[0] in message]
    return f" ({'; '.join([message, *launchers])})"


def _ended_by_itself(manifest: RunManifest, recorder: StepRecorder, code: Any) -> None:
    done = recorder.steps_done
    manifest.exit_code = code if isinstance(code, int) else (0 if code is None else 1)
    if manifest.exit_code != 0:
        manifest.status = Status.CRASHED.value
        manifest.message = f"the script called sys.exit({code!r}) after {_steps(done)}{_refused_arguments()}"
    else:
        status, manifest.message = ended_by_itself(done, manifest.steps_requested, len(manifest.skipped_steps))
        manifest.status = status.value
        if status == Status.NO_STEPS:
            manifest.message += f": {_no_step(recorder)}"


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
    return OpCapture(dump, batch, saver, (manifest.running_root, manifest.files_root))


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
    _import_dynamo_before_any_group()
    # Each rank its own seed, as each process of a real run starts from its own random state (a script that does
    # not seed draws another model and other data on each rank); rank 0, and a single process, the run's seed.
    _seed_generators(manifest.seed + manifest.rank)
    _share_cores(manifest.threads)
    writer = RunWriter(run_dir)
    batch = StatBatch()
    capture = _make_capture(manifest, writer, batch)
    recorder = StepRecorder(manifest, run_dir, writer, capture, batch)
    recorder.install()
    last_collective = rank_capture.LastCollective(run_dir).called
    watch: TorchDispatchMode | None = capture
    if capture is not None:
        capture.on_collective = last_collective
    elif manifest.world_size > 1:  # --dump off: no capture sees a rank's collectives, which a hang is named by
        watch = rank_capture.CollectiveWatch(last_collective, lambda: recorder.steps_done)
    with environment_record.recorded(manifest), rank_capture.process_group_recorded(manifest), \
            rank_capture.destroyed_groups_kept():
        write_manifest(run_dir, manifest)
        _run_script(manifest, recorder, watch, body)
    try:
        recorder.discard_partial_step()
    except CaptureFailed as error:  # a failure of verify's, after the script: the run is verify's error
        manifest.status, manifest.exit_code = Status.CRASHED.value, 1
        manifest.verify_error = manifest.message = manifest.verify_error or str(error)
    if capture is not None and capture.saver is not None and capture.saver.budget_exhausted:
        manifest.extra["tensor_cap_reached"] = True
    if computed := device_setup.ops_computed_in_fp32():  # the CPU lacked the device's kernel (an fp16 LSTM)
        manifest.extra["computed_in_fp32"] = computed
    if statistics_path := batch.device_stats.fused.note:  # which path reduced large floating tensors on CUDA
        manifest.extra["device_statistics"] = statistics_path
    if capture is not None:  # whether the ops it never records passed through in C++ or C, or all took Python
        manifest.extra["op_dispatch"] = dispatch_path()
    manifest.modelled_numerics = device_setup.modelled_numerics()
    if emulated := device_setup.emulated_calls():  # what FSDP2 and DTensor asked of an emulated device
        manifest.extra["emulated_calls"] = emulated
    manifest.half_precision = device_setup.half_precision()
    manifest.project_files = project_files.imported(manifest.running_script, manifest.running_root,
                                                      manifest.files_root)
    manifest.finished_at = now_iso()
    try:
        writer.close()
    except DiskFull as error:
        manifest.status, manifest.exit_code = Status.CRASHED.value, 1
        manifest.verify_error = manifest.message = manifest.verify_error or str(error)
    write_manifest(run_dir, manifest)
    return Status(manifest.status)


class CapturedRank:
    """What a process the script starts runs in place of the script's function (torch.multiprocessing.spawn's, a
    multiprocessing.Process's run(): its target's, or its subclass's own): that function under verify's capture,
    writing into the rank's folder. Pickled to a spawned process as the function itself is, by reference (the script
    is re-imported there as __mp_main__); a forked one calls it directly. `rank` None: the rank is the function's first
    argument (spawn's process index)."""

    def __init__(self, fn: Callable[..., Any], run_dir: Path, world_size: int, rank: int | None = None) -> None:
        self.fn, self.run_dir, self.world_size, self.rank = fn, str(run_dir), world_size, rank
        self.spawner = os.getpid()  # the script's process, with which each rank dies

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        die_with_parent(self.spawner)
        run_dir = Path(self.run_dir)
        folder, manifest = rank_capture.open_rank_dir(run_dir, read_manifest(run_dir), self._rank(args),
                                                      self.world_size)
        status = instrumented(folder, manifest, lambda: self.fn(*args, **kwargs))
        sys.stdout.flush()
        sys.stderr.flush()
        self._end(status)

    def _rank(self, args: tuple) -> int:
        return args[0] if self.rank is None else self.rank

    def _end(self, status: Status) -> None:
        # As the bootstrap ends: the script's leftover threads (a process group's) must not keep the rank alive.
        os._exit(0 if status in (Status.OK, Status.SHORT) else 1)


class ElasticRank(CapturedRank):
    """A rank that torch.distributed.elastic starts on a function of the script: its rank in RANK, as in a rank
    torch's launcher starts. One that ran its steps returns, for elastic's own wrapper around it must hand the agent a
    return value (the agent waits forever for a rank that ends its process first); one that failed exits 1, which the
    agent reads as a failed worker."""

    def _rank(self, args: tuple) -> int:
        return rank_capture.launched_rank()

    def _end(self, status: Status) -> None:
        if status not in (Status.OK, Status.SHORT):
            super()._end(status)


def _the_scripts(fn: Any, script_dir: Path) -> bool:
    """Whether `fn` is the script's own code (its file in the script's folder), not a library's: a DataLoader
    worker's loop and torch.multiprocessing.spawn's own wrapper start processes too, and are not ranks."""
    code = getattr(inspect.unwrap(getattr(fn, "func", fn)), "__code__", None)
    return code is not None and Path(code.co_filename).resolve().is_relative_to(script_dir)


def _code_run(process: multiprocessing.process.BaseProcess) -> Any:
    """The code a started process runs: its class's own run() (`class Worker(mp.Process): def run(self)`), else its
    target."""
    run = type(process).run
    return getattr(process, "_target", None) if run is multiprocessing.process.BaseProcess.run else run


class _DeviceFirst:
    """Sent in a spawned rank's preparation data (multiprocessing.spawn.get_preparation_data), which the new process
    unpickles before it imports the script as __mp_main__: unpickled, it sets the run's device up there, and verify's
    record of the process group, as the script's own process had them before the script ran. A script that imports
    c10d's or the device's functions by name (`from torch.distributed import init_process_group`, as pytorch/examples'
    DDP tutorial does) then holds the emulation's and the record's: imported before them, init_process_group("nccl")
    found no NCCL on the emulated CUDA. A set-up that fails here is left to the rank's own (instrumented), which
    reports it."""

    def __init__(self, device: str) -> None:
        self.device = device

    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return _set_up_before_the_script, (self.device,)


def _set_up_before_the_script(device: str) -> None:
    with contextlib.suppress(Exception):
        device_setup.prepare(device)
    rank_capture.record_process_groups()  # after the device's set-up, as instrumented() orders them


class _RankStarts:
    """The processes the script starts as ranks, in the order it starts them: refused in a rank --nproc-per-node
    launched (N times as many) and beyond the ranks the machine holds (VerifyError: exit 2)."""

    def __init__(self, run_dir: Path, manifest: RunManifest) -> None:
        self.run_dir, self.manifest, self.started = run_dir, manifest, 0
        self.spawner = os.getpid()  # a rank forked from the script inherits the hooks: its own processes are not ranks
        self.starting = False  # ranks are being started: a spawned one sets the device up first (_DeviceFirst)

    @contextlib.contextmanager
    def being_started(self) -> Iterator[None]:
        self.starting = True
        try:
            yield
        finally:
            self.starting = False

    def allow(self, count: int, how: str) -> None:
        starts = f"the script starts {self.started + count} ranks of its own ({how})"
        if self.manifest.nproc_per_node:
            raise VerifyError(f"{starts} in each of the {self.manifest.nproc_per_node} ranks --nproc-per-node "
                              "launched: run it without --nproc-per-node (--devices N presents N devices), and verify "
                              "captures each rank it starts")
        if self.manifest.rank_limit and self.started + count > self.manifest.rank_limit:
            raise VerifyError(f"{starts}, more than the {self.manifest.rank_limit} this machine holds (its cores and "
                              "free memory): ask the script for fewer, or add --force to start them anyway")
        self.started += count

    def _launched(self, count: int, how: str) -> None:
        """Ranks started together (a spawn, an elastic launch): a second launch ends the script, for its ranks'
        folders are taken: the steps asked for were those of its first ranks."""
        if self.started:
            raise StopRun(Status.OK, f"verify captured the {self.started} ranks the script started first and stopped "
                                     f"it where it starts more ({how})")
        self.allow(count, how)

    def spawned(self, fn: Callable[..., Any], nprocs: int) -> CapturedRank:
        self._launched(nprocs, "torch.multiprocessing.spawn")
        return CapturedRank(fn, self.run_dir, nprocs)

    def process(self, run: Callable[[], Any]) -> CapturedRank:
        self.allow(1, "multiprocessing.Process")
        return CapturedRank(run, self.run_dir, world_size=0, rank=self.started - 1)

    def elastic(self, entrypoint: Callable[..., Any] | str, args: dict[int, tuple]) -> tuple[Any, dict[int, tuple]]:
        """An elastic launch's entrypoint and each rank's arguments, run under the capture: a function of the script
        as an ElasticRank; a command that runs a Python script as the bootstrap running it as a rank, as the ranks
        --nproc-per-node launches are."""
        if callable(entrypoint):
            self._launched(len(args), "torch.distributed.elastic")
            return ElasticRank(entrypoint, self.run_dir, len(args)), args
        commands = {rank: rank_capture.rank_command(self.run_dir, *_script_and_argv(entrypoint, rank_args))
                    for rank, rank_args in args.items()}
        self._launched(len(args), "torch.distributed.elastic")
        return sys.executable, {rank: tuple(command[1:]) for rank, command in commands.items()}


def _script_and_argv(command: str, args: tuple) -> list[str]:
    """The Python script that an elastic launch's command runs, and its arguments: `python [-u ...] SCRIPT ARGS`
    (torch.distributed.run), or `SCRIPT ARGS` (its --no-python). Another command (a module, a binary) is refused."""
    args = tuple(map(str, args))
    if Path(command).name.startswith("python"):
        flags = next((index for index, arg in enumerate(args) if not arg.startswith("-")), len(args))
        if "-m" not in args[:flags] and "-c" not in args[:flags] and flags < len(args):
            return [str(Path(args[flags]).resolve()), *args[flags + 1:]]
    elif command.endswith(".py"):
        return [str(Path(command).resolve()), *args]
    raise VerifyError(f"the script launches ranks that run {' '.join((command, *args))!r}: verify captures ranks "
                      "that run a function of the script or a Python script (python SCRIPT ARGS)")


@contextlib.contextmanager
def spawned_ranks_captured(run_dir: Path, manifest: RunManifest) -> Iterator[None]:
    """Processes the script starts to run its own code (torch.multiprocessing.spawn or start_processes; a
    multiprocessing.Process of any start method, fork, spawn or forkserver, with a target of the script's or a run() of
    its subclass's; torch.distributed.elastic's launches, elastic_launch or torch.distributed.run called in the script,
    on a function or a script) run that code under the capture, each into its folder of the run directory (rankK/, K:
    spawn's process index or the launched rank, else the order they start in), without any option; --devices N
    presents the devices they ask for. A launch after the first ends the script: the ranks ran the steps asked for."""
    spawn_module = importlib.import_module("torch.multiprocessing.spawn")  # torch.multiprocessing.spawn: a function
    original_spawn, original_start = spawn_module.start_processes, multiprocessing.process.BaseProcess.start
    # elastic's agent (elastic_launch, torch.distributed.run) calls the name it imported from elastic.multiprocessing
    elastic_processes = importlib.import_module("torch.distributed.elastic.multiprocessing")
    elastic_agent = importlib.import_module("torch.distributed.elastic.agent.server.local_elastic_agent")
    original_elastic = elastic_processes.start_processes
    ranks, script_dir = _RankStarts(run_dir, manifest), Path(manifest.running_script).resolve().parent

    original_preparation = multiprocessing.spawn.get_preparation_data

    @functools.wraps(original_spawn)
    def start_processes(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1, *rest: Any, **kwargs: Any) -> Any:
        if not _the_scripts(fn, script_dir):
            return original_spawn(fn, args, nprocs, *rest, **kwargs)
        fn = ranks.spawned(fn, nprocs)
        with ranks.being_started():
            return original_spawn(fn, args, nprocs, *rest, **kwargs)

    @functools.wraps(original_elastic)
    def start_elastic(name: str, entrypoint: Callable[..., Any] | str, args: dict[int, tuple], *rest: Any,
                      **kwargs: Any) -> Any:
        if not isinstance(entrypoint, str) and not _the_scripts(entrypoint, script_dir):
            return original_elastic(name, entrypoint, args, *rest, **kwargs)
        entrypoint, args = ranks.elastic(entrypoint, args)
        with ranks.being_started():
            return original_elastic(name, entrypoint, args, *rest, **kwargs)

    @functools.wraps(original_start)
    def start(process: multiprocessing.process.BaseProcess) -> None:
        if os.getpid() != ranks.spawner or not _the_scripts(_code_run(process), script_dir):
            original_start(process)
            return
        # the instance's run() is what the process calls (a forked one directly, a spawned one unpickled)
        process.run = ranks.process(functools.partial(type(process).run, process))
        with ranks.being_started():
            original_start(process)

    @functools.wraps(original_preparation)
    def get_preparation_data(name: str) -> dict[str, Any]:
        prepared = original_preparation(name)
        return {**prepared, "npu_port_device": _DeviceFirst(manifest.device)} if ranks.starting else prepared

    spawn_module.start_processes = torch.multiprocessing.start_processes = start_processes
    multiprocessing.process.BaseProcess.start = start
    elastic_processes.start_processes = elastic_agent.start_processes = start_elastic
    multiprocessing.spawn.get_preparation_data = get_preparation_data
    try:
        yield
    finally:
        spawn_module.start_processes = torch.multiprocessing.start_processes = original_spawn
        multiprocessing.process.BaseProcess.start = original_start
        elastic_processes.start_processes = elastic_agent.start_processes = original_elastic
        multiprocessing.spawn.get_preparation_data = original_preparation
