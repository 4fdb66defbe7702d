"""Per-operator capture: a TorchDispatchMode that summarises every aten op's tensors, with the module path and
phase that torch.utils.module_tracker.ModuleTracker would report, at a cost close to the plain run.

Why it is cheap:
- statistics are taken by verify/capture/tensor_stats.py: one pass by a C extension on the CPU, kept on the device until
  the step ends on an accelerator, small tensors reduced many at a time;
- ops are seen by a dispatch mode, not by module and autograd-node hooks, which see modules and not the aten ops
  inside them (a functional call, the loss's arithmetic): hooks would give other records;
- view and bookkeeping ops, and ops that return uninitialised memory, are not recorded (as FlopCounterMode does);
- module paths come from two global module hooks and plain tensor hooks (verify/capture/module_scopes.py), not
  ModuleTracker's pytree walks and multi-grad hooks; per-op Python work is a few dict lookups, cached per OpOverload;
- the data flow (which recorded calls produced an op's inputs) is one dict lookup per tensor, by storage address;
- the user's line behind each call is interned per call site (verify/capture/source_lines.py), not a stack per op.
"""

from __future__ import annotations

import contextlib
import operator
import re
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import (TorchDispatchMode, _get_current_dispatch_mode, _pop_mode,
                                          _pop_mode_temporarily, _push_mode)

from verify.capture import op_hook
from verify.capture.module_scopes import ModuleScopes, leaves
from verify.capture.op_attributes import attributes
from verify.capture.source_lines import SourceLines, current_node, next_node_number
from verify.capture.tensor_stats import (Handle, PendingStats, SmallTensorStats, StatBatch, dtype_name,
                                         has_readable_data, has_statistics, host_array, md5_of, sample_fingerprints,
                                         summarize, summarize_all)
from verify.record.schema import (INPUT_OP, STAT_COLUMNS, UPDATE_OP, DumpMode, Phase, TENSORS_DIR, step_file,
                                  step_op_keys)

try:  # built by `pip install` where a C compiler is found (verify/capture/_dispatch.c)
    from verify.capture import _dispatch as native_dispatch
except ImportError:
    native_dispatch = None

aten = torch.ops.aten


def dispatch_path() -> str:
    """Which path hands the ops to the capture, as the manifest names it (manifest.extra["op_dispatch"]): the compiled
    hook (verify/capture/op_hook.py), else the C entry pip built, else the Python handler alone."""
    if op_hook.hook() is not None:
        return ("verify/capture/_op_hook.cpp: ops never recorded, autograd's detaches and the keyed streams' other ops "
                "passed in C++, recorded ops that write no argument run there and handed to the Python recording")
    not_built = f"the op hook not built: {op_hook.why_not()}"
    if native_dispatch is not None:
        return f"verify/capture/_dispatch.c: ops never recorded pass through in C ({not_built})"
    return f"Python: every op through the capture's handler (verify/capture/_dispatch.c not built; {not_built})"


_NOT_RECORDED = {
    # uninitialised memory: its contents differ from run to run and mean nothing
    aten.empty,
    aten.empty_like,
    aten.empty_strided,
    aten.new_empty,
    aten.new_empty_strided,
    # storage bookkeeping
    aten.resize_,
    aten.set_,
}

_DEAD = lambda: None  # noqa: E731  (a weak reference whose tensor is gone)
# Argument types the hook does not convert as torch hands them to a handler (torch.dtype, not the int it is stored as)
_TYPES_THE_HOOK_DOES_NOT_CONVERT = ("ScalarType", "Layout", "MemoryFormat", "Generator")
_NOT_RUN = object()  # _OpRecorder._record_call: the op is still to run


_ROW_COLUMNS = ("seq", "phase", "module", "op", "call_index", "io", "md5", "tensor_file", "inputs",
               "source", "attrs")
_PENDING_COLUMNS = ("dtype", "shape", "numel")
_ROW_FIELDS, _PENDING_FIELDS = operator.attrgetter(*_ROW_COLUMNS), operator.attrgetter(*_PENDING_COLUMNS)


@dataclass(slots=True)
class OpRow:
    seq: int
    phase: str
    module: str
    op: str
    call_index: int
    io: str
    stats: PendingStats
    md5: str = ""
    tensor_file: str = ""
    inputs: str = ""  # the seqs of the recorded calls whose outputs this call read
    source: str = ""  # the user's line that made the call ("train.py:55"; backward: the forward line it differentiates)
    attrs: str = ""  # a forward call's settings besides its tensors ("approximate='tanh'"; op_attributes.py)


class TensorSaver:
    """Tensor mode: saves the tensors of ops whose "phase/module/op" matches a regex, until a byte budget is spent."""

    def __init__(self, pattern: str | None, budget_bytes: int, save: Callable[[str, np.ndarray], str]) -> None:
        self._pattern = re.compile(pattern) if pattern else None
        self._budget = budget_bytes
        self._save = save
        self.budget_exhausted = False

    def wants(self, phase: str, module: str, op: str) -> bool:
        return self._pattern is None or self._pattern.search(f"{phase}/{module}/{op}") is not None

    def save(self, tensor: torch.Tensor, relative: str) -> str:
        size = tensor.numel() * tensor.element_size()
        if not has_readable_data(tensor) or size > self._budget:
            self.budget_exhausted = self.budget_exhausted or size > self._budget
            return ""
        self._budget -= size
        return self._save(relative, host_array(tensor))


def _storage(tensor: torch.Tensor) -> tuple[int, torch.UntypedStorage | None]:
    """Where a tensor's data lives and the storage holding it, shared by its views; (0, None) for tensors without
    storage (a subclass, a meta tensor)."""
    try:
        storage = tensor.untyped_storage()
        return storage.data_ptr(), storage
    except (RuntimeError, NotImplementedError):
        return 0, None


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Tensors of an op's outputs or arguments: a tensor, or a tuple/list of tensors (and of lists, for foreach).
    Called two or three times per recorded op: one loop, recursing only into nested lists."""
    if isinstance(value, torch.Tensor):
        return [value]
    found: list[torch.Tensor] = []
    if isinstance(value, (tuple, list)):
        for item in value:
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, (tuple, list)):
                found += tensors_in(item)
    return found


def written_arguments(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[Any]:
    """The arguments an op writes to (an in-place op's self, an out= variant's out): by its schema."""
    written = []
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        if argument.name in kwargs:
            written.append(kwargs[argument.name])
        elif position < len(args):
            written.append(args[position])
    return written


def _completed(out: Any) -> None:
    """Waits for a collective's work (gloo's all-reduce returns before its result is in the tensors; NCCL's wait only
    orders the device's stream): its outputs are recorded as the collective leaves them, not half reduced. The
    script's own wait then returns at once."""
    for item in out if isinstance(out, (tuple, list)) else (out,):
        if not isinstance(item, (torch.Tensor, list, tuple)) and callable(getattr(item, "wait", None)):
            item.wait()


def _functional_completed(out: Any) -> None:
    """A functional collective's (DTensor's all_gather_into_tensor, ...) outputs, which hold their values only once
    waited for (their buffer as allocated before): waited for, as _completed waits for c10d's; the script's own
    wait_tensor then finds the work done."""
    for tensor in tensors_in(out):
        torch.ops._c10d_functional.wait_tensor(tensor)


_FUNCTIONAL_COLLECTIVES, _FUNCTIONAL_WAIT = "_c10d_functional.", "_c10d_functional.wait_tensor"

# In-place ops whose result does not read the tensor they write, their first argument: an init's draw, a fill, a copy
# into it. In tensor mode that input is not recorded: after torch.empty (a parameter's init) it is the allocator's
# memory, whatever it held, which two runs never share, and it failed a script compared with itself.
OVERWRITTEN_FIRST = frozenset({
    "aten.uniform_", "aten.normal_", "aten.random_", "aten.bernoulli_", "aten.exponential_", "aten.geometric_",
    "aten.log_normal_", "aten.cauchy_", "aten.fill_", "aten.zero_", "aten.copy_",
})

# Ops whose later outputs are buffers they write only in part, the rest left as the allocator gave it (whatever the
# memory held, NaN among it) until a collective fills it: only the outputs before that number are recorded. FSDP2's
# all_gather_copy_in returns this rank's input to the all-gather, and the whole all-gather output it lies in.
PARTLY_UNWRITTEN = {"fsdp.all_gather_copy_in": 1}


class ServedInline(TorchDispatchMode):
    """A mode that acts on few ops (the keyed random draws: verify/capture/random_streams.py). Entered directly below
    the op capture, it is taken off the stack while the capture records, and the capture's handler calls it for the
    ops it `serves`, as the mode below would have been called: every other op then pays one Python mode, not two (a
    mode costs ~7 us per op, on the critical path of an accelerator's step). Where another mode lies between them (a
    calibration run's rounding), it stays a mode of its own. On the stack (the capture paused for the optimizer's
    step, or none entered), the ops it does not serve go straight to torch from their second call on, where the
    compiled hook is built (`passed_on`)."""

    def __init__(self) -> None:
        super().__init__()
        self._hook = None

    def serves(self, func: torch._ops.OpOverload) -> bool:
        raise NotImplementedError

    def __enter__(self) -> ServedInline:
        super().__enter__()
        self._hook = op_hook.hook()
        if self._hook is not None:
            self._hook.serve(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._hook is not None:
            self._hook.unserve(self)
        super().__exit__(*exc_info)

    def passed_on(self, func: torch._ops.OpOverload) -> None:
        """`func`, which __torch_dispatch__ does not serve, goes straight to torch from its next call on."""
        if self._hook is not None:
            self._hook.pass_through(self, func)


def _below(inline: ServedInline | None, func: torch._ops.OpOverload, types: Any, args: tuple, kwargs: dict) -> Any:
    """The op as the modes below the capture compute it: `inline`'s handler where it serves the op."""
    if inline is not None and inline.serves(func):
        return inline.__torch_dispatch__(func, types, args, kwargs)
    return func(*args, **kwargs)


class _OpRecorder(TorchDispatchMode):
    """Records a summary of each op's outputs (and inputs, in tensor mode) into `capture.rows`."""

    def __init__(self, capture: OpCapture) -> None:
        super().__init__()
        self.capture = capture
        self._names: dict[torch._ops.OpOverload, str | None] = {}
        # The ops this handler passes through go straight to torch: in C++ below torch's Python plumbing where the
        # compiled hook is built, else through the C entry that torch then calls as the instance's
        # __torch_dispatch__, which sends every other op to this handler.
        self._hook = op_hook.hook()
        self._entry = None
        if self._hook is None and native_dispatch is not None:
            self._entry = self.__torch_dispatch__ = native_dispatch.Entry(self, self.__torch_dispatch__)

    def __enter__(self) -> _OpRecorder:
        super().__enter__()
        if self._hook is not None:
            self._hook.serve(self, self._ran)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._hook is not None:
            self._hook.unserve(self)
        super().__exit__(*exc_info)

    def _name(self, func: torch._ops.OpOverload) -> str | None:
        name = self._names.get(func, self)  # self: not seen yet (OpOverload's hash is Python code, so hash once)
        if name is self:
            recorded = not func.is_view and func.namespace != "profiler" and func._overloadpacket not in _NOT_RECORDED
            name = self._names[func] = str(func._overloadpacket) if recorded else None
            self._hand_over(func, name)
        return name

    def _hand_over(self, func: torch._ops.OpOverload, name: str | None) -> None:
        """From the op's second call on, what `_below` does with it is done in compiled code: an op never recorded
        goes straight to torch (the hook or the C entry); under the hook, a recorded op that writes none of its
        arguments runs in C++ and comes to `_ran` (what the handler reads of its arguments is then as it was before
        the op). The keyed streams' ops, collectives (waited for, told to on_collective) and ops that write an
        argument (an in-place op, an out= one that may resize it) stay with the handler."""
        inline = self.capture.inline
        if inline is not None and inline.serves(func):
            return
        if name is None:
            if self._hook is not None:
                self._hook.pass_through(self, func)
            elif self._entry is not None:
                self._entry.pass_through(func)
        elif self._hook is not None and not name.startswith(("c10d.", _FUNCTIONAL_COLLECTIVES)) and not any(
                (argument.alias_info is not None and argument.alias_info.is_write)
                or any(kind in str(argument.real_type) for kind in _TYPES_THE_HOOK_DOES_NOT_CONVERT)
                for argument in func._schema.arguments):
            self._hook.record_after(self, func, name)

    def _ran(self, func: torch._ops.OpOverload, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        """The compiled hook ran `func` (_hand_over): its records, as __torch_dispatch__ writes them."""
        capture = self.capture
        if capture.recording and not (capture.own_nodes and capture.differentiating_own_work()):
            self._record_call(func, name, args, kwargs, out=out)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        capture = self.capture
        name = self._name(func) if capture.recording else None
        if name is None or (capture.own_nodes and capture.differentiating_own_work()):
            return _below(capture.inline, func, types, args, kwargs)
        return self._record_call(func, name, args, kwargs, types=types)

    def _record_call(self, func: torch._ops.OpOverload, name: str, args: tuple, kwargs: dict, types: Any = None,
                     out: Any = _NOT_RUN) -> Any:
        """The records of one call: its inputs' producers and settings, its outputs' statistics. `out`: what the op
        returned, where it ran already; else it runs here (_below) once its inputs are recorded."""
        capture = self.capture
        call = capture.begin_call(name)
        arguments = tensors_in(args)
        if kwargs:
            arguments += tensors_in(tuple(kwargs.values()))
        call.inputs = capture.producers(arguments)
        # a changed layer shows in its forward, a changed loss or activation the script computes at top level in
        # the op itself (the phases OP_CHANGED names); a backward follows from its forward
        if call.phase != _BACKWARD:
            call.attrs = attributes(func, args, kwargs)
        if capture.with_inputs:
            capture.record(call, "in", arguments[1:] if name in OVERWRITTEN_FIRST else arguments)
        if out is _NOT_RUN:
            out = _below(capture.inline, func, types, args, kwargs)
        if name.startswith("c10d."):
            _completed(out)
        elif name.startswith(_FUNCTIONAL_COLLECTIVES) and name != _FUNCTIONAL_WAIT:
            _functional_completed(out)
        outputs = tensors_in(out)
        if not outputs:  # in-place ops that return nothing (foreach): their results are the written arguments
            outputs = tensors_in(written_arguments(func, args, kwargs))
        if name in PARTLY_UNWRITTEN:
            outputs = outputs[:PARTLY_UNWRITTEN[name]]
        capture.record(call, "out", outputs)
        capture.produced(call, outputs)
        return out


_OPTIMIZER, _BACKWARD, _FORWARD, _OTHER = (phase.value for phase in (Phase.OPTIMIZER, Phase.BACKWARD, Phase.FORWARD,
                                                                     Phase.OTHER))


@dataclass(slots=True)
class _Call:
    seq: int
    phase: str
    module: str
    op: str
    call_index: int
    save_tensors: bool
    source: str
    inputs: str = ""
    attrs: str = ""  # a forward call's settings besides its tensors (verify/capture/op_attributes.py)


@contextlib.contextmanager
def _the_recorder_off(inline: ServedInline | None) -> Iterator[None]:
    """The recorder off the top of the stack, and the mode it serves inline back in its place."""
    with _pop_mode_temporarily():
        if inline is not None:
            _push_mode(inline)
        try:
            yield
        finally:
            if inline is not None:
                _pop_mode()


class OpCapture:
    """Context manager that records op summaries for the current step; `take_step` hands them over as columns.

    `paused()` keeps the instrumentation's own tensor work out of the records. Whoever watches optimizer.step() (the
    bootstrap's step hooks) calls `optimizer_step_begins` and `optimizer_step_ends` around it.
    """

    # A step's records are held until the step ends. Work after the last optimizer step (an evaluation over a whole
    # dataset, say) never ends its step, and without a bound its records filled 24 GiB on a real script.
    MAX_ROWS_PER_STEP = 200_000

    def __init__(self, dump: DumpMode, batch: StatBatch, saver: TensorSaver | None = None,
                 user_files: Path | tuple[Path, ...] = ()) -> None:
        self.dump = dump
        self.batch = batch
        self.saver = saver
        self.with_inputs = dump == DumpMode.TENSOR
        self.modules = ModuleScopes()
        # user_files: the script's folder (and the folder its run's view mirrors), whose lines the records name
        self.sources = SourceLines(*((user_files,) if isinstance(user_files, Path) else user_files))
        self.small_tensors = SmallTensorStats(batch)
        self.recording = True
        # The autograd nodes verify's own work made while paused (GradScaler.scale's product, the loss-scaler twin's),
        # as ranges of sequence numbers: their backward is not the model's either, and one side alone may have it.
        self.own_nodes: list[tuple[int, int]] = []
        self.rows: list[OpRow] = []
        self.samples: list[tuple[str, int, str, str, str]] = []  # this step's (module, call_index, io, shape, hashes)
        self._computed: dict[int, weakref.ref] = {}  # note_outputs
        # storage address -> (seq of this step's last recorded call writing it, that storage)
        self._writers: dict[int, tuple[int, weakref.ref]] = {}
        self.truncated = False  # this step reached MAX_ROWS_PER_STEP
        self._seq = 0
        self._call_counts: dict[tuple[str, str, str], int] = {}
        self._step = 0
        self._stack = contextlib.ExitStack()
        self._optimizer_pause = contextlib.ExitStack()
        self._recorder: _OpRecorder | None = None
        self.inline: ServedInline | None = None  # the mode below, served by the recorder's handler (ServedInline)
        # Called with (step, op, module) as a collective (a c10d op) is called: a rank's last collective is kept
        # where a hang leaves it (verify/capture/rank_capture.py).
        self.on_collective: Callable[[int, str, str], None] | None = None

    def __enter__(self) -> OpCapture:
        self._stack.enter_context(self.modules)
        below = _get_current_dispatch_mode()
        if isinstance(below, ServedInline):  # back on the stack when the capture ends, below nothing of ours
            self.inline = self._stack.enter_context(_pop_mode_temporarily())
            self._stack.callback(setattr, self, "inline", None)
        self._recorder = self._stack.enter_context(_OpRecorder(self))
        return self

    def __exit__(self, *exc_info: object) -> None:
        # An optimizer.step() that raised never reached optimizer_step_ends: put the recorder back first, or leaving
        # would pop a mode that is not there and hide the script's own error.
        self._optimizer_pause.close()
        self._stack.close()
        self._recorder = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Records nothing in the block. Where the recorder is the innermost mode, it is also taken off the stack: an
        op that passes through it costs 10 to 20 us even when it records nothing."""
        previous, self.recording = self.recording, False
        ours = self._recorder is not None and _get_current_dispatch_mode() is self._recorder
        first_node = next_node_number()
        try:
            with _the_recorder_off(self.inline) if ours else contextlib.nullcontext():
                yield
        finally:
            self.recording = previous
            if next_node_number() != first_node:
                self.own_nodes.append((first_node, next_node_number()))

    def differentiating_own_work(self) -> bool:
        """Whether backward is differentiating a node made while paused (own_nodes)."""
        node = current_node() if self.modules.in_backward() else None
        return node is not None and any(first <= node._sequence_nr() < end for first, end in self.own_nodes)

    def optimizer_step_begins(self) -> None:
        """optimizer.step() starts. Its ops are not recorded one by one: they are a few elementwise ops per parameter
        (30 of the 98 ops of a small CNN's step under SGD with momentum), each paying the dispatch mode's cost, while
        what they compute is the updated parameters, which `optimizer_step_ends` records."""
        self._optimizer_pause.enter_context(self.paused())

    @contextlib.contextmanager
    def closure_evaluated(self) -> Iterator[None]:
        """optimizer.step(closure) evaluates its closure: recorded in the block, as outside the step."""
        self._optimizer_pause.close()
        try:
            yield
        finally:
            self._optimizer_pause.enter_context(self.paused())

    def optimizer_step_ends(self, parameters: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Records each (name, parameter) after its update: op UPDATE_OP in the optimizer phase, the parameter's name
        as the module column (so keys read `step/optimizer/fc1.weight/update#0`)."""
        self._optimizer_pause.close()
        if not self.recording:
            return
        source = self.sources.here()  # the optimizer.step() (or scaler.step()) line
        with self.paused(), torch.no_grad():  # the statistics of a device tensor are torch ops of our own
            calls = []
            for name, parameter in parameters:
                call = self._call(_OPTIMIZER, name, UPDATE_OP, source)
                # its inputs: the recorded backward (or unscale) call that wrote the gradient it applied
                call.inputs = self.producers([parameter.grad]) if parameter.grad is not None else ""
                calls.append((call, parameter))
            # under no_grad: their statistics' copies track no gradient
            summaries = summarize_all([parameter for _, parameter in calls], self.batch, self.small_tensors)
            for (call, parameter), stats in zip(calls, summaries, strict=True):
                self.record(call, "out", [parameter], [stats])

    def note_outputs(self, output: Any) -> None:
        """An outermost module's outputs: what a later outermost module (a loss) receives of them is computed, not
        data, and record_inputs leaves it out. Kept by id with a weak reference (a tensor's == is elementwise)."""
        for leaf in leaves(output):
            if isinstance(leaf, torch.Tensor):
                self._computed[id(leaf)] = weakref.ref(leaf)

    def _is_data(self, tensor: torch.Tensor) -> bool:
        """Read from a dataset rather than computed in this step: no autograd history, and no outermost module's
        output (nor a view of one)."""
        if tensor.grad_fn is not None:
            return False
        return not any(candidate is not None and self._computed.get(id(candidate), _DEAD)() is candidate
                       for candidate in (tensor, tensor._base))

    def record_inputs(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        """The data an outermost module's forward receives (op INPUT_OP): its positional arguments' tensors (io in0,
        in1...) and its keyword ones by name, in the order of their names (`model(**batch)`: in.attention_mask,
        in.input_ids, in.labels, however a port's batch orders its keys): the batch each side read, which the
        comparison checks before any operator; a loss module's labels too, not the predictions it gets
        (note_outputs). Integer tensors (token ids, labels) are summarised as float64 values, so that their mean and
        norm, not only their min and max, tell two batches apart. Each record's inputs are the recorded calls of the
        step that wrote it (a batch collated or transformed in this process; a GAN's generated samples, detached),
        so that compare tells data read from data computed."""
        inputs = self._data_inputs(args, kwargs)
        if not inputs or not self.recording:
            return
        with self.paused(), torch.no_grad():
            call = self._call(_FORWARD, self.modules.name(module), INPUT_OP, self.sources.here())
            for io, tensor in inputs:
                exact = not tensor.is_floating_point() and has_statistics(tensor)
                stats = summarize(tensor.double() if exact else tensor, self.batch, self.small_tensors)
                stats.dtype = dtype_name(tensor.dtype)
                md5 = md5_of(tensor) if self.dump == DumpMode.MD5 else ""
                self.rows.append(OpRow(call.seq, call.phase, call.module, call.op, call.call_index, io,
                                       stats, md5, inputs=self.producers([tensor]), source=call.source))
                self.samples.append((call.module, call.call_index, io, stats.shape, sample_fingerprints(tensor)))

    def _data_inputs(self, args: Any, kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
        """(io, tensor) of the data among a forward's arguments: positional ones numbered, keyword ones named."""
        def data(value: Any) -> list[torch.Tensor]:
            return [leaf for leaf in leaves(value) if isinstance(leaf, torch.Tensor) and self._is_data(leaf)]

        named = [(f"in{position}", tensor) for position, tensor in enumerate(data(args))]
        for key in sorted(kwargs):
            tensors = data(kwargs[key])
            named += [(f"in.{key}" + (str(index) if len(tensors) > 1 else ""), tensor)
                      for index, tensor in enumerate(tensors)]
        return named

    def producers(self, tensors: Sequence[torch.Tensor]) -> str:
        """The recorded calls of this step that wrote the storage of `tensors` (views included), as "seq,seq"."""
        writers, seqs = self._writers, []  # (address 0, no storage, is never written: see produced)
        for address, storage in map(_storage, tensors):
            written = writers.get(address)
            # the storage that op wrote, not a later one at its freed address: torch keeps one Python object per
            # storage while it lives, so a live one is the same object
            if written is not None and written[1]() is storage:
                seqs.append(written[0])
        if len(seqs) < 2:  # most calls: one producer or none, at the cost of a lookup
            return str(seqs[0]) if seqs else ""
        return ",".join(map(str, sorted(set(seqs))))

    def produced(self, call: _Call, outputs: Sequence[torch.Tensor]) -> None:
        for tensor in outputs:
            address, storage = _storage(tensor)
            if address:
                self._writers[address] = (call.seq, weakref.ref(storage))

    def begin_call(self, op: str) -> _Call:
        module = self.modules.innermost
        if self.on_collective is not None and op.startswith("c10d."):
            self.on_collective(self._step, op, module)
        if self.modules.in_backward():
            return self._call(_BACKWARD, module, op, self.sources.backward())
        return self._call(_FORWARD if module else _OTHER, module, op, self.sources.forward())

    def _call(self, phase: str, module: str, op: str, source: str) -> _Call:
        counter = (phase, module, op)
        call_index = self._call_counts.get(counter, 0)
        self._call_counts[counter] = call_index + 1
        self._seq += 1
        save = self.saver is not None and self.saver.wants(phase, module, op)
        return _Call(self._seq - 1, phase, module, op, call_index, save, source)

    def record(self, call: _Call, io: str, tensors: Sequence[torch.Tensor],
               summaries: Sequence[PendingStats] | None = None) -> None:
        """A row per tensor of the call's `io`, with its statistics (`summaries` where the caller took them)."""
        if len(self.rows) >= self.MAX_ROWS_PER_STEP:
            self._stop_recording_this_step()
            return
        for position, tensor in enumerate(tensors):
            stats = summarize(tensor, self.batch, self.small_tensors) if summaries is None else summaries[position]
            row = OpRow(call.seq, call.phase, call.module, call.op, call.call_index, f"{io}{position}",
                        stats, inputs=call.inputs, source=call.source, attrs=call.attrs)
            if self.dump == DumpMode.MD5:
                row.md5 = md5_of(tensor)
            if call.save_tensors:
                relative = f"{TENSORS_DIR}/{step_file(self._step, '')}/{call.seq:06d}-{row.io}.npy"
                row.tensor_file = self.saver.save(tensor, relative)
            self.rows.append(row)

    def _stop_recording_this_step(self) -> None:
        if not self.truncated:
            self.truncated = True
            print(f"npu-port: op capture stopped at {self.MAX_ROWS_PER_STEP} records in step {self._step}; the rest of "
                  "this step is not recorded (work after the last optimizer step, such as a long evaluation, stays "
                  "in one step)", file=sys.stderr, flush=True)

    def take_step(self, step: int, fetched: Callable[[Handle], list[float]]) -> dict[str, list[Any]]:
        """The rows of `step` as OP_COLUMNS lists (statistics resolved from `fetched`); starts the next step."""
        return step_columns(step, self.close_step(step), fetched)

    def close_step(self, step: int) -> list[OpRow]:
        """The rows of `step`, whose statistics may still be on their way (`step_columns` resolves them once read);
        starts the next step."""
        rows = self.rows
        self.discard_step(step + 1)
        return rows

    def discard_step(self, next_step: int) -> None:
        self.small_tensors.discard()
        self._computed = {}
        self._writers = {}
        self.own_nodes = []
        self.modules.release_leaf_hooks()
        self.sources.discard_step()
        self.rows = []
        self.samples = []
        self.truncated = False
        self._seq = 0
        self._call_counts = {}
        self._step = next_step


def sample_columns(samples: list[tuple[str, int, str, str, str]]) -> dict[str, list[Any]]:
    """A step's sample fingerprints (OpCapture.samples) as SAMPLE_COLUMNS lists."""
    names = ("module", "call_index", "io", "shape", "fingerprints")
    return {name: list(column) for name, column in zip(names, zip(*samples))} if samples else {}


def step_columns(step: int, rows: list[OpRow], fetched: Callable[[Handle], list[float]]) -> dict[str, list[Any]]:
    """A step's rows as OP_COLUMNS lists, their statistics resolved from `fetched`. Every record holds one value per
    name, or this raises: a value never lands in another's column."""
    records = [(*_ROW_FIELDS(row), *_PENDING_FIELDS(row.stats), *row.stats.values(fetched)) for row in rows]
    names = (*_ROW_COLUMNS, *_PENDING_COLUMNS, *STAT_COLUMNS)
    columns = dict(zip(names, map(list, zip(*records, strict=True)) if records else ([] for _ in names),
                       strict=True))
    keys = step_op_keys(step, columns["phase"], columns["module"], columns["op"], columns["call_index"])
    return {"step": [step] * len(rows), "key": keys, **columns}
