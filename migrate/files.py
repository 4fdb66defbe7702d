"""From paths on the command line to ported files on disk: plan, read, port in parallel, write atomically.

The original is never written unless `in_place` is asked for; every file is read and written as bytes in its own
encoding, BOM and line endings, so only what a rule changed differs.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
import tokenize
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

from migrate import collector
from migrate.diff import unified_diff
from migrate.facts import file_facts
from migrate.line_length import configured_line_length
from migrate.parsing import check_size, too_deep
from migrate.types import FileResult, FileStatus, SourceError
from rules import Settings
from verify.contract.files import PORT_SUFFIX, REPORT_MD, REPORT_SUFFIX, port_name, report_folder

if TYPE_CHECKING:
    from rules import PortRule

SKIPPED_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".venv", "venv", ".tox", ".mypy_cache", ".pytest_cache"}


class PlanError(Exception):
    """The paths asked for cannot be ported (missing input, output over input, a user's file in the way, ...)."""


def shown_path(path: Path | str) -> str:
    """A path as reports and the terminal show it: the OS's name as it is, bytes that are not UTF-8 as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class Job:
    """One file to port (`port`) or copy as is (`port` False) from `source` to `target`."""

    source: Path
    target: Path  # where the output goes, or would go (named in the diff) when `write` is off
    port: bool
    settings: Settings
    write: bool = True  # False under --check and --diff
    is_own_output: bool = False  # NAME_npu.py from an earlier run: written only if porting it changes something
    mirror: bool = False  # part of a folder's copy (FOLDER_npu/): copied unchanged where it cannot be ported
    backup: Path | None = None  # --force over a file the user changed: its bytes are kept here before it is replaced


def plan(
    paths: Sequence[Path],
    settings: Settings,
    out: Path | None = None,
    in_place: bool = False,
    write: bool = True,
    suffix: str = PORT_SUFFIX,
    report_dir: Path | None = None,
    left_out: list[str] | None = None,
) -> list[Job]:
    """Decide, for every input path, what is read and where it is written; PlanError before anything is written
    where an output would replace a file of the user's. What a
    folder's walk leaves out that the user may look for (an earlier port, a symlinked folder) is appended to
    `left_out`, a line each."""
    if out is not None and in_place:
        raise PlanError("--out and --in-place exclude each other")
    if out is not None and len(paths) > 1:
        raise PlanError("--out takes one input path; give several paths without --out")
    jobs: list[Job] = []
    for path in paths:
        if not path.exists():
            raise PlanError(f"{path}: no such file or directory")
        if path.is_dir():
            target_root = path if in_place else out or _sibling(path, suffix)
            _refuse_overwrite(path, target_root, in_place)
            if write and out is None and not in_place:
                _refuse_user_output(path, target_root, report_dir)
            folder_jobs = _plan_folder(path, target_root, settings, left_out if left_out is not None else [])
            jobs.extend(replace(job, write=write) for job in folder_jobs)
        else:
            target = path if in_place else _file_target(path, out, suffix)
            _refuse_overwrite(path, target, in_place)
            if write and out is None and not in_place:
                _refuse_user_output(path, target, report_dir)
            own_output = out is None and not in_place and path.stem.endswith(suffix)
            entry = replace(settings, is_entry=True, line_length=configured_line_length(path))
            jobs.append(Job(path, target, port=True, settings=entry, write=write, is_own_output=own_output))
    return jobs


def _refuse_overwrite(source: Path, target: Path, in_place: bool) -> None:
    if not in_place and target.resolve() == source.resolve():
        raise PlanError(f"{shown_path(target)}: the output would overwrite the input; pass --in-place to mean that")


def _refuse_user_output(source: Path, target: Path, report_dir: Path | None) -> None:
    """The name migrate would give the port (NAME_npu.py, FOLDER_npu/) is taken by something that is not an earlier
    port (whose report folder is beside it, or whose report in --report-dir names it): the user's own file, which
    must survive. -o names an output explicitly."""
    taken = target.is_file() or target.is_symlink() or (target.is_dir() and any(target.iterdir()))
    if taken and not _is_earlier_port(target, report_dir):
        raise PlanError(
            f"{shown_path(target)} already exists and is not an earlier port of {shown_path(source)} (no "
            f"{report_folder(target).name}/ beside it): nothing was written; name the port otherwise with "
            "--suffix or -o")


def _is_earlier_port(target: Path, report_dir: Path | None) -> bool:
    if report_folder(target).is_dir():
        return True
    report = report_dir / REPORT_MD if report_dir is not None else None
    try:
        return report is not None and f"`{shown_path(target)}`" in report.read_text(errors="replace")
    except OSError:
        return False


def _sibling(folder: Path, suffix: str) -> Path:
    folder = folder.resolve()
    return folder.with_name(f"{folder.name}{suffix}")


def _file_target(path: Path, out: Path | None, suffix: str) -> Path:
    if out is None:
        return port_name(path, suffix)
    return out / path.name if out.is_dir() or out.suffix != ".py" else out


def _plan_folder(root: Path, target_root: Path, settings: Settings, left_out: list[str]) -> Iterator[Job]:
    in_place = target_root.resolve() == root.resolve()
    for source in _walk(root, None if in_place else target_root.resolve(), left_out):
        target = target_root / source.relative_to(root)
        if source.suffix == ".py":
            own = replace(settings, is_entry=has_main_guard(source), line_length=configured_line_length(source))
            yield Job(source, target, port=True, settings=own, mirror=not in_place)
        elif not in_place:
            yield Job(source, target, port=False, settings=settings)


def _walk(root: Path, skip: Path | None, left_out: list[str]) -> Iterator[Path]:
    """Files under root in a stable order, without migrate's own outputs from earlier runs.

    Left out: hidden and tool folders, the output folder itself, report folders (NAME_npu_report/), dangling links,
    and, each named in `left_out`, the ports of earlier runs (NAME_npu.py or FOLDER_npu/ with its report folder
    beside it; without one it is the user's own, and is kept) and symlinked folders: not followed, as they may lead
    out of the folder (a port would copy what is not the project's) or into a loop; their targets are ported apart.
    """
    for folder, dirs, files in os.walk(root, followlinks=False):
        kept = []
        for name in sorted(dirs):
            path = Path(folder) / name
            tool = (name in SKIPPED_DIRS or name.startswith(".")
                    or name.endswith((".egg-info", PORT_SUFFIX + REPORT_SUFFIX)))
            if tool or (skip is not None and path.resolve() == skip):
                continue
            if path.is_symlink():
                left_out.append(f"{shown_path(path)}: a symbolic link to a folder, not followed (it may lead out of "
                                f"the folder or into a loop): port {shown_path(path.resolve())} on its own if needed")
            elif _is_port_in_folder(path, dirs):
                left_out.append(f"{shown_path(path)}: an earlier port (its report folder is beside it), not ported "
                                "again")
            else:
                kept.append(name)
        dirs[:] = kept
        for name in sorted(files):
            path = Path(folder) / name
            if not path.is_file():  # a dangling link is not a file
                continue
            if _is_port_in_folder(path, files):
                left_out.append(f"{shown_path(path)}: an earlier port (its report folder is beside it), not ported "
                                "again")
            else:
                yield path


def _is_port_in_folder(path: Path, siblings: Sequence[str]) -> bool:
    """NAME_npu.py beside NAME.py, or FOLDER_npu/ beside FOLDER/, with its report folder beside it."""
    if path.is_dir():
        name, extension = path.name, ""
    elif path.suffix == ".py":
        name, extension = path.stem, path.suffix
    else:
        return False
    original = name.removesuffix(PORT_SUFFIX)
    return original != name and original + extension in siblings and report_folder(path).is_dir()


def has_main_guard(path: Path) -> bool:
    try:
        return b"__main__" in path.read_bytes()
    except OSError:
        return False


# ----- one file ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decoded:
    text: str
    encoding: str
    bom: bool


def decode(data: bytes, path: str) -> Decoded:
    """Bytes to text with the encoding Python itself would use (BOM, PEP 263 cookie, else utf-8)."""
    if b"\0" in data:
        raise SourceError(path, 1, 1, "binary file (contains NUL bytes), not Python source")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as error:
        raise SourceError(path, 1, 1, f"cannot read the encoding: {error.msg}") from None
    bom = encoding == "utf-8-sig"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise SourceError(path, line, 1, f"not valid {encoding} ({error.reason}); declare the encoding") from None
    return Decoded(text.removeprefix("\ufeff") if bom else text, encoding, bom)


def read_source(path: Path) -> Decoded:
    """A source file's text, once its size is within what the parser can read (migrate/parsing.py)."""
    shown = shown_path(path)
    check_size(path, shown)
    return decode(path.read_bytes(), shown)


def encode(text: str, decoded: Decoded) -> bytes:
    return text.encode("utf-8-sig" if decoded.bom else decoded.encoding)


def run_job(job: Job, rules: Sequence[type[PortRule]]) -> FileResult:
    """Port or copy one file; every failure becomes a FileResult with status ERROR, never an exception.

    This is the per-file boundary: a bug in one rule on one file is reported as that file's internal error, and the
    other files of the run are still ported.
    """
    source = shown_path(job.source)
    try:
        if not job.port:
            written = write_output(job, job.source.read_bytes()) if job.write else ""
            return FileResult(source, shown_path(job.target) if job.write else None, FileStatus.SKIPPED,
                              written=written)
        return _port(job, rules)
    except SourceError as error:
        return _not_ported(job, str(error))
    except RecursionError:
        return _not_ported(job, str(too_deep(source)))
    except OSError as error:
        where = shown_path(error.filename or job.target)
        return FileResult(source, None, FileStatus.ERROR, error=f"{where}: {error.strerror or error}")
    except Exception as error:  # noqa: BLE001 - see the docstring
        internal = f"internal error: {type(error).__name__}: {error} (please report this bug)"
        return _not_ported(job, f"{source}:1:1: {internal}")


def _not_ported(job: Job, error: str) -> FileResult:
    """A file that could not be ported. In a folder's copy it is copied unchanged, so that every file of the folder
    arrives (the report says so); elsewhere nothing is written for it."""
    target, written = None, ""
    if job.write and job.mirror:
        try:
            written = write_output(job, job.source.read_bytes())
            target = shown_path(job.target)
        except OSError as failure:
            error += f"; not copied either: {failure.strerror or failure}"
    return FileResult(shown_path(job.source), target, FileStatus.ERROR, error=error, written=written)


def _port(job: Job, rules: Sequence[type[PortRule]]) -> FileResult:
    from migrate.engine import migrate_source  # libcst and the rules' machinery: loaded when a file is ported

    source, target = shown_path(job.source), shown_path(job.target)
    decoded = read_source(job.source)
    with collector.paused():  # the checklist's facts, one more parse, only for a run that writes its reports
        result = migrate_source(decoded.text, source, job.settings, rules)
        facts = file_facts(result.original, result.code, result.rules_run, job.source.parent) if job.write else None
    diff = unified_diff(result.original, result.code, str(job.source), str(job.target))  # names quoted as git does
    writes = job.write and _writes(job, result.changed)
    written = write_output(job, encode(result.code, decoded)) if writes else ""
    status = FileStatus.CHANGED if result.changed else FileStatus.UNCHANGED
    return FileResult(source, target if writes else None, status, result.findings, diff, facts=facts,
                      inference=result.inference, written=written)


def _writes(job: Job, changed: bool) -> bool:
    """Whether a ported file is written: an earlier run's NAME_npu.py that needs nothing more is not copied to
    NAME_npu_npu.py, and an unchanged file is not written over itself (--in-place)."""
    return changed or (not job.is_own_output and job.target != job.source)


def fresh_output(job: Job, rules: Sequence[type[PortRule]]) -> bytes | None:
    """The bytes running `job` would write now; None where it would write nothing (a port that fails outside a
    folder's copy, an earlier port that needs nothing more). Reads, never writes."""
    from migrate.engine import migrate_source

    try:
        if not job.port:
            return job.source.read_bytes()
        decoded = read_source(job.source)
        result = migrate_source(decoded.text, shown_path(job.source), job.settings, rules)
    except Exception:  # noqa: BLE001 - as run_job: a file that cannot be ported is copied unchanged into a folder's port
        return job.source.read_bytes() if job.mirror else None
    return encode(result.code, decoded) if _writes(job, result.changed) else None


def write_output(job: Job, data: bytes) -> str:
    """Write `data` to the job's target unless it holds them already (a port run again changes nothing, not even a
    time stamp), keeping the file it replaces at `job.backup` first; returns the data's sha256, which the report
    folder records (migrate/ownership.py)."""
    write_keeping(job.target, data, job.backup, like=job.source)
    return sha256(data)


def write_keeping(target: Path, data: bytes, backup: Path | None = None, like: Path | None = None) -> None:
    """Write `data` to `target` unless it holds them already, keeping the file it replaces at `backup` first (a
    port or report file the user changed, under --force: migrate/ownership.py)."""
    current = target.read_bytes() if target.is_file() else None
    if current != data:
        if backup is not None and current is not None:
            write_atomic(backup, current, like=target)
        write_atomic(target, data, like=like)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_atomic(target: Path, data: bytes, like: Path | None = None) -> None:
    """Write through a temporary file in the same folder and rename it over the target: never half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        if like is not None:
            shutil.copymode(like, temporary)
        else:  # mkstemp makes it 0600; a new file's mode is the umask's, as open() would have made it
            os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask (only readable by setting it: set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ----- many files -------------------------------------------------------------------------------------------


def run_jobs(
    jobs: Sequence[Job],
    rules: Sequence[type[PortRule]],
    workers: int = 1,
    on_result: Callable[[FileResult], None] | None = None,
) -> list[FileResult]:
    """Run every job, in `workers` processes; results come back in the order of `jobs`."""
    results: Iterable[FileResult]
    if workers <= 1 or len(jobs) < 2:
        results = (run_job(job, rules) for job in jobs)
        return _collect(results, on_result)
    _warm_up(rules)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        chunk = max(1, len(jobs) // (workers * 8))
        return _collect(pool.map(run_job, jobs, [rules] * len(jobs), chunksize=chunk), on_result)


def _collect(results: Iterable[FileResult], on_result: Callable[[FileResult], None] | None) -> list[FileResult]:
    collected = []
    for result in results:
        collected.append(result)
        if on_result is not None:
            on_result(result)
    return collected


def _warm_up(rules: Sequence[type[PortRule]]) -> None:
    """Load the parser and fill the per-type caches once, before the workers fork, instead of once per worker."""
    from migrate.engine import migrate_source

    try:
        migrate_source(_WARM_UP_SOURCE, "<warm-up>", Settings(), rules)
    except Exception:  # noqa: BLE001 - a rule failing here fails again, per file, where it is reported
        pass


_WARM_UP_SOURCE = """import torch
import torch.nn as nn


class Net(nn.Module):
    def forward(self, x):
        return [v.cuda() for v in x if v is not None], {"k": x[0]}, lambda y: y + 1


def main(device="cuda"):
    with torch.no_grad() as guard:
        for step, (x, y) in enumerate([]):
            loss = Net()(x.to(device))
            loss.backward()


if __name__ == "__main__":
    main()
"""
