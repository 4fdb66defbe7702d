"""A forward call's settings besides its tensors (verify/capture/op_attributes.py, ops.attrs): what a changed layer
setting leaves when its numbers stay within the devices' noise."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from verify.capture.op_attributes import attributes


class Settings(TorchDispatchMode):
    """Each call's op and settings, as the capture records them."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((func.overloadpacket.__name__, attributes(func, args, kwargs)))
        return func(*args, **kwargs)


def settings_of(compute) -> dict[str, str]:
    with Settings() as mode:
        compute()
    return dict(mode.calls)


def test_a_setting_other_than_the_default_is_written_and_a_default_is_not():
    x = torch.randn(4, 8)
    assert settings_of(lambda: F.gelu(x))["gelu"] == ""
    assert settings_of(lambda: F.gelu(x, approximate="tanh"))["gelu"] == "approximate='tanh'"
    assert settings_of(lambda: F.layer_norm(x, (8,), eps=1e-6))["native_layer_norm"] == (
        "normalized_shape=[8], eps=1e-06")
    assert settings_of(lambda: F.leaky_relu(x, 0.2))["leaky_relu"] == "negative_slope=0.2"


def test_where_and_in_which_precision_an_op_computes_is_no_setting():
    x = torch.randn(4, 8)
    assert settings_of(lambda: x.sum(dim=0, dtype=torch.float64))["sum"] == "dim=[0]"  # the dtype reads as an int
    assert settings_of(lambda: torch._softmax(x, -1, False))["_softmax"] == "dim=1"  # half_to_float follows autocast


def test_a_float_setting_is_written_to_six_significant_digits():
    x = torch.randn(2, 3, 4)
    assert settings_of(lambda: nn.GroupNorm(1, 3, eps=1.0 / 3.0)(x))["native_group_norm"].endswith("eps=0.333333")


def test_a_dimension_counted_from_the_back_is_the_same_setting():
    x = torch.randn(4, 8)
    assert settings_of(lambda: F.log_softmax(x, dim=-1))["_log_softmax"] == "dim=1"
    assert settings_of(lambda: x.sum(dim=(-2, -1)))["sum"] == "dim=[0, 1]"
