"""The offline commands of `verify`: compare, report, export. Plain functions, registered by verify/cli.py:

    app.command("compare")(compare_cli.compare)
    app.command("report")(compare_cli.report)
    app.command("export")(compare_cli.export)

Exit codes: 0 PASS, 1 FAIL, 2 the inputs could not be read. None of this imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import pandas as pd
import typer
from rich.console import Console

from verify import msprobe, report as reports
from verify.compare import CompareError, CompareOptions, RunData, compare_runs, empty_frame
from verify.schema import (GRAD_COLUMNS, GRADS_DIR, HPARAMS, HPARAM_COLUMNS, LOSS_COLUMNS, LOSSES, MANIFEST,
                           OP_COLUMNS, OPS_DIR, OUTPUT_COLUMNS, OUTPUTS_DIR, RunManifest)

stdout = Console(highlight=False, soft_wrap=True)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)

ERROR_EXIT = 2


def _read_step_tables(root: Path, folder: str, columns: dict[str, str], notes: list[str]) -> pd.DataFrame:
    files = sorted((root / folder).glob("step-*.parquet")) if (root / folder).is_dir() else []
    frames = []
    for file in files:
        try:
            frames.append(pd.read_parquet(file))
        except (OSError, ValueError) as error:  # a step file cut short by a crash: keep the others
            notes.append(f"{folder}/{file.name} unreadable ({type(error).__name__}); its step is skipped")
    if not frames:
        return empty_frame(columns)
    frame = pd.concat(frames, ignore_index=True)
    missing = [name for name in columns if name not in frame.columns]
    frame = frame.assign(**{name: pd.Series(pd.NA, index=frame.index, dtype=columns[name]) for name in missing})
    return frame.astype({name: dtype for name, dtype in columns.items()})


def _read_csv(root: Path, name: str, columns: tuple[str, ...], notes: list[str]) -> pd.DataFrame:
    try:
        frame = pd.read_csv(root / name, dtype={"group": "string", "value": "string"}, keep_default_na=False,
                            na_values=[""])
    except FileNotFoundError:
        notes.append(f"no {name}")
        return empty_frame(columns)
    except (OSError, ValueError) as error:
        notes.append(f"{name} unreadable: {error}")
        return empty_frame(columns)
    return frame.reindex(columns=list(columns))


def read_run_directory(root: Path) -> RunData:
    """A run directory per verify/schema.py. Missing pieces become notes; only a missing manifest is an error."""
    try:
        manifest = RunManifest.from_json(json.loads((root / MANIFEST).read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise CompareError(f"{root}: no {MANIFEST}: neither a verify run directory nor an msprobe dump") from None
    except (OSError, ValueError, TypeError) as error:
        raise CompareError(f"{root / MANIFEST} is unreadable: {error}") from None
    notes: list[str] = []
    losses = _read_csv(root, LOSSES, LOSS_COLUMNS, notes)
    losses = losses.astype({"step": "int64", "micro_step": "int64"}).assign(
        loss=pd.to_numeric(losses["loss"], errors="coerce"), loss_scale=pd.to_numeric(losses["loss_scale"],
                                                                                   errors="coerce"))
    hparams = _read_csv(root, HPARAMS, HPARAM_COLUMNS, notes)
    return RunData(
        root=root, manifest=manifest, losses=losses, hparams=hparams,
        ops=_read_step_tables(root, OPS_DIR, OP_COLUMNS, notes),
        grads=_read_step_tables(root, GRADS_DIR, GRAD_COLUMNS, notes),
        outputs=_read_step_tables(root, OUTPUTS_DIR, OUTPUT_COLUMNS, notes), notes=notes)


def read_side(path: Path) -> RunData:
    """A verify run directory or an msprobe dump (any layout, see verify/msprobe.py)."""
    if not path.exists():
        raise CompareError(f"{path}: no such file or directory")
    if msprobe.is_msprobe_dump(path):
        return msprobe.read_dump(path)
    if not path.is_dir():
        raise CompareError(f"{path}: not a directory")
    return read_run_directory(path)


def compare(
    ref_run: Annotated[Path, typer.Argument(help="The reference run directory (or msprobe dump).")],
    actual_run: Annotated[Path, typer.Argument(help="The ported run directory (or msprobe dump).")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write the reports here.")] = None,
    loss_rtol: Annotated[Optional[float], typer.Option(
        help="Relative loss tolerance per step (default 0.01; 0.05 for an fp32-vs-AMP pair).")] = None,
    max_rows: Annotated[int, typer.Option(help="Divergent op rows shown on the terminal.")] = 10,
) -> None:
    """Compare two runs offline: verdict, first divergent operator, advice. Exit 0 PASS, 1 FAIL, 2 error."""
    try:
        result = compare_runs(read_side(ref_run), read_side(actual_run), CompareOptions(loss_rtol=loss_rtol))
        written = reports.write_reports(result, out, checklist=reports.find_checklist(ref_run, actual_run, out)) \
            if out else []
    except (CompareError, OSError) as error:
        stderr.print(f"[red]error:[/red] {error}")
        raise typer.Exit(ERROR_EXIT) from None
    reports.print_summary(result, stdout, max_rows=max_rows)
    for path in written:
        stderr.print(f"wrote {path}")
    raise typer.Exit(result.verdict.exit_code)


def report(
    run_or_result: Annotated[Path, typer.Argument(help="A run directory, or a folder written by `compare -o`.")],
) -> None:
    """Print a run's manifest and loss curve, or re-print a comparison's summary from its summary.json."""
    try:
        if (run_or_result / reports.SUMMARY_JSON).is_file():
            summary = json.loads((run_or_result / reports.SUMMARY_JSON).read_text(encoding="utf-8"))
            reports.print_saved_summary(summary, stdout)
            raise typer.Exit(int(summary.get("exit_code", ERROR_EXIT)))
        reports.print_run(read_side(run_or_result), stdout)
    except (CompareError, OSError, ValueError) as error:
        stderr.print(f"[red]error:[/red] {error}")
        raise typer.Exit(ERROR_EXIT) from None


def export(
    run: Annotated[Path, typer.Argument(help="A verify run directory.")],
    out: Annotated[Path, typer.Argument(help="Folder for the msprobe dump (step*/proc0/dump.json ...).")],
    msprobe_format: Annotated[bool, typer.Option("--msprobe", help="Write msprobe's dump layout (required).")] = False,
    layout: Annotated[msprobe.Layout, typer.Option(help="proc: msprobe 26.x; rank: msprobe 8.x.")] = (
        msprobe.Layout.PROC),
) -> None:
    """Export a run's operator records as an msprobe dump that `msprobe compare` accepts."""
    if not msprobe_format:
        stderr.print("[red]error:[/red] name the format to export: --msprobe (the only one so far)")
        raise typer.Exit(ERROR_EXIT)
    try:
        written = msprobe.write_dump(read_run_directory(run), out, layout)
    except (CompareError, OSError) as error:
        stderr.print(f"[red]error:[/red] {error}")
        raise typer.Exit(ERROR_EXIT) from None
    stderr.print(f"wrote {len(written)} msprobe step folder(s) under {out}")
