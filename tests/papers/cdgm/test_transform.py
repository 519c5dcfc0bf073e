"""C-DGM data transform (`papers/cdgm/transform.py`) by hand."""
import chex
import jax.numpy as jnp
import numpy as np

from iclr24_jax.papers.cdgm import transform as tfm
from .helpers import _manual_transform


def test_transform_by_hand():
  tf = _manual_transform()
  assert tf.data_dim == 1 + 2 + 2
  # x = 4 in component 0: alpha = (4 - 3) / (4 * 0.5) = 0.5; decode: 0.5 * 4 * 0.5 + 3 = 4.
  # x = 5 in component 0: alpha = (5 - 3) / 2 = 1 -> clipped to 0.99; decode: 0.99 * 2 + 3 = 4.98.
  comp = jnp.array([[[1.0, 0.0]], [[1.0, 0.0]]])
  alpha = tfm.reencode_alpha(tf, jnp.array([[4.0, 0.0], [5.0, 1.0]]), comp)
  np.testing.assert_allclose(alpha, [[0.5], [0.99]], rtol=1e-6)
  v = tf.join(alpha, comp, jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]]))
  np.testing.assert_allclose(tfm.decode(tf, v), [[4.0, 0.0], [4.98, 1.0]], rtol=1e-6)
  enc = tfm.encode(tf, np.array([[4.0, 1.0], [-2.5, 0.0]]))
  chex.assert_shape(enc, (2, 5))
  np.testing.assert_allclose(tfm.decode(tf, jnp.asarray(enc)), [[4.0, 1.0], [-2.5, 0.0]], rtol=1e-5)
