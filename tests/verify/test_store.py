"""The run-directory reader and writer, on directories written here (no torch, no child process)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from verify.schema import GRAD_COLUMNS, LOSSES, OP_COLUMNS, OPS_DIR, RunManifest, step_file
from verify.store import RunDirError, RunWriter, read_run, write_manifest


def write_run(run_dir, steps: int = 2):
    run_dir.mkdir(exist_ok=True)
    write_manifest(run_dir, RunManifest(script="train.py", steps_requested=steps, steps_completed=steps))
    writer = RunWriter(run_dir)
    for step in range(steps):
        writer.append_losses([(step, 0, 1.0 / (step + 1), None, 3.5)])
        writer.append_hparams([(step, "", "optimizer", "SGD", 0), (step, 0, "betas", [0.9, 0.99], 0)])
        writer.write_step_table(OPS_DIR, step, {
            "step": [step, step], "seq": [0, 1], "phase": ["forward", "backward"], "module": ["Net.fc", ""],
            "op": ["aten.addmm", "aten.mm"], "call_index": [0, 0], "io": ["out0", "out0"],
            "key": [f"{step}/forward/Net.fc/aten.addmm#0", f"{step}/backward//aten.mm#0"], "dtype": ["float32"] * 2,
            "shape": ["2x3", "3x3"], "numel": [6, 9], "min": [-1.0, None], "max": [2.0, None],
        })
    writer.close()
    return run_dir


def test_round_trip_keeps_the_schema_types(tmp_path):
    run = read_run(write_run(tmp_path))
    assert run.manifest.script == "train.py" and not run.warnings
    assert dict(run.ops.dtypes.astype(str)) == {name: dtype for name, dtype in OP_COLUMNS.items()}
    assert run.ops["key"].tolist()[:2] == ["0/forward/Net.fc/aten.addmm#0", "0/backward//aten.mm#0"]
    assert run.ops["min"].isna().tolist() == [False, True, False, True] and run.ops["md5"].eq("").all()
    assert run.losses["loss"].tolist() == [1.0, 0.5] and run.losses["loss_scale"].isna().all()
    assert run.hparams["value"].tolist() == ["SGD", [0.9, 0.99]] * 2
    assert run.grads.empty and list(run.grads.columns) == list(GRAD_COLUMNS)


def test_truncated_step_file_and_csv_line_are_skipped_with_a_warning(tmp_path):
    write_run(tmp_path)
    last = tmp_path / OPS_DIR / step_file(1)
    last.write_bytes(last.read_bytes()[:40])
    with (tmp_path / LOSSES).open("a") as losses:
        losses.write("2,0,0.3")  # cut mid-row: no loss_scale, no wall_ms, no newline
    with pytest.warns(UserWarning, match="step-000001"):
        run = read_run(tmp_path)
    assert set(run.ops["step"]) == {0}
    assert run.losses["step"].tolist() in ([0, 1], [0, 1, 2])  # a short row is kept only if its numbers parse
    assert any("step-000001" in warning for warning in run.warnings)


def test_missing_or_corrupt_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(RunDirError, match="not a run directory"):
        read_run(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(RunDirError, match="not a valid manifest"):
        read_run(tmp_path)


@pytest.mark.parametrize("name", ["../outside.npy", "/etc/passwd", "tensors/../../outside.npy", ""])
def test_names_outside_the_run_directory_are_refused(tmp_path, name):
    run = read_run(write_run(tmp_path / "run"))
    (tmp_path / "outside.npy").write_bytes(b"")
    with pytest.raises(RunDirError, match="refusing"):
        run.load_array(name)


def test_arrays_round_trip_and_pickles_are_never_loaded(tmp_path):
    writer = RunWriter(write_run(tmp_path))
    writer.save_array("tensors/a.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    np.save(tmp_path / "tensors" / "evil.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    run = read_run(tmp_path)
    assert run.load_array("tensors/a.npy").tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="allow_pickle"):
        run.load_array("tensors/evil.npy")


def test_reader_works_without_torch(tmp_path):
    write_run(tmp_path)
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any import of torch now fails
        "from verify.store import read_run\n"
        f"run = read_run({str(tmp_path)!r})\n"
        "print(len(run.ops), 'torch' in sys.modules and sys.modules['torch'] is not None)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["4", "False"]
