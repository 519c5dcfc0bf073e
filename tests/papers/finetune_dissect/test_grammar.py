"""Finetune-dissect grammar (`papers/finetune_dissect/grammar.py`): analytic log-probabilities, probe versions,
the entropy by hand and by sampling."""
import dataclasses
import math

import jax
import numpy as np
import pytest

from iclr24_jax.configs import finetune_dissect as cfg_mod
from iclr24_jax.papers.finetune_dissect import finetune as ft
from iclr24_jax.papers.finetune_dissect import grammar
from .helpers import SPEC, _domain_probes


def test_analytic_logprobs_normalised():
  # The grammar is a distribution: enumerate every document of a 1-sentence grammar and sum p(x) = 1.
  spec = grammar.GrammarSpec(num_topics=2, topic_vocab=2, num_styles=2, style_vocab=2, num_general_subjects=1,
                             num_domain_subjects=2, num_values=2, num_sentences=1)
  tables = grammar.fact_tables(jax.random.key(0), spec)
  gp = grammar.general_params(spec, tables, confidence=0.7)
  docs = []
  for sw in range(spec.num_styles * spec.style_vocab):
    for tw in range(spec.num_topics * spec.topic_vocab):
      for sj in range(spec.num_subjects):
        for v in range(spec.num_values):
          docs.append([grammar.BOS, spec.style_start + sw, spec.topic_start + tw, spec.subject_start + sj,
                       spec.value_start + v, grammar.SEP])
  lp = grammar.analytic_token_logprobs(gp, spec, np.array(docs)).sum(-1)
  np.testing.assert_allclose(np.exp(lp).sum(), 1.0, rtol=1e-10)


def test_probe_versions_change_one_factor():
  tables, probes = _domain_probes()
  o = probes["original"]
  ps, pt, pj, pv = (SPEC.positions(k) for k in range(4))
  assert np.all((o[:, pt] - SPEC.topic_start) // SPEC.topic_vocab == SPEC.domain_topic)
  assert np.all((o[:, ps] - SPEC.style_start) // SPEC.style_vocab == SPEC.domain_style)
  for name, pos in (("topic", pt), ("style", ps), ("counterfactual", pv)):
    diff = probes[name] != o
    assert np.all(diff[:, pos]) and not np.any(np.delete(diff, pos, axis=1)), name
  # The training domain mix is mostly (domain_topic_prob = 0.8), not only, on the domain topic.
  mix = dataclasses.replace(SPEC, domain_topic_prob=0.8)
  tables = grammar.fact_tables(jax.random.key(5), mix)
  docs = np.asarray(jax.jit(lambda k: grammar.sample_documents(k, mix, 4000, tables, "domain"))(jax.random.key(6)))
  frac = np.mean((docs[:, pt[0]] - SPEC.topic_start) // SPEC.topic_vocab == SPEC.domain_topic)
  assert abs(frac - 0.8) < 0.02   # 4000 draws: SE 0.0063
  t = (probes["topic"][:, pt] - SPEC.topic_start) // SPEC.topic_vocab
  assert np.all(t == t[:, :1]) and np.all(t != SPEC.domain_topic)
  assert np.all(probes["topic"][:, pt] % SPEC.topic_vocab == o[:, pt] % SPEC.topic_vocab)  # same word index


def test_general_entropy_by_hand_and_by_sampling():
  # Default grammar (4 topics x 8 words, 3 styles x 4, 64 + 512 subjects, 16 values, 4 sentences), nats per document:
  # ln 12 + 3 ln 4 + ln 32 + 3 ln 8 + 4 (ln 576 + 512/576 ln 16)
  # = 2.48491 + 4.15888 + 3.46574 + 6.23832 + 4 (6.35611 + 2.46452) = 51.63037; / 20 scored tokens = 2.58152.
  spec = ft.spec_from_config(cfg_mod.get_config("").data)
  ent = grammar.general_entropy(spec)
  assert ent["per_token"] == pytest.approx(51.63037 / 20, abs=1e-5)
  assert ent["later_topic"] == pytest.approx(math.log(8)) and ent["first_topic"] == pytest.approx(math.log(32))
  # Independently: the exact log-probabilities of sampled documents (only the value slot varies between documents:
  # 0 nats for a general subject, ln 16 for a domain one), averaged over 4000 documents: per-token SE
  # = ln 16 * sqrt(0.889 * 0.111) * sqrt(4 values) / 20 tokens / sqrt(4000) = 1.4e-3 -> 5 SE = 0.007.
  tables = grammar.fact_tables(jax.random.key(0), spec)
  ids = np.asarray(jax.jit(lambda k: grammar.sample_documents(k, spec, 4000, tables, "general"))(jax.random.key(1)))
  lp = grammar.analytic_token_logprobs(grammar.general_params(spec, tables), spec, ids)
  assert -lp[:, 1:].mean() == pytest.approx(ent["per_token"], abs=0.007)
  np.testing.assert_allclose(-lp[:, spec.positions(1)[1:]], math.log(8), rtol=1e-12)
  with pytest.raises(ValueError, match="num_sentences >= 2"):
    grammar.general_entropy(dataclasses.replace(spec, num_sentences=1))
