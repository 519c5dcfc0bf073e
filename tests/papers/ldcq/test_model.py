"""LDCQ skill VAE (`papers/ldcq/model.py`): the autoregressive low-level policy's structure."""
import jax
import numpy as np

from iclr24_jax.papers import ldcq
from .helpers import _segments, _spec, _tiny_vae


def test_autoregressive_policy_structure():
  vae = _tiny_vae()
  batch = _segments(jax.random.key(3), b=4)
  params = jax.jit(vae.init)(jax.random.key(4), batch["states"][:2], batch["actions"][:2])["params"]
  s = batch["states"][:, 0]
  z = jax.random.normal(jax.random.key(5), (4, 4))
  a = batch["actions"][:, 0]
  pol = jax.jit(lambda acts: vae.apply({"params": params}, s, z, acts, method=ldcq.SkillVAE.policy)[0])
  m1 = pol(a)
  m2 = pol(a.at[:, 1].add(1.0))          # changing a_1 moves neither component (component i sees a_{<i})
  np.testing.assert_allclose(m1, m2, rtol=1e-6)
  m3 = pol(a.at[:, 0].add(1.0))          # changing a_0 moves the second component only
  np.testing.assert_allclose(m3[:, 0], m1[:, 0], rtol=1e-6)
  assert np.max(np.abs(np.asarray(m3[:, 1] - m1[:, 1]))) > 1e-4
  # deterministic sampling = the means, fed back dimension by dimension
  det = jax.jit(lambda k: ldcq.low_level_action(k, ldcq.LDCQParams(vae=params, spec=_spec(vae)), s, z, True))(
      jax.random.key(0))
  np.testing.assert_allclose(det, pol(det), rtol=1e-5, atol=1e-6)
