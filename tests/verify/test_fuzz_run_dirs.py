"""Fuzzing `verify compare` with damaged run directories (issue 22): a fixed seed, a bounded number of mutations of one
side (bytes flipped, blocks overwritten, files truncated, manifest fields retyped, files removed), each judged as
`verify compare` judges it. Every outcome must be exit 2 with one line, or a verdict on what was written; never a
crash, a hang, or a verdict (PASS or FAIL) on damaged evidence (issue 36): every table the side holds (losses,
hparams, ops, grads) read as written, or the damage is exit 2 naming the damaged table. Beside the random mutations,
each table (outputs too, of an inference run) deleted, overwritten with random bytes or cut in half is exit 2 naming
it, in `verify compare` and `verify report`.

The run directories are written once, synthetically (verify.record.store's writer, as test_compare does), not by
training. Only the Arrow streams carry checksums: a digit changed in a CSV cell or in the manifest reads as another
run's number and cannot be told from one, so a verdict on it is allowed; a CSV row lost, added or unreadable is not.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import shutil
import signal
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer import Typer
from typer.testing import CliRunner

import numpy as np
import pandas as pd
from test_compare import grads, hparams, losses, trace_ops, with_noise, write_run
from verify.cli import compare_cmd as compare_cli
from verify.record.evidence import read_side
from verify.record.schema import MANIFEST, OUTPUT_COLUMNS
from verify.errors import EXIT_ERROR, VerifyFailure

SEED = 22
SHARDS = 4  # xdist runs them side by side: 520 mutations in all, two shards a core within the minute
MUTATIONS_PER_SHARD = 130
SHARD_BUDGET_S = 30.0
CASE_LIMIT_S = 10  # one case: a hang, not a slow machine
FILES = ("manifest.json", "losses.csv", "hparams.csv", "ops/steps.arrows", "grads/steps.arrows")
TABLES = ("ops/steps.arrows", "grads/steps.arrows")

app = Typer()
app.command("compare")(compare_cli.compare)
app.command("report")(compare_cli.report)  # two commands: typer then takes the first argument as the command


@dataclass
class Mutation:
    kind: str
    file: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} {self.file} ({self.detail})"


def _flip(data: bytearray, rng: random.Random) -> str:
    places = [rng.randrange(len(data)) for _ in range(rng.randint(1, 8))]
    for place in places:
        data[place] ^= rng.randint(1, 255)
    return f"bytes at {places}"


def _overwrite(data: bytearray, rng: random.Random) -> str:
    length = rng.randint(1, 400)
    start = rng.randrange(len(data))
    fill = rng.choice([b"A", b"\xff", b"\0", None])
    block = bytes(rng.randrange(256) for _ in range(length)) if fill is None else fill * length
    data[start:start + length] = block[: len(data) - start]
    return f"{length} bytes of {fill!r} at {start}"


def _truncate(data: bytearray, rng: random.Random) -> str:
    keep = rng.randrange(len(data))
    del data[keep:]
    return f"kept {keep} bytes"


RETYPED = [["x"], "0", {"a": 1}, 1.5, -1, None, True, "", [], "x" * 100_000, [[1, "a"]], {"": None}]


def mutate(side: Path, rng: random.Random) -> Mutation:
    """One mutation of the run directory `side`, in place."""
    kind = rng.choice(["flip", "flip", "overwrite", "truncate", "retype", "retype", "remove", "not-an-object"])
    if kind in ("retype", "not-an-object"):
        manifest = json.loads((side / MANIFEST).read_text())
        if kind == "not-an-object":
            value = rng.choice([[manifest], 3, "manifest", None])
            (side / MANIFEST).write_text(json.dumps(value))
            return Mutation(kind, MANIFEST, type(value).__name__)
        field = rng.choice([*manifest, "extra.environment", "loss_scaler.dynamic"])
        value = rng.choice(RETYPED)
        if "." in field:
            outer, inner = field.split(".")
            manifest[outer] = {**manifest[outer], inner: value}
        else:
            manifest[field] = value
        (side / MANIFEST).write_text(json.dumps(manifest))
        return Mutation(kind, MANIFEST, f"{field} = {str(value)[:20]}")
    name = rng.choice(FILES)
    path = side / name
    if kind == "remove":
        shutil.rmtree(path.parent) if name in TABLES and rng.random() < 0.5 else path.unlink()
        return Mutation(kind, name, "")
    data = bytearray(path.read_bytes())
    detail = {"flip": _flip, "overwrite": _overwrite, "truncate": _truncate}[kind](data, rng)
    path.write_bytes(bytes(data))
    return Mutation(kind, name, detail)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fuzz")
    return write_run(root / "ref"), write_run(root / "actual", ops=with_noise(trace_ops()), device="npu")


@pytest.mark.parametrize("shard", range(SHARDS))
def test_a_damaged_run_directory_is_one_error_line_or_judged_on_what_was_written(pristine, tmp_path, shard):
    ref, actual = pristine
    baseline = read_side(actual)
    rng = random.Random(SEED * SHARDS + shard)
    runner = CliRunner()
    outcomes = {"verdict, tables intact": 0, "verdict, a CSV number changed": 0, "exit 2": 0}
    judged: dict[str, str] = {}  # what a run directory reads as -> its outcome: equal reads, equal verdicts
    started, cpu_started = time.monotonic(), time.process_time()
    for case in range(MUTATIONS_PER_SHARD):
        side = tmp_path / f"case-{case}"
        shutil.copytree(actual, side)
        mutation = mutate(side, rng)
        where = f"case {case}, {mutation}"
        with _time_limit(CASE_LIMIT_S, where):
            read_as = _read_as(side)
            if read_as not in judged or not read_as:  # a new read, or none (exit 2): through the command itself
                result = runner.invoke(app, ["compare", str(ref), str(side)])
                judged[read_as] = _judge(where, mutation, result, side, baseline)
        outcomes[judged[read_as]] += 1
        shutil.rmtree(side)
    cpu = time.process_time() - cpu_started
    print(f"shard {shard}: {MUTATIONS_PER_SHARD} mutations ({len(judged)} distinct reads) in "
          f"{time.monotonic() - started:.1f} s ({cpu:.1f} s of CPU): {outcomes}")
    # CPU time, not wall time: the machine may be shared; alone on one core the shard takes this long.
    assert cpu < SHARD_BUDGET_S
    # both kinds of outcome were reached: the mutations reach the reader (a CSV number changed is rarely drawn)
    assert outcomes["exit 2"] and outcomes["verdict, tables intact"], outcomes


@contextlib.contextmanager
def _time_limit(seconds: int, what: str):
    """A hang fails the case instead of the whole run (SIGALRM: pytest runs tests in the main thread)."""
    def hung(signum, frame):
        raise TimeoutError(f"{what}: no outcome after {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _read_as(side: Path) -> str:
    """A digest of everything compare reads of a run directory ("" where it cannot be read: judged every time)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = read_side(side)
    except VerifyFailure:
        return ""
    digest = hashlib.sha256(json.dumps([run.manifest.to_json(), run.notes], sort_keys=True, default=str).encode())
    for frame in (run.ops, run.losses, run.hparams.astype({"value": str}), run.grads, run.outputs):
        digest.update(frame.to_csv(index=False).encode())
    return digest.hexdigest()


def _named(file: str, error: str) -> bool:
    """Whether an error line names a table's file (ops/steps.arrows) or, where the whole folder went, the folder."""
    return file in error or f"{file.split('/')[0]}/" in error


def _judge(where: str, mutation: Mutation, result, side: Path, baseline) -> str:
    """The outcome of `verify compare` on a damaged side; an assertion names the case where it is not allowed."""
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not crashed, f"{where}: {result.exception!r}\n{result.output}"
    assert result.exit_code in (0, 1, EXIT_ERROR), f"{where}: exit {result.exit_code}"
    if result.exit_code == EXIT_ERROR:
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{where}: {result.output}"
        assert "verify's own error" not in lines[0], f"{where}: {lines[0]}"
        if mutation.file != MANIFEST:  # a table's damage names the table (a manifest's may show elsewhere first)
            assert _named(mutation.file, lines[0]), f"{where}: {lines[0]}"
        return "exit 2"
    # A verdict: what the comparison read of the checksummed tables is what was written, and every row of the CSVs.
    run = read_side(side)
    for table in ("ops", "grads"):
        assert getattr(run, table).equals(getattr(baseline, table)), f"{where}: {table} changed, and judged"
    for table in ("losses", "hparams"):
        read, written = getattr(run, table), getattr(baseline, table)
        assert read["step"].tolist() == written["step"].tolist(), f"{where}: rows of {table} lost, and judged"
    same = all(getattr(run, table).astype(str).equals(getattr(baseline, table).astype(str))
               for table in ("losses", "hparams"))
    return "verdict, tables intact" if same else "verdict, a CSV number changed"


def inference_side(root: Path) -> Path:
    """An inference run of one step: its outputs table and the output's tensor."""
    logits = np.random.default_rng(5).normal(size=(8, 10)).astype(np.float32)
    outputs = pd.DataFrame([dict(step=0, output="out0", dtype="float32", shape="8x10", numel=80,
                                 min=float(logits.min()), max=float(logits.max()), mean=float(logits.mean()),
                                 l2_norm=float(np.linalg.norm(logits)), nan_count=0, inf_count=0,
                                 tensor_file="outputs/step-000000-out0.npy")]).astype(OUTPUT_COLUMNS)
    return write_run(root, ops=trace_ops(steps=1), loss=losses().iloc[:0], hparam=hparams().iloc[:0],
                     grad=grads().iloc[:0], outputs=outputs, arrays={"outputs/step-000000-out0.npy": logits},
                     inference=True, steps_requested=1, steps_completed=1)


def _random_bytes(path: Path) -> None:
    path.write_bytes(random.Random(36).randbytes(max(64, path.stat().st_size)))


def _half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGES = {"deleted": Path.unlink, "random bytes": _random_bytes, "cut in half": _half}
TABLE_FILES = [("training", name) for name in FILES if name != MANIFEST] + [("inference", "outputs/steps.arrows")]


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize(("kind", "table"), TABLE_FILES)
def test_every_table_damaged_or_deleted_is_exit_2_naming_it(tmp_path, kind, table, damage):
    """Issue 36 items 2 and 5, issue 37 item 3: each table a run folder holds (losses, hyperparameters, op records,
    gradients, inference outputs), deleted, overwritten or cut, is exit 2 naming the file, never PASS or FAIL; `verify
    report` reads it the same way."""
    write = inference_side if kind == "inference" else write_run
    ref, side = write(tmp_path / "ref"), write(tmp_path / "actual")
    assert CliRunner().invoke(app, ["compare", str(ref), str(side)]).exit_code == 0  # intact: judged
    DAMAGES[damage](side / table)
    for command in (["compare", str(ref), str(side)], ["report", str(side)]):
        result = CliRunner().invoke(app, command)
        lines = result.output.strip().splitlines()
        assert result.exit_code == EXIT_ERROR and len(lines) == 1, (command, result.output)
        assert lines[0].startswith("error: ") and _named(table, lines[0]), lines[0]


def test_ops_promised_by_the_dump_mode_and_missing_are_damage_and_dump_off_is_judged_on_losses(tmp_path):
    """Issue 37 item 3: a side recorded with --dump stats whose ops/ is gone is damaged (it passed before issue 36);
    a side recorded with --dump off has no ops to promise, and is compared on its losses."""
    ref = write_run(tmp_path / "ref")
    stats = write_run(tmp_path / "stats")
    shutil.rmtree(stats / "ops")
    result = CliRunner().invoke(app, ["compare", str(ref), str(stats)])
    assert result.exit_code == EXIT_ERROR and "ops/steps.arrows has no operator records" in result.output
    assert "recorded with --dump stats" in result.output.replace("\n", "")
    off = write_run(tmp_path / "off", ops=trace_ops().iloc[:0], dump_mode="off")
    judged = CliRunner().invoke(app, ["compare", str(ref), str(off)])
    assert judged.exit_code == 0 and "PASS: loss within" in judged.output, judged.output
