"""DeepSpeed (issue 55): a ZeRO script launched as the `deepspeed` launcher launches it (--launcher deepspeed adds
--local_rank=K to each rank's arguments) runs on EMULATED CUDA and on the emulated NPU as on their real hosts
(npu_port_emulation/deepspeed_runtime.py: its CUDA-built FusedAdam, CANN's ASCEND_HOME_PATH); DeepSpeed's own loss
scaler is followed as a GradScaler is (verify/frameworks/deepspeed.py): its loss recorded unscaled, its skipped
updates the warm-up's settling steps; and a port whose config trains otherwise fails naming the cause."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_sharded import SCRIPTS, verify

from verify.record.store import read_run

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
pytestmark = pytest.mark.slow
RANKS = ["--launcher", "deepspeed", "--nproc-per-node", "2", "--steps", "2", "-q"]


def config(stage: int, fp16: bool, lr: float = 1e-3, **more: object) -> dict:
    """ds_config.json: 2 ranks of 8 samples, DeepSpeed's own Adam (its FusedAdam), ZeRO's `stage`; fp16 with the
    dynamic loss scaler from 2**24, which overflows for its first steps."""
    return {"train_batch_size": 16, "optimizer": {"type": "Adam", "params": {"lr": lr}},
            "fp16": {"enabled": fp16, "initial_scale_power": 24}, "zero_optimization": {"stage": stage}, **more}


def sides(tmp_path: Path, ref_config: dict, port_config: dict) -> tuple[Path, Path]:
    """The script and its port, each in a folder of its own beside its ds_config.json."""
    scripts = []
    for name, script, settings in (("ref", "deepspeed_train.py", ref_config),
                                   ("port", "deepspeed_train_npu.py", port_config)):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(SCRIPTS / script, folder / script)
        (folder / "ds_config.json").write_text(json.dumps(settings))
        scripts.append(folder / script)
    return scripts[0], scripts[1]


@pytest.fixture(scope="module")
def zero2_fp16_pair(tmp_path_factory) -> tuple[int, str, dict, Path]:
    tmp_path = tmp_path_factory.mktemp("zero2")
    out = tmp_path / "pair"
    return (*verify(*sides(tmp_path, config(2, True), config(2, True)), *RANKS, "-o", out), out)


def test_a_zero2_fp16_port_passes_through_its_loss_scalers_warm_up(zero2_fp16_pair):
    code, output, summary, out = zero2_fp16_pair
    assert code == 0, output
    assert [reason[:4] for reason in summary["ranks"]["verdicts"]] == ["PASS", "PASS"]
    port, ref = read_run(out / "actual").ranks[0], read_run(out / "ref").ranks[0]
    # the scaled loss (fp16 inf at 2**24) is recorded unscaled; each skipped update ran one step more
    assert port.manifest.loss_scaler["init_scale"] == 2.0**24 and port.manifest.skipped_steps[:2] == [0, 1]
    assert port.manifest.steps_completed == 2 + len(port.manifest.skipped_steps)
    assert port.losses["loss"].between(0.5, 3).all()
    assert any("ASCEND_HOME_PATH" in call for call in port.manifest.extra["emulated_calls"])
    assert any("FusedAdam" in call for call in ref.manifest.extra["emulated_calls"])
    assert "torch_compile" not in port.manifest.extra  # DeepSpeed's Muon kernels, compiled as it is imported


@pytest.mark.parametrize("port_config, cause", [
    ({"train_batch_size": None, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2},
     "hyperparameter differs: gradient accumulation 1 vs 2 backward() calls per optimizer step"),
    ({"fp16": {"enabled": True, "initial_scale_power": 16}},
     "hyperparameter differs: initial loss scale 16777216.0 vs 65536.0"),
], ids=["gradient_accumulation_steps", "initial_scale_power"])
def test_a_port_whose_config_changes_how_it_trains_fails_naming_the_setting(zero2_fp16_pair, tmp_path, port_config,
                                                                           cause):
    settings = {key: value for key, value in (config(2, True) | port_config).items() if value is not None}
    ref, port = sides(tmp_path, config(2, True), settings)
    code, output, summary = verify(ref, port, *RANKS, "--ref-run", zero2_fp16_pair[3] / "ref", "-o", tmp_path / "o")
    assert code == 1, output
    assert cause in summary["reason"].splitlines()[0], summary["reason"]


def test_a_zero3_fp32_port_with_another_lr_in_its_config_fails_naming_lr(tmp_path):
    code, output, summary = verify(*sides(tmp_path, config(3, False), config(3, False, lr=2e-3)), *RANKS,
                                   "-o", tmp_path / "o")
    assert code == 1, output
    assert "hyperparameter differs: lr 0.001 vs 0.002" in summary["reason"].splitlines()[0], summary["reason"]


def test_a_script_that_needs_the_deepspeed_launcher_says_so_when_run_as_torchrun_runs_it(tmp_path):
    code, output, _ = verify(*sides(tmp_path, config(2, False), config(2, False)), *RANKS[2:], "-o", tmp_path / "o")
    assert code == 2
    assert "required: --local_rank; the deepspeed launcher passes --local_rank: verify --launcher deepspeed" in output
