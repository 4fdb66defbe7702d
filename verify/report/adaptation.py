"""adaptation.md: the adaptation report that people who port a model to Ascend publish with it (on its hub page),
made from a comparison: the script and model, each side's device as recorded (an emulated device named as emulated,
never passed off as hardware), the software versions, the run status, the time per step, the accuracy table
(inference: the outputs' cosine, max and mean absolute error, top-1 and top-5 agreement; training: the loss at each
step and the first divergence), the criterion and the verdict. Plain Markdown; its figures are summary.json's. No
torch.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from verify.compare.metrics import OUTPUT_METRICS
from verify.compare.runs import ComparisonResult
from verify.devices import title
from verify.record.environment import ENVIRONMENT_KEY
from verify.record.store import Run

ADAPTATION_MD = "adaptation.md"
_VERSIONS = ("python", "torch", "torch_npu", "cann")


def write_adaptation(result: ComparisonResult, out: Path) -> Path:
    path = out / ADAPTATION_MD
    path.write_text(adaptation_markdown(result), encoding="utf-8")
    return path


def adaptation_markdown(result: ComparisonResult) -> str:
    summary = result.summary()
    sides = (("Reference", result.ref), ("Port", result.actual))
    sections = [
        f"# Adaptation report: {Path(result.actual.manifest.script).name}",
        _section("Model and source", _table(["", "script", "sha256", "arguments"], [
            [side, f"`{run.manifest.script}`", run.manifest.script_sha256[:12], f"`{' '.join(run.manifest.argv)}`"]
            for side, run in sides])),
        _section("Hardware", _table(["", "device", "name", "emulated"], [
            [side, title(run.manifest.device, run.manifest.emulated_on), run.manifest.device_name or "-",
             "yes: a test double, not the device" if run.manifest.emulated else "no"] for side, run in sides])),
        _section("Software", _table(["", *_VERSIONS], [[side, *(_version(run, name) for name in _VERSIONS)]
                                                       for side, run in sides])),
        _section("Run", _table(["", "status", "steps", "median time per step"], [
            [side, run.manifest.status, f"{run.manifest.steps_completed} of {run.manifest.steps_requested}",
             _step_time(run)] for side, run in sides])),
        _section("Accuracy", _accuracy(summary, result)),
        _section("Criterion", _criterion(summary)),
        _section("Verdict", f"**{summary['verdict']}**: {summary['reason'].split(': ', 1)[-1]}\n\n"
                            f"Comparison: {summary['comparison']}."),
    ]
    return "\n\n".join(sections) + "\n"


def _section(heading: str, body: str) -> str:
    return f"## {heading}\n\n{body}"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell).replace("|", "\\|") for cell in line) + " |" for line in lines)


def _version(run: Run, name: str) -> str:
    return str(run.manifest.extra.get(ENVIRONMENT_KEY, {}).get("versions", {}).get(name) or "-")


def _step_time(run: Run) -> str:
    times = run.manifest.step_wall_s[1:] or run.manifest.step_wall_s  # the first step pays for warm-up
    if not times:
        return "-"
    median = f"{statistics.median(times) * 1e3:.1f} ms"
    return f"{median} (emulator: not a device figure)" if run.manifest.emulated else median


def _accuracy(summary: dict[str, Any], result: ComparisonResult) -> str:
    outputs = summary["outputs"]
    if outputs:
        rows = [[row["output"], *_figures(row), "yes" if row["passed"] else "no"] for row in outputs["per_output"]]
        rows.append(["all", *_figures(outputs["overall"]), "yes" if outputs["overall"]["passed"] else "no"])
        return ("Inference outputs, each figure at its worst over the steps:\n\n"
                + _table(["output", *(metric.label for metric in OUTPUT_METRICS), "within"], rows))
    frame = result.loss.frame.groupby("step").agg(ref_loss=("ref_loss", "mean"), actual_loss=("actual_loss", "mean"),
                                                  rel_diff=("rel_diff", "max")).reset_index()  # over micro-steps
    rows = [[int(step), f"{ref:.6g}", f"{actual:.6g}", f"{rel:.3%}"] for step, ref, actual, rel in frame.itertuples(
        index=False)]
    first = summary["first_divergent"]
    divergence = (f"First divergent operator: {first['op']} ({first['module'] or 'top level'}, {first['phase']}, step "
                  f"{first['step']})." if first else "No operator diverged beyond the noise it inherits.")
    return "Training loss at each step:\n\n" + _table(["step", "reference", "port", "relative difference"], rows) + (
        f"\n\n{divergence}")


def _figures(figures: dict[str, Any]) -> list[str]:
    return [f"{figures[metric.name]:{metric.fmt}}" for metric in OUTPUT_METRICS]


def _criterion(summary: dict[str, Any]) -> str:
    if summary["outputs"]:
        return summary["outputs"]["criterion"] + "."
    return (f"The loss within {summary['loss']['rtol']:.2%} of the reference's at every step; every operator within "
            "its dtype's tolerance beyond the noise it inherits (verify/compare/tolerances.py).")
