from __future__ import annotations

import libcst as cst

from rules import LOADER, Case, PortRule, Settings, Unchanged, argument, called_name, has_star_args, keyed_calls, \
    keyword, node_code, parsed, replace_argument_value, with_args

# The DataLoader arguments that decide which samples a batch holds and in what order, with their positions in
# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, drop_last,
# timeout, worker_init_fn, multiprocessing_context, generator). batch_size and drop_last are hyperparameters: a port
# that changed them is a port bug, never rewritten (migrate/fix.py names it).
_ORDER = (("shuffle", 2), ("worker_init_fn", 10), ("generator", 12))


def _loader(call: cst.Call) -> str | None:
    return LOADER if called_name(call) == LOADER and not has_star_args(call) else None


class OriginalLoaderOrder(PortRule):
    """Give the port's DataLoaders the original's shuffle, generator and worker_init_fn, where a verify pair measured
    another data order.

    ## What it does
    Only under `migrate PORT --fix-from PAIR` when verify found the sides' first batch differ (`data_order`;
    `Settings.original_source` holds the original's script): the k-th DataLoader the port builds gets the `shuffle=`,
    `generator=` and `worker_init_fn=` of the original's k-th, as the original writes them: added where the port
    lacks one, replaced where it differs, removed (a positional one set to None) where the original gives none.
    Other arguments are left, and so is a call with `*args`/`**kwargs`.

    ## Why
    A shuffling DataLoader draws its order from its `generator`, or from the global generator where it has none (in
    whatever state the model's initialisation left it); `worker_init_fn` seeds what each worker draws. A port that
    shuffles where the original does not, or draws its order from another generator, reads other batches from the
    first step (checklist C6, C7): verify's `data_order`.

    ## Safety
    Safe where it runs: the values are the original's expressions, which read names the port keeps (a generator the
    original builds beside the loader is built in the port too). A loader the port builds where the original has
    none is compared with the wrong one: the verify round after the fix shows it.

    ## References
    torch/utils/data/dataloader.py (DataLoader's `shuffle`, `generator`, `worker_init_fn`); PyTorch's
    reproducibility notes (docs/source/notes/randomness.rst, "DataLoader").
    """

    CODE = "DATA201"
    CHECKLIST = ("C6", "C7")
    TRIGGERS = (LOADER,)
    EXAMPLES = (
        Case(
            """
            from torch.utils.data import DataLoader
            train = DataLoader(data, batch_size=8, shuffle=False)
            test = DataLoader(data, 8, True, worker_init_fn=init)
            """,
            """
            from torch.utils.data import DataLoader
            train = DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(7))
            test = DataLoader(data, 8, None)
            """,
            lines=[2, 3],
            original_source="train = DataLoader(data, batch_size=8, shuffle=True, "
                            "generator=torch.Generator().manual_seed(7))\ntest = DataLoader(data, 8)\n",
        ),
        Unchanged(
            """
            from torch.utils.data import DataLoader
            train = DataLoader(data, batch_size=16, shuffle=True)
            """,
            original_source="train = DataLoader(data, batch_size=8, shuffle=True)\n",
        ),
        Unchanged("from torch.utils.data import DataLoader\ntrain = DataLoader(data, shuffle=False)\n"),
    )

    @classmethod
    def wants(cls, source: str, settings: Settings) -> bool:
        return settings.original_source is not None and super().wants(source, settings)

    def visit_Module(self, node: cst.Module) -> None:
        theirs = keyed_calls(parsed(self.settings.original_source), _loader)  # type: ignore[arg-type]
        self._theirs = {place: call for call, place in theirs.items()}
        self._mine = keyed_calls(node, _loader)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        theirs = self._theirs.get(self._mine.get(original_node))  # type: ignore[arg-type]
        if theirs is None:
            return updated_node
        new = updated_node
        for name, position in _ORDER:
            new = _given_as(new, theirs, name, position)
        if new is updated_node:
            return updated_node
        return self.replace(original_node, updated_node, new,
                            f"the original's data order: {', '.join(self._changed(updated_node, new))}")

    @staticmethod
    def _changed(old: cst.Call, new: cst.Call) -> list[str]:
        words = []
        for name, position in _ORDER:
            was, now = (_value(argument(call, position, name)) for call in (old, new))
            if was != now:
                words.append(f"{name}={now} (was {was})")
        return words


def _given_as(call: cst.Call, original: cst.Call, name: str, position: int) -> cst.Call:
    """`call` with its argument `name` as `original` gives it."""
    want, have = argument(original, position, name), argument(call, position, name)
    if _value(want) == _value(have):
        return call
    if want is None:
        if have.keyword is None:  # type: ignore[union-attr]  # positional: the ones after it keep their places
            return replace_argument_value(call, have, cst.Name("None"))  # type: ignore[arg-type]
        return with_args(call, [arg for arg in call.args if arg is not have])
    if have is None:
        return with_args(call, [*call.args, keyword(name, want.value)])
    return replace_argument_value(call, have, want.value)


def _value(given: cst.Arg | None) -> str:
    """An argument's value as written; None (every order argument's default) where it is not given."""
    return node_code(given.value) if given is not None else "None"
