"""Every sample's faithful port passes `verify` on its verify.toml, with the reference never crashed by verify.

The reference runs on EMULATED CUDA and the port on the emulated NPU, both on the CPU: this proves verify runs both
sides as they are (the reference under the port's autocast only where the port computes under it, the loss-scaler
twin following the port's GradScaler), not that a GPU and an NPU agree (tests/test_gpu_fixtures.py reads real GPU
runs for that).
"""

import json
import shutil

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from migrate import Mode
from samples_support import SCRIPT, all_samples, port
from verify.cli import app
from verify.cli.pair import route
from verify.record.run_folders import REF_UNDER_AUTOCAST

pytestmark = pytest.mark.slow
# The samples whose port rightly does not train as the original does, with the start of the verdict that says why.
# ddp_file_shards' original reads its shard files in glob order (the filesystem's); the port sorts them (DATA rule),
# so the two read different batches: the reference is not a usable one until it sorts too (checklist C1/C6).
# Samples whose losses show the emulators' modelled device noise within their verify.toml's steps.
LOSSES_DIFFER = {"mnist_cnn", "gpt_lm", "imagenet_classifier", "dcgan"}


@pytest.mark.parametrize("sample", [pytest.param(sample, id=sample.name) for sample in all_samples()])
def test_the_faithful_port_of_each_sample_passes(sample, tmp_path):
    config = sample.verify_config()
    original = tmp_path / SCRIPT
    shutil.copy(sample.script, original)
    ported = original.with_name("train_gpu_npu.py")
    ported.write_text(port(sample.script.read_text(), Mode.TRANSFER))
    out = tmp_path / "out"
    argv = [str(original), str(ported), "-n", str(config["steps"]), "--seed", str(config["seed"]), "-q",
            "--loss-rtol", str(config["tolerances"]["loss_rtol"]), "-o", str(out), "--", *config["args"]]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    summary = json.loads((out / "summary.json").read_text())
    assert (result.exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    # the emulated devices sum in orders of their own, as a GPU and an NPU do: a faithful port is not bit-exact
    assert pd.read_parquet(out / "ops.parquet")["stats_error"].max() > 0.0
    if sample.name in LOSSES_DIFFER:  # (others round their losses alike: an fp32 loss of fp16 logits)
        assert summary["loss"]["max_rel_diff"] > 0.0, summary["loss"]
    for side in ("ref", "actual"):
        manifest = json.loads((out / side / "manifest.json").read_text())
        assert manifest["status"] == "ok", f"{side}: {manifest['message']}"
    assert not (out / REF_UNDER_AUTOCAST).exists(), "the reference crashed under the port's autocast"
    assert summary["pair"]["mode"] in ("same-amp-imposed", "as-written"), summary["pair"]["description"]


MNIST_BREAKAGES = {  # one deliberate bug in the faithful port -> the start of the verdict that must name it
    "gelu": (("nn.ReLU()", "nn.GELU()"), "FAIL: the port computes aten.gelu where the original computes aten.relu"),
    "lr": (('default=1.0, metavar="LR"', 'default=0.5, metavar="LR"'), "FAIL: hyperparameter differs: lr 1.0 vs 0.5"),
    "zero_grad": (("        optimizer.zero_grad()\n", ""), "FAIL: the actual side does not reset gradients"),
}


@pytest.fixture(scope="module")
def mnist_reference(tmp_path_factory):
    """samples/mnist_cnn's faithful pair on the emulators' modelled device noise, run once: its reference is shared."""
    sample = next(sample for sample in all_samples() if sample.name == "mnist_cnn")
    folder = tmp_path_factory.mktemp("mnist")
    original = folder / SCRIPT
    shutil.copy(sample.script, original)
    ported = port(sample.script.read_text(), Mode.TRANSFER)
    config = sample.verify_config()
    argv = [str(original), str(original.with_name("faithful_npu.py")), "-n", str(config["steps"]), "-q"]
    original.with_name("faithful_npu.py").write_text(ported)
    result = CliRunner().invoke(app, route([*argv, "-o", str(folder / "out"), "--", *config["args"]],
                                           typer.main.get_command(app)))
    assert result.exit_code == 0, result.output
    return original, ported, config, folder / "out" / "ref"


@pytest.mark.parametrize("bug", list(MNIST_BREAKAGES))
def test_a_broken_mnist_port_fails_naming_its_cause_through_the_device_noise(mnist_reference, bug, tmp_path):
    original, ported, config, reference = mnist_reference
    (old, new), reason = MNIST_BREAKAGES[bug]
    assert ported.count(old) >= 1, old
    broken = tmp_path / "broken_npu.py"
    broken.write_text(ported.replace(old, new, 1))
    out = tmp_path / "out"
    argv = [str(original), str(broken), "-n", str(config["steps"]), "-q", "--ref-run", str(reference), "-o", str(out),
            "--", *config["args"]]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    summary = json.loads((out / "summary.json").read_text())
    assert result.exit_code == 1 and summary["reason"].startswith(reason), summary["reason"]
