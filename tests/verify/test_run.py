"""`verify run` end to end: real child processes running the tiny scripts in scripts/, read back with the reader."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hung_runs import timed_out_before_printing, timed_out_in_the_hang

from verify.compare.findings import unwritten_words
from verify.errors import Stopped
from verify.launch.runner import RunOptions, run_script
from verify.record.schema import SETTLING_STEPS, UNWRITTEN_KEY, DumpMode, Status
from verify.record.store import Run, read_run

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.slow


def run(tmp_path, script: str, *args: str, steps: int = 3, **options) -> Run:
    options = RunOptions(steps=steps, **{"device": "cpu", **options})
    run_dir = run_script(SCRIPTS / script, list(args), options, tmp_path / "run")
    return read_run(run_dir)


def test_full_run_records_losses_hparams_grads_and_ops_with_modules(tmp_path):
    result = run(tmp_path, "tiny_train.py", "--adam")
    manifest = result.manifest
    assert (manifest.status, manifest.steps_completed, manifest.exit_code) == (Status.OK.value, 3, 0)
    assert manifest.device == "cpu" and not manifest.emulated and len(manifest.step_wall_s) == 3
    assert result.losses["step"].tolist() == [0, 1, 2] and result.losses["loss"].notna().all()
    hparams = result.hparams[result.hparams["step"] == 0].set_index("name")["value"]
    assert hparams["optimizer"] == "Adam" and hparams["lr"] == 0.05 and hparams["betas"] == [0.9, 0.999]
    assert set(result.grads["param"]) == {"conv.weight", "conv.bias", "head.weight", "head.bias"}
    assert (result.grads["norm"] > 0).all() and (result.grads["nan_count"] == 0).all()
    ops = result.ops
    assert set(ops["step"]) == {0, 1, 2}
    assert set(ops["phase"]) >= {"forward", "backward", "optimizer", "other"}
    conv = ops[ops["op"] == "aten.convolution"]
    assert set(conv["module"]) == {"Net.conv"} and conv["phase"].eq("forward").all()
    conv_backward = ops[(ops["op"] == "aten.convolution_backward") & (ops["step"] == 1)]
    assert set(conv_backward["module"]) == {"Net.conv"} and conv_backward["phase"].eq("backward").all()
    assert ops["key"].is_unique or ops.duplicated(["key", "io"]).sum() == 0
    first = ops[ops["op"] == "aten.convolution"].iloc[0]
    assert first["key"] == "0/forward/Net.conv/aten.convolution#0" and first["shape"] == "8x4x8x8"
    assert first["min"] <= first["mean"] <= first["max"] and first["l2_norm"] > 0
    assert not (tmp_path / "run" / "output.log").read_text().count("Traceback")
    assert_readable_without_torch(tmp_path / "run", len(ops))


def assert_readable_without_torch(run_dir, op_rows: int) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
        "from verify.record.store import read_run\n"
        f"print(len(read_run({str(run_dir)!r}).ops))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == str(op_rows)


def test_capture_does_not_change_the_numbers(tmp_path):
    captured = run(tmp_path / "stats", "tiny_train.py", steps=4)
    plain = run(tmp_path / "off", "tiny_train.py", steps=4, dump=DumpMode.OFF)
    assert captured.losses["loss"].tolist() == plain.losses["loss"].tolist()
    assert plain.ops.empty and not plain.grads.empty


def test_the_op_hook_built_unbuildable_or_off_gives_the_same_records_and_the_manifest_says_which_ran(tmp_path):
    """Issue 57: a run with the compiled op hook (built by the session's conftest), one where it cannot be built (no
    C++ compiler, an empty cache) and one with it turned off write the same records, bit for bit; each manifest
    names the path that ran, and why where it is not the hook."""
    import pandas as pd

    from verify.capture import op_hook

    if op_hook.hook() is None:
        pytest.skip(f"the op hook is not built here: {op_hook.why_not()}")
    unbuildable = {"NPU_PORT_CACHE": str(tmp_path / "empty-cache"), "CXX": "/bin/false"}
    runs = {path: run(tmp_path / path, "tiny_train.py", "--adam", extra_env=env)
            for path, env in (("hook", {}), ("unbuildable", unbuildable), ("off", {op_hook.SWITCH: "0"}))}
    paths = {path: result.manifest.extra["op_dispatch"] for path, result in runs.items()}
    assert paths["hook"].startswith("verify/capture/_op_hook.cpp")
    assert paths["unbuildable"].startswith("verify/capture/_dispatch.c") and "the op hook not built: " in paths["unbuildable"]
    assert paths["off"].endswith(f"the op hook not built: {op_hook.SWITCH}=0)")
    assert not list((tmp_path / "empty-cache").glob("*.so"))  # nothing half-built left where a later run looks
    assert [failed.suffix for failed in (tmp_path / "empty-cache").iterdir()] == [".failed"]  # not tried again
    for path in ("unbuildable", "off"):
        pd.testing.assert_frame_equal(runs[path].ops, runs["hook"].ops)
        assert runs[path].losses["loss"].tolist() == runs["hook"].losses["loss"].tolist()


def test_crash_keeps_the_steps_before_it_and_the_traceback(tmp_path):
    result = run(tmp_path, "tiny_train.py", "--crash-at", "2", steps=5)
    manifest = result.manifest
    assert manifest.status == Status.CRASHED.value and manifest.steps_completed == 2
    assert "RuntimeError: boom at step 2" in manifest.message
    assert "tiny_train.py" in manifest.traceback
    assert "bootstrap.py" not in manifest.traceback and "runpy" not in manifest.traceback
    assert result.losses["step"].tolist() == [0, 1] and set(result.ops["step"]) == {0, 1}


def test_timeout_kills_the_run_and_keeps_its_steps(tmp_path):
    result, _, timeout = timed_out_in_the_hang(
        lambda timeout, out: run(out, "hang.py", steps=5, timeout=timeout, dump=DumpMode.OFF),
        tmp_path, lambda out: timed_out_before_printing(out / "run", "now hanging"))
    assert result.manifest.status == Status.TIMEOUT.value
    assert result.manifest.steps_completed == 2 and f"timed out after {timeout:g} s" in result.manifest.message


def test_interrupt_ends_the_child_and_keeps_its_steps(tmp_path):
    def press_ctrl_c_after_two_steps(steps: int) -> None:
        if steps == 2:
            raise KeyboardInterrupt

    options = RunOptions(steps=5, device="cpu", dump=DumpMode.OFF)
    with pytest.raises(Stopped) as stopped:
        run_script(SCRIPTS / "hang.py", [], options, tmp_path / "run", on_progress=press_ctrl_c_after_two_steps)
    assert stopped.value.signal_name == "SIGINT" and stopped.value.runs == [tmp_path / "run"]
    manifest = read_run(tmp_path / "run").manifest
    assert manifest.status == Status.INTERRUPTED.value and manifest.steps_completed == 2
    assert manifest.message == "interrupted: verify was stopped by SIGINT (2 steps completed)"
    assert manifest.exit_code < 0 and not list((tmp_path / "run").glob(".verify-*"))


def test_nan_loss_stops_the_run(tmp_path):
    result = run(tmp_path, "tiny_train.py", "--nan-at", "1", steps=5)
    assert result.manifest.status == Status.NAN.value and result.manifest.steps_completed == 2
    assert result.manifest.message == "loss is nan at step 1" and math.isnan(result.losses["loss"].iloc[-1])


@pytest.mark.parametrize(
    ("args", "status", "steps_done", "message"),
    [
        (("--exit-after", "2"), Status.SHORT, 2, "ended by itself after 2 of 5 steps"),
        (("--exit-after", "2", "--exit-code", "1"), Status.CRASHED, 2, "sys.exit(1) after 2 steps"),
        (("--epochs", "3"), Status.SHORT, 3, "ended by itself after 3 of 5 steps"),
    ],
)
def test_script_ending_early(tmp_path, args, status, steps_done, message):
    manifest = run(tmp_path, "tiny_train.py", *args, steps=5).manifest
    assert (manifest.status, manifest.steps_completed) == (status.value, steps_done)
    assert message in manifest.message


def test_no_steps(tmp_path):
    manifest = run(tmp_path, "no_steps.py").manifest
    assert manifest.status == Status.NO_STEPS.value
    assert manifest.message == ("the script ended without a step: no module's forward ran and no optimizer stepped; "
                                "its last output: 'sum: 45'")  # what the script said last (issue 37)


def test_a_model_that_ran_without_an_optimizer_step_is_told_so(tmp_path):
    manifest = run(tmp_path, "forward_without_step.py").manifest
    assert manifest.status == Status.NO_STEPS.value
    assert manifest.message == ("the script ended without a step: the model's forward ran 10 time(s) and backward() "
                                "ran, but the 1 optimizer it created never stepped (no optimizer.step(): with an "
                                "optimizer, its steps are the steps)")


def test_inference_script_records_each_forward_as_a_step(tmp_path):
    result = run(tmp_path, "inference.py", steps=3)
    assert result.manifest.inference and result.manifest.status == Status.OK.value
    outputs = result.outputs
    assert outputs["step"].tolist() == [0, 1, 2] and outputs["shape"].eq("3x5").all()
    logits = result.load_array(outputs["tensor_file"].iloc[0])
    assert logits.shape == (3, 5) and logits.dtype.name == "float32"
    assert result.losses.empty and set(result.ops["phase"]) >= {"forward"}
    # a step ends at the next forward or when the script leaves, sys.exit() included: all 4 forwards are steps
    manifest = run(tmp_path / "exit", "inference.py", "--exit", steps=5).manifest
    assert (manifest.status, manifest.steps_completed, manifest.exit_code) == (Status.SHORT.value, 4, 0)


def test_training_without_an_optimizer_steps_from_forward_to_forward(tmp_path):
    """Regression (pytorch/examples word_language_model, no --use-optimizer): its model's and its loss module's first
    forwards were taken for two inference steps, and after the first backward() no step ever ended."""
    result = run(tmp_path, "manual_update.py", steps=3)
    manifest = result.manifest
    assert (manifest.status, manifest.steps_completed, manifest.inference) == (Status.OK.value, 3, False)
    assert result.losses["step"].tolist() == [0, 1, 2] and result.outputs.empty
    ops = result.ops
    assert set(ops["step"]) == {0, 1, 2} and {"forward", "backward"} <= set(ops["phase"])
    # the hand-written update belongs to the step of the backward() before it
    assert (ops[ops["step"] == 0]["op"] == "aten.add_").sum() == 4


@pytest.mark.parametrize("update", ["optimizer", "by hand"])
def test_a_frozen_loss_network_called_before_the_loop_starts_no_step(tmp_path, update):
    """Regression (issue 52): a style-transfer-shaped script calls its frozen loss network, larger than the net it
    trains, once before the loop (and makes its optimizer after). Its steps were counted from the frozen network's
    calls: step 0 ran from that call to the network's first call in the loop, and had no loss (a damaged run)."""
    result = run(tmp_path, "frozen_loss_network.py", *(("--by-hand",) if update == "by hand" else ()), steps=3)
    manifest = result.manifest
    assert (manifest.status, manifest.steps_completed, manifest.inference) == (Status.OK.value, 3, False)
    assert result.losses["step"].tolist() == [0, 1, 2] and not result.damage
    assert manifest.extra["model"] == {"class": "Sequential", "parameters": 443, "shared_memory": False}
    assert manifest.extra["frozen_modules"] == [{"class": "Sequential", "parameters": 14768, "shared_memory": False}]
    if update == "optimizer":  # the trained net's parameters by their own names
        assert set(result.grads["param"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}


def test_dataloader_workers_do_not_record(tmp_path):
    result = run(tmp_path, "dataloader_workers.py", steps=4)
    assert result.manifest.status == Status.OK.value and result.manifest.steps_completed == 4
    assert result.losses["step"].tolist() == [0, 1, 2, 3]  # a worker writing would add rows or break the CSV


def test_ddp_with_one_process(tmp_path):
    result = run(tmp_path, "ddp_one_process.py")
    assert result.manifest.status == Status.OK.value, result.manifest.message
    # the model's own names, as without the wrapper (a port may train the model unwrapped)
    assert set(result.grads["param"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert {"Sequential.0", "Sequential.2"} <= set(result.ops["module"])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="a process's threads are read from /proc")
def test_a_gloo_group_destroyed_under_the_capture_lives_until_the_process_ends(tmp_path):
    """The capture's first op imported torch._dynamo after the script's init_process_group, which then held the group
    past destroy_process_group, until some later moment freed it (SIGABRT at the exit, "terminate called without an
    active exception"; 1 CI run in 20): dynamo is imported first. The group a destroy unregisters is now kept on
    purpose, until the rank ends with os._exit, which frees nothing: freed inside the script, gloo's destructor
    deadlocked a rank now and then (test_destroyed_groups.py). The run ends, its threads still there."""
    threads = tmp_path / "threads.json"
    result = run(tmp_path, "group_threads_after_destroy.py", str(threads))
    assert result.manifest.status == Status.OK.value, result.manifest.message
    assert [name for name in json.loads(threads.read_text()) if "gloo" in name]


@pytest.mark.parametrize("initialized", ["all", "head", "data", "assign", "norm"])
def test_the_parameters_left_as_to_empty_allocated_them_are_named_in_the_manifest(tmp_path, initialized):
    """pytorch/examples' FSDP2 example resets its embeddings and its head after to_empty, never its blocks: they
    trained from zeros on the emulated devices, so a change to a block's arithmetic changed no number. Buffers alike:
    a batch norm whose weight and bias alone are set normalizes with running statistics nothing computed. On the
    emulated NPU, whose fresh memory reads zeros: on the CPU the parameters left are the host's leftovers, a NaN now
    and then (the run then ended "loss is nan")."""
    result = run(tmp_path, "meta_init.py", initialized, device="emulated-npu")
    assert result.manifest.status == Status.OK.value, result.manifest.message
    unwritten = result.manifest.extra.get(UNWRITTEN_KEY)
    if initialized == "head":
        assert unwritten == {"where": "meta_init.py:16", "count": 2, "of": 4, "names": ["0.weight", "0.bias"]}
    elif initialized == "norm":
        assert unwritten == {"where": "meta_init.py:16", "count": 0, "of": 6, "names": [], "buffers": {
            "count": 3, "of": 3, "names": ["3.running_mean", "3.running_var", "3.num_batches_tracked"]}}
        assert unwritten_words(unwritten) == (
            "3 of 3 buffers unwritten after Module.to_empty (meta_init.py:16): "
            "3.running_mean, 3.running_var, 3.num_batches_tracked")
    else:  # reset in place, replaced by .data =, or loaded with assign=True
        assert unwritten is None


def test_gan_counts_one_step_per_iteration(tmp_path):
    result = run(tmp_path, "gan.py", steps=3)
    assert result.manifest.steps_completed == 3
    optimizers = result.hparams[result.hparams["name"] == "optimizer"]
    # a step ends when the discriminator's optimizer (the first to step) has stepped: the generator's step of
    # iteration k falls into step k+1, and its last one is cut off by the stop
    assert list(zip(optimizers["step"], optimizers["optimizer"])) == [(0, 0), (1, 1), (1, 0), (2, 1), (2, 0)]
    assert result.losses.groupby("step").size().tolist() == [1, 2, 2]


def test_grad_scaler_loss_is_unscaled_and_accumulation_recorded_per_micro_step(tmp_path):
    result = run(tmp_path, "tiny_train.py", "--scaler", "--accumulate", "2")
    plain = run(tmp_path / "plain", "tiny_train.py", "--accumulate", "2", dump=DumpMode.OFF)
    losses = result.losses
    assert losses["micro_step"].tolist() == [0, 1] * 3 and losses["loss_scale"].eq(256.0).all()
    assert losses["loss"].tolist() == pytest.approx(plain.losses["loss"].tolist(), rel=1e-6)


def test_steps_a_grad_scaler_skips_count_and_the_run_goes_on_at_most_settling_steps(tmp_path):
    """A loss scaler's warm-up is no training step: the run goes on by a step for each skipped update, at most
    SETTLING_STEPS more (issue 52). This scale is infinite: it never settles."""
    result = run(tmp_path, "tiny_train.py", "--scaler", "--overflow")
    manifest = result.manifest
    assert manifest.status == Status.OK.value and manifest.skipped_steps == list(range(3 + SETTLING_STEPS))
    assert manifest.message == (f"ran the 3 requested steps and {SETTLING_STEPS} more while the loss scale settled "
                                "(0 of them applied an update)")
    assert (result.grads["inf_count"] + result.grads["nan_count"] > 0).any()


def test_autocast_no_dropout_and_md5(tmp_path):
    result = run(tmp_path, "tiny_train.py", steps=2, autocast="bf16", no_dropout=True, dump=DumpMode.MD5)
    assert result.manifest.autocast == "bf16" and result.manifest.no_dropout
    ops = result.ops
    assert "bfloat16" in set(ops.loc[ops["op"] == "aten.convolution", "dtype"])
    assert not ops["op"].isin(["aten.bernoulli_", "aten.native_dropout"]).any()
    assert ops["md5"].str.len().eq(32).all()


def test_tensor_mode_saves_selected_ops_and_inputs(tmp_path):
    result = run(tmp_path, "tiny_train.py", steps=1, dump=DumpMode.TENSOR, ops=r"^forward/Net\.conv/")
    ops = result.ops
    saved = ops[ops["tensor_file"] != ""]
    assert set(saved["op"]) == {"aten.convolution"} and set(saved["io"]) >= {"in0", "out0"}
    out = saved[saved["io"] == "out0"].iloc[0]
    array = result.load_array(out["tensor_file"])
    assert array.shape == (8, 4, 8, 8) and array.max() == pytest.approx(out["max"])


def test_a_run_compared_with_itself_in_tensor_mode_passes(tmp_path):
    """Regression: two tensor-mode runs of one script FAILed. Each init draw's recorded input was the allocator's
    memory after torch.empty (other values each run), and identical int64 labels failed on a cosine of 1 - 2e-16."""
    first, second = (run(tmp_path / side, "tiny_train.py", steps=2, dump=DumpMode.TENSOR) for side in ("a", "b"))
    draws = first.ops[first.ops["op"] == "aten.uniform_"]
    assert len(draws) and set(draws["io"]) == {"out0"}
    done = subprocess.run([sys.executable, "-m", "verify", "compare", str(tmp_path / "a" / "run"),
                           str(tmp_path / "b" / "run"), "-o", str(tmp_path / "pair")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_an_error_inside_optimizer_step_is_the_scripts_own_crash(tmp_path):
    """optimizer.step() raising between the step hooks left the capture paused; leaving it then failed inside verify
    and hid the script's error ('exited before verify could record how it ended')."""
    manifest = run(tmp_path, "failing_optimizer.py").manifest
    assert (manifest.status, manifest.steps_completed) == (Status.CRASHED.value, 1)
    assert "the optimizer broke at its second step" in manifest.message and not manifest.verify_error


def test_a_gpu_script_takes_its_gpu_code_path_on_emulated_cuda(tmp_path):
    """auto on a machine without a GPU: EMULATED CUDA, where torch.accelerator, DataParallel, pin_memory and Adam's
    graph-capture check all answer as on one GPU (DataParallel used to refuse parameters on the CPU)."""
    options = RunOptions(steps=3, device="auto")
    run_dir = run_script(SCRIPTS / "cuda_code_path.py", [], options, tmp_path / "run")
    manifest = read_run(run_dir).manifest
    assert (manifest.status, manifest.device, manifest.emulated) == (Status.OK.value, "emulated-cuda", True)
    assert manifest.title.endswith("on EMULATED CUDA (on cpu)")
    assert '"device": "cuda", "cuda": true, "name": "Emulated CUDA (CPU)"' in (run_dir / "output.log").read_text()


def test_the_batch_is_recorded_but_not_a_loss_modules_predictions(tmp_path):
    """op 'input' records hold the data the outermost modules receive: the model's batch and the loss module's labels,
    not the predictions the loss module receives from the model (computed, not read)."""
    ops = run(tmp_path, "cuda_code_path.py", steps=2).ops
    inputs = ops.loc[ops["op"] == "input"]
    assert set(inputs["module"]) == {"Linear"} and set(inputs["io"]) == {"in0"}
    assert inputs["dtype"].eq("float32").all() and inputs["mean"].notna().all()


def test_a_model_wrapped_on_one_side_only_pairs_op_for_op(tmp_path):
    """DataParallel on EMULATED CUDA, the bare model on the CPU: module paths and parameter names are the model's on
    both sides (imagenet's port on an NPU skips its DataParallel; only 19% of its ops paired)."""
    from verify.compare.runs import compare_runs
    from verify.record.evidence import read_side

    runs = [run_script(SCRIPTS / "wrapped_on_gpu.py", [], RunOptions(steps=2, device=device), tmp_path / device)
            for device in ("emulated-cuda", "cpu")]
    wrapped, bare = (read_side(path) for path in runs)
    assert set(wrapped.ops["module"]) == set(bare.ops["module"]) and "Net.fc" in set(bare.ops["module"])
    assert set(wrapped.grads["param"]) == set(bare.grads["param"]) == {"fc.weight", "fc.bias"}
    result = compare_runs(wrapped, bare)
    assert result.verdict.passed and result.status_counts()["only_ref"] == 0, result.verdict.reason
