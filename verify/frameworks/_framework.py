"""The shape of what the project knows of one framework: its `Framework` record, which each module of this package
fills (verify/frameworks/accelerate.py ...). Standard library only, as the whole package."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

FP16, BF16 = "fp16", "bf16"


@dataclass(frozen=True)
class AmpSwitch:
    """How a script switches on the mixed precision a framework does itself (autocast, and for fp16 its loss scaler,
    torch.amp.GradScaler): a keyword of the object the script builds, an option on its command line, or, where the
    script leaves the keyword out, its launcher."""

    builds: tuple[str, ...]  # the names the script calls to build the object the switch belongs to: `Accelerator`
    keywords: tuple[str, ...]  # the object's keywords that choose the precision: `mixed_precision`
    mixed: Mapping[tuple[str, object], str]  # (keyword, literal value) -> FP16 or BF16; any other literal is off
    # (keyword, literal value) pairs that choose full precision: it trains in fp32 (Lightning's "32-true"), as where
    # fp32_when_built_as leaves the keyword out
    full_precision: frozenset[tuple[str, object]] = frozenset()
    subclasses_named_so: bool = False  # a name ending in one of `builds` builds it too: Seq2SeqTrainingArguments
    options: tuple[str, ...] = ()  # command-line options that choose it: `--mixed_precision`
    # what parses those options for the script, with the name the parser's call must hold ("": every call does)
    parsers: Mapping[str, str] = field(default_factory=dict)
    launcher_chooses: bool = False  # built without its keyword, the launcher's option or environment chooses
    # built without its keyword, it trains in fp32 where the call's dotted name starts with one of these ("": any
    # call of its name), which say the object is the framework's: `L.Trainer(...)`, not a Trainer class of the
    # script's own or Hugging Face's
    fp32_when_built_as: tuple[str, ...] = ()
    switch_on: str = ""  # how a user switches it on where they run the script (the checklist's advice)
    # a word the call's text must hold, where `builds` is a name other libraries use too: `deepspeed.initialize`
    # (apex's `amp.initialize` is no framework's switch)
    qualified_by: str = ""
    # a config file that a keyword's literal names (DeepSpeed's JSON), read for its precision: FP16, BF16, "" (off),
    # None (chosen elsewhere: HF's "auto")
    config_precision: Callable[[Mapping[str, Any]], str | None] | None = None

    def builds_it(self, name: str, call: str = "") -> bool:
        """Whether a call named `name` (its last dotted part), whose text is `call`, builds the object."""
        named = name in self.builds or self.subclasses_named_so and name.endswith(self.builds)
        return named and self.qualified_by in call

    def fp32_when_left_out(self, dotted_name: str) -> bool:
        """Whether a call of this dotted name that leaves the switch out trains in fp32 (fp32_when_built_as)."""
        return any(dotted_name.startswith(prefix) for prefix in self.fp32_when_built_as)

    def chooses_fp32(self, keyword: str, value: object) -> bool:
        """Whether the literal `value` of `keyword` chooses full precision (full_precision)."""
        return (keyword, value) in self.full_precision

    def precision(self, keyword: str, value: object) -> str | None:
        """FP16 or BF16 where the literal `value` of `keyword` switches the mixed precision on, else None."""
        return self.mixed.get((keyword, value))


@dataclass(frozen=True)
class LossScaler:
    """A framework's own loss scaler, which a run follows as it follows a GradScaler: the class (module, name) whose
    method `scales` returns the loss times the scale, with the scale and its settings in attributes, and the classes
    whose step() steps the torch optimizer they hold (`inner`) or, past an overflow, skips it."""

    scaler: tuple[str, str]
    scales: str  # scaler.scales(loss) -> loss * scale
    scale: str  # the scale it multiplies by now
    # GradScaler's words for a scaler's settings that a run records (growth_factor, growth_interval, dynamic) -> the
    # scaler's attributes holding them; its scale when it first scales a loss is its init_scale, and where no
    # backoff_factor is named, it divides by its growth factor
    settings: Mapping[str, str]
    steppers: tuple[tuple[str, str], ...]
    inner: str


@dataclass(frozen=True)
class Framework:
    """What the project knows of one framework, beyond the constants its own module keeps for one reader each.

    The source facts (migrate's checklist facts and the rules read them from the script's text) and the runtime facts
    (verify reads them in the run)."""

    name: str  # as a report names it
    amp: tuple[AmpSwitch, ...] = ()  # the objects that do their own mixed precision, and their switches
    # text of a script that hands backward() to the framework, which then brings its own mixed precision: the AMP
    # rules add no autocast or GradScaler of their own there
    own_amp_signs: tuple[str, ...] = ()
    seed_everything: tuple[str, ...] = ()  # qualified names of its helpers that seed every generator at once
    trainer_methods: tuple[str, ...] = ()  # a trainer's methods that train (`trainer.fit(model)`): the file trains
    # its modules whose kernels are CUDA's: (what they are, what to use instead), reported where a script imports one
    cuda_only_imports: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    # of those, the modules its NPU build provides all the same: what it runs there
    npu_provided_imports: Mapping[str, str] = field(default_factory=dict)
    # runtime: the variables through which its launcher chooses what a run computes (recorded with the run)
    environment: tuple[str, ...] = ()
    loss_scalers: tuple[LossScaler, ...] = ()  # runtime: its own loss scalers
    # runtime: its launcher's command (`deepspeed`), which starts ranks as torchrun does, and what it adds to each
    # rank's arguments (its local rank as "{local_rank}")
    launcher: str = ""
    rank_arguments: tuple[str, ...] = ()
    # paths above the script's folder its examples read, where a run's view must lead as the original folder does
    reads_above: tuple[str, ...] = ()
