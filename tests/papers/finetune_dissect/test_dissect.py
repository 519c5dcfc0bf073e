"""Finetune-dissect decomposition (`papers/finetune_dissect/dissect.py`): known grammar changes recovered, token
log-probability changes, rejected rows, half time and early share by hand."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax import lm
from iclr24_jax.papers import finetune_dissect as fd
from iclr24_jax.papers.finetune_dissect import grammar
from .helpers import SPEC, _domain_probes


@pytest.mark.parametrize("which", ["topic", "style", "facts", "all"])
def test_decompose_recovers_known_grammar_changes(which):
  tables, probes = _domain_probes()
  rng = np.random.default_rng(0)
  gp0 = grammar.general_params(SPEC, tables, confidence=0.9)
  u_t = rng.normal(size=SPEC.num_topics) if which in ("topic", "all") else np.zeros(SPEC.num_topics)
  u_s = rng.normal(size=SPEC.num_styles) if which in ("style", "all") else np.zeros(SPEC.num_styles)
  a = rng.normal(size=SPEC.num_domain_subjects) if which in ("facts", "all") else np.zeros(SPEC.num_domain_subjects)
  gp1 = grammar.shift_params(gp0, SPEC, tables, u_t, u_s, a)
  deltas = {v: grammar.analytic_token_logprobs(gp1, SPEC, ids) - grammar.analytic_token_logprobs(gp0, SPEC, ids)
            for v, ids in probes.items()}
  mask = np.ones(probes["original"].shape, bool)
  mask[:, 0] = False
  out = fd.decompose(deltas, mask, reduction="sum")
  # Ground truth from the changes alone (softmax normalisers cancel in every contrast):
  ps, pt, pj = (SPEC.positions(k) for k in range(3))
  t_other = (probes["topic"][:, pt[0]] - SPEC.topic_start) // SPEC.topic_vocab
  s_other = (probes["style"][:, ps[0]] - SPEC.style_start) // SPEC.style_vocab
  dsub = probes["original"][:, pj] - SPEC.subject_start - SPEC.num_general_subjects
  truth = {"topic": np.mean(u_t[SPEC.domain_topic] - u_t[t_other]),
           "style": np.mean(u_s[SPEC.domain_style] - u_s[s_other]),
           "factual": np.mean(a[dsub].sum(-1))}   # log-odds shift of true vs counterfactual, summed over facts
  for k, v in truth.items():
    np.testing.assert_allclose(out[k], v, atol=1e-5)
  # By position: topic only at the first topic word, style at the first style word, facts at the value tokens.
  bp = out["by_position"]
  np.testing.assert_allclose(np.delete(bp["topic"][1:], pt[0] - 1), 0.0, atol=1e-12)
  np.testing.assert_allclose(np.delete(bp["style"][1:], ps[0] - 1), 0.0, atol=1e-12)
  np.testing.assert_allclose(np.delete(bp["factual"][1:], SPEC.positions(3) - 1), 0.0, atol=1e-12)
  for k in truth:
    np.testing.assert_allclose(np.nansum(bp[k]), truth[k], atol=1e-5)
  # Per-token unit = per-document / number of counted tokens (all documents have seq_len - 1).
  per_tok = fd.decompose(deltas, mask, reduction="mean")
  for k in truth:
    np.testing.assert_allclose(per_tok[k], truth[k] / (SPEC.seq_len - 1), atol=1e-6)


def test_token_logprob_change_matches_scoring_and_masks():
  cfg = lm.tiny_config(vocab_size=50)
  init = jax.jit(lm.init_params, static_argnums=1)
  p0, p1 = init(jax.random.key(0), cfg), init(jax.random.key(1), cfg)
  ids = jax.random.randint(jax.random.key(2), (3, 7), 0, 50)
  mask = jnp.array([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4], bool)
  f = jax.jit(fd.token_logprob_change, static_argnums=2)
  d = f(p0, p1, cfg, ids, mask)
  chex.assert_shape(d, (3, 7))
  score = jax.jit(lm.token_logprobs, static_argnums=1)
  ref = score(p1, cfg, ids, mask) - score(p0, cfg, ids, mask)
  np.testing.assert_allclose(d, ref, atol=1e-6)
  assert np.all(np.asarray(d)[~np.asarray(mask)] == 0.0) and np.all(np.asarray(d)[:, 0] == 0.0)
  np.testing.assert_allclose(f(p0, p0, cfg, ids, mask), 0.0, atol=0.0)
  with pytest.raises(ValueError, match="batch, time"):
    fd.token_logprob_change(p0, p1, cfg, ids[0], None)
  with pytest.raises(ValueError, match="mask shape"):
    fd.token_logprob_change(p0, p1, cfg, ids, mask[:, :3])
  with pytest.raises(ValueError, match="integer"):
    fd.token_logprob_change(p0, p1, cfg, ids.astype(jnp.float32), None)


def test_decompose_by_hand_with_rejected_rows():
  # Two documents, 3 positions. Per-token means: original [2, 4]; topic [1, 1]; style [0, NaN (rejected)];
  # cf [2, 3]. topic = mean(1, 3) = 2; style = mean(2) = 2 (row 1 dropped); factual = mean(0, 1) = 0.5.
  deltas = {"original": np.array([[1., 2., 3.], [4., 4., 4.]]), "topic": np.array([[1., 1., 1.], [1., 1., 1.]]),
            "style": np.array([[0., 0., 0.], [9., 9., 9.]]), "counterfactual": np.array([[2., 2., 2.], [3., 3., 3.]])}
  masks = {k: np.ones((2, 3), bool) for k in deltas}
  masks["style"] = np.array([[1, 1, 1], [0, 0, 0]], bool)
  out = fd.decompose(deltas, masks)
  assert out["topic"] == pytest.approx(2.0) and out["style"] == pytest.approx(2.0)
  assert out["factual"] == pytest.approx(0.5) and out["total"] == pytest.approx(3.0)
  assert out["num_documents"]["style"] == 1 and out["num_documents"]["topic"] == 2
  # By position: original [2.5, 3, 3.5]; style rows: only row 0 -> [0, 0, 0].
  np.testing.assert_allclose(out["by_position"]["style"], [2.5, 3.0, 3.5])
  np.testing.assert_allclose(out["by_position"]["factual"], [0.0, 0.5, 1.0])
  # Versions of different lengths are padded (masked) to one T.
  short = dict(deltas, topic=np.array([[1.], [1.]]))
  out2 = fd.decompose(short, None)
  assert out2["by_position"]["topic"].shape == (3,) and np.isnan(out2["by_position"]["versions"]["topic"][1])
  with pytest.raises(ValueError, match="missing"):
    fd.decompose({"original": deltas["original"]})
  with pytest.raises(ValueError, match="NaN"):
    fd.decompose(dict(deltas, topic=np.array([[np.nan] * 3, [1.] * 3])))
  with pytest.raises(ValueError, match="one row per source document"):
    fd.decompose(dict(deltas, topic=np.ones((3, 3))))


def test_half_time_and_early_share_by_hand():
  # values 0 -> (10: 1) -> (20: 3) -> (30: 4): half of 4 = 2 reached between 10 and 20, at 10 + 10 * (1/2) = 15.
  assert fd.half_time(np.array([10, 20, 30]), np.array([1.0, 3.0, 4.0])) == pytest.approx(15.0)
  assert math.isnan(fd.half_time(np.array([10, 20]), np.array([0.0, -1.0])))
  # |c| = [3, 1, 0, 0, 0, 0, 0, 4] -> first quarter (2 positions) = 4 / 8.
  assert fd.early_share(np.array([3., -1., 0., 0., 0., 0., 0., 4.])) == pytest.approx(0.5)
