"""CLIP OOD similarity (`papers/clip_ood/similarity.py`): top-k against brute force, sharded, pruning and
splits."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import sharding
from iclr24_jax.papers import clip_ood
from .helpers import _unit


@pytest.fixture(scope="module")
def mesh8():
  return sharding.make_mesh()


@pytest.fixture(scope="module")
def points():
  rng = np.random.default_rng(0)
  return {"queries": _unit(rng, 37), "keys": _unit(rng, 1001), "ref": _unit(rng, 50),
          "tests": [_unit(rng, 20), _unit(rng, 11)]}


@pytest.mark.parametrize("chunk,sharded", [(1024, False), (100, False), (7, False), (64, True), (1000, True)])
def test_topk_matches_bruteforce(points, mesh8, chunk, sharded):
  q, k = points["queries"], points["keys"]
  sims = q.astype(np.float64) @ k.T.astype(np.float64)
  ref_idx = np.argsort(-sims, axis=1, kind="stable")[:, :5]
  fn = jax.jit(lambda a, b: clip_ood.topk_similarity(a, b, 5, chunk, mesh8 if sharded else None))
  vals, idx = fn(q, k)
  chex.assert_shape([vals, idx], (37, 5))
  assert idx.dtype == jnp.int32
  np.testing.assert_array_equal(np.asarray(idx), ref_idx)
  np.testing.assert_allclose(np.asarray(vals), np.take_along_axis(sims, ref_idx, 1), rtol=1e-5, atol=1e-6)


def test_topk_key_mask_ties_and_errors(points):
  q, k = points["queries"][:3], points["keys"][:40]
  mask = np.arange(40) % 2 == 0
  vals, idx = clip_ood.topk_similarity(q, k, 3, 8, key_mask=jnp.asarray(mask))
  assert (np.asarray(idx) % 2 == 0).all()
  # fewer valid keys than k: -inf and index -1 in the tail
  vals, idx = clip_ood.topk_similarity(q, k, 3, 8, key_mask=jnp.asarray(np.arange(40) == 5))
  assert np.asarray(idx)[:, 0].tolist() == [5, 5, 5] and (np.asarray(idx)[:, 1:] == -1).all()
  assert np.isneginf(np.asarray(vals)[:, 1:]).all()
  # equal keys: the lower index wins, as in a stable sort
  dup = np.repeat(points["keys"][:1], 4, axis=0)
  _, idx = clip_ood.topk_similarity(points["keys"][:1], dup, 2, 3)
  assert np.asarray(idx).tolist() == [[0, 1]]
  with pytest.raises(ValueError, match=r"k must be in \[1, 40\]"):
    clip_ood.topk_similarity(q, k, 41)
  with pytest.raises(ValueError, match="dimension"):
    clip_ood.topk_similarity(q, k[:, :8], 2)
  bad = q.copy()
  bad[0, 0] = np.nan
  with pytest.raises(ValueError, match="NaN"):
    clip_ood.topk_similarity(bad, k, 2)


def _bruteforce_prune(pool, ref, tests):
  t = np.concatenate(tests).astype(np.float64)
  s = (t @ ref.T.astype(np.float64)).max(1)
  return ~((t @ pool.T.astype(np.float64)) > s[:, None]).any(0), s


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_similarity_prune_properties(seed):
  rng = np.random.default_rng(seed)
  pool, ref, tests = _unit(rng, 400, 8), _unit(rng, 30, 8), [_unit(rng, 15, 8), _unit(rng, 9, 8)]
  keep = np.asarray(jax.jit(lambda p, r, a, b: clip_ood.similarity_prune(p, r, [a, b], chunk=64))(pool, ref, *tests))
  expected, s = _bruteforce_prune(pool, ref, tests)
  np.testing.assert_array_equal(keep, expected)
  assert 0 < keep.sum() < len(pool)
  # every test point's nearest neighbour in the kept pool is at most as similar as in the reference set
  t = jnp.asarray(np.concatenate(tests))
  nn_kept = np.asarray(clip_ood.nearest_similarity(t, pool, chunk=64, key_mask=jnp.asarray(keep)))
  assert (nn_kept <= s + 1e-6).all()
  # a sample below every test point's threshold is never removed
  below = ((np.concatenate(tests) @ pool.T) <= s[:, None] - 1e-6).all(0)
  assert keep[below].all()
  # the official candidate search: exact with enough candidates, prunes a subset with fewer
  keep_all = np.asarray(clip_ood.similarity_prune(pool, ref, tests, chunk=64, num_candidates=400))
  np.testing.assert_array_equal(keep_all, expected)
  keep_few = np.asarray(clip_ood.similarity_prune(pool, ref, tests, chunk=64, num_candidates=2))
  assert (keep_few | ~keep).all() and keep_few.sum() >= keep.sum()


def test_similarity_prune_sharded_matches_and_errors(points, mesh8):
  args = (points["keys"], points["ref"], points["tests"])
  keep1 = np.asarray(clip_ood.similarity_prune(*args, chunk=128))
  keep8 = np.asarray(jax.jit(lambda p, r, a, b: clip_ood.similarity_prune(p, r, [a, b], 128, mesh8))(
      points["keys"], points["ref"], *points["tests"]))
  np.testing.assert_array_equal(keep1, keep8)
  with pytest.raises(TypeError, match="list"):
    clip_ood.similarity_prune(points["keys"], points["ref"], points["tests"][0])
  with pytest.raises(ValueError, match="empty"):
    clip_ood.similarity_prune(points["keys"], points["ref"], [])


def test_similarity_split(points):
  pool, tests = points["keys"], points["tests"]
  score = (np.concatenate(tests) @ pool.T).max(0)
  most = np.asarray(clip_ood.similarity_split(pool, tests, 100, "most_similar", chunk=128))
  least = np.asarray(clip_ood.similarity_split(pool, tests, 100, "least_similar", chunk=128))
  assert most.sum() == 100 and least.sum() == 100
  assert score[most].min() >= score[~most].max() - 1e-6
  assert score[least].max() <= score[~least].min() + 1e-6
  np.testing.assert_allclose(np.asarray(clip_ood.max_similarity_to_sets(pool, tests)), score, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="keep"):
    clip_ood.similarity_split(pool, tests, 10, "closest")
