"""Shared test helpers: NumPy references of the update and bit rules, input builders, tree
comparisons and the command-line helpers (in-process and subprocess runs, one-line refusals). Every
reference is written from the equations in docs/algorithms.md with explicit loops (float64),
independent of the library's kernels; the tests import from here instead of keeping private copies
(``tests/`` is on ``sys.path`` through pytest's rootdir conftest)."""

import functools
import importlib.util
import json
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgossip as jg
from jaxgossip import compress
from jaxgossip import topology as tp

# ---------------------------------------------------------------- input builders


def load_script(relpath):
    """Imports a script of the repository (e.g. ``"experiments/gpu_suite.py"``) as a module; its
    folder is on ``sys.path`` while it loads, for scripts that import a sibling (``_common.py``)."""
    import sys

    path = pathlib.Path(__file__).resolve().parent.parent / relpath
    name = path.stem
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def node_normal(n, shapes, seed=0, *, offset=0.0, dtype=np.float32):
    """``{name: [n, *shape]}`` NumPy draws of N(offset, 1) from ``default_rng(seed)``, in the order
    of ``shapes`` (a mapping name -> per-node shape), cast to ``dtype`` (``None`` keeps float64, e.g.
    to convert each leaf to a low-precision JAX dtype in one rounding)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        value = rng.standard_normal((n,) + tuple(shape))
        if offset:
            value = value + offset
        out[name] = value if dtype is None else value.astype(dtype)
    return out


def read_json(path):
    """The parsed JSON file at ``path`` (the CLI's outputs)."""
    with open(path) as f:
        return json.load(f)


def to_jax(tree):
    """Every leaf as a JAX array (the library's inputs)."""
    return jax.tree.map(jnp.asarray, tree)


def weighted_digraph(n, seed=0):
    """A random strongly connected digraph (``random_directed(n, 0.35, seed)``) with random
    (non-uniform) column-stochastic weights."""
    rng = np.random.default_rng(seed)
    base = tp.random_directed(n, 0.35, seed=seed).matrix(0)
    m = (base > 0) * rng.uniform(0.2, 1.0, size=base.shape)
    return tp.from_matrix(m / m.sum(axis=0, keepdims=True), name=f"weighted_digraph({seed})")


def column_stochastic_graphs(n):
    """Column-stochastic test graphs of the push-sum family, built on demand: name -> factory."""
    return {
        "one_peer_exponential": lambda: tp.one_peer_exponential(n),
        "random_directed": lambda: tp.random_directed(n, 0.35, seed=3),
        "directed_ring": lambda: tp.directed_ring(n),
        # time-varying with self weights that change from round to round
        "schedule": lambda: tp.schedule([tp.random_directed(n, 0.35, seed=s) for s in (0, 1)]),
    }


def static_graphs_16():
    """Static N = 16 graphs of different degrees (slots kernel)."""
    return [tp.ring(16), tp.torus(4, 4), tp.hypercube(16), tp.exponential(16), tp.erdos_renyi(16, 0.3, seed=2)]


def compressed_gossip_graphs():
    """The 8-node graphs of the Choco / DeepSqueeze references, built on demand: name -> factory."""
    return {
        "ring": lambda: tp.ring(8),
        "torus": lambda: tp.torus(2, 4),  # side 2: merged double edges (weight 2/5)
        "exponential": lambda: tp.exponential(8),  # directed, out-degree 3
    }


def column_stochastic_only():
    """Column stochastic but not row stochastic: push-sum weights on a path 0 - 1 - 2."""
    adj = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]])
    return tp.from_adjacency(adj, weights="column")


# ---------------------------------------------------------------- comparisons


def assert_tree_close(got, want, rtol=1e-5, atol=1e-5, *, by_dtype=None, atol_scale=1.0, same_dtype=False):
    """Same tree structure and every leaf close. ``by_dtype`` maps the dtype name of ``got``'s leaf
    to ``{"rtol", "atol"}`` (overriding ``rtol``/``atol``), ``atol_scale`` multiplies atol,
    ``same_dtype`` also requires equal dtypes and shapes. Leaves narrower than float32 (bfloat16,
    float16) are compared as float32; float32 / float64 leaves as they are."""
    got_leaves, got_def = jax.tree_util.tree_flatten_with_path(got)
    want_leaves, want_def = jax.tree_util.tree_flatten(want)
    assert got_def == want_def, (got_def, want_def)

    def widen(leaf):
        leaf = np.asarray(leaf)
        return leaf if leaf.dtype.itemsize >= 4 else leaf.astype(np.float32)

    for (keypath, g), w in zip(got_leaves, want_leaves):
        if same_dtype:
            assert g.dtype == w.dtype and g.shape == w.shape
        tol = by_dtype[np.dtype(g.dtype).name] if by_dtype is not None else {"rtol": rtol, "atol": atol}
        np.testing.assert_allclose(
            widen(g),
            widen(w),
            rtol=tol["rtol"],
            atol=tol["atol"] * atol_scale,
            err_msg=jax.tree_util.keystr(keypath),
        )


# ---------------------------------------------------------------- compressors and bit rules


def top_k_count(size, fraction):
    """Entries kept by top-k / Sparse-Push at ``fraction``: max(1, floor(fraction * size))."""
    return max(1, math.floor(fraction * size))


def index_bits(size):
    """Bits of one index into a leaf of ``size`` entries ("log2" rule): max(1, ceil(log2 size))."""
    return max(1, math.ceil(math.log2(size)))


def np_top_k(v, kept):
    """The ``kept`` entries of largest magnitude (ties: lowest flat index first), the rest zero;
    same shape as ``v``."""
    flat = np.asarray(v).reshape(-1)
    idx = np.argsort(-np.abs(flat), kind="stable")[:kept]
    out = np.zeros_like(flat)
    out[idx] = flat[idx]
    return out.reshape(np.shape(v))


def np_top_k_message(v, fraction):
    """Top-k at ``fraction`` with log2 indices: (dense values, bits = kept (32 + index bits))."""
    kept = top_k_count(v.size, fraction)
    return np_top_k(v, kept), kept * (32 + index_bits(v.size))


def np_sign(v):
    """Scaled sign: (mean |v| * sign(v), bits = one bit per entry + a float32 scale)."""
    return np.abs(v).sum() / v.size * np.sign(v), v.size + 32


# NumPy compressor -> the library's (name, options), for the Choco / DeepSqueeze references.
NP_COMPRESSORS = {
    "top_k": (lambda v: np_top_k_message(v, 0.25), ("top_k", {"fraction": 0.25})),
    "sign": (np_sign, ("sign", {})),
}


def np_out_degree(w):
    """Receivers of each sender j: nonzero off-diagonal entries of column j of W."""
    off = (w != 0) & ~np.eye(w.shape[0], dtype=bool)
    return off.sum(axis=0)


# ---------------------------------------------------------------- push-sum family
# docs/algorithms.md, sections push_sum, sparse_push and scsp


PUSH_N = 8
PUSH_SHAPES = {"a": (3, 4), "b": (5,)}  # two leaves: D = 12 + 5 = 17


def push_x0(seed=0, offset=0.0):
    """The push-sum family's inputs: ``node_normal(PUSH_N, PUSH_SHAPES, seed, offset=offset)``."""
    return node_normal(PUSH_N, PUSH_SHAPES, seed, offset=offset)


def node_average(x0):
    """The average over nodes of every leaf, in float64."""
    return {k: v.astype(np.float64).mean(axis=0) for k, v in x0.items()}


def node_sums(x):
    """The sum over nodes of every leaf, in float64 (the mass push-sum conserves)."""
    return {k: np.asarray(v, np.float64).sum(axis=0) for k, v in x.items()}


def debias_error(alg, x, state, x0):
    """max |x_i / w_i - mean(x0)| over nodes and entries."""
    z = alg.debias(x, state)
    avg = node_average(x0)
    return max(float(np.max(np.abs(np.asarray(z[k]) - avg[k]))) for k in avg)


def row_stochastic_only():
    """Row stochastic but not column stochastic (strongly connected), 3 nodes."""
    return tp.from_matrix(np.array([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.0, 0.5, 0.5]]))


def np_push_sum(topo, x0, rounds):
    """Push-sum (SGP): per-node loop over in-neighbours; returns (x, w, bits [rounds, N]) with one
    message of 32 D + 32 bits (values and weight) per out-neighbour."""
    n = topo.num_nodes
    x = {k: v.astype(np.float64).copy() for k, v in x0.items()}
    w = np.ones(n)
    d = sum(math.prod(v.shape[1:]) for v in x0.values())
    bits = []
    for t in range(rounds):
        wt = topo.matrix(t)
        new_x = {k: np.zeros_like(v) for k, v in x.items()}
        new_w = np.zeros(n)
        for i in range(n):
            for j in range(n):
                if wt[i, j] != 0:
                    for k in x:
                        new_x[k][i] += wt[i, j] * x[k][j]
                    new_w[i] += wt[i, j] * w[j]
        x, w = new_x, new_w
        degree = np_out_degree(wt)
        bits.append([degree[j] * (32 * d + 32) for j in range(n)])
    return x, w, np.array(bits)


def np_copy_table(topo, mode):
    """Public-copy index per round of the period: one per distinct matrix, or 0 when ``shared``."""
    if mode == "shared":
        return [0] * topo.period
    distinct, table = [], []
    for t in range(topo.period):
        m = topo.matrix(t)
        for p, d in enumerate(distinct):
            if np.array_equal(m, d):
                table.append(p)
                break
        else:
            distinct.append(m)
            table.append(len(distinct) - 1)
    return table


def np_sparse_push(topo, x0, rounds, gamma, fraction, mode="per_graph", tau=None, max_boost=1):
    """Per-node loop of the Sparse-Push round (and SCSP's adaptive budget when tau is given);
    returns (x, w, bits [rounds, N])."""
    n = topo.num_nodes
    table = np_copy_table(topo, mode)
    num_copies = max(table) + 1
    x = {k: v.astype(np.float64).reshape(n, -1).copy() for k, v in x0.items()}
    w = np.ones(n)
    x_hat = {k: np.zeros((num_copies,) + v.shape) for k, v in x.items()}
    s = {k: np.zeros((num_copies,) + v.shape) for k, v in x.items()}
    bits = []
    for t in range(rounds):
        wt = topo.matrix(t)
        p = table[t % topo.period]
        payload = np.zeros(n)
        q = {}
        for k in x:
            size = x[k].shape[1]
            base = top_k_count(size, fraction)
            q[k] = np.zeros_like(x[k])
            for i in range(n):
                r = x[k][i] - x_hat[k][p, i]
                kept = base
                if tau is not None:
                    rho = np.linalg.norm(r) / np.linalg.norm(x[k][i])
                    kept = int(np.clip(math.ceil(base * rho / tau), base, min(size, max_boost * base)))
                q[k][i] = np_top_k(r, kept)
                payload[i] += kept * (32 + index_bits(size))
            x_hat[k][p] += q[k]
            for i in range(n):
                for j in range(n):
                    if j != i and wt[i, j] != 0:
                        s[k][p, i] += wt[i, j] * q[k][j]
            for i in range(n):
                x[k][i] += gamma * (s[k][p, i] + wt[i, i] * x_hat[k][p, i] - x_hat[k][p, i])
        new_w = w.copy()
        for i in range(n):
            mu = sum(wt[i, j] * w[j] for j in range(n) if j != i)
            new_w[i] = w[i] + gamma * (mu + wt[i, i] * w[i] - w[i])
        w = new_w
        degree = np_out_degree(wt)
        bits.append([degree[j] * (payload[j] + 32) for j in range(n)])
    x = {k: v.reshape(x0[k].shape) for k, v in x.items()}
    return x, w, np.array(bits)


# ---------------------------------------------------------------- ResNet-20 shapes
# docs/training.md, section training recipes and models

# Choco variant with 1x1-conv downsample: 22 matrices (conv kernels viewed as [out, in * kh * kw])
# holding 270,896 parameters and 43 vectors holding 1,578: 21 batch norms (after conv1; 2 per block
# in 9 blocks; one per downsample in stages 2 and 3), each with a scale and a bias, plus the fc bias.
RESNET20_MATRICES = (
    [(16, 27)]
    + [(16, 144)] * 6
    + [(32, 144), (32, 16)]
    + [(32, 288)] * 5
    + [(64, 288), (64, 32)]
    + [(64, 576)] * 5
    + [(10, 64)]
)
RESNET20_VECTORS = [16] * 14 + [32] * 14 + [64] * 14 + [10]


def resnet20_tree(num_nodes):
    """ResNet-20 parameter sizes as a stacked pytree of zeros: leaves p00..p21 are the matrices,
    p22..p64 the vectors (tree order = this order)."""
    shapes = list(RESNET20_MATRICES) + [(d,) for d in RESNET20_VECTORS]
    return {f"p{i:02d}": jnp.zeros((num_nodes,) + shape, jnp.float32) for i, shape in enumerate(shapes)}


# ---------------------------------------------------------------- drivers


@functools.cache
def _split_keys():
    # Concrete even when first asked for inside a jit trace (a cached tracer would leak into the
    # next test that uses it).
    with jax.ensure_compile_time_eval():
        return jax.random.split(jax.random.key(0), 32)  # one PRNG compile per session


def split_keys(rounds):
    """The first ``rounds`` (<= 32) keys of ``split(key(0), 32)``."""
    return _split_keys()[:rounds]


def key_range(rounds):
    """``key(t)`` for t < rounds."""
    return [jax.random.key(t) for t in range(rounds)]


def fold_in_keys(rounds, key=None):
    """``fold_in(key, t)`` for t < rounds (key defaults to ``key(0)``)."""
    key = jax.random.key(0) if key is None else key
    return [jax.random.fold_in(key, t) for t in range(rounds)]


def run_rounds(alg, x0, keys):
    """One jitted ``alg.step`` per key from ``alg.init(x0)``, x0 converted to JAX arrays.
    Returns (final x, final state, bits [rounds, N] as NumPy)."""
    step = jax.jit(alg.step)
    x = to_jax(x0)
    state = alg.init(x)
    bits = []
    for key in keys:
        x, state, info = step(x, state, key)
        bits.append(np.asarray(info.bits))
    return x, state, np.array(bits)


def consensus_error_ratio(alg, x0, num_steps=300):
    """Consensus error after ``num_steps`` rounds of ``run_consensus`` (key 0) over the initial one."""
    result = jg.run_consensus(alg, to_jax(x0), num_steps, jax.random.key(0))
    error = np.asarray(result.error)
    return error[-1] / error[0]


# ---------------------------------------------------------------- contract checks


def check_compressed_gossip_validation(factory, label):
    """The validation errors of a compressed-gossip factory (``choco`` / ``deepsqueeze``, named
    ``label`` in its messages): gamma, mixing weights, topology type, compressor specs, node axis."""
    ring = tp.ring(8)
    for bad in (0.0, -0.5):
        with pytest.raises(ValueError, match="gamma=.* must be > 0"):
            factory(ring, gamma=bad)
    with pytest.raises(ValueError, match="gamma=.* must be finite"):
        factory(ring, gamma=float("nan"))
    with pytest.raises(ValueError, match=f"{label} needs doubly stochastic mixing weights"):
        factory(column_stochastic_only())
    with pytest.raises(TypeError, match=f"{label} needs a jaxgossip Topology"):
        factory(np.eye(3))
    with pytest.raises(ValueError, match=rf"{label}: unknown compressor 'nope'; known compressors: \['identity'"):
        factory(ring, compressor="nope")
    with pytest.raises(ValueError, match=f"{label}: unknown compressor"):
        factory(ring, compressor={"name": "nope"})
    with pytest.raises(ValueError, match="needs a 'name' key"):
        factory(ring, compressor={"fraction": 0.1})
    with pytest.raises(ValueError, match="only apply when the compressor is given by name"):
        factory(ring, compressor=compress.sign(), compressor_options={"k": 1})
    with pytest.raises(ValueError, match=r"option\(s\) \['k'\] given both"):
        factory(ring, compressor={"name": "top_k", "k": 1}, compressor_options={"k": 2})
    with pytest.raises(ValueError, match="top_k fraction=2.0 is out of range"):
        factory(ring, compressor="top_k", compressor_options={"fraction": 2.0})
    with pytest.raises(TypeError, match="compressor 'sign' does not take option"):
        factory(ring, compressor="sign", compressor_options={"fraction": 0.1})
    with pytest.raises(TypeError, match="compressor must be a Compressor, a name or a spec mapping"):
        factory(ring, compressor=3)
    with pytest.raises(TypeError, match="compressor_options must be a mapping"):
        factory(ring, compressor="top_k", compressor_options=[("k", 1)])
    with pytest.raises(ValueError, match="leading node axis of size N=8"):
        factory(ring).init({"w": jnp.zeros((3, 2))})


def fast_compile_vars(env=None) -> dict:
    """The environment variables that make a subprocess compile like the in-process tests, without
    XLA's expensive backend optimizations and with XLA:CPU's classic emitters (tests/conftest.py),
    the latter added to the XLA_FLAGS of ``env`` (default: this process's); none with
    JAXGOSSIP_TEST_OPTIMIZE=1."""
    import os

    if os.environ.get("JAXGOSSIP_TEST_OPTIMIZE", "0") == "1":
        return {}
    flags = (os.environ if env is None else env).get("XLA_FLAGS", "")
    if "xla_cpu_use_fusion_emitters" not in flags:
        flags = f"{flags} --xla_cpu_use_fusion_emitters=false".strip()
    return {"JAX_DISABLE_MOST_OPTIMIZATIONS": "1", "XLA_FLAGS": flags}


def fast_compile_env(env=None) -> dict:
    """``env`` (default: this process's) plus :func:`fast_compile_vars`, for a subprocess compared
    with this process's results or checked to tolerances only (SIGKILL-and-resume, CLI commands)."""
    import os

    base = os.environ if env is None else env
    return {**base, **fast_compile_vars(base)}


def start_cli(command: str, argv, out, env):
    """``python -m jaxgossip.cli COMMAND ARGV --out OUT`` as a subprocess (text pipes), so several
    commands can run side by side; read them with ``proc.communicate(timeout=...)``."""
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "jaxgossip.cli", command, *argv, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def run_cli(*argv, env=None):
    """``python -m jaxgossip.cli ARGV`` as a subprocess compiling like the in-process tests
    (:func:`fast_compile_env` of ``env``); returns ``(exit status, stdout, stderr)``."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "jaxgossip.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=fast_compile_env(env),
    )
    return proc.returncode, proc.stdout, proc.stderr


def call_cli(capsys, *argv):
    """``jaxgossip ARGV`` in this process (``jaxgossip.cli.main``); returns ``(exit status, stdout,
    stderr)``. The process-level exit (no traceback from ``python -m jaxgossip.cli``) is checked once per
    command by tests/cli/test_cli_config.py."""
    from jaxgossip.cli import main

    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_refused(rc, stderr, *parts):
    """Exit 2, no traceback, and one error line holding every one of ``parts``; returns that line."""
    assert rc == 2, stderr
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, stderr
    for part in parts:
        assert part in errors[0], errors[0]
    return errors[0]


def run_main(capsys, *argv):
    """``jaxgossip ARGV`` in-process: ``(exit status, stdout, stderr)``."""
    from jaxgossip.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(capsys) -> str:
    """What an in-process ``main`` wrote to stderr, checked to be one line, without its newline."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return err.strip()


def assert_finite(value, what):
    """``value`` is a finite Python number (``what`` names it in the failure)."""
    assert isinstance(value, (int, float)) and math.isfinite(value), (what, value)


def file_hashes(folder) -> dict:
    """SHA-256 of every file under ``folder``, keyed by its path relative to ``folder``."""
    import hashlib
    import os

    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


def readme_plugin() -> str:
    """The README's complete plug-in file (section "Adding an algorithm"): ``my_file.py``, whose
    ``damped_gossip`` the README names as ``my_file:damped_gossip``."""
    text = (pathlib.Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = text.split("### Adding an algorithm", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def assert_identity_compressor_is_gossip(factory, gamma, n, shapes):
    """``factory(ring(n), gamma=gamma)`` with its default identity compressor computes exactly what
    gossip with the same gamma computes, and sends the same bits (10 rounds)."""
    topo = tp.ring(n)
    x0 = node_normal(n, shapes, 3)
    x, _, bits = run_rounds(factory(topo, gamma=gamma), x0, split_keys(10))
    ref, _, ref_bits = run_rounds(jg.algorithms.make("gossip", topo, gamma=gamma), x0, split_keys(10))
    assert_tree_close(x, ref)
    np.testing.assert_array_equal(bits, ref_bits)


# ---------------------------------------------------------------- robust aggregation and attacks
# Receiver i reads m_ji = x_j from each in-neighbour j (W[i, j] != 0, j != i) unless the dict
# ``msgs[(j, i)]`` replaces it (what an attacker j sends to i). Models are flat float64 [N, D].


def in_neighbours(w, i):
    """In-neighbours of receiver i (W[i, j] != 0, j != i), ascending."""
    return [j for j in range(w.shape[0]) if j != i and w[i, j] != 0]


def flat(x):
    """Node i's whole model as one float64 vector, per node: [N, D]."""
    return np.concatenate(
        [np.asarray(leaf, np.float64).reshape(leaf.shape[0], -1) for leaf in jax.tree_util.tree_leaves(x)], 1
    )


def unflat(v, like):
    out, start = [], 0
    leaves, treedef = jax.tree_util.tree_flatten(like)
    for leaf in leaves:
        size = int(np.prod(leaf.shape[1:]))
        out.append(v[:, start : start + size].reshape(leaf.shape))
        start += size
    return jax.tree_util.tree_unflatten(treedef, out)


def ref_clipped(w, x, msgs=None, tau=None, num_clipped=1):
    """x_i + sum_j W_ij clip(m_ji - x_i, tau_i); m_ji = x_j unless ``msgs[(j, i)]`` replaces it.
    Adaptive tau_i: the (num_clipped + 1)-th largest distance (the smallest with fewer neighbours)."""
    msgs = msgs or {}
    out = x.copy()
    for i in range(x.shape[0]):
        nbrs = in_neighbours(w, i)
        if not nbrs:
            continue
        diffs = {j: msgs.get((j, i), x[j]) - x[i] for j in nbrs}
        dist = {j: np.linalg.norm(d) for j, d in diffs.items()}
        if tau is None:
            ranked = sorted(dist.values(), reverse=True)
            radius = ranked[min(num_clipped, len(ranked) - 1)]
        else:
            radius = tau
        for j in nbrs:
            scale = min(1.0, radius / dist[j]) if dist[j] > 0 else 1.0
            out[i] = out[i] + w[i, j] * scale * diffs[j]
    return out


def neighbourhood(w, x, msgs, i):
    """[m_i, D]: x_i and what i receives from each in-neighbour."""
    return np.stack([x[i]] + [msgs.get((j, i), x[j]) for j in in_neighbours(w, i)])


def ref_trimmed(w, x, msgs=None, trim=1):
    msgs = msgs or {}
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        v = np.sort(neighbourhood(w, x, msgs, i), axis=0)
        m = v.shape[0]
        b = min(trim, (m - 1) // 2)
        out[i] = v[b : m - b].mean(axis=0)
    return out


def ref_median(w, x, msgs=None):
    msgs = msgs or {}
    return np.stack([np.median(neighbourhood(w, x, msgs, i), axis=0) for i in range(x.shape[0])])


def ref_gossip(w, x, msgs=None):
    msgs = msgs or {}
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        out[i] = w[i, i] * x[i] + sum(w[i, j] * msgs.get((j, i), x[j]) for j in in_neighbours(w, i))
    return out


def irregular_graph():
    """Metropolis weights on a graph with degrees 2..5 (not node-symmetric); it stays connected
    without nodes 3 and 6."""
    edges = [(0, 1), (1, 2), (2, 3), (3, 0), (1, 3), (3, 4), (4, 5), (5, 6), (6, 4), (3, 6), (6, 7), (2, 8)]
    edges += [(8, 9), (7, 9), (5, 0), (8, 4)]
    adj = np.zeros((10, 10))
    for a, b in edges:
        adj[a, b] = adj[b, a] = 1
    return tp.from_adjacency(adj, name="irregular(10)")


def clock_equals_simulate(topo, net, algorithm: str):
    """Runs 6 rounds of consensus of ``algorithm`` on ``topo`` under ``net`` (the compiled float32
    clock), asserts that cost.simulate of the run's recorded bits (float64, host) gives the same
    per-round comm and round times, and returns that :class:`~jaxgossip.sim.cost` result."""
    import jax

    import jaxgossip as jg
    from jaxgossip.sim import timing
    from jaxgossip.sim.cost import simulate

    alg = jg.algorithms.make(algorithm, topo)
    time = timing.time_model(topo, net, algorithm=algorithm)
    x0 = {"x": jax.random.normal(jax.random.key(0), (topo.num_nodes, 100))}
    result = jg.run_consensus(alg, x0, 6, jax.random.key(1), time=time)
    priced = simulate(np.asarray(result.node_bits, np.float64), topo, net, allreduce=algorithm == "allreduce")
    np.testing.assert_allclose(np.asarray(result.comm_time)[1:], np.cumsum(priced.comm_time), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(result.sim_time)[1:], np.cumsum(priced.round_time), rtol=1e-6)
    return priced


def timed_tiny_run(**time):
    """tests/tiny.py's run on 8 nodes for 10 rounds with ``--time.*`` = ``time`` (compute 0.01 s
    unless given): a :class:`jaxgossip.run.runner.RunResult`."""
    from tiny import tiny_config

    from jaxgossip.run.runner import run_training

    config = tiny_config(num_nodes=8, num_rounds=10, time={"compute": 0.01, **time})
    return run_training(config, progress=False, log=lambda _: None)


def assert_only_the_clock_differs(fast, slow):
    """``slow`` (a :func:`timed_tiny_run`) took longer in simulated time from the first round on,
    while its iterates, losses and bits are ``fast``'s bit for bit: the clock never changes them."""
    import jax

    assert np.all(np.asarray(slow.metrics.sim_time)[1:] > np.asarray(fast.metrics.sim_time)[1:])
    same = fast.state._replace(clock=None), slow.state._replace(clock=None)
    for a, b in zip(*(jax.tree_util.tree_leaves(s) for s in same), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(fast.metrics.test_loss), np.asarray(slow.metrics.test_loss))
    np.testing.assert_array_equal(np.asarray(fast.metrics.bits), np.asarray(slow.metrics.bits))
