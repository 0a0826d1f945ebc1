"""Native XLA:CPU kernels, compiled on first use and registered through the XLA FFI.

A few operations that XLA:CPU runs slowly (exact top-k selection, see
:mod:`jaxgossip.compress.selection`) have C++ versions in ``jaxgossip/compress/csrc/``. They are compiled once per
machine, jaxlib version and source on the first call that needs them (about 3 s, with the C++
compiler ``$CXX`` or ``c++`` and the FFI headers that jaxlib ships, ``jax.ffi.include_dir()``),
cached under ``$JAXGOSSIP_NATIVE_CACHE`` (default ``~/.cache/jaxgossip/native``), loaded with
``ctypes`` and registered with ``jax.ffi.register_ffi_target`` for the ``"cpu"`` platform.

Nothing depends on them: when no compiler is found or the build fails, :func:`load` returns a
:class:`NativeStatus` with ``available=False`` and the reason, a warning is issued once, and the
callers use XLA's own operations (same results, slower). ``JAXGOSSIP_NATIVE=0`` turns the native
kernels off without a warning. Accelerators never use them. On x86-64 the inner loops have AVX2
versions chosen at run time; ``JAXGOSSIP_NATIVE_AVX2=0`` (read once per process) keeps the portable
loops, with the same results (the tests run both).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from typing import NamedTuple

import jax

__all__ = ["NativeStatus", "load", "enabled", "SOURCE_DIR"]

SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
_SOURCES = ("top_k.cc", "fused_top_k.cc")
_HEADERS = ("select.h",)
# The handlers top_k.cc exports (one per dtype); jaxgossip.compress.selection calls them by these names.
_TARGETS = tuple(f"jaxgossip_{op}_{dtype}" for op in ("top_k", "top_k_dense") for dtype in ("f32", "bf16", "f16"))
# fused_top_k.cc: the fused top-k round with public copies (jaxgossip.compress.fused calls it).
_TARGETS += ("jaxgossip_fused_top_k_f32",)
# No FMA contraction: the kernels must round as XLA does (one rounding per operation).
_FLAGS = ("-O3", "-std=c++17", "-shared", "-fPIC", "-w", "-ffp-contract=off")


class NativeStatus(NamedTuple):
    """Whether the native kernels are registered, and why not.

    Attributes:
      available: the FFI targets are registered for the ``"cpu"`` platform.
      reason: empty when available; else what failed (no compiler, the compiler's error, ...).
      library: path of the shared library (empty when none was built).
    """

    available: bool
    reason: str = ""
    library: str = ""


_lock = threading.Lock()
_status: NativeStatus | None = None


def enabled() -> bool:
    """False when ``JAXGOSSIP_NATIVE`` is ``0`` / ``false`` / ``off`` / ``no``."""
    return os.environ.get("JAXGOSSIP_NATIVE", "1").strip().lower() not in ("0", "false", "off", "no")


def _cache_dir() -> str:
    root = os.environ.get("JAXGOSSIP_NATIVE_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "jaxgossip", "native")
    return root


def _library_path(compiler: str) -> str:
    digest = hashlib.sha256()
    for name in _SOURCES + _HEADERS:
        with open(os.path.join(SOURCE_DIR, name), "rb") as f:
            digest.update(f.read())
    # A library built against other FFI headers, by another compiler or for another machine is
    # not reused.
    import jaxlib

    for part in (jaxlib.__version__, compiler, platform.machine(), platform.system(), " ".join(_FLAGS)):
        digest.update(part.encode())
    return os.path.join(_cache_dir(), f"jaxgossip_native_{digest.hexdigest()[:16]}.so")


def _build(compiler: str, target: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    # Concurrent builders (pytest-xdist workers, several processes of one launch) each write a
    # private file and rename it into place; the rename is atomic, so a reader never sees half a file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
    os.close(fd)
    try:
        cmd = [compiler, *_FLAGS, "-I", jax.ffi.include_dir()]
        cmd += [os.path.join(SOURCE_DIR, name) for name in _SOURCES] + ["-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{proc.stderr[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _load() -> NativeStatus:
    if not enabled():
        return NativeStatus(False, "turned off by JAXGOSSIP_NATIVE=0")
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not compiler:
        return NativeStatus(False, "no C++ compiler found (set CXX or install g++)")
    try:
        path = _library_path(compiler)
        if not os.path.exists(path):
            _build(compiler, path)
        lib = ctypes.cdll.LoadLibrary(path)
        for name in _TARGETS:
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
    except Exception as err:  # any failure leaves the XLA path in place; say why once
        return NativeStatus(False, f"{type(err).__name__}: {err}")
    return NativeStatus(True, "", path)


def load() -> NativeStatus:
    """Builds (first time on this machine), loads and registers the native kernels, once per process.

    Returns the :class:`NativeStatus`; on failure warns once with the reason, unless turned off by
    ``JAXGOSSIP_NATIVE=0``.
    """
    global _status
    with _lock:
        if _status is None:
            _status = _load()
            if not _status.available and enabled():
                warnings.warn(
                    f"jaxgossip: native CPU kernels unavailable, using XLA's (same results, slower): {_status.reason}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return _status
