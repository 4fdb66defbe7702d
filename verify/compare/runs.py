"""Compare a reference run with a ported run: the comparison's result and how it is put together.

Pure computation over two `Run` (read by compare_cli from a run directory or an msprobe dump): `compare_runs` takes
the precision policy (verify/compare/precision_policy.py), judges the operators and finds the first divergent one
(verify/compare/op_verdicts.py), compares the losses, hyperparameters, gradients, outputs and overflow
(verify/compare/curves.py), and collects the findings and the verdict (verify/compare/findings.py) into a
`ComparisonResult` that report.py renders. It never imports torch, so a comparison runs on any laptop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import pandas as pd

from verify.compare import envelope
from verify.compare.envelope import Envelope
from verify.record import environment
from verify.compare.align import AlignStatus, align_ops
from verify.compare.code_lines import CodeLines
from verify.compare.curves import (LossComparison, compare_grads, compare_hparams, compare_losses, compare_outputs,
                           compare_overflow, summarize_outputs)
from verify.compare.findings import FAILING, Finding, FindingCode, Verdict, collect_findings, how_runs_ended, verdict
from verify.compare.op_catalogue import BUILT_IN, RANDOM, OpCatalogue
from verify.compare.op_verdicts import carried_noise_of, first_divergent_op, op_metrics, unscaled_backward
from verify.compare.precision_policy import CompareOptions, PrecisionPolicy, precision_cost, precision_policy
from verify.compare.rank_compare import findings_across_ranks, race_loss_rtol, racy_updates, ranks_of, worst_rank
from verify.record.store import Run
from verify.devices import title
from verify.record.schema import COMPILE_KEY, DumpMode, Status


# The op table of several ranks: each row's rank, its first column (absent for two single processes); across
# machines, then the node that ran the port's rank.
RANK_COLUMN = "rank"
NODE_COLUMN = "node"


@dataclass
class ComparisonResult:
    verdict: Verdict
    policy: PrecisionPolicy
    ref: Run
    actual: Run
    loss: LossComparison
    ops: pd.DataFrame  # align_ops + metrics + tolerance + passed; several ranks: every rank's rows (RANK_COLUMN)
    first_divergent: dict[str, Any] | None
    hparams: pd.DataFrame  # differences only: step, group, name, ref_value, actual_value, message
    grads: pd.DataFrame  # step, param, ref_norm, actual_norm, rel_diff, passed
    outputs: pd.DataFrame  # inference: step, output, metrics, passed
    overflow: dict[str, Any]
    findings: list[Finding]
    notes: list[str]
    outputs_summary: dict[str, Any] = field(default_factory=dict)  # curves.summarize_outputs: inference only
    ops_not_compared: str = ""  # why no operator was compared (compare._ops_not_compared), "" when they were
    # Runs of several ranks: their numbers, the rank whose comparison this is (shown_rank: its findings, its first
    # divergent op; `ops` holds every rank's), each rank's verdict and the sharding evidence
    # (verify/compare/rank_compare.py); empty for two single processes.
    ranks: dict[str, Any] = field(default_factory=dict)
    op_catalogue: OpCatalogue = BUILT_IN  # what the comparison knew of ops (the advice reads it too)
    # What it was judged from besides the two runs, as summary.json names it so that `verify report` judges again
    # (verify/record/provenance.py): the reference's calibration runs and the options.
    calibrations: list[Run] = field(default_factory=list)
    options: CompareOptions = CompareOptions()

    def status_counts(self) -> dict[str, int]:
        counts = self.ops["status"].value_counts() if len(self.ops) else pd.Series(dtype="int64")
        return {status.value: int(counts.get(status.value, 0)) for status in AlignStatus}

    def summary(self) -> dict[str, Any]:
        """What CI reads in summary.json: verdict, numbers, findings; no per-op rows. Values may be numpy or pandas
        scalars: report.write_json makes them plain JSON data."""
        loss = {item.name: getattr(self.loss, item.name) for item in fields(self.loss) if item.name != "frame"}
        return {
            "verdict": "PASS" if self.verdict.passed else "FAIL",
            "passed": self.verdict.passed,
            "exit_code": self.verdict.exit_code,
            "reason": self.verdict.reason,
            "comparison": self.policy.description,
            "ref": {"path": str(self.ref.root), "title": self.ref.manifest.title, "source": self.ref.source,
                    "emulated": self.ref.manifest.emulated, "device_name": self.ref.manifest.device_name,
                    **precision_cost(self.ref)},
            "actual": {"path": str(self.actual.root), "title": self.actual.manifest.title,
                       "source": self.actual.source, "emulated": self.actual.manifest.emulated,
                       "device_name": self.actual.manifest.device_name, **precision_cost(self.actual)},
            "loss": loss,
            "ops": {**self.status_counts(), "past_tolerance": int((self.ops["passed"] == False).sum()),  # noqa: E712
                    "not_compared": self.ops_not_compared},
            "first_divergent": self.first_divergent,
            "hparam_differences": self.hparams["message"].tolist(),
            "environment_differences": [asdict(d) for d in
                                        environment.differences(self.ref.manifest, self.actual.manifest)],
            "overflow": self.overflow,
            "outputs": self.outputs_summary,
            "findings": [{"code": f.code.value, "message": f.message, "detail": f.detail} for f in self.findings],
            "notes": self.notes,
            **({"ranks": self.ranks} if self.ranks else {}),
        }


# --- precision policy ----------------------------------------------------------------------------------------------


# --- operators -----------------------------------------------------------------------------------------------------


# --- losses, hyperparameters, gradients, outputs ---------------------------------------------------------------------


# --- overflow ------------------------------------------------------------------------------------------------------


# --- findings and the verdict ----------------------------------------------------------------------------------------


def _random_notes(ref: Run, actual: Run) -> list[str]:
    """Whether both sides drew their random numbers from the keyed stream, and the random draws left to each device's
    own generator (on two real devices those differ, whatever the port does)."""
    aligned = [run.manifest.align_random for run in (ref, actual)]
    every_draw = all(run.manifest.random_keyed_by_tag for run in (ref, actual))
    keyed = "random draws (every op torch tags nondeterministic_seeded)" if every_draw else "dropout masks"
    notes = [f"{keyed} drawn from one keyed stream on both sides (verify/capture/random_streams.py)" if all(aligned)
             else "dropout masks from each device's own generator" + ("" if not any(aligned) else " on one side")]
    unaligned = sorted({*ref.manifest.random_not_aligned, *actual.manifest.random_not_aligned})
    for run in (ref, actual):
        if run.manifest.random_keyed_by_tag:
            continue  # its manifest names every draw it left
        # a run recorded before every draw was keyed: its random ops inside modules (at the top level, draws are
        # mostly data and weights made on the CPU)
        ops = run.ops
        drawn = ops.loc[ops["op"].isin(list(RANDOM)) & (ops["module"] != ""), ["op", "module"]].drop_duplicates()
        unaligned += [f"{op} in {module}" for op, module in drawn.itertuples(index=False)
                      if f"{op} in {module}" not in unaligned]
    if unaligned:
        notes.append(f"random draws left to each device's own generator ({len(unaligned)}): "
                     + ", ".join(unaligned[:8]) + (", ..." if len(unaligned) > 8 else "")
                     + "; on two different devices their values differ")
    return notes


def _emulation_notes(ref: Run, actual: Run) -> list[str]:
    """Ops an emulation computed in float32 and rounded, where the CPU lacks the kernel the device runs them with, and
    what it modelled of its device's numerics (or that it computed exactly as the CPU)."""
    sides = (("ref", ref), ("actual", actual))
    notes = [f"{side}: {title(run.manifest.device, run.manifest.emulated_on)} computed {', '.join(ops)} in float32 "
             "and rounded the results to that dtype, as the CPU has no kernel for it"
             for side, run in sides if (ops := run.manifest.extra.get("computed_in_fp32"))]
    notes += [f"{side}: {title(run.manifest.device, run.manifest.emulated_on)} modelled its device's own summation "
              f"order and generator: {'; '.join(modelled)}" for side, run in sides
              if (modelled := run.manifest.modelled_numerics)]
    notes += [f"{side}: {title(run.manifest.device, run.manifest.emulated_on)} computed exactly as the CPU does "
              "(--exact-emulation)" for side, run in sides if run.manifest.exact_emulation]
    return notes


def _compile_notes(ref: Run, actual: Run) -> list[str]:
    """What each side's script compiled with torch.compile, and how verify ran it (verify/capture/compile_calls.py):
    eagerly, op by op, where dynamo compiled nothing under the capture; one note where both sides say the same."""
    said = {side: _compiled_words(run.manifest.extra[COMPILE_KEY])
            for side, run in (("ref", ref), ("actual", actual)) if COMPILE_KEY in run.manifest.extra}
    if len(said) == 2 and len(set(said.values())) == 1:
        return [f"both scripts compile {said['ref']}"]
    return [f"{side}: the script compiles {words}" for side, words in said.items()]


def _compiled_words(compiled: dict[str, Any]) -> str:
    targets = ", ".join(compiled.get("targets", []))
    if graphs := compiled.get("graphs", 0):
        return (f"with torch.compile ({targets}) and dynamo compiled {graphs} graph(s) during the run: "
                "their ops ran as compiled kernels, which the capture does not record one by one")
    return (f"with torch.compile ({targets}): verify ran it eagerly, op by op, so that each op is "
            "recorded (dynamo compiles nothing under the capture's dispatch mode); compiled kernels (inductor's "
            "fusions) are not what was compared")


def _step_notes(ref: Run, actual: Run) -> list[str]:
    notes = []
    ref_steps, actual_steps = set(ref.losses["step"].tolist()), set(actual.losses["step"].tolist())
    if ref_steps != actual_steps and ref_steps and actual_steps:
        notes.append(f"step counts differ: ref {len(ref_steps)}, actual {len(actual_steps)}; compared the "
                     f"{len(ref_steps & actual_steps)} common steps")
    if ref.manifest.seed != actual.manifest.seed:
        notes.append(f"seeds differ: ref {ref.manifest.seed}, actual {actual.manifest.seed}")
    return notes


def _one_sided_notes(ref: Run, actual: Run) -> list[str]:
    """Gradient or output records on one side only: the other's are missing (deleted, damaged from its first step,
    or never written), and comparing only the steps both have would hide it. The operators have their own note."""
    notes = []
    for table in ("grads", "outputs"):
        counts = {side: len(getattr(run, table)) for side, run in (("ref", ref), ("actual", actual))}
        for side, other in (("ref", "actual"), ("actual", "ref")):
            if counts[side] == 0 and counts[other]:
                notes.append(f"the {side} side has no {_TABLE_NAMES[table]} records where the {other} side has "
                             f"{counts[other]}: they were not compared")
    return notes


_TABLE_NAMES = {"grads": "gradient", "outputs": "output"}


def _ops_not_compared(ref: Run, actual: Run) -> str:
    """Why the operators cannot be compared ("" when both sides recorded some): a side without records is named, so
    that the other side's records are not counted as unmatched."""
    missing = {side: _why_no_ops(run) for side, run in (("ref", ref), ("actual", actual)) if run.ops.empty}
    if len(missing) == 2:
        reasons = set(missing.values())
        return (f"neither side recorded any: both {reasons.pop()}" if len(reasons) == 1
                else f"neither side recorded any: ref {missing['ref']}, actual {missing['actual']}")
    return "".join(f"the {side} side recorded none: it {why}" for side, why in missing.items())


def _why_no_ops(run: Run) -> str:
    if run.manifest.dump_mode == DumpMode.OFF.value:
        return "ran with --dump off"
    if run.manifest.steps_completed == 0:
        return "stopped before its first step"
    return "has no operator table"


def _settling_notes(actual: Run, overflow: dict[str, Any]) -> list[str]:
    """The steps the runs made past those asked for while the loss scale settled (verify/capture/step_recorder.py),
    from the scale they started at to the one the first update applied at."""
    settling = actual.manifest.steps_completed - actual.manifest.steps_requested
    trace = overflow["actual_scale"]
    if settling <= 0 or not trace["scales"]:
        return []
    applied = [scale for step, scale in zip(trace["steps"], trace["scales"]) if step not in trace["skipped"]]
    settled = f"{applied[0]:g}" if applied else f"{trace['scales'][-1]:g}, still falling"
    return [f"ran {settling} more step(s) while the loss scale settled ({trace['scales'][0]:g} → {settled}): "
            f"{len(trace['skipped'])} update(s) skipped, {len(applied)} applied"]


def _overflow_noise_notes(overflow: dict[str, Any]) -> list[str]:
    notes = []
    apart = ", ".join(map(str, overflow.get("calibration_overflows_apart", [])))
    if overflow["skips_within_noise"]:
        skipped = ", ".join(str(skip["step"]) for skip in overflow["skips_within_noise"])
        notes.append(f"updates skipped on one side only (step {skipped}) are within the script's noise: under the same "
                     f"scales the reference's calibration run overflowed at other steps than the reference ({apart})")
    if overflow.get("firsts_within_noise"):
        firsts = "; ".join(f"{side} step {first['step']} ({first['op']}, {first['module'] or 'top level'})"
                           for side in ("ref", "actual") if (first := overflow[f"{side}_first"]))
        notes.append(f"the first gradient overflows outside a skipped update differ ({firsts}) within the script's "
                     f"noise: the reference's calibration run overflowed at other steps than the reference ({apart})")
    return notes


def _chaotic_notes(measured: Envelope | None, loss_rtol: float) -> list[str]:
    """Where the reference's own loss moves past the loss tolerance: from that step on, the script's noise (a GAN, a
    loss scaler skipping other steps) covers what the port does, and the verdict judges those steps by little."""
    if measured is None or measured.losses.empty:
        return []
    past = measured.losses[measured.losses > loss_rtol]
    if past.empty:
        return []
    step = int(past.index.get_level_values("step").min())
    return [f"from step {step} on, the reference differs from itself by more than the loss tolerance {loss_rtol:.2%} "
            f"(up to {measured.losses.max():.2%}): the script's own noise covers what the port does there, so those "
            f"steps judge the port by little; the steps before {step} judge it closely (--steps {step} keeps only them)"]


def _unmeasured(calibrations: Sequence[Run]) -> str:
    """Why the comparison fell back to fixed tolerances: the note every report shows."""
    why = (f"its {len(calibrations)} calibration run(s) did not end well" if calibrations
           else "no calibration run of the reference was found beside it (--calibration-runs 0, or runs made apart)")
    return (f"judged by fixed tolerances ({why}): the reference's own noise was not measured, so fixed rules "
            "stand in for it (verify/compare/tolerances.py)")


def _evidence(loss: LossComparison, hparams_compared: bool, grads: pd.DataFrame, outputs: pd.DataFrame) -> str:
    """What a comparison without operators was judged on: 'losses, hyperparameters and gradients'."""
    kinds = [kind for kind, present in (("losses", loss.steps_compared > 0), ("hyperparameters", hparams_compared),
                                        ("gradients", len(grads) > 0), ("outputs", len(outputs) > 0)) if present]
    return " and ".join([", ".join(kinds[:-1]), kinds[-1]] if len(kinds) > 1 else kinds) or "nothing"


def compare_runs(ref: Run, actual: Run, options: CompareOptions = CompareOptions(),
                 calibrations: Sequence[Run] | None = None) -> ComparisonResult:
    """The comparison of two runs; CompareError where they prove nothing (see findings.how_runs_ended). Runs of
    several ranks are compared rank by rank, and across ranks (_compare_ranks). `calibrations`: the reference's
    calibration runs, whose differences from it are the envelope each record is judged against (envelope.py); None
    where none could be (a run compared with itself, as `verify determinism` does)."""
    compare = _compare_ranks if ref.ranks or actual.ranks else _compare_processes
    result = compare(ref, actual, options, calibrations)
    result.calibrations, result.options = list(calibrations or []), options
    return result


def _compare_ranks(ref: Run, actual: Run, options: CompareOptions,
                   calibrations: Sequence[Run] | None) -> ComparisonResult:
    """Each pair of ranks compared as two processes, each against the same rank of the calibration runs; the findings
    across ranks first (the data each rank read, the ranks' agreement), then the worst rank's, named. That rank's
    comparison is what the reports show. Ranks whose updates race (hogwild) are judged on what does not race."""
    ended, shared_ending = how_runs_ended(ref, actual)
    ended = [finding for finding in ended if finding.code is FindingCode.RUN_FAILED]
    across, evidence = findings_across_ranks(ref, actual)
    across = ended + across  # the port's run as a whole: the rank that ended it, the collective the others were in
    racy = racy_updates(ref) or racy_updates(actual)
    pairs = zip(ranks_of(ref), ranks_of(actual))
    if shared_ending:  # both runs ended alike: each rank by the run's ending, not by how the launcher's teardown hit it
        pairs = ((_ended_as(mine, ref), _ended_as(theirs, actual)) for mine, theirs in pairs)
    race_rtol = race_loss_rtol(ref) if racy else 0.0
    results = [_compare_processes(mine, theirs, options, _same_rank(calibrations, rank), racy, race_rtol)
               for rank, (mine, theirs) in enumerate(pairs)]
    worst = worst_rank([(result.verdict.passed, result.findings) for result in results],
                       actual.manifest.extra.get("cause_rank", 0))
    verdicts = [rank_result.verdict.reason for rank_result in results]
    result = results[worst]
    result.ops = _every_rank(results, actual.rank_nodes())
    result.findings = across + [replace(finding, message=f"{actual.rank_name(worst)}: {finding.message}",
                                        detail={**finding.detail, "rank": worst}) for finding in result.findings]
    failing = [finding for finding in across if finding.code in FAILING]
    reason = result.verdict.reason.split(": ", 1)[-1]
    if failing:
        result.verdict = Verdict(False, f"FAIL: {failing[0].message}")
    elif not result.verdict.passed:
        result.verdict = Verdict(False, f"FAIL: {actual.rank_name(worst)}: {reason}")
    else:
        result.verdict = Verdict(True, f"PASS: on each of the {len(results)} ranks, {reason}")
    result.notes += [f"{actual.rank_name(rank)}: {reason}" for rank, reason in enumerate(verdicts)]
    if evidence["sharding"].get("checked"):
        result.notes.append(f"data read by each rank (run time): {evidence['sharding']['message']}")
    result.ref, result.actual = ref, actual
    result.ranks = {**evidence, "shown_rank": worst, "verdicts": verdicts, **_by_node(ref, actual)}
    return result


def _ended_as(rank: Run, run: Run) -> Run:
    """A rank of a run that stopped, ending as the run did: the crash of the rank that caused it, where the others
    only failed in a collective it never joined (gloo's error, which names a port of that launch: another text on
    each side, and even another error as the peer's death is seen by a read or a write)."""
    if rank.manifest.status not in (Status.CRASHED.value, Status.TIMEOUT.value):
        return rank
    run_ending = {name: getattr(run.manifest, name) for name in ("status", "message", "traceback")}
    return replace(rank, manifest=replace(rank.manifest, **run_ending))


def _same_rank(calibrations: Sequence[Run] | None, rank: int) -> list[Run] | None:
    """The calibration runs' records of `rank` (None: no calibration was asked for)."""
    if calibrations is None:
        return None
    return [ranks_of(run)[rank] for run in calibrations if rank < len(ranks_of(run))]


def _by_node(ref: Run, actual: Run) -> dict[str, Any]:
    """Across machines, each side's ranks by the node that ran them ({"nodes": {"actual": {"0": [0, 1], ...}}}; the
    rendezvous may give the sides' ranks to other nodes); {} on one machine."""
    sides = {side: run.ranks_by_node() for side, run in (("ref", ref), ("actual", actual))}
    if not any(sides.values()):
        return {}
    return {"nodes": {side: {str(node): ranks for node, ranks in nodes.items()} for side, nodes in sides.items()}}


def _every_rank(results: list[ComparisonResult], nodes: dict[int, int]) -> pd.DataFrame:
    """Each rank's op rows, in rank order, with the rank as the first column (then its node, across machines)."""
    ops = pd.concat([result.ops.assign(**{RANK_COLUMN: rank}, **({NODE_COLUMN: nodes.get(rank)} if nodes else {}))
                     for rank, result in enumerate(results)], ignore_index=True)
    leading = [RANK_COLUMN, *([NODE_COLUMN] if nodes else [])]
    return ops[[*leading, *(column for column in ops.columns if column not in leading)]]


def _compare_processes(ref: Run, actual: Run, options: CompareOptions,
                       calibrations: Sequence[Run] | None = None, racy: str = "",
                       race_rtol: float = 0.0) -> ComparisonResult:
    """Two processes: two single-process runs, or a rank of each. `racy`: why their operators and gradients cannot
    be judged (processes updating shared parameters without locks), "" where they can; `race_rtol`: how far their
    losses may move for the race alone (rank_compare.race_loss_rtol)."""
    ended, shared_ending = how_runs_ended(ref, actual)
    notes = [*(f"ref: {n}" for n in ref.notes), *(f"actual: {n}" for n in actual.notes), *_step_notes(ref, actual),
             *_one_sided_notes(ref, actual), *_random_notes(ref, actual), *_emulation_notes(ref, actual),
             *_compile_notes(ref, actual)]
    if shared_ending:
        notes.append(shared_ending)
    policy = precision_policy(ref, actual, options)
    ops_not_compared = racy or _ops_not_compared(ref, actual)
    sides = (ref.ops.iloc[:0], actual.ops.iloc[:0]) if ops_not_compared else (
        unscaled_backward(ref), unscaled_backward(actual))
    catalogue = options.op_catalogue
    notes += [f"ops paired by the op mapping file {source} too" for source in catalogue.sources]
    measured = envelope.measure(ref, [run for run in calibrations or () if run.manifest.status in ("ok", "short")],
                                unscaled_backward)
    if calibrations is not None:
        notes.append(measured.describe() if measured else _unmeasured(calibrations))
    notes += _chaotic_notes(measured, policy.loss_rtol)
    table = op_metrics(align_ops(*sides, catalogue), ref, actual, policy, notes, measured)
    first = first_divergent_op(table)
    loss = compare_losses(ref, actual, max(policy.loss_rtol, race_rtol), measured)
    if race_rtol > policy.loss_rtol:
        notes.append(f"losses judged within {race_rtol:.2%}: the spread of the reference's racing workers' losses "
                     "over its steps, as a step may follow any number of the other workers' updates")
    hparams = compare_hparams(ref, actual)
    carried = carried_noise_of(table) if measured is None else None  # the envelope measures it where it exists
    grads = compare_grads(ref, actual, policy.loss_rtol, carried, measured)
    grads = grads.iloc[:0] if racy else grads  # each gradient is of parameters the other processes moved meanwhile
    outputs = compare_outputs(ref, actual, policy, notes)
    overflow = compare_overflow(ref, actual, measured)
    notes += _settling_notes(actual, overflow) + _overflow_noise_notes(overflow)
    if ops_not_compared:
        evidence = _evidence(loss, not (ref.hparams.empty or actual.hparams.empty), grads, outputs)
        notes.append(f"operators not compared: {ops_not_compared}; judged on the {evidence}")
    findings = collect_findings(ended, ref, actual, table, first, loss, hparams, grads, outputs, overflow, policy,
                                catalogue, CodeLines(ref, actual))
    outputs_summary = summarize_outputs(outputs, policy)
    return ComparisonResult(
        verdict=verdict(findings, loss, table, policy, first, ops_not_compared, shared_ending, outputs_summary),
        policy=policy, ref=ref, actual=actual, loss=loss, ops=table, first_divergent=first, hparams=hparams,
        grads=grads, outputs=outputs, overflow=overflow, findings=findings, notes=notes,
        outputs_summary=outputs_summary, ops_not_compared=ops_not_compared, op_catalogue=catalogue)
