"""verify never changes what a framework loads (issue 44): tiny BERT, Llama and GPT-2 models, built from configs and
saved with `save_pretrained`, loaded by tests/verify/scripts/framework_loads.py (`from_pretrained`, and built empty
with `init_empty_weights` or `torch.device("meta")`, then `to_empty` and the safetensors file) hold the same
parameters and buffers, bit for bit, under `verify run` on each emulator and on the CPU as in a plain run.
`from_pretrained(device_map="auto")` names the GPU by its index, `torch.device(0)`: under EMULATED CUDA that stopped
with "Cannot access accelerator device when none is available" (a CPU build's torch has no CUDA hooks to ask).

Under both emulators, transformers 5's non-persistent buffers (BERT's position_ids, a Llama's rotary inv_freq) were
uninitialised memory; on the CPU the load stopped with "Cannot copy out of meta tensor"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from verify.cli import app
from verify.cli.pair import route

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
safetensors_torch = pytest.importorskip("safetensors.torch")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "scripts" / "framework_loads.py"
TINY = {"vocab_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 32,
        "max_position_embeddings": 32}


def tiny_models() -> dict[str, torch.nn.Module]:
    return {
        "bert": transformers.BertModel(transformers.BertConfig(hidden_size=16, **TINY)),
        "llama": transformers.LlamaModel(transformers.LlamaConfig(hidden_size=16, num_key_value_heads=1, **TINY)),
        "gpt2": transformers.GPT2Model(transformers.GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2,
                                                               n_positions=32)),
    }


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """The saved models' folder, and what the script loads from it in a plain Python run."""
    models = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    for name, model in tiny_models().items():
        model.save_pretrained(models / name)
    dump = models / "plain.safetensors"
    done = subprocess.run([sys.executable, SCRIPT, models, dump], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return models, safetensors_torch.load_file(dump)


def test_the_plain_load_makes_the_non_persistent_buffers(plain):
    _, loaded = plain
    assert loaded["bert/from_pretrained/embeddings.position_ids"].flatten().tolist() == list(range(32))
    inv_freq = loaded["llama/from_pretrained/rotary_emb.inv_freq"]
    assert torch.equal(inv_freq, 1.0 / 10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8))


@pytest.mark.parametrize("device", ["emulated-npu", "emulated-cuda", "cpu"])
def test_verify_loads_every_parameter_and_buffer_as_a_plain_run_does(plain, tmp_path, device):
    models, expected = plain
    dump = tmp_path / "loaded.safetensors"
    argv = ["run", str(SCRIPT), "--device", device, "--steps", "2", "-q", "-o", str(tmp_path / "run"), "--",
            str(models), str(dump)]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    assert result.exit_code == 0, result.output
    loaded = safetensors_torch.load_file(dump)
    assert loaded.keys() == expected.keys()
    # to_empty leaves non-persistent buffers uninitialised in a plain run too: only from_pretrained's are compared
    differing = [key for key, value in expected.items() if not torch.equal(loaded[key], value)]
    assert differing == []
