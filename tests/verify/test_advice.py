"""Advice for the first divergent operator when a hyperparameter differs: ops that ran after the differing value
took effect (the optimizer's update of that step, every op of later steps) follow from it; earlier ones do not.

The runs are built in memory (Run), two steps of forward, backward and optimizer ops with identical statistics
on both sides unless a test perturbs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from verify.report.advice import advise
from verify.compare.runs import compare_runs
from verify.compare.findings import FindingCode
from verify.record.schema import OP_COLUMNS, RunManifest
from verify.record.store import Run

TRACE = [("forward", "Net.fc", "aten.addmm"), ("backward", "Net.fc", "aten.mm"), ("optimizer", "", "aten.add_")]
STEPS = 2


def trace_ops() -> pd.DataFrame:
    rows = [dict(step=step, seq=seq, phase=phase, module=module, op=op, call_index=0, io="out0",
                 key=f"{step}/{phase}/{module}/{op}#0", dtype="float32", shape="4x4", numel=16, min=-1.0, max=1.0,
                 mean=0.1 * (seq + 1), l2_norm=2.0 + step, nan_count=0, inf_count=0, md5="", tensor_file="", inputs="",
                 source="", attrs="")
            for step in range(STEPS) for seq, (phase, module, op) in enumerate(TRACE)]
    return pd.DataFrame(rows).astype(OP_COLUMNS)


def hparams(lrs: list[float]) -> pd.DataFrame:
    return pd.DataFrame([{"step": step, "group": "0", "name": "lr", "value": json.dumps(lr), "optimizer": 0}
                         for step, lr in enumerate(lrs)])


def run(root: Path, ops: pd.DataFrame, lrs: list[float], device: str) -> Run:
    manifest = RunManifest(script_sha256="one script", device=device, status="ok", steps_completed=STEPS)
    return Run(root=root, manifest=manifest, ops=ops, hparams=hparams(lrs))


def diverging_from(first: tuple[int, str], lrs: list[float], tmp_path: Path, device: str = "npu"):
    """The actual side's ops differ from the first (step, phase) on, with its learning rates `lrs` against 0.1
    throughout; both sides run the same script, the reference on the CPU."""
    actual_ops = trace_ops()
    step, seq = first[0], [phase for phase, _, _ in TRACE].index(first[1])
    later = (actual_ops["step"] > step) | ((actual_ops["step"] == step) & (actual_ops["seq"] >= seq))
    actual_ops.loc[later, "l2_norm"] *= 1.5
    result = compare_runs(run(tmp_path / "ref", trace_ops(), [0.1] * STEPS, "cpu"),
                          run(tmp_path / "actual", actual_ops, lrs, device))
    return result, [item.message for item in advise(result.findings)]


def test_an_update_with_another_lr_is_a_consequence_not_an_accuracy_issue(tmp_path):
    result, advice = diverging_from((0, "optimizer"), [0.2, 0.2], tmp_path)
    assert (result.first_divergent["step"], result.first_divergent["phase"]) == (0, "optimizer")
    op_finding = next(f for f in result.findings if f.code is FindingCode.OP_DIVERGES)
    assert op_finding.detail["follows_hparams"] == "lr"
    assert op_finding.message.endswith("it follows from the lr difference")
    assert advice[0].startswith("Make lr equal on both sides")
    assert advice[1].startswith("aten.add_ (optimizer, step 0) and the ops after it diverge because lr differs")
    assert not any("diverges although its inputs agree" in text for text in advice)  # the accuracy-issue advice


def test_a_forward_op_before_the_differing_update_is_still_an_accuracy_issue(tmp_path):
    """The forward of step 0 runs before the optimizer uses lr: the difference cannot explain it."""
    result, advice = diverging_from((0, "forward"), [0.2, 0.2], tmp_path)
    assert result.first_divergent["phase"] == "forward"
    assert any("aten.addmm in Net.fc diverges although its inputs agree" in text for text in advice)
    assert not any("because lr differs" in text for text in advice)


def test_an_lr_that_differs_only_from_step_1_does_not_explain_the_update_of_step_0(tmp_path):
    result, advice = diverging_from((0, "optimizer"), [0.1, 0.2], tmp_path)
    assert result.hparams["message"].tolist() == ["lr 0.1 vs 0.2 in group 0 from step 1"]
    assert any("aten.add_ in the top level (no module) diverges although its inputs agree" in text for text in advice)
    assert not any("because lr differs" in text for text in advice)


def test_the_same_script_with_another_lr_on_the_same_device_is_not_called_nondeterministic(tmp_path):
    result, advice = diverging_from((0, "optimizer"), [0.2, 0.2], tmp_path, device="cpu")
    assert FindingCode.NONDETERMINISM not in {f.code for f in result.findings}
    assert not any("the benchmark is not constant" in text for text in advice)
    assert any("because lr differs" in text for text in advice)


def test_a_float64_reference_op_computed_in_float32_by_the_port_is_named_as_the_cause(tmp_path):
    ref_ops = trace_ops().assign(dtype="float64")
    actual_ops = trace_ops()
    actual_ops.loc[actual_ops["seq"] == 0, "mean"] *= 1.01  # the forward addmm of each step, in float32
    result = compare_runs(run(tmp_path / "ref", ref_ops, [0.1, 0.1], "cuda"),
                          run(tmp_path / "actual", actual_ops, [0.1, 0.1], "npu"))
    advice = [item.message for item in advise(result.findings) if item.code is FindingCode.OP_DIVERGES]
    assert advice[0].startswith("aten.addmm ran in float64 on the reference and in float32 on the port")
    assert not any("operator accuracy issue" in message for message in advice)


def _finding(code: FindingCode, step: int, **detail) -> "Finding":
    from verify.compare.findings import Finding
    return Finding(code, str(code), {"op": "aten.relu", "module": "Net", "phase": "forward", "step": step, **detail})


def test_an_op_diverging_after_a_changed_operator_gets_no_accuracy_advice():
    """Regression (issue 54): Lightning's backbone ported with gelu for its first relu FAILed naming the change, and
    the advice then called the next relu, whose inputs agree, "an operator accuracy issue"."""
    changed = _finding(FindingCode.OP_CHANGED, 0, actual_op="aten.gelu", original_call="aten.relu",
                       port_call="aten.gelu")
    diverges = _finding(FindingCode.OP_DIVERGES, 0)
    advice = [item.message for item in advise([changed, diverges])]
    assert advice[0].startswith("The port computes aten.gelu where the original computes aten.relu")
    assert not any("operator accuracy issue" in message for message in advice)


def test_a_changed_operator_after_the_first_diverging_step_leaves_the_accuracy_advice():
    changed = _finding(FindingCode.OP_CHANGED, 2, actual_op="aten.gelu")
    diverges = _finding(FindingCode.OP_DIVERGES, 0)
    assert any("operator accuracy issue" in item.message for item in advise([changed, diverges]))


def test_a_change_left_unpaired_at_its_first_step_is_named_at_that_step():
    """Regression (issue 54): Lightning's gelu for relu was unpaired at step 0 (only_ref relu, only_actual gelu) and
    paired from step 1, and the changed operator was named at step 1 where the ops tables show it at step 0."""
    from verify.compare.findings import _first_call_of_change

    rows = [
        dict(step=0, phase="forward", module="Lit.backbone", status="only_ref", ref_op="aten.relu", actual_op=None,
             ref_seq=17, ref_source="train.py:54", actual_source=None),
        dict(step=0, phase="forward", module="Lit.backbone", status="only_actual", ref_op=None, actual_op="aten.gelu",
             ref_seq=None, ref_source=None, actual_source="train_npu.py:57"),
        dict(step=1, phase="forward", module="Lit.backbone", status="sequence", ref_op="aten.relu",
             actual_op="aten.gelu", ref_seq=5, ref_source="train.py:54", actual_source="train_npu.py:57"),
    ]
    table = pd.DataFrame(rows)
    original, port = _first_call_of_change(table, table.loc[2])
    assert (original["step"], original["ref_op"], original["ref_seq"]) == (0, "aten.relu", 17)
    assert (port["step"], port["actual_op"], port["actual_source"]) == (0, "aten.gelu", "train_npu.py:57")
    original, port = _first_call_of_change(table.loc[[2]], table.loc[2])  # paired from its first step
    assert original is port and original["step"] == 1


def test_a_port_whose_ranks_read_other_shards_is_told_to_share_the_data_out_as_the_original():
    """Regression (issue 54): accelerate's nlp_example with its train dataloader left out of accelerator.prepare
    FAILed naming the sharding, and its advice said nothing of it."""
    from verify.compare.findings import Finding
    sharding = Finding(FindingCode.SHARDING, "rank 1 read the same samples as rank 0 at step 0", {"step": 0})
    [advice] = advise([sharding])
    assert advice.message.startswith("Share the data out to the ranks as the original does")
    assert "accelerator.prepare" in advice.message and advice.checklist == ("C7",)


def test_an_lr_that_differs_only_from_a_later_step_is_told_of_its_scheduler(tmp_path):
    """Regression (issue 54): PEFT's peft_no_lora_accelerate.py with its lr_scheduler.step() dropped FAILed on
    'lr ... from step 1', and the advice spoke of argparse defaults and config files."""
    result, advice = diverging_from((0, "optimizer"), [0.1, 0.2], tmp_path)
    [mismatch] = [f for f in result.findings if f.code is FindingCode.HPARAM_MISMATCH]
    assert mismatch.detail == {"name": "lr", "from_step": 1}
    assert advice[0].startswith("lr starts equal and differs from step 1: the port schedules it otherwise")
    assert not any(text.startswith("Make lr equal on both sides") for text in advice)
