"""Whether the port's ranks read the data as the original's do, checked on what they read at run time: the samples
table holds a fingerprint of each sample the model received (verify/capture/ops.py), per rank and step. Where the
original's ranks read disjoint shards the port's must too, each rank must read what the original's rank read, and the
union of a step's samples must be equal on both sides. The first difference becomes one finding, its cause named
where the runs tell it (a DataLoader without the original's DistributedSampler, a sampler whose epoch is never set,
ranks seeded alike). No torch.
"""

from __future__ import annotations

from typing import Any

from verify.compare.findings import Finding, FindingCode
from verify.record.schema import ACCUMULATION
from verify.record.store import Run

Shards = list[dict[int, frozenset[str]]]  # rank -> step -> the fingerprints of the samples it read
_DISTRIBUTED_SAMPLER = "DistributedSampler"


def _lead_rows(run: Run):
    """The samples of the first outermost module that received data."""
    samples = run.samples
    return samples.loc[samples["module"] == samples.iloc[0]["module"]]


def lead_input(runs: list[Run]) -> str:
    """The input of the lead module whose samples tell the most apart, over every run of both sides (one choice for
    all, so that they compare the same input): a keyword batch (`model(**batch)`) may come labels first, whose samples
    are a handful of classes, where input_ids tell each sample apart (accelerate's nlp_example: two fingerprints, so
    two ranks reading the same unsharded data read 'the same samples' as the original's shards). The first input
    where several tell as much; "" where a run recorded none."""
    counts: dict[str, int] = {}
    names: list[set[str]] = []
    for run in runs:
        if run.samples.empty:
            return ""
        rows = _lead_rows(run)
        distinct: dict[str, set[str]] = {}
        for io, fingerprints in zip(rows["io"], rows["fingerprints"]):
            distinct.setdefault(str(io), set()).update(filter(None, str(fingerprints).split(",")))
        names.append(set(distinct))
        for io, found in distinct.items():
            counts[io] = counts.get(io, 0) + len(found)
    shared = [io for io in dict.fromkeys(_lead_rows(runs[0])["io"].astype(str)) if all(io in own for own in names)]
    return max(shared, key=lambda io: counts[io], default="")


def step_samples(run: Run, io: str = "") -> dict[int, frozenset[str]]:
    """step -> the samples this process's model received: an input of the first outermost module that received data
    (`io`, else its first), over every forward of the step."""
    samples = run.samples
    if samples.empty:
        return {}
    rows = _lead_rows(run)
    rows = rows.loc[rows["io"] == (io if io in set(rows["io"]) else rows.iloc[0]["io"])]
    steps: dict[int, set[str]] = {}
    for step, fingerprints in zip(rows["step"], rows["fingerprints"]):
        steps.setdefault(int(step), set()).update(filter(None, str(fingerprints).split(",")))
    return {step: frozenset(found) for step, found in steps.items()}


def _common_steps(ref: Shards, actual: Shards) -> list[int]:
    steps = [set(rank) for rank in (*ref, *actual)]
    return sorted(set.intersection(*steps)) if steps else []


def _sampler(run: Run) -> str:
    """The sampler class of the run's first DataLoader ("" without one), as the environment record names it."""
    loaders = run.manifest.extra.get("environment", {}).get("data_loaders", [])
    return str(loaders[0].get("sampler", "")) if loaders and isinstance(loaders[0], dict) else ""


def _dropped_sampler(ref: Run, actual: Run) -> str:
    """"the port has no DistributedSampler (...)" where the original's DataLoader has one and the port's not; ""."""
    actual_sampler = _sampler(actual)
    if _sampler(ref) != _DISTRIBUTED_SAMPLER or actual_sampler == _DISTRIBUTED_SAMPLER:
        return ""
    return f"the port has no {_DISTRIBUTED_SAMPLER} (its DataLoader samples with {actual_sampler or 'no sampler'})"


def _loaders(run: Run) -> int:
    """How many DataLoaders the run made, as the environment record lists them (a DataLoader that accelerate's
    prepare() shards is one more: the loader it makes for each rank)."""
    return len(run.manifest.extra.get("environment", {}).get("data_loaders", []))


def _shared_cause(ref: Run, actual: Run) -> str:
    """Why the port's ranks read the same samples where the original's do not."""
    if dropped := _dropped_sampler(ref, actual):
        return dropped
    if (made := _loaders(actual)) < (made_by_original := _loaders(ref)):
        return (f"the port made {made} DataLoader(s) where the original made {made_by_original}: a loader the original "
                "shards out to its ranks (passed to accelerate's accelerator.prepare, or given a DistributedSampler) "
                "the port reads whole on every rank")
    if not _sampler(actual):
        return "the port's ranks draw the same batches: a seed that differs per rank (seed + rank) is missing"
    return "the port's ranks read the same shard of the data"


def _overlap_finding(ref: Run, actual: Run, ref_shards: Shards, actual_shards: Shards,
                     steps: list[int]) -> Finding | None:
    """The first step and pair of ranks whose samples overlap in the port where they are disjoint in the original."""
    for step in steps:
        for rank in range(1, len(actual_shards)):
            for other in range(rank):
                shared = actual_shards[rank][step] & actual_shards[other][step]
                if not shared or ref_shards[rank][step] & ref_shards[other][step]:
                    continue
                read = actual_shards[rank][step]
                what = (f"the same samples as {actual.rank_name(other)}" if read == actual_shards[other][step]
                        else f"{len(shared)} of its {len(read)} samples that {actual.rank_name(other)} read too")
                return Finding(FindingCode.SHARDING, (
                    f"{actual.rank_name(rank)} read {what} at step {step}, where the original's ranks read disjoint "
                    f"shards: {_shared_cause(ref, actual)}"), {"step": step, "rank": rank, "other_rank": other,
                                                              "cause": "overlap"})
    return None


def _repeated_step(union: list[frozenset[str]], position: int) -> int | None:
    """The earlier step position whose union of samples the one at `position` repeats, if any."""
    return next((earlier for earlier in range(position) if union[earlier] == union[position]), None)


def _reading_finding(ref: Run, actual: Run, ref_shards: Shards, actual_shards: Shards,
                     steps: list[int]) -> Finding | None:
    """The first step at which a rank of the port read other samples than the same rank of the original."""
    ref_union = [frozenset().union(*(rank[step] for rank in ref_shards)) for step in steps]
    actual_union = [frozenset().union(*(rank[step] for rank in actual_shards)) for step in steps]
    for position, step in enumerate(steps):
        differing = [rank for rank, (mine, theirs) in enumerate(zip(actual_shards, ref_shards))
                     if mine[step] != theirs[step]]
        if not differing:
            continue
        rank, detail = differing[0], {"step": step, "rank": differing[0]}
        repeated = _repeated_step(actual_union, position)
        if repeated is not None and _repeated_step(ref_union, position) is None:
            message = (f"at step {step} the port's ranks read again the samples of step {steps[repeated]}, where the "
                       "original's read new ones: the port does not set the sampler's epoch (set_epoch) as the "
                       "original does")
            return Finding(FindingCode.SHARDING, message, detail | {"cause": "epoch", "repeats": steps[repeated]})
        if actual_union[position] == ref_union[position]:
            message = (f"{actual.rank_name(rank)} read other samples than the original's {ref.rank_name(rank)} at "
                       f"step {step}, though both "
                       "sides' ranks together read the same: the port shares the data out to its ranks otherwise")
            return Finding(FindingCode.SHARDING, message, detail | {"cause": "assignment"})
        agreeing = [other for other in range(len(actual_shards)) if other not in differing]
        dropped = _dropped_sampler(ref, actual)  # ranks that each read data of their own: no overlap tells it
        same = (f": {dropped}" if dropped else f" (rank{'s' if len(agreeing) > 1 else ''} "
                f"{', '.join(map(str, agreeing))} read the same): the port's ranks are seeded or sharded differently"
                if agreeing else ": the data, its order or its seed differ")
        message = (f"{actual.rank_name(rank)} read other samples than the original's {ref.rank_name(rank)} at step "
                   f"{step}{same}")
        return Finding(FindingCode.SHARDING, message, detail | {"cause": "samples"})
    return None


def _accumulation(run: Run) -> set[str]:
    """The backward() calls of each step of the run's lead optimizer (hparams.csv), as recorded."""
    hparams = run.hparams
    if not len(hparams) or "name" not in hparams:
        return set()
    return set(hparams.loc[hparams["name"] == ACCUMULATION, "value"].astype(str))


def sharding(ref: Run, actual: Run) -> tuple[list[Finding], dict[str, Any]]:
    """The sharding finding (at most one) and the evidence for the reports (checklist items C6 and C7)."""
    ref_ranks, actual_ranks = ref.ranks or [ref], actual.ranks or [actual]
    io = lead_input([*ref_ranks, *actual_ranks])
    ref_shards, actual_shards = ([step_samples(run, io) for run in ranks] for ranks in (ref_ranks, actual_ranks))
    if len(ref_shards) != len(actual_shards) or not all(ref_shards + actual_shards):
        return [], {"checked": False, "why": "a side recorded no samples, or the sides ran other numbers of ranks"}
    steps = _common_steps(ref_shards, actual_shards)
    # a step of a side that accumulates more backward() calls reads more samples: the hyperparameter's finding says it
    reads_alike = _accumulation(ref_ranks[0]) == _accumulation(actual_ranks[0])
    finding = (_overlap_finding(ref, actual, ref_shards, actual_shards, steps)
               or (_reading_finding(ref, actual, ref_shards, actual_shards, steps) if reads_alike else None))
    disjoint = all(not (shards[rank][step] & shards[other][step]) for shards in (ref_shards,) for step in steps
                   for rank in range(len(shards)) for other in range(rank))
    evidence = {"checked": True, "steps": len(steps), "ranks": len(ref_shards), "original_disjoint": disjoint,
                "passed": finding is None, "message": finding.message if finding else (
                    f"each of the port's {len(ref_shards)} ranks read the samples the original's rank read at each of "
                    f"the {len(steps)} steps" + (" (disjoint shards)" if disjoint and len(ref_shards) > 1 else ""))}
    return ([finding] if finding else []), evidence
