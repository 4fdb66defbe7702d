"""report.html: one self-contained page (inline SVG plots, inline CSS, no script, no external resource), so that
it can be mailed and opened offline. Its operator table holds the first rows past tolerance or unmatched; the full
table is in ops.csv and ops.parquet. Renders only: every number comes from compare.py. No torch.
"""

from __future__ import annotations

import html
import json
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from verify.record import environment
from verify.report.advice import Advice
from verify.compare.metrics import OUTPUT_METRICS
from verify.compare.runs import ComparisonResult
from verify.report.tables import (cell_text, diverging_rows, emulation, emulation_banners, reading_columns,
                                   shown_rank_first)
from verify.record.schema import shown, shown_json

HTML_MAX_OP_ROWS = 200


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
        f'<tr class="{cls}">' + "".join(f"<td>{html.escape(cell_text(v))}</td>" for v in row) + "</tr>"
        for cls, row in zip(classes, frame.itertuples(index=False, name=None)))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _text(text: str) -> str:
    """Text that may come from a run directory (a message, a note, a script's path), as the HTML shows it."""
    return html.escape(shown(text))


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
    rows = diverging_rows(shown_rank_first(result), HTML_MAX_OP_ROWS)
    counts = ", ".join(f"{status}: {count}" for status, count in result.status_counts().items())
    if rows.empty:
        return _section("Operators", f"<p>{counts}. Every matched op is within tolerance.</p>")
    shown = rows.reindex(columns=reading_columns(rows))
    classes = np.where((rows["passed"] == False).fillna(False), "failed", rows["status"])  # noqa: E712
    return _section("Operators past tolerance or unmatched",
                    f"<p>{counts}. First {len(rows)} rows; every row is in ops.csv and ops.parquet.</p>"
                    + _html_table(shown, classes))


def _finding_item(number: int, message: str, lines: dict[str, Any] | None) -> str:
    """A finding; one with the lines behind its op links to their side-by-side view."""
    link = f' <a href="#lines-{number}">(the two lines)</a>' if lines else ""
    return f"<li>{_text(message)}{link}</li>"


def _side_by_side(number: int, lines: dict[str, Any]) -> str:
    """The original's line and the port's, each in its context, the line itself marked."""
    def column(side: str, mark: str) -> str:
        line = int(mark.rpartition(":")[2]) if mark else 0
        rows = "".join(f'<tr class="{"failed" if n == line else ""}"><td>{n}</td><td><pre>{html.escape(text)}</pre>'
                       "</td></tr>" for n, text in lines["context"].get(side, []))
        return f"<td><b>{html.escape(mark or 'no paired line')}</b><table>{rows}</table></td>"

    why = "; ".join(lines["rewrites"]) if lines["rewrites"] else (
        "your own edit of the port" if lines["user_edit"] else "a line migrate carried over")
    return (f'<div id="lines-{number}"><p>Finding {number}: {html.escape(why)} (lines paired by '
            f"{html.escape(lines['paired_by'])})</p><table><tr><th>original</th><th>port</th></tr><tr>"
            f"{column('original', lines['original'])}{column('port', lines['port'])}</tr></table></div>")


def _lines_section(result: ComparisonResult) -> str:
    views = [_side_by_side(number, f.detail["lines"]) for number, f in enumerate(result.findings, 1)
             if f.detail.get("lines")]
    return _section("The lines behind the findings", "".join(views)) if views else ""


def _first_divergent_section(first: dict[str, Any] | None) -> str:
    if not first:
        return _section("First divergent operator", "<p>None: no op breaks its tolerance with agreeing inputs.</p>")
    stats = pd.DataFrame([{"side": side, **first[side]} for side in ("ref", "actual")])
    text = (f"<p><b>{html.escape(str(first['op']))}</b> (actual: {html.escape(str(first['actual_op']))}) in "
            f"<code>{html.escape(first['module'] or 'top level')}</code>, {first['phase']}, step {first['step']}, "
            f"output {html.escape(first['io'])}, dtype {first['dtype']}/{first['actual_dtype']}: stats error "
            f"{first['stats_error']:.4g} {'&gt;' if first['stats_error'] > first['tolerance'] else '&le;'} tolerance "
            f"{first['tolerance']:.4g}; "
            f"{html.escape(first['inputs_evidence'])}.</p>")
    return _section("First divergent operator", text + _html_table(stats))


def _misc_sections(result: ComparisonResult) -> str:
    parts = []
    if len(result.hparams):
        parts.append(_section("Hyperparameter differences", _html_table(result.hparams)))
    # verify/record/environment.py
    if differing := environment.differences(result.ref.manifest, result.actual.manifest):
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
        columns = ["step", "output", *(metric.name for metric in OUTPUT_METRICS), "stats_error", "passed"]
        parts.append(_section("Inference outputs", _html_table(result.outputs[columns])))
    return "".join(parts)


def _manifest_section(result: ComparisonResult) -> str:
    blocks = "".join(
        f"<h3>{side}: {_text(run.manifest.title)}</h3><p>{html.escape(run.source)}, "
        f"<code>{html.escape(str(run.root))}</code></p><pre>"
        f"{html.escape(json.dumps(shown_json(run.manifest.to_json()), indent=1, default=str))}</pre>"
        for side, run in (("ref", result.ref), ("actual", result.actual)))
    return _section("Runs", blocks)


def _emulated_devices(result: ComparisonResult) -> str:
    """' (EMULATED NPU, EMULATED CUDA)': the emulations the comparison ran on, for its title."""
    names = [emulation(run) for run in (result.ref, result.actual) if run.manifest.emulated]
    return f" ({', '.join(dict.fromkeys(names))})" if names else ""


CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;
margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px;text-align:left}
.verdict{font-size:20px;font-weight:bold;padding:.5em}.pass{background:#e2f0d9}.fail{background:#f8cbad}
.banner{background:#ffd966;border:3px solid #bf9000;padding:.7em;font-size:18px;font-weight:bold}
tr.related{background:#ddebf7}tr.sequence{background:#fff2cc}tr.only_ref{background:#e7e6e6}
tr.only_actual{background:#fce4d6}tr.failed{background:#f8cbad}pre{background:#f6f6f6;padding:.5em;overflow:auto}"""


def render_html(result: ComparisonResult, advice: Sequence[Advice], checklist: list[dict[str, Any]] | None) -> str:
    verdict_class = "pass" if result.verdict.passed else "fail"
    banners = "".join(f'<div class="banner">{html.escape(b)}: its numerics are a stand-in\'s, not the real '
                      "device's.</div>" for b in emulation_banners(result))
    emulated = _emulated_devices(result)
    findings = "".join(_finding_item(number, f.message, f.detail.get("lines"))
                       for number, f in enumerate(result.findings, 1)) or "<li>none</li>"
    advice_items = "".join(
        f"<li>{_text(a.message)}" + (f" <i>[checklist {', '.join(a.checklist)}]</i>" if a.checklist else "")
        + "</li>" for a in advice) or "<li>Nothing to do.</li>"
    notes = "".join(f"<li>{_text(n)}</li>" for n in result.notes)
    body = (f"<h1>npu-port verify{emulated}</h1>{banners}"
            f'<div class="verdict {verdict_class}">{_text(result.verdict.reason)}</div>'
            f"<p>Comparison: {html.escape(result.policy.description)}</p>"
            + _section("Findings", f"<ul>{findings}</ul>") + _section("Advice", f"<ol>{advice_items}</ol>")
            + _lines_section(result)
            + _first_divergent_section(result.first_divergent) + _loss_section(result) + _ops_section(result)
            + _misc_sections(result) + _checklist_section(checklist) + _manifest_section(result)
            + (_section("Notes", f"<ul>{notes}</ul>") if notes else ""))
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>npu-port verify{emulated}: '
            f"{html.escape(result.verdict.reason[:80])}</title><style>{CSS}</style></head><body>{body}</body></html>")
