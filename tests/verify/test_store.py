"""The run-directory reader and writer, on directories written here (no torch, no child process)."""

from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np
import pytest

from verify.record.schema import GRAD_COLUMNS, LOSSES, OP_COLUMNS, OPS_DIR, TABLE_FILE, RunManifest
from verify.record.store import RunWriter, read_run, write_manifest
from verify.errors import RunDirError


def op_columns(step: int) -> dict[str, list]:
    """Two op records of `step`, as the capture hands them over (md5, tensor_file and some statistics left out)."""
    return {
        "step": [step, step], "seq": [0, 1], "phase": ["forward", "backward"], "module": ["Net.fc", ""],
        "op": ["aten.addmm", "aten.mm"], "call_index": [0, 0], "io": ["out0", "out0"],
        "key": [f"{step}/forward/Net.fc/aten.addmm#0", f"{step}/backward//aten.mm#0"], "dtype": ["float32"] * 2,
        "shape": ["2x3", "3x3"], "numel": [6, 9], "min": [-1.0, None], "max": [2.0, None],
    }


def write_run(run_dir, steps: int = 2) -> list[int]:
    """Writes a run of `steps` steps; returns the size of the ops stream after each step (it grows as it goes)."""
    run_dir.mkdir(exist_ok=True)
    write_manifest(run_dir, RunManifest(script="train.py", steps_requested=steps, steps_completed=steps))
    writer = RunWriter(run_dir)
    sizes = []
    for step in range(steps):
        writer.append_losses([(step, 0, 1.0 / (step + 1), None, 3.5)])
        writer.append_hparams([(step, "", "optimizer", "SGD", 0), (step, 0, "betas", [0.9, 0.99], 0)])
        writer.write_step_table(OPS_DIR, step, op_columns(step))
        writer.write_step_table("grads", step, {})  # as the recorder does at every step, if only an empty batch
        sizes.append((run_dir / OPS_DIR / TABLE_FILE).stat().st_size)
    writer.close()
    return sizes


def test_round_trip_keeps_the_schema_types(tmp_path):
    write_run(tmp_path)
    run = read_run(tmp_path)
    assert run.manifest.script == "train.py" and not run.notes
    assert dict(run.ops.dtypes.astype(str)) == {name: dtype for name, dtype in OP_COLUMNS.items()}
    assert run.ops["key"].tolist()[:2] == ["0/forward/Net.fc/aten.addmm#0", "0/backward//aten.mm#0"]
    assert run.ops["min"].isna().tolist() == [False, True, False, True] and run.ops["md5"].eq("").all()
    assert run.losses["loss"].tolist() == [1.0, 0.5] and run.losses["loss_scale"].isna().all()
    assert run.hparams["value"].tolist() == ["SGD", [0.9, 0.99]] * 2
    assert run.grads.empty and list(run.grads.columns) == list(GRAD_COLUMNS)
    assert not (tmp_path / "outputs").exists()  # a table never written


@pytest.mark.parametrize("version", [4, 5])
def test_the_settings_of_top_level_calls_read_as_missing_from_a_run_that_did_not_record_them(tmp_path, version):
    """Schema 4 recorded a forward call's settings only: its top-level calls' "" is no setting against a newer run's
    (a loss's beta=2 would read as changed)."""
    write_manifest(tmp_path, RunManifest(script="train.py", steps_requested=1, steps_completed=1,
                                         schema_version=version))
    writer = RunWriter(tmp_path)
    writer.append_losses([(0, 0, 1.0, None, 3.5)])
    writer.write_step_table(OPS_DIR, 0, {
        "step": [0, 0], "seq": [0, 1], "phase": ["forward", "other"], "module": ["Net.act", ""],
        "op": ["aten.gelu", "aten.smooth_l1_loss"], "call_index": [0, 0], "io": ["out0", "out0"],
        "key": ["0/forward/Net.act/aten.gelu#0", "0/other//aten.smooth_l1_loss#0"], "attrs": ["", ""]})
    writer.write_step_table("grads", 0, {})
    writer.close()
    attrs = read_run(tmp_path).ops["attrs"]
    assert attrs.isna().tolist() == [False, version == 4]


def test_truncated_stream_and_csv_line_are_skipped_with_a_warning(tmp_path):
    sizes = write_run(tmp_path)
    stream = tmp_path / OPS_DIR / TABLE_FILE
    stream.write_bytes(stream.read_bytes()[: sizes[0] + 40])  # step 1's batch cut short
    with (tmp_path / LOSSES).open("a") as losses:
        losses.write("2,0,0.3")  # cut mid-row: no loss_scale, no wall_ms, no newline
    with pytest.warns(UserWarning, match=f"{OPS_DIR}/{TABLE_FILE}"):
        run = read_run(tmp_path)
    assert set(run.ops["step"]) == {0}
    assert run.losses["step"].tolist() in ([0, 1], [0, 1, 2])  # a short row is kept only if its numbers parse
    assert any(f"{OPS_DIR}/{TABLE_FILE} is damaged at byte {sizes[0]}, in the batch after step 0's" in note
               and note.endswith("read the 1 step(s) before it") for note in run.notes)


def metadata_end(data: bytes, start: int) -> int:
    """Where the body of the IPC message at `start` begins: a message is a 4-byte continuation marker, the 4-byte
    length of its metadata, the metadata, then the body."""
    return start + 8 + int.from_bytes(data[start + 4 : start + 8], "little")


@pytest.mark.parametrize("part", ["metadata", "body"])
def test_a_stream_cut_inside_a_batch_keeps_the_steps_before_it(tmp_path, part):
    sizes = write_run(tmp_path, steps=3)
    stream = tmp_path / OPS_DIR / TABLE_FILE
    data = stream.read_bytes()
    third_batch, its_body = sizes[1], metadata_end(data, sizes[1])
    stream.write_bytes(data[: (third_batch + its_body) // 2 if part == "metadata" else (its_body + sizes[2]) // 2])
    with pytest.warns(UserWarning, match=r"read the 2 step\(s\) before it"):
        run = read_run(tmp_path)
    assert run.ops["step"].tolist() == [0, 0, 1, 1]
    assert dict(run.ops.dtypes.astype(str)) == OP_COLUMNS


def test_a_stream_cut_inside_its_schema_reads_as_an_empty_table(tmp_path):
    write_run(tmp_path)
    stream = tmp_path / OPS_DIR / TABLE_FILE
    data = stream.read_bytes()
    stream.write_bytes(data[: metadata_end(data, 0) // 2])
    with pytest.warns(UserWarning, match=r"in its schema: .*read the 0 step\(s\)"):
        run = read_run(tmp_path)
    assert run.ops.empty and dict(run.ops.dtypes.astype(str)) == OP_COLUMNS


def test_a_writer_killed_without_closing_keeps_every_step_written(tmp_path):
    write_manifest(tmp_path, RunManifest(script="train.py", steps_requested=3))
    code = (
        "import os, signal, sys\n"
        "from verify.record.store import RunWriter\n"
        "writer = RunWriter(sys.argv[1])\n"
        "for step in range(3):\n"
        "    writer.write_step_table('ops', step, {'seq': [0, 1]})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"  # no close(): no end-of-stream marker
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=False)
    assert done.returncode == -signal.SIGKILL
    run = read_run(tmp_path)
    assert run.ops["step"].tolist() == [0, 0, 1, 1, 2, 2] and run.notes == ["no loss recorded"]  # only ops were written


def test_missing_or_corrupt_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(RunDirError, match="not a run directory"):
        read_run(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(RunDirError, match="not a valid manifest"):
        read_run(tmp_path)


@pytest.mark.parametrize("name", ["../outside.npy", "/etc/passwd", "tensors/../../outside.npy", ""])
def test_names_outside_the_run_directory_are_refused(tmp_path, name):
    write_run(tmp_path / "run")
    run = read_run(tmp_path / "run")
    (tmp_path / "outside.npy").write_bytes(b"")
    with pytest.raises(RunDirError, match="refusing"):
        run.load_array(name)


def test_arrays_round_trip_and_pickles_are_never_loaded(tmp_path):
    write_run(tmp_path)
    writer = RunWriter(tmp_path)
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
        "from verify.record.store import read_run\n"
        f"run = read_run({str(tmp_path)!r})\n"
        "print(len(run.ops), 'torch' in sys.modules and sys.modules['torch'] is not None)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["4", "False"]


def test_a_run_of_several_ranks_reads_each_rank_and_the_run_manifest(tmp_path):
    """run_folders' layout: RUN/manifest.json for the run, RUN/rankK/ for each rank; rank 0's records stand for the
    run, every rank's Run is in `ranks`, and a rank that left no manifest is named."""
    from verify.record.run_folders import rank_dir, rank_dirs

    write_manifest(tmp_path, RunManifest(script="train.py", steps_requested=2, steps_completed=2, world_size=3,
                                         process_group={"backend": "hccl", "runs_as": "gloo"}))
    for rank in (1, 0):
        write_run(rank_dir(tmp_path, rank), steps=rank + 1)
        manifest = RunManifest(script="train.py", steps_requested=2, steps_completed=rank + 1, rank=rank,
                               world_size=3)
        write_manifest(rank_dir(tmp_path, rank), manifest)
    rank_dir(tmp_path, 2).mkdir()  # a rank killed before it wrote anything
    (tmp_path / "rank-notes").mkdir()  # not a rank folder

    run = read_run(tmp_path)
    assert [folder.name for folder in rank_dirs(tmp_path)] == ["rank0", "rank1", "rank2"]
    assert [rank.manifest.rank for rank in run.ranks] == [0, 1]
    assert [len(rank.losses) for rank in run.ranks] == [1, 2] and run.losses.equals(run.ranks[0].losses)
    assert run.root == tmp_path and run.ranks[1].root == rank_dir(tmp_path, 1)
    assert run.manifest.world_size == 3 and run.manifest.title == "train.py on , 3 ranks (hccl run as gloo)"
    assert any(note.startswith("rank2 left out") for note in run.notes)
    assert "no records of rank(s) 2 of 3" in run.notes


def test_a_single_process_run_has_no_ranks(tmp_path):
    write_run(tmp_path)
    assert read_run(tmp_path).ranks == [] and read_run(tmp_path).manifest.title == "train.py on "
