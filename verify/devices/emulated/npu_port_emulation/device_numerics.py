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

The two faces use different block counts (CUDA_BLOCKS, NPU_BLOCKS) and generator streams. The other ops that
half_precision.HALF_PRECISION computes in float32 from half inputs (convolution's backward, the CPU's flash attention,
mv, dot) are computed so in the CPU's order, as are the other reductions (softmax, norms, losses): not modelled. The
modelling sits below verify's op capture (a dispatch mode entered when the face is installed, before the capture),
so the capture records the same ops on both sides, with the face's values.

With EXACT_VAR set (`verify --exact-emulation`), none of this is done: the faces compute as the CPU does and draw from
the CPU's generator, for bit-exact debugging, except that half precision is computed as the devices compute it
(HALF_PRECISION, in the CPU's order), as a CPU reference under an imposed autocast computes it
(`half_precision_as_devices()`): the CPU's own half-precision products are 20-200x slower, and unlike any device's.
TF32/HF32 rounding follows the script's switches either way: this mode rounds the multiplicands
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
from torch.utils._pytree import tree_flatten, tree_map

from . import half_precision
from .half_precision import Computed, computed_so
from .reduced_precision import ROUNDED, as_multiplied


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


def _half(tensor: torch.Tensor) -> bool:
    """A half-precision tensor on the CPU: its kernels there neither compute as a device does nor quickly (a GPU's
    target computes half precision as the GPU does)."""
    return tensor.dtype in _LOW_PRECISION and tensor.device.type == "cpu"


def _half_dtype(values: Iterable[Any]) -> torch.dtype | None:
    """The half dtype of the first half-precision tensor among `values`, None where there is none."""
    return next((value.dtype for value in values if isinstance(value, torch.Tensor) and _half(value)), None)


def _as_float32(value: Any) -> Any:
    return value.float() if isinstance(value, torch.Tensor) and _half(value) else value


def _op_overloads(name: str) -> list[Any]:
    """The overloads of aten `name` that compute a new result: no out= variant, nothing in place."""
    packet = getattr(aten, name, None)
    names = [overload for overload in getattr(packet, "overloads", list)() if "out" not in overload]
    return [op for op in (getattr(packet, overload) for overload in names) if not op._schema.is_mutable]


def _record(func: Any, tensor: torch.Tensor) -> None:
    if _half(tensor):
        half_precision.computed(func._overloadpacket.__name__)


class DeviceNumerics(TorchDispatchMode):
    """The dispatch mode that computes a face's modelled ops and the ops that half_precision.HALF_PRECISION computes
    in float32; every other op passes through unchanged. A handler returns None for a call it leaves alone (a dtype,
    layout or size): the call then runs as given. With one block (exact emulation, a CPU reference under autocast)
    only half-precision calls are computed here, in the CPU's order."""

    def __init__(self, blocks: int, generator: torch.Generator | None) -> None:
        super().__init__()
        self.blocks = blocks
        self.generator = generator
        modelled = {
            aten.mm.default: self._mm, aten.bmm.default: self._mm,
            aten.addmm.default: self._addmm, aten.baddbmm.default: self._addmm,
            aten.convolution.default: self._convolution,
            aten.sum.default: self._sum, aten.sum.dim_IntList: self._sum,
            aten.mean.default: self._mean, aten.mean.dim: self._mean,
        }
        self._handlers: dict[Any, Callable[..., Any]] = {
            op: modelled.get(op) or self._in_float32(row.rounded_outputs)
            for name, row in computed_so(Computed.IN_FLOAT32).items() for op in _op_overloads(name)
        }
        if generator is not None:  # the cpu target: on cuda, the GPU's generator is the device's
            self._handlers.update({
                aten.native_dropout.default: self._native_dropout,
                aten.bernoulli.default: self._own_generator, aten.bernoulli.p: self._own_generator,
                aten.bernoulli_.float: self._own_generator, aten.bernoulli_.Tensor: self._own_generator,
            })

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in ROUNDED:  # TF32/HF32, where the script's switch is on
            args = as_multiplied(func, args)
        handler = self._handlers.get(func)
        result = None if handler is None else handler(func, *args, **kwargs)
        return func(*args, **kwargs) if result is None else result

    def _parts(self, length: int, tensor: torch.Tensor) -> int:
        """How many partial results to sum along a dimension of `length`: the face's blocks where it is long enough
        to split, else one; 0 where nothing is to be done here (float32 in one piece: the CPU's own)."""
        parts = self.blocks if length >= 2 * self.blocks else 1
        return parts if parts > 1 or _half(tensor) else 0

    # --- ops computed in float32 from half inputs, by the table --------------------------------------------------

    def _in_float32(self, rounded_outputs: tuple[int, ...] | None) -> Callable[..., Any]:
        def compute(func: Any, *args: Any, **kwargs: Any) -> Any:
            values = tree_flatten((args, kwargs))[0]
            half = _half_dtype(values)
            if half is None or not _strided(*(value for value in values if isinstance(value, torch.Tensor))):
                return None
            half_precision.computed(func._overloadpacket.__name__)
            outputs = func(*tree_map(_as_float32, args), **tree_map(_as_float32, kwargs))
            if isinstance(outputs, torch.Tensor):
                return outputs.to(half)
            return type(outputs)(output.to(half) if isinstance(output, torch.Tensor) and output.is_floating_point()
                                 and (rounded_outputs is None or index in rounded_outputs) else output
                                 for index, output in enumerate(outputs))

        return compute

    # --- matrix products and convolutions: partial products over the inner dimension, summed in float32 -----------

    def _product(self, func: Any, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor | None:
        """left @ right (2-d or batched) as the sum of the face's partial products, in the accumulation dtype; None
        where there is nothing to model (float32 too short to split) or the dtype is not floating."""
        parts = self._parts(left.shape[-1], left)
        if not parts or not left.is_floating_point() or left.dtype != right.dtype or not _strided(left, right):
            return None
        _record(func, left)
        accumulate = _accumulated(left.dtype)
        return _in_order(torch.matmul(part_of_left.to(accumulate), part_of_right.to(accumulate)) for
                         part_of_left, part_of_right in zip(left.tensor_split(parts, -1),
                                                            right.tensor_split(parts, -2)))

    def _mm(self, func: Any, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor | None:
        total = self._product(func, left, right)
        return None if total is None else total.to(left.dtype)

    def _addmm(self, func: Any, bias: torch.Tensor, left: torch.Tensor, right: torch.Tensor, *, beta: Any = 1,
               alpha: Any = 1) -> torch.Tensor | None:
        if bias.dtype != left.dtype:
            return None
        total = self._product(func, left, right)
        if total is None:
            return None
        if alpha != 1:
            total = total * alpha
        if beta != 0:  # beta 0 ignores the bias, NaN included
            total = total + (bias.to(total.dtype) if beta == 1 else bias.to(total.dtype) * beta)
        return total.to(left.dtype)

    def _convolution(self, func: Any, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any,
                     groups: int) -> torch.Tensor | None:
        channels = input.shape[1] if input.dim() > 1 and groups == 1 else 0
        parts = self._parts(channels, input)
        if not parts or not input.is_floating_point() or input.dtype != weight.dtype or not _strided(input, weight):
            return None
        _record(func, input)
        accumulate = _accumulated(input.dtype)
        if parts == 1:  # half precision in one piece, groups included
            return func(input.to(accumulate), weight.to(accumulate), _as_float32(bias), stride, padding, dilation,
                        transposed, output_padding, groups).to(input.dtype)
        kernels = weight.tensor_split(parts, 0 if transposed else 1)  # the weight's input channels
        total = _in_order(func(part.to(accumulate), kernel.to(accumulate), None, stride, padding, dilation, transposed,
                               output_padding, 1) for part, kernel in zip(input.tensor_split(parts, 1), kernels))
        if bias is not None:
            total = total + bias.to(accumulate).reshape(1, -1, *([1] * (total.dim() - 2)))
        return total.to(input.dtype)

    # --- sums and means: partial sums along the largest reduced dimension ---------------------------------------

    def _partial_sums(self, func: Any, input: torch.Tensor, dim: Any, keepdim: bool,
                      dtype: Any) -> tuple[torch.Tensor, int] | None:
        """(the sum over `dim` as the face's partial sums, in the accumulation dtype with the reduced dims kept; the
        count of elements summed per output); None where there is nothing to model."""
        if not input.is_floating_point() or input.dim() == 0 or not _strided(input):
            return None
        dims = sorted({d % input.dim() for d in dim}) if dim else list(range(input.dim()))
        longest = max(dims, key=lambda d: input.shape[d])
        parts = self._parts(input.shape[longest], input)
        if not parts:
            return None
        _record(func, input)
        accumulate = _accumulated(dtype or input.dtype)
        total = _in_order(aten.sum.dim_IntList(part, dims, True, dtype=accumulate)
                          for part in input.tensor_split(parts, longest))
        count = 1
        for d in dims:
            count *= input.shape[d]
        if not keepdim:
            total = total.squeeze(dims)
        return total, count

    def _sum(self, func: Any, input: torch.Tensor, dim: Any = None, keepdim: bool = False, *,
             dtype: Any = None) -> torch.Tensor | None:
        summed = self._partial_sums(func, input, dim, keepdim, dtype)
        return None if summed is None else summed[0].to(dtype or input.dtype)

    def _mean(self, func: Any, input: torch.Tensor, dim: Any = None, keepdim: bool = False, *,
              dtype: Any = None) -> torch.Tensor | None:
        summed = self._partial_sums(func, input, dim, keepdim, dtype)
        return None if summed is None else (summed[0] / summed[1]).to(dtype or input.dtype)

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
        self.offset = 0
        self.generator.manual_seed(seed if EXACT else stream_seed(seed, self.face))

    def philox_state(self) -> torch.Tensor:
        """The state as a device's Philox generator gives it (seed and offset, two uint64, as 16 bytes), which
        DTensor's RNG tracker reads and moves by offsets: the seed it was given and the offset last set."""
        return torch.tensor([self._seed, self.offset], dtype=torch.int64).view(torch.uint8)

    def set_philox_state(self, state: torch.Tensor) -> None:
        """Draws from the stream of (seed, offset) of a Philox-shaped state (philox_state): a state set again draws
        the same numbers again, and each offset its own, as a shard's offset does on the device."""
        seed, offset = state.view(torch.int64).tolist()
        self._seed, self.offset = seed, offset
        self.generator.manual_seed(stream_seed(seed, f"{self.face}+{offset}"))

    def seed(self) -> None:
        self._seed = self.generator.seed()

    def initial_seed(self) -> int:
        """The seed it was given, as a device's initial_seed() answers (its stream's own seed is derived from it)."""
        return self._seed


BLOCKS = {"CUDA": CUDA_BLOCKS, "NPU": NPU_BLOCKS}
_installed: list[DeviceNumerics] = []


def install(face: str, generator: OwnGenerator | None) -> None:
    """Enters the face's numerics for the rest of the process, below any mode entered later (verify's capture). In
    exact mode, on the cpu target, only half precision as the devices compute it, in the CPU's order."""
    if _installed or (EXACT and generator is None):  # exact on a GPU: the GPU computes half precision as it does
        return
    # The mode's first op imports torch._dynamo (torch wraps every __torch_dispatch__ so). Imported after the script's
    # init_process_group, dynamo keeps the gloo group alive past destroy_process_group, and at the exit the group's
    # threads abort the process: it is imported while no group exists yet.
    import torch._dynamo  # noqa: F401
    if EXACT:
        mode = DeviceNumerics(1, None)
    else:
        mode = DeviceNumerics(_blocks(face), generator.generator if generator is not None else None)
        MODELLED.extend(_modelled(face, own_generator=generator is not None))
    mode.__enter__()  # never left: the process ends with it
    _installed.append(mode)


def summed_in_blocks(blocks: int) -> DeviceNumerics:
    """For a calibration run of a reference on a real device (the CPU, a CUDA GPU): its modelled products and sums
    computed as `blocks` partial results, as an emulated face with that count sums on the same kernels; its random
    draws stay its own. A dispatch mode to enter below the capture."""
    return DeviceNumerics(blocks, None)


def half_precision_as_devices() -> DeviceNumerics:
    """For a CPU reference under an imposed autocast: half precision computed as the devices compute it (the table),
    in the CPU's order; a dispatch mode to enter below the capture."""
    return DeviceNumerics(1, None)


MODELLED: list[str] = []  # what this process's face models, for the run's manifest (empty: none, or exact)


def _blocks(face: str) -> int:
    return int(os.environ.get(BLOCKS_VAR) or BLOCKS[face])


def _modelled(face: str, own_generator: bool) -> list[str]:
    blocks = _blocks(face)
    return [f"matrix products and convolutions summed as {blocks} partial products in float32",
            f"sums and means summed as {blocks} partial sums",
            *([f"the random draws verify leaves to the device drawn from {face}'s own generator"]
              if own_generator else [])]
