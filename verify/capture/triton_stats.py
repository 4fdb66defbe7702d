"""One pass over a large floating tensor on a CUDA device for its one-pass statistics (min, max, sum, L2 norm, NaN
and inf counts), in two Triton kernel launches: `_partials` reduces a fixed share of the data per program into six
partials, `_combine` reduces the partials in a fixed order. No atomics: identical runs give identical bits. Nothing
is read back: the row stays on the device (verify/capture/tensor_stats.py ships it with the step's other
statistics).

Imported only by tensor_stats.FusedReduction, at the first tensor it takes: importing triton costs a second, and a
run on the CPU or an NPU never needs it. Written in the long-stable subset of triton.language (triton 3.0, torch
2.4.1's, up to 3.6). Under Triton's interpreter (TRITON_INTERPRET=1, set before this module is imported) the same
kernels run on CPU tensors: the tests check them there.
"""

# No `from __future__ import annotations`: triton 3.0 tells a kernel's tl.constexpr parameters by their annotation
# object, not by its text
import torch
import triton
import triton.language as tl

BLOCK = 1024  # elements one program reads per tile
PROGRAMS = 1024  # programs at most, so partials at most: `_combine` reduces them in one tile
LARGEST = 1 << 30  # elements; above it the offsets could pass int32 (the caller uses torch's reductions)
ROW = ("min", "max", "sum", "l2_norm", "nan_count", "inf_count")


@triton.jit
def _partials(values, partials, numel, programs, TILES: tl.constexpr, BLOCK: tl.constexpr):
    """Program `pid` reads TILES tiles: pid, pid + programs, ... (neighbouring programs read neighbouring tiles), and
    writes its min, max, sum, sum of squares, NaN and inf counts to column pid of `partials` (6 rows of `programs`),
    in float32. NaNs are left out of min and max here and put back by `_combine` from the NaN count, whatever
    tl.minimum does with a NaN; sums take every element, so NaN and inf propagate as in torch's sums."""
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    low = tl.full([BLOCK], float("inf"), tl.float32)
    high = tl.full([BLOCK], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    squares = tl.zeros([BLOCK], tl.float32)
    nans = tl.zeros([BLOCK], tl.int32)
    infs = tl.zeros([BLOCK], tl.int32)
    for tile in range(TILES):
        offsets = (tile * programs + pid) * BLOCK + lanes
        inside = offsets < numel
        x = tl.load(values + offsets, mask=inside, other=0.0).to(tl.float32)
        ordered = inside & (x == x)  # noqa: PLR0124  (not NaN: the test triton.language has had since 3.0)
        low = tl.minimum(low, tl.where(ordered, x, float("inf")))
        high = tl.maximum(high, tl.where(ordered, x, float("-inf")))
        total += x
        squares += x * x
        nans += (x != x).to(tl.int32)  # noqa: PLR0124
        infs += (tl.abs(x) == float("inf")).to(tl.int32)
    tl.store(partials + pid, tl.min(low, axis=0))
    tl.store(partials + programs + pid, tl.max(high, axis=0))
    tl.store(partials + 2 * programs + pid, tl.sum(total, axis=0))
    tl.store(partials + 3 * programs + pid, tl.sum(squares, axis=0))
    # float32 holds a program's counts exactly: at most LARGEST / PROGRAMS = 2**20 elements each
    tl.store(partials + 4 * programs + pid, tl.sum(nans, axis=0).to(tl.float32))
    tl.store(partials + 5 * programs + pid, tl.sum(infs, axis=0).to(tl.float32))


@triton.jit
def _combine(partials, row, programs, PROGRAMS: tl.constexpr):
    """The six statistics (ROW) from `programs` columns of partials, into `row` as float64: min, max, sum and norm
    are float32 values (the accumulation dtype), the counts exact. min and max are NaN where any element is."""
    lanes = tl.arange(0, PROGRAMS)
    used = lanes < programs
    low = tl.min(tl.load(partials + lanes, mask=used, other=float("inf")), axis=0)
    high = tl.max(tl.load(partials + programs + lanes, mask=used, other=float("-inf")), axis=0)
    total = tl.sum(tl.load(partials + 2 * programs + lanes, mask=used, other=0.0), axis=0)
    squares = tl.sum(tl.load(partials + 3 * programs + lanes, mask=used, other=0.0), axis=0)
    nans = tl.sum(tl.load(partials + 4 * programs + lanes, mask=used, other=0.0).to(tl.float64), axis=0)
    infs = tl.sum(tl.load(partials + 5 * programs + lanes, mask=used, other=0.0).to(tl.float64), axis=0)
    tl.store(row, tl.where(nans > 0, float("nan"), low).to(tl.float64))
    tl.store(row + 1, tl.where(nans > 0, float("nan"), high).to(tl.float64))
    tl.store(row + 2, total.to(tl.float64))
    tl.store(row + 3, tl.sqrt(squares).to(tl.float64))
    tl.store(row + 4, nans)
    tl.store(row + 5, infs)


def one_pass_row(values: torch.Tensor) -> torch.Tensor:
    """The statistics ROW of `values` (float32, float16 or bfloat16, at most LARGEST elements, laid out densely
    from its data pointer in any order of dimensions), a float64 tensor of 6 on its device; queued on the device's
    current stream, nothing waited for."""
    numel = values.numel()
    # a power of two: a few compiled variants (1 to PROGRAMS), and a loop bound Triton's interpreter takes as it is
    tiles = triton.next_power_of_2(triton.cdiv(numel, PROGRAMS * BLOCK))
    programs = triton.cdiv(numel, tiles * BLOCK)
    partials = torch.empty(6 * programs, dtype=torch.float32, device=values.device)
    row = torch.empty(len(ROW), dtype=torch.float64, device=values.device)
    _partials[(programs,)](values, partials, numel, programs, TILES=tiles, BLOCK=BLOCK)
    _combine[(1,)](partials, row, programs, PROGRAMS=PROGRAMS)
    return row
