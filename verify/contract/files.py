"""Where each tool writes what the other, or a person, opens: the port's name, migrate's report folder and fix folder,
verify's report files and the run's manifest. Every name is spelt here alone; a reader of the other tool's files
finds them through these names, never by a literal of its own. The run folder's own tables and logs are verify's
(verify/record/schema.py).
"""

from __future__ import annotations

from pathlib import Path

# --- the port ---------------------------------------------------------------------------------------------------

# migrate writes the port of train.py as train_npu.py, and of src/ as src_npu/, beside the original.
PORT_SUFFIX = "_npu"


def port_name(original: Path, suffix: str = PORT_SUFFIX) -> Path:
    """Where `migrate ORIGINAL` writes the port by default, and where `verify ORIGINAL` looks for it (`migrate
    --suffix` names it otherwise)."""
    return original.with_name(f"{original.stem}{suffix}{original.suffix}")


def project_trees(original: Path, ported: Path) -> tuple[Path, Path] | None:
    """The folders at which the paths of a script and of its port part, the folders below them the same: minGPT/ and
    minGPT_npu/ for minGPT/projects/chargpt/chargpt.py and minGPT_npu/projects/chargpt/chargpt.py (`migrate minGPT`
    ports the project as one tree, naming the port's after the original's). None for scripts in one folder or in
    folders of other names."""
    a, b = original.resolve().parent, ported.resolve().parent
    while a != b and a.name == b.name and a.parent != a:
        a, b = a.parent, b.parent
    ported_tree = b.name.startswith(a.name) and b.name != a.name
    return (a, b) if ported_tree and not (a.is_relative_to(b) or b.is_relative_to(a)) else None


# --- migrate's report folder: <port stem>_report/ beside the port -------------------------------------------------

REPORT_SUFFIX = "_report"


def report_folder(port: Path) -> Path:
    """Where migrate writes the reports of a port written to `port`: NAME_npu.py -> NAME_npu_report/, src_npu/ ->
    src_npu_report/. Its presence beside a port is what marks the port as migrate's own; verify reads the
    checklist and the lines migrate changed from it."""
    name = port.stem if port.suffix == ".py" else port.name
    return port.with_name(name + REPORT_SUFFIX)


REPORT_MD = "report.md"  # the port's findings in Markdown; an earlier port is listed in it
FINDINGS_CSV = "findings.csv"
# each finding of migrate's rules: verify names the rule behind a line migrate changed
FINDINGS_JSON = "findings.json"
# the port against the original: verify rebuilds the port migrate wrote from it
DIFF_PATCH = "diff.patch"
CHANGE_LIST_CSV = "change_list.csv"
UNSUPPORTED_API_CSV = "unsupported_api.csv"
HYPERPARAMETERS_CSV = "hyperparameters.csv"
CHECKLIST_MD = "checklist.md"
# the checklist items (id, title, status, evidence, action): verify's reports show them
CHECKLIST_JSON = "checklist.json"
# The sha256 of each file a run of migrate wrote, by its path relative to the report folder: what migrate may replace
# (migrate/ownership.py), and, for verify, whether a port on disk is still the one migrate wrote.
WRITTEN_JSON = "written.json"

# --- migrate's fix folder: PAIR_fix/ beside a verify pair's folder (`migrate PORT --fix-from PAIR`) ----------------

FIX_JSON = "fix.json"  # its rounds, causes and rewrites, and the sha256 of the fixed port
FIX_MD = "fix.md"  # the same for a person; its diff.patch is DIFF_PATCH

# --- verify's report files: a pair's folder, `verify compare -o`, `verify determinism` ----------------------------

# the verdict, the findings and the numbers; migrate --fix-from reads them (pair_result.py)
SUMMARY_JSON = "summary.json"
ADVICE_TXT = "advice.txt"
REPORT_HTML = "report.html"
OPS_XLSX = "ops.xlsx"
OPS_CSV = "ops.csv"
OPS_PARQUET = "ops.parquet"
# the compared loss curves (a run's own losses are verify/record/schema.py's LOSSES)
LOSSES_CSV = "losses.csv"
ADAPTATION_MD = "adaptation.md"
DETERMINISM_JSON = "determinism.json"
# the pair's folder of the AMP effect's reports (--amp-effect), its own SUMMARY_JSON in it
AMP_EFFECT = "amp-effect"
# verify's own bug: its traceback, kept in the command's output folder (verify/cli/exits.py)
TRACEBACK_FILE = "verify-traceback.txt"

# --- verify's run folder ------------------------------------------------------------------------------------------

# the run's record (verify/record/schema.py RunManifest); migrate reads what ran from it (pair_result.py)
MANIFEST = "manifest.json"
