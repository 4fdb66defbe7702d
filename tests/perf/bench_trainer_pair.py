"""Cost of a Hugging Face Trainer pair (issue 44): `verify ORIGINAL PORTED --steps N` against its slowest side alone
(`verify run` of the original on EMULATED CUDA, of the port on the emulated NPU, as the pair runs each), whole
processes measured in one run. The benchmark writes its own Trainer script (a tiny GPT-2 built from a config, saved
with save_pretrained and loaded by from_pretrained; a few hundred lines of local text, tokenized by a word list), its
port (the script with torch_npu's imports, as `migrate` makes it) and the model, into a temporary folder.

    python tests/perf/bench_trainer_pair.py [--steps 5] [--rounds 1] [--fp16]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

WORDS = "the a cat dog sat ran on under mat log tree house big small red blue quick slow jumps eats".split()
SCRIPT = textwrap.dedent('''
    """A tiny causal language model fine-tuned by transformers' Trainer on local text."""
    import sys

    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments, set_seed

    WORDS = {WORDS!r}


    class Lines(torch.utils.data.Dataset):
        def __init__(self, path, length=16):
            ids = [WORDS.index(word) for line in open(path) for word in line.split()]
            self.blocks = [ids[start:start + length] for start in range(0, len(ids) - length, length)]

        def __len__(self):
            return len(self.blocks)

        def __getitem__(self, index):
            block = torch.tensor(self.blocks[index])
            return {{"input_ids": block, "labels": block}}


    def main():
        set_seed(0)
        model = AutoModelForCausalLM.from_pretrained("model")
        arguments = TrainingArguments(output_dir="out", per_device_train_batch_size=8, learning_rate=1e-3,
                                      max_steps=50, report_to="none", save_strategy="no", logging_steps=1,
                                      fp16="--fp16" in sys.argv, disable_tqdm=True)
        Trainer(model=model, args=arguments, train_dataset=Lines("train.txt")).train()


    if __name__ == "__main__":
        main()
''').format(WORDS=WORDS)
PORT_IMPORTS = "import torch_npu\nfrom torch_npu.contrib import transfer_to_npu\n"


def write_project(folder: Path) -> tuple[Path, Path]:
    """The Trainer script, its port, the tiny GPT-2 and the local text, in `folder`."""
    original = folder / "train_lm.py"
    original.write_text(SCRIPT)
    port = folder / "train_lm_npu.py"
    port.write_text(SCRIPT.replace("import torch\n", "import torch\n" + PORT_IMPORTS, 1))
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(WORDS), n_embd=32, n_layer=2, n_head=2, n_positions=32, bos_token_id=0,
                        eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(folder / "model")
    picker = random.Random(0)
    lines = (" ".join(picker.choice(WORDS) for _ in range(picker.randint(8, 30))) for _ in range(300))
    (folder / "train.txt").write_text("\n".join(lines) + "\n")
    return original, port


def timed(command: list[str], folder: Path) -> float:
    """Wall seconds of one verify command run as a user runs it, in `folder`; it must succeed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "verify", *command], cwd=folder, env=env, capture_output=True,
                          text=True, check=False)
    wall = time.perf_counter() - started
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    return wall


def one_round(folder: Path, steps: int, script_args: list[str]) -> tuple[float, float, float]:
    """(pair, original alone, port alone) wall seconds."""
    original, port = write_project(folder)
    common = ["--steps", str(steps), "-q"]
    pair = timed([original.name, port.name, *common, "-o", "pair", "--", *script_args], folder)
    ref = timed(["run", original.name, "--device", "emulated-cuda", *common, "-o", "ref", "--", *script_args], folder)
    actual = timed(["run", port.name, "--device", "emulated-npu", *common, "-o", "actual", "--", *script_args],
                   folder)
    return pair, ref, actual


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--fp16", action="store_true", help="the Trainer's own fp16 (--fp16) on both sides")
    options = parser.parse_args()
    script_args = ["--fp16"] if options.fp16 else []
    rounds = []
    for number in range(options.rounds):
        with tempfile.TemporaryDirectory() as folder:
            rounds.append(one_round(Path(folder), options.steps, script_args))
        pair, ref, actual = rounds[-1]
        print(f"round {number + 1}: pair {pair:.1f} s, original alone {ref:.1f} s, port alone {actual:.1f} s",
              flush=True)
    pair, ref, actual = (statistics.median(walls) for walls in zip(*rounds))
    slowest = max(ref, actual)
    print(f"Trainer pair, {options.steps} steps{' fp16' if options.fp16 else ''}, on {os.cpu_count()} cores, medians "
          f"of {options.rounds}: pair {pair:.1f} s against its slowest side alone {slowest:.1f} s: "
          f"{pair / slowest:.2f}x")


if __name__ == "__main__":
    main()
