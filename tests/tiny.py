"""A tiny training configuration shared by the end-to-end tests (seconds per run on 2 CPU cores)."""

from jaxgossip.run.runner import TrainConfig


def tiny_config(**changes) -> TrainConfig:
    """4 nodes, synthetic data, an MLP(8), 20 rounds evaluated every 5; ``changes`` override fields."""
    base = TrainConfig(
        dataset="synthetic",
        num_nodes=4,
        model="mlp",
        model_options={"hidden": [8]},
        batch_size=8,
        num_rounds=20,
        eval_every=5,
        evals_per_chunk=1,
        lr=0.05,
        eval_size=128,
        eval_chunk=64,
    )
    return base.replace(**changes)


# The same run as command-line flags (lr and evals_per_chunk left at the CLI defaults).
TINY_FLAGS = [
    "--dataset=synthetic",
    "--num_nodes=4",
    "--model=mlp",
    "--model_options.hidden=8",
    "--batch_size=8",
    "--num_rounds=20",
    "--eval_every=5",
    "--eval_size=128",
    "--eval_chunk=64",
]

# Choco with top-k compression, the flags of the refusal tests on compressor options.
CHOCO_TOP_K = ["--algorithm=choco", "--algorithm_options.compressor=top_k"]
