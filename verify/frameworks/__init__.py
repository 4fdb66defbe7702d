"""What the project knows of the frameworks a training script may use, one module each: Hugging Face Transformers
(`transformers.py`: Trainer, TrainingArguments, HfArgumentParser, from_pretrained), accelerate, Lightning (Trainer,
LightningModule, Fabric, LightningCLI), torch.compile, DeepSpeed (its engine, config, loss scaler and launcher) and
FSDP2 (its MixedPrecisionPolicy).

Each module holds both halves of its framework: the source facts that migrate's checklist facts and the rules read
(precision switches, seeding helpers, what trains, device idioms, CUDA-only modules) and the runtime facts verify reads
(the variables its launcher chooses the precision with, what it wraps a model in), as its `FRAMEWORK` record
(`_framework.Framework`) and, for what one reader alone needs, constants beside it. Every public module here is one
framework, found by its name (as the rules' registry finds rules): adding one is adding its module. Below, the
questions every framework answers, each answered here once, over all of them.

A leaf: the standard library only, no torch and no libcst, importing nothing else of verify (tests/test_layering.py),
so that migrate, the rules (through rules/framework/frameworks.py) and verify's packages may import it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from itertools import chain
from pathlib import PurePosixPath

from verify.frameworks._framework import BF16, AmpSwitch, Framework, LossScaler
from verify.frameworks._on_import import when_imported  # noqa: F401  (patches a framework's module as it is imported)

FRAMEWORKS: tuple[Framework, ...] = tuple(
    importlib.import_module(f"{__name__}.{module.name}").FRAMEWORK
    for module in pkgutil.iter_modules(__path__)
    if not module.name.startswith("_")
)
_AMP_SWITCHES = tuple(chain.from_iterable(framework.amp for framework in FRAMEWORKS))
_OWN_AMP_SIGNS = tuple(chain.from_iterable(framework.own_amp_signs for framework in FRAMEWORKS))

# Command-line options that choose a framework's mixed precision, and the names of the calls that build a framework
# object with a precision switch or parse those options (what migrate's facts look for on a line).
PRECISION_OPTIONS = tuple(chain.from_iterable(switch.options for switch in _AMP_SWITCHES))
AMP_NAMES = frozenset(chain.from_iterable((*switch.builds, *switch.parsers) for switch in _AMP_SWITCHES))
# The helpers that seed every generator at once, by qualified name, and by the name a call ends with.
SEED_EVERYTHING = frozenset(chain.from_iterable(framework.seed_everything for framework in FRAMEWORKS))
SEED_EVERYTHING_NAMES = frozenset(name.rsplit(".", 1)[-1] for name in SEED_EVERYTHING)
TRAINER_METHODS = tuple(chain.from_iterable(framework.trainer_methods for framework in FRAMEWORKS))
CUDA_ONLY_IMPORTS = {module: what for framework in FRAMEWORKS for module, what in framework.cuda_only_imports.items()}
NPU_PROVIDED_IMPORTS = {module: what for framework in FRAMEWORKS
                        for module, what in framework.npu_provided_imports.items()}
# The frameworks' own loss scalers, which a run follows as it follows a GradScaler.
LOSS_SCALERS: tuple[LossScaler, ...] = tuple(chain.from_iterable(framework.loss_scalers for framework in FRAMEWORKS))
# The frameworks' launchers (`verify --launcher NAME`): what each adds to the arguments of each rank it starts.
LAUNCHERS = {framework.launcher: framework.rank_arguments for framework in FRAMEWORKS if framework.launcher}
# The variables a run records because a framework's launcher chooses what the run computes with them.
ENVIRONMENT = frozenset(chain.from_iterable(framework.environment for framework in FRAMEWORKS))
# How many folders above the script's folder the frameworks' examples reach (Lightning's ../../../Datasets: 3).
LEVELS_ABOVE = max((PurePosixPath(path).parts.count("..")
                    for framework in FRAMEWORKS for path in framework.reads_above), default=0)


def own_amp(code: str) -> str | None:
    """Whether a framework does the mixed precision of `code` (a script's text) itself: the first sign that the script
    hands backward() to one (`accelerator.backward`, `self.manual_backward`, an Accelerator or Fabric it builds), else
    None. The AMP rules add no autocast or GradScaler there, and migrate's checklist reads the framework's switch
    (`amp_switch`) of the same frameworks."""
    return next((sign for sign in _OWN_AMP_SIGNS if sign in code), None)


def amp_switch(name: str, call: str = "") -> AmpSwitch | None:
    """The precision switch of the framework object a call named `name` (its last dotted part; its text `call`)
    builds, where that object does the mixed precision itself; None where it builds none."""
    return next((switch for switch in _AMP_SWITCHES if switch.builds_it(name, call)), None)


def precision_parser(name: str) -> str | None:
    """Where a call named `name` parses a framework's precision options from the command line: the name its call
    must also hold ("" where any call does: LightningCLI); None where it parses none."""
    return next((switch.parsers[name] for switch in _AMP_SWITCHES if name in switch.parsers), None)


def run_time_switch(name: str, flags: Sequence[str] = (), call: str = "") -> str:
    """How the mixed precision that a call named `name` (with the literal arguments `flags`: add_argument's; its text
    `call`) leaves to run time is switched on where the script runs, in its switch's words; "" where none is known."""
    switch = amp_switch(name, call) or next(
        (switch for switch in _AMP_SWITCHES if name in switch.parsers or set(flags) & set(switch.options)), None)
    return switch.switch_on if switch else ""


def switch_on_advice(in_config_files: bool = False) -> str:
    """How each framework's mixed precision is switched on where the script runs (of those a config file switches
    on, DeepSpeed's, with `in_config_files`), for the checklist's advice."""
    return ", ".join(switch.switch_on for switch in _AMP_SWITCHES
                     if switch.switch_on and (switch.config_precision or not in_config_files))
