"""A port the user edited is theirs: what migrate wrote is recorded, and a file changed since is never replaced unasked.

Every run that writes records, in its report folder (written.json), the sha256 of each file it wrote, by its path
relative to that folder. Before the next run writes anything, each target on disk is checked: one that holds what
migrate last wrote there, or what it would write now (nothing would be lost), is migrate's to replace; any other was
changed by someone, and the run stops (exit 2) naming it and the lines that differ, unless --force, which keeps the
file beside it (NAME.bak, NAME.bak.1, ...) before replacing it.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from migrate.files import Job, PlanError, fresh_output, sha256, shown_path, write_keeping
from migrate.types import FileResult
from verify.contract.files import WRITTEN_JSON, report_folder

if TYPE_CHECKING:
    from rules import PortRule

SHOWN_PLACES = 6  # places named in one refusal; the others are counted


@dataclass(frozen=True)
class Edit:
    """A file migrate would replace that holds neither what migrate last wrote there nor (a port) what it would
    write now: a port the user edited, or a file of the user's in the report folder (report.md, findings.csv...)."""

    target: Path
    recorded: bool  # whether the report folder has a record of what migrate wrote there
    lines: str  # a port's "at line 3, lines 7-9": where it differs from the port migrate would write now
    backup: Path
    report: bool = False  # one of the report folder's files, whose new bytes are known only once the run is done

    def refusal(self) -> str:
        target = shown_path(self.target)
        if self.recorded:
            why = "was changed since migrate wrote it"
        elif self.report:
            why = "is a file migrate did not write (written.json beside it has no record of it)"
        else:
            why = "is not what migrate would write and migrate has no record of writing it"
        if self.report:
            return (f"{target} {why}; nothing was written. Move it, or name another report folder with --report-dir, "
                    f"or pass --force to write the reports, your file kept as {shown_path(self.backup.name)} first")
        return (f"{target} {why}: it differs from the new port {self.lines}; nothing was written. Keep your "
                "changes (move them into the original, or name the new port with -o or --suffix), or pass --force "
                f"to port again, your file kept as {shown_path(self.backup.name)} first")


def edits(jobs: Sequence[Job], rules: Sequence[type[PortRule]], report_dir: Path) -> list[Edit]:
    """The targets the run would replace although they hold what someone else wrote (reads, never writes)."""
    record = read_record(report_dir)
    found = []
    for job in jobs:
        if not job.write or job.target == job.source or not job.target.is_file():
            continue
        current = job.target.read_bytes()
        recorded = record.get(_key(job.target, report_dir))
        if recorded == sha256(current):
            continue
        fresh = fresh_output(job, rules)
        if fresh is not None and fresh != current:
            found.append(Edit(job.target, recorded is not None, _changed_lines(current, fresh), backup_path(job.target)))
    return found


def report_edits(report_dir: Path, names: Sequence[str]) -> list[Edit]:
    """The files of the report folder migrate would replace (`names`, and written.json, its record) that it did
    not write: the user's own report.md or findings.csv where --report-dir points, or edited since. Reads only."""
    record, found = read_record(report_dir), []
    for name in names:
        path = report_dir / name
        if path.is_file() and record.get(_key(path, report_dir)) != sha256(path.read_bytes()):
            found.append(Edit(path, _key(path, report_dir) in record, "", backup_path(path), report=True))
    written = report_dir / WRITTEN_JSON
    if written.is_file() and not record and written.read_bytes() != _record_bytes({}):  # not a record of ours
        found.append(Edit(written, False, "", backup_path(written), report=True))
    return found


def refuse_ports(paths: Sequence[Path], suffix: str, report_dir: Path | None) -> None:
    """PlanError where a path asked for is a port migrate wrote: porting it again would write NAME_npu_npu.py and a
    report of a report. Its original is what to port again (an edited port is guarded by edits() above)."""
    for path in paths:
        why = _written_by_migrate(path, suffix, report_dir) if path.is_file() else ""
        if why:
            raise PlanError(f"{shown_path(path)} is a port migrate wrote ({why}): nothing was written; port its "
                            "original instead (a port you edited is kept unless --force), or name an output with -o")


def _written_by_migrate(path: Path, suffix: str, report_dir: Path | None) -> str:
    """Why `path` is one of migrate's outputs ("" if it is not): a record of what was written that names it
    (--report-dir's, the report folder beside it, or that of one of its folders: a folder's port), or, for a port
    written before migrate kept records, its name (NAME_npu.py) and the report folder beside it."""
    beside = report_folder(path)
    folders = [report_dir] if report_dir is not None else []
    folders += [beside, *(report_folder(folder) for folder in Path(os.path.abspath(path)).parents if folder.name)]
    for folder in folders:
        if _key(path, folder) in read_record(folder):
            return f"{shown_path(folder / WRITTEN_JSON)} records it"
    if path.stem.endswith(suffix) and beside.is_dir():
        return f"{shown_path(beside.name)}/ is beside it"
    return ""


def keeping_backups(jobs: Sequence[Job], found: Sequence[Edit]) -> list[Job]:
    """The jobs, each that replaces an edited file told where to keep it first (--force)."""
    backups = backups_of(found)
    return [replace(job, backup=backups.get(job.target)) for job in jobs]


def backups_of(found: Sequence[Edit]) -> dict[Path, Path]:
    """Where each file --force replaces is kept first."""
    return {edit.target: edit.backup for edit in found}


def backup_path(target: Path) -> Path:
    """NAME.bak beside the target, or NAME.bak.1, .2, ...: an earlier backup is never replaced."""
    candidate, number = target.with_name(f"{target.name}.bak"), 0
    while candidate.exists() or candidate.is_symlink():
        number += 1
        candidate = target.with_name(f"{target.name}.bak.{number}")
    return candidate


def recorded(path: Path, report_dir: Path) -> str | None:
    """The sha256 of what migrate last wrote at `path`, as `report_dir`'s record has it; None where it has none."""
    return read_record(report_dir).get(_key(path, report_dir))


def read_record(report_dir: Path) -> dict[str, str]:
    """path (relative to the report folder) -> sha256 of what migrate wrote there; {} where none can be read."""
    try:
        files = json.loads((report_dir / WRITTEN_JSON).read_bytes())["files"]
        return {path: digest for path, digest in files.items() if isinstance(digest, str)}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):  # absent, or not a record of ours
        return {}


def write_record(report_dir: Path, jobs: Sequence[Job], results: Sequence[FileResult],
                 reports: Mapping[Path, str], backup: Path | None = None) -> Path:
    """Adds what this run wrote, its ports and its `reports` (path -> sha256), to the report folder's record (the
    other files it names keep their entries); a written.json not of ours is kept at `backup` first (--force)."""
    record = read_record(report_dir) | {
        _key(job.target, report_dir): result.written for job, result in zip(jobs, results) if result.written}
    record |= {_key(path, report_dir): digest for path, digest in reports.items()}
    path = report_dir / WRITTEN_JSON
    write_keeping(path, _record_bytes(record), backup)
    return path


def _record_bytes(record: Mapping[str, str]) -> bytes:
    return json.dumps({"files": dict(sorted(record.items()))}, indent=1).encode()


def _key(target: Path, report_dir: Path) -> str:
    # relative: a project moved or checked out elsewhere, its report folder with it, keeps its record
    return os.fsdecode(os.path.relpath(os.path.abspath(target), os.path.abspath(report_dir)))


def _changed_lines(current: bytes, fresh: bytes) -> str:
    """Where `current` differs from `fresh`, by its own line numbers: "at line 3, lines 7-9, after line 40"."""
    mine, theirs = current.decode(errors="replace").splitlines(), fresh.decode(errors="replace").splitlines()
    places = [_place(start, end) for tag, start, end, _, _ in
              difflib.SequenceMatcher(None, mine, theirs, autojunk=False).get_opcodes() if tag != "equal"]
    more = f" and {len(places) - SHOWN_PLACES} more places" if len(places) > SHOWN_PLACES else ""
    return "at " + ", ".join(places[:SHOWN_PLACES]) + more if places else "in its line endings or encoding"


def _place(start: int, end: int) -> str:
    if end == start:  # lines the new port has and the file lacks
        return f"after line {start}" if start else "before line 1"
    return f"line {end}" if end == start + 1 else f"lines {start + 1}-{end}"
