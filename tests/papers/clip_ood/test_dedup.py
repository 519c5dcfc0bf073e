"""CLIP OOD deduplication (`papers/clip_ood/dedup.py`): exact duplicates, the official within-cluster rule, k-means."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import clip_ood
from iclr24_jax.papers.clip_ood import dedup as dedup_lib
from .helpers import _unit


def test_deduplicate_removes_exact_duplicates_keeps_distinct():
  rng = np.random.default_rng(0)
  x = _unit(rng, 200, 32)                     # random directions in 32-d: pairwise sims far below 0.876
  xd = np.concatenate([x, x[:30], 3.0 * x[30:40]])         # 30 exact copies, 10 rescaled copies (same direction)
  keep = np.asarray(clip_ood.deduplicate(xd, 6, clip_ood.DEDUP_THRESHOLD, jax.random.key(0)))
  assert keep[:200].all()                     # the first occurrence is kept
  assert not keep[200:].any()                 # every later copy is removed
  # shuffled: exactly one member of each group survives, and it is the earliest one
  perm = np.random.default_rng(1).permutation(len(xd))
  keep_p = np.asarray(clip_ood.deduplicate(xd[perm], 6, 0.124, jax.random.key(3)))
  group = np.concatenate([np.arange(200), np.arange(30), np.arange(30, 40)])[perm]
  assert keep_p.sum() == 200
  for g in range(200):
    members = np.flatnonzero(group == g)
    assert keep_p[members].tolist() == [True] + [False] * (len(members) - 1)


def test_within_cluster_rule_matches_official_bruteforce():
  rng = np.random.default_rng(2)
  base = _unit(rng, 60, 8)
  x = np.concatenate([base, base[:20] + 0.05 * rng.normal(size=(20, 8)).astype(np.float32)])
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  assign = np.asarray(rng.integers(0, 4, len(x)), np.int32)
  sims = x @ x.T
  # official: i removed iff max over earlier j of the same cluster sim(i, j) > 1 - threshold
  expected = np.array([any(assign[j] == assign[i] and sims[i, j] > 1 - 0.124 for j in range(i))
                       for i in range(len(x))])
  for window in (None, 64):
    got = np.asarray(dedup_lib.within_cluster_duplicates(jnp.asarray(x), jnp.asarray(assign), 0.124, window, 16))
    np.testing.assert_array_equal(got, expected)
  assert expected.any()


def test_kmeans_assigns_to_nearest_centre():
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.normal(c, 0.05, (30, 2)) for c in ([0, 0], [3, 0], [0, 3])]).astype(np.float32)
  centers, assign = jax.jit(dedup_lib.kmeans, static_argnums=(1,))(x, 3, jax.random.key(0))
  chex.assert_shape(centers, (3, 2))
  d = ((x[:, None] - np.asarray(centers)[None]) ** 2).sum(-1)
  np.testing.assert_array_equal(np.asarray(assign), d.argmin(1))
  assert len(np.unique(np.asarray(assign))) == 3
  with pytest.raises(ValueError, match="num_clusters"):
    dedup_lib.kmeans(x, 0, jax.random.key(0))
  with pytest.raises(ValueError, match="cosine distance"):
    clip_ood.deduplicate(x, 2, threshold=3.0)
