"""Write and read run directories (the layout is in `verify.record.schema`). Never imports torch.

The writer runs inside the instrumented child and receives plain Python numbers and numpy arrays: whatever touches
tensors converts them first (`verify.capture.ops`). The reader runs anywhere, including on a laptop without torch: it
concatenates the record batches of each table's stream, keeps the complete ones of a stream cut short by a kill
(with a warning), never unpickles anything and refuses names that would leave the run directory.

What a run directory lacks or cannot read of what its manifest promises is its damage (`Run.damage`), not a note: a
run that ended under verify's control (ok, short, nan, no-steps) promises every file whole; every run promises, for
each step it completed, its losses (training), its operator records (--dump stats, tensor, md5), a gradient table,
the hyperparameters of each step whose gradients it recorded, and its outputs (inference). A run killed mid-write
may lose the last step it completed and the end of a file; nothing else. Damaged evidence is never judged
(verify/cli/compare_cmd.py: exit 2).
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import os
import warnings
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from verify.record.run_folders import rank_dirs, writer_gone
from verify.record.schema import (
    GRAD_COLUMNS,
    GRADS_DIR,
    HPARAM_COLUMNS,
    HPARAMS,
    LAST_COLLECTIVE,
    LOSS_COLUMNS,
    LOSSES,
    MANIFEST,
    OP_COLUMNS,
    OP_KEY_PARTS,
    OPS_DIR,
    OUTPUT_COLUMNS,
    OUTPUTS_DIR,
    SAMPLE_COLUMNS,
    SAMPLES_DIR,
    TABLE_FILE,
    TOP_LEVEL_ATTRS_VERSION,
    DumpMode,
    Phase,
    RunManifest,
    Status,
)
from verify.errors import DiskFull, RunDirError

_ARROW_TYPES = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}
_DEFAULTS = {"int64": pa.scalar(0), "float64": pa.scalar(None, pa.float64()), "string": pa.scalar("")}
"""What a column left out of `RunWriter.write_step_table` holds (float64: null, read back as NaN)."""
TABLES: dict[str, dict[str, str]] = {OPS_DIR: OP_COLUMNS, GRADS_DIR: GRAD_COLUMNS, OUTPUTS_DIR: OUTPUT_COLUMNS,
                                     SAMPLES_DIR: SAMPLE_COLUMNS}
"""Folder holding a table's stream (TABLE_FILE) -> its columns."""




@contextlib.contextmanager
def space_needed(path: Path) -> Iterator[None]:
    """An OSError of a write to `path` for want of space becomes errors.DiskFull naming it: verify's own failure,
    never the script's crash."""
    try:
        yield
    except OSError as error:
        if error.errno in DiskFull.ERRNOS:
            raise DiskFull.of(error, path) from None
        raise


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    # A reader (or a parent finalising after a kill) must never see half a file: write beside it, then rename.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with space_needed(path):
            temporary.write_bytes(data)
    except DiskFull:
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)


def now_iso() -> str:
    """Manifest time stamps: ISO 8601, UTC, to the millisecond (two runs started at once are ordered by them: to the
    second, a run started 0.9 s after another could read as started first)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def write_manifest(run_dir: Path, manifest: RunManifest) -> None:
    _atomic_write_bytes(Path(run_dir) / MANIFEST, json.dumps(manifest.to_json(), indent=1).encode())


def read_manifest(run_dir: Path) -> RunManifest:
    """The run's manifest, checked against verify.record.schema.RunManifest (RunDirError names the field that is
    not)."""
    path = Path(run_dir) / MANIFEST
    try:
        return RunManifest.from_json(json.loads(path.read_bytes()))
    except FileNotFoundError:
        raise RunDirError(f"{run_dir} is not a run directory: {MANIFEST} is missing") from None
    except (ValueError, RecursionError) as error:  # JSON, UTF-8 or the schema (ManifestError)
        raise RunDirError(f"{path} is not a valid manifest: {error}") from None


def _arrow_schema(columns: Mapping[str, str]) -> pa.Schema:
    return pa.schema([(name, _ARROW_TYPES[dtype]) for name, dtype in columns.items()])


_SCHEMAS = {folder: _arrow_schema(columns) for folder, columns in TABLES.items()}
# Each record batch carries the CRC-32 of its serialized form in its IPC message's metadata, and the stream's schema
# says so: a reader then tells a damaged batch (a flipped byte, a block of zeros) from a step that computed other
# numbers. A stream whose schema does not say so was written before checksums (read with full validation only).
_CHECKSUM_KEY = b"crc32"
_CHECKSUMMED = {b"npu-port.batch-checksum": _CHECKSUM_KEY}


def _checksum(batch: pa.RecordBatch) -> bytes:
    return str(zlib.crc32(batch.serialize())).encode()


def _record_batch(folder: str, step: int, columns: Mapping[str, Sequence[Any]]) -> pa.RecordBatch:
    """Column lists as one batch of the table's schema; a column left out holds its default, the step column `step`.
    Every step pays for this: the names and types come from dicts, not from the schema's (slow) Field objects."""
    length = len(next(iter(columns.values()))) if columns else 0
    columns = {"step": [step] * length, **columns}
    arrays = [
        pa.array(columns[name], type=_ARROW_TYPES[dtype])
        if name in columns
        else pa.repeat(_DEFAULTS[dtype], length)  # several times cheaper than converting a list of defaults
        for name, dtype in TABLES[folder].items()
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=_SCHEMAS[folder])


class RunWriter:
    """Appends to a run directory as the run goes: CSV rows and each step's record batch are handed to the OS at
    once, so everything written before a crash, even a kill, stays readable."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self._csv = {LOSSES: self._open_csv(LOSSES, LOSS_COLUMNS), HPARAMS: self._open_csv(HPARAMS, HPARAM_COLUMNS)}
        self._streams: dict[str, tuple[pa.NativeFile, pa.ipc.RecordBatchStreamWriter]] = {}

    def _open_csv(self, name: str, columns: Sequence[str]) -> tuple[Any, Any]:
        path = self.run_dir / name
        handle = path.open("a", newline="")
        writer = csv.writer(handle)
        if path.stat().st_size == 0:
            writer.writerow(columns)
            handle.flush()
        return handle, writer

    def _append(self, name: str, rows: Iterable[Sequence[Any]]) -> None:
        handle, writer = self._csv[name]
        with space_needed(self.run_dir / name):
            writer.writerows(rows)
            handle.flush()

    def append_losses(self, rows: Iterable[Sequence[Any]]) -> None:
        """Rows in LOSS_COLUMNS order; None becomes an empty cell."""
        self._append(LOSSES, rows)

    def append_hparams(self, rows: Iterable[tuple[int, int | str, str, Any, int]]) -> None:
        """(step, group, name, value, optimizer) with any JSON-able value."""
        self._append(HPARAMS, ((step, group, name, json.dumps(value), opt) for step, group, name, value, opt in rows))

    def _stream(self, folder: str) -> tuple[pa.NativeFile, pa.ipc.RecordBatchStreamWriter]:
        """The table's stream, created with its first step: a run without outputs has no outputs stream."""
        if folder not in self._streams:
            path = self.run_dir / folder / TABLE_FILE
            path.parent.mkdir(exist_ok=True)
            # Buffered: a batch is a dozen small writes (header, each column's buffers); the flush makes them one.
            sink = pa.BufferedOutputStream(pa.OSFile(str(path), "wb"), buffer_size=1 << 16)
            self._streams[folder] = sink, pa.ipc.new_stream(sink, _SCHEMAS[folder].with_metadata(_CHECKSUMMED))
        return self._streams[folder]

    def write_step_table(self, folder: str, step: int, columns: Mapping[str, Sequence[Any]]) -> None:
        """One step of ops, grads or outputs, as column lists named as in the schema (missing columns: defaults),
        appended to the table's stream as one record batch. The OS has it when this returns: a kill keeps it."""
        sink, stream = self._stream(folder)
        batch = _record_batch(folder, step, columns)
        with space_needed(self.run_dir / folder / TABLE_FILE):
            stream.write_batch(batch, custom_metadata={_CHECKSUM_KEY: _checksum(batch)})
            sink.flush()

    def save_array(self, relative: str, array: np.ndarray) -> str:
        """Saves a .npy under the run directory (no pickle) and returns its path relative to it."""
        path = resolve_inside(self.run_dir, relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        with space_needed(path), path.open("wb") as handle:
            np.save(handle, np.ascontiguousarray(array), allow_pickle=False)
        return relative

    def close(self) -> None:
        """Closes every file, each even where another failed for want of space (DiskFull, raised after)."""
        full = None
        closes = [(self.run_dir / name, handle.close) for name, (handle, _) in self._csv.items()]
        # the end-of-stream marker, then the file; a stream without the marker (a kill) reads the same
        closes += [(self.run_dir / folder / TABLE_FILE, close) for folder, (sink, stream) in self._streams.items()
                   for close in (stream.close, sink.close)]
        for path, close in closes:
            try:
                with space_needed(path):
                    close()
            except DiskFull as error:
                full = full or error
        if full is not None:
            raise full


def resolve_inside(run_dir: Path, relative: str) -> Path:
    """The file `relative` names inside `run_dir`; a name that is absolute or escapes the directory is refused."""
    root = Path(run_dir).resolve()
    if not relative or Path(relative).is_absolute():
        raise RunDirError(f"refusing file name {relative!r}: not a relative path inside the run directory")
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise RunDirError(f"refusing file name {relative!r}: it points outside the run directory {root}")
    return path


def op_keys(parts: Mapping[str, pd.Series]) -> pd.Series:
    """schema.step_op_keys for every row at once, from a Series per key part (OP_KEY_PARTS)."""
    key = None
    for name, separator in OP_KEY_PARTS:
        text = separator + parts[name].astype(str)
        key = text if key is None else key + text
    return key


def empty_frame(columns: Mapping[str, str] | Sequence[str]) -> pd.DataFrame:
    if isinstance(columns, Mapping):
        return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in columns.items()})
    return pd.DataFrame({name: pd.Series(dtype="object") for name in columns})


@dataclass
class Run:
    """One run in memory, whatever it was read from (a run directory here, an msprobe dump by verify/record/msprobe.py):
    the manifest and one frame per table, following verify.record.schema's columns (empty frames keep them). `notes` say
    what was missing or skipped while reading; compare and report take this and read no file themselves."""

    root: Path
    manifest: RunManifest
    ops: pd.DataFrame = field(default_factory=lambda: empty_frame(OP_COLUMNS))
    losses: pd.DataFrame = field(default_factory=lambda: empty_frame(LOSS_COLUMNS))
    hparams: pd.DataFrame = field(default_factory=lambda: empty_frame(HPARAM_COLUMNS))
    grads: pd.DataFrame = field(default_factory=lambda: empty_frame(GRAD_COLUMNS))
    outputs: pd.DataFrame = field(default_factory=lambda: empty_frame(OUTPUT_COLUMNS))
    samples: pd.DataFrame = field(default_factory=lambda: empty_frame(SAMPLE_COLUMNS))
    source: str = "npu-port run directory"
    notes: list[str] = field(default_factory=list)
    # What the run directory lacks or cannot read of what its manifest promises (the module's docstring), each naming
    # its file: evidence that cannot be judged. [] for an intact run.
    damage: list[str] = field(default_factory=list)
    # A run of several ranks: each rank's Run, by rank; the run itself holds the run's manifest and rank 0's records,
    # which stand for the run where one rank is read (its precision, its loss scaler). [] for a single process.
    ranks: list[Run] = field(default_factory=list)

    def rank_nodes(self) -> dict[int, int]:
        """rank -> the node that ran it (its manifest's), for a run across several machines; {} on one machine."""
        return {rank.manifest.rank: rank.manifest.node for rank in self.ranks} if self.manifest.nodes else {}

    def ranks_by_node(self) -> dict[int, list[int]]:
        """node -> its ranks, by node, for a run across several machines; {} on one machine."""
        nodes = self.rank_nodes()
        return {node: [rank for rank, its in nodes.items() if its == node] for node in sorted(set(nodes.values()))}

    def rank_name(self, rank: int) -> str:
        """How every report names one of the run's ranks: "rank 1", "rank 1 (node 1)" across machines."""
        node = self.rank_nodes().get(rank)
        return f"rank {rank}" if node is None else f"rank {rank} (node {node})"

    def load_array(self, relative: str) -> np.ndarray:
        """A tensor saved in the run (a `tensor_file` cell), confined to the run directory and never unpickled."""
        return np.load(resolve_inside(self.root, relative), allow_pickle=False)


def _empty(columns: Mapping[str, str]) -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in columns.items()})


@dataclass
class _Reading:
    """What reading one process's run directory found wrong: `damage` (Run.damage) and `notes` (Run.notes); `cut`:
    the run may have been killed mid-write (its status is not one verify ended it with), so the end of a file may
    be missing."""

    cut: bool
    damage: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # a run stopped before it wrote a step (killed while torch imported, at a timeout) may not have made its files
    unstarted: bool = False


def _complete_batches(path: Path, folder: str, reading: _Reading) -> list[pa.RecordBatch]:
    """The record batches of a stream up to the first damaged one, each checked before any of its values is used
    (offsets and lengths in full, then its checksum); what is wrong is reported with the step it hides and its byte
    offset: damage, unless the stream just ends early in a run killed mid-write (a note)."""
    batches: list[pa.RecordBatch] = []
    offset, name = 0, f"{folder}/{TABLE_FILE}"
    try:
        with pa.OSFile(str(path)) as source:
            reader = pa.ipc.open_stream(source)
            if damage := _schema_damage(reader.schema, folder):  # the schema has no checksum: its columns are checked
                reading.damage.append(_damaged(name, batches, offset, damage))
                return batches
            checksummed = (reader.schema.metadata or {}).items() >= _CHECKSUMMED.items()
            while True:
                offset = source.tell()
                try:
                    batch, metadata = reader.read_next_batch_with_custom_metadata()
                except StopIteration:  # an end-of-stream mark: the writer's last bytes, or zeros written over records
                    if (end := source.tell()) < (size := source.size()):
                        reading.damage.append(_damaged(name, batches, offset, (
                            f"its stream ends at byte {end} of {size}: an end-of-stream mark among its records")))
                    return batches
                if damage := _damage(batch, metadata, checksummed):
                    reading.damage.append(_damaged(name, batches, offset, damage))
                    return batches
                batches.append(batch)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as error:  # a damaged name in the schema: not UTF-8
        (reading.notes if reading.cut else reading.damage).append(
            _damaged(name, batches, offset, str(error)))
    return batches


def _schema_damage(schema: pa.Schema, folder: str) -> str:
    """What is wrong with a stream's schema ("" nothing): a column the table does not have, or of another type. A
    column it lacks is allowed (version 1 had no ops.inputs): it reads as missing."""
    expected = _SCHEMAS[folder]
    for column in schema:
        known = expected.field(column.name) if column.name in expected.names else None
        if known is None or known.type != column.type or schema.names.count(column.name) > 1:
            return f"its schema has a column {column.name!r} of type {column.type} that {folder} does not have"
    return ""


def _damage(batch: pa.RecordBatch, metadata: pa.KeyValueMetadata | None, checksummed: bool) -> str:
    """What is wrong with a batch just read ("" nothing). Validated in full before anything reads its values: a
    damaged offset would otherwise send the reader outside its buffers."""
    try:
        batch.validate(full=True)
    except pa.ArrowException as error:
        return f"invalid batch: {error}"
    expected = (metadata or {}).get(_CHECKSUM_KEY)
    if expected is None:
        return "a batch without its checksum" if checksummed else ""
    return "" if _checksum(batch) == expected else "checksum mismatch"


def _damaged(name: str, batches: list[pa.RecordBatch], offset: int, damage: str) -> str:
    last = batches[-1]["step"][0].as_py() if batches and batches[-1].num_rows else None
    where = ("in its schema" if not offset else "in its first step's batch") if not batches else (
        f"in the batch after step {last}'s")
    damage = " ".join(damage.split())
    return f"{name} is damaged at byte {offset}, {where}: {damage}; read the {len(batches)} step(s) before it"


def _read_steps(run_dir: Path, folder: str, reading: _Reading) -> pd.DataFrame:
    columns = TABLES[folder]
    path = run_dir / folder / TABLE_FILE
    batches = _complete_batches(path, folder, reading) if path.is_file() else []
    if not batches:
        return _empty(columns)
    frame = pa.Table.from_batches(batches).to_pandas()
    return frame.reindex(columns=list(columns)).astype(columns)


def _read_csv(path: Path, columns: Sequence[str], floats: Sequence[str], integers: Sequence[str],
              reading: _Reading) -> pd.DataFrame:
    """A CSV of ours, its rows whose cells parse. Every line the writer wrote is a row of numbers where the columns
    are numbers (a NaN loss reads "nan"), so anything else is damage: no file, no header, a line that is not a row, a
    cell that is not a number; only a last row cut short in a run killed mid-write is left out with a note."""
    frame = pd.DataFrame({name: pd.Series(dtype="string") for name in columns})
    data, damaged = path.read_bytes() if path.is_file() else None, len(reading.damage)
    if data is None and not reading.unstarted:
        reading.damage.append(f"{path.name} is missing")
    elif data and not data.endswith(b"\n"):  # the writer ends every row: a row cut short
        (reading.notes if reading.cut else reading.damage).append(
            f"{path.name} ends in the middle of a row" + (" (the run was stopped while writing it)" * reading.cut))
        data = data[: data.rfind(b"\n") + 1]
    lines = data.count(b"\n") - 1 if data else 0  # less the header
    try:
        frame = pd.read_csv(io.BytesIO(data), dtype="string", keep_default_na=False, on_bad_lines="skip",
                            encoding_errors="replace") if data else frame
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as error:
        reading.damage.append(f"{path.name} is not a CSV table: {' '.join(str(error).split())}")
    if data == b"":
        reading.damage.append(f"{path.name} is empty: not even a whole header")
    elif data is not None and (missing := [name for name in columns if name not in frame.columns]):
        reading.damage.append(f"{path.name} lacks the column(s) {', '.join(missing)}: its header is damaged")
    elif len(frame) < lines:
        reading.damage.append(f"{path.name}: {lines - len(frame)} of its {lines} line(s) are not rows of the table")
    frame = frame.reindex(columns=list(columns)).astype("string")
    cells = frame[[*floats, *integers]].fillna("")
    for name in (*floats, *integers):
        frame[name] = pd.to_numeric(frame[name].replace("", None), errors="coerce").astype("float64")
    counts = frame[list(integers)]
    # A step or a counter that is not a whole number in int64's range is as unreadable as a missing one, and so is a
    # number that does not parse.
    unparsed = (frame[[*floats, *integers]].isna() & (cells != "") & (cells.apply(lambda c: c.str.lower()) != "nan"))
    complete = (counts.notna() & (counts % 1 == 0) & (counts.abs() < 2.0**62)).all(axis=1) & ~unparsed.any(axis=1)
    if not complete.all() and len(reading.damage) == damaged:
        reading.damage.append(f"{path.name}: {int((~complete).sum())} row(s) hold cells that are not numbers")
    frame = frame[complete].reset_index(drop=True)
    return frame.astype({name: "int64" for name in integers})


_LOSS_NUMBERS = (("loss", "loss_scale", "wall_ms"), ("step", "micro_step"))


def read_losses(run_dir: Path) -> pd.DataFrame:
    """losses.csv alone, its readable rows (the loss curve is small; the op tables need not be read for it)."""
    return _read_csv(Path(run_dir) / LOSSES, LOSS_COLUMNS, *_LOSS_NUMBERS, _Reading(cut=True))


def recorded_loss_scales(losses: pd.DataFrame) -> list[tuple[int, int, float]]:
    """(step, micro_step, scale) of each backward() a run's GradScaler scaled (losses.csv's loss_scale)."""
    scales = pd.to_numeric(losses["loss_scale"], errors="coerce")
    scaled = losses.assign(loss_scale=scales).dropna(subset=["loss_scale"])
    return list(zip(scaled["step"], scaled["micro_step"], scaled["loss_scale"]))


def read_run(run_dir: Path) -> Run:
    """Reads a run directory written by `verify run` (or one cut short by a crash), of one process or of several
    ranks (verify/record/run_folders.py). Problems become `Run.notes` and Python warnings; only a missing or corrupt
    manifest of the run is an error (RunDirError)."""
    run_dir = Path(run_dir)
    folders = rank_dirs(run_dir)
    return _read_ranks(run_dir, folders) if folders else _read_process(run_dir)


def _read_ranks(run_dir: Path, folders: list[Path]) -> Run:
    """A run of several ranks: the run's manifest, rank 0's records, and each rank's Run. A rank folder without a
    readable manifest (a rank killed before it wrote one) is left out, with a note."""
    manifest = _closed(read_manifest(run_dir), run_dir)
    ranks, notes = [], []
    for folder in folders:
        try:
            ranks.append(_read_process(folder, lock_dir=run_dir))
        except RunDirError as error:
            notes.append(f"{folder.name} left out: {error}")
    ranks.sort(key=lambda run: run.manifest.rank)
    missing = sorted(set(range(manifest.world_size)) - {run.manifest.rank for run in ranks})
    if missing:
        notes.append(f"no records of rank(s) {', '.join(map(str, missing))} of {manifest.world_size}")
    notes += [f"rank {run.manifest.rank}: {note}" for run in ranks for note in run.notes]
    damage = [f"rank {run.manifest.rank}: {damage}" for run in ranks for damage in run.damage]
    if not ranks:
        return Run(run_dir, manifest, notes=notes)
    return replace(ranks[0], root=run_dir, manifest=manifest, ranks=ranks, notes=notes, damage=damage)


def _closed(manifest: RunManifest, lock_dir: Path) -> RunManifest:
    """A manifest left `running` by a verify that is gone (the run's stale lock: run_folders.writer_gone), read as
    the run ended: interrupted with that verify, saying so."""
    if manifest.status != Status.RUNNING.value or not (why := writer_gone(lock_dir)):
        return manifest
    return replace(manifest, status=Status.INTERRUPTED.value,
                   message=f"interrupted: {why} ({manifest.steps_completed} steps completed)")


def _read_process(run_dir: Path, lock_dir: Path | None = None) -> Run:
    """The run directory of one process: a single-process run, or one rank of several (`lock_dir`: its run's)."""
    manifest = _closed(read_manifest(run_dir), lock_dir or run_dir)
    reading = _Reading(cut=manifest.status not in _ENDED_BY_VERIFY,
                       unstarted=manifest.steps_completed == 0 and manifest.status != Status.RUNNING.value)
    losses = _read_csv(run_dir / LOSSES, LOSS_COLUMNS, *_LOSS_NUMBERS, reading)
    hparams = _read_csv(run_dir / HPARAMS, HPARAM_COLUMNS, (), ("step", "optimizer"), reading)
    if not reading.damage and (texts := hparams["value"].dropna().map(_is_json).value_counts().get(False, 0)):
        reading.damage.append(f"{HPARAMS}: {texts} value(s) are not the JSON its writer writes")
    hparams["value"] = hparams["value"].map(_json_or_text, na_action="ignore").astype("object")
    tables = {folder: _read_steps(run_dir, folder, reading) for folder in TABLES}
    _unrecorded_settings_missing(tables[OPS_DIR], manifest)
    if not reading.damage:  # a table that cannot be read has lost its rows: that is said once, above
        reading.damage += _broken_promises(run_dir, manifest, losses, hparams, tables, reading.cut)
    for problem in (*reading.damage, *reading.notes):
        warnings.warn(f"{run_dir}: {problem}", stacklevel=2)
    if losses.empty and not manifest.inference:
        reading.notes.append("no loss recorded")
    return Run(run_dir, manifest, ops=tables[OPS_DIR], losses=losses, hparams=hparams, grads=tables[GRADS_DIR],
               outputs=tables[OUTPUTS_DIR], samples=tables[SAMPLES_DIR], notes=reading.damage + reading.notes,
               damage=reading.damage)


def _unrecorded_settings_missing(ops: pd.DataFrame, manifest: RunManifest) -> None:
    """An older run's top-level calls' settings, which it did not record (its "" says nothing), read as missing: a
    setting a newer run records there is no change against them."""
    if manifest.schema_version < TOP_LEVEL_ATTRS_VERSION and "attrs" in ops:
        ops.loc[ops["phase"] == Phase.OTHER.value, "attrs"] = pd.NA


# The statuses of a run that verify ended itself, its files closed whole; any other (running, timeout, crashed) may
# have been killed while writing.
_ENDED_BY_VERIFY = (Status.OK.value, Status.SHORT.value, Status.NAN.value, Status.NO_STEPS.value)


def _broken_promises(run_dir: Path, manifest: RunManifest, losses: pd.DataFrame, hparams: pd.DataFrame,
                     tables: Mapping[str, pd.DataFrame], cut: bool) -> list[str]:
    """What the manifest promises that the readable files lack: for each step the run wrote (a run killed mid-write
    may have lost its last), its losses, op records, gradient table and hyperparameters (a training run with an
    optimizer) and outputs (an inference). A run whose script never called backward() promises no loss."""
    written = range(max(0, manifest.steps_completed - cut))
    if not written:
        return []
    steps = f"of the {len(written)} step(s) the manifest records as written"
    broken = []
    if not manifest.inference and manifest.backward_calls != 0 and (
            missing := _missing(losses, written if len(hparams) else _up_to_the_last_loss(losses, written))):
        broken.append(f"{LOSSES} has no loss of step(s) {missing} {steps}")
    if manifest.dump_mode != DumpMode.OFF.value and (missing := _missing(tables[OPS_DIR], written)):
        broken.append(f"{OPS_DIR}/{TABLE_FILE} has no operator records of step(s) {missing} {steps} (it was "
                      f"recorded with --dump {manifest.dump_mode})")
    # The recorder writes a batch of each every step, if only an empty one.
    for folder, why in ((GRADS_DIR, f"though an optimizer stepped ({HPARAMS})" if len(hparams) else ""),
                        (OUTPUTS_DIR, "though the run is an inference" if manifest.inference else "")):
        if why and not (run_dir / folder / TABLE_FILE).is_file():
            broken.append(f"{folder}/{TABLE_FILE} is missing, {why}")
    if unmatched := sorted(set(tables[GRADS_DIR]["step"]) - set(hparams["step"])):
        broken.append(f"{HPARAMS} has no hyperparameters of step(s) {_shown_steps(unmatched)}, whose gradients the "
                      "optimizer stepped with")
    # the last step's rows of a run killed mid-write may be cut short
    return broken + _uneven_hparams(hparams[hparams["step"] < hparams["step"].max()] if cut else hparams)


def _uneven_hparams(hparams: pd.DataFrame) -> list[str]:
    """Rows of hparams.csv lost or renamed: every optimizer step writes its optimizer's class (group "") and each
    param_group's settings. A group may gain a setting (a scheduler made after the first step adds initial_lr), never
    lose one."""
    names = hparams.groupby(["optimizer", "group", "step"])["name"].agg(frozenset)
    for (optimizer, group), steps in names.groupby(level=[0, 1]):
        if any(not later >= earlier for earlier, later in itertools.pairwise(steps.sort_index())):
            return [f"{HPARAMS}: optimizer {optimizer}'s {'group ' + group if group else 'class'} loses settings "
                    "from step to step (rows lost or damaged)"]
        classless = set(hparams.loc[hparams["optimizer"] == optimizer, "step"]) - set(
            steps.index.get_level_values("step") if group == "" else ())
        if group == "" and classless:
            return [f"{HPARAMS}: optimizer {optimizer} has no class at step(s) {_shown_steps(sorted(classless))}"]
    return []


def _up_to_the_last_loss(losses: pd.DataFrame, written: range) -> range:
    """The steps that promise a loss where no optimizer steps (the forwards count the steps: a script updating its
    weights by hand): those up to its last backward. Its forwards after it (pytorch/examples' word_language_model
    evaluates once its data ends) are steps without a loss."""
    last = int(losses["step"].max()) if len(losses) else -1
    return range(min(len(written), last + 1))


def _missing(table: pd.DataFrame, steps: range) -> str:
    """The steps of `steps` that `table` has no row of, as a person reads them ("" none)."""
    missing = sorted(set(steps) - set(table["step"]))
    return _shown_steps(missing) if missing else ""


def _shown_steps(steps: Sequence[int]) -> str:
    return ", ".join(map(str, steps[:8])) + (f" and {len(steps) - 8} more" if len(steps) > 8 else "")


def read_last_collective(run_dir: Path) -> dict[str, Any]:
    """The last collective a rank called ({"step", "op", "module", "count"}), {} where it called none or the record
    cannot be read (a write cut short)."""
    try:
        record = json.loads((Path(run_dir) / LAST_COLLECTIVE).read_bytes())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and isinstance(record.get("count"), int) else {}


def _is_json(cell: str) -> bool:
    try:
        json.loads(cell)
    except json.JSONDecodeError:
        return False
    return True


def _json_or_text(cell: str) -> Any:
    try:
        return json.loads(cell)
    except json.JSONDecodeError:
        return cell
