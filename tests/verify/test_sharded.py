"""Sharded training (issue 55): a DTensor's statistics describe the whole logical tensor, combined across its mesh
from each shard's partial statistics, never gathered (verify/capture/sharded_stats.py); FSDP2 and DTensor run on
the emulated devices (npu_port_emulation/sharding.py); an FSDP2 pair passes rank by rank, and a changed lr fails
naming lr."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import typer
from free_ports import free_port
from typer.testing import CliRunner

from verify.capture import sharded_stats
from verify.cli import app
from verify.cli.pair import route
from verify.devices import DEVICE_COUNT_VAR, emulation_env
from verify.record.store import read_run

SCRIPTS = Path(__file__).resolve().parent / "scripts"
# DTensor's public module and its RNG tracker's device state are torch 2.5's; FSDP2's public fully_shard torch 2.6's
PUBLIC_DTENSOR = pytest.mark.skipif(tuple(map(int, torch.__version__.split(".")[:2])) < (2, 5),
                                    reason="DTensor's public API and its RNG tracker's device state need torch 2.5")
ORIGINAL, PORT = SCRIPTS / "fsdp2_train.py", SCRIPTS / "fsdp2_train_npu.py"
RANKS = ["--nproc-per-node", "2", "--steps", "2", "-q"]


def statistics_of(values: torch.Tensor) -> dict[str, float]:
    """The definition: a tensor's statistics computed whole."""
    values = values.double()
    return {"min": values.min().item(), "max": values.max().item(), "mean": values.mean().item(),
            "l2_norm": values.norm().item(), "nan_count": 0, "inf_count": 0}


def test_partial_statistics_of_shards_combine_to_the_whole_tensors():
    whole = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    shards = [whole[:4], whole[4:], whole[:0]]  # uneven, and an empty shard
    gathered = torch.stack([torch.stack([sharded_stats.partials(shard)]) for shard in shards])
    row = sharded_stats.statistics_rows(sharded_stats.combine(gathered))[0].tolist()
    low, high, total, norm, nans, infs = row
    expected = statistics_of(whole)
    assert (low, high, nans, infs) == (expected["min"], expected["max"], 0, 0)
    assert math.isclose(total / whole.numel(), expected["mean"], rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(norm, expected["l2_norm"], rel_tol=1e-9)


def test_a_dtensors_record_describes_the_logical_tensor(tmp_path):
    """One rank holding the whole mesh: the record has the logical shape and the statistics of the tensor."""
    script = tmp_path / "one_rank.py"
    script.write_text(textwrap.dedent("""
        import json, os, torch, torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        try:
            from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor
        except ImportError:  # torch 2.4: DTensor is not public yet
            from torch.distributed._tensor import DTensor, Partial, Shard, distribute_tensor
        from verify.capture.tensor_stats import StatBatch, summarize
        dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{os.environ['PORT']}")
        mesh = init_device_mesh("cpu", (1,))
        values = torch.arange(12.0).reshape(3, 4)
        batch = StatBatch()
        with torch.no_grad():
            sharded = summarize(distribute_tensor(values, mesh, [Shard(0)]), batch)
            pending = summarize(DTensor.from_local(values * 2, mesh, [Partial()]), batch)
        fetched = batch.fetch()
        print("RESULT", json.dumps({"sharded": [sharded.shape, sharded.resolve(fetched)],
                                    "pending": [pending.shape, pending.resolve(fetched)]}))
        dist.destroy_process_group()
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PORT": free_port()})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    expected = statistics_of(torch.arange(12.0))
    assert result["sharded"][0] == "3x4"
    assert result["sharded"][1] == pytest.approx(expected)
    assert result["pending"] == ["3x4", pytest.approx(statistics_of(torch.arange(12.0) * 2))]  # this rank's own


def test_the_emulated_generator_gives_dtensor_a_philox_seed_and_offset_that_draws_again_when_set(tmp_path):
    script = tmp_path / "philox_npu.py"
    script.write_text(textwrap.dedent("""
        import json, torch, torch_npu
        torch.manual_seed(3)
        state = torch.npu.get_rng_state()
        from npu_port_emulation import device_api
        philox = device_api.GENERATOR.philox_state()
        shard = philox.clone(); shard.view(torch.int64)[1] += 8
        draws = []
        for _ in range(2):
            torch.npu.set_rng_state(shard)
            draws.append(torch.rand(4, generator=device_api.GENERATOR.generator).tolist())
        torch.npu.set_rng_state(philox)
        other = torch.rand(4, generator=device_api.GENERATOR.generator).tolist()
        torch.npu.set_rng_state(state)  # the whole state still round-trips
        print("RESULT", json.dumps({"philox": philox.view(torch.int64).tolist(), "draws": draws, "other": other}))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **emulation_env("cpu")})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["philox"] == [3, 0]  # the seed torch.manual_seed gave, the offset not moved yet
    assert result["draws"][0] == result["draws"][1] and result["draws"][0] != result["other"]


def run_emulated_npu(script: str, tmp_path: Path) -> dict:
    """`script` on the emulated NPU as rank 0 of 1 (torchrun's variables set): what it prints after RESULT."""
    path = tmp_path / "sharded_npu.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, **emulation_env("cpu"), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT ", 1)[1])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="a process's threads are read from /proc")
def test_the_emulated_npus_process_group_ends_with_destroy_process_group(tmp_path):
    """The emulation's numerics mode imported torch._dynamo at its first op, after the script's init_process_group,
    which then kept the gloo group standing in for hccl alive past destroy_process_group: at the exit its threads
    aborted a rank of the collectives test below 1 run in 20 (SIGABRT, "terminate called without an active
    exception")."""
    threads = tmp_path / "threads.json"
    env = {**os.environ, **emulation_env("cpu"), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}
    done = subprocess.run([sys.executable, str(SCRIPTS / "group_threads_after_destroy.py"), str(threads), "--npu"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not [name for name in json.loads(threads.read_text()) if "gloo" in name]


@PUBLIC_DTENSOR
def test_a_device_mesh_on_the_npu_starts_its_process_group_on_hccl_and_shards_there(tmp_path):
    """init_device_mesh starts the default process group itself, with its own import of init_process_group: it
    takes hccl (run as gloo), so distribute_tensor's scatter finds a backend for the tensors' device; c10d's
    broadcast asks the capability of a tensor transfer_to_npu calls a CUDA one, and is answered."""
    result = run_emulated_npu("""
        import json, torch, torch_npu
        from torch_npu.contrib import transfer_to_npu
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        mesh = init_device_mesh("npu", (1,))
        shard = distribute_tensor(torch.arange(4.0, device="npu"), mesh, [Shard(0)]).to_local()
        dist.broadcast(shard, 0)
        print("RESULT", json.dumps({"backend": dist.get_backend(), "shard": shard.tolist(),
                                    "script_capability": torch.cuda.get_device_capability()}))
        dist.destroy_process_group()
    """, tmp_path)
    assert result == {"backend": "hccl", "shard": [0.0, 1.0, 2.0, 3.0], "script_capability": None}


COLLECTIVES = """
    import json, torch, torch_npu
    import torch.distributed as dist
    dist.init_process_group("hccl")
    rank = dist.get_rank()
    x = torch.arange(4.0, device="npu") + 10 * rank
    gathered, scattered, averaged, exchanged = (torch.empty(n, device="npu") for n in (8, 2, 2, 4))
    dist.all_gather_into_tensor(gathered, x)
    dist.reduce_scatter_tensor(scattered, x.clone())
    dist.reduce_scatter_tensor(averaged, x.clone(), op=dist.ReduceOp.AVG)
    dist.all_to_all_single(exchanged, x.clone())
    if rank == 1:
        print("RESULT", json.dumps([t.tolist() for t in (gathered, scattered, averaged, exchanged)]))
    dist.destroy_process_group()
"""


def run_on_two_emulated_npus(script: str, tmp_path: Path) -> object:
    """`script` on 2 ranks of the emulated NPU (hccl run as gloo), launched by torchrun: what it prints after RESULT."""
    path = tmp_path / "ranks_npu.py"
    path.write_text(textwrap.dedent(script))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **emulation_env("cpu"), DEVICE_COUNT_VAR: "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT ", 1)[1])


@pytest.mark.slow
def test_the_collectives_fsdp2_and_dtensor_use_run_on_hccl_as_their_definitions_say(tmp_path):
    """all_gather_into_tensor, reduce_scatter_tensor (sum, average) and all_to_all_single on 2 ranks of the emulated
    NPU (hccl run as gloo), against their definitions for x = arange(4) + 10 * rank."""
    shards = [torch.arange(4.0) + 10 * rank for rank in (0, 1)]
    total = shards[0] + shards[1]
    expected = [torch.cat(shards).tolist(), total[2:].tolist(), (total[2:] / 2).tolist(),
                torch.cat([shards[0][2:], shards[1][2:]]).tolist()]
    assert run_on_two_emulated_npus(COLLECTIVES, tmp_path) == expected


HEADS_SHARDED_ATTENTION = """
    import json, torch, torch_npu
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("npu", (2,))
    torch.manual_seed(0)
    whole = [torch.randn(2, 4, 6, 8, device="npu", requires_grad=True) for _ in range(3)]
    by_heads = [distribute_tensor(tensor.detach(), mesh, [Shard(1)]).requires_grad_() for tensor in whole]
    expected, output = (F.scaled_dot_product_attention(*tensors, is_causal=True) for tensors in (whole, by_heads))
    (expected * torch.arange(8.0, device="npu")).sum().backward()
    (output.full_tensor() * torch.arange(8.0, device="npu")).sum().backward()
    differences = [(output.full_tensor() - expected).abs().max().item()]
    differences += [(shard.grad.full_tensor() - tensor.grad).abs().max().item()
                    for shard, tensor in zip(by_heads, whole)]
    if dist.get_rank() == 0:
        print("RESULT", json.dumps({"placements": str(output.placements), "differences": differences}))
    dist.destroy_process_group()
"""


@PUBLIC_DTENSOR
@pytest.mark.slow
def test_attention_sharded_by_heads_computes_each_ranks_heads_as_the_whole_attention_does(tmp_path):
    """pytorch/examples' FSDP2 + tensor-parallel Llama crashed every rank on the emulated devices: the CPU's fused
    attention kernel has no DTensor sharding rule (a GPU's has). Each rank computes its own heads' attention, forward
    and backward, as the whole tensors' attention does, and the output stays sharded by heads."""
    result = run_on_two_emulated_npus(HEADS_SHARDED_ATTENTION, tmp_path)
    assert result["placements"] == "(Shard(dim=1),)"
    assert max(result["differences"]) < 1e-5, result


@PUBLIC_DTENSOR
def test_dtensors_rng_tracker_draws_on_the_emulated_generator(tmp_path):
    """A sharded parameter initialised on the device (FSDP2's reset_parameters after to_empty) draws through DTensor's
    OffsetBasedRNGTracker, which reads the device generator's state as Philox's seed and offset."""
    result = run_emulated_npu("""
        import json, torch, torch_npu
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        from torch.distributed.tensor import _random
        mesh = init_device_mesh("npu", (1,))
        torch.manual_seed(0)
        weight = distribute_tensor(torch.zeros(6, 4, device="npu"), mesh, [Shard(0)])
        torch.nn.init.uniform_(weight)
        values = weight.to_local()
        print("RESULT", json.dumps([type(_random._rng_tracker).__name__, 0 <= values.min().item(),
                                    values.max().item() < 1, values.unique().numel()]))
    """, tmp_path)
    assert result == ["OffsetBasedRNGTracker", True, True, 24]


def test_the_emulated_streams_are_torch_streams_that_record_stream_takes(tmp_path):
    result = run_emulated_npu("""
        import json, torch, torch_npu
        stream = torch.npu.Stream()
        tensor = torch.ones(3, device="npu")
        tensor.record_stream(stream)
        tensor.record_stream(torch.npu.current_stream())
        print("RESULT", json.dumps([isinstance(stream, torch.Stream), stream.priority, stream.query()]))
    """, tmp_path)
    assert result == [True, 0, True]


def test_what_deepspeed_and_megatron_ask_of_the_device_is_the_emulated_devices(tmp_path):
    """DeepSpeed's accelerator makes buffers with the legacy tensor types (torch.npu.IntTensor) and its NPU op builders
    read ASCEND_HOME_PATH; Megatron's RNG tracker sets the device generator's state through default_generators."""
    result = run_emulated_npu("""
        import json, os, torch, torch_npu
        state = torch.npu.get_rng_state()
        first = torch.randn(3, device="npu").tolist()
        torch.npu.default_generators[0].set_state(state)
        again = torch.randn(3, device="npu").tolist()
        ints = torch.npu.IntTensor([1, 2])
        shaped = torch.npu.FloatTensor(2, 3)
        types = [isinstance(ints, torch.npu.IntTensor), isinstance(ints.float(), torch.npu.IntTensor)]
        print("RESULT", json.dumps([first == again, str(ints.dtype), ints.tolist(), list(shaped.shape), *types,
                                    os.path.isdir(os.environ["ASCEND_HOME_PATH"])]))
    """, tmp_path)
    assert result == [True, "torch.int32", [1, 2], [2, 3], True, False, True]


def test_a_model_built_on_meta_gets_device_memory_that_reads_zeros(tmp_path):
    """pytorch/examples' FSDP2 Transformer initialises only some of its parameters after to_empty: the others read
    what the memory held, the host's leftovers (NaN among them) on the emulated device, zeros as a device's fresh
    memory reads."""
    result = run_emulated_npu("""
        import json, torch, torch_npu
        with torch.device("meta"):
            model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
        model.to_empty(device="npu")
        print("RESULT", json.dumps([parameter.abs().max().item() for parameter in model.parameters()]))
    """, tmp_path)
    assert result == [0.0] * 16


def verify(*args: str | Path) -> tuple[int, str, dict]:
    argv = [str(arg) for arg in args]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    out = Path(argv[argv.index("-o") + 1])
    summary_file = out / "summary.json"
    return result.exit_code, result.output, json.loads(summary_file.read_text()) if summary_file.is_file() else {}


@pytest.fixture(scope="module")
def fsdp2_pair(tmp_path_factory) -> tuple[int, str, dict, Path]:
    out = tmp_path_factory.mktemp("fsdp2") / "pair"
    return (*verify(ORIGINAL, PORT, *RANKS, "-o", out), out)


@pytest.mark.slow
def test_an_fsdp2_port_passes_rank_by_rank(fsdp2_pair):
    code, output, summary, _ = fsdp2_pair
    assert code == 0, output
    assert [reason[:4] for reason in summary["ranks"]["verdicts"]] == ["PASS", "PASS"]
    assert "2 ranks (hccl run as gloo)" in summary["actual"]["title"]
    port_rank = read_run(fsdp2_pair[3] / "actual").ranks[0]
    assert "fully_shard's mesh device: the emulation target" in port_rank.manifest.extra["emulated_calls"]
    copy_in = port_rank.ops[port_rank.ops["op"] == "fsdp.all_gather_copy_in"]
    assert set(copy_in["io"]) == {"out0"}  # its all-gather output, not yet gathered, is no record


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory):
    """The FSDP2 script's model and batches trained in one process, without sharding."""
    out = tmp_path_factory.mktemp("unsharded") / "run"
    code, output, _ = verify("run", PORT, "--steps", "2", "-q", "-o", out, "--", "--unsharded")
    assert code == 0, output
    return read_run(out)


def assert_records_agree(sharded, unsharded) -> None:
    """Each gradient and update record of a rank (a whole parameter, its shards combined) as the unsharded run's."""
    assert sharded.grads["shape"].tolist() == ["16x8", "16", "4x16", "4"] * 2  # the logical shapes, not a shard's
    for column in ("min", "max", "mean", "norm", "nan_count"):
        assert sharded.grads[column].tolist() == pytest.approx(unsharded.grads[column].tolist(), rel=1e-4, abs=1e-7)
    updates = [run.ops[run.ops["op"] == "update"].reset_index() for run in (sharded, unsharded)]
    assert updates[0]["shape"].tolist() == updates[1]["shape"].tolist()
    for column in ("min", "max", "mean", "l2_norm"):
        assert updates[0][column].tolist() == pytest.approx(updates[1][column].tolist(), rel=1e-4, abs=1e-7)


@pytest.mark.slow
def test_a_sharded_parameters_statistics_agree_with_the_same_parameter_unsharded(fsdp2_pair, unsharded):
    """Every rank reads the same batches, so FSDP2's averaged gradients and Adam's updates are those of one process."""
    assert_records_agree(read_run(fsdp2_pair[3] / "actual").ranks[0], unsharded)


@pytest.mark.slow
def test_a_parameter_sharded_over_a_2d_mesh_agrees_with_it_unsharded_on_every_rank(unsharded, tmp_path):
    """FSDP2 over tensor parallel on 4 ranks: a weight split along the same dimension by both (a strided shard)
    combines over both mesh dimensions."""
    out = tmp_path / "mesh2d"
    code, output, _ = verify("run", PORT, "--nproc-per-node", "4", "--devices", "4", "--force", "--steps", "2", "-q",
                             "-o", out, "--", "--tensor-parallel")
    assert code == 0, output
    for rank in read_run(out).ranks:
        assert_records_agree(rank, unsharded)


@pytest.mark.slow
def test_an_fsdp2_port_with_another_lr_fails_naming_lr(fsdp2_pair, tmp_path):
    port = tmp_path / "fsdp2_train_npu.py"
    port.write_text(PORT.read_text().replace("lr=0.01", "lr=0.02"))
    code, output, summary = verify(ORIGINAL, port, *RANKS, "--ref-run", fsdp2_pair[3] / "ref", "-o", tmp_path / "o")
    assert code == 1, output
    assert "hyperparameter differs: lr 0.01 vs 0.02" in summary["reason"].splitlines()[0], summary["reason"]


@pytest.mark.slow
def test_an_fsdp2_port_with_another_mixed_precision_policy_fails_naming_it(fsdp2_pair, tmp_path):
    """A reduce_dtype of bfloat16 trains within bfloat16's noise of float32's on a tiny model: the policy of each
    module fully_shard made is a recorded setting, so the port fails naming it, not passing."""
    port = tmp_path / "fsdp2_train_npu.py"
    policy = "mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)"
    port.write_text(PORT.read_text().replace("import fully_shard", "import MixedPrecisionPolicy, fully_shard")
                    .replace("fully_shard(model, mesh=mesh)", f"fully_shard(model, mesh=mesh, {policy})"))
    code, output, summary = verify(ORIGINAL, port, *RANKS, "--ref-run", fsdp2_pair[3] / "ref", "-o", tmp_path / "o")
    assert code == 1, output
    assert ("hyperparameter differs: mp_policy.reduce_dtype None vs torch.bfloat16 in the model"
            in summary["reason"].splitlines()[0]), summary["reason"]


def test_a_failure_of_verifys_own_work_is_verifys_error_naming_where():
    """The reference's crash of issue 55 (shipping a step's statistics of DTensors) was read as the script's crash,
    then as a rank the launcher stopped: verify's own work fails as CaptureFailed, which the run records as verify's
    error (exit 2)."""
    from verify.capture.step_recorder import verifys_own
    from verify.errors import CaptureFailed, VerifyFailure

    with pytest.raises(CaptureFailed, match=r"^verify's capture failed at test_sharded\.py:\d+: RuntimeError: mixed"):
        with verifys_own():
            raise RuntimeError("mixed torch.Tensor and DTensor")
    assert issubclass(CaptureFailed, VerifyFailure)


@pytest.mark.slow
def test_a_functional_collective_is_recorded_once_its_values_arrived(tmp_path):
    """DTensor's all_gather_into_tensor returns its buffer before the collective filled it (wait_tensor completes
    it): recorded as allocated, it held the host's leftovers (NaN among them) on one side only. The gathered batch
    of sequence_parallel.py is a ramp from 0 to 1. Its process group, which init_device_mesh starts, is recorded as
    the device's backend run as gloo (it was not recorded: device_mesh calls init_process_group by its own name)."""
    out = tmp_path / "run"
    code, output, _ = verify("run", SCRIPTS / "sequence_parallel.py", *RANKS, "-o", out)
    assert code == 0, output
    assert read_run(out).manifest.process_group == {"backend": "nccl", "runs_as": "gloo"}  # a GPU script's
    assert "2 ranks (nccl run as gloo)" in output.replace("\n", "")
    for rank in read_run(out).ranks:
        gathered = rank.ops[(rank.ops["op"] == "_c10d_functional.all_gather_into_tensor")
                            & (rank.ops["module"] == "Sequential.0")]
        assert len(gathered) == 2 and gathered["shape"].eq("16x8").all()
        assert gathered["min"].tolist() == [0.0, 0.0] and gathered["max"].tolist() == [1.0, 1.0]
