"""Linear measurement operators with an exact singular value decomposition (SVD) interface.

A measurement is y = A x + sigma * n. Every operator here factorises A = U S V^H with orthonormal (unitary)
bases, in the style of DDRM's `H_functions` (Kawar et al. 2022), which the official FPS code reuses
(`guided_diffusion/svd_replacement.py`):

  vt(x)  -> x's coordinates in the V basis          [..., n]   (n = prod(x_shape); complex for the FFT blurs)
  v(xs)  -> back to x space                          [..., *x_shape]
  ut(y)  -> y's coordinates in the U basis          [..., m]   (m = size of the measurement space)
  u(ys)  -> back to y space                          [..., *y_shape]
  singular_values                                    [r]        r <= min(m, n), spectral pair j < r:
                                                                (U^H A x)_j = s_j (V^H x)_j
and A x = u(pad(s * vt(x)[..., :r])). All methods act on the trailing x_shape / y_shape axes and accept any
leading batch axes (particles). The closed-form Gaussian conditioning of FPS (`smc.gaussian_condition`) only
needs these pieces, and it is exact for every operator because the bases are orthonormal.

Operators:
  Inpainting(mask)                      y = mask * x (kept in image shape, zeros where unobserved); V = a
                                        permutation putting observed pixels first, s = 1.
  SuperResolution(factor, shape)        y = f x f average pooling (DDRM's `SuperResolution`); per block V
                                        is an orthonormal f^2 x f^2 basis whose first vector is ones / f,
                                        s = 1 / f.
  GaussianBlur(kernel_size, std, shape) y = k (*) x, CIRCULAR (periodic) convolution, diagonalised by the
  MotionBlur(kernel_size, shape, ...)   unitary 2-D DFT: V = F^H, U = F^H diag(phase(k^)), s = |k^|.
  CircularBlur(kernel, shape)           the same for any kernel.
  Dense(A)                              any matrix A [m, n] on vectors (numpy SVD, float64, once).

Boundary condition (blurs): periodic. The official code uses DDRM's separable `Deblurring` (a zero-padded
"same" Toeplitz convolution per axis whose SVD is computed numerically); periodic convolution has the same
interior behaviour and an exact FFT SVD with no O(n^3) decomposition, at the price of wrap-around at the
image border. Deviation: documented in README.md.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def _concrete(x, what: str) -> np.ndarray:
  try:
    return np.asarray(x)
  except jax.errors.TracerArrayConversionError as e:
    raise ValueError(f"{what} must be a concrete array (build operators outside jit; pass them in as "
                     "arguments, they are pytrees).") from e


class LinearOperator:
  """Base class: a pytree (array leaves + static aux) with generic methods built on the SVD pieces.

  Subclasses set `_leaf_fields`, `_aux_fields` and implement forward, adjoint, vt, v, ut, u and
  `singular_values`; `x_shape`, `y_shape` are static tuples.
  """

  _leaf_fields: tuple[str, ...] = ()
  _aux_fields: tuple[str, ...] = ()
  is_complex: bool = False

  # -- pytree --------------------------------------------------------------------------------------
  def tree_flatten(self):
    """Pytree flattening: (array leaves of `_leaf_fields`, static aux of `_aux_fields`)."""
    return (tuple(getattr(self, f) for f in self._leaf_fields),
            tuple(getattr(self, f) for f in self._aux_fields))

  @classmethod
  def tree_unflatten(cls, aux, leaves):
    """Pytree unflattening: rebuilds the operator from aux and leaves without running __init__."""
    obj = object.__new__(cls)
    for f, val in zip(cls._leaf_fields, leaves):
      setattr(obj, f, val)
    for f, val in zip(cls._aux_fields, aux):
      setattr(obj, f, val)
    return obj

  def __repr__(self) -> str:
    return f"{type(self).__name__}(x_shape={self.x_shape}, y_shape={self.y_shape}, rank<={self.rank})"

  # -- sizes ---------------------------------------------------------------------------------------
  @property
  def x_size(self) -> int:
    """n = prod(x_shape)."""
    return int(np.prod(self.x_shape))

  @property
  def y_size(self) -> int:
    """m = number of measurement-space coordinates (U's size)."""
    return int(np.prod(self.y_shape))

  @property
  def rank(self) -> int:
    """r = number of spectral pairs (singular values, some may be 0)."""
    return int(self.singular_values.shape[0])

  # -- interface (subclasses) ----------------------------------------------------------------------
  @property
  def singular_values(self) -> jax.Array:  # pragma: no cover - abstract
    raise NotImplementedError

  def forward(self, x: jax.Array) -> jax.Array:  # pragma: no cover - abstract
    """A x: x [..., *x_shape] -> y [..., *y_shape]."""
    raise NotImplementedError

  def adjoint(self, y: jax.Array) -> jax.Array:  # pragma: no cover - abstract
    """A^T y: y [..., *y_shape] -> [..., *x_shape]."""
    raise NotImplementedError

  def vt(self, x: jax.Array) -> jax.Array:  # pragma: no cover - abstract
    """V^T x: x [..., *x_shape] -> spectral coordinates [..., n] (the first r pair with the singular values)."""
    raise NotImplementedError

  def v(self, xs: jax.Array) -> jax.Array:  # pragma: no cover - abstract
    """V xs: spectral coordinates [..., n] -> [..., *x_shape] (inverse of `vt`)."""
    raise NotImplementedError

  def ut(self, y: jax.Array) -> jax.Array:  # pragma: no cover - abstract
    """U^T y: y [..., *y_shape] -> measurement-space coordinates [..., m] (m = y_size)."""
    raise NotImplementedError

  def u(self, ys: jax.Array) -> jax.Array:  # pragma: no cover - abstract
    """U ys: measurement-space coordinates [..., m] -> [..., *y_shape] (inverse of `ut` on the measurement space)."""
    raise NotImplementedError

  # -- generic -------------------------------------------------------------------------------------
  def _batch(self, x: jax.Array, shape: tuple[int, ...], what: str) -> tuple[int, ...]:
    nd = len(shape)
    if x.ndim < nd or tuple(x.shape[x.ndim - nd:]) != tuple(shape):
      raise ValueError(f"{type(self).__name__}: {what} must end in shape {tuple(shape)}, got {tuple(x.shape)}.")
    return tuple(x.shape[:x.ndim - nd])

  def forward_svd(self, x: jax.Array) -> jax.Array:
    """A x through the SVD pieces: u(s * vt(x)[:r]) (equals `forward`; used to test the factorisation)."""
    xs = self.vt(x)
    r = self.rank
    ys = self.singular_values.astype(xs.dtype) * xs[..., :r]
    pad = self.y_size - r
    if pad:
      ys = jnp.concatenate([ys, jnp.zeros(ys.shape[:-1] + (pad,), ys.dtype)], -1)
    return self.u(ys)

  def project_noise(self, z: jax.Array) -> jax.Array:
    """Keeps the part of white noise z [..., *y_shape] that lies in the measurement space (u(ut(z)))."""
    return self.u(self.ut(z))

  def measure(self, key: jax.Array, x: jax.Array, sigma: float) -> jax.Array:
    """y = A x + sigma n with n white in the measurement space [..., *y_shape].

    Args:
      key: PRNG key of the noise.
      x: [..., *x_shape] clean signals.
      sigma: noise std.

    Returns:
      y [..., *y_shape] float32.
    """
    z = jax.random.normal(key, tuple(x.shape[:x.ndim - len(self.x_shape)]) + tuple(self.y_shape), jnp.float32)
    return self.forward(x) + sigma * self.project_noise(z)

  def matrix(self) -> jax.Array:
    """The dense matrix [prod(y_shape), n] (for tests and exact posteriors on small problems)."""
    eye = jnp.eye(self.x_size, dtype=jnp.float32).reshape((self.x_size,) + tuple(self.x_shape))
    return self.forward(eye).reshape(self.x_size, -1).T

  def pseudo_inverse(self, y: jax.Array, rcond: float = 1e-3) -> jax.Array:
    """A^+ y through the SVD (singular values below rcond * max(s) are dropped) [..., *x_shape].

    Args:
      y: [..., *y_shape] measurements.
      rcond: relative cutoff on the singular values.

    Returns:
      [..., *x_shape] least-squares, minimum-norm reconstruction.
    """
    ys = self.ut(y)
    s = self.singular_values
    keep = s > rcond * jnp.max(s)
    inv = jnp.where(keep, 1.0 / jnp.where(keep, s, 1.0), 0.0).astype(ys.dtype)
    xs_r = inv * ys[..., :self.rank]
    pad = self.x_size - self.rank
    if pad:
      xs_r = jnp.concatenate([xs_r, jnp.zeros(xs_r.shape[:-1] + (pad,), xs_r.dtype)], -1)
    return self.v(xs_r)


# ------------------------------------------------------------------------------------------- inpainting


@jax.tree_util.register_pytree_node_class
class Inpainting(LinearOperator):
  """y = mask * x: observed pixels are kept, the others are 0 (the official/DPS convention, image-shaped y).

  SVD: V^H x = x[perm] with the observed pixels first; U^H y = y[observed]; s = 1 (r = number observed).

  Args:
    mask: [*x_shape] (or broadcastable to `shape`) 0/1 or bool, 1 = observed. Must be concrete.
    shape: optional x shape to broadcast the mask to (e.g. a [H, W, 1] mask for [H, W, C] images).
  """

  _leaf_fields = ("mask", "perm", "inv_perm")
  _aux_fields = ("x_shape", "num_observed")

  def __init__(self, mask, shape: Sequence[int] | None = None):
    m = _concrete(mask, "the inpainting mask")
    if shape is not None:
      m = np.broadcast_to(m, tuple(shape))
    if not np.all((m == 0) | (m == 1)):
      raise ValueError("the inpainting mask must hold only 0/1 (or booleans).")
    flat = m.reshape(-1).astype(bool)
    obs = np.flatnonzero(flat)
    unobs = np.flatnonzero(~flat)
    perm = np.concatenate([obs, unobs]).astype(np.int32)
    self.mask = jnp.asarray(m, jnp.float32)
    self.perm = jnp.asarray(perm)
    self.inv_perm = jnp.asarray(np.argsort(perm).astype(np.int32))
    self.x_shape = tuple(int(d) for d in m.shape)
    self.num_observed = int(obs.size)

  @property
  def y_shape(self) -> tuple[int, ...]:
    return self.x_shape

  @property
  def y_size(self) -> int:
    return self.num_observed

  @property
  def singular_values(self) -> jax.Array:
    return jnp.ones((self.num_observed,), jnp.float32)

  def forward(self, x):
    """A x: x [..., *x_shape] -> y [..., *y_shape]."""
    self._batch(x, self.x_shape, "x")
    return self.mask * x

  def adjoint(self, y):
    """A^T y: y [..., *y_shape] -> [..., *x_shape]."""
    self._batch(y, self.y_shape, "y")
    return self.mask * y

  def vt(self, x):
    """V^T x: x [..., *x_shape] -> spectral coordinates [..., n] (the first r pair with the singular values)."""
    b = self._batch(x, self.x_shape, "x")
    return jnp.take(x.reshape(b + (-1,)), self.perm, axis=-1)

  def v(self, xs):
    """V xs: spectral coordinates [..., n] -> [..., *x_shape] (inverse of `vt`)."""
    b = xs.shape[:-1]
    return jnp.take(xs, self.inv_perm, axis=-1).reshape(b + self.x_shape)

  def ut(self, y):
    """U^T y: y [..., *y_shape] -> measurement-space coordinates [..., m] (m = y_size)."""
    b = self._batch(y, self.y_shape, "y")
    return jnp.take(y.reshape(b + (-1,)), self.perm[:self.num_observed], axis=-1)

  def u(self, ys):
    """U ys: measurement-space coordinates [..., m] -> [..., *y_shape] (inverse of `ut` on the measurement space)."""
    b = ys.shape[:-1]
    pad = jnp.zeros(b + (self.x_size - self.num_observed,), ys.dtype)
    return jnp.take(jnp.concatenate([ys, pad], -1), self.inv_perm, axis=-1).reshape(b + self.y_shape)

  def measure(self, key, x, sigma):
    """y = mask * (x + sigma n): noise only on observed pixels.

    Args:
      key: PRNG key of the noise.
      x: [..., *x_shape] clean images.
      sigma: noise std.

    Returns:
      y [..., *x_shape] (zero at masked pixels).
    """
    z = jax.random.normal(key, x.shape, jnp.float32)
    return self.mask * (x + sigma * z)


# ------------------------------------------------------------------------------------ super-resolution


def _block_basis(factor: int) -> np.ndarray:
  """An orthonormal f^2 x f^2 basis (columns) whose first column is ones / f (float64)."""
  k = factor * factor
  a = np.eye(k)
  a[:, 0] = 1.0
  q, _ = np.linalg.qr(a)
  if q[0, 0] < 0:
    q[:, 0] = -q[:, 0]
  return q


def _image_shape(shape: Sequence[int], what: str) -> tuple[int, ...]:
  shape = tuple(int(d) for d in shape)
  if len(shape) not in (2, 3) or min(shape) < 1:
    raise ValueError(f"{what}: shape must be (H, W) or (H, W, C), got {shape}.")
  return shape


@jax.tree_util.register_pytree_node_class
class SuperResolution(LinearOperator):
  """y = average pooling over factor x factor blocks: [H, W(, C)] -> [H/f, W/f(, C)].

  This is DDRM's `SuperResolution` (the operator the official FPS code builds its SVD from). Per block the row
  of A is ones / f^2 (norm 1 / f): V's first block vector is ones / f, s = 1 / f, U = identity on y.

  Args:
    factor: f >= 1, dividing H and W.
    shape: x shape (H, W) or (H, W, C).
  """

  _leaf_fields = ("basis",)
  _aux_fields = ("factor", "x_shape")

  def __init__(self, factor: int, shape: Sequence[int]):
    shape = _image_shape(shape, "SuperResolution")
    factor = int(factor)
    if factor < 1 or shape[0] % factor or shape[1] % factor:
      raise ValueError(f"SuperResolution: factor {factor} must be >= 1 and divide H and W of {shape}.")
    self.factor = factor
    self.x_shape = shape
    self.basis = jnp.asarray(_block_basis(factor), jnp.float32)

  @property
  def _c(self) -> int:
    return self.x_shape[2] if len(self.x_shape) == 3 else 1

  @property
  def y_shape(self) -> tuple[int, ...]:
    h, w = self.x_shape[0] // self.factor, self.x_shape[1] // self.factor
    return (h, w) + tuple(self.x_shape[2:])

  @property
  def singular_values(self) -> jax.Array:
    return jnp.full((self.y_size,), 1.0 / self.factor, jnp.float32)

  def _blocks(self, x):
    """[..., H, W(, C)] -> [..., Hb, Wb, C, f*f]."""
    b = self._batch(x, self.x_shape, "x")
    f, (h, w) = self.factor, self.x_shape[:2]
    x = x.reshape(b + (h // f, f, w // f, f, self._c))
    nb = len(b)
    x = jnp.moveaxis(x, (nb + 1, nb + 3), (nb + 3, nb + 4))   # [..., Hb, Wb, C, f, f]
    return x.reshape(b + (h // f, w // f, self._c, f * f))

  def _unblocks(self, blocks, b):
    f, (h, w) = self.factor, self.x_shape[:2]
    x = blocks.reshape(b + (h // f, w // f, self._c, f, f))
    nb = len(b)
    x = jnp.moveaxis(x, (nb + 3, nb + 4), (nb + 1, nb + 3))
    return x.reshape(b + self.x_shape)

  def forward(self, x):
    """A x: x [..., *x_shape] -> y [..., *y_shape]."""
    return jnp.mean(self._blocks(x), -1).reshape(x.shape[:x.ndim - len(self.x_shape)] + self.y_shape)

  def adjoint(self, y):
    """A^T y: y [..., *y_shape] -> [..., *x_shape]."""
    b = self._batch(y, self.y_shape, "y")
    yb = y.reshape(b + self.y_shape[:2] + (self._c, 1))
    return self._unblocks(jnp.broadcast_to(yb, yb.shape[:-1] + (self.factor ** 2,)) / self.factor ** 2, b)

  def vt(self, x):
    """V^T x: x [..., *x_shape] -> spectral coordinates [..., n] (the first r pair with the singular values)."""
    b = x.shape[:x.ndim - len(self.x_shape)]
    coef = self._blocks(x) @ self.basis                          # [..., Hb, Wb, C, f^2]
    coef = jnp.moveaxis(coef, -1, len(b))                        # [..., f^2, Hb, Wb, C]: mean coords first
    return coef.reshape(b + (-1,))

  def v(self, xs):
    """V xs: spectral coordinates [..., n] -> [..., *x_shape] (inverse of `vt`)."""
    b = xs.shape[:-1]
    hb, wb = self.y_shape[:2]
    coef = xs.reshape(b + (self.factor ** 2, hb, wb, self._c))
    coef = jnp.moveaxis(coef, len(b), -1)
    return self._unblocks(coef @ self.basis.T, b)

  def ut(self, y):
    """U^T y: y [..., *y_shape] -> measurement-space coordinates [..., m] (m = y_size)."""
    b = self._batch(y, self.y_shape, "y")
    return y.reshape(b + (-1,))

  def u(self, ys):
    """U ys: measurement-space coordinates [..., m] -> [..., *y_shape] (inverse of `ut` on the measurement space)."""
    return ys.reshape(ys.shape[:-1] + self.y_shape)


# ------------------------------------------------------------------------------------------------ blurs


def gaussian_kernel(kernel_size: int, std: float) -> np.ndarray:
  """[k, k] normalised Gaussian kernel (float64).

  Args:
    kernel_size: k, a positive odd integer.
    std: the Gaussian's std in pixels (> 0).

  Returns:
    float64 [k, k] summing to 1.

  Raises:
    ValueError: k not positive odd, or std <= 0.
  """
  if kernel_size < 1 or kernel_size % 2 == 0:
    raise ValueError(f"kernel_size must be a positive odd integer, got {kernel_size}.")
  if not std > 0:
    raise ValueError(f"the blur std must be > 0, got {std}.")
  ax = np.arange(kernel_size) - kernel_size // 2
  g = np.exp(-0.5 * (ax / std) ** 2)
  k = np.outer(g, g)
  return k / k.sum()


def motion_kernel(kernel_size: int, angle: float = 45.0, length: float | None = None) -> np.ndarray:
  """[k, k] linear motion-blur kernel: a segment of `length` pixels through the centre at `angle` degrees.

  The segment is sampled densely and splatted bilinearly (anti-aliased), then normalised to sum 1.

  Args:
    kernel_size: k, a positive odd integer.
    angle: the segment's direction in degrees (counter-clockwise from the x axis).
    length: segment length in pixels, in (0, k sqrt 2] (None: k).

  Returns:
    float64 [k, k] summing to 1.

  Raises:
    ValueError: k not positive odd, or length out of range.
  """
  if kernel_size < 1 or kernel_size % 2 == 0:
    raise ValueError(f"kernel_size must be a positive odd integer, got {kernel_size}.")
  length = float(kernel_size) if length is None else float(length)
  if not 0 < length <= kernel_size * math.sqrt(2):
    raise ValueError(f"motion length must be in (0, kernel_size * sqrt(2)], got {length}.")
  c = kernel_size // 2
  t = np.linspace(-0.5, 0.5, 16 * kernel_size + 1) * (length - 1.0)
  th = np.deg2rad(angle)
  px, py = c + t * np.cos(th), c - t * np.sin(th)
  k = np.zeros((kernel_size, kernel_size))
  x0, y0 = np.floor(px).astype(int), np.floor(py).astype(int)
  fx, fy = px - x0, py - y0
  for dx, dy, wgt in ((0, 0, (1 - fx) * (1 - fy)), (1, 0, fx * (1 - fy)), (0, 1, (1 - fx) * fy), (1, 1, fx * fy)):
    xi, yi = np.clip(x0 + dx, 0, kernel_size - 1), np.clip(y0 + dy, 0, kernel_size - 1)
    np.add.at(k, (yi, xi), wgt)
  return k / k.sum()


@jax.tree_util.register_pytree_node_class
class CircularBlur(LinearOperator):
  """y = k (*) x with PERIODIC boundaries on the two spatial axes, per channel; exact FFT SVD.

  With F the unitary 2-D DFT (norm='ortho') and k^ = DFT of the kernel (not normalised),
  A = F^H diag(k^) F = (F^H diag(phase)) diag(|k^|) F: V^H x = F x, U^H y = conj(phase) F y, s = |k^|.
  Spectral coordinates are complex; the Gaussian formulas of `smc` hold for them unchanged (unitary basis,
  Hermitian-symmetric multipliers).

  Args:
    kernel: [kh, kw] kernel (odd sizes; centred at (kh // 2, kw // 2)); not renormalised.
    shape: x shape (H, W) or (H, W, C); y has the same shape.
  """

  _leaf_fields = ("kernel", "kernel_fft")
  _aux_fields = ("x_shape",)
  is_complex = True

  def __init__(self, kernel, shape: Sequence[int]):
    self._setup(_concrete(kernel, "the blur kernel").astype(np.float64), shape)

  def _setup(self, kernel: np.ndarray, shape: Sequence[int]) -> None:
    shape = _image_shape(shape, type(self).__name__)
    if kernel.ndim != 2 or kernel.shape[0] % 2 == 0 or kernel.shape[1] % 2 == 0:
      raise ValueError(f"the blur kernel must be 2-D with odd sizes, got {kernel.shape}.")
    h, w = shape[:2]
    kh, kw = kernel.shape
    if kh > h or kw > w:
      raise ValueError(f"the blur kernel {kernel.shape} is larger than the image {shape[:2]}; "
                       "use a kernel_size <= min(H, W).")
    pad = np.zeros((h, w))
    pad[:kh, :kw] = kernel
    pad = np.roll(pad, (-(kh // 2), -(kw // 2)), axis=(0, 1))   # centre at (0, 0): no shift
    self.kernel = jnp.asarray(kernel, jnp.float32)
    self.kernel_fft = jnp.asarray(np.fft.fft2(pad), jnp.complex64)
    self.x_shape = shape

  @property
  def y_shape(self) -> tuple[int, ...]:
    return self.x_shape

  @property
  def _axes(self) -> tuple[int, int]:
    nd = len(self.x_shape)
    return (-nd, -nd + 1)

  def _bcast(self, k):
    return k[..., None] if len(self.x_shape) == 3 else k

  @property
  def singular_values(self) -> jax.Array:
    s = jnp.broadcast_to(self._bcast(jnp.abs(self.kernel_fft)), self.x_shape)
    return s.reshape(-1).astype(jnp.float32)

  @property
  def _phase(self):
    mag = jnp.abs(self.kernel_fft)
    ph = jnp.where(mag > 0, self.kernel_fft / jnp.where(mag > 0, mag, 1.0), 1.0)
    return self._bcast(ph)

  def forward(self, x):
    """A x: x [..., *x_shape] -> y [..., *y_shape]."""
    self._batch(x, self.x_shape, "x")
    xf = jnp.fft.fft2(x, axes=self._axes)
    return jnp.real(jnp.fft.ifft2(self._bcast(self.kernel_fft) * xf, axes=self._axes)).astype(jnp.float32)

  def adjoint(self, y):
    """A^T y: y [..., *y_shape] -> [..., *x_shape]."""
    self._batch(y, self.y_shape, "y")
    yf = jnp.fft.fft2(y, axes=self._axes)
    return jnp.real(jnp.fft.ifft2(jnp.conj(self._bcast(self.kernel_fft)) * yf, axes=self._axes)).astype(jnp.float32)

  def vt(self, x):
    """V^H x = F x: x [..., *x_shape] -> complex64 Fourier coordinates [..., n] (unitary 2-D DFT)."""
    b = self._batch(x, self.x_shape, "x")
    return jnp.fft.fft2(x, axes=self._axes, norm="ortho").reshape(b + (-1,))

  def v(self, xs):
    """V xs: complex Fourier coordinates [..., n] -> real part of the inverse DFT [..., *x_shape], float32."""
    b = xs.shape[:-1]
    x = jnp.fft.ifft2(xs.reshape(b + self.x_shape), axes=self._axes, norm="ortho")
    return jnp.real(x).astype(jnp.float32)

  def ut(self, y):
    """U^H y = conj(phase) F y: y [..., *y_shape] -> complex64 coordinates [..., m] (m = y_size)."""
    b = self._batch(y, self.y_shape, "y")
    yf = jnp.fft.fft2(y, axes=self._axes, norm="ortho")
    return (jnp.conj(self._phase) * yf).reshape(b + (-1,))

  def u(self, ys):
    """U ys: complex coordinates [..., m] -> real part of F^H (phase ys) [..., *y_shape], float32."""
    b = ys.shape[:-1]
    y = jnp.fft.ifft2(self._phase * ys.reshape(b + self.y_shape), axes=self._axes, norm="ortho")
    return jnp.real(y).astype(jnp.float32)


@jax.tree_util.register_pytree_node_class
class GaussianBlur(CircularBlur):
  """Gaussian deblurring: a normalised kernel_size x kernel_size Gaussian of `std` pixels, periodic boundary.

  Args:
    kernel_size: odd, <= min(H, W) (official: 61 on 256 x 256, std 3.0).
    std: the Gaussian's std in pixels.
    shape: x shape (H, W) or (H, W, C).
  """

  def __init__(self, kernel_size: int, std: float, shape: Sequence[int]):
    self._setup(gaussian_kernel(int(kernel_size), float(std)), shape)


@jax.tree_util.register_pytree_node_class
class MotionBlur(CircularBlur):
  """Motion deblurring with a REAL motion kernel: a linear streak of `length` pixels at `angle` degrees,
  periodic boundary (or any `kernel` passed explicitly).

  Deviation: the official FPS code builds its "motion blur" SVD from a delta kernel along one axis and a
  Gaussian of std 0.5 along the other, i.e. almost no blur; here the kernel is a real motion streak.

  Args:
    kernel_size: odd, <= min(H, W).
    shape: x shape (H, W) or (H, W, C).
    angle: streak direction in degrees (0 = horizontal).
    length: streak length in pixels (default kernel_size).
    kernel: optional explicit [k, k] kernel (overrides angle / length).
  """

  def __init__(self, kernel_size: int, shape: Sequence[int], angle: float = 45.0, length: float | None = None,
               kernel=None):
    k = motion_kernel(int(kernel_size), angle, length) if kernel is None else _concrete(kernel, "kernel")
    self._setup(np.asarray(k, np.float64), shape)


# ------------------------------------------------------------------------------------------------ dense


@jax.tree_util.register_pytree_node_class
class Dense(LinearOperator):
  """Any matrix A [m, n] acting on vectors x [..., n] -> y [..., m]; SVD by numpy (float64) at construction.

  Full U [m, m] and V [n, n]; r = min(m, n) singular values (zeros allowed: A = 0 carries no information).
  """

  _leaf_fields = ("a", "u_mat", "s", "v_mat")
  _aux_fields = ("x_shape", "y_shape")

  def __init__(self, a):
    a64 = _concrete(a, "the matrix").astype(np.float64)
    if a64.ndim != 2:
      raise ValueError(f"Dense needs a 2-D matrix [m, n], got shape {a64.shape}.")
    if not np.all(np.isfinite(a64)):
      raise ValueError("the matrix has NaN/inf entries.")
    u, s, vh = np.linalg.svd(a64, full_matrices=True)
    self.a = jnp.asarray(a64, jnp.float32)
    self.u_mat = jnp.asarray(u, jnp.float32)
    self.s = jnp.asarray(s, jnp.float32)
    self.v_mat = jnp.asarray(vh.T, jnp.float32)
    self.y_shape, self.x_shape = (int(a64.shape[0]),), (int(a64.shape[1]),)

  @property
  def singular_values(self) -> jax.Array:
    return self.s

  def forward(self, x):
    """A x: x [..., *x_shape] -> y [..., *y_shape]."""
    self._batch(x, self.x_shape, "x")
    return x @ self.a.T

  def adjoint(self, y):
    """A^T y: y [..., *y_shape] -> [..., *x_shape]."""
    self._batch(y, self.y_shape, "y")
    return y @ self.a

  def vt(self, x):
    """V^T x: x [..., *x_shape] -> spectral coordinates [..., n] (the first r pair with the singular values)."""
    self._batch(x, self.x_shape, "x")
    return x @ self.v_mat

  def v(self, xs):
    """V xs: spectral coordinates [..., n] -> [..., *x_shape] (inverse of `vt`)."""
    return xs @ self.v_mat.T

  def ut(self, y):
    """U^T y: y [..., *y_shape] -> measurement-space coordinates [..., m] (m = y_size)."""
    self._batch(y, self.y_shape, "y")
    return y @ self.u_mat

  def u(self, ys):
    """U ys: measurement-space coordinates [..., m] -> [..., *y_shape] (inverse of `ut` on the measurement space)."""
    return ys @ self.u_mat.T

  def matrix(self) -> jax.Array:
    """The matrix A [m, n] itself (float32)."""
    return self.a


OPERATORS = ("inpainting", "super_resolution", "gaussian_blur", "motion_blur", "dense")
