from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Case, Flag, PortRule, Unchanged, dotted_name, matches

# Functions whose result order is whatever the file system gives.
_LISTINGS = {"os.listdir", "os.scandir", "glob.glob", "glob.iglob"}
# Path methods with the same property; the receiver's type is unknown, so these are matched by method name.
_PATH_METHODS = {"glob", "rglob", "iterdir"}
# Consumers for which order does not matter: wrapping their argument in sorted() would be noise.
_ORDER_FREE = {"sorted", "len", "set", "frozenset", "any", "all", "sum", "max", "min", "bool", "Counter"}
_METHOD = m.Attribute(attr=m.Name())


class UnsortedFileListing(PortRule):
    """Sort file lists read from the file system (listdir, glob, scandir, Path.glob/rglob/iterdir).

    ## What it does
    Wraps `os.listdir(...)`, `glob.glob(...)`, `glob.iglob(...)`, `os.scandir(...)` and the `Path` methods
    `.glob()`, `.rglob()`, `.iterdir()` in `sorted(...)` (`os.scandir` by entry name), unless their result goes straight
    into an order-free consumer (`sorted`, `len`, `set`, `any`, a membership test...). `os.walk` loops are reported:
    sort `dirs` in place and iterate `sorted(files)`.

    ## Why
    Python documents these results as being in arbitrary, file-system dependent order. A dataset built from them,
    and above all a shard `files[rank::world_size]`, then differs between the GPU machine and the NPU machine, so the
    two trainings see different data and their losses cannot be compared (checklist C7).

    ## Safety
    Safe: only the order changes, to a reproducible one. Apply the same change to the original script so that both
    sides read files in one order. `iglob` and `scandir` become lists (read eagerly).

    ## References
    Python docs of os.listdir (<https://docs.python.org/3/library/os.html#os.listdir>) and glob.glob
    (<https://docs.python.org/3/library/glob.html>).
    """

    CODE = "DATA001"
    CHECKLIST = ("C7",)
    TRIGGERS = ("listdir", "glob", "iterdir", "scandir", "walk")
    EXAMPLES = (
        Case(
            """
            import os, glob
            files = os.listdir(root)  # images
            shards = glob.glob(f"{root}/*.tar")[rank::world_size]
            for entry in os.scandir(root):
                pass
            """,
            """
            import os, glob
            files = sorted(os.listdir(root))  # images
            shards = sorted(glob.glob(f"{root}/*.tar"))[rank::world_size]
            for entry in sorted(os.scandir(root), key=lambda entry: entry.name):
                pass
            """,
            lines=[2, 3, 4],
        ),
        Case(
            """
            from pathlib import Path
            from glob import iglob as find
            images = [p for p in Path(root).rglob("*.jpg")]
            masks = list(find("masks/*.png"))
            """,
            """
            from pathlib import Path
            from glob import iglob as find
            images = [p for p in sorted(Path(root).rglob("*.jpg"))]
            masks = list(sorted(find("masks/*.png")))
            """,
            lines=[3, 4],
        ),
        Flag(
            """
            import os
            for folder, dirs, names in os.walk(root):
                samples.extend(names)
            """,
            lines=[2],
        ),
        Unchanged(
            """
            import os, glob
            files = sorted(os.listdir(root))
            count = len(glob.glob("*.py"))
            exists = "train" in os.listdir(root)
            unique = set(os.listdir(root))
            images = sorted(os.path.join(root, n) for n in os.listdir(root) if n.endswith(".jpg"))
            names = {entry.name for entry in os.scandir(root)}
            matches = pattern.glob("x")  # a regex-like object, not a call on a Path we can see
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._order_free: set[cst.CSTNode] = set()  # listing calls whose consumer ignores order

    def visit_Call(self, node: cst.Call) -> None:
        if dotted_name(node.func) in _ORDER_FREE or self.refers_to(node.func, "collections.Counter"):
            for arg in node.args:
                self._order_free.add(arg.value)
                if isinstance(arg.value, (cst.GeneratorExp, cst.ListComp, cst.SetComp)):
                    self._order_free.update(_iterated(arg.value))

    def visit_SetComp(self, node: cst.SetComp) -> None:
        self._order_free.update(_iterated(node))

    def visit_Comparison(self, node: cst.Comparison) -> None:
        for target in node.comparisons:
            if matches(target.operator, m.In() | m.NotIn()):
                self._order_free.add(target.comparator)

    def visit_For(self, node: cst.For) -> None:
        if self._listing(node.iter) == "os.walk":
            self.report(
                node.iter,
                "os.walk yields folders and files in file-system order",
                "Sort in the loop: `dirs.sort()` and iterate `sorted(files)`, so every machine sees one order.",
            )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        listing = self._listing(original_node)
        if listing is None or listing == "os.walk" or original_node in self._order_free:
            return updated_node
        key = ", key=lambda entry: entry.name" if listing == "os.scandir" else ""
        code = cst.Module([]).code_for_node(updated_node)
        sorted_call = cst.parse_expression(f"sorted({code}{key})")
        return self.replace(
            original_node,
            updated_node,
            sorted_call,
            f"sorted the result of {listing}() (file-system order differs between machines)",
            "Sort the same list in the original script too, so both sides read files in one order.",
        )

    def _listing(self, node: cst.BaseExpression) -> str | None:
        """Which listing function `node` calls, if any."""
        if not isinstance(node, cst.Call):
            return None
        if self.refers_to(node.func, *_LISTINGS, "os.walk"):  # resolved only where a name could be one
            return min(self.qualified_names(node.func) & (_LISTINGS | {"os.walk"}))
        if matches(node.func, _METHOD) and node.func.attr.value in _PATH_METHODS:  # type: ignore
            receiver = node.func.value  # type: ignore[attr-defined]
            if self._looks_like_path(receiver):
                return f"Path.{node.func.attr.value}"  # type: ignore[attr-defined]
        return None

    def _looks_like_path(self, receiver: cst.BaseExpression) -> bool:
        """A receiver built by Path(...)/PurePath(...), or any name whose text says path/dir/root/folder."""
        if isinstance(receiver, cst.Call):
            return bool(self.qualified_names(receiver.func) & {"pathlib.Path", "pathlib.PurePath"}) or (
                isinstance(receiver.func, cst.Attribute) and receiver.func.attr.value in {"joinpath", "resolve"}
            )
        text = cst.Module([]).code_for_node(receiver).lower()
        return any(hint in text for hint in ("path", "dir", "root", "folder"))


def _iterated(comprehension: cst.BaseComp) -> list[cst.BaseExpression]:
    """What the `for ... in X` clauses of a comprehension iterate over."""
    iterated, clause = [], comprehension.for_in
    while clause is not None:
        iterated.append(clause.iter)
        clause = clause.inner_for_in
    return iterated
