"""The vocabulary of a rule: the settings it runs under, how safe its fix is, and the findings it records.

Everything here is frozen and picklable, so findings cross process boundaries unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum

class Mode(str, Enum):
    """How the port reaches the NPU."""

    TRANSFER = "transfer"  # import transfer_to_npu, which patches cuda APIs at run time
    EXPLICIT = "explicit"  # no runtime patching: rewrite every cuda API to its npu counterpart


class Safety(str, Enum):
    """Whether a rule's rewrite is applied by default (ruff's fix applicability)."""

    SAFE = "safe"  # applied by default
    UNSAFE = "unsafe"  # may change behaviour: applied only with --unsafe-fixes, reported otherwise
    REPORT = "report-only"  # never rewrites; reports what a person must do


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class Action(str, Enum):
    """What happened at a finding's location."""

    CHANGED = "changed"  # the code was rewritten
    PENDING = "unsafe-fix-available"  # an unsafe rewrite exists but was not applied
    REPORTED = "reported"  # nothing to rewrite; a person must look


class AmpPolicy(str, Enum):
    FP16 = "fp16"
    BF16 = "bf16"
    OFF = "off"


@dataclass(frozen=True)
class Settings:
    """Everything a rule may consult besides the source. One instance per file."""

    mode: Mode = Mode.TRANSFER
    unsafe_fixes: bool = False
    is_entry: bool = True  # named on the command line, or has a __main__ guard
    # An entry point of a multi-file port whose project trains in a module it imports (main.py calling train.train()):
    # it is never read as an inference script, whatever it holds itself.
    project_trains: bool = False
    amp: AmpPolicy = AmpPolicy.FP16
    seed: int | None = None
    deterministic: bool = False
    line_length: int | None = None  # the project's configured line length; None: the file's own (rules.line_limit)
    # Files ported in one call with a suffix (migrate/project.py): each import of another of them, as this file writes
    # it (`model`, `pkg.model`, `.model`), with its port's name (`model_npu`, ...); and each import of a file of the
    # project that the call left out, with that file's path.
    ported_modules: tuple[tuple[str, str], ...] = ()
    unported_modules: tuple[tuple[str, str], ...] = ()
    # Fixes of what `verify` measured (`migrate PORT --fix-from PAIR`, migrate/fix.py), empty in a plain port: the lines
    # of the port whose statements compute an op that overflows or diverges in half precision (AMP201 keeps them in
    # fp32), and the initial loss scale that the overflow record settled (AMP202).
    fp32_lines: tuple[int, ...] = ()
    # ... and the functions of the port's project (qualified: `utils.gram_matrix`) whose op does, in a file beside the
    # port: AMP201 keeps in fp32 the port's statements under autocast that call them
    fp32_calls: tuple[str, ...] = ()
    # ... and of fp32_lines, the module or function whose op it was, by its last name (line, "big" for self.big):
    # AMP201 keeps that call alone in fp32 where it can
    fp32_callees: tuple[tuple[int, str], ...] = ()
    # ... the lines whose module's forward (the `forward` method holding the line) AMP201 keeps in fp32 whole: the
    # fix's second rung, where the line alone did not PASS
    fp32_forwards: tuple[int, ...] = ()
    init_scale: float | None = None
    # The precision the fix's last rungs give the port's autocast and GradScaler (AMP204): bf16, then off (fp32).
    fix_precision: AmpPolicy | None = None
    # The original's source, where verify found the port reads other data or initial weights (`data_order`): DET201
    # and DATA201 give the port its seeds and data order.
    original_source: str | None = None


@dataclass(frozen=True)
class Finding:
    """One change or one finding, with the evidence a person needs to review it."""

    path: str
    line: int
    column: int
    code: str
    severity: Severity
    action: Action
    message: str
    suggestion: str = ""
    end_line: int = 0
    checklist: tuple[str, ...] = ()
    old_code: str = ""
    new_code: str = ""

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"

    def as_row(self) -> dict[str, object]:
        row = asdict(self)
        row["severity"] = self.severity.value
        row["action"] = self.action.value
        row["checklist"] = " ".join(self.checklist)
        return row
