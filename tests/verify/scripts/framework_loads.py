"""Loads the tiny BERT, Llama and GPT-2 that tests/verify/test_framework_loads.py saved, each as users load one:
`from_pretrained` (built on the meta device, its non-persistent buffers made anew, the safetensors file loaded; also
with `device_map="auto"`, which names the GPU by its index), and built empty (accelerate's `init_empty_weights`,
`torch.device("meta")`), `to_empty` and the safetensors file loaded into it. Writes every tensor each holds to DUMP (a safetensors file), then trains a layer for the steps verify asks.

    python framework_loads.py MODELS DUMP
"""

import sys

import torch
from accelerate import init_empty_weights
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel

MODELS = ("bert", "llama", "gpt2")
LOADED = {"from_pretrained": {}, "device_map_auto": {"device_map": "auto"}}  # from_pretrained's keywords


def built_empty(folder: str, empty_context) -> torch.nn.Module:
    """The model built without memory, given memory by to_empty, its saved weights loaded (its non-persistent
    buffers stay as to_empty left them: uninitialised)."""
    with empty_context:
        model = AutoModel.from_config(AutoConfig.from_pretrained(folder))
    model.to_empty(device="cpu")
    model.load_state_dict(load_file(f"{folder}/model.safetensors"), strict=False)
    return model


def held(model: torch.nn.Module, kind: str) -> dict[str, torch.Tensor]:
    tensors = model.state_dict() if kind not in LOADED else dict([*model.named_parameters(), *model.named_buffers()])
    return {f"{kind}/{key}": value.detach().clone().contiguous() for key, value in tensors.items()}


def main(models: str, dump: str) -> None:
    tensors = {}
    for name in MODELS:
        folder = f"{models}/{name}"
        for kind, keywords in LOADED.items():
            loaded = AutoModel.from_pretrained(folder, **keywords)
            tensors |= {f"{name}/{key}": value for key, value in held(loaded, kind).items()}
        for kind, context in (("init_empty_weights", init_empty_weights()), ("meta", torch.device("meta"))):
            tensors |= {f"{name}/{key}": value for key, value in held(built_empty(folder, context), kind).items()}
    save_file(tensors, dump)
    layer = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        layer(torch.ones(2, 4)).pow(2).mean().backward()
        optimizer.step()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
