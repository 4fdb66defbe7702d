"""verify/capture/random_streams.py in-process: dropout masks and every seeded random op drawn from the keyed stream are
the same whatever else a side draws from its generators, and differ from step to step and from module to module; the
seeded random ops of the installed torch are each keyed or named with the reason they cannot be."""

import contextlib
import functools

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from verify.capture import random_streams
from verify.capture.ops import OpCapture
from verify.capture.tensor_stats import StatBatch
from verify.record.schema import DumpMode
from verify.devices.emulated.npu_port_emulation.device_numerics import DeviceNumerics


class TwoDropouts(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Dropout(0.5)
        self.second = nn.Dropout2d(0.5)

    def forward(self, x):
        return self.first(x), self.second(x)


def outputs(seed: int, step: int, draws_before: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)  # the script's seed: the stream's
    torch.rand(draws_before)  # another side: another generator state
    not_aligned = []
    with random_streams.keyed(lambda: step, not_aligned):
        first, second = TwoDropouts()(torch.ones(4, 3, 5, 5))
    assert not_aligned == []
    return first, second


def test_masks_do_not_depend_on_the_devices_generator():
    assert all(torch.equal(a, b) for a, b in zip(outputs(1, 0, draws_before=0), outputs(1, 0, draws_before=7)))


def test_masks_differ_by_step_by_module_and_by_seed():
    first, second = outputs(1, 0, 0)
    assert not torch.equal(first, outputs(1, 1, 0)[0]) and not torch.equal(first, outputs(2, 0, 0)[0])
    assert not torch.equal(first, second)
    # Dropout2d drops whole channels; the kept elements are scaled by 1 / keep
    assert set(second.flatten(2).unique(dim=2).shape[2:]) == {1} and set(second.unique().tolist()) <= {0.0, 2.0}


def test_dropout_in_eval_mode_leaves_the_input_and_the_functions_are_restored():
    with random_streams.keyed(lambda: 0, []):
        assert torch.equal(nn.functional.dropout(torch.ones(3), 0.5, training=False), torch.ones(3))
    assert nn.functional.dropout.__name__ == "dropout" and nn.functional.dropout.__module__ == "torch.nn.functional"


def test_attention_dropout_is_keyed_and_without_dropout_it_is_the_kernels_own():
    torch.manual_seed(0)
    query, key, value = torch.randn(3, 2, 2, 5, 8).unbind(0)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    results = []
    for draws_before in (0, 9):
        torch.rand(draws_before)
        with random_streams.keyed(lambda: 0, []):
            results.append(nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask,
                                                                      dropout_p=0.3))
            plain = nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    assert torch.equal(results[0], results[1])
    expected = nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    assert torch.equal(plain, expected)
    with random_streams.keyed(lambda: 0, []):  # no dropout kept: the math path equals the kernel
        reference = nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=1e-12)
    assert torch.allclose(reference, expected, atol=1e-6)


# --- every op torch tags nondeterministic_seeded ---------------------------------------------------------------------

torch.manual_seed(0)
_X, _P = torch.rand(3, 4), torch.rand(3, 4)
_SEQUENCE = torch.rand(5, 2, 4)
_RECURRENT = {kind: module(4, 4, num_layers=2, dropout=0.5, **extra) for kind, module, extra in (
    ("lstm", nn.LSTM, {}), ("gru", nn.GRU, {}), ("rnn_tanh", nn.RNN, {}), ("rnn_relu", nn.RNN, {"nonlinearity": "relu"}))}

# One call that draws, per tagged op that the keyed stream aligns (the recurrent modules' and the composite dropouts'
# draws reach it as the bernoulli_ they decompose into on the CPU).
DRAWS = {
    "aten.bernoulli": lambda: torch.bernoulli(_P),
    "aten.bernoulli_": lambda: _X.clone().bernoulli_(0.5),
    "aten.cauchy": lambda: torch.ops.aten.cauchy(_X),
    "aten.cauchy_": lambda: _X.clone().cauchy_(),
    "aten.dropout": lambda: torch.dropout(_X, 0.5, True),
    "aten.alpha_dropout": lambda: nn.functional.alpha_dropout(_X, 0.5, True),
    "aten.native_dropout": lambda: torch.native_dropout(_X, 0.5, True)[0],
    "aten.exponential": lambda: torch.ops.aten.exponential(_X),
    "aten.exponential_": lambda: _X.clone().exponential_(),
    "aten.geometric": lambda: torch.ops.aten.geometric(_X, 0.3),
    "aten.geometric_": lambda: _X.clone().geometric_(0.3),
    "aten.log_normal": lambda: torch.ops.aten.log_normal(_X),
    "aten.log_normal_": lambda: _X.clone().log_normal_(),
    **{f"aten.{kind}": functools.partial(lambda module: module(_SEQUENCE)[0], module)
       for kind, module in _RECURRENT.items()},
    "aten.multinomial": lambda: torch.multinomial(_P, 3),
    "aten.normal": lambda: torch.normal(_X, 1.0),
    "aten.normal_": lambda: _X.clone().normal_(),
    "aten.normal_functional": lambda: torch.ops.aten.normal_functional(_X),
    "aten.poisson": lambda: torch.poisson(_X * 3),
    "aten._standard_gamma": lambda: torch._standard_gamma(_X + 0.5),
    "aten.rand": lambda: torch.rand(3, 4),
    "aten.rand_like": lambda: torch.rand_like(_X),
    "aten.randint": lambda: torch.randint(0, 100, (3, 4)),
    "aten.randint_like": lambda: torch.randint_like(_X, 100),
    "aten.randn": lambda: torch.randn(3, 4),
    "aten.randn_like": lambda: torch.randn_like(_X),
    "aten.randperm": lambda: torch.randperm(20),
    "aten.rrelu": lambda: torch.rrelu(_X - 0.5, training=True),  # composite: its rrelu_with_noise draws
    "aten.rrelu_with_noise": lambda: nn.functional.rrelu(_X - 0.5, training=True),
    "aten.rrelu_with_noise_": lambda: nn.functional.rrelu(_X - 0.5, training=True, inplace=True),
    "aten.rrelu_with_noise_functional": lambda: torch.ops.aten.rrelu_with_noise_functional(
        _X - 0.5, torch.zeros_like(_X), training=True)[0],
    "aten.uniform": lambda: torch.ops.aten.uniform(_X),
    "aten.uniform_": lambda: _X.clone().uniform_(),
    "aten._sample_dirichlet": lambda: torch._sample_dirichlet(_X + 0.5),
    "aten.binomial": lambda: torch.binomial(_X * 10, _P),
    "aten.random_": lambda: _X.clone().random_(0, 100),
    "aten.random": lambda: torch.ops.aten.random(_X, 0, 100),
    # composites: they decompose into the ops above, which draw
    "aten.dropout_": lambda: torch.dropout_(_X.clone(), 0.5, True),
    "aten.alpha_dropout_": lambda: torch.alpha_dropout_(_X.clone(), 0.5, True),
    "aten.feature_dropout": lambda: torch.feature_dropout(_SEQUENCE, 0.5, True),
    "aten.feature_dropout_": lambda: torch.feature_dropout_(_SEQUENCE.clone(), 0.5, True),
    "aten.feature_alpha_dropout": lambda: torch.feature_alpha_dropout(_SEQUENCE, 0.5, True),
    "aten.feature_alpha_dropout_": lambda: torch.feature_alpha_dropout_(_SEQUENCE.clone(), 0.5, True),
    "aten.rrelu_": lambda: torch.rrelu_(_X.clone() - 0.5, training=True),
    "aten._scaled_dot_product_attention_math": lambda: torch.ops.aten._scaled_dot_product_attention_math(
        _SEQUENCE, _SEQUENCE, _SEQUENCE, dropout_p=0.5)[0],
    # composite: the keyed stream computes it as its documented math path, whose dropout draws from the stream
    "aten.scaled_dot_product_attention": lambda: nn.functional.scaled_dot_product_attention(
        _SEQUENCE, _SEQUENCE, _SEQUENCE, dropout_p=0.5),
}


def tagged_ops() -> set[str]:
    """The op packets of the installed torch with an overload tagged nondeterministic_seeded: every aten op the
    dispatcher has registered, not only those this process has touched (torch.ops.aten loads its packets lazily, so
    dir() depended on what the tests that ran before had called)."""
    tagged = set()
    names = {name.split("::", 1)[1].split(".", 1)[0] for name in torch._C._dispatch_get_all_op_names()
             if name.startswith("aten::")}
    for name in sorted(names):
        packet = getattr(torch.ops.aten, name, None)
        if isinstance(packet, torch._ops.OpOverloadPacket) and any(
                torch.Tag.nondeterministic_seeded in getattr(packet, overload).tags for overload in packet.overloads()):
            tagged.add(str(packet))
    return tagged


class Step(nn.Module):
    """A training step's module: what its forward draws is keyed by its path."""

    def __init__(self, draw):
        super().__init__()
        self.draw = draw

    def forward(self):
        return self.draw()


def drawn(draw, seed: int, host_draws: int, device_seed: int) -> torch.Tensor:
    """`draw` in a step under the keyed stream of the script's `seed`, with the host's generator in another state
    (`host_draws` drawn) and an emulated device's own generator (device_numerics.py, below the keyed stream as in a
    run) seeded otherwise."""
    torch.manual_seed(seed)
    torch.rand(host_draws)
    not_aligned = []
    with DeviceNumerics(2, torch.Generator().manual_seed(device_seed)), random_streams.keyed(lambda: 0, not_aligned):
        result = Step(draw)()
    assert not_aligned == []
    return result


# The torch whose tagged ops DRAWS and NOT_KEYED list exactly; older torch lacks some of them (2.4 has no
# rrelu_with_noise_functional) and tags fewer (2.4 leaves poisson untagged).
LISTED_FOR = "2.13"


def test_every_seeded_random_op_of_the_installed_torch_is_keyed_or_named_with_its_reason():
    listed = set(DRAWS) | set(random_streams.NOT_KEYED)
    assert tagged_ops() <= listed
    if torch.__version__ >= LISTED_FOR:
        assert listed == tagged_ops()
    assert not set(DRAWS) & set(random_streams.NOT_KEYED)


@pytest.mark.parametrize("op", sorted(DRAWS))
def test_a_seeded_random_op_draws_from_the_keyed_stream_whatever_the_generators_hold(op):
    if not hasattr(torch.ops.aten, op.removeprefix("aten.")):
        pytest.skip(f"torch {torch.__version__} has no {op}")
    draw = DRAWS[op]
    result = drawn(draw, seed=1, host_draws=0, device_seed=0)
    assert torch.equal(result, drawn(draw, seed=1, host_draws=5, device_seed=9))
    assert not torch.equal(result, drawn(draw, seed=2, host_draws=0, device_seed=0))  # the key is what it draws from


def test_a_tagged_op_that_cannot_be_keyed_is_named_with_its_reason():
    not_aligned = []
    with random_streams.keyed(lambda: 0, not_aligned), pytest.raises(NotImplementedError):
        Step(lambda: torch._fused_dropout(_X, 0.5))()  # CUDA's kernel: none on the CPU
    assert not_aligned == [f"aten._fused_dropout in Step ({random_streams.NOT_KEYED['aten._fused_dropout']})"]


def test_setup_draws_are_the_hosts_as_in_a_plain_run_and_a_scripts_own_generator_is_its_own():
    torch.manual_seed(3)
    plain = torch.randn(4), nn.Linear(3, 2).weight, torch.randn(4, generator=torch.Generator().manual_seed(8))
    torch.manual_seed(3)
    with random_streams.keyed(lambda: 0, []):
        keyed = (torch.randn(4), nn.Linear(3, 2).weight,  # before the first module call
                 Step(lambda: torch.randn(4, generator=torch.Generator().manual_seed(8)))())
    assert all(torch.equal(a, b) for a, b in zip(plain, keyed))


class _PassThrough(TorchDispatchMode):
    """A mode between the capture and the keyed draws (as a calibration's rounding is): they stay two modes."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Noisy(nn.Module):
    """Seeded ops that reach the dispatch modes (no functional dropout: that is keyed above them)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.RReLU()

    def forward(self, x):
        return self.act(self.fc(x)) * torch.bernoulli(torch.full_like(x, 0.5))


def _captured_with_keyed_draws(mode_between: bool) -> tuple[dict, torch.Tensor, list[str]]:
    torch.manual_seed(0)
    model, x = _Noisy(), torch.randn(3, 4)
    batch = StatBatch()
    between = _PassThrough() if mode_between else contextlib.nullcontext()
    with random_streams.keyed(lambda: 0, []), between, OpCapture(DumpMode.STATS, batch) as capture:
        stack = [type(mode).__name__ for mode in _get_current_dispatch_mode_stack()]
        model(x).sum().backward()
        with capture.paused():  # verify's own work: off the record, still keyed
            drawn_while_paused = torch.rand_like(x)
        columns = capture.take_step(0, batch.fetch())
    return columns, drawn_while_paused, stack


def test_the_capture_serves_the_keyed_draws_below_it_as_their_own_mode_would():
    """Directly below the capture, the keyed draws leave the mode stack while it records (every other op pays one
    Python mode, not two) and its handler draws for them: the same records and draws as with a mode between them, and
    a paused block's draws keyed too."""
    inline, paused_inline, stack_inline = _captured_with_keyed_draws(mode_between=False)
    apart, paused_apart, stack_apart = _captured_with_keyed_draws(mode_between=True)
    assert stack_inline == ["_OpRecorder"]
    assert stack_apart == ["KeyedDraws", "_PassThrough", "_OpRecorder"]
    assert "rrelu_with_noise" in " ".join(inline["op"]) and "bernoulli" in " ".join(inline["op"])
    assert inline == apart
    assert torch.equal(paused_inline, paused_apart)
    assert _get_current_dispatch_mode_stack() == []


def _keyed_steps_alone(monkeypatch, hooked: bool) -> tuple[list[torch.Tensor], tuple[int, int, int]]:
    """Three SGD steps of a small model with dropout under the keyed streams alone, no capture (as the optimizer's
    step sees them, the capture paused): the parameters after each, and what the op hook served meanwhile."""
    from verify.capture import op_hook

    hook = op_hook.hook() if hooked else None
    if not hooked:
        monkeypatch.setattr(op_hook, "hook", lambda: None)
    before = hook.counts() if hook is not None else (0, 0, 0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Dropout(0.3), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    parameters, step = [], 0
    with random_streams.keyed(lambda: step, []):
        for step in range(3):
            optimizer.zero_grad()
            model(torch.randn(4, 6)).square().mean().backward()
            optimizer.step()
            parameters += [parameter.detach().clone() for parameter in model.parameters()]
    monkeypatch.undo()
    after = hook.counts() if hook is not None else (0, 0, 0)
    return parameters, tuple(end - start for start, end in zip(before, after))


def test_the_keyed_streams_on_the_stack_pass_the_ops_they_do_not_serve_in_the_compiled_hook(monkeypatch):
    """Issue 57: on the mode stack (no capture, or the capture paused for the optimizer's step) the keyed streams' mode
    hands every op it does not draw for to verify/capture/_op_hook.cpp from its second call on: the same draws and
    the same training, bit for bit."""
    from verify.capture import op_hook

    if op_hook.hook() is None:
        pytest.skip(f"the op hook is not built here: {op_hook.why_not()}")
    (hooked, (passed, detaches, recorded)), (python, _) = (_keyed_steps_alone(monkeypatch, way) for way in (True, False))
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(hooked, python, strict=True))
    assert passed >= 2 * 10 and detaches > 0 and recorded == 0  # it records nothing: no op is run and handed over
