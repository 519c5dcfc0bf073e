"""Grammar specs and helpers shared by the finetune-dissect test modules."""
import functools

import jax
import numpy as np

from iclr24_jax.configs import finetune_dissect as cfg_mod
from iclr24_jax.papers.finetune_dissect import finetune as ft
from iclr24_jax.papers.finetune_dissect import grammar


SPEC = grammar.GrammarSpec(num_topics=4, topic_vocab=3, num_styles=3, style_vocab=2, num_general_subjects=5,
                           num_domain_subjects=7, num_values=4, num_sentences=4, domain_topic_prob=1.0,
                           domain_style_prob=1.0)


@functools.lru_cache(maxsize=None)
def _domain_probes(n=32, seed=0):
  @jax.jit
  def make(key):
    tables = grammar.fact_tables(jax.random.fold_in(key, 1), SPEC)
    ids = grammar.sample_documents(jax.random.fold_in(key, 2), SPEC, n, tables, "domain")
    return tables, grammar.probe_versions(jax.random.fold_in(key, 3), SPEC, ids, tables)
  tables, versions = make(jax.random.key(seed))
  return tables, {k: np.asarray(v) for k, v in versions.items()}


SMALL = ft.spec_from_config(cfg_mod.get_config("tiny").data)   # 3 topics x 4 words, 2 styles x 3 words, 3 sentences


def _assert_base_models_grammar(fit, ent, tol=0.05):
  fit = {k: np.asarray(v) for k, v in fit.items()}
  # Within tol of the entropy per token, and later topic / style words near ln V_t / ln V_s: a base that ignores
  # the context would pay ln(T V_t) / ln(S V_s) there.
  for k in ("per_token", "later_topic", "later_style"):
    assert np.all(np.abs(fit[k] - ent[k]) < tol), (k, fit[k], ent[k])
