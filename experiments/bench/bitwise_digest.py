"""Digests of a fixed set of consensus, optimization and training runs, for bitwise comparisons.

Every registered algorithm runs (1) consensus on a graph it accepts, (2) its step driven by fixed
explicit keys (``steps/``: the rounds themselves, whatever key schedule a driver uses), (3)
decentralized optimization of per-node quadratics and (4) a short training run through the command
line on the embedded ``digits`` data; the script prints one SHA-256 per run, of the final iterates'
bytes (consensus, steps, optimization) or of the metrics rows without wall-clock fields (training).

It uses the public API and the command line only, so the same file can digest another checkout:

    PYTHONPATH=/path/to/other/checkout python experiments/bench/bitwise_digest.py --out a.json
    python experiments/bench/bitwise_digest.py --out b.json
    python experiments/bench/bitwise_digest.py --compare a.json b.json
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax

import jaxgossip as jg

N = 8
OPTIONS = {
    "gossip": {"gamma": 0.9},
    "choco": {"compressor": "top_k", "compressor_options": {"fraction": 0.25}, "gamma": 0.5},
    "deepsqueeze": {"compressor": "top_k", "compressor_options": {"fraction": 0.5}, "gamma": 0.2},
    "power_gossip": {"rank": 1, "num_iterations": 1, "gamma": 1.0},
    "sparse_push": {"fraction": 0.25, "gamma": 0.5},
    "scsp": {"fraction": 0.25, "gamma": 0.5},
    "d2": {"gamma": 0.5},
    "qgm": {"lr": 0.1},
    "moniqua": {"theta": 8.0, "bits": 8, "gamma": 0.5},
}
# Extra variants that take other code paths (the fused native top-k round needs a leaf of >= 2^12).
EXTRA = {
    "choco_sign": ("choco", {"compressor": "sign", "gamma": 0.2}),
    "power_gossip_r2": ("power_gossip", {"rank": 2, "num_iterations": 2}),
    "sparse_push_big": ("sparse_push", {"fraction": 0.01, "gamma": 1.0}),
    "scsp_big": ("scsp", {"fraction": 0.01, "gamma": 1.0}),
    "choco_big": ("choco", {"compressor": "top_k", "compressor_options": {"fraction": 0.01}, "gamma": 0.5}),
}


def digest(tree) -> str:
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        a = np.asarray(leaf)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def topology_for(name: str):
    info = jg.algorithms.info(name)
    graph = getattr(info, "graph", info)  # the graph facts, grouped or (another checkout) flat
    if graph.tree:  # RelaySum runs on trees only
        return jg.topology.binary_tree(N)
    return jg.topology.one_peer_exponential(N) if graph.mixing == "column_stochastic" else jg.topology.ring(N)


def build(name: str, options: dict):
    factory = jg.algorithms.REGISTRY[name]
    accepted = set(inspect.signature(factory).parameters)
    # the options an algorithm's defaults alone are refused without (its metadata; absent in
    # checkouts whose metadata has none)
    hooks = getattr(jg.algorithms.info(name), "hooks", None)
    options = {**dict(getattr(hooks, "example_options", None) or {}), **options}
    kwargs = {k: v for k, v in options.items() if k in accepted}
    return jg.algorithms.make(name, topology_for(name), **kwargs)


def x0_tree(big: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    tree = {"w": rng.normal(size=(N, 6, 5)), "b": rng.normal(size=(N, 7))}
    if big:
        tree["big"] = rng.normal(size=(N, 64, 96))
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), tree)


def runs():
    for name in sorted(jg.algorithms.REGISTRY):
        yield name, name, OPTIONS.get(name, {}), False
    for label, (name, options) in EXTRA.items():
        yield label, name, options, label.endswith("_big")


def consensus_digests() -> dict:
    out = {}
    for label, name, options, big in runs():
        alg = build(name, options)
        result = jg.run_consensus(alg, x0_tree(big), 30, jax.random.key(1))
        out[f"consensus/{label}"] = digest((result.x, result.error, result.bits))
    return out


def steps_digests() -> dict:
    """Every algorithm's step driven by the same explicit keys in any checkout (``split(key, 30)``
    through ``lax.scan``, not a driver's key schedule): the rounds themselves, bitwise."""
    out = {}
    for label, name, options, big in runs():
        alg = build(name, options)
        x0 = x0_tree(big)

        def body(carry, key, alg=alg):
            x, state = carry
            x, state, info = alg.step(x, state, key)
            return (x, state), info.bits

        (x, _), bits = jax.jit(lambda x0, keys, alg=alg, body=body: jax.lax.scan(body, (x0, alg.init(x0)), keys))(
            x0, jax.random.split(jax.random.key(1), 30)
        )
        out[f"steps/{label}"] = digest((x, bits))
    return out


def optimization_digests() -> dict:
    centers = x0_tree(False, seed=3)

    def loss_fn(params, node, key):
        del key
        c = jax.tree_util.tree_map(lambda leaf: leaf[node], centers)
        return sum(jnp.sum((p - q) ** 2) for p, q in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(c)))

    out = {}
    for label, name, options, big in runs():
        if big:
            continue
        alg = build(name, options)
        for ordering in ("atc", "same_iterate"):
            try:
                result = jg.run_optimization(
                    alg, x0_tree(False), loss_fn, optax.sgd(0.05), 20, jax.random.key(2), local_steps=2, ordering=ordering
                )
            except ValueError as err:  # an ordering the algorithm refuses
                out[f"optimization/{label}/{ordering}"] = f"refused: {str(err)[:60]}"
                continue
            out[f"optimization/{label}/{ordering}"] = digest((result.x, result.objective, result.consensus, result.bits))
    return out


# Row fields the digest leaves out: the measured wall time (varies between runs) and the simulated
# time model's columns (sim_time, comm_time and the cost report's comm_s / sim_s), whose formula
# and precision are the time model's, not the training's: the iterates, losses, accuracies and
# bits are compared.
_SCRUBBED = ("wall", "sim_", "comm_")


def scrub(row):
    """The row without its measured wall-clock and time-model fields (see _SCRUBBED)."""
    if isinstance(row, dict):
        return {k: scrub(v) for k, v in row.items() if not any(part in k for part in _SCRUBBED)}
    if isinstance(row, list):
        return [scrub(v) for v in row]
    return row


def training_digests() -> dict:
    out = {}
    names = sorted(jg.algorithms.REGISTRY)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            run_dir = os.path.join(tmp, name)
            hooks = getattr(jg.algorithms.info(name), "hooks", None)
            options = {**dict(getattr(hooks, "example_options", None) or {}), **OPTIONS.get(name, {})}
            opts = [f"--algorithm_options.{k}={json.dumps(v) if isinstance(v, dict) else v}" for k, v in options.items()]
            topo = topology_for(name).name.split("(")[0]
            cmd = [
                sys.executable, "-m", "jaxgossip.cli", "train", "--dataset=digits", "--model=mlp", f"--algorithm={name}",
                f"--topology={topo}", f"--num_nodes={N}", "--num_rounds=12", "--eval_every=6", "--batch_size=16",
                "--seed=3", f"--out={run_dir}", *opts,
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                out[f"train/{name}"] = f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
                continue
            with open(os.path.join(run_dir, "metrics.json")) as f:
                metrics = json.load(f)
            rows = metrics["rows"] if isinstance(metrics, dict) and "rows" in metrics else metrics
            out[f"train/{name}"] = hashlib.sha256(json.dumps(scrub(rows), sort_keys=True).encode()).hexdigest()[:16]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the digests to this JSON file")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two digest files and exit")
    parser.add_argument("--skip-train", action="store_true", help="consensus and optimization only")
    args = parser.parse_args()
    if args.compare:
        with open(args.compare[0]) as f:
            a = json.load(f)
        with open(args.compare[1]) as f:
            b = json.load(f)
        keys = sorted(set(a) & set(b))
        diff = [k for k in keys if a[k] != b[k]]
        for k in keys:
            print(f"{'DIFF' if k in diff else 'same'}  {k}  {a[k]}  {b[k]}")
        print(f"{len(keys) - len(diff)} of {len(keys)} digests equal")
        only = sorted(set(a) ^ set(b))
        if only:  # runs of algorithms one checkout does not have
            print(f"{len(only)} digests exist in one file only: {', '.join(only)}")
        sys.exit(1 if diff else 0)
    print(f"jaxgossip from {os.path.dirname(jg.__file__)}", file=sys.stderr)
    digests = {**consensus_digests(), **steps_digests(), **optimization_digests()}
    if not args.skip_train:
        digests.update(training_digests())
    for k, v in digests.items():
        print(k, v)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(digests, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
