"""The record schema has one owner (verify/record/schema.py): a statistic added there, and nowhere else, reaches every
report. Checked on a temporary copy of verify with one statistic more, comparing run directories that carry it."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_COMPARE_WITH_A_NEW_STATISTIC = """
import json, sys
from pathlib import Path
import pandas as pd
from typer.testing import CliRunner
from verify.cli import app
from verify.record.schema import OP_COLUMNS, RunManifest, op_key
from verify.record.store import RunWriter

def ops(relu_mean):
    rows = []
    for step in range(2):
        for seq, (module, op, mean) in enumerate([("Net.fc", "aten.addmm", 0.1), ("Net.act", "aten.relu", relu_mean)]):
            rows.append(dict(step=step, seq=seq, phase="forward", module=module, op=op, call_index=0, io="out0",
                             key=op_key(step=step, phase="forward", module=module, op=op, call_index=0),
                             dtype="float32", shape="4x8", numel=32, min=-1.0, max=1.0, mean=mean, l2_norm=3.0,
                             nan_count=0, inf_count=0, md5="", tensor_file="", inputs=str(seq - 1) if seq else "",
                             abs_mean=abs(mean) + 1.0))
    return pd.DataFrame(rows).astype(OP_COLUMNS)

out = Path(sys.argv[1])
for side, relu_mean in (("ref", 0.2), ("actual", 0.7)):
    root = out / side
    root.mkdir(parents=True)
    manifest = RunManifest(script="train.py", script_sha256=side, device="cpu", status="ok", steps_requested=2,
                           steps_completed=2)
    (root / "manifest.json").write_text(json.dumps(manifest.to_json()))
    pd.DataFrame({"step": [0, 1], "micro_step": 0, "loss": [2.0, 1.5], "loss_scale": None, "wall_ms": 1.0}).to_csv(
        root / "losses.csv", index=False)
    writer = RunWriter(root)
    for step, part in ops(relu_mean).groupby("step"):
        writer.write_step_table("ops", step, {column: part[column].tolist() for column in part.columns})
    writer.close()
result = CliRunner().invoke(app, ["compare", str(out / "ref"), str(out / "actual"), "-o", str(out / "reports")])
print(result.exit_code)
"""


def test_a_statistic_added_to_the_schema_reaches_csv_html_and_json(tmp_path):
    copy = tmp_path / "project"
    shutil.copytree(ROOT / "verify", copy / "verify", ignore=shutil.ignore_patterns("__pycache__"))
    schema = copy / "verify" / "record" / "schema.py"
    text = schema.read_text()
    text = text.replace('STAT_COLUMNS = ("min", "max", "mean", "l2_norm", "nan_count", "inf_count")',
                        'STAT_COLUMNS = ("min", "max", "mean", "l2_norm", "nan_count", "inf_count", "abs_mean")')
    text = text.replace('    "inputs": "string",\n}', '    "inputs": "string",\n    "abs_mean": "float64",\n}', 1)
    assert text.count("abs_mean") == 2
    schema.write_text(text)
    done = subprocess.run([sys.executable, "-c", _COMPARE_WITH_A_NEW_STATISTIC, str(tmp_path / "runs")],
                          env={"PYTHONPATH": str(copy), "PATH": "/usr/bin:/bin"}, cwd=tmp_path, capture_output=True,
                          text=True)
    assert done.stdout.split()[-1] == "1", done.stdout + done.stderr
    reports = tmp_path / "runs" / "reports"
    header = (reports / "ops.csv").read_text().splitlines()[0].split(",")
    assert {"ref_abs_mean", "actual_abs_mean"} <= set(header)
    assert "ref_abs_mean" in (reports / "report.html").read_text()
    first = json.loads((reports / "summary.json").read_text())["first_divergent"]
    assert first["ref"]["abs_mean"] != first["actual"]["abs_mean"]
