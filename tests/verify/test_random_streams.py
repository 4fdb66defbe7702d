"""verify/random_streams.py in-process: dropout masks drawn from the keyed stream are the same whatever else a side
draws from its generator, and differ from step to step and from module to module."""

import torch
import torch.nn as nn

from verify import random_streams


class TwoDropouts(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Dropout(0.5)
        self.second = nn.Dropout2d(0.5)

    def forward(self, x):
        return self.first(x), self.second(x)


def outputs(seed: int, step: int, draws_before: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(draws_before)  # another side: another generator state
    torch.rand(draws_before)
    not_aligned = []
    with random_streams.keyed(seed, lambda: step, not_aligned):
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


def test_dropout_in_eval_mode_and_attention_dropout():
    not_aligned = []
    with random_streams.keyed(1, lambda: 0, not_aligned):
        assert torch.equal(nn.functional.dropout(torch.ones(3), 0.5, training=False), torch.ones(3))
        query = torch.randn(1, 2, 4, 8)
        nn.functional.scaled_dot_product_attention(query, query, query, dropout_p=0.1)
    assert not_aligned == ["scaled_dot_product_attention dropout_p"]
    assert nn.functional.dropout.__name__ == "dropout" and nn.functional.dropout.__module__ == "torch.nn.functional"
