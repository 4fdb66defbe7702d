"""Megatron-core (issue 55): a tiny GPT with tensor parallel 2 on 2 ranks, written for GPUs as megatron-core's own
example is, runs on EMULATED CUDA and the emulated NPU as on their devices (its CUDA RNG tracker reads and sets the
device generator through torch.cuda.random and default_generators), passes rank by rank as migrate ports it, and a
port with another lr fails naming lr."""

from __future__ import annotations

import pytest
from test_sharded import SCRIPTS, verify

pytest.importorskip("megatron.core", reason="megatron-core is not installed")
pytestmark = pytest.mark.slow
ORIGINAL, PORT = SCRIPTS / "megatron_gpt.py", SCRIPTS / "megatron_gpt_npu.py"
RANKS = ["--nproc-per-node", "2", "--steps", "2", "-q"]


def test_a_tensor_parallel_megatron_gpt_passes_rank_by_rank_and_another_lr_fails_naming_it(tmp_path):
    code, output, summary = verify(ORIGINAL, PORT, *RANKS, "-o", tmp_path / "pair")
    assert code == 0, output
    assert [reason[:4] for reason in summary["ranks"]["verdicts"]] == ["PASS", "PASS"]
    assert not any("torch.compile" in note for note in summary["notes"])  # Megatron's, made as it is imported
    port = tmp_path / "megatron_gpt_npu.py"
    port.write_text(PORT.read_text().replace("lr=1e-3", "lr=2e-3"))
    code, output, summary = verify(ORIGINAL, port, *RANKS, "--ref-run", tmp_path / "pair" / "ref",
                                   "-o", tmp_path / "lr")
    assert code == 1, output
    assert "hyperparameter differs: lr 0.001 vs 0.002" in summary["reason"].splitlines()[0], summary["reason"]
