"""Whose runs these are. Every run directory records what ran (verify/record/schema.py: the script's path and the
sha256 of its text, the files of its project it imported with theirs, its arguments, seed and steps, torch and the
device), and evidence is judged only where it is the run it is used as:

- a calibration run is its reference's: the same script text, imported files, arguments, seed and steps, and its
  manifest.perturbation["of"] names the reference's folder, and where both record the pair command that made them
  (manifest.pair), it is the same one (a calibration of another script, or of another pair of this one, widens the
  envelope the port is judged against: a FAIL became a PASS);
- a `--ref-run` is a run of ORIGINAL as it is now (its text and imported files), with the pair's arguments, seed and
  steps, and neither a calibration run nor a run of PORTED (a broken port passed against its own run);
- a comparison's summary.json names the runs it judged (`named_runs`: each folder, relative to the summary's and
  absolute, and the sha256 of its manifest), and `verify report` judges again from those runs only (`runs_named`);
  where one is gone from beside the summary and read at its absolute path (a copy of a pair's folder without its
  runs), `NamedRuns.read_elsewhere` names the folder read, and every report says so.

`verify compare A B` compares runs of two scripts, the original's and its port's, made on two machines: it demands
nothing of A and B alike, only of the calibration runs beside A. Every refusal is a ProvenanceError (exit 2) naming
what differs. No torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verify.errors import ProvenanceError, RunDirError
from verify.record.run_folders import file_sha256
from verify.record.schema import MANIFEST, RunManifest
from verify.record.store import Run, read_manifest


def sha256_of(path: Path) -> str:
    """The sha256 of a file's bytes; "" where it cannot be read (a file that is gone)."""
    try:
        return file_sha256(Path(path))
    except OSError:
        return ""


def check_calibration(ref: Run, calibration: Run) -> None:
    """ProvenanceError unless `calibration` is a calibration run of `ref` (the module's docstring)."""
    perturbation = calibration.manifest.perturbation
    found = [] if perturbation else ["it is no calibration run (its manifest records no perturbation)"]
    if perturbation and perturbation.get("of") != ref.root.name:
        found.append(f"it calibrates {perturbation.get('of')!r}, not {ref.root.name!r}")
    if ref.manifest.pair and calibration.manifest.pair and ref.manifest.pair != calibration.manifest.pair:
        found.append(f"another pair command made it (pair {calibration.manifest.pair}, the reference's "
                     f"{ref.manifest.pair})")
    found += _differences(calibration.manifest, ref.manifest)
    if found:
        raise ProvenanceError(f"{calibration.root} is not a calibration run of the reference {ref.root}: "
                              f"{'; '.join(found)}. A calibration measures its reference's own noise, which the port "
                              "is judged against: remove it, or run the pair again")


def check_reference(run_dir: Path, original: Path, ported: Path, args: Sequence[str], seed: int, steps: int) -> None:
    """ProvenanceError unless `run_dir` (--ref-run) is a run of ORIGINAL as it is now, with the pair's arguments, seed
    and steps, and neither a calibration run nor a run of PORTED."""
    try:
        manifest = read_manifest(run_dir)
    except RunDirError as error:
        raise ProvenanceError(f"--ref-run {error}: a reference is a run directory of ORIGINAL") from None
    expected = RunManifest(script=str(original), script_sha256=sha256_of(original), argv=list(args), seed=seed,
                           steps_requested=steps, project_files=_as_now(manifest, Path(original)))
    found = ["it is a calibration run, not a reference"] if manifest.perturbation else []
    port_sha256 = sha256_of(ported)
    if (manifest.script_sha256 == port_sha256 != expected.script_sha256
            or Path(manifest.script).resolve() == Path(ported).resolve()):
        found.append(f"it is a run of PORTED {ported}")
    found += _differences(manifest, expected)
    if found:
        raise ProvenanceError(f"--ref-run {run_dir} is not a run of ORIGINAL {original} with this pair's arguments, "
                              f"seed and steps: {'; '.join(found)}")


def _differences(run: RunManifest, of: RunManifest) -> list[str]:
    """What of `run` differs from `of`, the run it should repeat: the script's text, the files both imported, the
    arguments, seed and steps."""
    found = []
    if run.script_sha256 != of.script_sha256:
        found.append(f"its script {run.script} (sha256 {run.script_sha256[:12] or 'not recorded'}) is not "
                     f"{of.script} (sha256 {of.script_sha256[:12] or 'not recorded'})")
    changed = sorted(name for name in run.project_files.keys() & of.project_files.keys()
                     if run.project_files[name] != of.project_files[name])
    if changed:
        found.append(f"the file{'s' if len(changed) > 1 else ''} it imported differ{'' if len(changed) > 1 else 's'}:"
                     f" {', '.join(changed)}")
    found += [f"its {what} {mine!r} {'are' if what == 'arguments' else 'is'} not {theirs!r}"
              for what, mine, theirs in (("arguments", run.argv, of.argv), ("seed", run.seed, of.seed),
                                         ("steps", run.steps_requested, of.steps_requested)) if mine != theirs]
    return found


def _as_now(run: RunManifest, script: Path) -> dict[str, str]:
    """The sha256 of each project file `run` imported, as the file is now beside `script` ("" where it is gone): the
    folder it is named from lies as far above `script` as the run's files_root lay above the run's script."""
    depth = len(Path(run.script_in_root).parts) - 1
    parents = script.resolve().parents
    if depth >= len(parents):
        return {}
    root = parents[depth]
    return {name: sha256_of(root / name) for name in run.project_files}


# --- the runs a summary names ---------------------------------------------------------------------------------------


def named_runs(ref: Run, actual: Run, calibrations: Sequence[Run], folder: Path) -> dict[str, Any]:
    """summary.json's `runs`: the runs a comparison judged, each where it lies, from `folder` (the summary's: a
    pair's folder moved whole still finds its runs) and absolute (a --ref-run's stays where it was), with the
    sha256 of its manifest ("" for an msprobe dump, which has none)."""
    return {"ref": _named(ref, folder), "actual": _named(actual, folder),
            "calibrations": [_named(run, folder) for run in calibrations]}


def _named(run: Run, folder: Path) -> dict[str, str]:
    root = Path(run.root).resolve()
    return {"path": Path(os.path.relpath(root, Path(folder).resolve())).as_posix(), "absolute": str(root),
            "manifest_sha256": sha256_of(root / MANIFEST)}


@dataclass(frozen=True)
class NamedRuns:
    """The runs a summary names (named_runs), each where it is still that run."""

    ref: Path
    actual: Path
    calibrations: list[Path]
    # The folders holding those found at their absolute path only, gone from where the summary names them beside
    # itself: a copy of a pair's folder without its runs is judged from the original's, which its reports name.
    read_elsewhere: list[Path]


def runs_named(summary_file: Path, summary: dict[str, Any]) -> NamedRuns:
    """The reference, the port's run and the calibration runs a summary names (named_runs), where each is still
    that run; ProvenanceError where the summary names none (a hand-written one), or one is gone or another."""
    runs = summary.get("runs")
    if not isinstance(runs, dict) or not isinstance(runs.get("calibrations", []), list):
        raise ProvenanceError(f"{summary_file} names no runs it was judged from: not a summary `verify compare -o` or "
                              "a pair wrote (an older verify's: compare its runs again), and no verdict without runs")
    found = [_named_run(summary_file, runs.get("ref"), "reference"),
             _named_run(summary_file, runs.get("actual"), "port's"),
             *(_named_run(summary_file, entry, "calibration") for entry in runs.get("calibrations", []))]
    elsewhere = sorted({path.parent for path, beside in found if not beside})
    return NamedRuns(found[0][0], found[1][0], [path for path, _ in found[2:]], elsewhere)


def _named_run(summary_file: Path, entry: Any, role: str) -> tuple[Path, bool]:
    """The run `entry` names, and whether it lies where the summary names it beside itself (else at its absolute
    path)."""
    if not isinstance(entry, dict) or not all(isinstance(entry.get(key), str) for key in ("path", "absolute")):
        raise ProvenanceError(f"{summary_file} does not name its {role} run as verify writes it: no verdict without "
                              "runs")
    beside = Path(os.path.normpath(Path(summary_file).parent / entry["path"]))
    path = next((place for place in (beside, Path(entry["absolute"])) if place.exists()), beside)
    if not path.exists():
        raise ProvenanceError(f"{summary_file} was judged from the {role} run {path}, which is not there: a verdict "
                              "is judged again from its runs, and without them there is none")
    if entry.get("manifest_sha256") != sha256_of(path / MANIFEST):
        raise ProvenanceError(f"{path} is not the {role} run {summary_file} was judged from: its {MANIFEST} changed "
                              "since")
    return path, path == beside
