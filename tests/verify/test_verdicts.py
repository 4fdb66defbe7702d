"""The verdicts of `verify ORIGINAL [PORTED]` and `verify determinism` on real runs (child processes, CPU, the
EMULATED NPU): a faithful port passes; ports broken one way at a time fail with the right diagnosis.

Runs are the expensive part (a child imports torch): the broken ports of verdict_mlp.py share one reference run
(--ref-run), and every run makes 3 steps of a tiny model.
"""

import json
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import typer
from hung_runs import timed_out, timed_out_before_printing, timed_out_in_the_hang
from typer.testing import CliRunner

from migrate import Settings, migrate_source
from verify.compare import tolerances
from verify.errors import EXIT_ERROR
from verify.cli import app
from verify.cli.pair import route
from verify.contract.files import AMP_EFFECT, DETERMINISM_JSON
from verify.record.store import read_run
from verify.launch.runner import RunOptions, run_script
from verify.pair.plan import follows_its_port, runs_with_its_reference

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SAMPLES = Path(__file__).resolve().parents[2] / "samples"
SAMPLE = SAMPLES / "grad_accum_clip"
ORIGINAL, PORT = SCRIPTS / "verdict_mlp.py", SCRIPTS / "verdict_mlp_npu.py"
STEPS = 3
# migrate's fp16 port of verdict_mlp: its GradScaler skips steps 0 to 5 while the scale backs off to where the
# sum-reduced gradients fit, and applies from step 6: a run goes on while its scale settles
SCALER_SETTLES = list(range(6))
ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # the autouse fixture is per test; the shared reference runs before any


def verify(*args: str | Path, exits: tuple[int, ...] = (0, 1)) -> tuple[int, dict, Path]:
    """`verify ...` in-process, ending with one of `exits` (by default a verdict); the exit code, summary.json and the
    output folder (the -o among args)."""
    argv = [str(arg) for arg in args]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    out = Path(argv[argv.index("-o") + 1])
    summary_file = out / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    assert result.exit_code in exits, result.output
    return result.exit_code, summary, out


def codes(summary: dict) -> list[str]:
    return [finding["code"] for finding in summary["findings"]]


def finding(summary: dict, code: str) -> dict:
    return next(item for item in summary["findings"] if item["code"] == code)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """verdict_mlp.py on the CPU, once for all the fp32 broken ports."""
    run_dir = tmp_path_factory.mktemp("reference") / "ref"
    run_script(ORIGINAL, [], RunOptions(steps=STEPS, device="cpu", extra_env=ONE_THREAD), run_dir)
    return run_dir


def broken_port(tmp_path: Path, old: str, new: str) -> Path:
    """verdict_mlp_npu.py with one deliberate bug."""
    code = PORT.read_text()
    assert code.count(old) == 1, old
    path = tmp_path / "broken_npu.py"
    path.write_text(code.replace(old, new))
    return path


def against_reference(tmp_path: Path, reference: Path, old: str, new: str) -> tuple[int, dict, Path]:
    return verify(ORIGINAL, broken_port(tmp_path, old, new), "-n", STEPS, "--ref-run", reference, "-q",
                  "-o", tmp_path / "out")


def test_faithful_port_of_a_sample_passes_and_reports_the_amp_effect(tmp_path):
    """migrate's port gains fp16 autocast and a GradScaler: the reference runs under the same autocast, so the
    comparison isolates the port; --amp-effect adds fp32 against AMP with its wider tolerance."""
    config = tomllib.loads((SAMPLE / "verify.toml").read_text())
    code = (SAMPLE / "train_gpu.py").read_text()
    (tmp_path / "train.py").write_text(code)
    (tmp_path / "train_npu.py").write_text(migrate_source(code, "train.py", Settings(is_entry=True)).code)
    exit_code, summary, out = verify(tmp_path / "train.py", "-n", STEPS, "--seed", config["seed"], "--amp-effect",
                                     "-q", "-o", tmp_path / "out", "--", *config["args"])
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    assert summary["actual"]["emulated"] and "EMULATED NPU" in summary["actual"]["title"]
    assert summary["pair"]["mode"] == "same-amp-imposed" and summary["pair"]["ref_autocast"] == "fp16"
    assert "loss scaled by 65536" in summary["pair"]["description"]  # as the port's GradScaler
    assert summary["comparison"].startswith("same-AMP policy")
    assert summary["loss"]["steps_compared"] == STEPS
    effect = summary["pair"]["amp_effect"]
    assert effect["loss_rtol"] == tolerances.AMP_VS_FP32_LOSS_RTOL and effect["comparison"].startswith("fp32-vs-AMP")
    assert (out / AMP_EFFECT / "summary.json").is_file() and (out / "ref-fp32" / "manifest.json").is_file()
    assert "imposed from outside" in (out / "report.html").read_text()


@pytest.mark.parametrize("exact", [False, True], ids=["modelled", "exact"])
def test_a_faithful_pair_on_the_emulators_differs_as_devices_do_and_passes(tmp_path, exact):
    """EMULATED CUDA against the emulated NPU: each sums in its own order (device_numerics.py), so a faithful port's
    matmuls differ, within tolerance (tests/test_samples_verified.py shows the losses differing on the samples);
    --exact-emulation makes the two agree bit for bit."""
    options = ["--exact-emulation"] if exact else []
    exit_code, summary, out = verify(ORIGINAL, PORT, "-n", STEPS, *options, "-q", "-o", tmp_path / "out")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    ops = pd.read_parquet(out / "ops.parquet")
    matmuls = ops.loc[ops["ref_op"].isin(["aten.addmm", "aten.mm"]), "stats_error"]
    assert (matmuls.max() == 0.0) == exact and (ops["stats_error"].max() == 0.0) == exact
    if exact:
        assert summary["loss"]["max_rel_diff"] == 0.0
    manifest = json.loads((out / "actual" / "manifest.json").read_text())
    assert manifest["exact_emulation"] == exact and bool(manifest["modelled_numerics"]) != exact
    assert any("own summation order" in note for note in summary["notes"]) != exact, summary["notes"]


@pytest.mark.parametrize("aligned", [True, False], ids=["keyed", "own-generators"])
def test_noise_drawn_on_the_device_is_keyed_whatever_else_a_side_draws(tmp_path, aligned):
    """The port draws one more random tensor on its device before training. With the keyed stream both sides still
    add the same noise in every step; with --no-align-random each emulated device draws from its own generator, as
    a GPU and an NPU do, and the losses part."""
    original = SCRIPTS / "noise_injection.py"
    port = tmp_path / "noise_injection_npu.py"
    code = original.read_text().replace('"cuda" if torch.cuda.is_available()', '"npu" if torch.npu.is_available()')
    port.write_text("import torch_npu\n" + code.replace("for step in range", "torch.rand(5, device=device)\nfor step in range"))
    options = [] if aligned else ["--no-align-random"]
    exit_code, summary, _ = verify(original, port, "-n", 4, *options, "-q", "-o", tmp_path / "out")
    if aligned:
        assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    else:
        assert exit_code == 1 and summary["loss"]["max_rel_diff"] > 0.01, summary["loss"]


@pytest.mark.parametrize("aligned", [True, False], ids=["keyed", "own-generators"])
def test_every_random_draw_is_aligned_the_lstms_dropout_included(tmp_path, aligned):
    """random_draws.py draws with torch.randn_like, Tensor.bernoulli_, Tensor.normal_, torch.multinomial and an
    nn.LSTM's dropout between its layers in every step. With the keyed stream its faithful port passes, each draw equal
    on both sides and none left to a device's generator; with --no-align-random each emulated device draws its
    dropout from its own generator, and the pair fails."""
    options = [] if aligned else ["--no-align-random"]
    exit_code, summary, out = verify(SCRIPTS / "random_draws.py", SCRIPTS / "random_draws_npu.py", "-n", STEPS,
                                     *options, "-q", "-o", tmp_path / "out")
    ops = pd.read_parquet(out / "ops.parquet")
    drawn = ops.loc[ops["ref_op"].isin(["aten.randn_like", "aten.bernoulli_", "aten.normal_", "aten.multinomial"])
                    & (ops["step"] == 0)]
    lstm_dropout = drawn["module"].str.endswith(".rnn") & (drawn["ref_op"] == "aten.bernoulli_")
    assert lstm_dropout.sum() == 1  # computed inside aten::lstm on the CPU, between its two layers
    if not aligned:
        assert exit_code == 1 and not drawn.loc[lstm_dropout, "passed"].all()
        return
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    assert len(drawn) == 6 and (drawn["stats_error"] == 0.0).all() and drawn["md5_equal"].all()
    for side in ("ref", "actual"):
        manifest = json.loads((out / side / "manifest.json").read_text())
        assert manifest["random_keyed_by_tag"] and manifest["random_not_aligned"] == []
    assert not any("left to each device's own generator" in note for note in summary["notes"]), summary["notes"]


def _line_of(script: Path, text: str) -> int:
    """The line of `script` where `text` is: where an op is made (a port's edits here keep its lines)."""
    return next(number for number, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def test_a_gans_changed_generator_is_a_changed_op_not_different_data(tmp_path):
    """gan.py's port with the generator's ReLU made a GELU: the discriminator's batch differs at step 0, but the
    generator computed it (its recorded producers), so the gelu is named, never "the sides read different data"."""
    code = (SCRIPTS / "gan.py").read_text()
    assert code.count("nn.Linear(2, 8), nn.ReLU()") == 1
    port = tmp_path / "gan_npu.py"
    port.write_text(code.replace("nn.Linear(2, 8), nn.ReLU()", "nn.Linear(2, 8), nn.GELU()"))
    exit_code, summary, _ = verify(SCRIPTS / "gan.py", port, "-n", STEPS, "-q", "-o", tmp_path / "out")
    assert exit_code == 1 and "data_order" not in codes(summary), summary["reason"]
    line = _line_of(SCRIPTS / "gan.py", "fake = generator(noise)")  # the generator's ops are made by its call
    assert summary["reason"].startswith(
        f"FAIL: the port computes aten.gelu where the original computes aten.relu at gan_npu.py:{line} (original "
        f"gan.py:{line}), in Sequential.1 forward, step 0")
    first = summary["first_divergent"]
    assert (first["op"], first["actual_op"], first["step"]) == ("aten.relu", "aten.gelu", 0)


def test_an_unshuffled_batch_is_other_data_where_the_calibration_rounds_the_data_pipeline(tmp_path):
    """--no-match-amp: the calibration rounds every result in fp16, the worker's normalisation too, so the batch's
    envelope is 0.00016; ten times it let the unshuffled port's first batch (0.0005 off) pass as noise, and no
    data_order was named (pytorch/examples mnist, `'shuffle': False` in its kwargs). A batch read is data."""
    code = (SCRIPTS / "near_batches.py").read_text()
    port = tmp_path / "near_batches_npu.py"
    port.write_text(code.replace("import torch\n", "import torch\nimport torch_npu\n", 1)
                    .replace('"cuda" if torch.cuda', '"npu" if torch.npu').replace("shuffle=True", "shuffle=False")
                    .replace("    loss = F.mse_loss(model(x), y)\n",
                             "    with torch.autocast(device, dtype=torch.float16):\n"
                             "        loss = F.mse_loss(model(x), y)\n"))
    exit_code, summary, _ = verify(SCRIPTS / "near_batches.py", port, "--no-match-amp", "-n", STEPS, "-q", "-o",
                                   tmp_path / "out")
    assert exit_code == 1 and summary["reason"].startswith("FAIL: the sides read different data"), summary["reason"]
    assert finding(summary, "data_order")["detail"]["source"] == "inputs"


def test_a_discriminators_batch_copied_from_its_generator_is_judged_as_computed(tmp_path):
    """The discriminator's batch made by the generator, detached and copied (aten.clone, a carrier between), is the
    generator's output, judged with its op's tolerance; the batch read (`real`) with the data's (batch_rtol)."""
    original = tmp_path / "gan.py"
    original.write_text((SCRIPTS / "gan.py").read_text().replace("fake.detach()", "fake.detach().clone()"))
    port = tmp_path / "gan_npu.py"
    port.write_text(original.read_text())
    exit_code, summary, out = verify(original, port, "-n", STEPS, "-q", "-o", tmp_path / "out")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    ops = pd.read_parquet(out / "ops.parquet")
    batches = ops.loc[(ops["ref_op"] == "input") & (ops["step"] == 0) & (ops["ref_shape"] == "16x4")]
    assert sorted(batches["tolerance"] >= tolerances.OP_TOLERANCES["float32"].stats_rtol) == [False, True]


def test_a_changed_learning_rate_is_named_a_hyperparameter_difference(tmp_path, reference):
    exit_code, summary, out = against_reference(tmp_path, reference, "default=1e-4", "default=2e-4")
    assert exit_code == 1
    assert summary["hparam_differences"] == ["lr 0.0001 vs 0.0002 in group 0"]
    assert codes(summary)[0] == "hparam_mismatch" and summary["reason"].startswith("FAIL: hyperparameter differs: lr")
    assert "[checklist C9]" in (out / "advice.txt").read_text()
    # the first update with the other lr is where the ops start to differ: a consequence, not an accuracy issue
    first = summary["first_divergent"]
    assert (first["step"], first["phase"]) == (0, "optimizer")
    assert not any("diverges although its inputs agree" in text for text in summary["advice"])
    assert sum("because lr differs" in text for text in summary["advice"]) == 1


def test_a_swapped_activation_is_named_first_as_a_changed_op(tmp_path, reference):
    exit_code, summary, out = against_reference(tmp_path, reference, "nn.ReLU()", "nn.GELU()")
    assert exit_code == 1
    forward = "return self.out(self.act(self.hidden(x)))"
    assert summary["reason"].startswith(
        "FAIL: the port computes aten.gelu where the original computes aten.relu at "
        f"broken_npu.py:{_line_of(PORT, forward)} (original verdict_mlp.py:{_line_of(ORIGINAL, forward)}), in "
        "Net.act forward, step 0")
    first = summary["first_divergent"]
    assert (first["op"], first["actual_op"], first["module"], first["phase"], first["step"]) == (
        "aten.relu", "aten.gelu", "Net.act", "forward", 0)
    assert any("aten.gelu where the original computes aten.relu" in text for text in summary["advice"])


CONFIGURED_MLP = """import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class TanhGELU(nn.Module):  # GPT-2's gelu_new: eight ops, none of them aten.gelu
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS = {"gelu_new": TanhGELU, "relu": nn.ReLU}
CONFIG = {"hidden": 32, "activation": "gelu_new"}


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc = nn.Linear(16, config["hidden"])
        self.act = ACTIVATIONS[config["activation"]]()
        self.proj = nn.Linear(config["hidden"], 16)

    def forward(self, x):
        return x + self.proj(self.act(self.fc(x)))


torch.manual_seed(0)
model = nn.Sequential(Block(CONFIG), nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(10):
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    optimizer.zero_grad()
    F.mse_loss(model(x), y).backward()
    optimizer.step()
"""


def test_an_activation_changed_through_a_config_is_named_though_no_record_pairs_with_it(tmp_path):
    """Regression (issue 44): the port's config picks relu where the original's computes a tanh GELU of eight ops
    (GPT-2's). No call of either pairs, so the addmm after them is the first to differ, "the ops that produced its
    inputs agree": the relu only the port computes, in that addmm's data flow, is named first."""
    original, port = tmp_path / "train.py", tmp_path / "train_npu.py"
    original.write_text(CONFIGURED_MLP)
    port.write_text(CONFIGURED_MLP.replace('"activation": "gelu_new"', '"activation": "relu"'))
    exit_code, summary, _ = verify(original, port, "-n", 2, "-q", "-o", tmp_path / "out")
    line = _line_of(port, "return x + self.proj(self.act(self.fc(x)))")
    assert exit_code == 1
    assert summary["reason"].startswith(
        f"FAIL: the port computes aten.relu (Sequential.0.act forward, train_npu.py:{line}) where the original "
        "computes aten.mul, aten.pow, aten.add, aten.tanh (8 calls, Sequential.0.act forward, train.py:"), summary["reason"]
    assert "before the first divergent operator aten.addmm (Sequential.0.proj forward, step 0" in summary["reason"]
    assert summary["first_divergent"]["op"] == "aten.addmm"


def _migrated(original: Path, folder: Path) -> Path:
    """`migrate ORIGINAL`'s port of a test script, in `folder`."""
    port = folder / f"{original.stem}_npu.py"
    port.write_text(migrate_source(original.read_text(), original.name, Settings(is_entry=True)).code)
    return port


def test_layers_called_through_forward_under_the_ports_autocast_and_grad_scaler_pass(tmp_path):
    """Regression: pytorch/examples' mnist_forward_forward calls its layers through .forward(), never as modules, each
    with its own optimizer. Its fp16 port was read as fp32 (no module's forward computed in half precision), so the
    reference ran without the port's autocast and loss scale, and every backward op computed from forward values
    alone (log1p's 1 + x) differed by the scale, 65536; under the same autocast, the loss-scaler twin unscaled no
    gradient (it knew the parameters of outermost modules only) and Adam's steps differed by its epsilon."""
    port = _migrated(SCRIPTS / "layers_by_forward.py", tmp_path)
    assert "torch.autocast(" in port.read_text() and "scaler.step(self.opt)" in port.read_text()
    exit_code, summary, _ = verify(SCRIPTS / "layers_by_forward.py", port, "-q", "-o", tmp_path / "out")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    assert summary["comparison"].startswith("same-AMP policy (float16"), summary["comparison"]


def test_a_changed_layer_setting_is_named_though_its_numbers_stay_within_the_noise(tmp_path):
    """GELU's tanh approximation moves its outputs less than the devices' noise here (nanoGPT's MLP ported with
    approximate="tanh" passed on its numbers): the op's recorded settings name it."""
    original, port = tmp_path / "gelu.py", tmp_path / "gelu_npu.py"
    original.write_text(ORIGINAL.read_text().replace("nn.ReLU()", "nn.GELU()"))
    port.write_text(PORT.read_text().replace("nn.ReLU()", 'nn.GELU(approximate="tanh")'))
    exit_code, summary, _ = verify(original, port, "-n", 2, "-q", "-o", tmp_path / "out")
    assert exit_code == 1
    assert summary["reason"].startswith("FAIL: the port computes aten.gelu(approximate='tanh') where the original "
                                        "computes aten.gelu() at gelu_npu.py:"), summary["reason"]
    changed = finding(summary, "op_changed")["detail"]
    assert (changed["attrs"], changed["actual_attrs"], changed["module"]) == ("", "approximate='tanh'", "Net.act")


def test_a_changed_setting_of_a_loss_the_script_computes_outside_any_module_is_named(tmp_path):
    """Regression: only a module's forward calls had their settings recorded, so a smooth L1 loss computed at top
    level with another beta was "an operator accuracy issue" of aten.smooth_l1_loss, whose inputs agree, with the
    advice to run it in fp32; the setting names the change."""
    loss = 'F.mse_loss(model(x), y, reduction="sum")'
    original, port = tmp_path / "huber.py", tmp_path / "huber_npu.py"
    original.write_text(ORIGINAL.read_text().replace(loss, "F.smooth_l1_loss(model(x), y, beta=1.0)"))
    port.write_text(PORT.read_text().replace(loss, "F.smooth_l1_loss(model(x), y, beta=2.0)"))
    exit_code, summary, _ = verify(original, port, "-n", 2, "-q", "-o", tmp_path / "out")
    lines = (_line_of(port, "loss = F.smooth_l1_loss("), _line_of(original, "loss = F.smooth_l1_loss("))
    assert exit_code == 1
    assert summary["reason"] == (
        "FAIL: the port computes aten.smooth_l1_loss(beta=2) where the original computes aten.smooth_l1_loss() at "
        "huber_npu.py:{} (original huber.py:{}), in the top level, step 0: a changed operator".format(*lines))
    assert finding(summary, "op_changed")["detail"]["phase"] == "other"


def test_a_port_whose_loss_scaler_is_made_for_cuda_only_fails_naming_its_unscaled_float16(tmp_path):
    """Regression (timm's train.py): its GradScaler is made where `device.type in ('cuda',)`, so its NPU port trained
    float16 unscaled and its gradients flushed to 0; the reason was "an operator accuracy issue" of a backward op."""
    original = SCRIPTS / "cuda_only_scaler.py"
    port = tmp_path / "cuda_only_scaler_npu.py"
    port.write_text(original.read_text().replace("import torch\n", "import torch\nimport torch_npu\n", 1)
                    .replace('"cuda" if torch.cuda.is_available()', '"npu" if torch.npu.is_available()'))
    exit_code, summary, out = verify(original, port, "-q", "-o", tmp_path / "out")
    assert exit_code == 1
    assert summary["reason"].startswith(
        "FAIL: the port trains under float16 autocast without a loss scaler where the original scales its loss "
        "(65536 at its first step)"), summary["reason"]
    advice = (out / "advice.txt").read_text()
    assert "add \"npu\" to it" in advice and "operator accuracy issue" not in advice


def test_migrate_gives_the_cuda_only_loss_scaler_the_npu_where_it_defaults_the_device_option_to_npu(tmp_path):
    """Regression (timm's train.py): migrate defaulted `--device` to "npu" (DEV020, the script handles the NPU) but
    left `device.type in ('cuda',)`, so its port made no loss scaler and verify failed it as unscaled float16 (the
    test above). DEV006 now has that test take "npu" too, and leaves the if/elif chain that has an npu arm alone."""
    port = _migrated(SCRIPTS / "cuda_only_scaler.py", tmp_path)
    text = port.read_text()
    assert 'if device.type in ("cuda", "npu") else None' in text and 'if device.type == "cuda":' in text, text
    exit_code, summary, _ = verify(SCRIPTS / "cuda_only_scaler.py", port, "-q", "-o", tmp_path / "out")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]


def test_a_port_runs_at_once_with_its_reference_which_follows_its_precision_as_it_runs(tmp_path):
    """Issue 32's pair time: a port that starts no ranks runs at once with its reference and calibration run. Where
    it gained autocast and a GradScaler (migrate's fp16), the reference follows them as the port writes them
    (verify/capture/followed_port.py) and computes exactly what it computes after the port: an original whose text
    names autocast (here in a string: a comment says nothing) is not followed so, and its reference runs again after
    the port. A comment that reads "Process" does not make the port start ranks."""
    assert runs_with_its_reference(PORT, RunOptions(), None)
    assert not runs_with_its_reference(SCRIPTS / "ddp_spawn.py", RunOptions(), None)
    assert not runs_with_its_reference(PORT, RunOptions(nproc_per_node=2), None)
    port = _migrated(ORIGINAL, tmp_path)
    assert "GradScaler" in port.read_text() and "torch.autocast(" in port.read_text()
    exit_code, summary, out = verify(ORIGINAL, port, "-n", STEPS, "-q", "-o", tmp_path / "live")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    manifests = {side: json.loads((out / side / "manifest.json").read_text()) for side in ("ref", "actual")}
    ref = manifests["ref"]
    assert (ref["follows"], ref["autocast"], ref["loss_scaler"]["twin"]) == (str((out / "actual").resolve()), "fp16",
                                                                             "scale")
    # the reference started while the port ran (the port's start plus its steps' times leaves out its set-up before
    # the first step, which the reference waits for: an estimate that failed once that set-up took a second more)
    assert pd.Timestamp(ref["started_at"]) < pd.Timestamp(manifests["actual"]["finished_at"])
    (tmp_path / "after").mkdir()
    original = tmp_path / "after" / ORIGINAL.name
    original.write_text(ORIGINAL.read_text() + "# trains in fp32: no torch.autocast\n")
    assert follows_its_port(ORIGINAL, "auto", True, True) and follows_its_port(original, "auto", True, True)
    original.write_text(ORIGINAL.read_text() + 'PRECISION = "fp32, no torch.autocast"\n')
    assert not follows_its_port(original, "auto", True, True)
    commented = tmp_path / "commented_npu.py"
    commented.write_text("# Process features\n" + PORT.read_text())
    assert runs_with_its_reference(commented, RunOptions(), None)
    exit_code, after_summary, after = verify(original, port, "-n", STEPS, "-q", "-o",
                                             tmp_path / "after" / "out")
    assert json.loads((after / "ref" / "manifest.json").read_text())["follows"] == ""
    assert (exit_code, after_summary["reason"]) == (0, summary["reason"])
    for side in ("ref", "calibration"):
        live, late = read_run(out / side), read_run(after / side)
        pd.testing.assert_frame_equal(live.losses.drop(columns="wall_ms"), late.losses.drop(columns="wall_ms"))
        numbers = live.ops.select_dtypes("number").columns
        pd.testing.assert_frame_equal(live.ops[numbers], late.ops[numbers])


def test_a_port_whose_autocast_hides_in_a_module_is_followed_after_all(tmp_path):
    """A port whose text shows no autocast runs at once with its reference; where it computed in half precision after
    all (in a module it imports), the reference runs again after it, under its autocast and loss scales."""
    (tmp_path / "amp_layers.py").write_text(
        "import torch\n\n\ndef half_forward(layer, x):\n"
        "    with torch.autocast(device_type='npu', dtype=torch.float16):\n        return layer(x)\n")
    port = tmp_path / "verdict_mlp_npu.py"
    imported = "import torch_npu\nfrom amp_layers import half_forward\n"
    port.write_text(PORT.read_text().replace("import torch_npu\n", imported, 1)
                    .replace("F.mse_loss(model(x), y", "F.mse_loss(half_forward(model, x).float(), y"))
    assert "half_forward(model, x)" in port.read_text() and runs_with_its_reference(port, RunOptions(), None)
    exit_code, summary, _ = verify(ORIGINAL, port, "-n", 2, "-q", "-o", tmp_path / "out")
    assert summary["comparison"].startswith("same-AMP policy (float16"), summary["comparison"]
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]


def test_fp16_without_loss_scaling_overflows_and_is_told_to_scale(tmp_path):
    """A port that trains in pure fp16 (no autocast, no GradScaler): its sum-reduced loss overflows. The reference
    runs under fp16 autocast, which keeps the loss in fp32, so the overflow is the port's alone."""
    port = broken_port(tmp_path, "dtype = torch.float32", "dtype = torch.float16")
    exit_code, summary, out = verify(ORIGINAL, port, "-n", STEPS, "-q", "-o", tmp_path / "out")
    assert exit_code == 1
    assert summary["pair"]["mode"] == "same-amp-imposed" and "loss scaled" not in summary["pair"]["description"]
    overflow = finding(summary, "overflow")["detail"]
    assert (overflow["side"], overflow["op"], overflow["dtype"]) == ("actual", "aten.mse_loss", "float16")
    assert "hparam_mismatch" not in codes(summary) and "low_match" not in codes(summary)
    advice = (out / "advice.txt").read_text()
    assert "GradScaler" in advice and "C4" in advice


_SCALED_FROM_THE_START = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 8).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cuda")
for step in range({steps}):
    x = torch.randn(16, 8).cuda()
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).mean() * 1000  # gradients of ~8: at a scale of 2**16 and its halvings they overflow fp16
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""


def _scaled_from_the_start(tmp_path: Path, steps: int) -> tuple[int, dict, Path]:
    """The original with its own GradScaler, its loop of `steps` steps, and its faithful port, verified for 3 steps."""
    original = tmp_path / "train.py"
    original.write_text(_SCALED_FROM_THE_START.format(steps=steps))
    port = tmp_path / "train_npu.py"
    port.write_text(migrate_source(original.read_text(), "train.py", Settings(is_entry=True)).code)
    return verify(original, port, "-n", 3, "-q", "-o", tmp_path / "out")


def test_both_sides_own_grad_scalers_warming_up_run_on_until_their_updates_are_compared(tmp_path):
    """Regression (issue 52): each side's own GradScaler skips its first updates while its scale halves, and the 3
    steps asked for ended inside that warm-up: a PASS was printed on no compared update. The runs go on while the
    scale settles and compare 3 applied updates."""
    exit_code, summary, out = _scaled_from_the_start(tmp_path, steps=20)
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    skipped = summary["overflow"]["actual_scale"]["skipped"]
    assert skipped == summary["overflow"]["ref_scale"]["skipped"] == list(range(len(skipped))) and skipped
    manifest = json.loads((out / "actual" / "manifest.json").read_text())
    assert manifest["steps_completed"] == 3 + len(skipped)
    assert any(note.startswith(f"ran {len(skipped)} more step(s) while the loss scale settled (65536 → ")
               for note in summary["notes"])


def test_both_sides_own_grad_scalers_skipping_every_update_of_the_script_is_no_pass(tmp_path):
    """The script ends (3 steps) while both sides' GradScalers still back off: no update was compared, which is no
    PASS (issue 52), and no updates_skipped either: nothing the port changed (that is for a port whose original has
    no loss scaler, test_fix.py)."""
    exit_code, summary, _ = _scaled_from_the_start(tmp_path, steps=3)
    assert (exit_code, summary["verdict"]) == (1, "FAIL"), summary["reason"]
    assert summary["overflow"]["actual_scale"]["skipped"] == summary["overflow"]["ref_scale"]["skipped"] == [0, 1, 2]
    assert "no_update_compared" in codes(summary) and "updates_skipped" not in codes(summary)
    assert summary["reason"].startswith("FAIL: no update was compared: each side's own loss scaler skipped the update "
                                        "of each of its 3 steps (loss scale 65536 down to 16384; the script ended "
                                        "while it still fell)")
    assert any("more steps" in advice for advice in summary["advice"])


def test_a_port_loading_in_the_main_process_where_its_original_has_workers_passes(tmp_path):
    """Without workers the dataset's ops run in the main process, with them in a worker: a DataLoader's fetch is
    never recorded, so the two pair every op (before: 'only 35% of operator records could be paired')."""
    code = (SCRIPTS / "dataloader_workers.py").read_text()
    original, port = tmp_path / "train.py", tmp_path / "train_npu.py"
    original.write_text(code)
    port.write_text(code.replace("num_workers=2", "num_workers=0"))
    exit_code, summary, _ = verify(original, port, "-n", 3, "-q", "-o", tmp_path / "out")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    assert "low_match" not in codes(summary)


def test_a_removed_zero_grad_diverges_in_the_gradients_of_the_second_step(tmp_path, reference):
    exit_code, summary, out = against_reference(tmp_path, reference, "        optimizer.zero_grad()\n", "")
    assert exit_code == 1
    assert summary["reason"].startswith("FAIL: the actual side does not reset gradients between steps: from step 1")
    # step 0 is identical; from step 1 the gradients accumulate. The update they make is the state training carries,
    # judged only at the first step (op_verdicts._state_after_the_first_step): the gradients name the cause
    assert summary["first_divergent"] is None or summary["first_divergent"]["step"] >= 1
    assert "at step 1" in finding(summary, "grad_diverges")["message"]
    losses = pd.read_csv(out / "losses.csv")
    assert losses.loc[losses["step"] <= 1, "passed"].all()  # the losses only follow a step later


def test_a_removed_zero_grad_is_named_while_every_step_overflows(tmp_path):
    """Regression (found on a real GPU): migrate's fp16 port of verdict_mlp.py overflows at every step of a short run
    while its GradScaler calibrates, so the gradients it never resets are inf and nan; their norm is nan, and a check
    for a positive norm read them as reset, so the pair PASSed."""
    code = ORIGINAL.read_text()
    (tmp_path / "train.py").write_text(code)
    port = migrate_source(code, "train.py", Settings(is_entry=True)).code
    assert port.count("        optimizer.zero_grad()\n") == 1
    (tmp_path / "train_npu.py").write_text(port.replace("        optimizer.zero_grad()\n", ""))
    exit_code, summary, _ = verify(tmp_path / "train.py", "-n", STEPS, "-q", "-o", tmp_path / "out")
    assert exit_code == 1
    assert summary["reason"].startswith("FAIL: the actual side does not reset gradients between steps: from step 1")


@pytest.mark.parametrize(("dropped", "step"), [("optimizer_d", 1), ("optimizer_g", 2)])
def test_a_gan_missing_one_of_its_two_gradient_resets_is_named(tmp_path, dropped, step):
    """Regression (issue 45): the generator's backward() adds to the discriminator's gradients on both sides every
    iteration, so "the first backward() of a step found gradients" held on a faithful GAN too and named nothing; the
    discriminator's dropped reset was an aten.add_ in its backward. Each optimizer's reads are watched now (the
    generator's optimizer steps second: its first carried update falls in step 2)."""
    code = (SCRIPTS / "gan.py").read_text()
    assert code.count(f"    {dropped}.zero_grad()\n") == 1
    port = tmp_path / "gan_npu.py"
    port.write_text(code.replace(f"    {dropped}.zero_grad()\n", ""))
    exit_code, summary, _ = verify(SCRIPTS / "gan.py", port, "-n", STEPS, "-q", "-o", tmp_path / "out")
    assert exit_code == 1
    assert summary["reason"].startswith(
        f"FAIL: the actual side does not reset gradients between steps: from step {step}, its backward() adds to "
        "gradients its optimizer already applied"), summary["reason"]


LBFGS_SCRIPT = """import math
import torch
import torch.nn as nn

torch.manual_seed(0)
wave = torch.sin(torch.linspace(0, 8 * math.pi, 200)).unsqueeze(-1)
inputs, targets = wave[:-1].unsqueeze(0), wave[1:].unsqueeze(0)
model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.8)
for step in range(10):
    def closure():
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        return loss
    optimizer.step(closure)
"""


@pytest.mark.parametrize("faithful", [True, False], ids=["faithful", "reset-dropped"])
def test_an_lbfgs_closure_missing_its_gradient_reset_is_named_before_its_inf_loss(tmp_path, faithful):
    """Regression (issue 45): LBFGS evaluates its closure many times per step() and reads the gradients of each;
    without the closure's zero_grad() every evaluation adds to the last, the port's loss goes inf, and the verdict
    said "actual run nan". The carried gradients are the cause, named first; a faithful closure PASSes."""
    original, port = tmp_path / "train.py", tmp_path / "train_npu.py"
    original.write_text(LBFGS_SCRIPT)
    port.write_text(LBFGS_SCRIPT if faithful else LBFGS_SCRIPT.replace("        optimizer.zero_grad()\n", ""))
    exit_code, summary, _ = verify(original, port, "-n", STEPS, "-q", "-o", tmp_path / "out")
    if faithful:
        assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
        return
    assert exit_code == 1
    assert summary["reason"].startswith(
        "FAIL: the actual side does not reset gradients between steps: from step 0, its backward() adds to gradients "
        "its optimizer already applied"), summary["reason"]


def test_shuffled_data_order_is_a_data_order_finding(tmp_path, reference):
    exit_code, summary, out = against_reference(tmp_path, reference, "shuffle=False", "shuffle=True")
    assert exit_code == 1
    assert "data_order" in codes(summary)
    # the first op after the batch the model read (a DataLoader's collation is not recorded)
    first = summary["first_divergent"]
    assert (first["step"], first["phase"], first["module"]) == (0, "forward", "Net.hidden")
    assert "[checklist C6, C7]" in (out / "advice.txt").read_text()


@pytest.mark.parametrize("change", ["", "keys reordered", "shuffled"])
def test_a_batch_given_as_keyword_arguments_is_recorded_and_its_order_named_first(tmp_path, change):
    """Regression (issue 54): the batch of `model(**batch)` (Hugging Face models) was never recorded, only positional
    arguments were, so a port reading its data in another order FAILed on an operator whose inputs agreed. Its keys
    are recorded by name: a port whose batch dict orders them otherwise reads the same data."""
    code = (SCRIPTS / "keyword_batch.py").read_text()
    original, port = tmp_path / "train.py", tmp_path / "train_npu.py"
    original.write_text(code)
    port.write_text({"": code, "keys reordered": code.replace("for key in rows[0]", "for key in reversed(rows[0])"),
                     "shuffled": code.replace("shuffle=False", "shuffle=True")}[change])
    shuffled = change == "shuffled"
    exit_code, summary, out = verify(original, port, "-n", STEPS, "-q", "-o", tmp_path / "out")
    batch = read_run(out / "ref").ops.query("op == 'input' and step == 0")
    assert batch["io"].tolist() == ["in.attention_mask", "in.input_ids", "in.labels"]  # by name, not dict order
    if not shuffled:
        assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
        return
    assert exit_code == 1 and summary["reason"].startswith(
        "FAIL: the sides read different data: the in.input_ids input of TinyClassifier's first forward differs at "
        "step 0")
    assert finding(summary, "data_order")["detail"]["source"] == "inputs"
    assert not any("diverges although its inputs agree" in advice for advice in summary["advice"])  # the data's


def test_a_changed_dropout_rate_is_named_first(tmp_path):
    """Regression (issue 54): a dropout rate set through a config (PEFT's lora_dropout doubled) FAILed naming the
    dropout's aten.mul, not the rate; each dropout module's rate is a hyperparameter verify reads off the model."""
    port = tmp_path / "dropout_mlp_npu.py"
    port.write_text((SCRIPTS / "dropout_mlp.py").read_text().replace("nn.Dropout(0.1)", "nn.Dropout(0.2)"))
    exit_code, summary, _ = verify(SCRIPTS / "dropout_mlp.py", port, "-n", STEPS, "-q", "-o", tmp_path / "out")
    assert exit_code == 1 and summary["reason"] == "FAIL: hyperparameter differs: dropout 0.1 vs 0.2 in 5", (
        summary["reason"])
    assert not any("diverges although its inputs agree" in advice for advice in summary["advice"])  # not an op's


@pytest.mark.parametrize("accumulate", [2, 1], ids=["faithful", "accumulation-dropped"])
def test_a_changed_gradient_accumulation_is_named_first(tmp_path, accumulate):
    """Regression (issue 54): accumulate's gradient_accumulation.py with 2 micro-steps turned into 1 FAILed at aten.div,
    "the ops that produced its inputs agree"; the backward() calls per optimizer step are a hyperparameter."""
    code = (SCRIPTS / "tiny_train.py").read_text()
    port = tmp_path / "tiny_train_npu.py"
    default = '"--accumulate", type=int, default='
    port.write_text(code.replace(f"{default}1", f"{default}{accumulate}"))
    original = tmp_path / "tiny_train.py"
    original.write_text(code.replace(f"{default}1", f"{default}2"))
    exit_code, summary, _ = verify(original, port, "-n", STEPS, "-q", "-o", tmp_path / "out")
    if accumulate == 2:
        assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
        return
    assert exit_code == 1 and summary["reason"] == (
        "FAIL: hyperparameter differs: gradient accumulation 2 vs 1 backward() calls per optimizer step"), (
        summary["reason"])
    assert not any("diverges although its inputs agree" in advice for advice in summary["advice"])


def determinism(tmp_path: Path, script: Path) -> tuple[int, dict]:
    result = CliRunner().invoke(app, ["determinism", str(script), "-n", "2", "-q", "-o", str(tmp_path / "out")])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads((tmp_path / "out" / DETERMINISM_JSON).read_text())


def test_determinism_of_a_seeded_script(tmp_path):
    exit_code, record = determinism(tmp_path, ORIGINAL)
    assert exit_code == 0 and record["deterministic"] and record["differing_ops"] == []
    assert record["loss"]["max_abs_diff"] == 0 and record["dump"] == "md5"
    assert (record["checklist"]["id"], record["checklist"]["status"]) == ("C1", "Passed")


def test_determinism_names_the_op_drawing_from_an_unseeded_generator(tmp_path):
    exit_code, record = determinism(tmp_path, SCRIPTS / "verdict_unseeded.py")
    assert exit_code == 1 and not record["deterministic"]
    first = record["differing_ops"][0]
    assert (first["op"], first["module"], first["phase"], first["step"]) == ("aten.randn", "Noisy", "forward", 0)
    assert record["loss"]["max_abs_diff"] > 0
    assert record["checklist"]["status"] == "Failed" and "aten.randn" in " ".join(record["checklist"]["evidence"])


def migrated(tmp_path: Path, original: Path) -> Path:
    """`original` and its transfer-mode port by `migrate` (fp16 autocast and a GradScaler added) side by side."""
    code = original.read_text()
    (tmp_path / "train.py").write_text(code)
    (tmp_path / "train_npu.py").write_text(migrate_source(code, "train.py", Settings(is_entry=True)).code)
    return tmp_path / "train.py"


@pytest.mark.parametrize("match_amp", [True, False], ids=["same-amp", "no-match-amp"])
def test_steps_the_ports_grad_scaler_skips_are_followed_by_the_reference(tmp_path, match_amp):
    """verdict_mlp's sum-reduced loss overflows fp16 gradients at the GradScaler's first scales, so the port skips its
    first updates while the scale backs off. The reference's loss-scaler twin scales as the port did and skips the same
    updates (no NaN of verify's making); in fp32 (--no-match-amp) too, where its scaling is exact and overflows nothing.
    Both are loss scaling at work."""
    original = migrated(tmp_path, ORIGINAL)
    assert "GradScaler" in (tmp_path / "train_npu.py").read_text()
    exit_code, summary, out = verify(original, "-n", STEPS, "-q", "-o", tmp_path / "out",
                                     *(() if match_amp else ("--no-match-amp",)))
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    ref, actual = (json.loads((out / side / "manifest.json").read_text()) for side in ("ref", "actual"))
    assert actual["skipped_steps"] == ref["skipped_steps"] == SCALER_SETTLES  # then it trains
    assert ref["status"] == "ok" and ref["loss_scaler"]["twin"] == "scale"
    assert ref["loss_scaler"]["followed"] == actual["skipped_steps"]
    assert not {"overflow", "scale_collapse"} & set(codes(summary))
    if match_amp:
        ref_scales = pd.read_csv(out / "ref" / "losses.csv")["loss_scale"].tolist()
        assert ref_scales == pd.read_csv(out / "actual" / "losses.csv")["loss_scale"].tolist()
    else:
        assert "were skipped on the reference too" in summary["pair"]["description"]


def test_a_faithful_fp16_port_passes_once_its_loss_scale_has_settled(tmp_path):
    """Regression (issue 52, on a CPU and on an H200): migrate's fp16 port of verdict_mlp at 6 steps FAILed
    updates_skipped ("65536 down to 2048"), its GradScaler still halving. The pair goes on while the scale falls,
    until 6 updates are applied, and says so."""
    original = migrated(tmp_path, ORIGINAL)
    exit_code, summary, out = verify(original, "-n", 6, "-q", "-o", tmp_path / "out", "--", "--epochs", "2")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    skipped = summary["overflow"]["actual_scale"]["skipped"]
    assert skipped[:len(SCALER_SETTLES)] == SCALER_SETTLES  # and where a later step overflows, one more step
    assert summary["reason"].startswith(f"PASS: loss within 1.00% at all {6 + len(skipped)} steps")
    assert (f"ran {len(skipped)} more step(s) while the loss scale settled (65536 → 1024): {len(skipped)} update(s) "
            "skipped, 6 applied") in summary["notes"]


def test_a_port_whose_gradients_keep_their_first_overflow_is_told_to_reset_them_not_to_lower_the_scale(tmp_path):
    """pytorch/examples' tensor-parallel toy never calls zero_grad: its fp16 port overflowed at step 0, the inf
    stayed in the gradients, and its GradScaler skipped every step down to any scale. The FAIL said its gradients
    overflowed "at every scale" and advised a lower init_scale; it names the gradients never reset, and so does the
    advice."""
    exit_code, summary, out = verify(SCRIPTS / "never_zeroed_sum_loss.py", SCRIPTS / "never_zeroed_sum_loss_npu.py",
                                     "-n", 3, "-q", "-o", tmp_path / "out")
    assert (exit_code, summary["verdict"]) == (1, "FAIL"), summary["reason"]
    assert "and nothing resets them (no optimizer.zero_grad()): each later backward() adds to the inf they hold" in \
        summary["reason"]
    assert finding(summary, "updates_skipped")["detail"]["grads_carried"] is True
    advice = (out / "advice.txt").read_text()
    assert "\n1. Reset the port's gradients once per optimizer step" in advice and "init_scale" not in advice


def test_migrate_leaves_a_loop_that_never_clears_its_gradients_in_float32_and_its_port_passes(tmp_path):
    """Regression: migrate's default port of pytorch/examples' tensor-parallel toys added a GradScaler to a loop
    that never clears its gradients, and that port never trained (the test above). It leaves the loop in float32,
    AMP105 says why, and the port passes."""
    original = migrated(tmp_path, SCRIPTS / "never_zeroed_sum_loss.py")
    assert "GradScaler(" not in (tmp_path / "train_npu.py").read_text()
    exit_code, summary, _ = verify(original, "-n", 3, "-q", "-o", tmp_path / "out")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]


def test_a_style_shaped_port_is_judged_on_the_net_it_trains_beside_a_frozen_loss_network(tmp_path):
    """Regression (issue 52): the frozen loss network's call before the loop opened step 0, which then had no loss:
    exit 2, "damaged run directory". Judged on the trained net, its faithful fp16 port passes."""
    original = migrated(tmp_path, SCRIPTS / "frozen_loss_network.py")
    exit_code, summary, out = verify(original, "-n", 3, "-q", "-o", tmp_path / "out", "--adaptation-report")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    for side in ("ref", "actual"):
        extra = json.loads((out / side / "manifest.json").read_text())["extra"]
        assert (extra["model"]["parameters"], [frozen["parameters"] for frozen in extra["frozen_modules"]]) == (
            443, [14768])
    assert "| `Sequential` (14,768) |" in (out / "adaptation.md").read_text()


def test_a_reference_without_a_gpu_takes_its_gpu_code_path_on_emulated_cuda(tmp_path):
    """mnist_cnn shuffles, pins memory and uses a worker only when CUDA is available. The port sees CUDA
    (transfer_to_npu); the reference, on EMULATED CUDA, takes the same branch and reads the same batches: PASS. With
    --device-ref cpu it takes the CPU branch, and the verdict says first that the sides read different data."""
    config = tomllib.loads((SAMPLES / "mnist_cnn" / "verify.toml").read_text())
    original = migrated(tmp_path, SAMPLES / "mnist_cnn" / "train_gpu.py")
    args = ("-n", 3, "--seed", config["seed"], "-q", "--", *config["args"])
    exit_code, summary, _ = verify(original, "-o", tmp_path / "out", *args)
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    assert summary["ref"]["emulated"] and summary["ref"]["title"].endswith("on EMULATED CUDA (on cpu)")
    exit_code, summary, _ = verify(original, "--device-ref", "cpu", "-o", tmp_path / "cpu", *args)
    assert exit_code == 1 and summary["reason"].startswith("FAIL: the sides read different data"), summary["reason"]


def test_a_reference_on_the_cpu_draws_the_noise_its_gpu_path_and_the_port_draw_on_their_devices(tmp_path):
    """Regression: dcgan draws its fixed noise on its device before training and its noise each step. On the CPU
    (--device-ref cpu) the first advanced the host's generator, which shuffles the loader, where the port's device
    draw did not, and the second came from the host where the port's came from the keyed stream: FAIL, "the sides
    read different data", for a faithful port. A factory asked for a device, the CPU too, now draws keyed: PASS."""
    config = tomllib.loads((SAMPLES / "dcgan" / "verify.toml").read_text())
    original = migrated(tmp_path, SAMPLES / "dcgan" / "train_gpu.py")
    exit_code, summary, _ = verify(original, "--device-ref", "cpu", "-n", 3, "--seed", config["seed"], "-q",
                                   "-o", tmp_path / "cpu", "--", *config["args"])
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    assert summary["ops"]["only_ref"] == summary["ops"]["only_actual"] == 0


def test_a_reference_that_cannot_run_under_the_ports_autocast_runs_as_written(tmp_path):
    """The port computes its functional binary cross entropy outside autocast at the top level, after a forward
    under it; the reference, following the port's outermost calls, still computes it under autocast, which refuses
    it. verify runs the reference again as written and judges fp32 against AMP, saying why; the crashed run stays."""
    exit_code, summary, out = verify(SCRIPTS / "bce_top_level.py", SCRIPTS / "bce_top_level_npu.py", "-n", STEPS,
                                     "-q", "-o", tmp_path / "out")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    assert summary["pair"]["mode"] == "amp-vs-fp32-unmatched"
    assert "could not run under the port's fp16 autocast (RuntimeError: " in summary["pair"]["description"]
    assert "fp32-vs-AMP" in summary["reason"]
    assert json.loads((out / "ref-under-autocast" / "manifest.json").read_text())["status"] == "crashed"
    assert json.loads((out / "ref" / "manifest.json").read_text())["status"] == "ok"


def test_dropout_masks_match_whatever_else_a_side_draws(tmp_path):
    """The port draws from its generator where the original does not (as two devices' generators differ): with the
    keyed stream both sides still drop the same units; with each side's own generator they do not."""
    code = (SCRIPTS / "dropout_mlp.py").read_text()
    port = migrate_source(code, "dropout_mlp.py", Settings(is_entry=True)).code
    assert port.count("    optimizer.zero_grad()\n") == 1
    (tmp_path / "dropout_mlp_npu.py").write_text(
        port.replace("    optimizer.zero_grad()\n", "    torch.rand(3)  # a draw the original does not make\n"
                                                      "    optimizer.zero_grad()\n"))
    exit_code, summary, _ = verify(SCRIPTS / "dropout_mlp.py", tmp_path / "dropout_mlp_npu.py", "-n", STEPS, "-q",
                                   "-o", tmp_path / "aligned")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    assert any("one keyed stream on both sides" in note for note in summary["notes"])
    exit_code, summary, _ = verify(SCRIPTS / "dropout_mlp.py", tmp_path / "dropout_mlp_npu.py", "-n", STEPS, "-q",
                                   "--no-align-random", "-o", tmp_path / "own")
    assert exit_code == 1, summary["reason"]


# --- a crash is never a verdict (issue 18): verify's own errors exit 2 with one line, a FAIL is never lost ----------

NEEDS_TORCHRUN, SHORT_EPOCH = SCRIPTS / "needs_torchrun.py", SCRIPTS / "short_epoch.py"
LAUNCHER_ERROR = "KeyError: 'LOCAL_RANK'; the script expects a launcher such as torchrun"


def verify_error(*args: str | Path) -> str:
    """`verify ...` that must end in verify's own error: exit 2, its one line (the last on stderr), no traceback."""
    result = CliRunner().invoke(app, route([str(arg) for arg in args], typer.main.get_command(app)))
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    return result.stderr.strip().splitlines()[-1]


def test_two_runs_with_dump_off_are_compared_on_their_losses(tmp_path):
    """Regression: `verify compare` of two `verify run --dump off` runs died in compare (TypeError, exit 1)."""
    for side in ("ref", "actual"):
        made = CliRunner().invoke(app, ["run", str(SCRIPTS / "tiny_train.py"), "-n", "2", "--device", "cpu",
                                        "--dump", "off", "-q", "-o", str(tmp_path / side), "--", "--epochs", "5"])
        assert made.exit_code == 0, made.output
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "ref"), str(tmp_path / "actual"),
                                      "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("PASS: loss within 1.00% at all 2 steps (max 0.000%); operators not compared: "
                                    "neither side recorded any: both ran with --dump off")


def test_a_script_that_needs_torchrun_is_an_error_naming_the_launcher(tmp_path):
    """Regression (pytorch/examples multigpu_torchrun.py without torchrun): both sides stop before their first step,
    which proves nothing; the pair and `verify compare` of its runs say so on one line."""
    out = tmp_path / "out"
    line = verify_error(NEEDS_TORCHRUN, NEEDS_TORCHRUN, "-n", STEPS, "-q", "-o", out)
    assert line == (f"error: both sides stopped before their first step: {LAUNCHER_ERROR} "
                    f"(runs: {out / 'ref'}, {out / 'actual'})")
    assert verify_error("compare", out / "ref", out / "actual") == line


def test_a_reference_that_cannot_run_is_an_error_and_a_port_that_cannot_is_a_fail(tmp_path):
    line = verify_error(NEEDS_TORCHRUN, SHORT_EPOCH, "-n", 2, "-q", "-o", tmp_path / "ref-crashes")
    assert line.startswith(f"error: the reference crashed after 0 of 2 steps: {LAUNCHER_ERROR}; a reference that "
                           "cannot run proves nothing")
    exit_code, summary, _ = verify(SHORT_EPOCH, NEEDS_TORCHRUN, "-n", 2, "--dump", "off", "-q",
                                   "-o", tmp_path / "port-crashes")
    assert exit_code == 1 and summary["reason"] == "FAIL: actual run crashed: KeyError: 'LOCAL_RANK' (after 0 steps)"
    assert summary["ops"]["not_compared"] == "neither side recorded any: both ran with --dump off"
    assert not (tmp_path / "port-crashes" / "calibration").exists()  # no noise measured for a side that crashed


def test_scripts_ending_by_themselves_are_judged_on_their_steps_and_on_how_many_they_made(tmp_path):
    """Regression: an epoch of 2 steps run with --steps 3 ended 'short' on both sides and was read as FAIL."""
    exit_code, summary, _ = verify(SHORT_EPOCH, SHORT_EPOCH, "-n", STEPS, "-q", "-o", tmp_path / "same")
    assert exit_code == 0 and summary["reason"].endswith("; both scripts ended by themselves after 2 of 3 steps")
    assert "both scripts ended by themselves after 2 of 3 steps; judged on those 2" in summary["notes"]
    longer = tmp_path / "longer_npu.py"
    longer.write_text(SHORT_EPOCH.read_text().replace("for _ in range(2)", "for _ in range(3)"))
    exit_code, summary, _ = verify(SHORT_EPOCH, longer, "-n", STEPS, "-q", "-o", tmp_path / "longer")
    assert exit_code == 1 and summary["reason"] == (
        "FAIL: the scripts ran different numbers of steps: ref 2 of 3 (it ended by itself), actual all 3")


def test_a_port_updating_its_parameters_by_hand_with_another_rate_fails_with_its_reports(tmp_path):
    """Regression: compare found the FAIL, then summary.json died on a numpy bool (exit 1, no report, no verdict)."""
    port = tmp_path / "manual_update_npu.py"
    port.write_text((SCRIPTS / "manual_update.py").read_text().replace("alpha=-0.1", "alpha=-0.2"))
    exit_code, summary, out = verify(SCRIPTS / "manual_update.py", port, "-n", STEPS, "-q", "-o", tmp_path / "out")
    assert exit_code == 1 and summary["reason"] == (
        "FAIL: the port computes aten.add_(alpha=-0.2) where the original computes aten.add_(alpha=-0.1) at "
        "manual_update_npu.py:15 (original manual_update.py:15), in the top level, step 0: a changed operator; it is "
        "the script's own parameter update (no optimizer): its learning rate or rule differs")
    assert finding(summary, "op_changed")["detail"]["update_by_hand"] is True
    assert finding(summary, "op_diverges")["detail"]["update_by_hand"] is True
    advice = (out / "advice.txt").read_text()
    assert "is the script's own parameter update" in advice and "a changed layer or function" not in advice
    assert {"report.html", "ops.xlsx", "advice.txt"} <= {path.name for path in out.iterdir()}


def test_a_script_updating_by_hand_then_evaluating_is_judged_on_its_training(tmp_path):
    """Regression (pytorch/examples word_language_model at --steps 40: its data ends at step 20, then it evaluates):
    the forwards after the last backward count as steps without a loss, which read as a damaged run (exit 2)."""
    exit_code, summary, _ = verify(SCRIPTS / "manual_update.py", SCRIPTS / "manual_update.py", "-n", 20, "-q",
                                   "-o", tmp_path / "out")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    assert summary["reason"].startswith("PASS: loss within 1.00% at all 6 steps"), summary["reason"]


def test_an_inference_pair_names_its_outputs_and_writes_an_adaptation_report(tmp_path):
    """Issue 24: a classifier's inference script (no optimizer, top-5 printed) against its port: the verdict names the
    outputs' figures, summary.json holds them with the criterion, and adaptation.md has every section."""
    code = (SCRIPTS / "classify_inference.py").read_text()
    (tmp_path / "classify_npu.py").write_text(migrate_source(code, "classify.py", Settings(is_entry=True)).code)
    exit_code, summary, out = verify(SCRIPTS / "classify_inference.py", tmp_path / "classify_npu.py", "-n", STEPS,
                                     "-q", "--adaptation-report", "-o", tmp_path / "out")
    assert exit_code == 0
    assert summary["reason"].startswith("PASS: 1 inference output(s) within the criterion at every step: cosine ")
    assert all(figure in summary["reason"] for figure in ("max abs", "mean abs", "top-1 100.00%", "top-5 100.00%"))
    overall = summary["outputs"]["overall"]
    assert overall["top1_agreement"] == overall["top5_agreement"] == 1.0 and overall["cosine"] > 0.9999
    assert summary["outputs"]["criterion"].startswith("cosine >= ")
    report = (out / "adaptation.md").read_text()
    for heading in ("Model and source", "Hardware", "Software", "Run", "Accuracy", "Criterion", "Verdict"):
        assert f"## {heading}\n" in report
    assert "EMULATED NPU (a test double on cpu)" in report and "(emulator: not a device figure)" in report
    # issue 37: fit to publish: no absolute path, the model named and counted, the command that made it
    assert str(tmp_path) not in report and str(SCRIPTS) not in report and "/tmp" not in report
    assert "| Port | `classify_npu.py` |" in report and "| `Classifier` | 26,148 |" in report
    assert "## Command\n\n```\nverify " in report and "--adaptation-report" in report
    again = CliRunner().invoke(app, ["report", str(out), "--adaptation-report"])
    assert again.exit_code == 0 and (out / "adaptation.md").read_text() == report


def test_an_inference_output_of_fewer_than_5_classes_names_its_top_k_over_all_of_them(tmp_path):
    """Issue 36 item 7: a PASS printed `top-5 nan%` for an output of 3 classes; its top-k is over its 3 classes."""
    code = (SCRIPTS / "classify_inference.py").read_text().replace("16 * 16, 100)", "16 * 16, 3)").replace(
        "topk(5)", "topk(3)")
    (tmp_path / "classify.py").write_text(code)
    (tmp_path / "classify_npu.py").write_text(migrate_source(code, "classify.py", Settings(is_entry=True)).code)
    exit_code, summary, _ = verify(tmp_path / "classify.py", tmp_path / "classify_npu.py", "-n", STEPS, "-q",
                                   "-o", tmp_path / "out")
    assert exit_code == 0, summary
    assert "top-1 100.00%, top-3 (all 3 classes) 100.00%" in summary["reason"] and "nan" not in summary["reason"]
    assert summary["outputs"]["overall"]["top_k"] == 3 and summary["outputs"]["overall"]["top5_agreement"] == 1.0


def test_a_port_that_never_calls_backward_fails_naming_that(tmp_path):
    """Issue 36 item 7: a port without backward() against a trainer FAILed naming aten.addmm at step 1 (then, once
    damaged runs were refused, exit 2 'losses.csv has no loss'): the manifest counts backward() calls, a run without
    one promises no loss, and the verdict names the missing call."""
    port = tmp_path / "tiny_train_npu.py"
    port.write_text((SCRIPTS / "tiny_train.py").read_text().replace(
        "(scaler.scale(loss) if scaler else loss).backward()", "pass  # backward() lost in the port"))
    exit_code, summary, _ = verify(SCRIPTS / "tiny_train.py", port, "-n", STEPS, "-q", "-o", tmp_path / "out")
    assert exit_code == 1, summary
    assert summary["reason"] == ("FAIL: the port never calls backward(): it made 3 step(s) without a gradient, where "
                                 "the original called backward() 3 time(s)")
    assert any("Restore it as in the original" in advice for advice in summary["advice"])


def test_a_grad_scaler_over_fp32_compute_is_followed_exactly_by_an_fp32_reference(tmp_path):
    """Regression: pytorch/examples' reinforce.py, as migrate ports it (autocast around the loss alone, computing
    nothing in half precision, and a GradScaler), FAILed: its backward's masks and quotients of forward values
    (Categorical.log_prob's) were divided by the port's loss scale alone, and the backward of GradScaler.scale's
    product, which the reference lacked, shifted the pairing of the ops after it. The fp32 reference now plays the
    port's scale (exact in fp32), and the backward of verify's and a GradScaler's own products is not recorded."""
    original = SCRIPTS / "policy_gradient.py"
    port = tmp_path / "policy_gradient_npu.py"
    port.write_text(original.read_text()
                    .replace("import torch\n", "import torch\nimport torch_npu\n", 1)
                    .replace("torch.manual_seed(0)\n", "torch.manual_seed(0)\nscaler = torch.amp.GradScaler('npu')\n")
                    .replace("    loss = torch.stack", "    with torch.autocast('npu', dtype=torch.float16):\n"
                                                     "        loss = torch.stack")
                    .replace("    loss.backward()\n    optimizer.step()\n",
                             "    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n    scaler.update()\n"))
    exit_code, summary, out = verify(original, port, "-n", 6, "-q", "-o", tmp_path / "out")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    assert summary["pair"]["mode"] == "as-written" and "loss was scaled" in summary["pair"]["description"]
    ops = pd.read_parquet(out / "ops.parquet")
    assert not ops.loc[ops["phase"] == "backward", "status"].isin(["only_actual", "only_ref"]).any()


def test_a_port_that_hangs_leaves_its_following_reference_to_run_to_its_end(tmp_path):
    """The reference that follows a port as it runs waits where the port has not got there yet: a port that hangs
    after two steps holds it until the port's timeout ends it. The reference then runs on, or, where its own timeout
    came first while it waited, runs again after the port: its timeout is never the verdict."""
    original = tmp_path / "steady.py"
    original.write_text((SCRIPTS / "hang.py").read_text().split("print(")[0].replace("range(2)", "range(6)"))
    port = tmp_path / "steady_npu.py"
    port.write_text((SCRIPTS / "hang.py").read_text())

    def too_soon(out: Path) -> bool:  # the reference's run again after the port has the timeout too, and must end
        return timed_out_before_printing(out / "actual", "now hanging") or timed_out(out / "ref")

    # a run whose timeout came before its first step reads as damaged (exit 2): one made too soon
    (exit_code, summary, out), _, _ = timed_out_in_the_hang(
        lambda timeout, out: verify(original, port, "-n", 4, "--timeout", timeout, "-q", "-o", out,
                                    exits=(0, 1, EXIT_ERROR)),
        tmp_path, too_soon)
    manifests = {side: json.loads((out / side / "manifest.json").read_text()) for side in ("ref", "actual")}
    assert manifests["actual"]["status"] == "timeout" and manifests["actual"]["steps_completed"] == 2
    assert manifests["ref"]["status"] == "ok" and manifests["ref"]["steps_completed"] == 4
    assert exit_code == 1 and "timed out" in summary["reason"], summary["reason"]


def test_runs_going_together_build_torch_extensions_in_folders_of_their_own(tmp_path, monkeypatch):
    """Regression: the cuda_extension_model sample's pair crashed now and then ("bias_gelu_ext.so: cannot open shared
    object file"): its reference, calibration run and port, going at once, built one extension in one folder, each
    replacing the library the other was loading. Each run of a pair now builds in a folder of its own."""
    record = f"import os\nopen({str(tmp_path / 'folders.txt')!r}, 'a').write(os.environ['TORCH_EXTENSIONS_DIR'] + '\\n')\n"
    original, port = tmp_path / ORIGINAL.name, tmp_path / PORT.name
    original.write_text(record + ORIGINAL.read_text())
    port.write_text(record + PORT.read_text())
    monkeypatch.chdir(tmp_path)  # the scripts' folder, the root of each run's view
    exit_code, summary, _ = verify(original, port, "-n", 2, "-q", "-o", tmp_path / "out")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    # each run wrote folders.txt in its own view of the scripts' folder (RUNDIR/files: test_working_folder.py)
    folders = sorted(Path(line).name for side in ("actual", "calibration", "ref")
                     for line in (tmp_path / "out" / side / "files" / "folders.txt").read_text().split())
    assert [folder.split("-torch")[0] for folder in folders] == ["npu-port-actual", "npu-port-calibration",
                                                                  "npu-port-ref"]


def meta_init_port(tmp_path: Path, initialized: str, loss: str = "square()") -> Path:
    """meta_init.py's port to the emulated NPU, initializing its model as `initialized` says (meta_init.py), its loss
    computed by `loss` in place of square()."""
    port = tmp_path / "meta_init_npu.py"
    source = (SCRIPTS / "meta_init.py").read_text().replace("how = sys.argv[1]", f"how = {initialized!r}")
    source = source.replace(".square()", f".{loss}")
    port.write_text(source.replace("import torch\n", "import torch\nimport torch_npu  # noqa: F401\n", 1))
    return port


def test_a_pair_whose_scripts_both_leave_parameters_as_to_empty_allocated_them_passes_saying_so(tmp_path):
    """The port is faithful (a PASS), and the pair says what its numbers cannot prove: the body's parameters are
    the allocator's, zeros here, on both sides."""
    code, summary, out = verify(SCRIPTS / "meta_init.py", meta_init_port(tmp_path, "head"), "--steps", "3", "-q",
                                "-o", tmp_path / "pair", "--", "head")
    assert code == 0 and summary["verdict"] == "PASS"
    unwritten = finding(summary, "uninitialized")
    assert unwritten["detail"]["side"] == "both" and "2 of 4 parameters" in unwritten["message"]
    advice = (out / "advice.txt").read_text()
    assert "Initialize every parameter and buffer after to_empty (meta_init_npu.py:17)" in advice


def test_a_failing_ports_advice_starts_with_its_cause_not_with_what_both_scripts_leave_uninitialized(tmp_path):
    """pytorch/examples' FSDP2 example, broken at its embedding: its first advice was to initialize the blocks both
    scripts leave unwritten, which is no cause of the FAIL, and the loss it moved came before the changed operator,
    whose advice was given twice (its OP_CHANGED finding and the first divergent operator's) where the loss's
    arithmetic, outside any module, changed. The cause now comes first, once, in the findings as in the advice."""
    code, summary, out = verify(SCRIPTS / "meta_init.py", meta_init_port(tmp_path, "head", loss="abs()"), "--steps",
                                "3", "-q", "-o", tmp_path / "pair", "--", "head")
    assert code == 1 and "the port computes aten.abs" in summary["reason"], summary["reason"]
    codes = [item["code"] for item in summary["findings"]]
    assert codes[0] == "op_changed" and codes.index("loss_diverges") > codes.index("op_diverges"), codes
    assert codes.index("uninitialized") > codes.index("loss_diverges"), codes
    todo = (out / "advice.txt").read_text().split("What to do:\n")[1].splitlines()
    assert todo[0].startswith("1. The port computes aten.abs where the original computes aten.pow"), todo
    assert sum("The port computes aten.abs" in line for line in todo) == 1, todo
    assert "Initialize every parameter and buffer after to_empty" in todo[-1], todo


def test_a_port_that_leaves_parameters_its_original_initializes_fails_naming_them(tmp_path):
    code, summary, out = verify(SCRIPTS / "meta_init.py", meta_init_port(tmp_path, "head"), "--steps", "3", "-q",
                                "-o", tmp_path / "pair", "--", "all")
    assert code == 1 and summary["verdict"] == "FAIL"
    assert summary["reason"].startswith("FAIL: the port leaves 2 of 4 parameters unwritten after Module.to_empty")
    unwritten = finding(summary, "init_differs")
    assert unwritten["detail"]["side"] == "actual" and "0.weight, 0.bias" in unwritten["message"]
    assert "as the other script does" in (out / "advice.txt").read_text()
