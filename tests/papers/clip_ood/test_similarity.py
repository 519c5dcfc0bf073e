"""Tests for clip_ood (iclr24_jax.papers.clip_ood): top-k similarity, pruning, splits, dedup, data, smoke run."""
import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import sharding
from iclr24_jax.papers import clip_ood
from iclr24_jax.papers.clip_ood import data as data_mod
from iclr24_jax.papers.clip_ood import dedup as dedup_lib
from iclr24_jax.vision import clip


def _unit(rng, n, d=16):
  x = rng.normal(size=(n, d))
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


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


def test_public_api_reexports_the_vision_clip():
  assert clip_ood.clip_loss is clip.clip_loss
  assert clip_ood.zero_shot_accuracy is clip.zero_shot_accuracy
  for name in clip_ood.__all__:
    assert hasattr(clip_ood, name)
  # the loss on a hand example: identity pairs at scale 1 -> log(1 + e^-1) = 0.3132617 (see tests/vision)
  np.testing.assert_allclose(float(clip_ood.clip_loss(jnp.eye(2), jnp.eye(2), 1.0)), 0.3132617, atol=1e-4)


def test_build_benchmark_roles_are_disjoint():
  b = data_mod.build_benchmark(pool_size=300, reference_size=200, test_size=40, lowres_test_size=20, seed=3)
  n = 300 + 30 + 6                                   # pool + 10% near-duplicates + 2% benchmark copies
  chex.assert_shape(b.pool.images, (n, 16, 16, 1))
  assert len(b.pool.captions) == n and all(c for c in b.pool.captions)
  assert set(b.tests) == set(data_mod.BENCHMARKS)
  chex.assert_shape(b.tests["clean"][0], (40, 16, 16, 1))
  chex.assert_shape(b.tests["lowres"][0], (20, 16, 16, 1))
  assert b.reference_images.shape[0] == 200
  assert b.pool.images.min() >= 0 and b.pool.images.max() <= 1
  dups = np.flatnonzero(b.pool.duplicate_of >= 0)
  assert len(dups) == 30 and (b.pool.source[dups] == 1).all()
  assert (b.pool.labels[dups] == b.pool.labels[b.pool.duplicate_of[dups]]).all()
  # only the deliberate copies repeat a benchmark image exactly
  clean = b.tests["clean"][0].reshape(40, -1)
  flat = b.pool.images.reshape(n, -1)
  exact = (np.abs(flat[:, None] - clean[None]).max(-1) == 0).any(1)
  assert (b.pool.source[exact] == 2).all()
  assert len(data_mod.zero_shot_prompts()) == 10 * len(data_mod.ZERO_SHOT_TEMPLATES)
  with pytest.raises(ValueError, match="unknown styles"):
    data_mod.build_benchmark(pool_size=10, style_rates={"psychedelic": 1.0})


def test_config_variants():
  from iclr24_jax.configs import clip_ood as cfg_mod
  for v in cfg_mod.VARIANTS:
    c = cfg_mod.get_config(v)
    assert c.paper == "clip_ood"
  assert cfg_mod.get_config("prune_sketch").prune.benchmarks == ("sketch",)
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("laion5b")


def test_default_analogue_is_calibrated_to_the_papers_ratios():
  from iclr24_jax.configs import clip_ood as cfg_mod
  d = cfg_mod.get_config("").data
  n_test = d.test_size * (len(data_mod.BENCHMARKS) - 1) + d.lowres_test_size
  assert n_test / d.reference_size <= 0.15  # the paper: ~166k benchmark images / 1.28M ImageNet-train = 0.13
  # the reference is asked for every digit style in the pool's proportions: the requested reference shares match
  # the digit styles the pool actually holds (built small here with the same generator)
  b = data_mod.build_benchmark(pool_size=3000, reference_size=1500, test_size=20, lowres_test_size=20,
                               reference_style_rates=dict(d.reference_style_rates), seed=1)
  digit = b.pool.styles != data_mod.STYLES.index("photo")
  rates = dict(d.reference_style_rates)
  total = sum(rates.values())
  for i, s in enumerate(data_mod.STYLES):
    if s == "photo":
      continue
    pool_share = float(np.mean(b.pool.styles[digit] == i))
    assert abs(pool_share - rates[s] / total) < 0.03, (s, pool_share, rates[s] / total)


def test_tiny_experiment_smoke(tmp_path):
  from iclr24_jax.configs import clip_ood as cfg_mod
  from iclr24_jax.papers.clip_ood import experiment
  cfg = cfg_mod.get_config("tiny")
  with cfg.unlocked():
    cfg.progress = False
  res = experiment.run(cfg, str(tmp_path))
  with open(tmp_path / "results.json") as f:
    saved = json.load(f)
  assert set(saved["zero_shot"]) == set(cfg.conditions)
  for cond in cfg.conditions:
    assert set(data_mod.BENCHMARKS) <= set(saved["zero_shot"][cond])
  sizes = res["splits"]["sizes"]
  assert sizes["random"] == sizes["pruned"] < sizes["full"]
  assert sizes["most_similar"] == sizes["least_similar"] == round(0.5 * sizes["full"])
  for row in res["splits"]["per_benchmark"].values():      # the similarity gap holds after pruning
    assert row["max_excess/pruned"] <= 1e-6 and row["share_closer_than_reference/pruned"] == 0.0
  assert res["contamination_kept"]["pruned"] == 0
  assert os.path.exists(tmp_path / "metrics.jsonl")
  for p in res["plots"]:
    assert os.path.exists(p)
