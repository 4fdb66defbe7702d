"""Benchmark: align and judge one million synthetic op-record pairs on one core (target: under 10 s).

    .venv/bin/python tests/perf/bench_compare.py [--records 1000000]

The records look like a long training trace: 200 steps x 5000 records, spread over modules and ops, with the
port's statistics carrying device noise and 1% of its ops renamed to a related NPU kernel, 0.1% missing and 0.1%
extra (so every alignment pass does work). Prints the time of each phase and the total.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, as the target says

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from verify.align import align_ops  # noqa: E402
from verify.op_verdicts import first_divergent_op, op_metrics  # noqa: E402
from verify.precision_policy import CompareOptions, precision_policy  # noqa: E402
from verify.schema import OP_COLUMNS, RunManifest  # noqa: E402
from verify.store import Run  # noqa: E402

OPS = ["aten.convolution", "aten.relu", "aten.addmm", "aten.native_layer_norm", "aten.gelu", "aten.mm", "aten.add",
       "aten.mul", "aten._softmax", "aten.view"]


def synthetic_trace(records: int, steps: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    per_step = records // steps
    seq = np.tile(np.arange(per_step), steps)
    step = np.repeat(np.arange(steps), per_step)
    module_index = seq // 50  # 50 ops per module call
    op = np.array(OPS)[seq % len(OPS)]
    phase = np.where(module_index % 3 == 2, "backward", "forward")
    module = np.char.add("model.layers.", module_index.astype(str))
    frame = pd.DataFrame({"step": step, "seq": seq, "phase": phase, "module": module, "op": op, "io": "out0"})
    frame["call_index"] = frame.groupby(["step", "phase", "module", "op"]).cumcount()
    frame["key"] = (frame["step"].astype(str) + "/" + frame["phase"] + "/" + frame["module"] + "/" + frame["op"]
                    + "#" + frame["call_index"].astype(str))
    scale = rng.uniform(0.5, 2.0, len(frame))
    frame = frame.assign(dtype="float32", shape="4x1024", numel=4096, min=-3 * scale, max=3 * scale,
                         mean=rng.normal(0, 0.1, len(frame)), l2_norm=64 * scale, nan_count=0, inf_count=0, md5="",
                         tensor_file="")
    return frame[list(OP_COLUMNS)].astype(OP_COLUMNS)


def ported(ref: pd.DataFrame, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    actual = ref.copy()
    for stat in ("min", "max", "mean", "l2_norm"):
        actual[stat] = actual[stat] * (1 + rng.normal(0, 1e-7, len(actual)))
    gelu = actual["op"] == "aten.gelu"
    renamed = gelu & (rng.random(len(actual)) < 0.1)  # ~1% of all records: the NPU's fast GELU
    actual.loc[renamed, "op"] = "npu.npu_fast_gelu"
    actual.loc[renamed, "key"] = actual.loc[renamed, "key"].str.replace("aten.gelu", "npu.npu_fast_gelu")
    # Missing calls are drawn from other ops than GELU: a missing call next to a renamed one is ambiguous by signature
    # (either ref call could be the renamed one), which would make this benchmark report a divergence it planted.
    dropped = (rng.random(len(actual)) < 0.001) & ~gelu
    extra = actual.loc[rng.random(len(actual)) < 0.001].assign(op="aten._to_copy", key=lambda f: f["key"] + "c")
    return pd.concat([actual.loc[~dropped], extra], ignore_index=True)


def side(ops: pd.DataFrame) -> Run:
    return Run(root=Path("."), manifest=RunManifest(), ops=ops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    ref_ops = synthetic_trace(args.records, args.steps, seed=0)
    actual_ops = ported(ref_ops, seed=1)
    ref, actual = side(ref_ops), side(actual_ops)
    print(f"records: ref {len(ref_ops):,}, actual {len(actual_ops):,}")
    timings = {}
    cpu_start = time.process_time()  # CPU seconds: honest on a shared machine where wall time includes waiting
    start = time.perf_counter()
    aligned = align_ops(ref_ops, actual_ops)
    timings["align"] = time.perf_counter() - start
    mark = time.perf_counter()
    policy = precision_policy(ref, actual, CompareOptions())
    table = op_metrics(aligned, ref, actual, policy, [])
    timings["metrics + tolerances"] = time.perf_counter() - mark
    mark = time.perf_counter()
    first = first_divergent_op(table)
    timings["first divergent op"] = time.perf_counter() - mark
    total, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    for name, seconds in timings.items():
        print(f"{name:>22}: {seconds:6.2f} s wall")
    print(f"{'total':>22}: {total:6.2f} s wall, {cpu:6.2f} s CPU (target < 10 s; {len(table) / cpu:,.0f} rows per "
          f"CPU-second; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print("statuses:", table["status"].value_counts().to_dict())
    print("first divergent:", None if first is None else (first["step"], first["op"], first["module"]))


if __name__ == "__main__":
    main()
