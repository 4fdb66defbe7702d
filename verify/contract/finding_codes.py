"""verify's finding codes: what a comparison found, one code each (verify/compare/findings.py finds them), as
summary.json's findings name them and `migrate --fix-from` acts on them (migrate/fix.py). Standard library only."""

from __future__ import annotations

from enum import Enum


class FindingCode(str, Enum):
    RUN_FAILED = "run_failed"
    NO_BACKWARD = "no_backward"  # the port steps without ever calling backward(), the original trains
    STEPS_DIFFER = "steps_differ"  # both ran as far as they could, one of them fewer steps than the other
    HPARAM_MISMATCH = "hparam_mismatch"
    OVERFLOW = "overflow"
    SCALE_COLLAPSE = "scale_collapse"
    LOSS_DIVERGES = "loss_diverges"
    OUTPUT_DIVERGES = "output_diverges"
    OP_DIVERGES = "op_diverges"
    OP_CHANGED = "op_changed"  # the port calls another computation where the original calls this one
    DATA_ORDER = "data_order"
    NONDETERMINISM = "nondeterminism"
    GRAD_DIVERGES = "grad_diverges"
    AMP_ONE_SIDE = "amp_one_side"
    LOW_MATCH = "low_match"
    GRADS_NOT_RESET = "grads_not_reset"
    # one side's float16 backward runs without a loss scale where the other side scales its loss
    UNSCALED_HALF = "unscaled_half"
    SCALE_STUCK = "scale_stuck"
    # the port's GradScaler skipped every update of the run, where the original (no loss scaler) updates at each step
    UPDATES_SKIPPED = "updates_skipped"
    # each side's own loss scaler skipped every update of the run: no update was compared, so nothing is proven
    NO_UPDATE_COMPARED = "no_update_compared"
    # not failing by itself: it names a cause (verify/record/environment.py)
    ENVIRONMENT_DIFFERS = "environment_differs"
    RANKS_DIFFER = "ranks_differ"  # the sides ran other numbers of ranks
    SHARDING = "sharding"  # a rank of the port read other samples than the original's (verify/compare/sharding.py)
    RANKS_DISAGREE = "ranks_disagree"  # the port's ranks hold other gradients or parameters where the original's agree
    # not failing by itself: a side ran an original module of the project where its port was beside it (or the
    # reference a port): what ran is not the port migrate wrote
    ORIGINAL_MODULE = "original_module"
    # not failing by itself: parameters Module.to_empty allocated and neither script wrote before training
    # (verify/capture/initialization.py): what the layers computed from them proves nothing
    UNINITIALIZED = "uninitialized"
    INIT_DIFFERS = "init_differs"  # one script leaves parameters as to_empty allocated them, the other writes them
