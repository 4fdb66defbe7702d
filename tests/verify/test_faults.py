"""Issue 22's reproductions, each driven from a run directory written here (no training): damaged tables, manifests
that do not follow the schema, huge strings, one-sided tables. Every outcome is a verdict with a note naming the
damage, or exit 2 with one line; never a crash, a traceback or a silent PASS. A side that lacks or cannot read what
its manifest promises is damaged (issue 36): exit 2 with one line naming the file, never a verdict."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer import Typer
from typer.testing import CliRunner

from test_compare import trace_ops, with_noise, write_run
from verify.cli import compare_cmd as compare_cli
from verify.record.schema import MANIFEST, TABLE_FILE
from verify.errors import EXIT_ERROR

app = Typer()
app.command("compare")(compare_cli.compare)
app.command("export")(compare_cli.export)


@pytest.fixture
def pair(tmp_path) -> tuple[Path, Path]:
    """A reference and a port that agree (device noise only): undamaged, they PASS."""
    return write_run(tmp_path / "ref"), write_run(tmp_path / "actual", ops=with_noise(trace_ops()), device="npu")


def invoke(*args: object):
    return CliRunner().invoke(app, [str(arg) for arg in args])


def _crashed(result) -> bool:
    """An exception other than the command's own exit escaped it (CliRunner catches it)."""
    return result.exception is not None and not isinstance(result.exception, SystemExit)


def one_error_line(result) -> str:
    assert result.exit_code == EXIT_ERROR and not _crashed(result), result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_undamaged_pair_passes(pair):
    result = invoke("compare", *pair)
    assert result.exit_code == 0 and "PASS" in result.output and "is damaged at" not in result.output


@pytest.mark.parametrize("fill", [b"A", b"\xff", b"\0"], ids=["A", "0xFF", "zeros"])
def test_400_damaged_bytes_mid_stream_are_exit_2_naming_the_stream(pair, tmp_path, fill):
    stream = pair[1] / "ops" / TABLE_FILE
    data = bytearray(stream.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 400] = fill * 400
    stream.write_bytes(bytes(data))
    line = one_error_line(invoke("compare", *pair))
    assert f"damaged run directory {pair[1]}: ops/{TABLE_FILE} is damaged at byte " in line
    assert f"ops/{TABLE_FILE} is damaged at byte " in one_error_line(invoke("export", pair[1], tmp_path / "dump",
                                                                            "--msprobe"))


def test_a_damaged_checksum_is_named_with_the_step_and_offset(pair):
    """A value changed in place (one float's bytes) still parses: only the checksum tells it from another number."""
    stream = pair[1] / "ops" / TABLE_FILE
    data = bytearray(stream.read_bytes())
    first_batch = _batch_offsets(stream)[1]
    at = data.index(b"Net.conv1", first_batch)  # a string value of step 1's batch
    data[at:at + 3] = b"Xet"
    stream.write_bytes(bytes(data))
    line = one_error_line(invoke("compare", *pair))
    assert (f"ops/{TABLE_FILE} is damaged at byte {first_batch}, in the batch after step 0's: checksum "
            "mismatch; read the 1 step(s) before it") in line


def _batch_offsets(stream: Path) -> list[int]:
    """Where each record batch of a stream begins."""
    import pyarrow as pa

    offsets = []
    with pa.OSFile(str(stream)) as source:
        reader = pa.ipc.open_stream(source)
        while True:
            offsets.append(source.tell())
            try:
                reader.read_next_batch()
            except StopIteration:
                return offsets[:-1]


def test_a_side_without_ops_and_grads_is_damaged(pair):
    shutil.rmtree(pair[1] / "ops")
    shutil.rmtree(pair[1] / "grads")
    line = one_error_line(invoke("compare", *pair))
    assert (f"ops/{TABLE_FILE} has no operator records of step(s) 0, 1, 2 of the 3 step(s) the manifest records as "
            "written (it was recorded with --dump stats)") in line
    assert f"grads/{TABLE_FILE} is missing, though an optimizer stepped (hparams.csv)" in line


def retyped(run: Path, **fields: object) -> None:
    manifest = run / MANIFEST
    manifest.write_text(json.dumps(json.loads(manifest.read_text()) | fields))


@pytest.mark.parametrize("field, value, kind", [
    ("device", ["x"], "a list, not the str"),
    ("skipped_steps", "0", "a string, not the list[int]"),
    ("loss_scaler", "x", "a string, not the dict[str, Any]"),
    ("emulated", 1, "a number, not the bool"),
    ("exit_code", "1", "a string, not the int | None"),
])
def test_a_manifest_field_of_the_wrong_type_is_exit_2_naming_it(pair, field, value, kind):
    retyped(pair[1], **{field: value})
    line = one_error_line(invoke("compare", *pair))
    assert f"{pair[1] / MANIFEST} is not a valid manifest: field {field!r} is {kind} the schema declares" in line


def test_a_manifest_that_is_not_an_object_or_lacks_a_field_is_exit_2(pair):
    (pair[1] / MANIFEST).write_text("[1, 2]")
    assert "a JSON object expected, found a list" in one_error_line(invoke("compare", *pair))
    (pair[1] / MANIFEST).write_text(json.dumps({"schema_version": 2, "script": "x"}))
    assert "field 'device' is missing" in one_error_line(invoke("compare", *pair))
    (pair[1] / MANIFEST).write_bytes(b'{"script": "\xff"}')
    assert "is not a valid manifest" in one_error_line(invoke("compare", *pair))


def test_an_empty_losses_csv_is_damage(pair):
    (pair[1] / "losses.csv").write_bytes(b"")
    assert "losses.csv is empty: not even a whole header" in one_error_line(invoke("compare", *pair))


def test_a_huge_message_is_capped_where_shown_and_kept_whole_in_the_file(pair, tmp_path):
    huge = "boom " * 2_000_000  # 10 MB
    retyped(pair[1], status="crashed", message=huge, traceback=huge)
    result = invoke("compare", *pair, "-o", tmp_path / "out")
    assert result.exit_code == 1 and len(result.output) < 20_000
    assert "more characters, kept whole in the run directory" in result.output
    assert (tmp_path / "out" / "report.html").stat().st_size < 200_000
    assert json.loads((pair[1] / MANIFEST).read_text())["message"] == huge


def test_a_damaged_csv_header_is_damage(pair):
    hparams = pair[1] / "hparams.csv"
    hparams.write_bytes(hparams.read_bytes().replace(b"name", b"n\x92me", 1))
    assert "hparams.csv lacks the column(s) name: its header is damaged" in one_error_line(invoke("compare", *pair))


@pytest.mark.parametrize("damaged", [b"shapX", b"sh\xffpe"], ids=["another name", "not UTF-8"])
def test_a_damaged_column_name_in_a_streams_schema_is_damage(pair, damaged):
    """The schema has no checksum of its own: its columns are checked against the table's."""
    stream = pair[1] / "grads" / TABLE_FILE
    stream.write_bytes(stream.read_bytes().replace(b"shape", damaged, 1))
    assert f"grads/{TABLE_FILE} is damaged at byte 0, in its schema" in one_error_line(invoke("compare", *pair))
