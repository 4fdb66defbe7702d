"""verify/capture/random_streams.py in-process: dropout masks drawn from the keyed stream are the same whatever else a
side draws from its generator, and differ from step to step and from module to module."""

import torch
import torch.nn as nn

from verify.capture import random_streams


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


def test_dropout_in_eval_mode_leaves_the_input_and_the_functions_are_restored():
    with random_streams.keyed(1, lambda: 0, []):
        assert torch.equal(nn.functional.dropout(torch.ones(3), 0.5, training=False), torch.ones(3))
    assert nn.functional.dropout.__name__ == "dropout" and nn.functional.dropout.__module__ == "torch.nn.functional"


def test_attention_dropout_is_keyed_and_without_dropout_it_is_the_kernels_own():
    torch.manual_seed(0)
    query, key, value = torch.randn(3, 2, 2, 5, 8).unbind(0)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    results = []
    for draws_before in (0, 9):
        torch.rand(draws_before)
        with random_streams.keyed(1, lambda: 0, []):
            results.append(nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask,
                                                                      dropout_p=0.3))
            plain = nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    assert torch.equal(results[0], results[1])
    expected = nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    assert torch.equal(plain, expected)
    with random_streams.keyed(1, lambda: 0, []):  # no dropout kept: the math path equals the kernel
        reference = nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=1e-12)
    assert torch.allclose(reference, expected, atol=1e-6)
