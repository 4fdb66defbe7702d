"""What an emulated device changes in torch: `import torch_npu` on the emulated NPU (face "npu"), and the CUDA
stand-in (face "cuda") that the bootstrap installs for a reference without a GPU.

The face's device type is real to torch.device, but no tensor is ever placed on it: every torch function and method
that takes a device is wrapped to send the redirected device types (npu; cuda too after transfer_to_npu, or for the
stand-in) to the emulation target. Consequences a script can see:
- `tensor.device` is the target (cpu or cuda), so `x.device.type == "npu"` is False; `torch.device("npu").type`
  is still "npu".
- `tensor.is_npu` (`is_cuda` for the stand-in) is True for every tensor on the target: on cpu that is every CPU
  tensor, since the emulation cannot tell host memory from device memory.
- torch.accelerator names the face's device, and DataParallel on the cpu target wraps nothing, as on a CPU.
"""

from __future__ import annotations

import copyreg
import functools
import importlib
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.utils._device
from torch.utils._python_dispatch import _disable_current_modes

from . import deepspeed_runtime, device_api, sharding
from .asked import note
from .target import TARGET, redirected_types, target_device, translate

DEVICE_KEYWORDS = ("device", "device_type", "map_location", "device_id")

FACTORIES = (
    "tensor", "as_tensor", "asarray", "scalar_tensor", "zeros", "ones", "empty", "full", "empty_strided",
    "zeros_like", "ones_like", "empty_like", "full_like", "rand", "randn", "randint", "rand_like", "randn_like",
    "randint_like", "randperm", "normal", "arange", "range", "linspace", "logspace", "eye", "tril_indices",
    "triu_indices", "bartlett_window", "blackman_window", "hamming_window", "hann_window", "kaiser_window",
    "sparse_coo_tensor", "sparse_csr_tensor", "sparse_compressed_tensor", "frombuffer", "from_file", "load",
    "set_default_device",
)
# Factories that draw random numbers: given the emulated device, they draw from its own generator, as a device does.
RANDOM_FACTORIES = ("rand", "randn", "randint", "randperm")
TENSOR_METHODS = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros")


def _translate_map_location(value: object) -> object:
    """map_location maps saved locations (keys, kept: they name what the checkpoint holds) to devices (values)."""
    if isinstance(value, dict):
        return {saved: translate(device) for saved, device in value.items()}
    return translate(value)


def _translate_arguments(args: tuple, kwargs: dict[str, Any], ints_are_devices: bool) -> tuple[tuple, dict]:
    args = tuple(translate(arg, ints_are_devices) for arg in args)
    for keyword in DEVICE_KEYWORDS:
        if keyword in kwargs:
            kwargs[keyword] = (
                _translate_map_location(kwargs[keyword])
                if keyword == "map_location"
                else translate(kwargs[keyword], ints_are_devices=True)
            )
    return args, kwargs


def accepting_npu(fn: Callable, ints_are_devices: bool = False) -> Callable:
    """`fn`, with npu device arguments sent to the emulation target."""

    @functools.wraps(fn)
    def on_target(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _translate_arguments(args, kwargs, ints_are_devices)
        return fn(*args, **kwargs)

    return on_target


def drawing_on_device(fn: Callable) -> Callable:
    """A random factory that, given the emulated device and no generator, draws from the device's own generator
    (device_api.GENERATOR: the CPU's default one in exact mode)."""

    @functools.wraps(fn)
    def draw(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        own = device_api.GENERATOR
        if own is not None and device is not None and kwargs.get("generator") is None:
            if translate(device, ints_are_devices=True) != device:  # the emulated device, not the host
                kwargs["generator"] = own.generator
        return fn(*args, **kwargs)

    return draw


def _wrap_all(owner: object, names: tuple[str, ...], ints_are_devices: bool = False) -> None:
    for name in names:
        if hasattr(owner, name):
            setattr(owner, name, accepting_npu(getattr(owner, name), ints_are_devices))


def _to_face(face: str) -> Callable[..., Any]:
    """`tensor.npu()` / `tensor.cuda()`: to the face's device (the target), an int naming its index."""

    def to_face(self: Any, device: object = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        return self.to(translate(face if device is None else device, ints_are_devices=True),
                       **({"non_blocking": non_blocking} if isinstance(self, torch.Tensor) else {}))

    to_face.__name__ = face
    return to_face


def _is_on_target(self: torch.Tensor) -> bool:
    return self.device.type == TARGET


def _pin_memory(original: Callable) -> Callable:
    """Pinning is host-to-NPU transfer tuning, with nothing to pin on the cpu target: the tensor itself."""

    @functools.wraps(original)
    def pin_memory(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self if TARGET == "cpu" else original(self)

    return pin_memory


def _ddp_init(original: Callable) -> Callable:
    """DDP's device_ids name GPUs (here NPUs); a module on the CPU takes none."""

    @functools.wraps(original)
    def __init__(self: Any, module: torch.nn.Module, device_ids: Any = None, output_device: Any = None, *args, **kwargs):
        if TARGET == "cpu":
            device_ids = output_device = None
        elif device_ids is not None:
            device_ids = [translate(device, ints_are_devices=True) for device in device_ids]
            output_device = translate(output_device, ints_are_devices=True)
        original(self, module, device_ids, output_device, *args, **kwargs)

    return __init__


def _zeroed_as_fresh_device_memory(original: Callable) -> Callable:
    """Module.to_empty: a model built on the meta device gets memory on the emulated device that reads as zeros, as
    a device's fresh allocations read (its driver clears pages before a process gets them), never the host's
    leftovers, which differ from run to run and between the sides (pytorch/examples' FSDP2 Transformer initialises
    only some of its parameters after to_empty). Zeroed below every dispatch mode: no op of the script's."""

    @functools.wraps(original)
    def to_empty(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        module = original(self, *args, **kwargs)
        note("fresh_memory")
        with torch.no_grad(), _disable_current_modes():
            for tensor in (*module.parameters(), *module.buffers()):
                getattr(tensor, "_local_tensor", tensor).zero_()  # a DTensor: this rank's shard
        return module

    return to_empty


def _no_data_parallel_device() -> None:
    """DataParallel asks which accelerator to split the batch over; on the cpu target there is none to split over,
    so it wraps nothing and runs the module as it does on a CPU."""
    return None


def install_accelerator(face: str, device_api: Any) -> None:
    """torch.accelerator answers for the face's device (scripts such as pytorch/examples choose their device by it),
    asking the emulated device API."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:  # torch < 2.6 has no torch.accelerator for a script to ask
        return
    accelerator.is_available = lambda: True
    accelerator.current_accelerator = lambda check_available=False: torch.device(face)
    accelerator.device_count = device_api.device_count
    accelerator.current_device_index = device_api.current_device
    accelerator.set_device_index = device_api.set_device
    accelerator.synchronize = device_api.synchronize
    accelerator.current_stream = device_api.current_stream
    accelerator.set_stream = lambda stream: None  # one stream, always current


_TORCH_DEVICE = torch.device


class _DeviceIndexedByFace(type):
    """The metaclass of torch.device's stand-in (install_device_index): a bare index names the face's device, every
    other call, isinstance() and issubclass() are torch.device's own."""

    face = ""

    def __call__(cls, *args: Any, **kwargs: Any) -> torch.device:
        if len(args) == 1 and not kwargs and type(args[0]) is int:
            return _TORCH_DEVICE(cls.face, args[0])
        return _TORCH_DEVICE(*args, **kwargs)

    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, _TORCH_DEVICE)

    def __subclasscheck__(cls, subclass: type) -> bool:
        return issubclass(subclass, _TORCH_DEVICE)


def install_device_index(face: str) -> None:
    """`torch.device(0)` is device 0 of the current accelerator, which torch asks its C++ hooks for: on a CPU build
    none answers for the CUDA stand-in ("Cannot access accelerator device when none is available", from transformers'
    device_map="auto", which names devices by index, or `torch.device(torch.cuda.current_device())`). Where torch
    cannot answer, torch.device becomes a stand-in that answers with the face's device. A device still pickles as
    torch.device (copyreg: the stand-in carries torch.device's name), so what the run saves loads in any process."""
    try:
        _TORCH_DEVICE(0)
        return  # torch's own hooks answer (the emulated NPU's, registered by install_privateuse1_hooks)
    except RuntimeError:
        pass
    stand_in = _DeviceIndexedByFace("device", (), {"face": face, "__module__": "torch", "__qualname__": "device",
                                                   "__doc__": _TORCH_DEVICE.__doc__})
    torch.device = stand_in
    copyreg.pickle(_TORCH_DEVICE, lambda device: (stand_in, (str(device),)))


def install_device_patches(face: str) -> None:
    _wrap_all(torch, FACTORIES)
    for name in RANDOM_FACTORIES:
        setattr(torch, name, drawing_on_device(getattr(torch, name)))
    _wrap_all(torch.Tensor, TENSOR_METHODS)
    _wrap_all(torch.Tensor, ("to",), ints_are_devices=True)
    _wrap_all(torch.nn.Module, ("to", "to_empty"), ints_are_devices=True)
    torch.nn.Module.to_empty = _zeroed_as_fresh_device_memory(torch.nn.Module.to_empty)
    _wrap_all(torch.fft, ("fftfreq", "rfftfreq"))
    torch.utils._device.DeviceContext.__init__ = accepting_npu(torch.utils._device.DeviceContext.__init__)
    torch.Tensor.pin_memory = _pin_memory(torch.Tensor.pin_memory)
    setattr(torch.Tensor, face, _to_face(face))
    setattr(torch.Tensor, f"is_{face}", property(_is_on_target))
    setattr(torch.nn.Module, face, _to_face(face))
    ddp = torch.nn.parallel.DistributedDataParallel
    ddp.__init__ = _ddp_init(ddp.__init__)
    if TARGET == "cpu":
        # the module, not torch.nn.parallel.data_parallel: that name is the data_parallel() function
        importlib.import_module("torch.nn.parallel.data_parallel")._get_available_device_type = _no_data_parallel_device


def _autocast_init(original: Callable) -> Callable:
    """torch.autocast("npu") is autocast on the target, float16 unless told otherwise, as on the NPU."""

    @functools.wraps(original)
    def __init__(self: Any, device_type: str, dtype: torch.dtype | None = None, *args: Any, **kwargs: Any) -> None:
        translated = translate(device_type)
        if translated != device_type and dtype is None:
            dtype = torch.float16
        original(self, translated, dtype, *args, **kwargs)

    return __init__


def _autocast_state_query(original: Callable) -> Callable:
    """torch.is_autocast_enabled/get_autocast_dtype: "npu" asks the target; no argument asks the npu once cuda is
    redirected (the real transfer_to_npu does the same)."""

    @functools.wraps(original)
    def query(device_type: str | None = None) -> Any:
        if device_type is None:
            return original(TARGET) if "cuda" in redirected_types else original()
        return original(translate(device_type))

    return query


def _autocast_state_setter(original: Callable) -> Callable:
    @functools.wraps(original)
    def setter(*args: Any) -> None:
        if len(args) == 1 and "cuda" in redirected_types:  # the legacy one-argument form meant cuda
            args = (TARGET, args[0])
        original(*(translate(arg) for arg in args))

    return setter


def install_amp_patches() -> None:
    autocast = torch.amp.autocast_mode.autocast
    autocast.__init__ = _autocast_init(autocast.__init__)
    torch.amp.GradScaler.__init__ = accepting_npu(torch.amp.GradScaler.__init__)
    torch.amp.custom_fwd = accepting_npu(torch.amp.custom_fwd)
    torch.amp.custom_bwd = accepting_npu(torch.amp.custom_bwd)
    torch.is_autocast_enabled = _autocast_state_query(torch.is_autocast_enabled)
    torch.get_autocast_dtype = _autocast_state_query(torch.get_autocast_dtype)
    torch.set_autocast_enabled = _autocast_state_setter(torch.set_autocast_enabled)
    torch.set_autocast_dtype = _autocast_state_setter(torch.set_autocast_dtype)
    # The NPU's autocast default is float16; on the cpu target the default would be bfloat16.
    torch.set_autocast_dtype(TARGET, torch.float16)


def _hccl_stand_in(store: Any, rank: int, world_size: int, timeout: Any) -> Any:
    """hccl runs as gloo: gloo handles CPU tensors, and the CUDA tensors of the collectives DDP uses."""
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def _rewrite_backend(backend: str) -> str:
    """"hccl", "npu:hccl", and with cuda redirected "nccl" / "cuda:nccl", as backends on the target's device; for the
    CUDA stand-in, nccl is gloo (the stand-in has no NPU, so no hccl either)."""
    if "cuda" in redirected_types:
        backend = backend.replace("nccl", "hccl" if "npu" in redirected_types else "gloo")
    per_device: dict[str, str] = {}
    for part in backend.split(","):
        device, _, name = part.rpartition(":")
        device = translate(device).split(":")[0] if device else ""
        per_device.setdefault(device, name)  # two devices that land on the same target: the first one wins
    return ",".join(f"{device}:{name}" if device else name for device, name in per_device.items())


def _init_process_group(original: Callable, default_backend: str | None) -> Callable:
    """`default_backend`: the face's, for a call that names none (torch would pick its accelerator's backend for the
    face's device type, which no tensor is on)."""

    @functools.wraps(original)
    def init_process_group(backend: str | None = None, *args: Any, **kwargs: Any) -> None:
        backend = backend or default_backend
        if isinstance(backend, str):
            backend = _rewrite_backend(backend)
        if "device_id" in kwargs:
            kwargs["device_id"] = translate(kwargs["device_id"], ints_are_devices=True)
            if TARGET == "cpu":
                kwargs.pop("device_id")  # binding a process group to a device is for accelerators only
        original(backend, *args, **kwargs)

    return init_process_group


def install_distributed_patches(face: str) -> None:
    if not dist.is_available():
        return
    if face == "npu" and "hccl" not in dist.Backend.backend_list:
        dist.Backend.register_backend("hccl", _hccl_stand_in, devices=[target_device().split(":")[0]])
        dist.is_hccl_available = lambda: True
    if face == "npu" and hasattr(dist.Backend, "default_device_backend_map"):
        # as torch_npu registers hccl for its device: get_default_backend_for_device("npu:0") is "hccl"
        dist.Backend.default_device_backend_map.setdefault("npu", "hccl")
    if face == "cuda":
        dist.is_nccl_available = lambda: True
    _replace_everywhere("init_process_group",
                        _init_process_group(dist.init_process_group, "hccl" if face == "npu" else None))
    process_group = dist.ProcessGroup
    process_group.barrier = _barrier_on_target(process_group.barrier)
    sharding.install()
    deepspeed_runtime.install(face)


# Modules of torch that bind c10d's functions by name at import: DeviceMesh starts the default process group itself
# (init_process_group() with no backend, from init_device_mesh), which must take the face's backend too.
_BINDING_MODULES = ("torch.distributed.distributed_c10d", "torch.distributed.device_mesh")


def _replace_everywhere(name: str, replacement: Callable) -> None:
    """torch.distributed.`name`, and the same name where torch's modules imported it, is `replacement`."""
    setattr(dist, name, replacement)
    for module_name in _BINDING_MODULES:
        module = importlib.import_module(module_name)
        if hasattr(module, name):
            setattr(module, name, replacement)


def _barrier_on_target(original: Callable) -> Callable:
    """dist.barrier() synchronises on a tensor of the device it names: the accelerator torch finds (the NPU, through
    install_privateuse1_hooks) or device_ids' NPU. The tensor is made where the emulation computes."""

    @functools.wraps(original)
    def barrier(self: Any, opts: Any = None) -> Any:
        if opts is None:
            return original(self)
        if opts.device is not None:
            opts.device = translate(opts.device)
        return original(self, opts=opts)

    return barrier


_hooks: list[Any] = []  # the registered hooks, alive as long as torch may call them


def install_privateuse1_hooks(face: str) -> None:
    """torch asks the C++ hooks of the PrivateUse1 backend that `face` renames (torch._C._get_accelerator(): in
    dist.barrier(), init_process_group() without a backend, torch.get_device_module()), which torch_npu registers in
    C++: "Please register PrivateUse1HooksInterface" otherwise. This Python stand-in registers them through torch's
    Python binding of them where the installed torch has it (torch._C._acc); on a torch without it, the accelerator
    torch's Python asks for is the face's."""
    binding = getattr(torch._C, "_acc", None)
    if binding is not None and hasattr(binding, "register_python_privateuseone_hook"):

        class Hooks(binding.PrivateUse1Hooks):
            def is_available(self) -> bool:
                return True

            def has_primary_context(self, device_index: int) -> bool:
                return True

            def is_built(self) -> bool:
                return True

        _hooks.append(Hooks())
        binding.register_python_privateuseone_hook(_hooks[-1])
    elif hasattr(torch._C, "_get_accelerator"):
        torch._C._get_accelerator = lambda check=None: torch.device(face)
