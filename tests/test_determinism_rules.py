"""Whole scripts through the determinism rules: seeds and switches land in the process that trains."""

import ast
import subprocess
import sys
import textwrap

from migrate.engine import migrate_source
from rules import select_rules
from rules import Mode, Settings

DET = select_rules(["DET"])

SPAWN = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader

    def worker(rank, world_size):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        loader = DataLoader(dataset, batch_size=8, num_workers=2)
        for x in loader:
            model(x).sum().backward()

    if __name__ == "__main__":
        mp.spawn(worker, args=(2,), nprocs=2)
    """
)


def port(source: str, **settings) -> str:
    result = migrate_source(source, "train.py", Settings(**settings), DET)
    ast.parse(result.code)
    assert migrate_source(result.code, "train.py", Settings(**settings), DET).code == result.code, "not idempotent"
    return result.code


def function_body(code: str, name: str) -> list[str]:
    function = next(n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.FunctionDef) and n.name == name)
    return [ast.unparse(statement) for statement in function.body]


def test_spawned_worker_is_seeded_and_deterministic_before_the_process_group():
    code = port(SPAWN, seed=3, deterministic=True, mode=Mode.EXPLICIT)
    body = function_body(code, "worker")
    init = next(i for i, text in enumerate(body) if "init_process_group" in text)
    for line in ("os.environ.setdefault('HCCL_DETERMINISTIC', 'true')",
                 "os.environ.setdefault('CLOSE_MATMUL_K_SHIFT', '1')", "torch.use_deterministic_algorithms(True)",
                 "random.seed(3)", "torch.manual_seed(3)", "torch.npu.manual_seed_all(3)"):
        assert body.index(line) < init
    main_guard = code[code.index('if __name__'):]
    assert "seed" not in main_guard and "deterministic" not in main_guard


def test_loader_gets_generator_and_worker_seeding_once():
    code = port(SPAWN, seed=3)
    assert "worker_init_fn=seed_worker, generator=torch.Generator().manual_seed(3)" in " ".join(code.split())
    assert code.count("def seed_worker(") == 1


def test_without_seed_an_unseeded_trainer_is_reported_and_left_alone():
    result = migrate_source(SPAWN, "train.py", Settings(), DET)
    assert result.code == SPAWN
    assert [f.code for f in result.findings] == ["DET001"]


OWN_SEED = textwrap.dedent(
    """
    import argparse
    import random
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=None)


    def main():
        args = parser.parse_args()
        if args.seed is not None:
            torch.manual_seed(args.seed)
        loader = torch.utils.data.DataLoader(list(range(8)), batch_size=4, shuffle=True, num_workers=0)
        print(loader.generator is None, [batch.tolist() for batch in loader], random.random())


    if __name__ == "__main__":
        main()
    """
)


def test_every_inserted_seed_is_the_scripts_own_and_follows_its_guard(tmp_path):
    """`--seed 7` is not used where the script has a seed: python's generator and the loader's take `args.seed`,
    and without a seed the port runs as the original does (no generator), instead of crashing on
    `manual_seed(None)`."""
    code = port(OWN_SEED, seed=7)
    assert "7" not in code
    assert "random.seed(args.seed)" in code
    assert "generator=torch.Generator().manual_seed(args.seed) if args.seed is not None else None" in code
    script = tmp_path / "train_npu.py"
    script.write_text(code, encoding="utf-8")

    def run(*arguments: str) -> str:
        done = subprocess.run([sys.executable, str(script), *arguments], capture_output=True, text=True, check=True)
        return done.stdout

    assert run().startswith("True ")
    seeded = run("--seed", "5")
    assert seeded.startswith("False ") and seeded == run("--seed", "5")
