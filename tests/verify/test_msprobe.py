"""msprobe dumps as a comparison side (8.x and 26.x layouts, record variants), and export back to msprobe."""

import json
import math

import pytest

from test_compare import trace_ops, with_noise, write_run
from verify.record import msprobe
from verify.compare.runs import compare_runs
from verify.errors import CompareError
from verify.record.evidence import read_side


def tensor(mx, mn, mean, norm, dtype="torch.float32", shape=(4, 4), **extra):
    return {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape), "Max": mx, "Min": mn, "Mean": mean,
            "Norm": norm, "requires_grad": True, **extra}


def dump(version: str, conv_norm: float = 10.0) -> dict:
    """One step of a small model as each msprobe version writes it (dump-and-compare.md §2)."""
    forward_extra = {"is_recompute": False} if version == "8" else {}
    grad_key = "Module.conv1.Conv2d.parameters_grad" + ("" if version == "8" else ".0")
    return {"task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None, "data": {
        "Functional.conv2d.0.forward": {
            "input_args": [tensor(1.0, -1.0, 0.0, 4.0), tensor(0.5, -0.5, 0.0, 1.0),
                           [{"type": "int", "value": 1}, {"type": "int", "value": 1}]],
            "input_kwargs": {}, "output": [tensor(3.0, -3.0, 0.1, conv_norm)], **forward_extra},
        "Tensor.add_.0.forward": {"input_args": [tensor(3.0, -3.0, 0.1, conv_norm)],
                                  "input_kwargs": {"alpha": {"type": "float", "value": -0.01}},
                                  "output": [tensor(float("inf"), -3.0, None, None)], **forward_extra},
        "Torch.argmax.0.forward": {"input_args": [tensor(True, False, None, None, dtype="torch.bool")],
                                   "input_kwargs": {}, "output": [tensor(7, 0, None, None, dtype="torch.int64")]},
        "Functional.conv2d.0.backward": {"input": [tensor(0.1, -0.1, 0.0, 0.5)],
                                         "output": [tensor(0.2, -0.2, 0.0, 0.7), None]},
        grad_key: {"weight": [tensor(0.01, -0.01, 0.0, 0.05)]},
    }}


def write_dump(root, version: str, steps: int = 2, **kwargs):
    process = "rank" if version == "8" else "proc4242"
    for step in range(steps):
        folder = root / f"step{step}" / process
        folder.mkdir(parents=True)
        (folder / "dump.json").write_text(json.dumps(dump(version, **kwargs)))
        (folder / "construct.json").write_text(json.dumps({"Functional.conv2d.0.forward":
                                                           "Module.conv1.Conv2d.forward.0"}))
        (folder / "stack.json").write_text("{}")
    return root


@pytest.mark.parametrize("version", ["8", "26"])
def test_reader_maps_both_layouts(tmp_path, version):
    run = read_side(write_dump(tmp_path / "dump", version))
    assert run.source == f"msprobe dump ({'8.x' if version == '8' else '26.x'} layout)"
    ops = run.ops
    assert sorted(ops["step"].unique()) == [0, 1]
    conv = ops.loc[(ops["step"] == 0) & (ops["op"] == "Functional.conv2d") & (ops["phase"] == "forward")]
    assert conv["io"].tolist() == ["in0", "in1", "out0"] and set(conv["module"]) == {"conv1"}
    assert conv["key"].iloc[0] == "0/forward/conv1/Functional.conv2d#0"
    add = ops.loc[(ops["op"] == "Tensor.add_") & (ops["io"] == "out0")].iloc[0]
    assert add["inf_count"] == 1 and math.isnan(add["mean"])
    assert ops.loc[ops["op"] == "Torch.argmax", "dtype"].tolist()[:2] == ["bool", "int64"]
    backward = ops.loc[(ops["op"] == "Functional.conv2d") & (ops["phase"] == "backward") & (ops["step"] == 0)]
    assert backward["io"].tolist() == ["in0", "out0"]  # the null gradient is skipped
    grads = ops.loc[ops["op"] == "Module.Conv2d.parameters_grad"]
    assert grads["io"].iloc[0] == "grad_weight.0" and grads["module"].iloc[0] == "conv1"


def test_dump_versions_compare_to_each_other_and_name_the_divergent_op(tmp_path):
    ref = read_side(write_dump(tmp_path / "ref", "8"))
    actual = read_side(write_dump(tmp_path / "actual", "26", conv_norm=12.0))
    result = compare_runs(ref, actual)
    assert result.first_divergent["op"] == "Functional.conv2d"
    assert result.first_divergent["inputs_evidence"] == "its recorded inputs agree"
    assert result.status_counts()["only_ref"] == 0 and result.status_counts()["only_actual"] == 0


def test_step_dir_process_dir_and_file_are_accepted(tmp_path):
    root = write_dump(tmp_path / "dump", "26")
    for path in (root / "step1", root / "step1" / "proc4242", root / "step1" / "proc4242" / "dump.json"):
        assert len(read_side(path).ops) == len(read_side(root).ops) // 2


def test_broken_dump_is_a_clear_error(tmp_path):
    folder = tmp_path / "dump" / "step0" / "rank"
    folder.mkdir(parents=True)
    (folder / "dump.json").write_text('{"task": "statistics", "data": {"Functional.relu.0.forward": {"in')
    with pytest.raises(CompareError, match="not a readable msprobe dump.json"):
        read_side(tmp_path / "dump")


def test_unsafe_tensor_names_are_not_followed(tmp_path):
    data = dump("26")
    data["data"]["Functional.conv2d.0.forward"]["output"][0]["data_name"] = "../../secret.npy"
    folder = tmp_path / "dump" / "step0" / "proc1"
    folder.mkdir(parents=True)
    (folder / "dump.json").write_text(json.dumps(data))
    run = read_side(tmp_path / "dump")
    assert (run.ops["tensor_file"] == "").all()
    assert any("not read" in note for note in run.notes)


@pytest.mark.parametrize("layout", list(msprobe.Layout))
def test_export_round_trips_through_the_reader(tmp_path, layout):
    two_steps = {"steps_requested": 2, "steps_completed": 2}  # as many as the op records hold
    run = read_side(write_run(tmp_path / "run", ops=trace_ops(steps=2), **two_steps))
    written = msprobe.write_dump(run, tmp_path / "exported", layout)
    assert [p.name for p in written] == ["proc0" if layout is msprobe.Layout.PROC else "rank"] * 2
    first = json.loads((written[0] / "dump.json").read_text())
    entry = first["data"]["Aten.convolution.0.forward"]
    assert list(entry["output"][0]) == ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"]
    back = read_side(tmp_path / "exported")
    assert back.ops["l2_norm"].tolist() == run.ops.sort_values(["step", "seq"])["l2_norm"].tolist()
    # msprobe names carry no module or phase: two exports pair with each other, entry by entry.
    other = read_side(write_run(tmp_path / "other", ops=with_noise(trace_ops(steps=2)), **two_steps))
    msprobe.write_dump(other, tmp_path / "other_exported", layout)
    result = compare_runs(back, read_side(tmp_path / "other_exported"))
    assert result.status_counts()["exact"] == len(run.ops) and result.first_divergent is None
