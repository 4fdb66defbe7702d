"""Render a ComparisonResult: terminal summary (rich), report.html, ops.csv, ops.xlsx, advice.txt, summary.json.

Renders only: every number comes from compare.py. report.html is one self-contained file (inline SVG plots, inline
CSS, no script, no external resource) so it can be mailed and opened offline.
"""

from __future__ import annotations

import html
import json
import math
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
from openpyxl import Workbook
from openpyxl.cell import WriteOnlyCell
from openpyxl.styles import Font, PatternFill
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from verify import environment
from verify.advice import Advice, advise
from verify.align import AlignStatus
from verify.checklist_items import CHECKLIST_JSON  # written by `migrate` (id, title, status, evidence, action)
from verify.compare import ComparisonResult
from verify.devices import title
from verify.schema import OP_COLUMNS, OP_KEY_PARTS, OP_SHARED_COLUMNS, OP_SIDE_COLUMNS, STAT_COLUMNS, shown, shown_json
from verify.store import Run, op_keys

SUMMARY_JSON = "summary.json"
XLSX_MAX_ROWS = 200_000  # openpyxl writes ~20k styled rows/s; ops.csv always has every row
HTML_MAX_OP_ROWS = 200
# ops.csv/xlsx: the pair's shared columns and verdict, each side's columns side by side (every per-side column of the
# schema, so a statistic added there reaches the reports), then compare's differences and metrics.
_VERDICT_COLUMNS = ["status", "passed", "judged_by"]
_LEADING_SIDE_COLUMNS = ["op", "dtype", "shape"]
_TRAILING_SIDE_COLUMNS = ["seq", "key"]


def _both_sides(columns: list[str]) -> list[str]:
    return [f"{side}_{column}" for column in columns for side in ("ref", "actual")]


def op_report_columns(ops: pd.DataFrame) -> list[str]:
    side_columns = [c for c in OP_SIDE_COLUMNS if c not in (*_LEADING_SIDE_COLUMNS, *_TRAILING_SIDE_COLUMNS)]
    metric_columns = [c for c in ops.columns if not c.startswith(("ref_", "actual_"))
                      and c not in (*OP_SHARED_COLUMNS, *_VERDICT_COLUMNS, "note")]
    return [*OP_SHARED_COLUMNS, *_VERDICT_COLUMNS, *_both_sides(_LEADING_SIDE_COLUMNS), "stats_error", "tolerance",
            *_both_sides(side_columns), *(c for c in metric_columns if c not in ("stats_error", "tolerance")),
            *_both_sides(_TRAILING_SIDE_COLUMNS), "note"]


# Row colours by status (xlsx fills, html classes); a row past tolerance is red whatever its status.
STATUS_COLOURS = {"exact": "FFFFFF", "related": "DDEBF7", "sequence": "FFF2CC", "only_ref": "E7E6E6",
                  "only_actual": "FCE4D6", "failed": "F8CBAD"}


def op_report_frame(result: ComparisonResult) -> pd.DataFrame:
    """The ops table as written to ops.csv/xlsx, with each side's key (schema.op_key's format) rebuilt."""
    ops = result.ops
    keys = {f"{side}_key": _op_keys(ops, side).where(ops[f"{side}_op"].notna()) for side in ("ref", "actual")}
    ops = ops.assign(**keys)
    return ops.reindex(columns=op_report_columns(ops))


def _op_keys(ops: pd.DataFrame, side: str) -> pd.Series:
    """Each side's key: the parts a pair shares, then the side's own."""
    return op_keys({name: ops[name] if name in OP_SHARED_COLUMNS else ops[f"{side}_{name}"]
                    for name, _ in OP_KEY_PARTS})


def _row_colour(status: str, passed: Any) -> str:
    return STATUS_COLOURS["failed"] if passed is False else STATUS_COLOURS.get(status, "FFFFFF")


# --- files -------------------------------------------------------------------------------------------------------


def find_checklist(*places: Path | None) -> list[dict[str, Any]] | None:
    """migrate's checklist.json next to (in, or beside) a run or report folder, first found wins."""
    for place in places:
        if place is None:
            continue
        for folder in (place, place.parent):
            candidate = folder / CHECKLIST_JSON
            try:
                items = json.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(items, list):
                return [item for item in items if isinstance(item, dict)]
    return None


def write_xlsx(frame: pd.DataFrame, path: Path) -> None:
    workbook = Workbook(write_only=True)
    sheet = workbook.create_sheet("ops")
    sheet.freeze_panes = "A2"
    bold = Font(bold=True)
    sheet.append([_styled(sheet, name, font=bold) for name in frame.columns])
    fills = {colour: PatternFill("solid", start_color=colour) for colour in STATUS_COLOURS.values()}
    shown = frame.head(XLSX_MAX_ROWS)
    status_at, passed_at = shown.columns.get_loc("status"), shown.columns.get_loc("passed")
    for values in shown.astype(object).where(shown.notna(), None).itertuples(index=False, name=None):
        fill = fills[_row_colour(values[status_at], values[passed_at])]
        sheet.append([_styled(sheet, value, fill=fill) for value in values])
    if len(frame) > XLSX_MAX_ROWS:
        sheet.append([f"{len(frame) - XLSX_MAX_ROWS} more rows in ops.csv"])
    workbook.save(path)


def _styled(sheet: Any, value: Any, **style: Any) -> WriteOnlyCell:
    if isinstance(value, float) and not np.isfinite(value):
        value = str(value)  # Excel has no inf/nan
    cell = WriteOnlyCell(sheet, value=value)
    for name, setting in style.items():
        setattr(cell, name, setting)
    return cell


def advice_text(result: ComparisonResult, advice: Sequence[Advice]) -> str:
    lines = [result.verdict.reason, f"Comparison: {result.policy.description}", ""]
    lines += [f"- {finding.message}" for finding in result.findings]
    lines += ["", "What to do:"] if advice else ["", "Nothing to do."]
    lines += [f"{n}. {item.message}" + (f" [checklist {', '.join(item.checklist)}]" if item.checklist else "")
              for n, item in enumerate(advice, 1)]
    return "\n".join(lines) + "\n"


def json_data(value: Any) -> Any:
    """Plain JSON data: numpy and pandas scalars as Python numbers and bools, NaN, inf and NA as null, sequences and
    arrays as lists, enums and paths as their text. Every JSON file verify writes goes through it (write_json)."""
    if isinstance(value, dict):
        return {str(key): json_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset, np.ndarray, pd.Series, pd.Index)):
        return [json_data(item) for item in value]
    if isinstance(value, Enum):
        return json_data(value.value)
    if isinstance(value, np.generic):
        value = value.item()  # numpy bool, int, float, str -> Python's
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if pd.isna(value):  # pd.NA, NaT
        return None
    return str(value)  # a path, a timestamp: their text rather than a report lost to a TypeError


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(json_data(data), indent=1, allow_nan=False), encoding="utf-8")


def write_reports(result: ComparisonResult, out: Path, checklist: list[dict[str, Any]] | None = None,
                  summary: dict[str, Any] | None = None) -> list[Path]:
    """Every report of a comparison; `summary`: sections only the caller knows (the pair's), in summary.json."""
    out.mkdir(parents=True, exist_ok=True)
    advice = advise(result.findings)
    frame = op_report_frame(result)
    summary = result.summary() | {"advice": [item.message for item in advice]} | (summary or {})
    paths = {name: out / name for name in
             (SUMMARY_JSON, "ops.csv", "ops.xlsx", "advice.txt", "report.html", "losses.csv")}
    write_json(paths[SUMMARY_JSON], summary)
    frame.to_csv(paths["ops.csv"], index=False)
    write_xlsx(frame, paths["ops.xlsx"])
    paths["advice.txt"].write_text(advice_text(result, advice), encoding="utf-8")
    result.loss.frame.to_csv(paths["losses.csv"], index=False)
    paths["report.html"].write_text(render_html(result, advice, checklist), encoding="utf-8")
    return list(paths.values())


# --- terminal ----------------------------------------------------------------------------------------------------


def _emulation(run: Run) -> str:
    """"EMULATED NPU", "EMULATED CUDA": what a run's device stood in for."""
    return title(run.manifest.device, run.manifest.emulated_on).split(" (")[0]


def _emulation_banners(result: ComparisonResult) -> list[str]:
    return [f"{side.upper()} RAN ON AN {_emulation(run)}: {run.manifest.title}"
            for side, run in (("ref", result.ref), ("actual", result.actual)) if run.manifest.emulated]


def _emulated_devices(result: ComparisonResult) -> str:
    """' (EMULATED NPU, EMULATED CUDA)': the emulations the comparison ran on, for its title."""
    names = [_emulation(run) for run in (result.ref, result.actual) if run.manifest.emulated]
    return f" ({', '.join(dict.fromkeys(names))})" if names else ""


def diverging_rows(result: ComparisonResult, limit: int) -> pd.DataFrame:
    """Rows past tolerance, in execution order, then unmatched rows (those without an expected-one-side note)."""
    ops = result.ops
    failing = ops.loc[ops["passed"] == False]  # noqa: E712 (nullable boolean: NA rows are unmatched, not failing)
    one_sided = ops["status"].isin([AlignStatus.ONLY_REF.value, AlignStatus.ONLY_ACTUAL.value])
    unmatched = ops.loc[one_sided & ops["note"].isna()]
    return pd.concat([failing.head(limit), unmatched.head(max(0, limit - len(failing)))])


def print_summary(result: ComparisonResult, console: Console, max_rows: int = 10) -> None:
    for banner in _emulation_banners(result):
        console.print(f"[bold black on yellow] {banner} [/]")
    colour = "green" if result.verdict.passed else "red"
    console.print(f"[bold {colour}]{escape(shown(result.verdict.reason))}[/]")
    console.print(f"comparison: {result.policy.description}")
    console.print(f"ref:    {escape(shown(result.ref.manifest.title))} ({result.ref.source})")
    console.print(f"actual: {escape(shown(result.actual.manifest.title))} ({result.actual.source})")
    loss = result.loss
    if loss.steps_compared:
        console.print(f"loss: {loss.steps_compared} steps, max rel diff {loss.max_rel_diff:.3%}, mean "
                      f"{loss.mean_rel_diff:.3%}, tolerance {loss.rtol:.2%}, first step past tolerance: "
                      f"{loss.first_step_past_tolerance if loss.first_step_past_tolerance is not None else 'none'}")
    counts = result.status_counts()
    console.print(f"ops: not compared, {result.ops_not_compared}" if result.ops_not_compared else
                  "ops: " + ", ".join(f"{status} {count}" for status, count in counts.items()))
    if result.first_divergent:
        console.print(_divergence_table(result.first_divergent))
    rows = diverging_rows(result, max_rows)
    if len(rows):
        table = Table(title="ops past tolerance or unmatched", title_justify="left")
        for column in ("step", "phase", "module", "ref_op", "io", "status", "stats_error", "tolerance"):
            table.add_column(column)
        for row in rows.itertuples(index=False):
            table.add_row(*(_cell(getattr(row, c)) for c in ("step", "phase", "module", "ref_op", "io", "status",
                                                             "stats_error", "tolerance")))
        console.print(table)
    for finding in result.findings:
        console.print(f"- {escape(shown(finding.message))}")
    for n, item in enumerate(advise(result.findings), 1):
        console.print(f"[bold]{n}.[/] {escape(shown(item.message))}")
    for note in result.notes:
        console.print(f"[dim]note: {escape(shown(note))}[/]")


def _divergence_table(first: dict[str, Any]) -> Table:
    table = Table(title=f"first divergent operator: {first['op']} ({first['module'] or 'top level'}, "
                        f"{first['phase']}, step {first['step']}, {first['io']})", title_justify="left")
    table.add_column("")
    for stat in first["ref"]:
        table.add_column(stat)
    for side in ("ref", "actual"):
        table.add_row(side, *(_cell(value) for value in first[side].values()))
    return table


def _cell(value: Any) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def print_saved_summary(summary: dict[str, Any], console: Console) -> None:
    colour = "green" if summary.get("passed") else "red"
    for side in ("ref", "actual"):
        if summary.get(side, {}).get("emulated"):
            console.print(f"[bold black on yellow] {side.upper()} RAN ON AN EMULATED DEVICE: "
                          f"{summary[side]['title']} [/]")
    console.print(f"[bold {colour}]{escape(shown(str(summary.get('reason', ''))))}[/]")
    console.print(f"comparison: {escape(shown(str(summary.get('comparison', ''))))}")
    for finding in summary.get("findings", []):
        console.print(f"- {escape(shown(str(finding['message'])))}")
    for n, text in enumerate(summary.get("advice", []), 1):
        console.print(f"[bold]{n}.[/] {escape(shown(str(text)))}")


def print_run(run: Run, console: Console) -> None:
    manifest = run.manifest
    if manifest.emulated:
        console.print(f"[bold black on yellow] {escape(shown(manifest.title))} [/]")
    console.print(f"[bold]{escape(shown(manifest.title))}[/] ({run.source})")
    console.print(f"status {escape(shown(manifest.status))}, {manifest.steps_completed}/{manifest.steps_requested} "
                  f"steps, dump {escape(shown(manifest.dump_mode))}, {len(run.ops)} op records"
                  + (f": {escape(shown(manifest.message))}" if manifest.message else ""))
    if len(run.losses):
        table = Table("step", "micro_step", "loss", "loss_scale")
        for row in run.losses.itertuples(index=False):
            table.add_row(str(row.step), str(row.micro_step), _cell(row.loss), _cell(row.loss_scale))
        console.print(table)
    for note in run.notes:
        console.print(f"[dim]note: {escape(shown(note))}[/]")


# --- html --------------------------------------------------------------------------------------------------------


def svg_plot(series: dict[str, tuple[Sequence[float], Sequence[float]]], title: str, y_label: str,
             limit: float | None = None, width: int = 560, height: int = 260) -> str:
    """A line plot as inline SVG: axes with min/max labels, one polyline per series, an optional limit line."""
    colours = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
    points = [(np.asarray(x, float), np.asarray(y, float)) for x, y in series.values()]
    finite_y = np.concatenate([y[np.isfinite(y)] for _, y in points] + [np.array([limit] if limit else [])])
    all_x = np.concatenate([x for x, _ in points]) if points else np.array([])
    if not finite_y.size or not all_x.size:
        return f"<p>{html.escape(title)}: no data</p>"
    left, right, top, bottom = 70, width - 10, 25, height - 35
    x_lo, x_hi = float(all_x.min()), float(all_x.max()) or 1.0
    y_lo, y_hi = float(finite_y.min()), float(finite_y.max())
    if x_hi == x_lo:
        x_hi = x_lo + 1
    if y_hi == y_lo:
        y_hi = y_lo + (abs(y_lo) or 1.0)

    def scale(x: np.ndarray, y: np.ndarray) -> str:
        sx = left + (x - x_lo) / (x_hi - x_lo) * (right - left)
        sy = bottom - (np.clip(y, y_lo, y_hi) - y_lo) / (y_hi - y_lo) * (bottom - top)
        return " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(sx, sy))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<text x="{width / 2}" y="15" text-anchor="middle" font-size="13">{html.escape(title)}</text>',
             f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#444"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#444"/>',
             f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" font-size="11">{y_hi:.4g}</text>',
             f'<text x="{left - 4}" y="{bottom}" text-anchor="end" font-size="11">{y_lo:.4g}</text>',
             f'<text x="{left}" y="{bottom + 14}" font-size="11">step {x_lo:g}</text>',
             f'<text x="{right}" y="{bottom + 14}" text-anchor="end" font-size="11">step {x_hi:g}</text>',
             f'<text x="12" y="{(top + bottom) / 2}" font-size="11" transform="rotate(-90 12 '
             f'{(top + bottom) / 2})" text-anchor="middle">{html.escape(y_label)}</text>']
    if limit is not None:
        level = scale(np.array([x_lo, x_hi]), np.array([limit, limit]))
        parts.append(f'<polyline points="{level}" fill="none" stroke="#999" stroke-dasharray="4 3"/>')
    for n, ((name, _), (x, y)) in enumerate(zip(series.items(), points)):
        keep = np.isfinite(y)
        parts.append(f'<polyline points="{scale(x[keep], y[keep])}" fill="none" stroke="{colours[n % 4]}" '
                     'stroke-width="1.5"/>')
        parts.append(f'<text x="{right - 150}" y="{top + 14 * (n + 1)}" font-size="11" fill="{colours[n % 4]}">'
                     f'{html.escape(name)}</text>')
    return "".join(parts) + "</svg>"


def _html_table(frame: pd.DataFrame, row_classes: Iterable[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    classes = list(row_classes) if row_classes is not None else [""] * len(frame)
    body = "".join(
        f'<tr class="{cls}">' + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
        for cls, row in zip(classes, frame.itertuples(index=False, name=None)))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section(title: str, body: str) -> str:
    return f"<section><h2>{html.escape(title)}</h2>{body}</section>"


def _loss_section(result: ComparisonResult) -> str:
    frame = result.loss.frame
    if frame.empty:
        return _section("Loss", "<p>No common loss steps.</p>")
    x = frame["step"] + frame["micro_step"] / (frame["micro_step"].max() + 1)
    curves = svg_plot({"ref": (x, frame["ref_loss"]), "actual": (x, frame["actual_loss"])}, "loss", "loss")
    rel = svg_plot({"relative difference": (x, frame["rel_diff"])}, "relative loss difference (dashed: tolerance)",
                   "|actual-ref|/|ref|", limit=result.loss.rtol)
    loss = result.loss
    text = (f"<p>{loss.steps_compared} steps compared; max abs diff {loss.max_abs_diff:.4g}, mean "
            f"{loss.mean_abs_diff:.4g}; max rel diff {loss.max_rel_diff:.3%}, mean {loss.mean_rel_diff:.3%}; "
            f"tolerance {loss.rtol:.2%}; first step past tolerance: {loss.first_step_past_tolerance}</p>")
    return _section("Loss", text + curves + rel)


def _checklist_section(items: list[dict[str, Any]] | None) -> str:
    if not items:
        return _section("Checklist", "<p>No checklist.json from <code>migrate</code> found next to the runs.</p>")
    frame = pd.DataFrame([{"id": i.get("id", ""), "item": i.get("title", ""), "status": i.get("status", ""),
                           "evidence": "; ".join(map(str, i.get("evidence", []))), "action": i.get("action", "")}
                          for i in items])
    classes = frame["status"].map({"Passed": "exact", "Failed": "failed"}).fillna("")
    return _section("Checklist (from migrate)", _html_table(frame, classes))


def _ops_section(result: ComparisonResult) -> str:
    if result.ops_not_compared:
        return _section("Operators", f"<p>Not compared: {html.escape(result.ops_not_compared)}.</p>")
    rows = diverging_rows(result, HTML_MAX_OP_ROWS)
    counts = ", ".join(f"{status}: {count}" for status, count in result.status_counts().items())
    if rows.empty:
        return _section("Operators", f"<p>{counts}. Every matched op is within tolerance.</p>")
    statistics = [c for c in STAT_COLUMNS if OP_COLUMNS[c] == "float64"]
    shown = rows.reindex(columns=["step", "phase", "module", "ref_op", "actual_op", "io", "status", "ref_dtype",
                                  "actual_dtype", "stats_error", "tolerance", *_both_sides(statistics), "cosine",
                                  "note"])
    classes = np.where((rows["passed"] == False).fillna(False), "failed", rows["status"])  # noqa: E712
    return _section("Operators past tolerance or unmatched",
                    f"<p>{counts}. First {len(rows)} rows; every row is in ops.csv / ops.xlsx.</p>"
                    + _html_table(shown, classes))


def _first_divergent_section(first: dict[str, Any] | None) -> str:
    if not first:
        return _section("First divergent operator", "<p>None: no op breaks its tolerance with agreeing inputs.</p>")
    stats = pd.DataFrame([{"side": side, **first[side]} for side in ("ref", "actual")])
    text = (f"<p><b>{html.escape(str(first['op']))}</b> (actual: {html.escape(str(first['actual_op']))}) in "
            f"<code>{html.escape(first['module'] or 'top level')}</code>, {first['phase']}, step {first['step']}, "
            f"output {html.escape(first['io'])}, dtype {first['dtype']}/{first['actual_dtype']}: stats error "
            f"{first['stats_error']:.4g} &gt; tolerance {first['tolerance']:.4g}; "
            f"{html.escape(first['inputs_evidence'])}.</p>")
    return _section("First divergent operator", text + _html_table(stats))


def _misc_sections(result: ComparisonResult) -> str:
    parts = []
    if len(result.hparams):
        parts.append(_section("Hyperparameter differences", _html_table(result.hparams)))
    if differing := environment.differences(result.ref.manifest, result.actual.manifest):  # verify/environment.py
        parts.append(_section("Environment differences", _html_table(pd.DataFrame(differing).astype(str))))
    overflow = result.overflow
    rows = [{"side": side, "first inf/nan op": (f"{first['op']} ({first['module']}, step {first['step']})"
                                                if (first := overflow[f"{side}_first"]) else "none"),
             "loss scale trace": " ".join(f"{v:g}" for v in overflow[f"{side}_scale"]["scales"]) or "no scaler"}
            for side in ("ref", "actual")]
    parts.append(_section("Overflow and loss scaling", _html_table(pd.DataFrame(rows))))
    if len(result.grads):
        worst = result.grads.sort_values("rel_diff", ascending=False).head(20)
        parts.append(_section("Gradient norms (largest differences)", _html_table(
            worst[["step", "param", "ref_norm", "actual_norm", "rel_diff", "passed"]])))
    if len(result.outputs):
        columns = ["step", "output", "cosine", "max_abs_error", "mean_abs_error", "top1_agreement", "top5_agreement",
                   "stats_error", "passed"]
        parts.append(_section("Inference outputs", _html_table(result.outputs[columns])))
    return "".join(parts)


def _manifest_section(result: ComparisonResult) -> str:
    blocks = "".join(
        f"<h3>{side}: {_text(run.manifest.title)}</h3><p>{html.escape(run.source)}, "
        f"<code>{html.escape(str(run.root))}</code></p><pre>"
        f"{html.escape(json.dumps(shown_json(run.manifest.to_json()), indent=1, default=str))}</pre>"
        for side, run in (("ref", result.ref), ("actual", result.actual)))
    return _section("Runs", blocks)


def _text(text: str) -> str:
    """Text that may come from a run directory (a message, a note, a script's path), as the HTML shows it."""
    return html.escape(shown(text))


CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;
margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px;text-align:left}
.verdict{font-size:20px;font-weight:bold;padding:.5em}.pass{background:#e2f0d9}.fail{background:#f8cbad}
.banner{background:#ffd966;border:3px solid #bf9000;padding:.7em;font-size:18px;font-weight:bold}
tr.related{background:#ddebf7}tr.sequence{background:#fff2cc}tr.only_ref{background:#e7e6e6}
tr.only_actual{background:#fce4d6}tr.failed{background:#f8cbad}pre{background:#f6f6f6;padding:.5em;overflow:auto}"""


def render_html(result: ComparisonResult, advice: Sequence[Advice], checklist: list[dict[str, Any]] | None) -> str:
    verdict_class = "pass" if result.verdict.passed else "fail"
    banners = "".join(f'<div class="banner">{html.escape(b)}: its numerics are a stand-in\'s, not the real '
                      "device's.</div>" for b in _emulation_banners(result))
    emulated = _emulated_devices(result)
    findings = "".join(f"<li>{_text(f.message)}</li>" for f in result.findings) or "<li>none</li>"
    advice_items = "".join(
        f"<li>{_text(a.message)}" + (f" <i>[checklist {', '.join(a.checklist)}]</i>" if a.checklist else "")
        + "</li>" for a in advice) or "<li>Nothing to do.</li>"
    notes = "".join(f"<li>{_text(n)}</li>" for n in result.notes)
    body = (f"<h1>npu-port verify{emulated}</h1>{banners}"
            f'<div class="verdict {verdict_class}">{_text(result.verdict.reason)}</div>'
            f"<p>Comparison: {html.escape(result.policy.description)}</p>"
            + _section("Findings", f"<ul>{findings}</ul>") + _section("Advice", f"<ol>{advice_items}</ol>")
            + _first_divergent_section(result.first_divergent) + _loss_section(result) + _ops_section(result)
            + _misc_sections(result) + _checklist_section(checklist) + _manifest_section(result)
            + (_section("Notes", f"<ul>{notes}</ul>") if notes else ""))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>npu-port verify{emulated}: '
            f"{html.escape(result.verdict.reason[:80])}</title><style>{CSS}</style></head><body>{body}</body></html>")
