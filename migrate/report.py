"""The files a person reviews after a port: report.md, findings.csv/json, diff.patch and Huawei-style views.

All of them are views of one findings table (a list of rows, one a finding), so they never disagree. The tables
are a few hundred rows: the `csv` module writes them, as pandas' `to_csv` would, without pandas' import (a third of
a second, more than porting a script costs).
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from migrate import checklist
from migrate.files import sha256, write_keeping
from migrate.types import FileResult, FileStatus
from rules import Action, Finding, Severity
from verify.contract.checklist_items import markdown_code, markdown_row, markdown_text
from verify.contract.files import (CHANGE_LIST_CSV, CHECKLIST_JSON, CHECKLIST_MD, DIFF_PATCH, FINDINGS_CSV,
                                   FINDINGS_JSON, HYPERPARAMETERS_CSV, REPORT_MD, UNSUPPORTED_API_CSV)

Row = dict[str, object]

FINDING_COLUMNS = [
    "path",
    "line",
    "column",
    "end_line",
    "code",
    "severity",
    "action",
    "message",
    "suggestion",
    "checklist",
    "old_code",
    "new_code",
]


@dataclass(frozen=True)
class Summary:
    """Counts over a whole run, and the exit code they imply."""

    files: int
    changed: int
    unchanged: int
    errors: int
    skipped: int
    by_severity: dict[str, int]
    pending: int  # unsafe fixes held back

    @classmethod
    def of(cls, results: Sequence[FileResult]) -> "Summary":
        statuses = Counter(result.status for result in results)
        findings = [finding for result in results for finding in result.findings]
        return cls(
            files=sum(1 for result in results if result.status is not FileStatus.SKIPPED),
            changed=statuses[FileStatus.CHANGED],
            unchanged=statuses[FileStatus.UNCHANGED],
            errors=statuses[FileStatus.ERROR],
            skipped=statuses[FileStatus.SKIPPED],
            by_severity={s.value: sum(1 for f in findings if f.severity is s) for s in Severity},
            pending=sum(1 for f in findings if f.action is Action.PENDING),
        )


def findings_table(results: Sequence[FileResult]) -> list[Row]:
    """One row a finding, its fields in FINDING_COLUMNS' order."""
    rows = [finding.as_row() for result in results for finding in result.findings]
    return [{column: row[column] for column in FINDING_COLUMNS} for row in rows]


REPORT_FILES = (REPORT_MD, FINDINGS_CSV, FINDINGS_JSON, DIFF_PATCH, CHANGE_LIST_CSV, UNSUPPORTED_API_CSV,
                HYPERPARAMETERS_CSV, CHECKLIST_MD, CHECKLIST_JSON)


def write_reports(
    results: Sequence[FileResult], directory: Path, title: str, checklist_items: Sequence[checklist.Item] = (),
    backups: Mapping[Path, Path] | None = None,
) -> dict[Path, str]:
    """Write every report file (REPORT_FILES) into `directory`, a file of the user's there kept at its `backups`
    entry first (--force; migrate/ownership.py refuses it otherwise); returns the paths written and their sha256."""
    findings = findings_table(results)
    files = {
        REPORT_MD: render_markdown(results, title).encode(),
        FINDINGS_CSV: to_csv(findings, FINDING_COLUMNS).encode(),
        FINDINGS_JSON: json.dumps(findings, indent=1, ensure_ascii=False).encode(),
        DIFF_PATCH: "".join(result.diff for result in results).encode(),
        CHANGE_LIST_CSV: to_csv(_change_list(findings), _CHANGE_LIST_COLUMNS).encode(),
        UNSUPPORTED_API_CSV: to_csv(_unsupported_api(findings), _UNSUPPORTED_API_COLUMNS).encode(),
        HYPERPARAMETERS_CSV: to_csv(hyperparameter_table(results), _HYPERPARAMETER_COLUMNS).encode(),
    }
    if checklist_items:
        files[CHECKLIST_MD] = checklist.to_markdown(checklist_items).encode()
        files[CHECKLIST_JSON] = checklist.to_json(checklist_items).encode()
    written = {}
    for name, data in files.items():
        write_keeping(directory / name, data, (backups or {}).get(directory / name))
        written[directory / name] = sha256(data)
    return written


def to_csv(rows: Sequence[Row], columns: Sequence[str]) -> str:
    """`rows` as CSV with a header, None as an empty field, quoted only where needed."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


_HYPERPARAMETER_COLUMNS = ["file", "source", "name", "original", "ported", "original_line", "ported_line", "same"]


def hyperparameter_table(results: Sequence[FileResult]) -> list[Row]:
    """The original's and the port's hyperparameters side by side (checklist C9)."""
    return [
        {
            "file": result.source,
            "source": (original or ported).source,
            "name": (original or ported).name,
            "original": original.value if original else None,
            "ported": ported.value if ported else None,
            "original_line": original.line if original else None,
            "ported_line": ported.line if ported else None,
            "same": bool(original and ported and original.value == ported.value),
        }
        for result in results
        if result.facts is not None
        for original, ported in checklist.hyperparameter_pairs(result.facts)
    ]


_CHANGE_LIST_COLUMNS = ["File", "Start Line", "End Line", "Operation Type", "Message"]


def _change_list(findings: Sequence[Row]) -> list[Row]:
    """Huawei's change_list.csv: File, Start Line, End Line, Operation Type, Message."""
    return [
        dict(zip(_CHANGE_LIST_COLUMNS, (row["path"], row["line"], row["end_line"], row["code"], row["message"])))
        for row in findings
        if row["action"] == Action.CHANGED.value
    ]


_UNSUPPORTED_API_COLUMNS = ["File", "Start Line", "End Line", "OP", "Tips"]


def _unsupported_api(findings: Sequence[Row]) -> list[Row]:
    """Huawei's unsupported_api.csv: File, Start Line, End Line, OP, Tips (everything left for a person)."""
    return [
        dict(zip(_UNSUPPORTED_API_COLUMNS, (
            row["path"], row["line"], row["end_line"], row["old_code"],
            f"{row['code']}: {row['message']} {row['suggestion']}".strip(),
        )))
        for row in findings
        if row["action"] != Action.CHANGED.value and row["severity"] != Severity.INFO.value
    ]


def render_markdown(results: Sequence[FileResult], title: str) -> str:
    summary = Summary.of(results)
    lines = [
        f"# {title}",
        "",
        f"Files: {summary.files} ported, {summary.changed} changed, {summary.unchanged} unchanged, "
        f"{summary.errors} with errors, {summary.skipped} copied as is.",
        "Findings: " + ", ".join(f"{count} {severity}" for severity, count in summary.by_severity.items())
        + (f"; {summary.pending} unsafe fixes held back (apply with --unsafe-fixes)." if summary.pending else "."),
        "",
        "| file | status | output | changes | findings |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        if result.status is FileStatus.SKIPPED:
            continue
        changes = sum(1 for f in result.findings if f.action is Action.CHANGED)
        lines.append(markdown_row([markdown_code(result.source), _status_text(result),
                                   markdown_code(result.target or "-"), changes, len(result.findings) - changes]))
    inference = [result.source for result in results if result.inference]
    if inference:
        lines += ["", "## Inference scripts", ""] + [f"- {markdown_code(source)}: {_INFERENCE_TEXT}"
                                                     for source in inference]
    errors = [result.error for result in results if result.error]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {markdown_text(error)}" for error in errors]
    for heading, wanted in (("Needs a person", _needs_person), ("Changes made", _is_change)):
        chosen = [f for result in results for f in result.findings if wanted(f)]
        if chosen:
            lines += ["", f"## {heading}", ""] + [_finding_line(f) for f in chosen]
    return "\n".join(lines) + "\n"


# Why a file was read as an inference script, and what that changed in its port.
_INFERENCE_TEXT = (
    f"{checklist.INFERENCE_NOTE}. The training-only checks were left out (a model left in eval mode; loss scaling and "
    "autocast, which migrate adds to training steps), and only the random generators it imports are seeded."
)


def _status_text(result: FileResult) -> str:
    """A file that could not be ported but was copied unchanged into a folder's port says so."""
    copied = result.status is FileStatus.ERROR and result.target
    return f"{result.status.value}, copied unchanged" if copied else result.status.value


def _needs_person(finding: Finding) -> bool:
    return finding.action is not Action.CHANGED


def _is_change(finding: Finding) -> bool:
    return finding.action is Action.CHANGED


def finding_text(finding: Finding) -> str:
    """`path:line:col: SEVERITY CODE: message` as tf_upgrade_v2 and compilers print it."""
    return f"{finding.location}: {finding.severity.value.upper()} {finding.code}: {finding.message}"


def _finding_line(finding: Finding) -> str:
    suggestion = f"\n  - suggestion: {markdown_text(finding.suggestion)}" if finding.suggestion else ""
    return f"- {markdown_code(finding_text(finding))}{suggestion}"
