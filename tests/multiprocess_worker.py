"""One process of the multi-process test (tests/run/test_multiprocess.py starts two of them with
``jaxgossip.run.launch``): trains through the ``jaxgossip train`` command with the node axis over all
processes' devices (5 rounds, then resumed from the checkpoint to 10), then runs a sharded
consensus; process 0 saves the consensus result.

  python tests/multiprocess_worker.py OUT_DIR
"""

import sys

import jax
import numpy as np

import jaxgossip as jg
from jaxgossip.cli import main as cli_main
from jaxgossip.ops import sharding
from jaxgossip.run import distributed

# (the same arguments build the single-process reference in the test)
TRAIN_ARGS = [
    "--dataset=synthetic",
    "--num_nodes=8",
    "--model=mlp",
    "--model_options.hidden=[8]",
    "--batch_size=8",
    "--eval_every=5",
    "--evals_per_chunk=1",
    "--lr=0.05",
    "--eval_size=64",
    "--eval_chunk=32",
    "--topology=ring",
    "--algorithm=gossip",
]
CONSENSUS_STEPS = 12


def consensus_x0() -> dict:
    rng = np.random.default_rng(1)
    return {"w": rng.normal(size=(8, 4, 3)).astype(np.float32), "b": rng.normal(size=(8, 6)).astype(np.float32)}


def consensus(x0):
    alg = jg.algorithms.make("gossip", jg.topology.ring(8), gamma=1.0)
    return jg.run_consensus(alg, x0, CONSENSUS_STEPS, jax.random.key(0))


def main(out: str) -> int:
    distributed.initialize_from_env()
    train = ["train", *TRAIN_ARGS, f"--devices={jax.device_count()}", "--no-progress", "--out", f"{out}/train"]
    # Half the rounds, then the same command with all of them: the second run restores the orbax
    # checkpoint on every process and continues.
    for rounds in (5, 10):
        status = cli_main([*train, f"--num_rounds={rounds}"])
        if status:
            return status
    mesh = sharding.node_mesh(8)
    result = consensus(sharding.shard_nodes(consensus_x0(), mesh, 8))
    host = sharding.to_host({"error": result.error, "x": result.x})
    print(f"process {jax.process_index()} of {jax.process_count()}, {jax.device_count()} devices: consensus done")
    if distributed.is_primary():
        np.savez(f"{out}/consensus.npz", error=host["error"], bits=result.bits, w=host["x"]["w"], b=host["x"]["b"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
