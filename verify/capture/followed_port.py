"""A port's run as it goes, followed by its reference while both run (manifest.follows: the port's run folder).

A reference follows its port's precision: it enters each module call under the autocast of the port's call of the
same number (precision_scopes.FollowedScopes) and plays the port's GradScaler step by step (loss_scaler_twin). After
the port's run it reads them from the finished run (manifest.autocast_follow, manifest.loss_scaler_plan). Run at once
with the port (`verify ORIGINAL PORTED`, verify/pair/run.py), it reads the port's run folder as the port writes it
(its manifest after every step, losses.csv) and waits where the port has not got there yet: a call's autocast until
the port has made that call, a step's loss scales and skipped updates until the port has written that step. The port
only appends to what is read, so each record is final once it is there, and where the port ends short of it the
reference takes what it would have taken from the finished run: it follows exactly what it would have followed after
the port, and the pair checks that it did (what it imposed is in its manifest, as after a finished port).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verify.record.schema import AUTOCAST_DTYPES, RunManifest, Status, LossScalerPlan
from verify.record.store import MANIFEST, LOSSES, read_losses, read_manifest, recorded_loss_scales

POLL_S = 0.005  # a step of a port takes milliseconds at least; a stat() this often costs nothing beside it
_FLAGS = {dtype: flag for flag, dtype in AUTOCAST_DTYPES.items()}  # float16 -> fp16


class FollowedPort:
    """The port's run folder, read as the port writes it, on behalf of the reference run whose manifest is `own`: it
    keeps `own.autocast_follow` (the port's autocast record as read) and `own.autocast` (the half dtype it imposes)
    as after a finished port."""

    def __init__(self, run_dir: Path, own: RunManifest) -> None:
        self.run_dir = run_dir
        self.own = own
        self.port: RunManifest | None = None  # None until the port's runner wrote its first manifest
        self._read: tuple[int, int, int] | None = None  # the manifest file read (inode, mtime, size)
        self._plan_read: tuple[Any, int] | None = None  # what the last loss-scaler plan was made from
        self._plan: LossScalerPlan | None = None
        self._written_steps = 0  # the port's steps known to be written whole

    @property
    def ended(self) -> bool:
        return self.port is not None and self.port.status != Status.RUNNING.value

    def scopes_of(self, path: str, number: int) -> list[list[Any]] | None:
        """The port's autocast record of module `path` once it holds call `number` or the port ended (None: the port
        never called it)."""
        port = self._waiting_for(lambda port: sum(count for _, count in port.autocast_scopes.get(path, ())) > number)
        return port.autocast_scopes.get(path)

    def scaler_plan(self, step: int) -> LossScalerPlan | None:
        """The port's GradScaler as far as `step` once the port wrote that step or ended (None: the port has none)."""
        port = self._waiting_for(lambda port: self._step_written(port, step))
        if not port.loss_scaler:
            return None
        losses = self.run_dir / LOSSES  # written once the port recorded a scale, as its manifest's loss_scaler
        made_from = (self._read, losses.stat().st_size if losses.exists() else 0)
        if made_from != self._plan_read:
            self._plan = LossScalerPlan.of_port(port.loss_scaler, port.loss_scaler.get("skipped_updates", []),
                                                recorded_loss_scales(read_losses(self.run_dir)))
            self._plan_read = made_from
        return self._plan

    def _step_written(self, port: RunManifest, step: int) -> bool:
        """Whether the port's records of `step` are all written: a step's losses may be written at the end of the
        next one (step_recorder: statistics still on their way from a GPU), never later."""
        if step < self._written_steps or port.steps_completed > step + 1:
            return True
        if port.steps_completed > step and bool((read_losses(self.run_dir)["step"] == step).any()):
            self._written_steps = step + 1
            return True
        return False

    def _waiting_for(self, arrived: Callable[[RunManifest], bool]) -> RunManifest:
        """The port's manifest once `arrived` holds of it or the port ended; read again only while it does not (a
        module call of a reference behind its port reads nothing)."""
        while self.port is None or not (self.ended or arrived(self.port)):
            if not self._refresh():
                time.sleep(POLL_S)
        return self.port

    def _refresh(self) -> bool:
        """Reads the port's manifest where it changed; whether it did."""
        try:
            stat = os.stat(self.run_dir / MANIFEST)
        except FileNotFoundError:
            return False
        read = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if read == self._read:
            return False
        self.port, self._read = read_manifest(self.run_dir), read
        self.own.autocast_follow = self.port.autocast_scopes
        if not self.own.autocast:
            self.own.autocast = next((_FLAGS[state] for runs in self.port.autocast_scopes.values()
                                      for state, _ in runs if state in _FLAGS), "")
        return True


def followed(own: RunManifest) -> FollowedPort | None:
    """The port a reference follows while both run (manifest.follows), if any."""
    return FollowedPort(Path(own.follows), own) if own.follows else None


def after_first_step(run_dir: Path) -> None:
    """Returns once the run in `run_dir` (manifest.starts_after: the port going at once with this run) has made its
    first step or ended."""
    while True:
        port = read_manifest(run_dir)  # there before this run started (sides.SideRunner.run_together), written whole
        if port.steps_completed > 0 or port.status != Status.RUNNING.value:
            return
        time.sleep(POLL_S * 10)
