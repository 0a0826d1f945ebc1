"""The suite shares compiled programs through JAX's persistent compilation cache (tests/conftest.py).
That is sound only if the cache keys on every setting that changes the compiled program: checked
here in a fresh process for the settings the suite changes (``jax_disable_most_optimizations``,
the ``fully_optimized`` fixture; the XLA_FLAGS of the classic emitters), the program itself, and the
device count of its sharding."""

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, os, sys
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

def entries():
    # this script's programs only (jnp.ones and friends compile small programs of their own)
    return sorted(n for n in os.listdir(sys.argv[1]) if n.startswith(("jit_f-", "jit_g-", "jit_h-")))

def compile_(fn, x):
    jax.clear_caches()  # the in-memory caches, so every compile asks the persistent one
    compiled = jax.jit(fn).lower(x).compile()
    return compiled, entries()

def f(x):
    return jnp.sin(x) @ x.T + 1

def g(x):
    return jnp.cos(x) @ x.T + 1

def h(x):
    return jnp.sin(x) * 2.0 + 1.0
x = jnp.ones((64, 64))
counts = {}
c0, e = compile_(f, x); counts["first"] = len(e)
c1, e = compile_(f, x); counts["again"] = len(e)
jax.config.update("jax_disable_most_optimizations", True)
_, e = compile_(f, x); counts["unoptimized"] = len(e)
jax.config.update("jax_disable_most_optimizations", False)
_, e = compile_(f, x); counts["optimized_again"] = len(e)
_, e = compile_(g, x); counts["other_program"] = len(e)
mesh = jax.make_mesh((2,), ("nodes",), devices=jax.devices()[:2])
xs = jax.device_put(x, NamedSharding(mesh, P("nodes")))
_, e = compile_(h, x); counts["elementwise"] = len(e)
_, e = compile_(h, xs); counts["two_devices"] = len(e)
mesh4 = jax.make_mesh((4,), ("nodes",))
x4 = jax.device_put(x, NamedSharding(mesh4, P("nodes")))
_, e = compile_(h, x4); counts["four_devices"] = len(e)
counts["same_result"] = bool(jnp.array_equal(c0(x), c1(x)))
counts["memory_analysis"] = c1.memory_analysis() is not None
print(json.dumps(counts))
"""


def test_the_persistent_cache_keys_on_the_settings_the_suite_changes(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "cache")], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    first = counts["first"]
    assert first >= 1
    assert counts["again"] == first, "the same program compiled again was not a cache hit"
    assert counts["unoptimized"] == first + 1, "jax_disable_most_optimizations does not change the key"
    assert counts["optimized_again"] == first + 1, "the optimized program was not found again"
    assert counts["other_program"] == first + 2
    assert counts["elementwise"] == first + 3
    assert counts["two_devices"] == first + 4 and counts["four_devices"] == first + 5, "the sharding is not keyed"
    assert counts["same_result"] and counts["memory_analysis"]


FLAG_SCRIPT = r"""
import os, sys
import jax, jax.numpy as jnp
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
jax.jit(lambda x: jnp.sin(x) @ x.T + 1).lower(jnp.ones((64, 64))).compile()
print(len([n for n in os.listdir(sys.argv[1]) if n.startswith("jit__lambda-")]))
"""


def test_the_persistent_cache_keys_on_xla_flags(tmp_path):
    def entries(flags):
        env = {**os.environ, "XLA_FLAGS": flags}
        done = subprocess.run(
            [sys.executable, "-c", FLAG_SCRIPT, str(tmp_path / "cache")],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return int(done.stdout.strip().splitlines()[-1])

    assert entries("") == 1
    assert entries("--xla_cpu_use_fusion_emitters=false") == 2, "XLA_FLAGS do not change the key"
    assert entries("--xla_cpu_use_fusion_emitters=false") == 2, "the same flags missed the cache"
    assert entries("") == 2
