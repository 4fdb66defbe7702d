"""The run directory: the data contract between `verify run` (which writes it) and `verify compare` (which reads it).

A run directory is written incrementally, so a crash or a timeout keeps every completed step:

    manifest.json          RunManifest, rewritten atomically at start, after each step and at the end
    losses.csv             one row per backward() call (micro-step), appended and flushed as it happens
    hparams.csv            optimizer hyperparameters, one row per (step, param_group, name), appended
    ops/steps.arrows       operator records (OP_COLUMNS)
    grads/steps.arrows     per-parameter gradient statistics just before the optimizer step (GRAD_COLUMNS)
    outputs/steps.arrows   inference runs: statistics of the outermost module's outputs (OUTPUT_COLUMNS)
    outputs/step-NNNNNN-outK.npy inference runs: the output tensors themselves (small: top-k agreement needs them)
    samples/steps.arrows   a fingerprint of each sample the outermost modules received (SAMPLE_COLUMNS): which
                           samples each rank read, compared across ranks and sides (verify/compare/sharding.py)
    tensors/step-NNNNNN/...npy   full tensors of the ops selected with --ops in `tensor` mode, under a size cap
    output.log             the script's stdout and stderr
    last-collective.json   the last collective (c10d op) the process called: {"step", "op", "module", "count"},
                           padded with spaces; absent where it called none

manifest.extra["environment"] (verify/record/environment.py) is the environment the run computed in, written at the
start and again when the script ends: {"versions": {python, torch, torch_npu, cann}, "precision": {fp32_matmul,
fp32_conv ("fp32", "tf32" or "hf32": what the device computes fp32 matmuls/convolutions in),
float32_matmul_precision}, "determinism": {deterministic_algorithms, deterministic_warn_only,
fill_uninitialized_memory, cudnn_deterministic, cudnn_benchmark}, "amp": {imposed_autocast, acl_precision_mode},
"environment": {allow-listed variable: value}, "data_loaders": [{batch_size, shuffle, num_workers, sampler,
drop_last, seeded_generator}, ...]}.

A table (ops, grads, outputs) is one Arrow IPC stream, TABLE_FILE in its folder: the schema, then one record batch
per step, appended and flushed to the OS as the step ends (every step pays for it: no file to create and no parquet
encoding keeps it cheap). The folder appears with the table's first step, so a training run has no outputs/. Each
batch carries the CRC-32 of its serialized form (verify/record/store.py): a stream cut short by a kill is read up to
the batch before the cut, with a note; a damaged one makes the run damaged (store.Run.damage), never judged.
manifest.json is checked against RunManifest as it is read (types, required fields, schema version):
RunManifest.from_json. Every file is plain data (JSON, CSV, Arrow IPC, .npy without pickle): readers never unpickle
anything, and names read from a run directory never become paths outside it. This module imports neither torch nor
pandas.
"""

from __future__ import annotations


import os
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import Any

from verify.contract.files import MANIFEST  # noqa: F401 (the folder's record: migrate reads it too)
from verify.devices import title
from verify.frameworks import fsdp
from verify.errors import ManifestError
from verify.record.statistics import STATISTIC_COLUMNS

# 2: ops.inputs (the data flow between recorded calls); 3: ops.source (the user's line); 4: ops.attrs (a forward
# call's settings); 5: ops.attrs of the calls outside any module too (the "other" phase)
SCHEMA_VERSION = 5
# The first version whose ops.attrs hold the settings of the calls outside any module (phase "other")
TOP_LEVEL_ATTRS_VERSION = 5

LOSSES = "losses.csv"
HPARAMS = "hparams.csv"
OPS_DIR = "ops"
GRADS_DIR = "grads"
OUTPUTS_DIR = "outputs"
SAMPLES_DIR = "samples"
TENSORS_DIR = "tensors"
TABLE_FILE = "steps.arrows"
LOG = "output.log"
# a rank's last collective call, rewritten in place (verify/capture/rank_capture.py)
LAST_COLLECTIVE = "last-collective.json"
# manifest.extra: the model the script trained or ran, {"class": its class's name, "parameters": how many it holds,
# "shared_memory": whether its parameters are in shared memory (hogwild's workers update them without locks)}: the
# outermost module the lead optimizer trains, else the first with a parameter that requires a gradient, else the first
# that ran forward (inside DataParallel, DistributedDataParallel or torch.compile, the module)
MODEL_KEY = "model"
# manifest.extra: the frozen networks beside the model (outermost modules with parameters, none of which requires a
# gradient: a perceptual loss's VGG, a distillation teacher, a reference model), each recorded as the model is
FROZEN_KEY = "frozen_modules"
# The steps a run makes past those asked for, at most, while a loss scaler skips updates: a GradScaler halving from
# its default 2**16 reaches 1 in 16 steps (verify/capture/step_recorder.py)
SETTLING_STEPS = 16
# manifest.extra: the script's torch.compile calls, {"calls": how many, "targets": what it compiled, "graphs": the graphs
# dynamo compiled during the run} (verify/capture/compile_calls.py); absent where the script never called it
COMPILE_KEY = "torch_compile"
# manifest.extra: the parameters Module.to_empty allocated that nothing wrote before the first forward, {"where":
# "train.py:87", "count": N, "of": M, "names": the first few, and where buffers were left "buffers": {"count", "of",
# "names"}} (verify/capture/initialization.py); absent where none
UNWRITTEN_KEY = "unwritten_after_to_empty"
# manifest.extra: the framework launcher its ranks started as (--launcher: "deepspeed"); absent for torchrun's
LAUNCHER_KEY = "launcher"


def step_file(step: int, suffix: str) -> str:
    """The name of what a run keeps per step: a folder (suffix "") or a file such as "-out0.npy"."""
    return f"step-{step:06d}{suffix}"


class Status(str, Enum):
    RUNNING = "running"  # still going, or killed so hard that nothing else could be written
    OK = "ok"  # all requested steps completed
    SHORT = "short"  # the script ended by itself before the requested steps
    CRASHED = "crashed"  # an exception escaped the script (traceback in the manifest)
    TIMEOUT = "timeout"  # killed after --timeout seconds
    INTERRUPTED = "interrupted"  # verify was stopped (SIGINT, SIGTERM, SIGHUP: the message names it), so the run
    NAN = "nan"  # the loss became NaN or inf; stopped there
    NO_STEPS = "no-steps"  # the script ended without a single step (no backward, no forward of a module)


def ended_by_itself(steps_done: int, steps_requested: int, skipped: int) -> tuple[Status, str]:
    """How a run whose script ended by itself with exit code 0 ended, and the words that say so: the steps asked for
    ran (OK), fewer (SHORT: not a crash, README's `verify run` exit 0), or none (NO_STEPS). `skipped`: the steps
    whose update a loss scaler skipped."""
    if steps_done == 0:
        return Status.NO_STEPS, "the script ended without a step"
    if steps_done < steps_requested:
        return Status.SHORT, f"the script ended by itself after {steps_done} of {steps_requested} steps"
    return Status.OK, ran_requested_steps(steps_done, steps_requested, skipped)


def ran_requested_steps(steps_done: int, steps_requested: int, skipped: int) -> str:
    """The words of a run that made the steps asked for, those it made past them while its loss scale settled, and
    how many applied an update where a loss scaler skipped some."""
    settling = steps_done - steps_requested
    words = f"ran the {steps_requested} requested steps" + (
        f" and {settling} more while the loss scale settled" if settling > 0 else "")
    return words + (f" ({steps_done - skipped} of them applied an update)" if skipped else "")


class Phase(str, Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"  # each parameter after optimizer.step(): op "update", module the parameter's name
    OTHER = "other"  # outside any module: data preparation, loss arithmetic at top level





# The half-precision dtypes autocast computes in, and the --autocast flag naming each.
HALF_DTYPES = ("float16", "bfloat16")
AUTOCAST_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}

# The statistics of a tensor, as columns of every table that has them (ops, grads, outputs): verify/record/statistics.py.
STAT_COLUMNS = tuple(STATISTIC_COLUMNS)

# Records that are no aten op: a parameter after optimizer.step() (phase optimizer, module the parameter's name), and
# the tensors the outermost module's forward receives (phase forward, io in0, in1...): the batch each side read.
UPDATE_OP = "update"
INPUT_OP = "input"


class DumpMode(str, Enum):
    STATS = "stats"
    TENSOR = "tensor"
    MD5 = "md5"
    OFF = "off"


# Column name -> pandas dtype. Statistics are float64 whatever the tensor's dtype: they are fetched in one batch
# per step, and float64 keeps fp32 extremes exact.
OP_COLUMNS: dict[str, str] = {
    "step": "int64",  # 0-based optimizer step (inference: forward index)
    "seq": "int64",  # execution order within the step, over all ops
    "phase": "string",  # Phase
    "module": "string",  # ModuleTracker path, e.g. "Net.layer1.0.conv1" ("" outside modules; optimizer: parameter)
    "op": "string",  # overload packet, e.g. "aten.convolution" (optimizer phase: "update")
    "call_index": "int64",  # n-th call of `op` in this (step, phase, module)
    "io": "string",  # which tensor: "out0", "out1", ... and in tensor mode "in0", ...
    "key": "string",  # step_op_keys(): f"{step}/{phase}/{module}/{op}#{call_index}" - identical on every machine
    "dtype": "string",  # "float32", "float16", "bfloat16", "int64", ...
    "shape": "string",  # "32x3x28x28"; "" for a 0-d tensor
    "numel": "int64",
    **STATISTIC_COLUMNS,
    "md5": "string",  # md5 mode only, else ""
    "tensor_file": "string",  # tensor mode: path relative to the run directory, else ""
    # The seqs of the recorded calls of this step whose outputs this call read ("12,15"; "" none: the batch, the
    # weights, or work not recorded); for a batch record (INPUT_OP), the calls that wrote the batch. Schema version 2;
    # version 1 runs read as missing (NA).
    "inputs": "string",
    # The innermost line of the user's own files that made the call, "train.py:55" (the file relative to the script's
    # folder; verify/capture/source_lines.py); a backward op's is the forward line whose graph it differentiates, an
    # update's the optimizer.step() line, "" where no user line made it. Schema version 3; older runs read as missing.
    "source": "string",
    # A forward or top-level ("other") call's settings besides its tensors that differ from its schema's defaults
    # ("approximate='tanh'", "eps=1e-06", a loss's "beta=0.5"; verify/capture/op_attributes.py), "" for none and for
    # the backward and optimizer phases. Schema version 4 (forward calls only: its top-level calls' read as missing,
    # TOP_LEVEL_ATTRS_VERSION); older runs read as missing.
    "attrs": "string",
}

# The op key: the parts that identify an op call on every machine, each preceded by its separator.
OP_KEY_PARTS = (("step", ""), ("phase", "/"), ("module", "/"), ("op", "/"), ("call_index", "#"))
# What comparing two runs reads of each op record: the columns shared by a pair of records (equal on both sides by
# construction of every alignment pass), and the ones each side has of its own (ref_*, actual_* in compare's table).
OP_SHARED_COLUMNS = ("step", "phase", "module", "io")
OP_SIDE_COLUMNS = tuple(column for column in OP_COLUMNS if column not in (*OP_SHARED_COLUMNS, "key"))


_OP_KEY_TEMPLATE = "".join(separator + "{}" for _, separator in OP_KEY_PARTS)


def step_op_keys(step: int, phases: Sequence[str], modules: Sequence[str], ops: Sequence[str],
                 call_indexes: Sequence[int]) -> list[str]:
    """The op keys of a step's calls, f"{step}/{phase}/{module}/{op}#{call_index}": identical on every machine for
    the same call. One positional format per call (a step's columns are written on its critical path)."""
    return [_OP_KEY_TEMPLATE.format(step, *parts) for parts in zip(phases, modules, ops, call_indexes, strict=True)]


# Gradients call the L2 norm `norm` and put it first: their table's layout from before the statistics had one table,
# kept so that the grads of old and new run folders read alike, byte for byte. Their other statistics follow.
GRAD_STATISTIC_NAMES = {"l2_norm": "norm"}
GRAD_COLUMNS: dict[str, str] = {
    "step": "int64",
    "param": "string",  # the parameter's qualified name in its module ("layer1.0.conv1.weight"), else "group0.3"
    "dtype": "string",
    "shape": "string",
    "numel": "int64",
    **{GRAD_STATISTIC_NAMES[name]: STATISTIC_COLUMNS[name] for name in GRAD_STATISTIC_NAMES},
    **{name: dtype for name, dtype in STATISTIC_COLUMNS.items() if name not in GRAD_STATISTIC_NAMES},
}

OUTPUT_COLUMNS: dict[str, str] = {
    "step": "int64",
    "output": "string",  # "out0", "out1", ... in pytree order
    "dtype": "string",
    "shape": "string",
    "numel": "int64",
    **STATISTIC_COLUMNS,
    "tensor_file": "string",
}

SAMPLE_COLUMNS: dict[str, str] = {
    "step": "int64",
    "module": "string",  # the outermost module whose forward received the batch (as in the INPUT_OP op records)
    "call_index": "int64",  # its n-th such forward in the step (gradient accumulation: several)
    "io": "string",  # "in0", "in1", ... as in the INPUT_OP records
    "shape": "string",
    # One 16-hex-digit hash a sample (a row along the first dimension) of its values as float64, comma-separated:
    # equal on two devices for the same sample whatever the tensor's dtype or device.
    "fingerprints": "string",
}

LOSS_COLUMNS = ("step", "micro_step", "loss", "loss_scale", "wall_ms")
"""losses.csv: `loss` is the unscaled scalar backward() was called on; `loss_scale` the GradScaler scale at that
moment (empty without a scaler); `micro_step` counts backward() calls within the step (gradient accumulation)."""

HPARAM_COLUMNS = ("step", "group", "name", "value", "optimizer")
"""hparams.csv: `group` is the param_group index ("" for optimizer-wide facts such as name="optimizer" whose value
is the class name); `value` is JSON (numbers, lists for betas, strings); `optimizer` numbers the optimizers in the
order they first stepped (0: the one whose steps count the run's steps; GANs have 0 and 1). The settings of the
model's modules (a dropout's rate) are rows of `optimizer` MODULE_HPARAMS, their `group` the module's path."""
MODULE_HPARAMS = -1
# Settings verify reads off the run, beside the optimizers' own, at every step of the lead optimizer: the rate of each
# dropout module that trains, the backward() calls made since the last step (gradient accumulation; an LBFGS
# closure's, made inside step(), are not), and the scale the script's own loss scaler started from (a GradScaler's
# init_scale, DeepSpeed's 2**initial_scale_power; none without one). A run recorded before one of them has none of
# its rows, and one is compared only where both runs have it.
DROPOUT_RATE = "dropout"
ACCUMULATION = "gradient accumulation"
INITIAL_LOSS_SCALE = "initial loss scale"
# and, rows of MODULE_HPARAMS, the dtypes of FSDP2's MixedPrecisionPolicy of each module fully_shard made
RECORDED_SETTINGS = (DROPOUT_RATE, ACCUMULATION, INITIAL_LOSS_SCALE, *fsdp.POLICY_SETTINGS)


@dataclass
class RunManifest:
    """manifest.json. Every field is JSON-native; unknown keys from newer writers are kept in `extra`."""

    schema_version: int = SCHEMA_VERSION
    tool_version: str = ""
    script: str = ""  # absolute path of the script that ran
    script_sha256: str = ""
    # The files under the script's folder the run imported (sys.modules at its end: the modules of the script's
    # project it ran), each path relative to that folder with its sha256 (verify/capture/project_files.py); under
    # project_root instead where one is given (a pair of scripts in two trees of one project: the folder holding both).
    project_files: dict[str, str] = field(default_factory=dict)
    project_root: str = ""
    # The run's own view of the folders it works in, the script's folder (files_root) and `cwd`
    # (verify/launch/working_folder.py): {"root" (the closest folder holding both), "view" (RUNDIR/files),
    # "mirrored_whole" (those two, whose paths the run reads in the view), "entries", "made_in_s", "shared": folders
    # linked whole, "left_out": verify's folders (never seen through the view)}, and after the run "written" (what
    # the run wrote, relative to the view, where it stays), "written_count", "originals_changed" (original files or
    # folders that changed meanwhile, by a writer the view could not keep to itself). Empty: the run ran in the
    # original folder (recorded before).
    working_folder: dict[str, Any] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)  # the script's own arguments
    # The folder verify was started in, where the script runs (in its view) as `python SCRIPT ARGS` would run there:
    # its relative paths lead from it. Runs recorded before ran in the script's folder, and say so.
    cwd: str = ""
    python_version: str = ""
    torch_version: str = ""
    torch_npu_version: str = ""  # "" when torch_npu is absent or emulated
    device: str = ""  # verify.devices.Device
    device_name: str = ""  # e.g. "NVIDIA H100", "Ascend910B", "CPU (emulated NPU)"
    emulated: bool = False  # True: the device was an emulation (a test double), not an Ascend NPU or a GPU
    emulated_on: str = ""  # verify.devices.EmulateOn: where the emulation ran
    seed: int = 0
    dump_mode: str = DumpMode.STATS.value
    ops_regex: str = ""  # tensor mode: tensors are saved for ops whose "phase/module/op" matches ("" all)
    tensor_cap_mb: float = 0.0  # tensor mode: the budget for saved tensors
    no_dropout: bool = False
    # Random draws from one keyed stream on every device (verify/capture/random_streams.py); False for runs recorded
    # before it existed. random_keyed_by_tag: every op torch tags nondeterministic_seeded drew from it (runs recorded
    # before: the dropouts and the random factories only). random_not_aligned: the random draws this run left to its
    # device's own generator, each with the reason.
    align_random: bool = False
    random_keyed_by_tag: bool = False
    random_not_aligned: list[str] = field(default_factory=list)
    # An emulated device's numerics: what it modelled of its real counterpart's (its own generator, its summation
    # order: verify/devices/emulated/npu_port_emulation/device_numerics.py), or exact_emulation: computed as the CPU
    # does.
    modelled_numerics: list[str] = field(default_factory=list)
    exact_emulation: bool = False
    # How half precision was computed: {"table": the one table that says which ops compute in float32 from half
    # inputs (verify/devices/emulated/npu_port_emulation/half_precision.py), "computed": {aten op: how, for each of its
    # ops this run computed from half inputs}}; empty on a real device or a plain CPU run.
    half_precision: dict[str, Any] = field(default_factory=dict)
    # A calibration run of the reference (verify/capture/perturbation.py): {"seed", "half", "blocks": the summation
    # order asked, "rounding": whether random rounding was asked, "rounded": whether it was done, "of": the
    # reference's run folder name}; empty for every other run.
    perturbation: dict[str, Any] = field(default_factory=dict)
    # The threads torch computed with (intra-op and inter-op), as verify gave them: every run of a pair or of
    # `verify determinism` gets the same share of the machine's cores, as some of them run at once; 0: torch's default.
    threads: int = 0
    autocast: str = ""  # autocast imposed from outside ("" none, "fp16", "bf16")
    # A reference imposed the autocast where the port computed under it (verify/capture/precision_scopes.py): the port's
    # autocast_scopes; empty: around the whole script.
    autocast_follow: dict[str, list[list[Any]]] = field(default_factory=dict)
    # A reference run at once with its port (verify/capture/followed_port.py): the port's run folder, whose autocast
    # and GradScaler it follows as the port writes them; autocast, autocast_follow and loss_scaler then say what it
    # followed. Empty: it follows a finished port's run, or none.
    follows: str = ""
    # A run going at once with the port (verify/pair/sides.py run_together): the port's run folder. Its script
    # starts once the port has made its first step or ended (imports and set-up go on meanwhile), so that what the
    # port's script prepares before it trains, a dataset it downloads or writes, is there, written once: three runs
    # downloading one file at once each truncate what another reads.
    starts_after: str = ""
    # The pair command that made this run (`verify ORIGINAL PORTED`): a random id its reference and calibration runs
    # share, so that a calibration copied from another pair of the same script is not taken for this reference's
    # (verify/record/provenance.py). Empty: a run made alone, or recorded before.
    pair: str = ""
    # What this run computed under: module path -> the autocast ("float16", "bfloat16" or "off") of each of its
    # calls, run-length encoded: [["float16", 20], ["off", 5]].
    autocast_scopes: dict[str, list[list[Any]]] = field(default_factory=dict)
    inference: bool = False  # no optimizer: each forward of the outermost module is a step
    # backward() calls the script made, each a row of losses.csv; None: a writer from before it was counted (losses
    # promised for every step of a training run)
    backward_calls: int | None = None
    steps_requested: int = 0
    steps_completed: int = 0
    status: str = Status.RUNNING.value
    message: str = ""  # one line a person can act on ("loss is NaN at step 3", "timed out after 60 s")
    exit_code: int | None = None
    traceback: str = ""
    verify_error: str = ""  # verify's own failure, not the script's (`verify run` exits 2)
    started_at: str = ""  # ISO 8601, UTC
    finished_at: str = ""
    wall_s: float = 0.0
    step_wall_s: list[float] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)  # steps whose optimizer.step() a GradScaler skipped (inf)
    # The GradScaler the script used (init_scale, growth_factor, backoff_factor, growth_interval, dynamic), or, on a
    # reference that followed a port's scaler, the twin: {"twin": "scale" | "skip-only", "followed": [...],
    # "overflowed": [steps whose gradients overflowed under the imposed scale], "script_scaler": {the above, where the
    # script scaled by itself too}}. Empty: no loss scaling.
    loss_scaler: dict[str, Any] = field(default_factory=dict)
    # A reference following the port's GradScaler: the plan its loss-scaler twin plays (LossScalerPlan.to_record(),
    # set by `verify ORIGINAL PORTED` from the port's run); empty otherwise.
    loss_scaler_plan: dict[str, Any] = field(default_factory=dict)
    # Steps in which an optimizer applied gradients that held what it had applied before, nothing having reset them
    # (zero_grad() missing: verify/capture/gradient_resets.py); without an optimizer, steps whose first backward()
    # found gradients left from an earlier step.
    grads_carried_steps: list[int] = field(default_factory=list)
    timeout_s: float | None = None  # --timeout, if any
    # Several ranks (verify/record/run_folders.py: RUN/rank0/ ...): `rank` is this rank's (0 in the run's own manifest),
    # `world_size` how many the run had (1: a single process); `nproc_per_node` how many verify launched through
    # torch.distributed.run (0: none; the script may spawn its own). process_group: the backend the script asked for
    # and the one that ran it ({"backend": "hccl", "runs_as": "gloo"} on an emulation, where gloo stands in).
    rank: int = 0
    world_size: int = 1
    nproc_per_node: int = 0
    # A run across several machines (verify/launch/nodes.py): the node (its --node-rank) whose verify ran this rank,
    # or wrote this node's manifest; `nodes` the rendezvous they met at (Nodes.to_record(); {} on one machine).
    node: int = 0
    nodes: dict[str, Any] = field(default_factory=dict)
    # The most ranks the machine holds (its cores and free memory, verify/launch/runner.py): the child refuses a script
    # that spawns more (0: no limit, --force).
    rank_limit: int = 0
    process_group: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def files_root(self) -> Path:
        """The folder the run's project_files and its ops' source lines are named from: project_root, else the
        script's folder."""
        return Path(self.project_root or Path(self.script).parent)

    @property
    def script_in_root(self) -> str:
        """The script's path as its ops' source lines name it."""
        return Path(self.script).relative_to(self.files_root).as_posix() if self.project_root else Path(
            self.script).name

    @property
    def running_script(self) -> str:
        """The script's path as it runs: in its run's view."""
        return self.seen_by_script(self.script)

    @property
    def running_cwd(self) -> str:
        """The folder the script runs in: cwd, in its run's view."""
        return self.seen_by_script(self.cwd)

    @property
    def running_root(self) -> Path:
        """files_root as the run sees it: its view, where it has one."""
        return Path(self.seen_by_script(str(self.files_root)))

    def seen_by_script(self, path: str) -> str:
        """`path` (the script, its working folder, a folder of its project) as the script sees it while it runs: in
        the run's view, where it has one."""
        return seen_in_view(path, self.working_folder) or path

    def to_json(self) -> dict[str, Any]:
        """The fields by name, each already a JSON value: not copied, as asdict would copy every nested dict and list
        (~0.4 ms on each step's write of a run's manifest, on the step's critical path)."""
        return {name: getattr(self, name) for name in _MANIFEST_FIELDS}

    @classmethod
    def from_json(cls, data: Any) -> "RunManifest":
        """The manifest `data` (parsed JSON) holds, checked against this class first: ManifestError names the first
        field that is missing, of another type than the one declared here, or a schema version this tool cannot
        read. What passes is what every reader may rely on."""
        hints = _manifest_hints()
        if not isinstance(data, dict):
            raise ManifestError(f"a JSON object expected, found {_json_kind(data)}")
        for name in REQUIRED_MANIFEST_FIELDS:
            if name not in data:
                raise ManifestError(f"field {name!r} is missing")
        for name, hint in hints.items():
            if name in data and not _conforms(data[name], hint):
                raise ManifestError(
                    f"field {name!r} is {_json_kind(data[name])}, not the {_type_name(hint)} the schema declares")
        if not 1 <= data["schema_version"] <= SCHEMA_VERSION:
            raise ManifestError(f"schema_version {data['schema_version']!r} is not one this npu-port reads (1 to "
                                f"{SCHEMA_VERSION}); compare it with the npu-port that wrote it")
        if data.get("project_root") and not Path(data["script"]).is_relative_to(data["project_root"]):
            raise ManifestError(f"field 'project_root' ({data['project_root']!r}) does not hold the script "
                                f"{data['script']!r}, whose files it names")
        known = hints.keys()
        manifest = cls(**{key: value for key, value in data.items() if key in known})
        manifest.extra.update({key: value for key, value in data.items() if key not in known})
        return manifest

    @property
    def title(self) -> str:
        """How every report names this run; an emulation is never hidden, nor a backend standing in for another."""
        return f"{self.script} on {title(self.device, self.emulated_on)}{self.ranks_words}"

    @property
    def ranks_words(self) -> str:
        """", 2 ranks (hccl run as gloo)" for a run of several ranks (", 4 ranks on 2 nodes (hccl)" across machines);
        "" for a single process."""
        if self.world_size <= 1:
            return ""
        asked, ran = self.process_group.get("backend", ""), self.process_group.get("runs_as", "")
        backend = f" ({asked} run as {ran})" if ran and ran != asked else f" ({asked})" if asked else ""
        nodes = f" on {self.nodes['nnodes']} nodes" if self.nodes else ""
        return f", {self.world_size} ranks{nodes}{backend}"


SHOWN_CHARS = 2000
"""The most of one string read from a run directory (a message, a traceback, a note, a path) that a terminal or a
report shows; the run directory keeps it whole."""


def lies_in(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or lies below it (every absolute path lies below `/`)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def in_view(path: str, root: str, view: str) -> str | None:
    """`path` as a view of the folder `root` at `view` shows it, where it lies in root; else None."""
    return view + path[len(root.rstrip(os.sep)):] if lies_in(path, root) else None


def seen_in_view(path: str, working_folder: Mapping[str, Any]) -> str | None:
    """`path` as a run sees it in its view (manifest.working_folder), where it lies in a folder the view mirrors
    whole, not in one it left out (verify's own); else None: there, and beside the way to those folders as above the
    view, the run reads and writes what lies there."""
    root, view = working_folder.get("root"), working_folder.get("view")
    if not view or not any(lies_in(path, folder) for folder in working_folder.get("mirrored_whole", [root])):
        return None
    if any(lies_in(path, os.path.join(root, name)) for name in working_folder.get("left_out", [])):
        return None
    return in_view(path, root, view)


def shown(text: str, limit: int = SHOWN_CHARS, tail: bool = False) -> str:
    """`text` as verify shows it: cut to `limit` characters (its end where `tail`, as for a traceback), the cut said."""
    if len(text) <= limit:
        return text
    cut = f"[{len(text) - limit} more characters, kept whole in the run directory]"
    return f"{cut} ...{text[-limit:]}" if tail else f"{text[:limit]}... {cut}"


def shown_json(value: Any) -> Any:
    """A JSON value with every string in it `shown()`: a manifest as a report prints it."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, list):
        return [shown_json(item) for item in value]
    if isinstance(value, dict):
        return {shown(str(key)): shown_json(item) for key, item in value.items()}
    return value




_MANIFEST_FIELDS = tuple(declared.name for declared in fields(RunManifest))  # to_json's
# What every writer of every schema version wrote; the other fields take their defaults when absent.
REQUIRED_MANIFEST_FIELDS = ("schema_version", "script", "device", "status", "steps_requested", "steps_completed")


def _manifest_hints() -> dict[str, Any]:
    return typing.get_type_hints(RunManifest)


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a parsed JSON value has the type a RunManifest annotation declares (bool is no number here)."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, argument) for argument in arguments)
    if origin is list:
        return isinstance(value, list) and all(_conforms(item, arguments[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(_conforms(item, arguments[1]) for item in value.values())
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _json_kind(value: Any) -> str:
    """A JSON value's kind, as a person reading the file names it (never the value: it may be huge)."""
    kinds = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


DEFAULT_JOIN_TIMEOUT_S = 300.0  # room to type the command on the other machines, and for torch to start there
RDZV_BACKENDS = ("c10d",)  # torchrun's own store, served by one node's agent: the only backend that needs nothing else


@dataclass(frozen=True)
class Nodes:
    """This node's place in a run across several machines, and the rendezvous they meet at (verify/launch/nodes.py
    reads them from the options; the bootstrap launches the ranks with them)."""

    nnodes: int
    node_rank: int
    endpoint: str  # HOST:PORT
    rdzv_id: str
    backend: str = "c10d"
    join_timeout: float = DEFAULT_JOIN_TIMEOUT_S

    def launcher_args(self) -> list[str]:
        """torch.distributed.run's options for this node (in place of --standalone)."""
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank), "--rdzv-backend", self.backend,
                "--rdzv-endpoint", self.endpoint, "--rdzv-id", self.rdzv_id,
                "--rdzv-conf", f"join_timeout={self.join_timeout:g},last_call_timeout=1"]

    def for_side(self, name: str, number: int) -> "Nodes":
        """The rendezvous of the `number`-th side (from 0) run at once with others: its own id and port."""
        host, _, port = self.endpoint.rpartition(":")
        return replace(self, endpoint=f"{host}:{int(port) + number}", rdzv_id=f"{self.rdzv_id}-{name}")

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "Nodes | None":
        return cls(**record) if record else None


@dataclass
class LossScalerPlan:
    """What a reference's loss-scaler twin follows: the port's GradScaler, as the port's run recorded it.

    `scales` ((step, micro_step) -> the scale the port's backward() used there; None: skip-only, the reference
    computes in fp32 and needs no scaling) and `skipped` ([step, optimizer] of each update the port's GradScaler
    skipped; optimizers numbered as in hparams.csv). Past the recorded steps the twin scales dynamically with the
    port's factors, as a GradScaler would.
    """

    skipped: list[list[int]] = field(default_factory=list)
    scales: dict[tuple[int, int], float] | None = None
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def to_record(self) -> dict[str, Any]:
        """As manifest.loss_scaler_plan keeps it (JSON: the scales as [step, micro_step, scale] rows)."""
        scales = None if self.scales is None else [[*key, scale] for key, scale in self.scales.items()]
        return asdict(self) | {"scales": scales}

    @classmethod
    def of_port(cls, scaler: dict[str, Any], skipped: Iterable[Sequence[int]],
                scales: Iterable[tuple[int, int, float]] | None) -> "LossScalerPlan":
        """The plan of a port's GradScaler (its manifest.loss_scaler), the updates it skipped ([step, optimizer]) and
        the (step, micro_step, scale) of its backward() calls (store.recorded_loss_scales; None: skip-only)."""
        return cls(skipped=[[int(step), int(index)] for step, index in skipped],
                   scales=None if scales is None else {(int(step), int(micro)): float(scale)
                                                       for step, micro, scale in scales},
                   growth_factor=scaler["growth_factor"], backoff_factor=scaler["backoff_factor"],
                   growth_interval=scaler["growth_interval"])

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> "LossScalerPlan":
        scales = data.get("scales")
        return cls(**{**data, "scales": None if scales is None else {
            (int(step), int(micro)): float(scale) for step, micro, scale in scales}})
