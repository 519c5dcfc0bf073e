"""CLIP OOD data (`papers/clip_ood/data.py`): benchmark roles are disjoint; the default analogue keeps the paper's
ratios."""
import chex
import numpy as np
import pytest

from iclr24_jax.papers.clip_ood import data as data_mod


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
