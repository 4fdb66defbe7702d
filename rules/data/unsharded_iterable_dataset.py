from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Flag, PortRule, Safety, Severity, Unchanged, dotted_name, findall
from rules.data._loaders import LOADER, LOADER_POSITIONS, flag_value, has_workers, source

_ITERABLE_DATASET = {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"}
# Calls that split a stream among DataLoader workers (torch's own, and webdataset's helper built on it).
_WORKER_SPLITS = m.Name("get_worker_info") | m.Name("split_by_worker")


class UnshardedIterableDataset(PortRule):
    """Report an IterableDataset that every DataLoader worker reads in full: each sample arrives num_workers times.

    ## What it does
    Reports each class derived from `torch.utils.data.IterableDataset` (directly or through another class of the
    file) when a DataLoader of the file has `num_workers` other than 0 and nothing in the file calls
    `get_worker_info()` (or webdataset's `split_by_worker`) to give each worker its own part of the stream.

    ## Why
    Every worker process gets a copy of the dataset object and runs its `__iter__` from the start, so with N workers
    the loader yields every sample N times. The epoch then holds N times the data, and when the GPU and NPU machines
    use different worker counts the two trainings see different data. Splitting by rank alone does not help: the
    workers of one rank still repeat that rank's part.

    ## Safety
    Report-only: where to split (files, shards, lines) depends on the dataset. In `__iter__`, read
    `torch.utils.data.get_worker_info()` and yield only the worker's share; under DDP split by rank as well.

    ## References
    torch/utils/data/dataset.py (IterableDataset docstring, the worker example); PyTorch's data docs
    (<https://docs.pytorch.org/docs/stable/data.html>).
    """

    CODE = "DATA006"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C7",)
    TRIGGERS = ("IterableDataset",)
    EXAMPLES = (
        Flag(
            """
            import torch
            from torch.utils.data import DataLoader, IterableDataset

            class LineStream(IterableDataset):
                def __iter__(self):
                    yield from open(self.path)

            class ShuffledLines(LineStream):
                pass

            loader = DataLoader(LineStream("a.txt"), batch_size=32, num_workers=args.workers)
            """,
            lines=[4, 8],
        ),
        Unchanged(
            """
            import itertools
            import torch.utils.data as data

            class LineStream(data.IterableDataset):
                def __iter__(self):
                    worker = data.get_worker_info()
                    lines = open(self.path)
                    return lines if worker is None else itertools.islice(lines, worker.id, None, worker.num_workers)

            loader = data.DataLoader(LineStream("a.txt"), num_workers=4)
            """
        ),
        Unchanged(
            """
            from torch.utils.data import DataLoader, IterableDataset

            class LineStream(IterableDataset):
                def __iter__(self):
                    yield from open(self.path)

            loader = DataLoader(LineStream("a.txt"), batch_size=32, num_workers=0)
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._streams: dict[str, cst.ClassDef] = {}  # IterableDataset subclasses of this file, by name
        self._loader_with_workers: cst.Call | None = None
        self._splits_by_worker = False

    def visit_Module(self, node: cst.Module) -> None:
        self._splits_by_worker = bool(findall(node, _WORKER_SPLITS))

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if any(self._is_stream(base.value) for base in node.bases):
            self._streams[node.name.value] = node

    def visit_Call(self, node: cst.Call) -> None:
        if self._loader_with_workers is None and self.refers_to(node.func, *LOADER) and has_workers(node):
            self._loader_with_workers = node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        loader = self._loader_with_workers
        if loader is None or self._splits_by_worker:
            return updated_node
        workers = source(flag_value(loader, LOADER_POSITIONS, "num_workers"))  # type: ignore[arg-type]
        line = self.file.position(loader).start.line
        for name, stream in self._streams.items():
            self.report(
                stream,
                f"{name} is an IterableDataset that no worker splits: with num_workers={workers} (line {line}) "
                "every DataLoader worker yields every sample",
                "In __iter__, read torch.utils.data.get_worker_info() and yield only that worker's share "
                "(e.g. itertools.islice(stream, info.id, None, info.num_workers)); under DDP split by rank too.",
                Severity.WARNING,
            )
        return updated_node

    def _is_stream(self, base: cst.BaseExpression) -> bool:
        return self.refers_to(base, *_ITERABLE_DATASET) or dotted_name(base) in self._streams
