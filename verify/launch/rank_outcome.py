"""How a run of several ranks ended, told from its ranks' manifests and last collectives
(verify/capture/rank_capture.py): which rank caused the ending (the first that failed by itself; after a timeout, the
one the others wait for) and the collective the others wait in. The runner finalises each rank and writes the run's
manifest with it. No torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from verify.record.schema import RunManifest, Status

STOPPED = "stopped_by"  # manifest.extra: why a rank that did not end by itself was stopped ("timeout", "launcher",
# or the signal that stopped verify: "SIGTERM")
_ENDED_WELL = (Status.OK.value, Status.SHORT.value)


def collective_words(last: dict[str, Any]) -> str:
    """'c10d.allreduce_ of step 2 (its collective #9)'."""
    if not last:
        return "no collective"
    where = f" in {last['module']}" if last.get("module") else ""
    return f"{last['op']}{where} of step {last['step']} (its collective #{last['count']})"


def stop_rank(manifest: RunManifest, ending: str, timeout: float | None, last: dict[str, Any],
              signal_name: str = "") -> RunManifest:
    """A rank whose process never wrote how it ended: killed at the timeout, when verify was stopped (by
    `signal_name`), or by the launcher after another rank failed. Its records up to then stay; its manifest says
    where it was."""
    if manifest.status != Status.RUNNING.value:
        return manifest
    done = f"{manifest.steps_completed} steps completed; last collective called: {collective_words(last)}"
    if ending == "timeout":
        return replace(manifest, status=Status.TIMEOUT.value, message=f"timed out after {timeout:g} s ({done})",
                       extra={**manifest.extra, STOPPED: "timeout"})
    if signal_name:
        return replace(manifest, status=Status.INTERRUPTED.value,
                       message=f"interrupted: verify was stopped by {signal_name} ({done})",
                       extra={**manifest.extra, STOPPED: signal_name})
    return replace(manifest, status=Status.CRASHED.value, message=f"stopped by the launcher ({done})",
                   extra={**manifest.extra, STOPPED: "launcher"})


def _cause(ranks: list[RunManifest], lasts: list[dict[str, Any]]) -> int:
    """The index of the rank that ended the run: of the ranks that failed by themselves (else of those stopped), the
    one that called the fewest collectives: the others failed or waited in one it never called; else rank 0."""
    failed = [index for index, manifest in enumerate(ranks)
              if manifest.status not in _ENDED_WELL and STOPPED not in manifest.extra]
    candidates = failed or [index for index, manifest in enumerate(ranks) if STOPPED in manifest.extra]
    return min(candidates, key=lambda index: (lasts[index].get("count", 0), index)) if candidates else 0


def _ending(run: RunManifest, ranks: list[RunManifest], lasts: list[dict[str, Any]], cause: int) -> str:
    """The run's message: the rank that ended it first, then the collective another rank failed or waited in, which
    that rank never called."""
    culprit, last = ranks[cause], lasts[cause]
    if culprit.status in _ENDED_WELL:
        return culprit.message + (f" on each of {len(ranks)} ranks" if len(ranks) > 1 else "")
    ahead = [(manifest, lasts[index]) for index, manifest in enumerate(ranks)
             if index != cause and lasts[index].get("count", 0) > last.get("count", 0)]
    if not ahead:
        return f"rank {culprit.rank}: {culprit.message}"
    other, theirs = ahead[0]
    if culprit.status == Status.TIMEOUT.value:
        return (f"rank {culprit.rank} hung at step {culprit.steps_completed} outside the collectives the others wait "
                f"for (its last: {collective_words(last)}); rank {other.rank} waits in {collective_words(theirs)}, "
                f"which rank {culprit.rank} never called; timed out after {run.timeout_s:g} s")
    verb = "was stopped" if STOPPED in other.extra else "failed"
    return (f"rank {culprit.rank}: {culprit.message}; rank {other.rank} {verb} in {collective_words(theirs)}, "
            f"which rank {culprit.rank} never called")


def run_manifest(run: RunManifest, ranks: list[RunManifest], lasts: list[dict[str, Any]]) -> RunManifest:
    """The run's manifest from its ranks': rank 0's record of the run (device, precision, process group), the steps
    every rank completed, and how the run ended, the rank that caused it named first."""
    cause = _cause(ranks, lasts)
    culprit = ranks[cause]
    return replace(
        ranks[0], rank=0, world_size=max(run.world_size, len(ranks)), status=culprit.status,
        message=_ending(run, ranks, lasts, cause), exit_code=culprit.exit_code, traceback=culprit.traceback,
        verify_error=culprit.verify_error, steps_completed=min(manifest.steps_completed for manifest in ranks),
        wall_s=run.wall_s, finished_at=run.finished_at, extra={**ranks[0].extra, "cause_rank": culprit.rank})
