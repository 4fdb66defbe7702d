"""What the data rules read off DataLoader and sampler calls, and which split a name says it is (no rule lives here)."""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from rules import argument, findall, matches

LOADER = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
DISTRIBUTED_SAMPLER = frozenset(
    {"torch.utils.data.distributed.DistributedSampler", "torch.utils.data.DistributedSampler"}
)

# Positions in DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn,
# pin_memory, drop_last, ...): the parameters may be passed positionally.
LOADER_POSITIONS = {"dataset": 0, "batch_size": 1, "shuffle": 2, "sampler": 3, "batch_sampler": 4, "num_workers": 5,
                    "drop_last": 8}
# DistributedSampler(dataset, num_replicas, rank, shuffle, seed, drop_last).
SAMPLER_POSITIONS = {"dataset": 0, "shuffle": 3, "drop_last": 5}

# Words of an identifier that name a held-out split: `val_loader`, `testset`, `evalDataset`, `valdir`, "val".
_EVALUATION_WORD = re.compile(r"^(?:val|valid|validation|eval|evaluation|test|testing)(?:set|sets|loader|dir|data|"
                              r"dataset|ds|sampler|s)?\d*$")
_TRAINING_WORD = re.compile(r"^(?:train|training)(?:set|sets|loader|dir|data|dataset|ds|sampler)?\d*$")
_CALL = m.Call()


def words(text: str) -> list[str]:
    """The lower-case words of source text: `self.valLoader[0]` -> self, val, loader, 0."""
    return re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text).lower())


def names_evaluation_split(text: str) -> bool:
    return any(_EVALUATION_WORD.match(word) for word in words(text))


def names_training_split(text: str) -> bool:
    return any(_TRAINING_WORD.match(word) for word in words(text))


def source(node: cst.CSTNode) -> str:
    if isinstance(node, cst.Name) and not node.lpar:  # most targets: no code to generate
        return node.value
    return cst.Module([]).code_for_node(node)


def assigned_calls(assign: cst.Assign) -> dict[cst.Call, str]:
    """Each call in an assignment's value, with the source of the targets it (or its result) is assigned to.

    `val_sampler = DistributedSampler(val_set) if distributed else None` gives that call "val_sampler"; so does
    the sampler built inline in `val_loader = DataLoader(ds, sampler=DistributedSampler(ds))`.
    """
    targets = " ".join(source(target.target) for target in assign.targets)
    return {call: targets for call in findall(assign.value, _CALL)}  # type: ignore[misc]


def flag_value(call: cst.Call, positions: dict[str, int], name: str) -> cst.BaseExpression | None:
    """The expression passed for parameter `name` of `call`, or None when it is left at its default."""
    passed = argument(call, positions.get(name), name)
    return passed.value if passed is not None else None


def description(call: cst.Call, positions: dict[str, int], assigned: str, *parameters: str) -> str:
    """What says which split a call serves: the names it is assigned to, and the source of the given arguments."""
    values = (flag_value(call, positions, name) for name in parameters)
    return " ".join([assigned, *(source(value) for value in values if value is not None)])


def is_true(value: cst.BaseExpression | None) -> bool:
    return value is not None and matches(value, m.Name("True"))


def has_workers(loader: cst.Call) -> bool:
    """`num_workers=` is passed and is not the literal 0 (an expression counts: it is usually above 0)."""
    workers = flag_value(loader, LOADER_POSITIONS, "num_workers")
    return workers is not None and not matches(workers, m.Integer("0"))

