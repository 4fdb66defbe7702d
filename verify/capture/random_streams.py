"""Random numbers that a GPU, an NPU and the CPU draw alike, so that a port is compared on the same dropout masks.

Each device draws from its own generator (CUDA's Philox, the NPU's npu_dropout_gen_mask with its own seed and
offset; the emulated devices model that: verify/devices/emulated/npu_port_emulation/device_numerics.py), so on real
hardware every op after a dropout differs between the sides, whatever the port does. With the streams aligned (the
default; `--no-align-random` leaves each device its own), every functional dropout (the modules call them: nn.Dropout,
nn.Dropout1d/2d/3d), and the dropout of scaled_dot_product_attention (computed then as its documented math path),
draws its mask on the CPU from a generator seeded by a key of the run's seed, the step, the innermost module path and
the call's number in that step and module, and moves it to the tensor's device, scaled as dropout scales (1 / keep).
Masks then match on any two devices, and stay matched where one side makes more or fewer random calls elsewhere. The
random factories torch.rand, randn, randint and randperm, asked for a tensor on a device (device=..., or torch's
default device) without a generator of the script's own, draw from the same keyed stream on the CPU and move the
result there (noise added in a training step, a VAE's sample). The drawing is hidden from the op capture: both
sides record the same ops on what was drawn.

Not aligned, and named in the manifest when a run uses them: alpha dropout, the dropout inside recurrent modules
(nn.LSTM(dropout=...)), and draws made from a tensor (torch.randn_like, Tensor.normal_, torch.bernoulli: on an
emulated device every tensor lives on the CPU, so they draw from the host's generator alike): compare names those it
finds in the op records (verify/compare/op_catalogue.py RANDOM).

`--no-dropout` turns every dropout off instead (as msprobe's seed_all(rm_dropout=True) does).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

from verify.capture.module_calls import ModuleCalls

# The functional dropouts whose masks are drawn from the keyed stream: name -> spatial dimensions dropped together
# (0: each element on its own).
KEYED_DROPOUTS = {"dropout": 0, "dropout1d": 1, "dropout2d": 2, "dropout3d": 3}
_DROPOUT_FUNCTIONS = (*KEYED_DROPOUTS, "alpha_dropout", "feature_alpha_dropout")
# The factories that draw a new random tensor of a given size: keyed when asked for one on a device.
KEYED_FACTORIES = ("rand", "randn", "randint", "randperm")
ATTENTION = "scaled_dot_product_attention"


class KeyedStream(ModuleCalls):
    """Draws dropout masks from a CPU generator keyed by (seed, step, innermost module path, call number)."""

    def __init__(self, seed: int, step: Callable[[], int], not_aligned: list[str]) -> None:
        super().__init__()
        self.seed = seed
        self.step = step
        self.not_aligned = not_aligned  # manifest: the random draws left to each device's generator
        self._paths = [""]
        self._calls: dict[tuple[int, str, str], int] = {}

    def entering(self, path: str, args: Any, outermost: bool) -> None:
        self._paths.append(path)

    def left(self) -> None:
        self._paths.pop()

    def generator(self, kind: str = "") -> torch.Generator:
        """A CPU generator for the next draw of `kind` (a factory and its size; "" for dropout masks), seeded by its
        key: the same on every device, whatever else a side drew, of other kinds or elsewhere."""
        step, path = self.step(), self._paths[-1]
        number = self._calls[step, path, kind] = self._calls.get((step, path, kind), -1) + 1
        key = hashlib.blake2b(f"{self.seed}/{step}/{path}/{kind}{number}".encode(), digest_size=8).digest()
        return torch.Generator().manual_seed(int.from_bytes(key, "little") >> 1)

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
        if dropout_p == 0.0:
            return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
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


def _on_a_device(device: Any) -> bool:
    """Whether a factory's device argument (None: torch's default device) is an accelerator, whose generator is
    its own, rather than the host."""
    if device is None:
        device = torch.get_default_device()
    try:
        return torch.device(device).type != "cpu"
    except (RuntimeError, TypeError):
        return False


def _flat_ints(args: tuple) -> tuple:
    return tuple(value for arg in args for value in (arg if isinstance(arg, (tuple, list)) else (arg,)))


def _keyed_factory(stream: KeyedStream, original: Callable[..., Any]) -> Callable[..., Any]:
    """A random factory (torch.randn(..., device=...)) that, asked for a tensor on a device and given no generator,
    draws it on the CPU from the keyed stream and moves it there; on the host, the script's own generator draws."""

    @functools.wraps(original)
    def factory(*args: Any, **kwargs: Any) -> torch.Tensor:
        device = kwargs.get("device")
        if kwargs.get("generator") is not None or not _on_a_device(device):
            return original(*args, **kwargs)
        requires_grad = kwargs.pop("requires_grad", False)
        with _disable_current_modes(), torch.no_grad():  # both sides record the ops that use it, not the draw
            kind = f"{original.__name__}{_flat_ints(args)}/"  # randn(2, 3) and randn((2, 3)) draw alike
            drawn = original(*args, **{**kwargs, "device": "cpu", "generator": stream.generator(kind)}).to(device)
        return drawn.requires_grad_(requires_grad)

    return factory


def _noted(stream: KeyedStream, name: str, original: Callable[..., Any], draws: Callable[..., bool]) -> Callable:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if draws(*args, **kwargs):
            stream.note_not_aligned(name)
        return original(*args, **kwargs)

    return wrapper


def _training_dropout(input: Any, p: float = 0.5, training: bool = False, *args: Any, **kwargs: Any) -> bool:
    return bool(training) and p > 0.0


@contextlib.contextmanager
def keyed(seed: int, step: Callable[[], int], not_aligned: list[str]) -> Iterator[None]:
    """Dropout masks from the keyed stream while inside; what stays unaligned is appended to `not_aligned`."""
    originals = {name: getattr(F, name) for name in (*_DROPOUT_FUNCTIONS, ATTENTION)}
    factories = {name: getattr(torch, name) for name in KEYED_FACTORIES}
    with KeyedStream(seed, step, not_aligned) as stream:
        for name, spatial in KEYED_DROPOUTS.items():
            setattr(F, name, _keyed_dropout(stream, originals[name], spatial))
        for name in ("alpha_dropout", "feature_alpha_dropout"):
            setattr(F, name, _noted(stream, name, originals[name], _training_dropout))
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
