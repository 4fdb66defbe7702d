"""`migrate PORT --fix-from PAIR`: from what a verify pair measured to a port that keeps accuracy.

A round reads what a verify pair found (the pair's, then each round's) through the contract between the two tools
(verify/contract/pair_result.py: its summary.json and its reference's manifest.json, typed; standard library only, the
one part of verify migrate imports), picks the causes a port can fix, has the fix rules (AMP201, AMP202) rewrite the
port into `<stem>_fixed.py` beside it (never over the user's file), and verifies that file again as a subprocess
(`verify ORIGINAL FIXED --no-match-amp`: the reference as written, in fp32, following the port's loss scale, since a
reference under the port's autocast would compute the kept line in half precision and overflow alike). It goes on
while a round fixes something, up to `rounds`. A precision FAIL (an op that overflows or diverges in half precision,
updates skipped at every loss scale, or a FAIL that stays after a round fixed one) climbs a ladder (`LADDER`), each
rung verified before the next, from the cheapest: the overflowing call alone in fp32, its module's forward in fp32, a
loss-scale search that may go below 1, bf16 in place of fp16, AMP off; a rung whose rewrite changes nothing more is
climbed past. fix.md shows each round's rung, verdict and cost (the share of records still in half precision, the
step time against the first port's). The causes it never fixes (a port bug: a changed hyperparameter,
operator, reduction, a dropped zero_grad) are named and left; no tolerance is widened. The fix folder
(`PAIR_fix/`) holds each round's verify output, diff.patch, fix.md and fix.json.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from migrate import ownership
from migrate.diff import unified_diff
from migrate.files import PlanError, sha256, shown_path, write_atomic
from rules import AmpPolicy, Settings, mapped_line, rule_by_code
from verify.contract.checklist_items import markdown_code, markdown_text
from verify.contract.files import DIFF_PATCH, FIX_JSON, FIX_MD, SUMMARY_JSON, report_folder
from verify.contract.finding_codes import FindingCode
from verify.contract.pair_result import PairResult, RunSetup, UnreadableFile

FIX_RULES = ("AMP201", "AMP202", "AMP204")
# with a `data_order` cause: the port's seeds and DataLoader order made the original's, and DATA002's set_epoch where
# the original calls it
ORDER_RULES = ("DET201", "DATA201")
EPOCH_RULE = "DATA002"
FIXED_SUFFIX = "_fixed"
_HALF = ("float16", "bfloat16")
# a cause of the fix's own beside verify's finding codes: a DataLoader setting verify's environment record shows changed
DATA_HPARAM = "data_hparam"
GRADS_CARRIED = "grads_carried"  # updates_skipped where the port never resets its gradients
# the causes a fix never touches: a port bug, named and left (issue 47)
NEVER_FIXED = {
    FindingCode.HPARAM_MISMATCH: "a changed hyperparameter: make the port's value the original's",
    FindingCode.OP_CHANGED: "a changed operator (activation, reduction, its settings): call the original's",
    FindingCode.GRADS_NOT_RESET: "a dropped zero_grad: reset the gradients where the original does",
    FindingCode.INIT_DIFFERS: "a dropped initialization: write the parameters after to_empty as the original does",
    DATA_HPARAM: "a changed DataLoader batch_size or drop_last: make the port's value the original's",
    FindingCode.NO_UPDATE_COMPARED: "both scripts' loss scalers skipped every update: give them more steps to compare "
                                    "one",
    GRADS_CARRIED: "gradients never reset keep the first overflow's inf, so the GradScaler skips every step at any "
                   "scale: reset them once per optimizer step (optimizer.zero_grad()), in the original too",
}
# what is said of a cause a fix could act on but whose rewrite changed nothing
UNFIXED = {FindingCode.DATA_ORDER: "no seed or DataLoader order argument of the port differs from the original's: "
                                   "seed and order the data as the original does (a file listing, a sampler, the data "
                                   "itself)"}
ADVICE = {**NEVER_FIXED, **UNFIXED}
# the DataLoader settings verify records whose difference is a port's changed hyperparameter
_DATA_HPARAMS = (".batch_size", ".drop_last")
# The pair's options a round passes on (flags, and options with a value); the reference and output are the round's.
_FLAGS = ("--no-dropout", "--no-align-random", "--exact-emulation")
_VALUED = ("--device-ref", "--timeout", "--devices", "--nproc-per-node", "--calibration-runs", "--op-mapping",
           "--loss-rtol")


@dataclass(frozen=True)
class Rung:
    """A rung of the fix's ladder for a precision cause: each is verified before the next, from the cheapest."""

    number: int
    does: str


# Each rung's rewrite holds the ones below it; a rung whose rewrite changes nothing more is climbed past. A cause starts
# at the first rung that acts on it: an op at the first, a loss scale that skips every update at the loss-scale rung.
CALL, FORWARD, LOSS_SCALE, BF16, FP32 = LADDER = (
    Rung(1, "the overflowing call alone in fp32, its inputs cast, the rest in the port's precision (AMP201)"),
    Rung(2, "its module's forward in fp32 (AMP201)"),
    Rung(3, "a loss-scale search that may go below 1 (AMP202)"),
    Rung(4, "bf16 in place of fp16, on Ascend 910B (Atlas A2/A3) and later (AMP204)"),
    Rung(5, "the training step in fp32: AMP off (AMP204)"),
)
# the Ascend chips that compute no bf16 (the Atlas training series), as torch.npu.get_device_name() names them: the
# ladder climbs past its bf16 rung on them (910B1-4 and 910_93 are Atlas A2/A3, which do)
NO_BF16_CHIPS = re.compile(r"Ascend910(A|ProA|ProB|PremiumA)")
# the causes a precision rung acts on: verify's measure of the port's half precision losing accuracy
PRECISION_CAUSES = (FindingCode.OVERFLOW, FindingCode.OP_DIVERGES, FindingCode.UPDATES_SKIPPED)


@dataclass
class Cause:
    code: str  # verify's finding code (a FindingCode's value), DATA_HPARAM or GRADS_CARRIED
    message: str
    line: int | None = None  # the port's line to keep in fp32
    init_scale: float | None = None
    function: str | None = None  # the function of another file of the project whose calls the port keeps in fp32
    callee: str | None = None  # of `line`, the module whose forward op overflowed, by its last name (self.big: big)


@dataclass
class Round:
    number: int
    causes: list[Cause]
    rewrites: list[dict[str, Any]] = field(default_factory=list)  # rule code, file:line, message
    verdict: str = "not verified"
    reason: str = ""
    folder: str = ""
    wall_s: float = 0.0
    rung: int = 0  # the ladder's rung its rewrite is on (0: no precision rewrite: the data order's)
    climbed_past: list[str] = field(default_factory=list)  # the rungs below it this round climbed past, and why
    half_share: float | None = None  # of the fixed port's forward and backward records, after the round
    step_ms: float | None = None  # the fixed port's median step time, after the round


@dataclass
class Pair:
    """What a verify pair found, and what it ran (its reference run's script, folder, arguments, seed and steps)."""

    folder: Path
    result: PairResult
    original: Path
    ran_in: Path
    options: list[str]
    args: list[str]

    @classmethod
    def read(cls, folder: Path) -> Pair:
        result = _read(PairResult.read, folder)
        if result.reference is None:
            raise PlanError(f"{shown_path(folder / SUMMARY_JSON)} names no reference run: give a verify pair's folder")
        ran = _read(RunSetup.read, result.reference)
        options = ["--steps", str(ran.steps), "--seed", str(ran.seed), *_carried(list(result.command))]
        return cls(folder, result, ran.script, Path(result.ran_in or ran.cwd), options, list(ran.argv))


_Read = TypeVar("_Read")


def _read(reader: Callable[[Path], _Read], path: Path) -> _Read:
    """What `reader` reads of verify's files at `path`; PlanError (exit 2) naming a file it cannot read."""
    try:
        return reader(path)
    except UnreadableFile as error:
        raise PlanError(f"cannot read {shown_path(error.path)}: {error.why}") from None


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise PlanError(f"cannot read {shown_path(path)}: {error}") from None


def _carried(command: list[str]) -> list[str]:
    words = command[: command.index("--")] if "--" in command else command
    carried = []
    for i, word in enumerate(words):
        name = word.split("=", 1)[0]
        if name in _FLAGS or (name in _VALUED and "=" in word):
            carried.append(word)
        elif name in _VALUED and i + 1 < len(words):
            carried += [word, words[i + 1]]
    return carried


def causes(result: PairResult, port: Path, original: Path, amp_effect: PairResult | None) -> list[Cause]:
    """The causes in what one verify pair found that a fix can act on, and those it names and leaves (line and
    scale None)."""
    port_text, original_text = port.read_text(encoding="utf-8"), original.read_text(encoding="utf-8")
    found = [Cause(f.code, f.message) for f in result.findings if f.code in ADVICE]
    found += [Cause(DATA_HPARAM, f"{d.setting} differs: ref {d.ref}, port {d.actual}")
              for d in result.setting_differences
              if d.setting.startswith("data_loaders.") and d.setting.endswith(_DATA_HPARAMS)]
    first = result.first_overflow
    if first is not None and first.dtype in _HALF:
        what = f"{first.op} overflows in {first.dtype} at step {first.step}"
        if line := _line_in(first.source, port):
            callee = first.module.rpartition(".")[2] if first.phase == "forward" and first.module else None
            found.append(Cause(FindingCode.OVERFLOW.value, what, line, callee=callee))
        elif function := _function_at(first.source, port.parent):
            found.append(Cause(FindingCode.OVERFLOW.value, f"{what}, in {function} ({first.source})",
                               function=function))
        else:  # a method of another file, which the fix does not write: the ladder's precision rungs act on it
            found.append(Cause(FindingCode.OVERFLOW.value, f"{what} ({first.source or 'no line of the project'})"))
    # where the sides read other data, every op after it differs: an op that diverges is its symptom, not a cause
    # ... nor where the port has a bug the fix names and leaves (a changed activation): the op after it diverges
    symptoms_only = any(cause.code in NEVER_FIXED for cause in found) or result.has(FindingCode.DATA_ORDER)
    for finding in result.findings:
        if finding.code == FindingCode.OP_DIVERGES and not symptoms_only and finding.port_dtype in _HALF and (
                line := _line_in(finding.port_source, port)):
            found.append(Cause(finding.code, finding.message, line))
    effect_first = amp_effect.first_overflow if amp_effect is not None else None
    if effect_first is not None and effect_first.dtype in _HALF and (line := _line_in(effect_first.source, original)):
        if (mapped := mapped_line(original_text, port_text, line)) is not None:
            found.append(Cause(FindingCode.OVERFLOW.value, f"--amp-effect: {effect_first.op} overflows in "
                               f"{effect_first.dtype} at step {effect_first.step} where fp32 does not (the original's "
                               f"line {line})", mapped))
    # verify's updates_skipped: the port's GradScaler skipped every step where the original has no loss scaler. The
    # scale starts as many halvings below the lowest it tried as it tried, below 1 where that is below 1 (the ladder's
    # loss-scale search: gradients that overflow fp16 at every scale of 1 and above); not where an op that overflows
    # in the forward pass explains it (a loss that is inf at every scale), nor where the port never resets its
    # gradients: a lower scale only puts off the first inf, which they then keep (a short run PASSed so, 3 steps).
    for finding in result.findings:
        if finding.code == FindingCode.UPDATES_SKIPPED and finding.grads_carried:
            found.append(Cause(GRADS_CARRIED, finding.message))
        elif finding.code == FindingCode.UPDATES_SKIPPED and not any(
                cause.line or cause.function or cause.code == FindingCode.OVERFLOW for cause in found):
            tried = finding.loss_scales
            found.append(Cause(finding.code, finding.message, init_scale=min(tried) / 2.0 ** len(tried)))
    return found


def _line_in(source: str | None, path: Path) -> int | None:
    """The line of `file:line` where it names `path` (by its name: verify names files from the folder it ran in)."""
    if not source or ":" not in source:
        return None
    name, _, line = source.rpartition(":")
    return int(line) if Path(name).name == path.name and line.isdigit() else None


def _function_at(source: str | None, folder: Path) -> str | None:
    """The module-level function of a project file (`utils.py:25`, from the port's folder) holding that line, by its
    qualified name (`utils.gram_matrix`); None for a line outside one, a method, or a file that is not there."""
    name, _, line = (source or "").rpartition(":")
    path = folder / name
    if not (line.isdigit() and path.suffix == ".py" and path.is_file()):
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError):
        return None
    module = ".".join(path.relative_to(folder).with_suffix("").parts)
    functions = (node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return next((f"{module}.{node.name}" for node in functions
                 if node.lineno <= int(line) <= (node.end_lineno or node.lineno)), None)


def fixed_path(port: Path) -> Path:
    return port.with_name(f"{port.stem}{FIXED_SUFFIX}{port.suffix}")


def fix_folder(pair: Path) -> Path:
    """PAIR_fix beside the pair, or the first free PAIR_fix.N: a fix never writes into an earlier one."""
    folder, n = pair.with_name(f"{pair.name}_fix"), 0
    while folder.exists():
        n += 1
        folder = pair.with_name(f"{pair.name}_fix.{n}")
    return folder


def rewrite(text: str, path: Path, fixable: list[Cause], original: str,
            rung: Rung = CALL) -> tuple[str, list[dict[str, Any]]]:
    """The port rewritten for the causes at the ladder's `rung` (and the ones below it), and what was rewritten."""
    from migrate.engine import migrate_source  # the engine loads libcst: only when a port is rewritten

    lines = tuple(sorted({cause.line for cause in fixable if cause.line is not None}))
    functions = tuple(sorted({cause.function for cause in fixable if cause.function is not None}))
    scales = [cause.init_scale for cause in fixable if cause.init_scale is not None]
    order = any(cause.code == FindingCode.DATA_ORDER for cause in fixable)
    callees = tuple(sorted({(cause.line, cause.callee) for cause in fixable if cause.line and cause.callee}))
    precision = {BF16.number: AmpPolicy.BF16, FP32.number: AmpPolicy.OFF}.get(rung.number)
    settings = Settings(fp32_lines=lines, fp32_calls=functions, fp32_callees=callees,
                        fp32_forwards=(*lines, *_kept_regions(text)) if rung.number >= FORWARD.number else (),
                        init_scale=min(scales) if scales else None, fix_precision=precision,
                        original_source=original if order else None)
    codes = [*FIX_RULES, *(ORDER_RULES if order else ()), *((EPOCH_RULE,) if order and ".set_epoch(" in original
                                                          else ())]
    result = migrate_source(text, path.name, settings, rules=[rule_by_code(code) for code in codes])
    return result.code, [{"code": f.code, "at": f"{path.name}:{f.line}", "message": f.message}
                         for f in result.findings]


def run(port: Path, pair_folder: Path, rounds: int, say: Callable[[str], None],
        bf16: bool = True) -> tuple[bool, Path]:
    """The fix loop; whether the last verified round passed with no fixable cause left (with `rounds` 0, whether a
    fix was written), and the fix folder. Without `bf16` (a target chip that computes none), or where the pair's port
    ran on such a chip, the ladder climbs past its bf16 rung."""
    pair = Pair.read(pair_folder)
    bf16 = bf16 and not NO_BF16_CHIPS.fullmatch(pair.result.port_device_name)
    target, folder = fixed_path(port), fix_folder(pair_folder)
    _take_over(target, port, pair_folder, say)
    folder.mkdir(parents=True)
    user_text, original_text = port.read_text(encoding="utf-8"), pair.original.read_text(encoding="utf-8")
    text, result, effect = user_text, pair.result, _read(PairResult.amp_effect, pair_folder)
    done: list[Round] = []
    left: list[Cause] = []
    passed = False
    reached = CALL  # the highest rung a round climbed to: a FAIL that stays after it climbs on from there
    for number in range(1, max(rounds, 1) + 1):
        start = time.monotonic()
        current = port if number == 1 else target
        found = causes(result, current, pair.original, effect)
        fixable = [cause for cause in found if cause.code not in NEVER_FIXED]
        left = [cause for cause in found if cause.code in NEVER_FIXED]
        # a new cause is fixed at the cheapest rung; where that rewrites nothing, the FAIL climbs from the highest
        # rung reached, each rung verified before the next
        rung = CALL
        new, rewrites = rewrite(text, target, fixable, original_text, rung) if fixable else (text, [])
        climbed_past: list[str] = []
        if new == text and reached is not CALL and _climbs(result, found, done):
            rung = reached
            new, rewrites = rewrite(text, target, fixable, original_text, rung)
        while new == text and rung is not FP32 and _climbs(result, found, done):
            climbed_past.append(f"{rung.number} (nothing more to rewrite)")
            rung = LADDER[rung.number]  # the next
            if rung is BF16 and not bf16:
                climbed_past.append(f"{BF16.number} (the target NPU computes no bf16)")
                rung = FP32
            new, rewrites = rewrite(text, target, fixable, original_text, rung)
        reached = max(reached, rung, key=lambda climbed: climbed.number)
        if new == text:
            left += [cause for cause in fixable if cause.code in UNFIXED]
            say(f"round {number}: nothing to fix")
            break
        write_atomic(target, new.encode("utf-8"))
        report_folder(port).mkdir(exist_ok=True)  # the record of what was written, which the next fix reads
        ownership.write_record(report_folder(port), [], [], {target: sha256(new.encode("utf-8"))})
        text = new
        round_ = Round(number, fixable, rewrites, rung=_rung_of(rewrites, rung), climbed_past=climbed_past)
        done.append(round_)
        if climbed_past:
            say(f"round {number}: climbed past rung {', '.join(climbed_past)}")
        if round_.rung:
            say(f"round {number}: rung {round_.rung}, {LADDER[round_.rung - 1].does}")
        for rewritten in rewrites:
            say(f"round {number}: {rewritten['code']} at {rewritten['at']}: {rewritten['message']}")
        if rounds == 0:
            passed = True  # written, not verified: what migrate's own port is until verify runs
            break
        round_.folder = f"round-{number}"
        result = _verify(pair, target, folder / round_.folder)
        effect = None
        round_.verdict, round_.reason = result.verdict, result.reason
        round_.half_share, round_.step_ms = result.port_half_share, result.port_step_ms
        round_.wall_s = round(time.monotonic() - start, 1)
        say(f"round {number}: {round_.reason} ({round_.wall_s:g} s)")
        remaining = [c for c in causes(result, target, pair.original, None) if c.code not in NEVER_FIXED]
        passed = result.passed and not remaining
        if passed:
            break
    for cause in left:
        say(f"left as it is: {cause.code}: {cause.message}: {ADVICE[cause.code]}")
    patch = unified_diff(user_text, text, str(port), str(target))
    _report(folder, port, target, pair, done, left, patch, passed)
    return passed and not left, folder


def _kept_regions(text: str) -> tuple[int, ...]:
    """The lines of the port's `with` statements that switch autocast off (the regions a fix kept in fp32): the
    forward rung keeps the forward holding one in fp32 whole, where the round that kept it did not PASS."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ()
    return tuple(node.lineno for node in ast.walk(tree) if isinstance(node, ast.With) and any(
        isinstance(item.context_expr, ast.Call) and any(
            word.arg == "enabled" and isinstance(word.value, ast.Constant) and word.value.value is False
            for word in item.context_expr.keywords) for item in node.items))


def _rung_of(rewrites: list[dict[str, Any]], climbed: Rung) -> int:
    """The ladder's rung a round's rewrites are on: the one the ladder climbed to, else the first rung of the rules
    that rewrote (AMP201 the op's call, AMP202 the loss scale); 0 for rewrites of the data order alone."""
    codes = {rewritten["code"] for rewritten in rewrites}
    if climbed is not CALL:
        return climbed.number
    return CALL.number if "AMP201" in codes else LOSS_SCALE.number if "AMP202" in codes else 0


def _cost(round_: Round, first: PairResult) -> str:
    """What the round's fixed port costs: its share of records still in half precision, and its step time against
    the first port's, both measured on the pair's device."""
    half = "not measured" if round_.half_share is None else f"{round_.half_share:.0%}"
    said = f"{half} of the forward and backward records computed in half precision"
    if round_.step_ms is not None and first.port_step_ms:
        said += (f"; step time {round_.step_ms:g} ms against {first.port_step_ms:g} ms for the first port "
                 f"({round_.step_ms / first.port_step_ms:.2f}x)")
    return said + (f" (the first port: {first.port_half_share:.0%})" if first.port_half_share is not None else "")


def _climbs(result: PairResult, found: list[Cause], done: list[Round]) -> bool:
    """Whether a FAIL is the port's half precision losing accuracy, so that the ladder's next rung may fix it: a
    precision cause is found, or an earlier round acted on one and the FAIL stayed (an op that diverges downstream of
    what it fixed, in fp32); never where a port bug or other data explain it."""
    if result.passed or result.verdict == "ERROR" or any(cause.code in NEVER_FIXED for cause in found):
        return False
    if result.has(FindingCode.DATA_ORDER):
        return False
    acted = [cause for round_ in done for cause in round_.causes]
    return any(cause.code in PRECISION_CAUSES for cause in [*found, *acted])


def _take_over(target: Path, port: Path, pair_folder: Path, say: Callable[[str], None]) -> None:
    """The fixed port an earlier fix wrote, of any pair (its record in the port's report folder, written.json; or,
    written before fixes kept one there, a fix of this pair), is the fix's to replace; one edited since, or the user's,
    is kept as NAME.bak first."""
    if not target.exists():
        return
    now = sha256(target.read_bytes())
    if ownership.recorded(target, report_folder(port)) == now or any(
            _json(record).get("fixed_sha256") == now
            for record in pair_folder.parent.glob(f"{pair_folder.name}_fix*/{FIX_JSON}")):
        return
    backup = ownership.backup_path(target)
    target.rename(backup)
    say(f"{shown_path(target)} was not written by a fix as it is now (edited since?): kept as {shown_path(backup)}")


def _verify(pair: Pair, fixed: Path, out: Path) -> PairResult:
    """One verify round of the fixed port (the verify CLI, as a subprocess): what it found, or an ERROR."""
    command = [sys.executable, "-m", "verify", str(pair.original), str(fixed.resolve()), "--no-match-amp", "-q",
               "-o", str(out.resolve()), *pair.options, "--", *pair.args]
    done = subprocess.run(command, cwd=pair.ran_in, capture_output=True, text=True)
    if (out / SUMMARY_JSON).is_file():
        return _read(PairResult.read, out)
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return PairResult.not_written(f"verify exited {done.returncode}: {last}")


def _report(folder: Path, port: Path, target: Path, pair: Pair, done: list[Round], left: list[Cause], patch: str,
            passed: bool) -> None:
    written = sha256(target.read_bytes()) if target.exists() else None
    record = {"port": str(port), "fixed": str(target), "fixed_sha256": written, "pair": str(pair.folder),
              "passed": passed and not left,
              "rounds": [asdict(r) for r in done], "left": [asdict(c) for c in left],
              "never_fixed": {c.code: ADVICE[c.code] for c in left}}
    write_atomic(folder / FIX_JSON, json.dumps(record, indent=1).encode("utf-8"))
    write_atomic(folder / DIFF_PATCH, patch.encode("utf-8"))
    lines = [f"# Fix of {markdown_code(port.name)} from {markdown_code(shown_path(pair.folder))}", "",
             f"Fixed port: {markdown_code(shown_path(target))} ({'PASS' if record['passed'] else 'not PASS'})", ""]
    for r in done:
        on_rung = f": rung {r.rung} of {len(LADDER)}" if r.rung else ""
        lines += [f"## Round {r.number}{on_rung} ({r.wall_s:g} s)", ""]
        lines += [f"- rung: {markdown_text(LADDER[r.rung - 1].does)}"] if r.rung else []
        lines += [f"- climbed past rung {markdown_text(', '.join(r.climbed_past))}"] if r.climbed_past else []
        lines += [f"- cause: {markdown_code(c.code)} {markdown_text(c.message)}" for c in r.causes]
        lines += [f"- rewrite: {markdown_code(w['code'])} at {markdown_code(w['at'])}: {markdown_text(w['message'])}"
                  for w in r.rewrites]
        lines += [f"- verdict after: **{r.verdict}** {markdown_text(r.reason)}"]
        lines += [f"- cost: {_cost(r, pair.result)}", ""]
    if left:
        lines += ["## Left as they are (a port bug: fix it by hand)", ""]
        lines += [f"- {markdown_code(c.code)} {markdown_text(c.message)}: {markdown_text(ADVICE[c.code])}"
                  for c in left]
    write_atomic(folder / FIX_MD, ("\n".join(lines) + "\n").encode("utf-8"))
