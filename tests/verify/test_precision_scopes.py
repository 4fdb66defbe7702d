"""verify/capture/precision_scopes.py in-process on the CPU: what a run records of its autocast, and a reference that
follows that record module call by module call."""

import torch
import torch.nn as nn

from verify.capture import precision_scopes

CPU = "cpu"


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, x):
        return torch.sigmoid(self.body(x))


def port_step(model, loss_module, x, y):
    """The port's shape: the forward under autocast, the loss module outside it on float32, then a validation call
    outside autocast."""
    with torch.autocast(CPU, dtype=torch.bfloat16):
        out = model(x)
    loss = loss_module(out.float(), y)
    model(x)  # validation, in float32
    return loss


def original_step(model, loss_module, x, y):
    out = model(x)
    loss = loss_module(out, y)
    validation = model(x)
    return out, loss, validation


def test_a_run_records_each_module_calls_autocast_in_order():
    scopes = {}
    with precision_scopes.recorded(CPU, scopes):
        port_step(Critic(), nn.BCELoss(), torch.randn(3, 4), torch.rand(3, 1))
    assert scopes["Critic"] == [["bfloat16", 1], ["off", 1]]
    assert scopes["Critic.body.0"] == [["bfloat16", 1], ["off", 1]]
    assert scopes["BCELoss"] == [["off", 1]]


def test_a_reference_follows_the_ports_calls_and_its_loss_module_gets_float32():
    scopes = {}
    with precision_scopes.recorded(CPU, scopes):
        port_step(Critic(), nn.BCELoss(), torch.randn(3, 4), torch.rand(3, 1))
    seen = {}
    loss_module = nn.BCELoss()
    loss_module.register_forward_pre_hook(lambda module, args: seen.update(loss_input=args[0].dtype))
    with precision_scopes.imposed(CPU, "bf16", precision_scopes.following(scopes)):
        assert not torch.is_autocast_enabled(CPU)  # data preparation before the first module call
        out, loss, validation = original_step(Critic(), loss_module, torch.randn(3, 4), torch.rand(3, 1))
        assert not torch.is_autocast_enabled(CPU)  # the last outermost call (validation) was outside autocast
    assert (out.dtype, seen["loss_input"], loss.dtype, validation.dtype) == (
        torch.bfloat16, torch.float32, torch.float32, torch.float32)
    assert not torch.is_autocast_enabled(CPU)


def test_without_a_record_the_autocast_covers_the_whole_script():
    with precision_scopes.imposed(CPU, "bf16", None):
        assert torch.is_autocast_enabled(CPU)
        out, _, validation = original_step(Critic(), nn.MSELoss(), torch.randn(3, 4), torch.rand(3, 1))
    assert (out.dtype, validation.dtype) == (torch.bfloat16, torch.bfloat16)
