"""The device API of an emulated device (torch.npu of the emulated NPU, torch.cuda of the CUDA stand-in), answered by
the emulation target.

On cpu: one device; synchronize, streams and events are trivially satisfied because CPU execution is synchronous;
memory statistics are 0 (there is no device memory to count) and mem_get_info reports host memory. The device's
random generator is its own (device_numerics.OwnGenerator: a stream other than the CPU's and the other face's,
seeded by torch.manual_seed as a device's is; in exact mode, the CPU's default generator). On cuda (the NPU emulated on a GPU): each call goes to the matching torch.cuda function of the GPU.

What differs between the devices (properties, capability, precision switches) is in each face's own module:
torch_npu.npu for the NPU, npu_port_emulation.cuda for the CUDA stand-in.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import os
import time
import types
from typing import Any

import torch

from .device_numerics import OwnGenerator
from .device_errors import as_the_device
from .target import EMULATION, TARGET, check_index, device_index, target_device
from .target import device_count as device_count

ON_CUDA = TARGET == "cuda"
# The GPU functions the emulation delegates to, captured before transfer_to_npu points torch.cuda's names here.
_cuda = types.SimpleNamespace(**{name: getattr(torch.cuda, name) for name in dir(torch.cuda)
                                 if not name.startswith("__")})
# The device this module answers for, as get_device_name() says it ("NPU" or "CUDA"); set by the face installing it
# (become()).
FACE = "NPU"

# The legacy tensor types of a device module (torch.cuda.IntTensor): DeepSpeed's accelerators make their buffers with
# them (get_accelerator().IntTensor([0]))
LEGACY_TENSOR_TYPES = {
    "FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "ByteTensor": torch.uint8, "CharTensor": torch.int8, "ShortTensor": torch.int16,
    "IntTensor": torch.int32, "LongTensor": torch.int64, "BoolTensor": torch.bool,
}

__all__ = [
    "is_available", "is_initialized", "init", "device_count", "set_device", "current_device", "device", "synchronize",
    "get_device_name", "mem_get_info",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
    "get_rng_state_all", "set_rng_state_all", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "memory_stats", "memory_summary", "empty_cache", "reset_peak_memory_stats",
    "reset_max_memory_allocated", "Stream", "Event", "stream", "current_stream", "default_stream",
    "is_current_stream_capturing", "is_autocast_enabled", "set_autocast_enabled", "get_autocast_dtype",
    "set_autocast_dtype", "default_generators", *LEGACY_TENSOR_TYPES,
]

def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    """torch.manual_seed asks every device module this before seeding it."""
    return False


def init() -> None:
    """Nothing to initialise: the target is ready."""


_current_index = 0


def set_device(device: object) -> None:
    global _current_index
    index = device_index(device)
    if index is None:
        return
    _current_index = check_index(index)
    if ON_CUDA:
        _cuda.set_device(index)


def current_device() -> int:
    return _cuda.current_device() if ON_CUDA else _current_index


@contextlib.contextmanager
def device(device: object):
    """`with torch.npu.device(i):` makes npu:i current for the block."""
    previous = current_device()
    set_device(device)
    try:
        yield
    finally:
        set_device(previous)


def synchronize(device: object = None) -> None:
    if ON_CUDA:
        _cuda.synchronize(device_index(device))


def get_device_name(device: object = None) -> str:
    on = _cuda.get_device_name(device_index(device)) if ON_CUDA else "CPU"
    return f"Emulated {FACE} ({on})"


def _host_memory() -> tuple[int, int]:
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def mem_get_info(device: object = None) -> tuple[int, int]:
    """(free, total) bytes: the GPU's on cuda, the host's on cpu."""
    return _cuda.mem_get_info(device_index(device)) if ON_CUDA else _host_memory()


def _memory_statistic(name: str):
    def statistic(device: object = None) -> int:
        return getattr(_cuda, name)(device_index(device)) if ON_CUDA else 0

    statistic.__name__ = name
    statistic.__doc__ = f"torch.cuda.{name} of the GPU standing in; 0 on cpu, which has no device memory."
    return statistic


memory_allocated = _memory_statistic("memory_allocated")
max_memory_allocated = _memory_statistic("max_memory_allocated")
memory_reserved = _memory_statistic("memory_reserved")
max_memory_reserved = _memory_statistic("max_memory_reserved")


def memory_stats(device: object = None) -> dict[str, Any]:
    return _cuda.memory_stats(device_index(device)) if ON_CUDA else {}


def memory_summary(device: object = None, abbreviated: bool = False) -> str:
    if ON_CUDA:
        return _cuda.memory_summary(device_index(device), abbreviated)
    return f"{EMULATION} on cpu: no device memory statistics"


def empty_cache() -> None:
    if ON_CUDA:
        _cuda.empty_cache()


def reset_peak_memory_stats(device: object = None) -> None:
    if ON_CUDA:
        _cuda.reset_peak_memory_stats(device_index(device))


reset_max_memory_allocated = reset_peak_memory_stats


# On cpu the device generator is the face's own (device_numerics.OwnGenerator). Call it directly: torch.manual_seed
# and torch.seed themselves call torch.npu.manual_seed_all (the registered device module) and, after transfer_to_npu,
# torch.cuda's.
GENERATOR = None if ON_CUDA else OwnGenerator(FACE)


def become(face: str) -> None:
    """This module answers for `face` ("NPU" or "CUDA"): its name, and on cpu its own generator's stream."""
    global FACE, GENERATOR
    FACE = face
    GENERATOR = None if ON_CUDA else OwnGenerator(face)


def manual_seed(seed: int) -> None:
    if ON_CUDA:
        _cuda.manual_seed(seed)
    else:
        GENERATOR.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    if ON_CUDA:
        _cuda.manual_seed_all(seed)
    else:
        GENERATOR.manual_seed(seed)


def seed() -> None:
    if ON_CUDA:
        _cuda.seed()
    else:
        GENERATOR.seed()


def seed_all() -> None:
    if ON_CUDA:
        _cuda.seed_all()
    else:
        GENERATOR.seed()


def initial_seed() -> int:
    return _cuda.initial_seed() if ON_CUDA else GENERATOR.initial_seed()


def get_rng_state(device: object = "npu") -> torch.Tensor:
    return _cuda.get_rng_state(_cuda_index_or_current(device)) if ON_CUDA else GENERATOR.generator.get_state()


# The bytes of a Philox state (seed and offset), which DTensor's RNG tracker sets (OwnGenerator.philox_state).
PHILOX_STATE_BYTES = 16


def set_rng_state(new_state: torch.Tensor, device: object = "npu") -> None:
    if ON_CUDA:
        _cuda.set_rng_state(new_state, _cuda_index_or_current(device))
    elif new_state.numel() == PHILOX_STATE_BYTES:
        GENERATOR.set_philox_state(new_state)
    else:
        GENERATOR.generator.set_state(new_state)


class _DeviceGenerator:
    """torch.<device>.default_generators[i] on cpu: the device's generator, as torch.Generator's methods reach it
    (Megatron's RNG tracker reads and sets its state so), answered by the functions above."""

    def get_state(self) -> torch.Tensor:
        return get_rng_state()

    def set_state(self, new_state: torch.Tensor) -> None:
        set_rng_state(new_state)

    def manual_seed(self, seed: int) -> "_DeviceGenerator":
        manual_seed(seed)
        return self

    def initial_seed(self) -> int:
        return initial_seed()


default_generators = _cuda.default_generators if ON_CUDA else tuple(_DeviceGenerator() for _ in range(device_count()))


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(index) for index in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


def _cuda_index_or_current(device: object) -> int:
    index = device_index(device)
    return _cuda.current_device() if index is None else index


def _registered_as_torchs_own(event: type, stream: type) -> None:
    """torch 2.4's DeviceInterface (torch._dynamo, which an optimizer's step imports) asserts that the device's Event
    and Stream subclass the abstract bases in torch._streambase; they are registered with them. Later torch's
    _streambase names torch.Event and torch.Stream, which are not abstract, and asserts nothing at registration."""
    try:
        streambase = importlib.import_module("torch._streambase")
    except ModuleNotFoundError:  # a torch that dropped the deprecated module
        return
    for cls, base in ((event, streambase._EventBase), (stream, streambase._StreamBase)):
        if isinstance(base, abc.ABCMeta):
            base.register(cls)


if ON_CUDA:
    Stream = _cuda.Stream
    Event = _cuda.Event
    stream = _cuda.stream
    current_stream = _cuda.current_stream
    default_stream = _cuda.default_stream
else:

    class Event:
        """A CPU event: work is synchronous, so an event is complete when recorded; timing is wall-clock."""

        def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
            self.enable_timing = enable_timing
            self._recorded_at: float | None = None

        def record(self, stream: "Stream | None" = None) -> None:
            self._recorded_at = time.perf_counter()

        def wait(self, stream: "Stream | None" = None) -> None:
            """Nothing to wait for."""

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            """Already complete."""

        def elapsed_time(self, end_event: "Event") -> float:
            if not (self.enable_timing and end_event.enable_timing):
                raise as_the_device(RuntimeError("Events were not created with enable_timing=True"))
            if self._recorded_at is None or end_event._recorded_at is None:
                raise as_the_device(RuntimeError("Both events must be recorded before elapsed_time()"))
            return (end_event._recorded_at - self._recorded_at) * 1000.0

    class Stream(torch.Stream):
        """A CPU stream: everything already runs in order on the calling thread. A torch.Stream, which
        Tensor.record_stream takes (DeepSpeed's ZeRO-3 and FSDP record their tensors on their streams)."""

        def __new__(cls, device: object = None, priority: int = 0):
            stream = super().__new__(cls, device="cpu", priority=priority)
            stream.priority = priority  # torch.Stream keeps none to read back
            return stream

        def wait_event(self, event: Event) -> None:
            """In order already."""

        def wait_stream(self, stream: "Stream") -> None:
            """In order already."""

        def record_event(self, event: Event | None = None) -> Event:
            event = event or Event()
            event.record(self)
            return event

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            """Nothing pending."""

        def is_capturing(self) -> bool:
            """No graph capture on the CPU (optimizers ask before each step)."""
            return False

    _registered_as_torchs_own(Event, Stream)
    # record_stream keeps a tensor's memory from reuse until the stream's work is done: work on the CPU is done when
    # it returns, and torch has no CPU kernel for it.
    _record_stream_on_cpu = torch.library.Library("aten", "IMPL")
    _record_stream_on_cpu.impl("record_stream", lambda tensor, stream: None, "CPU")
    _the_stream = Stream()

    def current_stream(device: object = None) -> Stream:
        device_index(device)
        return _the_stream

    default_stream = current_stream

    @contextlib.contextmanager
    def stream(stream: Stream | None):
        yield


def is_current_stream_capturing() -> bool:
    """Optimizers ask before each step (torch's graph-capture health check, on every torch that finds the device
    available); without this, torch <= 2.9 asks the real CUDA runtime, which a machine without a GPU lacks."""
    return _cuda.is_current_stream_capturing() if ON_CUDA else False


def is_autocast_enabled() -> bool:
    return torch.is_autocast_enabled(TARGET)


def set_autocast_enabled(enabled: bool) -> None:
    torch.set_autocast_enabled(TARGET, enabled)


def get_autocast_dtype() -> torch.dtype:
    return torch.get_autocast_dtype(TARGET)


def set_autocast_dtype(dtype: torch.dtype) -> None:
    torch.set_autocast_dtype(TARGET, dtype)




class _LegacyTensorType(type):
    """torch.<device>.FloatTensor and its kin: called with data, a tensor of it; with sizes, an uninitialised tensor of
    them; both of the type's dtype on the device. As an isinstance check, a tensor of that dtype on the target (where
    the emulated device's tensors are)."""

    dtype: torch.dtype

    def __call__(cls, *args: Any) -> torch.Tensor:
        if len(args) == 1 and not isinstance(args[0], int):
            return torch.tensor(args[0], dtype=cls.dtype, device=target_device())
        return torch.empty(*args, dtype=cls.dtype, device=target_device())

    def __instancecheck__(cls, instance: Any) -> bool:
        return (isinstance(instance, torch.Tensor) and instance.dtype == cls.dtype
                and instance.device.type == TARGET)


for _name, _dtype in LEGACY_TENSOR_TYPES.items():
    globals()[_name] = _LegacyTensorType(_name, (), {"dtype": _dtype})
