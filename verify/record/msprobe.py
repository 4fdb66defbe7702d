"""Read msprobe dumps as a comparison side, and export a verify run as an msprobe dump.

Formats, as msprobe writes them (PyPI's mindstudio-probe 8.3.3, source gitcode.com/Ascend/mstt
debug/accuracy_tools/msprobe; 26.2.0, source gitcode.com/Ascend/MindStudio-Probe):
`dump_path/step{N}/{rank | rank{R} | proc{pid}}/dump.json`, msprobe 8.x writing `rank` for a single process and 26.x
`proc{pid}`. An entry is `{Prefix}.{api}.{k}.{direction}` (API) or `Module.{path}.{Class}.{direction}.{k}` (module),
plus `Module.{path}.{Class}.parameters_grad[.{n}]`. Each tensor carries Max/Min/Mean/Norm (any of which may be null or
a bool), optionally md5 and data_name.

Mapping onto verify's op table: op = `{Prefix}.{api}` (`Aten` becomes our `aten` namespace, so exported runs read
back under their own names), call_index = msprobe's k, io = in{i} / in_{kwarg} / in_param_{name} / out{i} /
grad_{name}, with `.j` appended for nested lists and dicts. msprobe has no nan/inf counts: a nan or inf Max/Min
sets the count to 1 (presence, not a count). `.pt` tensor files would need torch to read, so an msprobe tensor dump
is compared by its statistics; `.npy` files (MindSpore) are used.
"""

from __future__ import annotations

import json
import math
import operator
import re
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd

from verify.errors import CompareError
from verify.record.schema import OP_COLUMNS, OP_KEY_PARTS, RunManifest, Status
from verify.record.statistics import STATISTICS
from verify.record.store import Run, empty_frame, op_keys

DUMP_JSON = "dump.json"
STEP_DIR = re.compile(r"^step(\d+)$")
PROCESS_DIR = re.compile(r"^(rank|proc)(\d*)$")
API_ENTRY = re.compile(r"^(?P<prefix>[A-Za-z]+)\.(?P<api>.+)\.(?P<k>\d+)\.(?P<direction>forward|backward)$")
MODULE_ENTRY = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<direction>forward|backward)\.(?P<k>\d+)$")
PARAM_GRAD_ENTRY = re.compile(r"^Module\.(?P<path>.+)\.(?P<cls>[^.]+)\.parameters_grad(?:\.(?P<k>\d+))?$")
TENSOR_DATA_DIR = "dump_tensor_data"
# msprobe prefixes that name the namespace our capture records ops under.
OUR_NAMESPACES = {"Aten": "aten", "NPU": "npu"}
# The statistics msprobe records (verify/record/statistics.py names their fields), in the order msprobe writes them:
# its own fields first, Max before Min, then any other statistic with an msprobe name, in the table's order.
_MSPROBE_ORDER = ("Max", "Min", "Mean", "Norm")
_EXPORTED = sorted((s for s in STATISTICS if s.msprobe), key=lambda s: (
    _MSPROBE_ORDER.index(s.msprobe) if s.msprobe in _MSPROBE_ORDER else len(_MSPROBE_ORDER)))
# msprobe records no NaN or inf counts: a nan or inf Max or Min stands for them (presence, not a count).
_PRESENCE_FROM_EXTREMES = {"nan_count": math.isnan, "inf_count": math.isinf}
_ROW_COLUMNS = [c for c in OP_COLUMNS if c != "key"]
_IN_ROW_ORDER = operator.itemgetter(*_ROW_COLUMNS)


class Layout(str, Enum):
    PROC = "proc"  # msprobe 26.x: step{N}/proc{pid}/ for a single process
    RANK = "rank"  # msprobe 8.x: step{N}/rank/


# --- reading -------------------------------------------------------------------------------------------------------


def is_msprobe_dump(path: Path) -> bool:
    if path.is_file():
        return path.suffix == ".json"
    return any(True for _ in _dump_files(path))


def _process_dirs(step_dir: Path) -> list[Path]:
    found = [d for d in step_dir.iterdir() if d.is_dir() and PROCESS_DIR.match(d.name) and (d / DUMP_JSON).is_file()]
    return sorted(found, key=lambda d: (int(PROCESS_DIR.match(d.name).group(2) or 0), d.name))


def _dump_files(path: Path) -> Iterator[tuple[int, Path, list[Path]]]:
    """(step, dump.json, all process dirs of that step) for a dump root, a step dir or a process dir."""
    if (path / DUMP_JSON).is_file():
        step = STEP_DIR.match(path.parent.name)
        yield (int(step.group(1)) if step else 0), path / DUMP_JSON, [path]
        return
    step_dirs = [path] if STEP_DIR.match(path.name) else sorted(
        (d for d in path.iterdir() if d.is_dir() and STEP_DIR.match(d.name)),
        key=lambda d: int(STEP_DIR.match(d.name).group(1))) if path.is_dir() else []
    for step_dir in step_dirs:
        processes = _process_dirs(step_dir)
        if processes:
            yield int(STEP_DIR.match(step_dir.name).group(1)), processes[0] / DUMP_JSON, processes


def _number(value: Any) -> float:
    """A Max/Min/Mean/Norm value: number, bool (bool tensors), null (26.2 for ints and float64), or a string."""
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _statistics(tensor: dict) -> dict[str, Any]:
    """Each statistic of a tensor record, by name: read from its msprobe field; the NaN and inf counts as 0/1 from
    Max and Min (a null statistic is not a nan); missing where msprobe records none."""
    extremes = [_number(tensor[k]) for k in ("Max", "Min") if tensor.get(k) is not None]
    values: dict[str, Any] = {}
    for statistic in STATISTICS:
        if statistic.msprobe:
            values[statistic.column] = _number(tensor.get(statistic.msprobe))
        elif statistic.column in _PRESENCE_FROM_EXTREMES:
            values[statistic.column] = int(any(map(_PRESENCE_FROM_EXTREMES[statistic.column], extremes)))
        else:
            values[statistic.column] = math.nan if statistic.dtype == "float64" else pd.NA
    return values


def _is_tensor(value: dict) -> bool:
    kind = str(value.get("type", ""))
    return "Tensor" in kind or kind == "numpy.ndarray"


def _tensors(value: Any, io: str) -> Iterator[tuple[str, dict]]:
    """(io, tensor record) for every tensor in an arg, flattening lists and dicts; scalars are skipped."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from _tensors(item, f"{io}.{index}")
    elif isinstance(value, dict) and "type" in value:
        if _is_tensor(value):
            yield io, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{io}.{key}")


def _record_tensors(record: dict) -> Iterator[tuple[str, dict]]:
    """Backward `input` are the gradients flowing in, `output` the gradients flowing out, as for a forward."""
    for position, arg in enumerate(record.get("input_args") or record.get("input") or []):
        yield from _tensors(arg, f"in{position}")
    for name, arg in (record.get("input_kwargs") or {}).items():
        yield from _tensors(arg, f"in_{name}")
    for name, arg in (record.get("parameters") or {}).items():
        yield from _tensors(arg, f"in_param_{name}")
    for position, arg in enumerate(record.get("output") or []):
        yield from _tensors(arg, f"out{position}")


def _entry_identity(name: str, parents: dict[str, str]) -> tuple[str, str, str, int]:
    """(phase, module, op, call_index) of an entry name; unknown names keep their full name as op."""
    if match := MODULE_ENTRY.match(name):
        return match["direction"], match["path"], f"Module.{match['cls']}", int(match["k"])
    if match := PARAM_GRAD_ENTRY.match(name):
        return "backward", match["path"], f"Module.{match['cls']}.parameters_grad", int(match["k"] or 0)
    if match := API_ENTRY.match(name):
        parent = MODULE_ENTRY.match(parents.get(name) or "")
        prefix = OUR_NAMESPACES.get(match["prefix"], match["prefix"])
        return match["direction"], parent["path"] if parent else "", f"{prefix}.{match['api']}", int(match["k"])
    return "other", "", name, 0


def _tensor_file(record: dict, process_dir: Path, root: Path, skipped: list[str]) -> str:
    name = str(record.get("data_name") or "")
    if not name:
        return ""
    if not name.endswith(".npy") or "/" in name or "\\" in name or name.startswith("."):
        skipped.append(name)
        return ""
    return (process_dir / TENSOR_DATA_DIR / name).relative_to(root).as_posix()


def _rows(step: int, dump_file: Path, root: Path, skipped: list[str]) -> list[tuple]:
    try:
        dump = json.loads(dump_file.read_text(encoding="utf-8"))
        entries = dump["data"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CompareError(f"{dump_file}: not a readable msprobe dump.json ({type(error).__name__}: {error})") from None
    construct = dump_file.parent / "construct.json"
    try:
        parents = json.loads(construct.read_text(encoding="utf-8")) if construct.is_file() else {}
    except ValueError:
        parents = {}
    rows = []
    for seq, (name, record) in enumerate(entries.items()):  # JSON parsing is per entry by nature
        if not isinstance(record, dict):
            continue
        phase, module, op, call_index = _entry_identity(name, parents if isinstance(parents, dict) else {})
        if op.endswith("parameters_grad"):
            tensors = [(f"grad_{io}", t) for name, arg in record.items() for io, t in _tensors(arg, name)]
        else:
            tensors = _record_tensors(record)
        for io, tensor in tensors:
            shape = [int(d) for d in tensor.get("shape") or []]
            rows.append(_IN_ROW_ORDER({
                "step": step, "seq": seq, "phase": phase, "module": module, "op": op, "call_index": call_index,
                "io": io, "dtype": str(tensor.get("dtype", "")).removeprefix("torch."), "shape": "x".join(map(str, shape)),
                "numel": int(np.prod(shape)) if shape else 1, **_statistics(tensor), "md5": str(tensor.get("md5") or ""),
                "tensor_file": _tensor_file(tensor, dump_file.parent, root, skipped),
                # msprobe records no data flow; its stack.json (each api's Python stack) is not read for the source
                "inputs": pd.NA, "source": pd.NA, "attrs": pd.NA}))
    return rows


def read_dump(path: Path) -> Run:
    """An msprobe dump (file, process dir, step dir or dump root) as one comparison side."""
    root = path.parent if path.is_file() else path
    files = [(0, path, [path.parent])] if path.is_file() else list(_dump_files(path))
    if not files:
        raise CompareError(f"{path}: no msprobe dump.json found (expected step*/rank*|proc*/dump.json)")
    notes, skipped, rows = [], [], []
    for step, dump_file, processes in files:
        if len(processes) > 1:
            notes.append(f"step {step}: {len(processes)} ranks/processes; compared {processes[0].name}")
        rows.extend(_rows(step, dump_file, root, skipped))
    if skipped:
        notes.append(f"{len(skipped)} tensor file(s) not read (torch .pt needs torch; compared by statistics), "
                     f"e.g. {skipped[0]}")
    ops = pd.DataFrame(rows, columns=_ROW_COLUMNS) if rows else empty_frame(OP_COLUMNS).drop(columns="key")
    ops["key"] = op_keys({name: ops[name] for name, _ in OP_KEY_PARTS})
    ops = ops[list(OP_COLUMNS)].astype(OP_COLUMNS)
    layout = {p.name.rstrip("0123456789") for _, _, processes in files for p in processes}
    version = "26.x" if "proc" in layout else "8.x" if "rank" in layout else "unknown"
    mode = "md5" if (ops["md5"] != "").any() else "tensor" if (ops["tensor_file"] != "").any() else "stats"
    manifest = RunManifest(script=str(path), device=f"msprobe dump ({version} layout)", dump_mode=mode,
                           steps_completed=len(files), status=Status.OK.value)
    return Run(root=root, manifest=manifest, ops=ops, source=f"msprobe dump ({version} layout)", notes=notes)


# --- writing -------------------------------------------------------------------------------------------------------


def _entry_prefix_and_api(op: str) -> tuple[str, str]:
    namespace, _, api = op.partition(".")
    ours = {ns: prefix for prefix, ns in OUR_NAMESPACES.items()}
    return (ours.get(namespace, namespace), api) if api else ("Aten", namespace)


def _tensor_json(row: dict) -> dict:
    """Fields in msprobe's order: type, dtype, shape, Max, Min, Mean, Norm (_EXPORTED), requires_grad[, md5]."""
    tensor = {"type": "torch.Tensor", "dtype": f"torch.{row['dtype']}",
              "shape": [int(d) for d in str(row["shape"]).split("x") if d],
              **{statistic.msprobe: _json_float(row[statistic.column]) for statistic in _EXPORTED},
              "requires_grad": False}
    if isinstance(row.get("md5"), str) and row["md5"]:
        tensor["md5"] = row["md5"]
    return tensor


def _json_float(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _step_dump(ops: pd.DataFrame) -> dict[str, Any]:
    calls = ops.drop_duplicates("seq")[["seq", "op"]]
    calls = calls.assign(k=calls.sort_values("seq").groupby("op").cumcount())  # msprobe's per-API call counter
    ops = ops.merge(calls[["seq", "k"]], on="seq").sort_values(["seq", "io"])
    data: dict[str, dict] = {}
    for (seq, op, k), rows in ops.groupby(["seq", "op", "k"], sort=True):  # one JSON entry per op call
        prefix, api = _entry_prefix_and_api(op)
        records = rows.to_dict("records")
        data[f"{prefix}.{api}.{k}.forward"] = {
            "input_args": [_tensor_json(r) for r in records if r["io"].startswith("in")],
            "input_kwargs": {},
            "output": [_tensor_json(r) for r in records if not r["io"].startswith("in")],
        }
    return {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None, "data": data}


def write_dump(run: Run, out: Path, layout: Layout = Layout.PROC) -> list[Path]:
    """One step{N}/{proc0|rank}/ folder per step with dump.json, an empty stack.json and construct.json."""
    if run.ops.empty:
        raise CompareError(f"{run.root}: no operator records to export")
    written = []
    for step, ops in run.ops.groupby("step", sort=True):
        folder = out / f"step{int(step)}" / ("proc0" if layout is Layout.PROC else "rank")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / DUMP_JSON).write_text(json.dumps(_step_dump(ops), indent=1), encoding="utf-8")
        (folder / "stack.json").write_text("{}", encoding="utf-8")
        (folder / "construct.json").write_text("{}", encoding="utf-8")
        written.append(folder)
    return written
