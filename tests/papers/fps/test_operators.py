"""FPS's operators (`papers/fps/operators.py`): the adjoint identity, the SVD reconstructs each
operator, inpainting / super-resolution / kernel values by hand, operators as pytrees under jit."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import fps
from .helpers import OPS, _basis_matrix


@pytest.mark.parametrize("name", list(OPS))
def test_adjoint_identity(name):
  op = OPS[name]
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((3,) + op.x_shape), jnp.float32)
  y = jnp.asarray(rng.standard_normal((3,) + op.y_shape), jnp.float32)
  lhs = jnp.sum(op.forward(x) * y, axis=tuple(range(1, 1 + len(op.y_shape))))
  rhs = jnp.sum(x * op.adjoint(y), axis=tuple(range(1, 1 + len(op.x_shape))))
  np.testing.assert_allclose(lhs, rhs, rtol=1e-5, atol=1e-5)
  chex.assert_shape(op.forward(x), (3,) + op.y_shape)
  chex.assert_shape(op.adjoint(y), (3,) + op.x_shape)


@pytest.mark.parametrize("name", list(OPS))
def test_svd_reconstructs_operator(name):
  op = OPS[name]
  n = op.x_size
  a = _basis_matrix(op.forward, op.x_shape)                 # [prod(y_shape), n]
  vt = _basis_matrix(op.vt, op.x_shape)                     # [n, n] (complex for blurs)
  np.testing.assert_allclose(vt @ vt.conj().T, np.eye(n), atol=1e-5)       # V is unitary
  ys_shape = op.y_shape
  ut = _basis_matrix(op.ut, ys_shape)                       # [m, prod(y_shape)]
  np.testing.assert_allclose(ut @ ut.conj().T, np.eye(op.y_size), atol=1e-5)   # U^H has orthonormal rows
  s = np.asarray(op.singular_values)
  assert s.shape == (op.rank,) and np.all(s >= 0)
  # A = U S V^H on the measurement space: U^H A = S_pad V^H
  s_mat = np.zeros((op.y_size, n))
  s_mat[np.arange(op.rank), np.arange(op.rank)] = s
  np.testing.assert_allclose(ut @ a, s_mat @ vt, atol=1e-5)
  # and the SVD path reproduces forward on random inputs
  x = jnp.asarray(np.random.default_rng(2).standard_normal((2,) + op.x_shape), jnp.float32)
  np.testing.assert_allclose(op.forward_svd(x), op.forward(x), atol=1e-5)
  np.testing.assert_allclose(op.v(op.vt(x)), x, atol=1e-5)


def test_inpainting_and_sr_values():
  # Inpainting keeps observed pixels; SR averages blocks: [[1, 2], [3, 4]] -> 2.5.
  op = fps.Inpainting(np.array([[1.0, 0.0], [0.0, 1.0]]))
  np.testing.assert_array_equal(op.forward(jnp.array([[1.0, 2.0], [3.0, 4.0]])), [[1.0, 0.0], [0.0, 4.0]])
  sr = fps.SuperResolution(2, (2, 2))
  np.testing.assert_allclose(sr.forward(jnp.array([[1.0, 2.0], [3.0, 4.0]])), [[2.5]], rtol=1e-6)
  np.testing.assert_allclose(sr.singular_values, [0.5], rtol=1e-6)   # row ones/4 has norm 1/2
  k = fps.gaussian_kernel(5, 1.0)
  np.testing.assert_allclose(k.sum(), 1.0, rtol=1e-12)
  mk = fps.motion_kernel(7, angle=0.0, length=5)
  np.testing.assert_allclose(mk.sum(), 1.0, rtol=1e-12)
  assert np.count_nonzero(mk.sum(1)) == 1 and np.count_nonzero(mk.sum(0)) == 5   # a horizontal streak of 5 px


def test_operators_are_pytrees_for_jit():
  op = OPS["gaussian_blur"]
  x = jnp.ones((1,) + op.x_shape)
  f = jax.jit(lambda o, x: o.forward(x))
  np.testing.assert_allclose(f(op, x), op.forward(x), rtol=1e-6)
  leaves, tree = jax.tree_util.tree_flatten(op)
  assert jax.tree_util.tree_unflatten(tree, leaves).x_shape == op.x_shape
