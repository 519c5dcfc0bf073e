"""Safeguards propagation (`papers/safeguards/propagation.py`): exact against enumeration and Monte Carlo,
chunking, the multilinear decomposition, 1 vs 8 devices, clear errors."""
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import sharding
from iclr24_jax.papers import safeguards as sg
from .helpers import _front_end


def _brute_force(p, params):
  """y_bar by explicit enumeration in float64 (the propagation equation written out)."""
  p = np.asarray(p, np.float64)
  w, b = np.asarray(params["w"], np.float64), float(params["b"])
  out = np.zeros(p.shape[0])
  for c in itertools.product([0, 1], repeat=p.shape[1]):
    c = np.array(c)
    weight = np.prod(np.where(c == 1, p, 1 - p), axis=1)
    out += weight / (1 + np.exp(-(c @ w + b)))
  return out


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_exact_propagation_equals_enumeration(k):
  rng = np.random.default_rng(k)
  p = rng.random((7, k)).astype(np.float32)
  params = _front_end(k, seed=k)
  y_bar = jax.jit(lambda q: sg.propagate(q, params))(p)
  chex.assert_shape(y_bar, (7,))
  assert y_bar.dtype == jnp.float32
  np.testing.assert_allclose(y_bar, _brute_force(p, params), rtol=1e-5, atol=1e-6)


def test_assignment_table_is_full_rows():
  # The official update_all_cs_probas reshapes the [2^K, K] table to [K 2^K, 1]; ours keeps full K-vectors.
  table = np.asarray(sg.assignments(3))
  chex.assert_shape(table, (8, 3))
  assert {tuple(r) for r in table.astype(int)} == set(itertools.product([0, 1], repeat=3))
  params = _front_end(3)
  np.testing.assert_allclose(sg.logistic_front_end(params, table),
                             1 / (1 + np.exp(-(table @ np.asarray(params["w"]) + 0.3))), rtol=1e-6)


def test_chunked_exact_equals_single_chunk():
  rng = np.random.default_rng(1)
  p = rng.random((5, 10)).astype(np.float32)
  params = _front_end(10)
  one = sg.propagate_exact(p, params, chunk_size=4096)
  many = sg.propagate_exact(p, params, chunk_size=16)   # 64 chunks through lax.scan
  np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(one, _brute_force(p, params), rtol=1e-5, atol=1e-6)


def test_exact_equals_mc_within_standard_error():
  rng = np.random.default_rng(2)
  p = rng.random((64, 6)).astype(np.float32)
  params = _front_end(6, seed=3)
  exact = np.asarray(jax.jit(lambda q: sg.propagate(q, params, method="exact"))(p))
  mc, se = jax.jit(lambda q, key: sg.propagate_mc(q, params, key, num_samples=4000, return_stderr=True))(
      p, jax.random.key(0))
  z = (np.asarray(mc) - exact) / np.asarray(se)
  assert np.all(np.abs(z) < 4.5), np.abs(z).max()        # 64 draws of N(0, 1): |z| < 4.5 w.p. > 0.9995
  assert 0.6 < np.mean(z ** 2) < 1.5                       # chi2_64 / 64: 5%-95% range is ~[0.73, 1.30]
  mc_api = jax.jit(lambda q, key: sg.propagate(q, params, method="mc", key=key, num_samples=4000))(
      p, jax.random.key(0))
  np.testing.assert_allclose(mc_api, mc, rtol=1e-6)


def test_confident_concepts_give_front_end_output():
  rng = np.random.default_rng(3)
  c = (rng.random((16, 5)) < 0.5).astype(np.float32)
  params = _front_end(5)
  f_c = sg.logistic_front_end(params, c)
  np.testing.assert_allclose(sg.propagate(c, params), f_c, rtol=1e-6)
  np.testing.assert_allclose(sg.propagate(c, params, method="mc", key=jax.random.key(1), num_samples=10),
                             f_c, rtol=1e-6)
  # 300 samples = one full chunk of 250 + a masked partial chunk: the mean must still be exactly f(c)
  np.testing.assert_allclose(sg.propagate_mc(c, params, jax.random.key(2), num_samples=300), f_c, rtol=1e-5)


def test_outcomes_are_multilinear_decomposition():
  rng = np.random.default_rng(4)
  p = rng.random((9, 4)).astype(np.float32)
  params = _front_end(4)
  y_bar = np.asarray(sg.propagate(p, params))
  f0, f1 = map(np.asarray, sg.concept_outcomes(p, params))
  chex.assert_shape((f0, f1), (9, 4))
  np.testing.assert_allclose(p * f1 + (1 - p) * f0, np.broadcast_to(y_bar[:, None], p.shape), rtol=1e-5, atol=1e-6)


def test_one_and_eight_devices_agree():
  rng = np.random.default_rng(5)
  p = rng.random((64, 7)).astype(np.float32)
  params = _front_end(7)
  outs = []
  for mesh in sharding.device_meshes((1, 8)):
    fn = jax.jit(lambda q, f: sg.propagate_exact(q, f), in_shardings=(sharding.data_sharding(mesh),
                                                                     sharding.replicated_sharding(mesh)))
    outs.append(np.asarray(fn(jax.device_put(p, sharding.data_sharding(mesh)), params)))
  np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6)


def test_clear_errors():
  params = _front_end(3)
  p = np.full((4, 3), 0.5, np.float32)
  with pytest.raises(ValueError, match="probabilities, not logits"):
    sg.propagate(p + 2.0, params)
  with pytest.raises(ValueError, match="NaN"):
    sg.propagate(np.full((4, 3), np.nan, np.float32), params)
  with pytest.raises(ValueError, match="agree"):
    sg.propagate(np.full((4, 2), 0.5, np.float32), params)
  with pytest.raises(ValueError, match=r"\[\.\.\., K\]"):
    sg.propagate(np.float32(0.5), params)
  # per-row math: a single [K] row is one instance (leading batch dims are free, so vmap composes)
  np.testing.assert_allclose(sg.propagate(p[0], params), sg.propagate(p, params)[0], rtol=1e-6)
  with pytest.raises(ValueError, match="PRNG key"):
    sg.propagate(p, params, method="mc")
  with pytest.raises(ValueError, match="unknown propagation method"):
    sg.propagate(p, params, method="sum")
  with pytest.raises(ValueError, match="method='mc'"):
    sg.propagate_exact(np.full((1, 30), 0.5, np.float32), _front_end(30))
  with pytest.raises(ValueError, match="target_accuracy"):
    sg.choose_threshold(jnp.ones(3) * 0.7, jnp.ones(3), 1.5)
  with pytest.raises(ValueError, match="strategy"):
    sg.confirm(p, params, np.ones(4, bool), 1, strategy="oracle")
  with pytest.raises(ValueError, match="PRNG key"):
    sg.confirm(p, params, np.ones(4, bool), 1, strategy="random")
  with pytest.raises(ValueError, match="abstain_mask"):
    sg.confirm(p, params, np.ones(5, bool), 1)
  with pytest.raises(ValueError, match="budget_per_concept"):
    sg.confirm(p, params, np.ones(4, bool), np.array([1, 2]))
  from iclr24_jax.configs import safeguards as cfg_mod
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("cub")
