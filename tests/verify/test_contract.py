"""The contract's readers (verify/contract/pair_result.py) on what verify wrote: the H200 pair folders' summary.json
and reference manifest.json, as `migrate --fix-from` reads them; and a file they cannot read, named."""

import json
from pathlib import Path

import pytest

from verify.contract.files import MANIFEST, SUMMARY_JSON
from verify.contract.finding_codes import FindingCode
from verify.contract.pair_result import PairResult, RunSetup, UnreadableFile

PAIRS = Path(__file__).parent / "fixtures" / "gpu-runs-h200"


def test_a_pairs_summary_reads_as_its_verdict_findings_and_command():
    result = PairResult.read(PAIRS / "mnist-lr")
    summary = json.loads((PAIRS / "mnist-lr" / SUMMARY_JSON).read_text())
    assert (result.verdict, result.passed, result.reason) == ("FAIL", False, summary["reason"])
    assert [finding.code for finding in result.findings] == [finding["code"] for finding in summary["findings"]]
    diverges = next(finding for finding in result.findings if finding.code == FindingCode.OP_DIVERGES)
    assert (diverges.port_dtype, diverges.port_source) == ("float32", "lr_npu.py:51")
    assert result.has(FindingCode.HPARAM_MISMATCH) and not result.has(FindingCode.UPDATES_SKIPPED)
    assert result.reference == Path(summary["runs"]["ref"]["absolute"])
    assert result.command[:3] == ("verify", "main.py", "lr_npu.py") and result.ran_in == summary["pair"]["ran_in"]
    assert PairResult.amp_effect(PAIRS / "mnist-lr") is None  # no --amp-effect


def test_a_reference_manifest_reads_as_what_ran():
    ran = RunSetup.read(PAIRS / "mnist-lr" / "ref")
    manifest = json.loads((PAIRS / "mnist-lr" / "ref" / MANIFEST).read_text())
    assert (ran.script, ran.seed, ran.steps) == (Path(manifest["script"]), manifest["seed"], manifest["steps_requested"])
    assert ran.argv == tuple(manifest["argv"])


@pytest.mark.parametrize("text, why", [(None, "No such file"), ("[1]", "holds a JSON list"),
                                       ('{"findings": [{"code": "op_diverges"}]}', "not a verify summary")])
def test_a_summary_it_cannot_read_is_named(tmp_path, text, why):
    if text is not None:
        (tmp_path / SUMMARY_JSON).write_text(text)
    with pytest.raises(UnreadableFile) as raised:
        PairResult.read(tmp_path)
    assert raised.value.path == tmp_path / SUMMARY_JSON and why in raised.value.why
