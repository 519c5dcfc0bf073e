"""The standard preference model baseline: a Bradley-Terry linear head on frozen LM hidden states.

r(y) = w . z(h(y)),  P(A > B) = sigmoid(r(A) - r(B)),  h = SmolLM2's final normed hidden states of the
prompt that holds the conversation and the reply (last token and mean over tokens, concatenated), z the
pooled standardisation. Trained on the same pairs as the CPM by the same L2 logistic solver (Newton; on the
rows when the embedding has more dimensions than there are pairs), the L2 strength chosen by the same
cross-validation; so the two models differ only in what they read: 13 + 1 interpretable features against
2 x 576 hidden dimensions.
# Deviation: the paper's standard PM is a fine-tuned Flan-T5-XL reward model (reward_model/
# RM_traing_from_scratch.py); here the backbone is frozen and only the linear head is fitted (CPU budget).
"""
from __future__ import annotations

from typing import Sequence

import jax

from iclr24_jax.papers.cpm import model as model_lib

PM_CS = tuple(float(c) for c in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 10.0))


def fit_pm(embed_a: jax.Array, embed_b: jax.Array, labels: jax.Array, Cs: Sequence[float] = PM_CS,
           num_folds: int = 8, seed: int | None = None, pad_rows: int = 64) -> tuple[model_lib.Model, dict]:
  """Fits the linear Bradley-Terry head on frozen embeddings, C chosen by k-fold CV accuracy.

  Args:
    embed_a: [N, D] embeddings of the first replies (in context).
    embed_b: [N, D] embeddings of the second replies.
    labels: [N] 1 where A is preferred.
    Cs: L2 strengths searched (scikit-learn's C).
    num_folds: CV folds.
    seed: None (unshuffled stratified folds, as the CPM's) or a fold shuffle seed.
    pad_rows: row padding multiple (compile sharing only).

  Returns:
    (model, cv info) as `model.cross_validate`; `model.reward(pm, embeddings)` scores replies.
  """
  return model_lib.cross_validate(embed_a, embed_b, labels, penalties=("l2",), Cs=Cs, num_folds=num_folds,
                                  seed=seed, pad_rows=pad_rows)
