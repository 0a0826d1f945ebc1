import time
import jax, jax.numpy as jnp, numpy as np
from jaxgossip import topology as tp
from jaxgossip.algorithms.power_gossip import _pair_tables, _half_step, _orth
H = jax.lax.Precision.HIGHEST

def slot_version(topo):
    host = _pair_tables(topo)
    tables = {k: jnp.asarray(getattr(host, k)[0]) for k in ("inc", "coef", "flat_a", "flat_b", "active")}
    def f(x, u, v):
        return _half_step(x, u, v, "right", None, tables["coef"], tables, True)
    return f, host

def gather_version(topo, host):
    a = jnp.asarray(host.a); b = jnp.asarray(host.b)
    pa, pb, wab, wba = topo.pairs
    w = jnp.asarray(wab[0], jnp.float32)
    n = topo.num_nodes
    def f(x, u, v):
        vh = _orth(v)
        d = x[b] - x[a]
        p = jnp.einsum('pmn,pnr->pmr', d, vh, precision=H)
        delta = jnp.einsum('pmr,pnr->pmn', p, vh, precision=H) * w[:, None, None]
        upd = jax.ops.segment_sum(delta, a, n) - jax.ops.segment_sum(delta, b, n)
        return x + upd, p, vh
    return f

for topo in (tp.ring(8), tp.torus(8, 8)):
    for (m, nn, r) in ((64, 576, 1), (64, 576, 4), (256, 2304, 1)):
        f1, host = slot_version(topo)
        f2 = gather_version(topo, host)
        N = topo.num_nodes; P = host.a.size
        x = jax.random.normal(jax.random.key(0), (N, m, nn))
        u = jax.random.normal(jax.random.key(1), (P, m, r))
        v = jax.random.normal(jax.random.key(2), (P, nn, r))
        res = []
        outs = []
        for name, f in (("slots", f1), ("gather", f2)):
            c = jax.jit(f).lower(x, u, v).compile()
            mem = c.memory_analysis()
            out = c(x, u, v); jax.block_until_ready(out)
            t0 = time.perf_counter()
            for _ in range(5):
                out = c(x, u, v)
            jax.block_until_ready(out)
            dt = (time.perf_counter() - t0) / 5
            outs.append(out)
            res.append(f"{name}: temp {mem.temp_size_in_bytes/1e6:.1f} MB, {dt*1e3:.1f} ms")
        err = float(jnp.abs(outs[0][0] - outs[1][0]).max())
        print(f"{topo.name} P={P} leaf {m}x{nn} r={r} (X = {x.nbytes/1e6:.1f} MB): " + "; ".join(res) + f"; max diff {err:.1e}")
