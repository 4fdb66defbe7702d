"""What separates two devices' numbers, modelled so that a CPU pair differs as a GPU/NPU pair does: each emulated
device sums in its own order and draws from its own random generator.

On real hardware a faithful port never matches its original bit for bit: cuBLAS and the NPU's cube unit split a
matrix product's inner dimension into blocks of their own and add the blocks' partial sums, reductions are tree-summed
in blocks, and each device has its own random generator (CUDA's Philox, the NPU's). Two emulations on the same CPU
kernels and the same generator would agree to 0.000%, which proves nothing about that. So each face computes:

- matrix products (aten.mm, addmm, bmm, baddbmm) and convolutions (aten.convolution with groups=1) as the sum of
  `blocks` partial products over the inner dimension (the input channels for a convolution), accumulated in float32
  and rounded once to the output dtype, as tensor cores and the cube unit accumulate;
- sums and means (aten.sum, aten.mean) of floating tensors as the sum of `blocks` partial sums along the largest
  reduced dimension;
- bernoulli draws (dropout's masks: aten.native_dropout, aten.bernoulli) and the random factories a script calls with
  the device (torch.randn(..., device="cuda")) from the device's own generator, seeded by torch.manual_seed and the
  face's manual_seed like a real device's, but into a stream of its own. Other in-place draws (nn.init's uniform_
  and normal_) are taken as draws on the host, where models are built; on the cpu target the emulation cannot tell
  host memory from device memory. verify's keyed stream (verify/capture/random_streams.py, on unless
  `--no-align-random`) draws every seeded random op above this mode, so these draws are the device's own only where
  a run leaves them to it.

The two faces use different block counts (CUDA_BLOCKS, NPU_BLOCKS) and generator streams. The backward of these ops,
the other reductions (softmax, norms, losses) and convolution's backward keep the CPU's order: not modelled. The
modelling sits below verify's op capture (a dispatch mode entered when the face is installed, before the capture),
so the capture records the same ops on both sides, with the face's values.

With EXACT_VAR set (`verify --exact-emulation`), none of this is done: the faces compute as the CPU does and draw from
the CPU's generator, for bit-exact debugging. TF32/HF32 rounding follows the script's switches either way
(reduced_precision.py).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


# The same name as verify.devices.EXACT_EMULATION_VAR (the stand-ins never import npu-port; a test checks they agree).
EXACT_VAR = "NPU_PORT_EXACT_EMULATION"
EXACT = os.environ.get(EXACT_VAR, "") == "1"
# The same name as verify.devices.BLOCKS_VAR: a calibration run of the reference sums in another order than its face's
# (verify/capture/perturbation.py), equally valid, so the comparison measures what a summation order alone moves.
BLOCKS_VAR = "NPU_PORT_BLOCKS"

CUDA_BLOCKS = 2  # split-K with two partial products: cuBLAS's split-K for a deep inner dimension
NPU_BLOCKS = 3  # the cube unit's blocks over K, another split than CUDA's
_LOW_PRECISION = (torch.float16, torch.bfloat16)
aten = torch.ops.aten


def _accumulated(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _strided(*tensors: torch.Tensor) -> bool:
    """Dense tensors with real storage: sparse, nested and tensor subclasses (a compiler's fake tensors) compute as
    the CPU does."""
    return all(tensor.layout == torch.strided and type(tensor) is torch.Tensor for tensor in tensors)


def _in_order(partials: Iterable[torch.Tensor]) -> torch.Tensor:
    """The partial results added first to last: the face's order."""
    return functools.reduce(torch.add, partials)


class DeviceNumerics(TorchDispatchMode):
    """The dispatch mode that computes a face's modelled ops; every other op passes through unchanged. A handler
    returns None for a call it does not model (a dtype, layout or size it leaves alone): the call then runs as
    given."""

    def __init__(self, blocks: int, generator: torch.Generator | None) -> None:
        super().__init__()
        self.blocks = blocks
        self.generator = generator
        self._handlers: dict[Any, Callable[..., Any]] = {
            aten.mm.default: self._mm, aten.bmm.default: self._mm,
            aten.addmm.default: self._addmm, aten.baddbmm.default: self._addmm,
            aten.convolution.default: self._convolution,
            aten.sum.default: self._sum, aten.sum.dim_IntList: self._sum,
            aten.mean.default: self._mean, aten.mean.dim: self._mean,
        }
        if generator is not None:  # the cpu target: on cuda, the GPU's generator is the device's
            self._handlers.update({
                aten.native_dropout.default: self._native_dropout,
                aten.bernoulli.default: self._own_generator, aten.bernoulli.p: self._own_generator,
                aten.bernoulli_.float: self._own_generator, aten.bernoulli_.Tensor: self._own_generator,
            })

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = self._handlers.get(func)
        result = None if handler is None else handler(func, *args, **kwargs)
        return func(*args, **kwargs) if result is None else result

    # --- matrix products and convolutions: partial products over the inner dimension, summed in float32 -----------

    def _product(self, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor | None:
        """left @ right (2-d or batched) as the sum of the face's partial products, in the accumulation dtype; None
        where the inner dimension is too short to split or the dtype is not floating."""
        inner = left.shape[-1]
        if (inner < 2 * self.blocks or not left.is_floating_point() or left.dtype != right.dtype
                or not _strided(left, right)):
            return None
        accumulate = _accumulated(left.dtype)
        return _in_order(torch.matmul(part_of_left.to(accumulate), part_of_right.to(accumulate)) for
                         part_of_left, part_of_right in zip(left.tensor_split(self.blocks, -1),
                                                            right.tensor_split(self.blocks, -2)))

    def _mm(self, func: Any, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor | None:
        total = self._product(left, right)
        return None if total is None else total.to(left.dtype)

    def _addmm(self, func: Any, bias: torch.Tensor, left: torch.Tensor, right: torch.Tensor, *, beta: Any = 1,
               alpha: Any = 1) -> torch.Tensor | None:
        total = self._product(left, right)
        if total is None or bias.dtype != left.dtype:
            return None
        if alpha != 1:
            total = total * alpha
        if beta != 0:  # beta 0 ignores the bias, NaN included
            total = total + (bias.to(total.dtype) if beta == 1 else bias.to(total.dtype) * beta)
        return total.to(left.dtype)

    def _convolution(self, func: Any, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any,
                     groups: int) -> torch.Tensor | None:
        channels = input.shape[1] if input.dim() > 1 else 0
        if (groups != 1 or channels < 2 * self.blocks or not input.is_floating_point() or input.dtype != weight.dtype
                or not _strided(input, weight)):
            return None
        accumulate = _accumulated(input.dtype)
        kernels = weight.tensor_split(self.blocks, 0 if transposed else 1)  # the weight's input channels
        total = _in_order(func(part.to(accumulate), kernel.to(accumulate), None, stride, padding, dilation, transposed,
                               output_padding, 1) for part, kernel in zip(input.tensor_split(self.blocks, 1), kernels))
        if bias is not None:
            total = total + bias.to(accumulate).reshape(1, -1, *([1] * (total.dim() - 2)))
        return total.to(input.dtype)

    # --- sums and means: partial sums along the largest reduced dimension ---------------------------------------

    def _partial_sums(self, input: torch.Tensor, dim: Any, keepdim: bool, dtype: Any) -> tuple[torch.Tensor, int]:
        """(the sum over `dim` as the face's partial sums, in the accumulation dtype with the reduced dims kept; the
        count of elements summed per output)."""
        dims = sorted({d % input.dim() for d in dim}) if dim else list(range(input.dim()))
        longest = max(dims, key=lambda d: input.shape[d])
        accumulate = _accumulated(dtype or input.dtype)
        total = _in_order(aten.sum.dim_IntList(part, dims, True, dtype=accumulate)
                          for part in input.tensor_split(self.blocks, longest))
        count = 1
        for d in dims:
            count *= input.shape[d]
        if not keepdim:
            total = total.squeeze(dims)
        return total, count

    def _reducible(self, input: torch.Tensor, dim: Any) -> bool:
        if not input.is_floating_point() or input.dim() == 0 or not _strided(input):
            return False
        dims = [d % input.dim() for d in dim] if dim else range(input.dim())
        return max(input.shape[d] for d in dims) >= 2 * self.blocks

    def _sum(self, func: Any, input: torch.Tensor, dim: Any = None, keepdim: bool = False, *,
             dtype: Any = None) -> torch.Tensor | None:
        if not self._reducible(input, dim):
            return None
        total, _ = self._partial_sums(input, dim, keepdim, dtype)
        return total.to(dtype or input.dtype)

    def _mean(self, func: Any, input: torch.Tensor, dim: Any = None, keepdim: bool = False, *,
              dtype: Any = None) -> torch.Tensor | None:
        if not self._reducible(input, dim):
            return None
        total, count = self._partial_sums(input, dim, keepdim, dtype)
        return (total / count).to(dtype or input.dtype)

    # --- the device's own random generator ----------------------------------------------------------------------

    def _own_generator(self, func: Any, *args: Any, generator: torch.Generator | None = None, **kwargs: Any) -> Any:
        return func(*args, generator=generator or self.generator, **kwargs)

    def _native_dropout(self, func: Any, input: torch.Tensor, p: float, train: bool | None) -> Any:
        if not train or p == 0:
            return None
        keep = 1.0 - p
        mask = torch.empty_like(input, dtype=torch.bool).bernoulli_(keep, generator=self.generator)
        return input * mask * (1.0 / keep), mask


def stream_seed(seed: int, face: str) -> int:
    """The face's generator seed for `seed`: a stream of its own, other than the CPU's and the other face's."""
    digest = hashlib.blake2b(f"{face}/{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class OwnGenerator:
    """The random generator of an emulated device: seeded as a device is (torch.manual_seed reaches it through the
    face's manual_seed_all), drawing its own stream. In exact mode it is the CPU's default generator."""

    def __init__(self, face: str) -> None:
        self.face = face
        self.generator = torch.default_generator if EXACT else torch.Generator()
        self._seed = torch.initial_seed()
        self.manual_seed(self._seed)

    def manual_seed(self, seed: int) -> None:
        self._seed = seed
        self.generator.manual_seed(seed if EXACT else stream_seed(seed, self.face))

    def seed(self) -> None:
        self._seed = self.generator.seed()

    def initial_seed(self) -> int:
        """The seed it was given, as a device's initial_seed() answers (its stream's own seed is derived from it)."""
        return self._seed


BLOCKS = {"CUDA": CUDA_BLOCKS, "NPU": NPU_BLOCKS}
_installed: list[DeviceNumerics] = []


def install(face: str, generator: OwnGenerator | None) -> None:
    """Enters the face's numerics for the rest of the process, below any mode entered later (verify's capture).
    Nothing in exact mode."""
    if EXACT or _installed:
        return
    mode = DeviceNumerics(_blocks(face), generator.generator if generator is not None else None)
    mode.__enter__()  # never left: the process ends with it
    _installed.append(mode)
    MODELLED.extend(_modelled(face, own_generator=generator is not None))


MODELLED: list[str] = []  # what this process's face models, for the run's manifest (empty: none, or exact)


def _blocks(face: str) -> int:
    return int(os.environ.get(BLOCKS_VAR) or BLOCKS[face])


def _modelled(face: str, own_generator: bool) -> list[str]:
    blocks = _blocks(face)
    return [f"matrix products and convolutions summed as {blocks} partial products in float32",
            f"sums and means summed as {blocks} partial sums",
            *([f"the random draws verify leaves to the device drawn from {face}'s own generator"]
              if own_generator else [])]
