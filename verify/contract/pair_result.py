"""What a verify pair found and what it ran, as `migrate PORT --fix-from PAIR` reads them (migrate/fix.py): the pair
folder's summary.json (verify/compare/runs.py `summary()`, with the runs and the pair's command that
verify/report/writers.py and the pair add), its amp-effect/summary.json, and the reference run's manifest.json
(verify/record/schema.py `RunManifest`). Only the parts a fix acts on are read, each typed once here: a file that
lacks one is `UnreadableFile`, named, never a KeyError in migrate. Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verify.contract.files import AMP_EFFECT, MANIFEST, SUMMARY_JSON


class UnreadableFile(ValueError):
    """A file of verify's that is missing, is not JSON, or lacks what is read of it."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


@dataclass(frozen=True)
class Finding:
    """One finding of the comparison: a FindingCode's value (verify/contract/finding_codes.py), its message, and the
    detail its code carries."""

    code: str
    message: str
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def port_dtype(self) -> str | None:
        """An op finding's (op_diverges): the dtype the port's op computed in."""
        return self.detail.get("actual_dtype")

    @property
    def port_source(self) -> str | None:
        """An op finding's: the port's line that called the op, `file:line`."""
        return self.detail.get("actual_source")

    @property
    def loss_scales(self) -> list[float]:
        """A loss-scale finding's (updates_skipped): the scale at each step of the port's run."""
        return list(self.detail.get("scales") or [])

    @property
    def grads_carried(self) -> bool:
        """A loss-scale finding's: whether the port's gradients are never reset, so that they keep the first
        overflow's inf at every scale."""
        return bool(self.detail.get("grads_carried"))


@dataclass(frozen=True)
class FirstOverflow:
    """The first op of a run whose result held an inf or a nan (summary.json's overflow.actual_first)."""

    op: str
    dtype: str
    step: int
    source: str | None  # the user's line that computed it, `file:line`
    phase: str = ""  # forward, backward, optimizer ...
    module: str = ""  # the module path it ran in (`Net.big`), "" at the top level


@dataclass(frozen=True)
class SettingDifference:
    """A setting of the environment the two runs computed in that differs (verify/record/environment.py), by its
    dotted name (`data_loaders.0.batch_size`)."""

    setting: str
    ref: Any
    actual: Any


@dataclass(frozen=True)
class PairResult:
    """A pair's verdict and what it found, from its summary.json."""

    verdict: str  # "PASS", "FAIL"; "ERROR" where verify wrote no summary (`not_written`)
    passed: bool
    reason: str
    findings: tuple[Finding, ...] = ()
    setting_differences: tuple[SettingDifference, ...] = ()
    first_overflow: FirstOverflow | None = None  # the port's
    reference: Path | None = None  # the reference run's folder, absolute
    command: tuple[str, ...] = ()  # the pair's command line (`verify ORIGINAL PORTED ... -- ARGS`)
    ran_in: str = ""  # the folder it ran in
    # what the port's precision costs (verify/compare/precision_policy.py precision_cost): the share of its forward
    # and backward records computed in half precision, and its median step time; None where not recorded
    port_half_share: float | None = None
    port_step_ms: float | None = None
    port_device_name: str = ""  # the port's device as its runtime names it ("Ascend910B2", "CPU (emulated NPU)")

    @classmethod
    def read(cls, folder: Path) -> PairResult:
        """The result a pair (or `verify compare -o`) wrote into `folder`."""
        path = folder / SUMMARY_JSON
        return cls.from_json(_json_object(path), path)

    @classmethod
    def amp_effect(cls, pair_folder: Path) -> PairResult | None:
        """The AMP effect a pair measured with --amp-effect (its fp32 reference against the reference under
        autocast); None where it measured none."""
        return cls.read(pair_folder / AMP_EFFECT) if (pair_folder / AMP_EFFECT / SUMMARY_JSON).is_file() else None

    @classmethod
    def not_written(cls, reason: str) -> PairResult:
        """A verify run that wrote no summary (it failed before its reports): an ERROR that passes nothing."""
        return cls("ERROR", False, reason)

    @classmethod
    def from_json(cls, summary: dict[str, Any], path: Path = Path(SUMMARY_JSON)) -> PairResult:
        try:
            overflow = (summary.get("overflow") or {}).get("actual_first")
            pair = summary.get("pair") or {}
            reference = ((summary.get("runs") or {}).get("ref") or {}).get("absolute")
            port = summary.get("actual") or {}
            return cls(
                summary.get("verdict", "ERROR"), bool(summary.get("passed")), summary.get("reason", ""),
                tuple(Finding(f["code"], f["message"], f.get("detail") or {}) for f in summary.get("findings", [])),
                tuple(SettingDifference(d["setting"], d["ref"], d["actual"])
                      for d in summary.get("environment_differences") or []),
                FirstOverflow(overflow["op"], overflow["dtype"], overflow["step"], overflow.get("source"),
                              str(overflow.get("phase") or ""), str(overflow.get("module") or ""))
                if overflow else None,
                Path(reference) if reference else None, tuple(pair.get("command", [])), pair.get("ran_in") or "",
                port.get("half_share"), port.get("step_ms"), str(port.get("device_name") or ""))
        except (AttributeError, KeyError, TypeError) as error:
            raise UnreadableFile(path, f"not a verify summary ({type(error).__name__}: {error})") from None

    def has(self, code: str) -> bool:
        return any(finding.code == code for finding in self.findings)


@dataclass(frozen=True)
class RunSetup:
    """What a run ran, where and how, from its manifest.json: what a pair's next round runs again."""

    script: Path
    cwd: Path
    argv: tuple[str, ...]  # the script's own arguments
    seed: int
    steps: int  # the steps asked for (--steps)

    @classmethod
    def read(cls, run_folder: Path) -> RunSetup:
        path = run_folder / MANIFEST
        manifest = _json_object(path)
        try:
            return cls(Path(manifest["script"]), Path(manifest["cwd"]), tuple(manifest.get("argv", [])),
                       manifest["seed"], manifest["steps_requested"])
        except (KeyError, TypeError) as error:
            raise UnreadableFile(path, f"not a verify run's manifest ({type(error).__name__}: {error})") from None


def _json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UnreadableFile(path, str(error)) from None
    if not isinstance(data, dict):
        raise UnreadableFile(path, f"holds a JSON {type(data).__name__}, not an object")
    return data
