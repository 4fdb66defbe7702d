"""Every threshold `verify compare` judges with, as data, each with the reason for its value.

The reference point is msprobe (dump-and-compare.md §3): statistics warn at a relative error of 0.5, tensors fail at
cosine < 0.99 with max abs error > 0.001, or max abs error > 1. Those are single numbers for every dtype; ours depend
on the dtype, because a bf16 op is legitimately 50x noisier than an fp32 one and one threshold cannot fit both.

An op whose two sides have different dtypes (fp32 reference against an fp16 port) is judged by the looser dtype.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class OpTolerance:
    stats_rtol: float  # largest accepted metrics.stats_error (max over min/max/mean/l2_norm, scaled by the tensor)
    cosine_min: float  # tensor mode: smallest accepted cosine similarity
    max_abs_error: float  # tensor mode: a larger max abs error fails unless nearly all elements are close...
    within_5e3_min: float  # ...i.e. unless at least this share of elements is within 0.5% (msprobe's Five Thousandths)
    looseness: int  # orders dtypes: a mixed pair is judged by the looser side


# stats_rtol, the floor of every op record's tolerance, is the devices' operator accuracy standard (Ascend's: an
# operator's mean relative error below 2^-10 in fp16, 2^-7 in bf16, 2^-13 in fp32, its largest below 10 times that),
# read through the statistics a record keeps (metrics.stats_error): a mean scaled by the tensor's largest magnitude
# moves by at most the elements' mean relative error; min and max are single elements, off by up to the largest
# (10 times the mean), and count EXTREME_WEIGHT (a tenth) of theirs; the L2 norm moves by the elements' relative
# errors weighted by their squares, about their mean. So a kernel within the standard moves no statistic of its own
# output past the standard's mean, and one 1% off moves its L2 norm by 1%: 10 times the fp16 floor. The noise an op
# carries from its inputs and from earlier steps is no kernel's error of its own: the envelope measures it, and without
# a calibration the rules of op_verdicts (NOISE_AMPLIFICATION, STATE_NOISE_GROWTH) stand in. Measured on the GPU
# fixtures (shared/fixtures/gpu-runs, tests/verify/fixtures/h200-runs: real H100/H200 references against the emulated
# NPU), whose faithful pairs pass on these floors.
OP_TOLERANCES: dict[str, OpTolerance] = {
    # float64 only appears in reference code or losses; both sides should agree to rounding.
    "float64": OpTolerance(stats_rtol=1e-6, cosine_min=0.999999, max_abs_error=1e-6, within_5e3_min=0.999, looseness=0),
    # fp32 in tensor mode: a GPU reference may run matmuls and convolutions in TF32 (10-bit mantissa, ~5e-4 per
    # rounding) and the NPU accumulates in a different order; cosine 0.9999 is 100x stricter than msprobe's 0.99,
    # which would let a visibly wrong fp32 op through; msprobe's max abs error 0.001 is kept.
    "float32": OpTolerance(stats_rtol=2.0**-13, cosine_min=0.9999, max_abs_error=1e-3, within_5e3_min=0.99,
                           looseness=1),
    # fp16: machine epsilon 9.8e-4.
    "float16": OpTolerance(stats_rtol=2.0**-10, cosine_min=0.999, max_abs_error=1e-2, within_5e3_min=0.9, looseness=2),
    # bf16: machine epsilon 7.8e-3, so one rounding alone can move an element by 0.4%; cosine 0.99 is msprobe's own
    # threshold, which was tuned on bf16 LLM training.
    "bfloat16": OpTolerance(stats_rtol=2.0**-7, cosine_min=0.99, max_abs_error=5e-2, within_5e3_min=0.5, looseness=3),
}
# The batch a model receives (compare's INPUT_OP records), where no model computed it (a GAN's discriminator reads its
# generator's output), is data: both sides read it from the same files through the same code, so it agrees to the
# rounding of its statistics, or the sides read other data. Those sum in float32: the CPU's kernel
# (verify/capture/_stats.c, its BLOCK) up to STATS_SUMMED_IN_TURN elements one after another, a GPU's as a tree, so
# two devices' statistics of the same bits differ by at most that many float32 roundings of their magnitude (of n
# elements, n for fewer). Measured on an H200 against the emulated NPU on the CPU, the same bits: 1.3e-6 to 2.0e-6
# (the L2 norm) for pytorch/examples mnist's 64x1x28x28 batches, 3.6e-5 for imagenet's 8x3x224x224; another batch
# moves its statistics by 1e-3 and more. BATCH_RTOL: the least, for a few elements.
BATCH_RTOL = 1e-6
STATS_SUMMED_IN_TURN = 4096
FLOAT32_ROUNDOFF = 2.0**-24


def batch_rtol(numel: np.ndarray) -> np.ndarray:
    """The tolerance of data batches of `numel` elements: the rounding of their statistics."""
    return np.maximum(BATCH_RTOL, np.minimum(numel, STATS_SUMMED_IN_TURN) * FLOAT32_ROUNDOFF)


# Integers and booleans (indices, masks, argmax) must be identical: any difference is a real divergence.
EXACT = OpTolerance(stats_rtol=0.0, cosine_min=1.0, max_abs_error=0.0, within_5e3_min=1.0, looseness=-1)
# A dtype we do not know (float8, complex, a dtype string from a newer writer) is judged like fp32 rather than skipped.
UNKNOWN_DTYPE = OP_TOLERANCES["float32"]
EXACT_DTYPES = ("bool", "int8", "uint8", "int16", "int32", "int64")

# fp32 reference against an AMP port: every op tolerance is widened by this factor, because the half-precision errors
# of each op add up through the layers and the first divergent op would otherwise be wherever the noise crosses the
# line. The report says that this policy was used.
AMP_VS_FP32_OP_FACTOR = 5.0

# Noise an op inherits: an op whose error is at most NOISE_AMPLIFICATION times the largest error among the
# INHERITED_NOISE_WINDOW op calls before it in its step carries their noise rather than making its own. On an H100
# against the emulated NPU (shared/fixtures/gpu-runs/nanogpt-bf16-faithful), the fp32 layer norm after bf16 matmuls
# shows 0.0022 against the fp32 tolerance 0.001 while the gradient flowing into it already differs by 0.0052; a
# changed activation (gelu for relu) amplifies its inputs' 0.0004 to 0.09. The window covers an op's inputs and the
# casts between (a backward op's incoming gradient and its cast are the two or three calls before it).
# The inputs' own tolerance counts as their noise too, amplified alike: their statistics average their elements' noise
# away, and an op summing thousands of them with cancellation brings it back (on the emulators' modelled noise, the fp32
# layer norm weight gradient of samples/gpt_lm over 2048 tokens shows 0.00105 where its inputs' statistics show 1e-5).
NOISE_AMPLIFICATION = 2.0
INHERITED_NOISE_WINDOW = 4
# min and max are one element each, and a device's noise moves single elements a long way: a max-pool's argmax or a
# ReLU's threshold flipped by a last-bit difference sends a gradient to another element. On the emulators' modelled
# noise (a faithful fp16 port of samples/mnist_cnn), the max of a convolution's input gradient moved 9% (0.000280
# against 0.000256) while its L2 norm agreed to 0.006% and the gradient flowing in to 0.085%. Their differences count
# a tenth of the mean's and the norm's in metrics.stats_error; an overflow or a saturation still moves them far past.
EXTREME_WEIGHT = 0.1
# Noise a step inherits from the state earlier steps left: after step 0 every op reads weights (and optimizer state)
# that differ by the noise of all earlier updates, and training amplifies that noise from step to step, in no op's
# data flow within the step. An op of step k carries noise up to STATE_NOISE_GROWTH times the largest error of the
# steps before it. Calibrated on the emulators' modelled device noise (EMULATED CUDA against the emulated NPU): the
# faithful fp16 port of samples/mnist_cnn, whose Adadelta makes sign-like first updates, grows its largest op error
# about 10x a step between steps 3 and 6 (0.0022, 0.021, 0.031) while its losses agree within 0.014%; a bias gradient
# summing thousands of cancelling fp16 terms shows 0.021 where its incoming gradient shows 0.00065; the climbing
# loss of samples/imagenet_classifier grows it 13x from step 0 to 1 (0.0064, 0.085). Step 0 starts from the same
# weights on both sides and is judged by its data flow alone, where a port's own divergence shows.
STATE_NOISE_GROWTH = 20.0
# An adaptive optimizer (Adam, Adadelta) moves each element by about lr whatever its gradient's size at its first
# applied update, so an element whose gradient is within the noise of zero flips its whole step: the mean of an update
# of n elements moves by 2/n of its largest per flipped element. Up to this many such elements are what the noise of
# the gradients makes, on updates of at least UPDATE_FLIP_MIN_ELEMENTS elements (a smaller one is all flips). Measured:
# pytorch/examples fast_neural_style's fp16 port, its GradScaler settled at 16, against its fp32 original: its first
# Adam update of an InstanceNorm bias (128 elements) 2/128 apart, one element flipped, every gradient within
# tolerance.
UPDATE_FLIPPED_ELEMENTS = 2
UPDATE_FLIP_MIN_ELEMENTS = 64
# What such flips carry into the next steps' forward records computed from the parameter alone (InstanceNorm's
# `weight.repeat`): the differences its update records were allowed, summed over the steps before, times this for
# the statistics' own rounding (fast_neural_style's fp16 port at init_scale 2: the repeat of an InstanceNorm weight
# 0.0156 apart at step 3, its updates' allowed differences summing to the same 0.0156 within the last bits).
CARRIED_FLIPS_SLACK = 2.0

# The reference's envelope (verify/compare/envelope.py): a record of the port diverges when its difference passes this
# many times the difference of the reference from its calibration run, and its dtype's tolerance above (the floor).
# One calibration run is one sample of the noise. Measured on EMULATED CUDA against the emulated NPU, faithful ports of
# pytorch/examples (mnist, dcgan, imagenet's resnet18 on --dummy data, siamese_network, all fp16 ports, 4 to 10 steps):
# of the records past their fixed tolerance (53, 599, 742 and 442 op records), the largest port difference was 3.6
# times its envelope (imagenet's ops; 2.5 its gradient norms, 0.5 the losses), so 10 leaves a margin of almost 3.
# Since the first calibration sums in the port's device's order, the same ports and mnist_rnn, vae, regression and
# word_language_model (10 steps) differ from the reference by at most 2.2 times their ops' envelopes (1.0 at the 99th
# percentile): what is left apart is where the two faces' autocasts cast a sum's input differently.
ENVELOPE_FACTOR = 10.0

# Where a difference enters the data flow (op_verdicts._where_it_enters): walking up from the first op past its
# tolerance, an op whose difference passes ENVELOPE_FACTOR times its envelope and this share of its tolerance is
# computed otherwise by the port, even below its floor: a kernel off by a quarter of the devices' accuracy standard is
# one; the faces' own autocast differences (the reference's noise) stay within ENVELOPE_FACTOR times the envelope.
ENTRY_SHARE_OF_FLOOR = 0.25

# Loss: relative difference per step (README: "Default loss tolerance: 1% relative per step").
LOSS_RTOL = 0.01
# An fp32 reference against an fp16/bf16 port: the AMP noise alone moves early losses by a few tenths of a percent and
# grows as the weights drift; 5% keeps "AMP noise" apart from "the port is wrong" for the short runs verify makes.
AMP_VS_FP32_LOSS_RTOL = 0.05
# Gradient norms per parameter: they follow the loss, so they get the loss's tolerance, widened for tiny gradients.
GRAD_NORM_ATOL = 1e-8  # a norm below this is zero for every practical purpose (fp16 underflows at 6e-8)
# A parameter's gradient norm differs relative to the larger of its own norm and this share of the step's largest
# parameter gradient norm, as an op's statistics are scaled by the tensor's largest element: the gradient of a bias
# that is a cancelling sum over the batch is mostly noise (on the emulators' modelled noise, the fp16 mnist port's
# classifier bias gradient, 0.066 against conv weight gradients of 0.5, moved 1.1% while the losses agreed to 0.03%).
GRAD_NORM_SHARE_OF_LARGEST = 0.1

# Loss scaling (checklist workflow step 1): "loss scale collapsing, e.g. straight to 1".
SCALE_COLLAPSE_FLOOR = 1.0  # a GradScaler scale at or below this no longer protects fp16 gradients from underflow
FREQUENT_OVERFLOW_SHARE = 0.5  # the scale fell (an overflow skipped the step) in at least this share of the steps
# a port whose GradScaler skipped every update of at least this many steps never trained in the run: one skipped
# step is a GradScaler's usual first back-off from its initial scale
MIN_STEPS_NEVER_UPDATED = 2

# Inference outputs: the criteria Ascend adaptation reports use.
OUTPUT_TOP1_MIN = 0.99  # at most 1% of samples change their top-1 class
OUTPUT_TOP5_MIN = 0.99  # top-5 sets overlap by 99% on average
OUTPUT_LIMITS = {"top1_agreement_min": OUTPUT_TOP1_MIN, "top5_agreement_min": OUTPUT_TOP5_MIN}  # metrics' thresholds


def output_criterion(ref_dtype: str, actual_dtype: str, widen: float = 1.0) -> str:
    """The criterion inference outputs are judged by, in the words of an adaptation report."""
    cosine_min = float(pair_tolerances(pd.Series([ref_dtype]), pd.Series([actual_dtype]), widen)["cosine_min"].iloc[0])
    return (f"cosine >= {cosine_min:g} ({'the looser of its two dtypes' if ref_dtype != actual_dtype else ref_dtype}), "
            f"top-1 agreement >= {OUTPUT_TOP1_MIN:.0%}, top-5 agreement >= {OUTPUT_TOP5_MIN:.0%}")


FIELDS = [f.name for f in fields(OpTolerance)]


def op_tolerance(dtype: str) -> OpTolerance:
    if dtype in EXACT_DTYPES:
        return EXACT
    return OP_TOLERANCES.get(dtype, UNKNOWN_DTYPE)


def _per_row(dtypes: pd.Series) -> np.ndarray:
    """rows x OpTolerance fields, looked up once per distinct dtype."""
    codes, uniques = pd.factorize(dtypes)
    table = np.array([astuple(op_tolerance(str(dtype))) for dtype in uniques] + [astuple(UNKNOWN_DTYPE)], float)
    return table[codes]  # code -1 (missing dtype) takes the appended UNKNOWN_DTYPE row


def pair_tolerances(ref_dtype: pd.Series, actual_dtype: pd.Series, widen: float = 1.0,
                    autocast: str = "") -> pd.DataFrame:
    """Per aligned row, the tolerance of the looser of the two dtypes, widened by `widen` (AMP-vs-fp32 policy). Under
    a half `autocast` a floating record is judged at least by the half dtype's: an fp32 op there reads half results
    (measured: an Adam update of fp32 master weights from fp16 gradients, 1.4e-4 apart on the emulators' modelled
    noise against fp32's 2^-13), so its own fp32 kernel's error is not what it shows."""
    ref_rows, actual_rows = _per_row(ref_dtype), _per_row(actual_dtype)
    looseness = FIELDS.index("looseness")
    looser = np.where((actual_rows[:, looseness] > ref_rows[:, looseness])[:, None], actual_rows, ref_rows)
    if autocast:
        half = np.array(astuple(op_tolerance(autocast)), float)
        looser = np.where(((looser[:, looseness] >= 0) & (looser[:, looseness] < half[looseness]))[:, None], half,
                          looser)
    chosen = pd.DataFrame(looser, columns=FIELDS, index=ref_dtype.index)
    chosen["stats_rtol"] *= widen
    chosen["max_abs_error"] *= widen
    chosen["cosine_min"] = 1.0 - (1.0 - chosen["cosine_min"]) * widen
    return chosen
