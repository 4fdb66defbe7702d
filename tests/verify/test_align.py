"""align_ops: exact, related and sequence passes, and nothing dropped; the user's op mapping file in a comparison."""

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import Result
from typer.testing import CliRunner

from verify.cli import app
from verify.compare.align import align_ops
from verify.compare.op_catalogue import ONE_SIDED
from verify.record.schema import OP_COLUMNS, RunManifest
from verify.record.store import RunWriter


def ops(calls: list[tuple[str, str]], step: int = 0, phase: str = "forward", shape: str = "4x4") -> pd.DataFrame:
    """(module, op) calls in execution order, one out0 record each, statistics numbering the call."""
    frame = pd.DataFrame(calls, columns=["module", "op"]).assign(step=step, phase=phase, io="out0", dtype="float32",
                                                                  shape=shape, numel=16, nan_count=0, inf_count=0,
                                                                  md5="", tensor_file="", inputs="", source="", attrs="")
    frame["seq"] = range(len(frame))
    frame["call_index"] = frame.groupby(["module", "op"]).cumcount()
    frame["key"] = [f"{step}/{phase}/{module}/{op}#{index}" for module, op, index in
                    zip(frame["module"], frame["op"], frame["call_index"])]
    frame = frame.assign(min=-1.0, max=1.0, mean=0.0, l2_norm=4.0)
    return frame[list(OP_COLUMNS)].astype(OP_COLUMNS)


def pairs(table: pd.DataFrame) -> list[tuple]:
    return list(zip(table["status"].astype(str), table["ref_op"].astype(object).where(table["ref_op"].notna(), None),
                    table["actual_op"].astype(object).where(table["actual_op"].notna(), None)))


def test_exact_keys_pair_and_keep_reference_order():
    calls = [("m", "aten.mm"), ("m", "aten.add"), ("m", "aten.mm")]
    table = align_ops(ops(calls), ops(calls))
    assert pairs(table) == [("exact", "aten.mm", "aten.mm"), ("exact", "aten.add", "aten.add"),
                            ("exact", "aten.mm", "aten.mm")]
    assert table["ref_seq"].tolist() == table["actual_seq"].tolist() == [0, 1, 2]


def test_related_ops_pair_when_both_sides_have_the_same_number_of_calls():
    ref = ops([("m", "aten.gelu"), ("m", "aten.mm"), ("m", "aten.gelu")])
    actual = ops([("m", "npu.npu_fast_gelu"), ("m", "aten.mm"), ("m", "aten.gelu")])
    table = align_ops(ref, actual)
    assert sorted(pairs(table)) == [("exact", "aten.gelu", "aten.gelu"), ("exact", "aten.mm", "aten.mm"),
                                    ("related", "aten.gelu", "npu.npu_fast_gelu")]


def test_a_missing_call_leaves_the_rest_to_sequence_matching():
    # The port drops the first add: exact keys now pair add#0 with the ref's add#1, whose shapes differ.
    ref = pd.concat([ops([("m", "aten.add")], shape="2x2"), ops([("m", "aten.mul"), ("m", "aten.add")])])
    ref = ref.assign(seq=range(3), call_index=[0, 0, 1], key=["0/forward/m/aten.add#0", "0/forward/m/aten.mul#0",
                                                              "0/forward/m/aten.add#1"])
    actual = ops([("m", "aten.mul"), ("m", "aten.add")])
    table = align_ops(ref.astype(OP_COLUMNS), actual)
    assert pairs(table) == [("only_ref", "aten.add", None), ("exact", "aten.mul", "aten.mul"),
                            ("sequence", "aten.add", "aten.add")]


def test_unmatched_ops_stay_as_rows_with_notes_for_expected_ones():
    ref = ops([("m", "aten.mm"), ("m", "aten.relu")])
    actual = ops([("m", "aten._to_copy"), ("m", "aten.mm"), ("other", "aten.sum")])
    table = align_ops(ref, actual)
    assert len(table) == 4
    assert sorted(pairs(table), key=str) == sorted([("exact", "aten.mm", "aten.mm"), ("only_ref", "aten.relu", None),
                                                    ("only_actual", None, "aten._to_copy"),
                                                    ("only_actual", None, "aten.sum")], key=str)
    notes = dict(zip(table["actual_op"].astype(str), table["note"].astype(object)))
    assert notes["aten._to_copy"] == ONE_SIDED["aten._to_copy"]
    assert pd.isna(notes["aten.sum"])



def test_a_swapped_op_pairs_with_the_op_it_replaced_but_a_one_sided_cast_does_not():
    ref = ops([("m", "aten.mm"), ("act", "aten.relu"), ("act", "aten.relu")])
    actual = ops([("m", "aten.mm"), ("act", "aten.gelu"), ("act", "aten._to_copy")])
    assert sorted(pairs(align_ops(ref, actual)), key=str) == sorted([
        ("exact", "aten.mm", "aten.mm"), ("sequence", "aten.relu", "aten.gelu"), ("only_ref", "aten.relu", None),
        ("only_actual", None, "aten._to_copy")], key=str)


def test_steps_and_phases_never_pair_across():
    ref = pd.concat([ops([("m", "aten.mm")], step=0), ops([("m", "aten.mm")], step=1, phase="backward")])
    actual = pd.concat([ops([("m", "aten.mm")], step=1), ops([("m", "aten.mm")], step=0, phase="backward")])
    table = align_ops(ref, actual)
    assert sorted(table["status"].astype(str)) == ["only_actual", "only_actual", "only_ref", "only_ref"]


def test_empty_sides():
    empty = ops([])
    assert align_ops(empty, empty).empty
    table = align_ops(ops([("m", "aten.mm")]), empty)
    assert pairs(table) == [("only_ref", "aten.mm", None)]



def test_a_swapped_function_pairs_and_the_same_function_after_it_still_pairs():
    """F.relu swapped for F.gelu in a module that calls F.relu again later (pytorch/examples mnist's Net.forward): the
    sequence pass numbered signatures per side, so the later relu, identical on both sides, paired with nothing."""
    ref = pd.concat([ops([("Net", "aten.relu")], shape="8x26"), ops([("Net", "aten.relu")], shape="8x24")])
    actual = pd.concat([ops([("Net", "aten.gelu")], shape="8x26"), ops([("Net", "aten.relu")], shape="8x24")])
    for frame in (ref, actual):
        frame["seq"] = range(len(frame))
        frame["call_index"] = frame.groupby(["module", "op"]).cumcount()
    table = align_ops(ref, actual)
    assert pairs(table) == [("sequence", "aten.relu", "aten.gelu"), ("sequence", "aten.relu", "aten.relu")]


# --- the user's op mapping file, in a real comparison ----------------------------------------------------------------

FUSED_PORT = [("Block", "npu.npu_add_layer_norm"), ("Block", "aten.mm")]  # the port calls torch_npu's fused kernel
EAGER_REFERENCE = [("Block", "aten.add"), ("Block", "aten.native_layer_norm"), ("Block", "aten.mm")]


def write_run(root: Path, calls: list[tuple[str, str]]) -> Path:
    """A run directory as `verify run` writes it, of one step whose ops are `calls`."""
    root.mkdir(parents=True)
    manifest = RunManifest(script=str(root / "train.py"), script_sha256=root.name, device="cpu", seed=0, status="ok",
                           steps_requested=1, steps_completed=1)
    (root / "manifest.json").write_text(json.dumps(manifest.to_json()))
    writer = RunWriter(root)
    writer.append_losses([(0, 0, 2.3, None, 10.0)])
    writer.write_step_table("ops", 0, ops(calls).to_dict("list"))
    writer.close()
    return root


def compare(tmp_path: Path, *options: str) -> Result:
    return CliRunner().invoke(app, ["compare", str(write_run(tmp_path / "ref", EAGER_REFERENCE)),
                                    str(write_run(tmp_path / "actual", FUSED_PORT)), "-o", str(tmp_path / "out"),
                                    *options])


def test_a_mapping_file_pairs_the_ports_fused_kernel_with_the_reference_op(tmp_path):
    mapping = tmp_path / "my_kernels.json"
    mapping.write_text(json.dumps({"related": {"npu.npu_add_layer_norm": "aten.native_layer_norm"}}))
    compared = compare(tmp_path, "--op-mapping", str(mapping))
    assert compared.exit_code == 0, compared.output
    table = pd.read_csv(tmp_path / "out" / "ops.csv")
    assert sorted(zip(table["status"], table["ref_op"].fillna(""), table["actual_op"].fillna(""))) == [
        ("exact", "aten.mm", "aten.mm"), ("only_ref", "aten.add", ""),  # the add the fused kernel absorbed
        ("related", "aten.native_layer_norm", "npu.npu_add_layer_norm")]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert f"ops paired by the op mapping file {mapping} too" in summary["notes"]


def test_without_the_mapping_file_the_fused_kernel_pairs_with_nothing(tmp_path):
    assert compare(tmp_path).exit_code in (0, 1)
    table = pd.read_csv(tmp_path / "out" / "ops.csv")
    assert table.loc[table["actual_op"] == "npu.npu_add_layer_norm", "status"].tolist() == ["only_actual"]
    assert table.loc[table["ref_op"] == "aten.native_layer_norm", "status"].tolist() == ["only_ref"]


@pytest.mark.parametrize(("content", "what"), [
    ("{not json", "is not valid JSON"),
    ('["npu.npu_add_layer_norm"]', "holds a JSON list, not an object"),
    ('{"releated": {}}', "unknown key 'releated'"),
    ('{"related": {"npu.npu_add_layer_norm": []}}', "must be an op name or a non-empty list of op names"),
    ('{"related": {"npu_add_layer_norm": "aten.native_layer_norm"}}', "'npu_add_layer_norm' is not an op name"),
    ('{"one_sided": {"npu.npu_format_cast": 3}}', "must be the note shown for it"),
])
def test_a_bad_mapping_file_is_verifys_error_naming_the_file(tmp_path, content, what):
    mapping = tmp_path / "bad.json"
    mapping.write_text(content)
    compared = compare(tmp_path, "--op-mapping", str(mapping))
    assert compared.exit_code == 2 and "Traceback" not in compared.output
    line = " ".join(compared.stderr.split())
    assert f"op mapping file {mapping}" in line and what in line


def test_the_pair_command_reads_its_mapping_file_before_running_anything(tmp_path):
    for script in ("train.py", "train_npu.py"):
        (tmp_path / script).write_text("raise SystemExit('must not run')\n")
    missing = tmp_path / "missing.json"
    paired = CliRunner().invoke(app, ["pair", str(tmp_path / "train.py"), "--op-mapping", str(missing), "-o",
                                      str(tmp_path / "out")])
    assert paired.exit_code == 2 and f"op mapping file {missing}: cannot be read" in " ".join(paired.stderr.split())
    assert not (tmp_path / "out").exists()
