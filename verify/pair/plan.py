"""What a pair will run, decided before anything runs: the options checked, the reference given (--ref-run) proven
the original's, and from the scripts' text whether the port runs at once with its reference (it starts no ranks of
its own: two runs at once would meet at one address) and whether that reference follows the port's precision as
the port runs (the original computes in full precision).
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, replace
from pathlib import Path

from verify import devices
from verify.compare.precision_policy import CompareOptions
from verify.contract.files import project_trees
from verify.errors import PairError
from verify.launch.runner import RunOptions, check_options
from verify.record import provenance, run_folders


@dataclass(frozen=True)
class PairPlan:
    original: Path
    ported: Path
    args: list[str]
    options: RunOptions  # what both sides share: steps, seed, dump, dropout, timeout
    device_ref: str
    device_actual: str
    match_amp: bool
    amp_effect: bool
    ref_run: Path | None
    out: Path
    compare: CompareOptions = CompareOptions()  # --loss-rtol, --op-mapping
    adaptation: bool = False  # --adaptation-report
    calibration_runs: int = 1  # --calibration-runs: the reference again under another rounding, measuring its noise
    command: tuple[str, ...] = ()  # the command line, as the adaptation report gives it (options.command_line)
    # The port runs at once with its reference and calibration runs: its text starts no ranks of its own
    # (runs_with_its_reference); the reference follows the port's precision as the port runs (`follows`) where the
    # original's text computes in full precision, as the pair compares a port that gained mixed precision.
    together: bool = False
    follows: bool = False
    trees: tuple[Path, Path] | None = None  # the original's and the port's trees of one project (project_trees)


def planned(asked: PairPlan) -> PairPlan:
    """The plan of what the command line asked, its scripts and options checked (PairError, exit 2, naming what is
    wrong), with what the scripts' text decides, once the pair's folder is claimed (across machines, each node its
    own)."""
    for role, script in (("ORIGINAL", asked.original), ("PORTED", asked.ported)):
        if not script.is_file():
            raise PairError(f"{role} {script}: no such file" + (" (run `migrate` first)" if role == "PORTED" else ""))
    if asked.amp_effect and (not asked.match_amp or asked.ref_run is not None):
        raise PairError("--amp-effect needs the reference run here under the port's autocast: drop "
                        + ("--no-match-amp" if not asked.match_amp else "--ref-run"))
    options = asked.options
    check_options(options)
    if asked.ref_run is not None:
        provenance.check_reference(asked.ref_run, asked.original, asked.ported, asked.args, options.seed,
                                   options.steps)
    together = runs_with_its_reference(asked.ported, options, asked.ref_run)
    if options.nodes:  # each node claims its own folder of the pair's (node 0 writes the reports beside them)
        run_folders.claim_node(asked.out, options.nodes.node_rank)
    else:
        run_folders.claim(asked.out)
    return replace(asked, device_actual=devices.port_device(asked.device_actual), together=together,
                   follows=follows_its_port(asked.original, asked.device_ref, asked.match_amp, together),
                   trees=project_trees(asked.original, asked.ported))


def runs_at_once(plan: PairPlan) -> int:
    """The most runs the pair makes together: the reference, its calibration runs and its fp32 run, and the port
    where it runs with them."""
    return 1 if plan.ref_run is not None else 1 + plan.calibration_runs + plan.amp_effect + plan.together


# What in a script's text starts ranks (two runs at once would meet at one address), and computes in half precision.
_STARTS_RANKS = re.compile(r"spawn|Process\b|init_process_group|elastic|distributed\.run|torchrun")
_HALF_PRECISION = re.compile(r"autocast|GradScaler|\.half\(|float16|bfloat16|\bamp\b")


def _code(script: Path) -> str:
    """A script's text without its comments: a comment that reads "# Process features" starts no process."""
    text = script.read_text(errors="replace")
    lines = text.splitlines(keepends=True)
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                row, column = token.start
                lines[row - 1] = lines[row - 1][:column] + "\n"
    except (tokenize.TokenError, SyntaxError):
        return text
    return "".join(lines)


def runs_with_its_reference(ported: Path, options: RunOptions, ref_run: Path | None) -> bool:
    """Whether the port can run at once with its reference: it starts no ranks, by its text and by verify. A port
    that starts them after all (in a module its text imports) is run first, and its reference again after it
    (verify/pair/run.py). Never across machines (--nnodes needs --nproc-per-node): no node reruns a reference for
    that."""
    return (ref_run is None and not options.nproc_per_node
            and not _STARTS_RANKS.search(_code(ported)))


def follows_its_port(original: Path, device_ref: str, match_amp: bool, together: bool) -> bool:
    """Whether a reference running at once with its port follows the port's autocast and GradScaler as they run
    (verify/capture/followed_port.py): the port's precision is matched, the original computes in full precision (one
    with an autocast of its own runs as written where the port computes in fp32, which following would change), and
    the reference is not one that takes the devices' autocast casts itself (the plain CPU: it computes half
    precision as the devices do only under an autocast it knows of before it starts, and an fp32 pair would pay for
    it)."""
    casts = device_ref in devices.DEVICE_TABLE and devices.row(device_ref).cuda_casts_under_autocast
    return together and match_amp and not casts and not _HALF_PRECISION.search(_code(original))
