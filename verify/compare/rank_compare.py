"""What comparing two runs of several ranks adds to comparing two processes (verify/compare/runs.py compares each pair
of ranks as two processes): the findings across ranks (the numbers of ranks, the data each rank read:
verify/compare/sharding.py, and whether a side's ranks agree on their gradients after the all-reduce and their
parameters after the step), and which rank's comparison the verdict and the reports show: the worst. No torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from verify.compare.findings import FAILING, Finding, FindingCode
from verify.compare.metrics import TINY
from verify.compare.sharding import sharding
from verify.record.store import Run
from verify.record.schema import MODEL_KEY, UPDATE_OP

# Ranks of one side after an all-reduce hold the same bytes; a relative difference past this is no rounding.
RANKS_AGREE_RTOL = 1e-5


def ranks_of(run: Run) -> list[Run]:
    """A run's ranks; a single process is its own only rank."""
    return run.ranks or [run]


def racy_updates(run: Run) -> str:
    """Why the ranks' updates race ("" where they do not): processes that train one model in shared memory without
    locks (hogwild), whose records then differ from run to run by design."""
    shared = [rank for rank in ranks_of(run) if rank.manifest.extra.get(MODEL_KEY, {}).get("shared_memory")]
    if len(shared) < 2:
        return ""
    return (f"the script's {len(shared)} processes update one model's parameters in shared memory without locks "
            "(hogwild): their updates race and differ from run to run by design, so neither operators nor gradients "
            "are judged")


def race_loss_rtol(run: Run) -> float:
    """How far a racing worker's loss may move for the race alone: its step may come after any number of the other
    workers' updates (they start apart, and run at their own pace), so its loss may lie anywhere on the path the
    workers' losses take: the spread of the reference's losses over all its ranks and steps, relative to the
    smallest."""
    losses = pd.concat([pd.to_numeric(rank.losses["loss"], errors="coerce") for rank in ranks_of(run)]).to_numpy(
        "float64")
    losses = losses[np.isfinite(losses)]
    if len(losses) < 2:
        return 0.0
    return float(np.ptp(losses) / max(np.abs(losses).min(), TINY))


def _norms(run: Run) -> pd.DataFrame:
    """rank, what ("gradient" before the step, "parameter" after it), step, name, norm: of every rank of a run."""
    frames = []
    for rank, process in enumerate(ranks_of(run)):
        grads = process.grads[["step", "param", "norm"]].assign(what="gradient")
        updates = process.ops.loc[process.ops["op"] == UPDATE_OP, ["step", "module", "l2_norm"]]
        params = updates.rename(columns={"module": "param", "l2_norm": "norm"}).assign(what="parameter")
        frames += [frame.assign(rank=rank) for frame in (grads, params) if len(frame)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["step", "param", "norm", "what", "rank"])


def disagreement(run: Run) -> dict[str, Any] | None:
    """The first (step, gradient or parameter) on which a rank of `run` differs from rank 0, or None where they all
    agree (as DDP's all-reduce and identical updates make them)."""
    norms = _norms(run)
    if norms["rank"].nunique() < 2:
        return None
    lead = norms.loc[norms["rank"] == 0].drop(columns="rank")
    joined = norms.loc[norms["rank"] != 0].merge(lead, on=["what", "step", "param"], suffixes=("", "_rank0"))
    scale = joined[["norm", "norm_rank0"]].abs().max(axis=1).clip(lower=1e-12)
    differ = joined.loc[(joined["norm"] - joined["norm_rank0"]).abs() / scale > RANKS_AGREE_RTOL]
    if differ.empty:
        return None
    row = differ.assign(after_step=differ["what"] == "parameter").sort_values(["step", "after_step", "rank"]).iloc[0]
    return {"step": int(row["step"]), "what": str(row["what"]), "param": str(row["param"]), "rank": int(row["rank"]),
            "norm": float(row["norm"]), "norm_rank0": float(row["norm_rank0"])}


def _agreement_findings(ref: Run, actual: Run) -> list[Finding]:
    """The port's ranks disagree where the original's agree: gradients that are not all-reduced (DDP left out), or
    updates that differ per rank."""
    theirs, ours = disagreement(ref), disagreement(actual)
    if ours is None or theirs is not None:
        return []
    cause = ("the port does not all-reduce its gradients (no DistributedDataParallel, or no all_reduce)"
             if ours["what"] == "gradient" else "the port's ranks update their parameters differently")
    return [Finding(FindingCode.RANKS_DISAGREE, (
        f"the port's {actual.rank_name(ours['rank'])} holds another {ours['what']} {ours['param']} than its "
        f"{actual.rank_name(0)} at step "
        f"{ours['step']} (norm {ours['norm']:.6g} vs {ours['norm_rank0']:.6g}), where the original's ranks agree: "
        f"{cause}"), ours)]


def findings_across_ranks(ref: Run, actual: Run) -> tuple[list[Finding], dict[str, Any]]:
    """The findings across ranks, causes first, and what the reports say of the ranks and their data."""
    counts = {"ref": len(ranks_of(ref)), "actual": len(ranks_of(actual))}
    if counts["ref"] != counts["actual"]:
        finding = Finding(FindingCode.RANKS_DIFFER, (
            f"the original ran as {counts['ref']} rank(s) and the port as {counts['actual']}: compared rank by rank "
            f"as far as both go"), counts)
        return [finding], {"world_size": counts, "sharding": {"checked": False}}
    found, evidence = sharding(ref, actual)
    return found + _agreement_findings(ref, actual), {"world_size": counts, "sharding": evidence}


def worst_rank(verdicts: list[tuple[bool, list[Finding]]], cause_rank: int) -> int:
    """Which rank's comparison stands for the pair: the failing one whose leading finding ranks first among the
    causes (the rank that ended the port's run where ranks tie), else rank 0. `verdicts`: (passed, findings) a rank."""
    def key(rank: int) -> tuple:
        passed, findings = verdicts[rank]
        leading = min((FAILING.index(f.code) for f in findings if f.code in FAILING), default=len(FAILING))
        return passed, leading, rank != cause_rank, rank

    return min(range(len(verdicts)), key=key)
