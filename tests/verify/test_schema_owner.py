"""A statistic of a tensor has one owner, the table in verify/record/statistics.py: a row added there, and nowhere else,
is computed by the capture of a real run, written to its records, compared, and reaches every report and the msprobe
export. Checked on a temporary copy of verify with one row more: two real trainings through `verify run`, then
`verify compare` and `verify export --msprobe`."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY_TRAIN = ROOT / "tests" / "verify" / "scripts" / "tiny_train.py"
LAST_ROW = '    Statistic("inf_count", "int64", ("isinf", "sum"), True, Comparison.PRESENCE),\n'
NEW_ROW = '    Statistic("abs_mean", "float64", ("abs", "mean"), False, Comparison.MAGNITUDE, "AbsMean"),\n'

pytestmark = pytest.mark.slow  # three real child processes of verify, a few seconds each


@pytest.fixture(scope="module")
def runs_with_abs_mean(tmp_path_factory):
    """Two 3-step trainings of tests/verify/scripts/tiny_train.py (other seeds: they diverge) by a copy of verify whose
    table has abs_mean, the first saving its ops' tensors, their comparison's reports and the msprobe export of the
    first."""
    tmp_path = tmp_path_factory.mktemp("abs_mean")
    copy = tmp_path / "project"
    shutil.copytree(ROOT / "verify", copy / "verify", ignore=shutil.ignore_patterns("__pycache__"))
    table = copy / "verify" / "record" / "statistics.py"
    text = table.read_text()
    assert text.count(LAST_ROW) == 1
    table.write_text(text.replace(LAST_ROW, LAST_ROW + NEW_ROW))
    environment = {**os.environ, "PYTHONPATH": str(copy)}

    def verify(*arguments: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-P", "-m", "verify", *arguments], env=environment, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)

    for side, seed, dump in (("ref", "1", "tensor"), ("actual", "2", "stats")):
        done = verify("run", str(TINY_TRAIN), "-n", "3", "--device", "cpu", "--seed", seed, "--dump", dump, "-o",
                      str(tmp_path / side))
        assert done.returncode == 0, done.stdout + done.stderr
    compared = verify("compare", str(tmp_path / "ref"), str(tmp_path / "actual"), "-o", str(tmp_path / "reports"))
    assert compared.returncode == 1, compared.stdout + compared.stderr  # other seeds: FAIL, with a first divergence
    exported = verify("export", str(tmp_path / "ref"), str(tmp_path / "msprobe"), "--msprobe")
    assert exported.returncode == 0, exported.stdout + exported.stderr
    return tmp_path


def _table(run: Path, folder: str) -> pd.DataFrame:
    with pa.ipc.open_stream(run / folder / "steps.arrows") as reader:
        return reader.read_all().to_pandas()


def test_the_capture_computes_a_new_statistic_into_the_records(runs_with_abs_mean):
    """Each op's abs_mean is the mean magnitude of the tensor the same run saved; each gradient's lies between 0 and
    its largest magnitude, and below its root mean square."""
    run = runs_with_abs_mean / "ref"
    ops = _table(run, "ops")
    assert list(ops.columns)[list(ops.columns).index("inf_count") + 1] == "abs_mean"
    # outputs only: an in-place init's input is the allocator's memory, any values (a float32 mean of them once
    # overflowed to inf where numpy's float64 mean did not)
    saved = ops.loc[(ops["tensor_file"] != "") & (ops["dtype"] == "float32") & ops["io"].str.startswith("out")]
    assert len(saved) > 50
    expected = [np.abs(np.load(run / name).astype(np.float64)).mean() for name in saved["tensor_file"]]
    assert saved["abs_mean"].tolist() == pytest.approx(expected, rel=1e-5, nan_ok=True)
    grads = _table(run, "grads")
    assert list(grads.columns)[-1] == "abs_mean" and len(grads) > 0
    largest = grads[["min", "max"]].abs().max(axis=1)
    root_mean_square = grads["norm"] / grads["numel"].map(math.sqrt)
    assert ((grads["abs_mean"] > 0) & (grads["abs_mean"] <= largest * (1 + 1e-6))).all()
    assert (grads["abs_mean"] <= root_mean_square * (1 + 1e-6)).all()


def test_a_new_statistic_reaches_csv_html_json_and_the_msprobe_export(runs_with_abs_mean):
    reports = runs_with_abs_mean / "reports"
    ops = pd.read_csv(reports / "ops.csv")
    assert {"ref_abs_mean", "actual_abs_mean", "abs_mean_diff"} <= set(ops.columns)
    assert ops["ref_abs_mean"].notna().any()
    assert "ref_abs_mean" in (reports / "report.html").read_text()
    first = json.loads((reports / "summary.json").read_text())["first_divergent"]
    assert {"abs_mean"} <= first["ref"].keys() & first["actual"].keys()
    assert first["ref"]["abs_mean"] != first["actual"]["abs_mean"]
    dump = json.loads(next((runs_with_abs_mean / "msprobe").glob("step0/proc0/dump.json")).read_text())
    tensors = [tensor for entry in dump["data"].values() for tensor in entry["output"]]
    assert tensors and all("AbsMean" in tensor for tensor in tensors)
    assert list(tensors[0])[3:8] == ["Max", "Min", "Mean", "Norm", "AbsMean"]  # msprobe's own fields keep their order
