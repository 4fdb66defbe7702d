from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Case, LOADER, PortRule, ReadsTheOriginal, Unchanged, argument, called_name, findall, has_star_args, \
    keyed_calls, keyword, node_code, parsed, replace_argument_value, with_args

# The DataLoader arguments that decide which samples a batch holds and in what order, with their positions in
# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, drop_last,
# timeout, worker_init_fn, multiprocessing_context, generator). batch_size and drop_last are hyperparameters: a port
# that changed them is a port bug, never rewritten (migrate/fix.py names it).
_ORDER = (("shuffle", 2), ("worker_init_fn", 10), ("generator", 12))


def _loader(call: cst.Call) -> str | None:
    return LOADER if called_name(call) == LOADER else None


# Where a loader's order argument is set: the value, and the node that sets it (the loader's own cst.Arg, a
# cst.DictElement of a `**kwargs` dict literal, or a cst.Arg of `dict(...)` / `.update(...)`).
Setting = tuple[cst.BaseExpression, cst.CSTNode]
_DICT_METHODS = ("update",)


class OriginalLoaderOrder(ReadsTheOriginal, PortRule):
    """Give the port's DataLoaders the original's shuffle, generator and worker_init_fn, where a verify pair measured
    another data order.

    ## What it does
    Only under `migrate PORT --fix-from PAIR` when verify found the sides' first batch differ (`data_order`;
    `Settings.original_source` holds the original's script): the k-th DataLoader the port builds gets the `shuffle=`,
    `generator=` and `worker_init_fn=` of the original's k-th, as the original writes them: added where the port
    lacks one, replaced where it differs, removed (a positional one set to None) where the original gives none.
    Where the loader takes `**name`, the order keys of that dict count as its arguments and are changed where they
    are set: the dict literal or `dict(...)` call assigned to `name` in the loader's scope (module or function body,
    before the loader), and what `name.update(...)` adds there (a dict literal, `dict(...)`, keywords, or a name bound
    to one of those in that scope: pytorch/examples mnist's `train_kwargs.update(accel_kwargs)`). Out of reach, and
    left: a dict built or changed elsewhere (a parameter, a function's result, a `name[key] = ...`, a comprehension);
    an argument the original sets is not added to a loader whose `**` dict is out of reach (it may hold that key).
    Other arguments are left.

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
        Case(
            """
            from torch.utils.data import DataLoader
            def main(data):
                kwargs = {'batch_size': 8}
                accel = {'num_workers': 1, 'shuffle': False}
                kwargs.update(accel)
                return DataLoader(data, **kwargs), DataLoader(data, **dict(shuffle=True))
            """,
            """
            from torch.utils.data import DataLoader
            def main(data):
                kwargs = {'batch_size': 8}
                accel = {'num_workers': 1, 'shuffle': True}
                kwargs.update(accel)
                return DataLoader(data, **kwargs), DataLoader(data, **dict())
            """,
            lines=[4, 6],
            original_source="def main(data):\n    kwargs = {'batch_size': 8}\n"
                            "    accel = {'num_workers': 1, 'shuffle': True}\n    kwargs.update(accel)\n"
                            "    return DataLoader(data, **kwargs), DataLoader(data, **dict())\n",
        ),
        Unchanged(
            """
            from torch.utils.data import DataLoader
            def main(data, kwargs):
                return DataLoader(data, **kwargs)
            """,
            original_source="def main(data, kwargs):\n    return DataLoader(data, shuffle=True, **kwargs)\n",
        ),
        Unchanged("from torch.utils.data import DataLoader\ntrain = DataLoader(data, shuffle=False)\n"),
    )

    def visit_Module(self, node: cst.Module) -> None:
        original = parsed(self.settings.original_source)  # type: ignore[arg-type]
        theirs = {place: _order_of(call, settings) for call, (place, settings) in _loaders(original).items()}
        self._plan: dict[cst.CSTNode, tuple[str, cst.BaseExpression | None]] = {}  # a dict's site: its new value
        self._calls: dict[cst.Call, dict[str, cst.BaseExpression | None]] = {}  # a loader: arguments to give it
        for call, (place, settings) in _loaders(node).items():
            if place in theirs:
                self._planned(call, _order_of(call, settings), theirs[place], settings is not None)

    def _planned(self, call: cst.Call, mine: dict[str, Setting], theirs: dict[str, Setting], resolved: bool) -> None:
        for name, _ in _ORDER:
            want = theirs[name][0] if name in theirs else None
            have = mine.get(name)
            if _code(want) == _code(have[0] if have else None):
                continue
            if have is not None and not any(have[1] is arg for arg in call.args):
                self._plan[have[1]] = (name, want)
            elif have is not None or resolved:
                self._calls.setdefault(call, {})[name] = want

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        wanted = self._calls.get(original_node)
        if not wanted:
            return updated_node
        new = updated_node
        for name, position in _ORDER:
            if name in wanted:
                new = _given_as(new, wanted[name], name, position)
        return self.replace(original_node, updated_node, new,
                            f"the original's data order: {', '.join(self._changed(updated_node, new))}")

    def leave_DictElement(self, original_node: cst.DictElement, updated_node: cst.DictElement
                          ) -> cst.DictElement | cst.RemovalSentinel:
        return self._set_in_a_dict(original_node, updated_node)  # type: ignore[return-value]

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg | cst.RemovalSentinel:
        return self._set_in_a_dict(original_node, updated_node)  # type: ignore[return-value]

    def _set_in_a_dict(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> cst.CSTNode:
        if original_node not in self._plan:
            return updated_node
        name, want = self._plan[original_node]
        was = _code(updated_node.value)  # type: ignore[attr-defined]
        message = f"the original's data order: {name}={_code(want)} (was {was}) in the loader's ** dict"
        if want is None:
            self.replace(original_node, updated_node, updated_node, message)
            return cst.RemoveFromParent()  # type: ignore[return-value]
        return self.replace(original_node, updated_node, updated_node.with_changes(value=want), message)

    @staticmethod
    def _changed(old: cst.Call, new: cst.Call) -> list[str]:
        words = []
        for name, position in _ORDER:
            was, now = (_value(argument(call, position, name)) for call in (old, new))
            if was != now:
                words.append(f"{name}={now} (was {was})")
        return words


def _given_as(call: cst.Call, want: cst.BaseExpression | None, name: str, position: int) -> cst.Call:
    """`call` with its argument `name` given as `want` (None: not given)."""
    have = argument(call, position, name)
    if want is None:
        if have is None:
            return call
        if have.keyword is None:  # positional: the ones after it keep their places
            return replace_argument_value(call, have, cst.Name("None"))
        return with_args(call, [arg for arg in call.args if arg is not have])
    if have is None:
        return with_args(call, [*call.args, keyword(name, want)])
    return replace_argument_value(call, have, want)


def _loaders(module: cst.Module) -> dict[cst.Call, tuple[tuple[str, int], dict[str, dict[str, Setting]] | None]]:
    """Each DataLoader call with its place (keyed_calls) and the order keys of the dicts its scope builds before it,
    by name (None where a `**` dict of the call is not one of them)."""
    places = keyed_calls(module, _loader)
    found: dict[cst.Call, tuple[tuple[str, int], dict[str, dict[str, Setting]] | None]] = {}
    for body in _scopes(module):
        dicts: dict[str, dict[str, Setting]] = {}
        for statement in body:
            for call in findall(statement, m.Call()):
                if call in places:
                    found[call] = (places[call], _star_dicts(call, dicts))
            _track(statement, dicts)
    for call, place in places.items():  # a loader in no statement of a body (a for loop's iterable)
        found.setdefault(call, (place, None if has_star_args(call) else {}))
    return found


def _star_dicts(call: cst.Call, dicts: dict[str, dict[str, Setting]]) -> dict[str, dict[str, Setting]] | None:
    """The dicts a loader's `**name` arguments name, where each is known (or a literal written there); None else."""
    stars = [arg.value for arg in call.args if arg.star == "**"]
    if any(arg.star == "*" for arg in call.args) or any(_entries(value, dicts) is None for value in stars):
        return None
    return {value.value: dicts[value.value] for value in stars if isinstance(value, cst.Name)}


def _scopes(module: cst.Module) -> list[list[cst.CSTNode]]:
    """The module's and each function's small statements in source order, a nested function's apart."""
    scopes: list[list[cst.CSTNode]] = []

    def walk(node: cst.CSTNode, body: list[cst.CSTNode]) -> None:
        for child in node.children:
            if isinstance(child, (cst.FunctionDef, cst.ClassDef)):
                scopes.append(inner := [])
                walk(child, inner)
            elif isinstance(child, cst.BaseSmallStatement):
                body.append(child)
            else:
                walk(child, body)

    scopes.append(top := [])
    walk(module, top)
    return scopes


def _track(statement: cst.CSTNode, dicts: dict[str, dict[str, Setting]]) -> None:
    """What `statement` does to the dicts `dicts` holds: `name = {...}` / `dict(...)` binds one; `name.update(...)`
    adds to it; anything else that names one (`name[key] = ...`) puts it out of reach."""
    if isinstance(statement, cst.Assign) and len(statement.targets) == 1 \
            and isinstance(target := statement.targets[0].target, cst.Name):
        entries = _entries(statement.value, dicts)
        if entries is None:
            dicts.pop(target.value, None)
        else:
            dicts[target.value] = entries
        return
    call = statement.value if isinstance(statement, cst.Expr) else None
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name) \
            and call.func.attr.value in _DICT_METHODS and call.func.value.value in dicts:
        added = _entries(cst.Call(func=cst.Name("dict"), args=call.args), dicts)
        if added is None:
            del dicts[call.func.value.value]
        else:
            dicts[call.func.value.value] = {**dicts[call.func.value.value], **added}
        return
    for name in [name for name in dicts if findall(statement, m.Name(name))]:
        del dicts[name]


def _entries(value: cst.BaseExpression, dicts: dict[str, dict[str, Setting]]) -> dict[str, Setting] | None:
    """The string keys a dict literal, `dict(...)` call or known dict name sets; None where it is none of those."""
    if isinstance(value, cst.Name):
        return dict(dicts[value.value]) if value.value in dicts else None
    if isinstance(value, cst.Dict):
        if not all(isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString) for e in value.elements):
            return None
        return {e.key.evaluated_value: (e.value, e) for e in value.elements}  # type: ignore[union-attr,misc]
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict":
        entries: dict[str, Setting] = {}
        for arg in value.args:
            if arg.keyword is not None:
                entries[arg.keyword.value] = (arg.value, arg)
            elif (given := _entries(arg.value, dicts)) is not None and not arg.star:
                entries.update(given)
            else:
                return None
        return entries
    return None


def _order_of(call: cst.Call, settings: dict[str, dict[str, Setting]] | None) -> dict[str, Setting]:
    """The order arguments a loader call is given, its own or from its `**` dicts (those known)."""
    given: dict[str, Setting] = {}
    for arg in call.args:
        if arg.star == "**" and isinstance(arg.value, cst.Name) and settings and arg.value.value in settings:
            given.update(settings[arg.value.value])
        elif arg.star == "**":
            given.update(_entries(arg.value, {}) or {})
    for name, position in _ORDER:
        own = argument(call, position, name)
        if own is not None:
            given[name] = (own.value, own)
    return {name: given[name] for name, _ in _ORDER if name in given}


def _code(value: cst.BaseExpression | None) -> str:
    return node_code(value) if value is not None else "None"


def _value(given: cst.Arg | None) -> str:
    """An argument's value as written; None (every order argument's default) where it is not given."""
    return node_code(given.value) if given is not None else "None"
