"""The LM family's one native kernel: 8-bit group-coded weights x 16-bit integer activations on the CPU (XLA FFI).

`quant.convert_params(params, "int8_a16")` decodes with it. XLA:CPU has no fast form of this product (its
int8 x int8 dot at one row ran slower than its fused int8-weight float32 dot; see the lm README), while a loop
over AVX-512 VNNI instructions (vpdpbusd) reads the codes at the machine's memory bandwidth at one row and runs
~65 GMAC/s at eight rows on 2 cores. Each activation is two int8 codes (x ~ (256 a1 + a2) d / 256 per group of
32), so every group's product is exact integer arithmetic; see `kernels/q8_matmul.cc` for the equations.

The source is compiled on first use with the system's C++ compiler (`$CXX`, else `g++`) against jaxlib's FFI
headers, into `$ICLR24_JAX_CACHE/native` (the project's cache root, default `~/.cache/iclr24_jax/native`; a
temporary folder when that is `off`), once per source, compiler, jax version and CPU (`-march=native`), in
~3 s; a CPU without AVX-512 VNNI gets the same file's plain C++ loop. Nothing is downloaded. The kernel splits
each product over its own threads (every core; `ICLR24_Q8_THREADS` sets the count), which spin briefly between
calls and then sleep.

`q8_matmul(x, q, scale, minimum)` is the entry point. Where the kernel cannot be used (another platform in the
lowering, no compiler, `ICLR24_NATIVE=0`) it computes the same arithmetic in XLA (`q8_matmul_reference`: the
same integer group dots, only the float summation order differs), so results agree to float rounding
everywhere; `unavailable_reason()` says why the kernel is not in use.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading

import jax
import jax.numpy as jnp

from iclr24_jax.common import compile_cache

GROUP = 32  # inputs per weight scale and per activation scale (the kernel's fixed block)
_SOURCE = os.path.join(os.path.dirname(__file__), "kernels", "q8_matmul.cc")
ENV_SWITCH = "ICLR24_NATIVE"   # 0 / off / false / no turns the kernel off (the XLA reference runs instead)

# Process-wide state: the library is built and its targets registered at most once per process (a second
# registration under the same name is an error in XLA).
_lock = threading.Lock()
_state: dict = {}


def _cache_dir() -> str:
  root = compile_cache.cache_root()
  if root is None:  # caches off: build into a folder of this process
    return _state.setdefault("tmp", tempfile.mkdtemp(prefix="iclr24_jax_native_"))
  return os.path.join(root, "native")


def _build() -> str:
  """Compiles the kernel if its cached library is missing; returns the library's path."""
  cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
  if not cxx:
    raise RuntimeError("no C++ compiler found (install g++ or set $CXX)")
  include = jax.ffi.include_dir()
  flags = ["-O3", "-march=native", "-std=c++20", "-shared", "-fPIC", "-w", f"-I{include}"]
  with open(_SOURCE, "rb") as f:
    source = f.read()
  import jaxlib
  key = hashlib.sha1(source + " ".join([cxx, jax.__version__, jaxlib.__version__, *flags[:-1]]).encode()
                     + _cpu_model().encode()).hexdigest()[:16]
  folder = _cache_dir()
  path = os.path.join(folder, f"q8_matmul-{key}.so")
  if os.path.exists(path):
    return path
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)  # build beside it, then rename: concurrent builders are safe
  os.close(fd)
  try:
    proc = subprocess.run([cxx, *flags, _SOURCE, "-o", tmp], capture_output=True, text=True)
    if proc.returncode:
      raise RuntimeError(f"{cxx} failed to compile {_SOURCE}:\n{proc.stderr[-2000:]}")
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return path


def _cpu_model() -> str:
  """The CPU's model name and feature flags (`-march=native` builds for them)."""
  found: dict[str, str] = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        name = line.split(":", 1)[0].strip()
        if name in ("model name", "flags") and name not in found:
          found[name] = line
        if len(found) == 2:
          break
  except OSError:
    pass
  return "".join(found.values())


def _load() -> None:
  with _lock:
    if _state:
      return
    if os.environ.get(ENV_SWITCH, "").strip().lower() in compile_cache.OFF_VALUES:
      _state["reason"] = f"{ENV_SWITCH}={os.environ[ENV_SWITCH]} turns it off"
      return
    try:
      lib = ctypes.cdll.LoadLibrary(_build())
      jax.ffi.register_ffi_target("iclr24_q8_matmul_affine", jax.ffi.pycapsule(lib.Q8MatmulAffine), platform="cpu")
      jax.ffi.register_ffi_target("iclr24_q8_matmul_symmetric", jax.ffi.pycapsule(lib.Q8MatmulSymmetric),
                                  platform="cpu")
      _state["lib"] = lib
      _state["vnni"] = bool(lib.q8_matmul_has_vnni())
    except Exception as e:  # noqa: BLE001 - any failure leaves the XLA reference in place, with the reason
      _state["reason"] = f"the native kernel did not build or load: {e}"
      logging.warning("iclr24_jax.lm.native: %s; int8_a16 matmuls run the (slower) XLA reference.", _state["reason"])


def available() -> bool:
  """Whether the compiled kernel is registered for the CPU (builds it on first call)."""
  _load()
  return "lib" in _state


def unavailable_reason() -> str | None:
  """None when the kernel is in use; otherwise why not (no compiler, switched off, a build error)."""
  _load()
  return _state.get("reason")


def has_vnni() -> bool:
  """Whether the compiled kernel uses AVX-512 VNNI (False: its portable C++ loop, or no kernel)."""
  return available() and _state["vnni"]


def quantize_activations(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per-row, per-32-input 16-bit integer codes of activations, exactly as the kernel rounds them.

  Two int8 codes per value (the kernel multiplies each with one VNNI instruction): a1 = round(x / d) and
  a2 = clip(round(256 (x / d - a1)), -127, 127), d = max|x| / 127 per group; c = 256 a1 + a2.

  Args:
    x: [R, I] float32, I a multiple of 32.

  Returns:
    (c int32 [R, I // 32, 32] in [-32639, 32639], step float32 [R, I // 32] = d / 256) with x ~ c * step
    (|x - c step| <= d / 512); 0 for an all-zero group.
  """
  r, i = x.shape
  xg = x.astype(jnp.float32).reshape(r, i // GROUP, GROUP)
  d = jnp.max(jnp.abs(xg), axis=-1) / 127.0
  inv = jnp.where(d > 0, 1.0 / jnp.where(d > 0, d, 1.0), 0.0)
  v = xg * inv[..., None]
  hi = jnp.round(v)
  lo = jnp.clip(jnp.round((v - hi) * 256.0), -127.0, 127.0)
  return 256 * hi.astype(jnp.int32) + lo.astype(jnp.int32), d / 256.0


def q8_matmul_reference(x: jax.Array, q: jax.Array, scale: jax.Array, minimum: jax.Array | None = None
                        ) -> jax.Array:
  """The kernel's arithmetic in XLA: 16-bit integer activations x 8-bit group codes, exact integer group dots.

  Args:
    x: [R, I] float activations.
    q: [O, I] uint8 codes (affine, with `minimum`) or int8 codes (symmetric, `minimum` None).
    scale: [O, I // 32] float32 weight scales.
    minimum: [O, I // 32] float32 group minimums (affine) or None.

  Returns:
    [R, O] float32 = sum_g scale step (q . c) + sum_g minimum * (sum of x over the group).
  """
  o, i = q.shape
  c, step = quantize_activations(x)
  qi = q.reshape(o, i // GROUP, GROUP).astype(jnp.int32)
  dots = jnp.einsum("rgk,ogk->rog", c, qi, preferred_element_type=jnp.int32).astype(jnp.float32)
  y = jnp.einsum("rog,og,rg->ro", dots, scale.astype(jnp.float32), step)
  if minimum is not None:
    xs = jnp.sum(x.astype(jnp.float32).reshape(x.shape[0], -1, GROUP), axis=-1)
    y = y + xs @ minimum.astype(jnp.float32).T
  return y


def q8_matmul(x: jax.Array, q: jax.Array, scale: jax.Array, minimum: jax.Array | None = None) -> jax.Array:
  """x @ W^T for 8-bit group codes W ~ q * scale (+ minimum), activations rounded to 16-bit integers per 32 inputs.

  The compiled CPU kernel where it is available (see the module docstring), the same arithmetic in XLA
  elsewhere (other platforms, no compiler). Inference only: it has no gradient.

  Args:
    x: [R, I] float activations (I a multiple of 32).
    q: [O, I] codes: uint8 with `minimum` (affine), or int8 without (symmetric).
    scale: [O, I // 32] float32.
    minimum: [O, I // 32] float32, or None.

  Returns:
    [R, O] float32.

  Raises:
    ValueError: shapes or code dtypes that do not fit together.
  """
  if x.ndim != 2 or q.ndim != 2 or x.shape[1] != q.shape[1] or q.shape[1] % GROUP:
    raise ValueError(f"q8_matmul expects x [R, I] and codes [O, I] with I a multiple of {GROUP}; got x {x.shape} "
                     f"and codes {q.shape}.")
  if scale.shape != (q.shape[0], q.shape[1] // GROUP) or (minimum is not None and minimum.shape != scale.shape):
    raise ValueError(f"q8_matmul: scale (and minimum) must be [O, I // {GROUP}] = "
                     f"{(q.shape[0], q.shape[1] // GROUP)}; got {scale.shape}"
                     f"{'' if minimum is None else f' and {minimum.shape}'}.")
  if (minimum is None) != (q.dtype == jnp.int8) or q.dtype not in (jnp.int8, jnp.uint8):
    raise ValueError(f"q8_matmul: uint8 codes take a minimum (affine), int8 codes none (symmetric); got "
                     f"{q.dtype} codes with minimum {'absent' if minimum is None else 'present'}.")
  x = x.astype(jnp.float32)
  scale = scale.astype(jnp.float32)
  if not available():
    return q8_matmul_reference(x, q, scale, minimum)
  out = jax.ShapeDtypeStruct((x.shape[0], q.shape[0]), jnp.float32)
  if minimum is None:
    call = jax.ffi.ffi_call("iclr24_q8_matmul_symmetric", out, vmap_method="sequential")
    args = (x, q, scale)
  else:
    call = jax.ffi.ffi_call("iclr24_q8_matmul_affine", out, vmap_method="sequential")
    args = (x, q, scale, minimum.astype(jnp.float32))
  reference = lambda *a: q8_matmul_reference(*a)  # noqa: E731 - the same signature as the call
  return jax.lax.platform_dependent(*args, cpu=call, default=reference)
