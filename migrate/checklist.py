"""The accuracy checklist (C1..C9, verify/contract/checklist_items.py) as a report: Passed / Failed / Not checked,
each with file:line evidence and what to do.

Two sources of evidence: the findings the rules recorded (each rule names the items it speaks to), and a few cheap
facts read from the original and the ported source (where autocast, a GradScaler, seeds, torch_npu imports are).
Items that need a run say "Not checked" and give the exact `verify` command that checks them.

An item passes only when something was checked: a file that was not read (it did not parse), a rule left out by
--select/--ignore, a rule that found nothing to look at, or a fact that could not be read leaves it "Not checked",
with the reason.
"""

from __future__ import annotations

import json
import os
import shlex
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

from migrate import hyperparams
from migrate.facts import FileFacts
from migrate.types import FileResult, FileStatus
from rules import Action, AmpPolicy, Finding, Mode, Settings, Severity, all_rules
import verify.frameworks as frameworks
from verify.contract.checklist_items import TITLES, Status, markdown_row, markdown_text

if TYPE_CHECKING:
    from migrate.project import Project, ProjectImport
    from rules import PortRule


@dataclass(frozen=True)
class Evidence:
    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}" if self.line else f"{self.path}: {self.text}"


# ----- the items --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    id: str
    title: str
    status: Status
    evidence: tuple[str, ...]
    action: str = ""


@dataclass
class _Inputs:
    results: Sequence[FileResult]
    settings: Settings
    rules: Sequence[type[PortRule]]
    verify_command: str
    original_script: str
    project: Project | None
    facts: list[tuple[str, FileFacts]] = field(default_factory=list)  # of the files whose facts were read
    unread: list[str] = field(default_factory=list)  # why a file, or its facts, could not be read
    rules_run: set[str] = field(default_factory=set)

    @property
    def inference(self) -> bool:
        """Every file that was ported is read as an inference script: no training step to scale or autocast."""
        ported = [r for r in self.results if r.status in (FileStatus.CHANGED, FileStatus.UNCHANGED)]
        return bool(ported) and all(r.inference for r in ported)

    @property
    def uses_torch(self) -> bool:
        return any(facts.original.torch_import for _, facts in self.facts)

    def ported(self, kind: str, text: str = "") -> list[Evidence]:
        return [
            Evidence(path, line, text or kind) for path, facts in self.facts for line in getattr(facts.ported, kind)
        ]

    def framework_amp(self) -> list[Evidence]:
        """Where a framework's mixed precision is switched on (verify/frameworks: its switch), with its dtype."""
        return [
            Evidence(path, line, f"{'bf16' if line in facts.ported.framework_bf16 else 'fp16'} {_FRAMEWORK_AMP}")
            for path, facts in self.facts
            for line in facts.ported.framework_amp
        ]

    def framework_amp_option(self) -> list[Evidence]:
        """Where a framework's mixed precision is chosen at run time, and how it is switched on there."""
        return [
            Evidence(path, line, f"{_FRAMEWORK_AMP}, chosen at run time" + (f": {how}" if how else ""))
            for path, facts in self.facts
            for line, how in facts.ported.framework_amp_switch_on
            if line in facts.ported.framework_amp_option
        ]

    def open_findings(self, item: str) -> list[Finding]:
        return [
            f
            for result in self.results
            for f in result.findings
            if item in f.checklist and f.action is not Action.CHANGED and f.severity is not Severity.INFO
        ]

    def fixed(self, item: str) -> list[Finding]:
        return [
            f for result in self.results for f in result.findings if item in f.checklist and f.action is Action.CHANGED
        ]

    def checked_by(self, item: str) -> list[str]:
        return [rule.CODE for rule in self.rules if item in rule.CHECKLIST]

    def left_out(self, item: str) -> list[str]:
        """The rules of this mode that speak to `item` but did not run: --select/--ignore left them out."""
        return [
            rule.CODE
            for rule in all_rules()
            if item in rule.CHECKLIST and self.settings.mode in rule.MODES and rule not in self.rules
        ]


def build(
    results: Sequence[FileResult],
    settings: Settings,
    rules: Sequence[type[PortRule]],
    verify_command: str,
    original_script: str,
    project: Project | None = None,
) -> list[Item]:
    """Every checklist item with its status, evidence and what to do. `verify_command` compares the original with
    the port; `original_script` is the original's path, which `verify determinism` runs alone. Of the files of a
    `project` ported by name, only those an entry point reaches give evidence: the others never run."""
    if project is not None:
        results = [r for r in results if project.counts(r.source)]
    inputs = _Inputs(results, settings, rules, verify_command, original_script, project)
    read = [r for r in results if r.facts is not None]
    # Evidence about the port points into the ported file, whose line numbers the facts carry.
    inputs.facts = [(r.target or r.source, r.facts) for r in read if r.facts.readable]
    inputs.unread = [f"not read: {r.error}" for r in results if r.error] + [
        f"{r.source}: Python's parser cannot read it, so its facts are unknown" for r in read if not r.facts.readable
    ]
    inputs.rules_run = {code for r in read for code in r.facts.rules_run}
    items = [
        _constant_results(inputs),
        _mixed_precision(inputs),
        _port_complete(inputs),
        _loss_scaling(inputs),
        _item("C5", Status.NOT_CHECKED, [], f"Run `{verify_command}`: it fingerprints the data each side reads."),
        _static_item(inputs, "C6"),
        _static_item(inputs, "C7"),
        _static_item(inputs, "C8"),
        _hyperparameters(inputs),
    ]
    return [_settle(item, inputs) for item in items]


def _settle(item: Item, inputs: _Inputs) -> Item:
    """An item passes only when everything it speaks to was checked. A file that was not read, or a rule that was
    left out, makes a pass (and an item that needs a run) "Not checked", with the reason first. A failure stands:
    what was read is wrong whatever the rest holds."""
    left_out = inputs.left_out(item.id)
    reasons = [*inputs.unread]
    if left_out:
        reasons.append(f"not run: {', '.join(left_out)} (left out by --select/--ignore)")
    if item.status is Status.FAILED or not reasons:
        return item
    todo = [
        "Make every file readable (see the errors) and run migrate again." if inputs.unread else "",
        "Run migrate without --select/--ignore." if left_out else "",
        item.action,
    ]
    return _item(item.id, Status.NOT_CHECKED, [*reasons, *item.evidence], " ".join(part for part in todo if part))


INFERENCE_NOTE = "read as an inference script: no backward() and no optimizer step"
# Evidence where a framework (verify/frameworks) does the mixed precision itself.
_FRAMEWORK_AMP = "mixed precision by the framework"
_NO_SECOND_AMP = "The framework does autocast and loss scaling: add no torch.autocast or GradScaler of your own."


def _without_torch(item_id: str) -> Item:
    return _item(item_id, Status.NOT_CHECKED, ["no file that was read imports torch: nothing to run on the NPU"])


def _item(item_id: str, status: Status, evidence: Iterable[object], action: str = "") -> Item:
    return Item(item_id, TITLES[item_id], status, tuple(str(e) for e in evidence), action)


def _finding_evidence(findings: Iterable[Finding]) -> list[str]:
    return [f"{f.location}: {f.code} {f.message}" for f in findings]


def _constant_results(inputs: _Inputs) -> Item:
    seeds = inputs.ported("seeds", "seeding call")
    evidence = seeds or (["no seeding call found in the source"] if inputs.facts else [])
    script = shlex.quote(inputs.original_script)
    return _item(
        "C1",
        Status.NOT_CHECKED,
        [*map(str, evidence), *_finding_evidence(inputs.open_findings("C1"))],
        f"Run `verify determinism {script}`: it runs the original twice and lists the operators that differ. On the "
        "NPU, constant results need torch.use_deterministic_algorithms(True), CLOSE_MATMUL_K_SHIFT=1 and, with "
        "collectives, HCCL_DETERMINISTIC=true (migrate --deterministic sets them, DET003).",
    )


def _mixed_precision(inputs: _Inputs) -> Item:
    if not inputs.uses_torch:
        return _without_torch("C2")
    autocast = inputs.ported("autocast")
    open_findings = inputs.open_findings("C2")
    framework = _framework_precision(inputs, "C2")
    if framework is not None and not open_findings:
        return framework
    if autocast and not open_findings:
        return _item(
            "C2", Status.PASSED, autocast, f"Confirm at run time: `{inputs.verify_command}` shows fp16/bf16 ops."
        )
    if inputs.inference and not open_findings:
        return _item(
            "C2",
            Status.NOT_CHECKED,
            [*autocast, INFERENCE_NOTE, "migrate adds autocast around training steps only"],
            f'For mixed-precision inference, wrap the model call in torch.autocast("npu"); `{inputs.verify_command}` '
            "compares the outputs either way.",
        )
    action = 'Run migrate with --amp fp16 (or bf16), or add torch.autocast("npu") around the forward and the loss.'
    if inputs.settings.amp is AmpPolicy.OFF:
        action = "Mixed precision was turned off (--amp off). " + action
    return _item(
        "C2", Status.FAILED, [*autocast, *_finding_evidence(open_findings)] or ["no autocast in the port"], action
    )


def _framework_precision(inputs: _Inputs, item_id: str) -> Item | None:
    """C2 or C4 where a framework does the mixed precision: Passed where a literal switches it on (C4: its loss
    scaler for fp16; bf16 needs none), Not checked where it is chosen at run time; None without a framework."""
    switched_on, option = inputs.framework_amp(), inputs.framework_amp_option()
    confirm = f"Confirm at run time: `{inputs.verify_command}` shows fp16/bf16 ops" + (
        " and the loss scale." if item_id == "C4" else "."
    )
    if switched_on:
        return _item(item_id, Status.PASSED, [*switched_on, *option], f"{confirm} {_NO_SECOND_AMP}")
    if off := inputs.ported("framework_amp_off", f"{_FRAMEWORK_AMP}, turned off by its config file"):
        return _item(item_id, Status.FAILED, off, "Turn the framework's mixed precision on in its config file "
                     f"({frameworks.switch_on_advice(in_config_files=True)}). {_NO_SECOND_AMP} {confirm}")
    if option:
        return _item(
            item_id,
            Status.NOT_CHECKED,
            option,
            "Chosen at run time: turn the framework's mixed precision on where you run it "
            f"({_switches_on(inputs, 'framework_amp_option')}). {_NO_SECOND_AMP} {confirm}",
        )
    full = inputs.ported("framework_fp32", f"{_FRAMEWORK_AMP}, not switched on: it trains in fp32")
    if full and not inputs.inference and not inputs.ported("autocast"):  # a loop of the script's own autocasts
        return _item(item_id, Status.FAILED, full, "Switch the framework's mixed precision on "
                     f"({_switches_on(inputs, 'framework_fp32')}). {_NO_SECOND_AMP} {confirm}")
    return None


def _switches_on(inputs: _Inputs, kind: str) -> str:
    """How the framework calls of facts `kind` switch mixed precision on, in their switches' words."""
    chosen = sorted({how for _, facts in inputs.facts for line, how in facts.ported.framework_amp_switch_on
                     if how and line in getattr(facts.ported, kind)})
    return "; or ".join(chosen) or frameworks.switch_on_advice()


def _port_complete(inputs: _Inputs) -> Item:
    if not inputs.uses_torch:
        return _without_torch("C3")
    imports = inputs.ported("npu_import")
    open_findings = [f for f in inputs.open_findings("C3") if f.severity is Severity.ERROR]
    left_out = _left_out(inputs)
    if imports and not open_findings and not left_out:
        evidence = [*map(str, imports), *map(str, inputs.ported("process_group"))]
        return _item("C3", Status.PASSED, evidence, f"Confirm that the port runs: `{inputs.verify_command}`.")
    not_ported = [f"{found}, which this call did not port: its cuda calls stay" for found in left_out]
    evidence = [*_finding_evidence(open_findings), *not_ported] or ["no file imports torch_npu"]
    action = "Port what the errors name; see the findings' suggestions."
    if left_out:
        folders = dict.fromkeys(shlex.quote(os.path.dirname(found.shown_file) or ".") + "/" for found in left_out)
        action = f"Port the files it names in the same call, or the folder: `migrate {' '.join(folders)}`. " + action
    return _item("C3", Status.FAILED, evidence, action)


def _left_out(inputs: _Inputs) -> list[ProjectImport]:
    """In explicit mode, the imports of project files the call did not port, in the files an entry point runs: their
    cuda calls stay. (In transfer mode transfer_to_npu patches them at run time; IMP004 warns of them.)"""
    if inputs.project is None or inputs.settings.mode is not Mode.EXPLICIT:
        return []
    return inputs.project.left_out()


def _loss_scaling(inputs: _Inputs) -> Item:
    if not inputs.uses_torch:
        return _without_torch("C4")
    scalers = inputs.ported("grad_scaler")
    scaled = inputs.ported("scaled_backward")
    bf16 = inputs.ported("autocast_bf16")
    open_findings = inputs.open_findings("C4")
    if open_findings:
        return _item("C4", Status.FAILED, _finding_evidence(open_findings), "Apply the suggestions (--unsafe-fixes).")
    framework = _framework_precision(inputs, "C4")
    if framework is not None and not scalers:
        return framework
    if inputs.inference and not scalers:
        return _item("C4", Status.NOT_CHECKED, [INFERENCE_NOTE, "no loss to scale"])
    if scalers and (scaled or not inputs.ported("autocast")):
        return _item(
            "C4", Status.PASSED, [*scalers, *scaled], "Confirm at run time: the verify report shows the scale."
        )
    if bf16 and not scalers:
        return _item("C4", Status.PASSED, [f"{e} (bf16 autocast needs no loss scaling)" for e in bf16])
    return _item(
        "C4",
        Status.FAILED,
        scalers or ["no GradScaler in the port"],
        'Use torch.amp.GradScaler("npu"): scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update().',
    )


def _static_item(inputs: _Inputs, item_id: str) -> Item:
    checked_by = inputs.checked_by(item_id)
    if not checked_by:
        evidence = [] if inputs.left_out(item_id) else ["no rule checks this item yet"]
        return _item(item_id, Status.NOT_CHECKED, evidence, "Review by hand.")
    open_findings = inputs.open_findings(item_id)
    fixed = [f"fixed: {text}" for text in _finding_evidence(inputs.fixed(item_id))]
    if open_findings:
        return _item(
            item_id, Status.FAILED, [*_finding_evidence(open_findings), *fixed], "See each finding's suggestion."
        )
    ran = [code for code in checked_by if code in inputs.rules_run]
    if not ran:
        what = f"nothing for {', '.join(checked_by)} to look at in the source that was read"
        return _item(item_id, Status.NOT_CHECKED, [what], "Review by hand.")
    return _item(item_id, Status.PASSED, fixed or [f"nothing found by {', '.join(ran)}"])


def _hyperparameters(inputs: _Inputs) -> Item:
    differences, count = [], 0
    for path, facts in inputs.facts:
        for original, ported in hyperparameter_pairs(facts):
            count += 1
            if original is None or ported is None or original.value != ported.value:
                differences.append(_difference(path, original, ported))
    runtime = f"At run time `{inputs.verify_command}` compares every param_group of both optimizers."
    if differences:
        return _item("C9", Status.FAILED, differences, "Make the port's values equal the original's. " + runtime)
    if not count:
        return _item("C9", Status.NOT_CHECKED, ["no hyperparameter found in the source that was read"], runtime)
    return _item("C9", Status.PASSED, [f"{count} hyperparameters identical in the original and the port"], runtime)


def hyperparameter_pairs(
    facts: FileFacts,
) -> list[tuple[hyperparams.Hyperparameter | None, hyperparams.Hyperparameter | None]]:
    """Original and ported hyperparameters paired by (source, name, n-th occurrence)."""

    def keyed(rows: Sequence[hyperparams.Hyperparameter]) -> dict[tuple[str, str, int], hyperparams.Hyperparameter]:
        seen: Counter[tuple[str, str]] = Counter()
        out = {}
        for row in rows:
            out[(*row.key, seen[row.key])] = row
            seen[row.key] += 1
        return out

    original, ported = keyed(facts.original.hyperparameters), keyed(facts.ported.hyperparameters)
    return [(original.get(key), ported.get(key)) for key in dict.fromkeys([*original, *ported])]


def _difference(path: str, original, ported) -> str:
    if ported is None:
        return f"{path}: {original.name} = {original.value} (original line {original.line}) is missing in the port"
    if original is None:
        return f"{path}:{ported.line}: {ported.name} = {ported.value} appears only in the port"
    return f"{path}:{ported.line}: {ported.name} = {ported.value} in the port, {original.value} in the original"


# ----- rendering --------------------------------------------------------------------------------------------


def to_json(items: Sequence[Item]) -> str:
    return json.dumps([asdict(item) | {"status": item.status.value} for item in items], indent=1)


def to_markdown(items: Sequence[Item], title: str = "Accuracy checklist") -> str:
    counts = Counter(item.status.value for item in items)
    lines = [f"# {title}", "", ", ".join(f"{n} {status}" for status, n in counts.items()), ""]
    lines += ["| id | item | status |", "|---|---|---|"]
    lines += [markdown_row([item.id, item.title, f"**{item.status.value}**"]) for item in items]
    for item in items:  # the evidence and the action quote file names and code: escaped
        lines += ["", f"## {item.id} {item.status.value}: {item.title}", ""]
        lines += [f"- {markdown_text(evidence)}" for evidence in item.evidence]
        if item.action:
            lines += ["", f"What to do: {markdown_text(item.action)}"]
    return "\n".join(lines) + "\n"
