"""adaptation.md: the adaptation report that people who port a model to Ascend publish with it (on its hub page),
made from a comparison: the scripts (paths relative to the folder verify ran in: the report is published, and a home
directory is nobody's business), the model (its class and parameter count) and the frozen networks beside it, the
command line that made it, each side's device as recorded (an emulated device named as emulated, never passed off as
hardware), the software versions, the run status, the time per step, the accuracy table (inference: the outputs'
cosine, max and mean absolute error, top-1 and top-5 agreement; training: the loss at each step and the first
divergence), the criterion and the verdict. Plain Markdown; its figures are summary.json's. No torch.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from verify.contract.checklist_items import markdown_code, markdown_row, markdown_text
from verify.contract.files import ADAPTATION_MD
from verify.compare.metrics import OUTPUT_METRICS
from verify.compare.runs import ComparisonResult
from verify.devices import title
from verify.errors import VerifyFailure
from verify.record.environment import ENVIRONMENT_KEY
from verify.record.schema import FROZEN_KEY, MODEL_KEY
from verify.record.store import Run

_VERSIONS = ("python", "torch", "torch_npu", "cann")


def write_adaptation(result: ComparisonResult, out: Path, command: list[str], ran_in: str) -> Path:
    """adaptation.md in `out`, for the comparison that `command` (its words) made in the folder `ran_in`."""
    path = out / ADAPTATION_MD
    path.write_text(adaptation_markdown(result, command, Path(ran_in)), encoding="utf-8")
    return path


@contextlib.contextmanager
def adaptation_or_why_not(wanted: bool) -> Iterator[None]:
    """Under --adaptation-report, verify's error (a comparison that could not be made, a damaged run) also says that
    no adaptation.md was written, and why: it reports a comparison."""
    try:
        yield
    except VerifyFailure as error:
        if not wanted:
            raise
        raise VerifyFailure(f"{error}; no adaptation.md was written: it reports a comparison, and none could be "
                            "made") from None


def adaptation_markdown(result: ComparisonResult, command: list[str], ran_in: Path) -> str:
    summary = result.summary()
    sides = (("Reference", result.ref), ("Port", result.actual))
    sections = [
        f"# Adaptation report: {markdown_text(Path(result.actual.manifest.script).name)}",
        _section("Model and source", _table(["", "script", "sha256", "arguments", "model", "parameters",
                                             "frozen beside it"], [
            [side, markdown_code(_public(run.manifest.script, ran_in)), markdown_text(run.manifest.script_sha256[:12]),
             markdown_code(shlex.join(_public(arg, ran_in) for arg in run.manifest.argv)), *_model(run), _frozen(run)]
            for side, run in sides])),
        _section("Command", markdown_code(shlex.join(_public(word, ran_in) for word in command), block=True)),
        _section("Hardware", _table(["", "device", "name", "emulated"], [
            [side, title(run.manifest.device, run.manifest.emulated_on), markdown_text(run.manifest.device_name or "-"),
             "yes: a test double, not the device" if run.manifest.emulated else "no"] for side, run in sides])),
        _section("Software", _table(["", *_VERSIONS], [[side, *(_version(run, name) for name in _VERSIONS)]
                                                       for side, run in sides])),
        _section("Run", _table(["", "status", "steps", "median time per step"], [
            [side, markdown_text(run.manifest.status), f"{run.manifest.steps_completed} of {run.manifest.steps_requested}",
             _step_time(run)] for side, run in sides])),
        _section("Accuracy", _accuracy(summary, result)),
        _section("Criterion", _criterion(summary)),
        _section("Verdict", f"**{summary['verdict']}**: {markdown_text(summary['reason'].split(': ', 1)[-1])}\n\n"
                            f"Comparison: {markdown_text(summary['comparison'])}."),
    ]
    return "\n\n".join(sections) + "\n"


def _public(word: str, ran_in: Path) -> str:
    """A path as the report may publish it: relative to the folder verify ran in, else its name alone (never a home
    directory). Other words as they are."""
    if not os.path.isabs(word):
        return word
    path = Path(word)
    return str(path.relative_to(ran_in)) if path.is_relative_to(ran_in) else path.name


def _model(run: Run) -> list[str]:
    """The model's class and its parameter count, as the run recorded them (manifest.extra[MODEL_KEY])."""
    model = run.manifest.extra.get(MODEL_KEY)
    return [markdown_code(model["class"]), f"{model['parameters']:,}"] if model else ["-", "-"]


def _frozen(run: Run) -> str:
    """The frozen networks the model trained beside (a loss network, a teacher), as the run recorded them."""
    frozen = run.manifest.extra.get(FROZEN_KEY, [])
    return ", ".join(f"{markdown_code(module['class'])} ({module['parameters']:,})" for module in frozen) or "-"


def _section(heading: str, body: str) -> str:
    return f"## {heading}\n\n{body}"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    return "\n".join(markdown_row(line) for line in [header, ["---"] * len(header), *rows])


def _version(run: Run, name: str) -> str:
    return markdown_text(run.manifest.extra.get(ENVIRONMENT_KEY, {}).get("versions", {}).get(name) or "-")


def _step_time(run: Run) -> str:
    times = run.manifest.step_wall_s[1:] or run.manifest.step_wall_s  # the first step pays for warm-up
    if not times:
        return "-"
    median = f"{statistics.median(times) * 1e3:.1f} ms"
    return f"{median} (emulator: not a device figure)" if run.manifest.emulated else median


def _accuracy(summary: dict[str, Any], result: ComparisonResult) -> str:
    outputs = summary["outputs"]
    if outputs:
        rows = [[markdown_text(row["output"]), *_figures(row), "yes" if row["passed"] else "no"]
                for row in outputs["per_output"]]
        rows.append(["all", *_figures(outputs["overall"]), "yes" if outputs["overall"]["passed"] else "no"])
        return ("Inference outputs, each figure at its worst over the steps:\n\n"
                + _table(["output", *(metric.label for metric in OUTPUT_METRICS), "within"], rows))
    frame = result.loss.frame.groupby("step").agg(ref_loss=("ref_loss", "mean"), actual_loss=("actual_loss", "mean"),
                                                  rel_diff=("rel_diff", "max")).reset_index()  # over micro-steps
    rows = [[int(step), f"{ref:.6g}", f"{actual:.6g}", f"{rel:.3%}"] for step, ref, actual, rel in frame.itertuples(
        index=False)]
    first = summary["first_divergent"]
    divergence = (f"First divergent operator: {markdown_text(first['op'])} ({markdown_text(first['module'] or 'top level')}, "
                  f"{markdown_text(first['phase'])}, step {first['step']})." if first
                  else "No operator diverged beyond the noise it inherits.")
    return "Training loss at each step:\n\n" + _table(["step", "reference", "port", "relative difference"], rows) + (
        f"\n\n{divergence}")


def _figures(figures: dict[str, Any]) -> list[str]:
    return [f"{figures[metric.name]:{metric.fmt}}" for metric in OUTPUT_METRICS]


def _criterion(summary: dict[str, Any]) -> str:
    if summary["outputs"]:
        return markdown_text(summary["outputs"]["criterion"]) + "."
    return (f"The loss within {summary['loss']['rtol']:.2%} of the reference's at every step; every operator within "
            "its dtype's tolerance beyond the noise it inherits (verify/compare/tolerances.py).")
