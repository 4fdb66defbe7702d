from __future__ import annotations

from typing import Iterable, Sequence

import libcst as cst
import libcst.matchers as m

from rules import (
    Case, PortRule, Settings, Unchanged, argument, findall, keyword, keyword_names, matches, statement, with_args,
)
from rules.determinism._entry_points import numpy_alias, seeds_python_generator
from rules.determinism._script_seed import ScriptSeed, bound_where, script_seed

_DATA_LOADER = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
_HELPER = "seed_worker"
_TWO_BLANK_LINES = (cst.EmptyLine(), cst.EmptyLine())  # around a top-level function, as PEP 8 asks


class UnseededDataLoader(PortRule):
    """Give each DataLoader a seeded generator, and seed its worker processes, when the port is seeded.

    ## What it does
    With `--seed N`, a `DataLoader(...)` without `generator=` gets `generator=torch.Generator().manual_seed(S)`,
    where S is the script's own seed where it has one and it is bound there (`args.seed` for a `--seed` option or
    `torch.manual_seed(args.seed)`, see `_script_seed`), else N; where the script seeds only when a seed is given
    (`if args.seed is not None:`, a `--seed` without default), the generator follows: `... if args.seed is not None
    else None`. The report names the seed each loader gets. A loader with workers (`num_workers=` other than 0) and
    no `worker_init_fn=` gets `worker_init_fn=seed_worker`.
    The `seed_worker` function (seeding python's generator, and numpy's where the file imports numpy, from the seed
    torch gives each worker) is added once per file, before its first definition or the first statement that uses
    it, whichever comes first, unless the file already defines one. An inference script (see UnseededTraining)
    seeds only the generators it uses: python's where it imports random, numpy's where it imports numpy, and its
    loaders get no `worker_init_fn` where it uses neither.

    ## Why
    The shuffle order comes from the loader's generator and each worker's augmentations from its own generators:
    without these, two seeded runs still see different batches (checklist C6).

    ## Safety
    Safe: asked for with `--seed`. The generator is a CPU generator, as the DataLoader's sampler needs.

    ## References
    PyTorch's reproducibility notes, "DataLoader" (<https://docs.pytorch.org/docs/stable/notes/randomness.html>).
    """

    CODE = "DET004"
    CHECKLIST = ("C6",)
    TRIGGERS = ("DataLoader",)
    EXAMPLES = (
        Case(
            """
            import numpy as np
            from torch.utils.data import DataLoader

            def main():
                loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=4)
            """,
            """
            import numpy as np
            from torch.utils.data import DataLoader
            import random
            import torch


            def seed_worker(worker_id):
                \"\"\"Seed python's and numpy's generators in a DataLoader worker from the seed torch gave it.\"\"\"
                worker_seed = torch.initial_seed() % 2**32
                random.seed(worker_seed)
                np.random.seed(worker_seed)

            def main():
                loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=4, worker_init_fn=seed_worker,
                                    generator=torch.Generator().manual_seed(7))
            """,
            lines=[4, 5],
            seed=7,
            is_entry=False,  # a project's data module: the script that trains is another file
        ),
        Case(
            """
            import torch
            loader = torch.utils.data.DataLoader(dataset, shuffle=True)
            """,
            """
            import torch
            loader = torch.utils.data.DataLoader(dataset, shuffle=True, generator=torch.Generator().manual_seed(0))
            """,
            lines=[2],
            seed=0,
        ),
        Case(
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(dataset, num_workers=2)

            def train():
                pass
            """,
            """
            import torch
            from torch.utils.data import DataLoader
            import random


            def seed_worker(worker_id):
                \"\"\"Seed python's generator in a DataLoader worker from the seed torch gave it.\"\"\"
                worker_seed = torch.initial_seed() % 2**32
                random.seed(worker_seed)


            loader = DataLoader(dataset, num_workers=2, worker_init_fn=seed_worker, generator=torch.Generator().manual_seed(5))

            def train():
                pass
            """,
            lines=[3],
            seed=5,
            is_entry=False,
        ),
        Case(  # the script's own seed, and its guard: no seed given, no generator, as the script
            """
            import argparse
            import random
            import torch
            from torch.utils.data import DataLoader
            parser = argparse.ArgumentParser()
            parser.add_argument("--seed", type=int, default=None)

            def main():
                args = parser.parse_args()
                if args.seed is not None:
                    random.seed(args.seed)
                    torch.manual_seed(args.seed)
                loader = DataLoader(dataset, shuffle=True)
            """,
            """
            import argparse
            import random
            import torch
            from torch.utils.data import DataLoader
            parser = argparse.ArgumentParser()
            parser.add_argument("--seed", type=int, default=None)

            def main():
                args = parser.parse_args()
                if args.seed is not None:
                    random.seed(args.seed)
                    torch.manual_seed(args.seed)
                loader = DataLoader(dataset, shuffle=True,
                                    generator=torch.Generator().manual_seed(args.seed) if args.seed is not None else None)
            """,
            lines=[13],
            seed=7,
        ),
        Case(  # the script's seed is not bound in the function that makes the loader: the literal stands in
            """
            import torch

            def make_loader(dataset):
                return torch.utils.data.DataLoader(dataset, shuffle=True)

            def main():
                args = parse()
                torch.manual_seed(args.seed)
            """,
            """
            import torch

            def make_loader(dataset):
                return torch.utils.data.DataLoader(dataset, shuffle=True, generator=torch.Generator().manual_seed(7))

            def main():
                args = parse()
                torch.manual_seed(args.seed)
            """,
            lines=[4],
            seed=7,
        ),
        Case(  # an inference script that uses neither python's nor numpy's generator: its workers need no seeding
            """
            import torch
            from torch.utils.data import DataLoader

            def main():
                model = Classifier().eval()
                loader = DataLoader(images, batch_size=64, num_workers=4)
                with torch.no_grad():
                    for batch in loader:
                        print(model(batch).argmax(1))
            """,
            """
            import torch
            from torch.utils.data import DataLoader

            def main():
                model = Classifier().eval()
                loader = DataLoader(images, batch_size=64, num_workers=4, generator=torch.Generator().manual_seed(7))
                with torch.no_grad():
                    for batch in loader:
                        print(model(batch).argmax(1))
            """,
            lines=[6],
            seed=7,
        ),
        Case(  # an inference script that uses numpy's generator and not python's: seed_worker seeds numpy's only
            """
            import numpy as np
            import torch
            from torch.utils.data import DataLoader

            def main():
                loader = DataLoader(Crops(np.load("images.npy")), num_workers=4)
                with torch.no_grad():
                    for batch in loader:
                        print(Classifier().eval()(batch).argmax(1))
            """,
            """
            import numpy as np
            import torch
            from torch.utils.data import DataLoader


            def seed_worker(worker_id):
                \"\"\"Seed numpy's generator in a DataLoader worker from the seed torch gave it.\"\"\"
                worker_seed = torch.initial_seed() % 2**32
                np.random.seed(worker_seed)

            def main():
                loader = DataLoader(Crops(np.load("images.npy")), num_workers=4, worker_init_fn=seed_worker,
                                    generator=torch.Generator().manual_seed(7))
                with torch.no_grad():
                    for batch in loader:
                        print(Classifier().eval()(batch).argmax(1))
            """,
            lines=[5, 6],
            seed=7,
        ),
        Unchanged(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(dataset, shuffle=True)
            """
        ),
        Unchanged(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(dataset, num_workers=2, worker_init_fn=init, generator=g)
            """,
            seed=0,
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._seeded_workers: list[tuple[cst.Call, cst.CSTNode]] = []  # (original, new) calls given seed_worker
        self._has_helper = False
        self._seed: ScriptSeed | None = None
        self._module: cst.Module | None = None
        self._python_generator = True  # seed_worker seeds python's generator
        self._numpy: str | None = None  # the name numpy is imported as, whose generator seed_worker seeds

    @classmethod
    def wants(cls, source: str, settings: Settings) -> bool:
        return settings.seed is not None and super().wants(source, settings)

    def visit_Module(self, node: cst.Module) -> None:
        self._has_helper = any(matches(line, m.FunctionDef(name=m.Name(_HELPER))) for line in node.body)
        self._seed = script_seed(node, self)
        self._module = node
        self._python_generator = seeds_python_generator(node, self.file.inference)
        self._numpy = numpy_alias(node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.refers_to(original_node.func, *_DATA_LOADER):  # resolved only where a name could be one
            return updated_node
        present = keyword_names(updated_node)
        added = []
        seeds_workers = self._python_generator or self._numpy is not None
        if "worker_init_fn" not in present and seeds_workers and _has_workers(updated_node):
            added.append(keyword("worker_init_fn", cst.Name(_HELPER)))
        seeded_with = ""
        if "generator" not in present:
            generator, seeded_with = self._generator(original_node)
            added.append(keyword("generator", cst.parse_expression(generator)))
        if not added:
            return updated_node
        new = with_args(updated_node, [*updated_node.args, *added])
        names = " and ".join(arg.keyword.value for arg in added)  # type: ignore[union-attr]
        message = f"seeded DataLoader: added {names}{seeded_with}"
        result = self.replace(original_node, updated_node, new, message, imports=[("torch", None)])
        if "worker_init_fn" in names and result is new:
            self._seeded_workers.append((original_node, new))
        return result

    def _generator(self, loader: cst.Call) -> tuple[str, str]:
        """The generator `loader` gets, and the words naming its seed for the report."""
        seed = self._seed
        line_of = lambda node: self.file.position(node).start.line  # noqa: E731
        if seed is not None and bound_where(seed, self._module, loader, line_of):  # type: ignore[arg-type]
            return seed.guarded(f"torch.Generator().manual_seed({seed.text})"), f", seeded with {seed.described()}"
        literal = self.settings.seed
        why = f"`{seed.text}` is not bound here" if seed is not None else "the script has no seed of its own"
        return f"torch.Generator().manual_seed({literal})", f", seeded with {literal} (migrate --seed: {why})"

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self._seeded_workers or self._has_helper:
            return updated_node
        originals, news = zip(*self._seeded_workers)
        body = list(updated_node.body)
        where = _helper_place(body, news)
        if where < len(body) and not any(line.comment is None for line in body[where].leading_lines):
            body[where] = body[where].with_changes(leading_lines=[*_TWO_BLANK_LINES, *body[where].leading_lines])
        body.insert(where, _seed_worker(self._python_generator, self._numpy))
        new = updated_node.with_changes(body=body)
        anchor = original_node.body[min(_helper_place(original_node.body, originals), len(original_node.body) - 1)]
        imports = [("random", None), ("torch", None)] if self._python_generator else [("torch", None)]
        return self.replace(original_node, updated_node, new, f"added the {_HELPER} function", imports=imports, at=anchor)


def _helper_place(body: Sequence[cst.BaseStatement], seeded: Iterable[cst.CSTNode]) -> int:
    """The index of the first definition in `body` or of its first statement that makes one of the `seeded` loaders:
    the helper goes before it, defined before any use."""
    calls = {id(call) for call in seeded}
    for index, line in enumerate(body):
        if isinstance(line, (cst.FunctionDef, cst.ClassDef)) or any(id(c) in calls for c in findall(line, m.Call())):
            return index
    return len(body)


def _has_workers(call: cst.Call) -> bool:
    workers = argument(call, 5, "num_workers")
    return workers is not None and not matches(workers.value, m.Integer("0"))


def _seed_worker(python: bool, numpy: str | None) -> cst.BaseStatement:
    """The helper seeding python's generator (where `python`) and numpy's (where numpy is imported as `numpy`)."""
    names = [name for name, used in (("python's", python), ("numpy's", numpy)) if used]
    generators = " and ".join(names) + (" generators" if len(names) > 1 else " generator")
    lines = [
        f"def {_HELPER}(worker_id):",
        f'    """Seed {generators} in a DataLoader worker from the seed torch gave it."""',
        "    worker_seed = torch.initial_seed() % 2**32",
    ]
    if python:
        lines.append("    random.seed(worker_seed)")
    if numpy:
        lines.append(f"    {numpy}.random.seed(worker_seed)")
    helper = statement("\n".join(lines))
    return helper.with_changes(leading_lines=_TWO_BLANK_LINES)
