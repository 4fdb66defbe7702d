"""Random numbers that a GPU, an NPU and the CPU draw alike, so that a port is compared on the same random draws.

Each device draws from its own generator (CUDA's Philox, the NPU's npu_dropout_gen_mask with its own seed and
offset; the emulated devices model that: verify/devices/emulated/npu_port_emulation/device_numerics.py), so on real
hardware every op after a random draw differs between the sides, whatever the port does. With the streams aligned (the
default; `--no-align-random` leaves each device its own), every op torch tags `nondeterministic_seeded` (bernoulli_,
normal_, uniform_, randn_like, multinomial, native_dropout, rrelu's noise, the dropout an nn.LSTM draws between its
layers on the CPU, ...) draws on the CPU, below the other dispatch modes (an emulated device's own generator among
them), from the CPU generator seeded by a key of the script's seed (the host generator's, as the script last set
it: per rank where the script seeds each rank its own), the step, the innermost module path, the op, its sizes and the
call's number in that step and module; its result goes to the tensor's device. Draws then match on any
two devices, and stay matched where one side makes more or fewer random calls elsewhere. Before the first module call
(a model's initial weights, data made before training) an op draws from the host's generator as it stands, as in a
plain run: on both sides the host's generator is seeded alike. An op given a generator of the script's own draws from
it. KeyedDraws is that dispatch mode; NOT_KEYED names the tagged ops it cannot key (kernels that draw inside, with
no CPU kernel to draw with), and the run's manifest names each of them a run calls with a draw (random_not_aligned).

Three Python-level entries keep the ops a run records the same on every device: the functional dropouts (the modules
call them: nn.Dropout, nn.Dropout1d/2d/3d) draw their mask from the same keyed stream and multiply by it (one aten.mul
where the CPU records bernoulli_, div_ and mul and CUDA native_dropout); scaled_dot_product_attention with dropout is
computed as its documented math path (a fused kernel draws inside); and the random factories torch.rand, randn,
randint and randperm, asked for a tensor on a device (device=..., the CPU too, or an accelerator as torch's default
device) without a generator of the script's own, draw on the CPU and move the result there: a GPU script's CPU code
path (--device-ref cpu) draws its `device=device` tensors as its GPU path does, and neither touches the host's
generator. Their drawing is hidden from the op capture: both sides record the same ops on what was drawn.

`--no-dropout` turns every dropout off instead (as msprobe's seed_all(rm_dropout=True) does).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_map

from verify.capture.module_calls import ModuleCalls
from verify.capture.ops import ServedInline, written_arguments
from verify.capture.sharded_stats import is_dtensor, local_part, splits

# The functional dropouts whose masks are drawn from the keyed stream: name -> spatial dimensions dropped together
# (0: each element on its own).
KEYED_DROPOUTS = {"dropout": 0, "dropout1d": 1, "dropout2d": 2, "dropout3d": 3}
_DROPOUT_FUNCTIONS = (*KEYED_DROPOUTS, "alpha_dropout", "feature_alpha_dropout")  # --no-dropout turns all off
# The factories that draw a new random tensor of a given size: keyed when asked for one on a device.
KEYED_FACTORIES = ("rand", "randn", "randint", "randperm")
ATTENTION = "scaled_dot_product_attention"
# The device whose tensors hold no data: a draw there draws nothing, in a plain run as here (the initial weights of a
# model built under `with torch.device("meta")`, as transformers builds one before loading its weights).
_NO_DATA = "meta"

# The ops torch tags nondeterministic_seeded that cannot draw from the keyed stream, and why: each draws inside a
# device's kernel with no CPU kernel to draw with instead. Every other tagged op is keyed; tests/verify/
# test_random_streams.py enumerates the tag in the installed torch against this table.
_RNN_KERNEL = ("cuDNN (MIOpen) draws a recurrent module's dropout between layers inside its kernel, from a state of "
               "its own; keyed where the module runs without it (the CPU, or torch.backends.cudnn.enabled = False)")
_FUSED_ATTENTION = ("a fused attention kernel draws its dropout inside, from the device's own stream; "
                    "F.scaled_dot_product_attention with dropout is computed by its math path instead, so only a "
                    "direct call reaches it")
_REPLAYED = "replays the dropout its forward kernel drew (aligned where that forward is)"
NOT_KEYED = {
    "aten._cudnn_rnn": _RNN_KERNEL, "aten.miopen_rnn": _RNN_KERNEL,
    "aten._fused_dropout": "CUDA's fused dropout kernel, called directly (F.dropout's masks are keyed)",
    **dict.fromkeys(("aten._flash_attention_forward", "aten._flash_attention_forward_no_dropout_inplace",
                     "aten._efficient_attention_forward", "aten._scaled_dot_product_flash_attention",
                     "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention",
                     "aten._scaled_dot_product_fused_attention_overrideable"), _FUSED_ATTENTION),
    "aten._scaled_dot_product_efficient_attention_backward": _REPLAYED,
    "aten._scaled_dot_product_cudnn_attention_backward": _REPLAYED,
    "aten._scaled_dot_product_attention_math_for_mps": "Apple MPS's attention, with no CPU kernel",
    "aten._scaled_dot_product_flash_attention_for_cpu": "never draws: its CPU kernel refuses dropout",
    **dict.fromkeys(("aten._cudnn_attention_forward", "aten._triton_scaled_dot_attention",
                     "aten._fill_mem_eff_dropout_mask_"), _FUSED_ATTENTION),
    "aten._cudnn_attention_backward": _REPLAYED,
    "aten._cudnn_init_dropout_state": _RNN_KERNEL,
    "aten._lstm_mps": "Apple MPS's LSTM, with no CPU kernel",
    "aten._nested_tensor_softmax_with_shape": "a nested tensor's softmax, with no CPU kernel",
    "aten._fused_sdp_choice": "never draws: it picks an attention kernel",
}


class KeyedStream(ModuleCalls):
    """CPU generators keyed by (the script's seed, step, innermost module path, kind of draw, call number). The seed
    is the host generator's as the script last set it (torch.initial_seed(): verify's seed + the rank where the script
    sets none), so that the streams follow the script's seeding: ranks it seeds alike draw alike, ranks it seeds each
    its own (torch.manual_seed(seed + rank)) draw each their own, as on the devices."""

    def __init__(self, step: Callable[[], int], not_aligned: list[str]) -> None:
        super().__init__()
        self.step = step
        self.not_aligned = not_aligned  # manifest: the random draws left to each device's generator
        self._paths = [""]
        self._calls: dict[tuple[int, str, str], int] = {}
        self.began = False  # a module was called: draws until then are setup, the host's (KeyedDraws)

    @property
    def path(self) -> str:
        return self._paths[-1]

    def entering(self, path: str, args: Any, outermost: bool) -> None:
        self.began = True
        self._paths.append(path)

    def left(self) -> None:
        self._paths.pop()

    def key(self, kind: str = "") -> int:
        """The seed of the next draw of `kind` (an op or a factory and its sizes; "" for dropout masks): the same on
        every device, whatever else a side drew, of other kinds or elsewhere."""
        step, path = self.step(), self.path
        number = self._calls[step, path, kind] = self._calls.get((step, path, kind), -1) + 1
        seed = torch.initial_seed()  # a keyed draw seeds the host's generator only inside fork_rng, which restores it
        key = hashlib.blake2b(f"{seed}/{step}/{path}/{kind}{number}".encode(), digest_size=8).digest()
        return int.from_bytes(key, "little") >> 1

    def generator(self, kind: str = "") -> torch.Generator:
        """A CPU generator for the next draw of `kind`, seeded by its key."""
        return torch.Generator().manual_seed(self.key(kind))

    def scaled_mask(self, shape: tuple[int, ...], keep: float, like: torch.Tensor) -> torch.Tensor:
        """The kept units as 1 / keep, the dropped as 0, in `like`'s dtype and on its device."""
        generator = self.generator()
        with _disable_current_modes(), torch.no_grad():
            kept = torch.rand(shape, generator=generator) < keep
            return (kept * (1.0 / keep)).to(device=like.device, dtype=like.dtype)

    def note_not_aligned(self, what: str) -> None:
        if what not in self.not_aligned:
            self.not_aligned.append(what)


def _keyed_dropout(stream: KeyedStream, original: Callable[..., Any], spatial: int) -> Callable[..., Any]:
    @functools.wraps(original)
    def dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
        if not training or p == 0.0 or p == 1.0 or not input.is_floating_point():
            return original(input, p, training, inplace)
        keep = 1.0 - p
        shape = tuple(input.shape[:input.dim() - spatial]) + (1,) * spatial
        mask = stream.scaled_mask(shape, keep, input)
        return input.mul_(mask) if inplace else input * mask

    return dropout


def _keyed_attention(stream: KeyedStream, original: Callable[..., Any]) -> Callable[..., Any]:
    """scaled_dot_product_attention with dropout: its attention weights computed as its documented reference does
    (the math path) and dropped with the keyed stream's mask; without dropout, the device's own kernel."""

    @functools.wraps(original)
    def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
                  dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                  enable_gqa: bool = False) -> torch.Tensor:
        if dropout_p == 0.0:  # enable_gqa passed on only when asked for: torch 2.4's kernel has no such argument
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                            **({"enable_gqa": True} if enable_gqa else {}))
        if enable_gqa:
            key = key.repeat_interleave(query.size(-3) // key.size(-3), -3)
            value = value.repeat_interleave(query.size(-3) // value.size(-3), -3)
        weights = query @ key.transpose(-2, -1) * (query.size(-1) ** -0.5 if scale is None else scale)
        if is_causal:
            causal = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool, device=query.device).tril()
            weights = weights.masked_fill(~causal, float("-inf"))
        if attn_mask is not None:
            weights = (weights.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool
                       else weights + attn_mask)
        weights = torch.softmax(weights, dim=-1)
        weights = weights * stream.scaled_mask(tuple(weights.shape), 1.0 - dropout_p, weights)
        return weights @ value

    return attention


def _for_a_device(device: Any) -> bool:
    """Whether a factory call draws for the script's device, whose generator is the device's own: a device named
    (device=..., the CPU too: a GPU script's CPU code path, --device-ref cpu, names the CPU where its GPU path names
    the GPU), or an accelerator as torch's default device; not the host's default nor the meta device (no data:
    nothing is drawn there)."""
    try:
        named = torch.device(device if device is not None else torch.get_default_device())
    except (RuntimeError, TypeError):
        return False
    return named.type != _NO_DATA and (device is not None or named.type != "cpu")


def _flat_ints(args: tuple) -> tuple:
    return tuple(value for arg in args for value in (arg if isinstance(arg, (tuple, list)) else (arg,)))


def _keyed_factory(stream: KeyedStream, original: Callable[..., Any]) -> Callable[..., Any]:
    """A random factory (torch.randn(..., device=...)) that, drawing for a device and given no generator, draws on
    the CPU from the keyed stream and moves the result there; on the host's default, the script's own generator
    draws (KeyedDraws keys that draw after the first module call), and so does a forked child (a DataLoader
    worker), as in a plain run."""
    process = os.getpid()

    @functools.wraps(original)
    def factory(*args: Any, **kwargs: Any) -> torch.Tensor:
        device = kwargs.get("device")
        if (kwargs.get("generator") is not None or kwargs.get("out") is not None or os.getpid() != process
                or not _for_a_device(device)):
            return original(*args, **kwargs)
        requires_grad = kwargs.pop("requires_grad", False)
        with _disable_current_modes(), torch.no_grad():  # both sides record the ops that use it, not the draw
            kind = f"{original.__name__}{_flat_ints(args)}/"  # randn(2, 3) and randn((2, 3)) draw alike
            drawn = original(*args, **{**kwargs, "device": "cpu", "generator": stream.generator(kind)}).to(device)
        return drawn.requires_grad_(requires_grad)

    return factory


_PROBABILITIES = ("p", "dropout", "dropout_p")  # 0: the call draws nothing
_TRAINING_FLAGS = ("train", "training")  # False: the call draws nothing


def _argument(func: torch._ops.OpOverload, args: tuple, kwargs: dict, name: str) -> Any:
    """The value of an op's argument `name` in this call (its default where not given; None where it has none)."""
    if name in kwargs:
        return kwargs[name]
    for position, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            if position < len(args) and not argument.kwarg_only:
                return args[position]
            return argument.default_value if argument.has_default_value() else None
    return None


def _draws(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether this call of a tagged op draws: not a dropout of probability 0, nor one out of training."""
    return (all(_argument(func, args, kwargs, name) != 0 for name in _PROBABILITIES)
            and all(_argument(func, args, kwargs, name) is not False for name in _TRAINING_FLAGS))


def _sizes(args: tuple) -> tuple:
    """The sizes that make a draw's kind: each tensor argument's shape and each list of sizes."""
    return tuple(tuple(arg.shape) if isinstance(arg, torch.Tensor) else tuple(arg) for arg in args
                 if isinstance(arg, torch.Tensor) or (isinstance(arg, (list, tuple)) and all(
                     isinstance(item, int) for item in arg)))


def _device_of(args: tuple, kwargs: dict) -> torch.device:
    """Where the call puts its result: its device argument, else its first tensor's device."""
    if kwargs.get("device") is not None:
        return torch.device(kwargs["device"])
    tensor = next((arg for arg in args if isinstance(arg, torch.Tensor)), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def _computed_on_the_cpu(func: torch._ops.OpOverload, args: tuple, kwargs: dict, device: torch.device) -> Any:
    """`func` run on CPU copies of its tensors; the arguments it writes take the drawn values, and what it makes goes
    to `device`."""
    originals: dict[int, torch.Tensor] = {}

    def to_cpu(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value.device.type == "cpu":
            return value
        copy = value.cpu()
        originals[id(copy)] = value
        return copy

    cpu_args, cpu_kwargs = tree_map(to_cpu, (args, kwargs))
    if "device" in cpu_kwargs:
        cpu_kwargs["device"] = torch.device("cpu")
    out = func(*cpu_args, **cpu_kwargs)
    for original, drawn in zip(written_arguments(func, args, kwargs), written_arguments(func, cpu_args, cpu_kwargs)):
        original.copy_(drawn)

    def placed(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        return originals[id(value)] if id(value) in originals else value.to(device)

    return tree_map(placed, out)


def _drawn_on_the_cpu(func: torch._ops.OpOverload, args: tuple, kwargs: dict, key: int | None) -> Any:
    """`func` drawn on the CPU from its generator seeded with `key` for this call (None: the host's generator as it
    stands), below every other dispatch mode: an emulated device's own generator never sees it."""
    device = _device_of(args, kwargs)
    with _disable_current_modes(), torch.random.fork_rng(devices=[], enabled=key is not None):
        if key is not None:
            torch.default_generator.manual_seed(key)
        return func(*args, **kwargs) if device.type == "cpu" else _computed_on_the_cpu(func, args, kwargs, device)


def _drawn_into_shards(func: torch._ops.OpOverload, args: tuple, kwargs: dict, key: int | None) -> Any:
    """An in-place draw into a DTensor (a sharded parameter's initialisation): each rank draws its own shard on the
    CPU as `_drawn_on_the_cpu` draws, from a key of its shard's place (`_shard_key`), never the whole tensor, and never
    from the device's generator, which differs between the devices (DTensor's RNG tracker moves its offset). An
    out-of-place draw is DTensor's own."""
    written = written_arguments(func, args, kwargs)
    if not written:
        return func(*args, **kwargs)
    _drawn_on_the_cpu(func, tree_map(local_part, args), tree_map(local_part, kwargs), _shard_key(key, written[0]))
    return args[0]


def _shard_key(key: int | None, tensor: torch.Tensor) -> int:
    """The draw's key (before the first module call, the host generator's seed) with the shard's coordinates on the
    mesh dimensions that split the tensor: shards draw apart, replicas alike, the same on every device."""
    coordinate = tensor.device_mesh.get_coordinate() or []
    place = [index for index, placement in zip(coordinate, tensor.placements) if splits(placement)]
    seed = torch.initial_seed() if key is None else key
    return int.from_bytes(hashlib.blake2b(f"{seed}/{place}".encode(), digest_size=8).digest(), "little") >> 1


class KeyedDraws(ServedInline):
    """Every op torch tags nondeterministic_seeded, drawn on the CPU from the keyed stream (from the host's generator
    before the first module call), unless the script gave it a generator of its own; the tagged ops in NOT_KEYED,
    and draws from a script's own generator on a device, are appended to the stream's not_aligned. Entered below the
    op capture (which records the op and what it drew, and serves it inline: ops.ServedInline) and above an emulated
    device's own numerics. Forked children (DataLoader workers) draw as a plain run does."""

    def __init__(self, stream: KeyedStream) -> None:
        super().__init__()
        self.stream = stream
        self._pid = os.getpid()
        # Whether an op is tagged, per OpOverload: every op of the run passes here, and testing a tag costs ~1 us
        # (pybind's enum comparison), a dict lookup a tenth of that.
        self._seeded: dict[torch._ops.OpOverload, bool] = {}

    def serves(self, func: torch._ops.OpOverload) -> bool:
        """Whether the op is tagged nondeterministic_seeded (the ops this mode may draw for)."""
        seeded = self._seeded.get(func)
        if seeded is None:
            seeded = self._seeded[func] = torch.Tag.nondeterministic_seeded in func.tags
        return seeded

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.serves(func):
            self.passed_on(func)
            return func(*args, **kwargs)
        if os.getpid() != self._pid or not _draws(func, args, kwargs) or _device_of(args, kwargs).type == _NO_DATA:
            return func(*args, **kwargs)
        op = str(func._overloadpacket)
        given = _argument(func, args, kwargs, "generator")
        if op in NOT_KEYED or (given is not None and given.device.type != "cpu"):
            why = NOT_KEYED.get(op) or f"drawn from the script's own {given.device.type} generator"
            self.stream.note_not_aligned(f"{op} in {self.stream.path or 'the top level'} ({why})")
            return func(*args, **kwargs)
        if given is not None:
            return func(*args, **kwargs)
        key = self.stream.key(f"{op}{_sizes(args)}/") if self.stream.began else None
        if any(map(is_dtensor, args)):
            return _drawn_into_shards(func, args, kwargs, key)
        return _drawn_on_the_cpu(func, args, kwargs, key)


@contextlib.contextmanager
def keyed(step: Callable[[], int], not_aligned: list[str]) -> Iterator[None]:
    """Random draws from the keyed stream while inside; what stays unaligned is appended to `not_aligned`."""
    originals = {name: getattr(F, name) for name in (*KEYED_DROPOUTS, ATTENTION)}
    factories = {name: getattr(torch, name) for name in KEYED_FACTORIES}
    with KeyedStream(step, not_aligned) as stream, KeyedDraws(stream):
        for name, spatial in KEYED_DROPOUTS.items():
            setattr(F, name, _keyed_dropout(stream, originals[name], spatial))
        F.scaled_dot_product_attention = _keyed_attention(stream, originals[ATTENTION])
        for name, original in factories.items():
            setattr(torch, name, _keyed_factory(stream, original))
        try:
            yield
        finally:
            for name, original in originals.items():
                setattr(F, name, original)
            for name, original in factories.items():
                setattr(torch, name, original)


@contextlib.contextmanager
def dropout_disabled() -> Iterator[None]:
    """Every dropout (modules call the functional ones) as in eval mode (--no-dropout). RNN modules' internal
    dropout is not covered."""
    originals = {name: getattr(F, name) for name in (*_DROPOUT_FUNCTIONS, ATTENTION)}

    def no_dropout(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(input, p=0.5, training=True, inplace=False):
            return original(input, p, False, inplace)

        return wrapper

    def attention_without_dropout(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 4:  # (query, key, value, attn_mask, dropout_p, ...)
            args = (*args[:4], 0.0, *args[5:])
        else:
            kwargs["dropout_p"] = 0.0
        return originals[ATTENTION](*args, **kwargs)

    for name in _DROPOUT_FUNCTIONS:
        setattr(F, name, no_dropout(originals[name]))
    F.scaled_dot_product_attention = attention_without_dropout
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(F, name, original)
