"""Preference pairs for CPM: HH-RLHF (harmless-base test) from the shared data folder, and a synthetic generator
whose true feature weights and true reward are known.

The official code reads the pairs with features already attached (dongyoung4091/hh-rlhf_with_features_*) and
puts the chosen reply in position A or B at random (`preprocess_hh_dataset`: label 1 = A is chosen); the same
is done here with a seeded generator.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from iclr24_jax.papers.cpm import features as feat

_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):", re.S)


def load_pairs(num_pairs: int, seed: int = 0, max_chars: int = 600, data_dir: str | None = None,
               skip: int = 0) -> list[dict]:
  """HH-RLHF harmless-base test pairs as (history, reply A, reply B, label).

  Pairs are kept when both replies are non-empty and different, chosen and rejected share the history, and
  both transcripts have at most `max_chars` characters; they are shuffled with `seed` and `num_pairs` are
  taken after the first `skip`. Each pair's chosen reply goes to A or B by a fair coin (official).

  Args:
    num_pairs: pairs to return.
    seed: shuffling and A/B-order seed.
    max_chars: longest transcript kept (the LM cost grows with the prompt length).
    data_dir: the HH-RLHF folder (holding harmless-base/) or the shared data folder above it (default:
      ICLR24_DATA or ../shared/data).
    skip: pairs skipped first (so disjoint sets can be drawn from one shuffle).

  Returns:
    A list of {'history', 'reply_a', 'reply_b', 'label' (1: A is chosen), 'index' (row in the file)}.
  """
  import os
  from iclr24_jax.common import textdata
  if data_dir and os.path.isdir(os.path.join(data_dir, "hh_rlhf")):
    data_dir = os.path.join(data_dir, "hh_rlhf")
  rows = textdata.load_hh_rlhf(split="test", subset="harmless-base", data_dir=data_dir)
  keep = []
  for i, r in enumerate(rows):
    if len(r["chosen"]) > max_chars or len(r["rejected"]) > max_chars:
      continue
    h1, c = feat.split_dialogue(r["chosen"])
    h2, j = feat.split_dialogue(r["rejected"])
    if h1 != h2 or not c or not j or c == j:
      continue
    keep.append((i, h1, c, j))
  rng = np.random.default_rng(seed)
  order = rng.permutation(len(keep))
  if skip + num_pairs > len(keep):
    raise ValueError(f"asked for {num_pairs} pairs after {skip}, but only {len(keep)} HH-RLHF pairs have "
                     f"transcripts <= {max_chars} characters; raise max_chars or ask for fewer.")
  flips = rng.random(len(keep)) < 0.5
  out = []
  for k in order[skip:skip + num_pairs]:
    i, h, c, j = keep[k]
    a_is_chosen = bool(flips[k])
    out.append({"history": h, "reply_a": c if a_is_chosen else j, "reply_b": j if a_is_chosen else c,
                "label": int(a_is_chosen), "index": int(i)})
  return out


def history_messages(history: str) -> list[dict[str, str]]:
  """An HH transcript ("Human: ... \\n\\nAssistant: ... \\n\\nHuman: ...") as chat messages.

  Args:
    history: the transcript before the reply.

  Returns:
    [{'role': 'user' | 'assistant', 'content'}, ...].
  """
  text = "\n\n" + history.strip()
  parts = _TURN.split(text)
  msgs = []
  for role, content in zip(parts[1::2], parts[2::2]):
    msgs.append({"role": "user" if role == "Human" else "assistant", "content": content.strip()})
  if not msgs:
    raise ValueError(f"no Human/Assistant turns in the history: {history[:80]!r}.")
  return msgs


def make_synthetic(seed: int, num_pairs: int, weights: Sequence[float] | np.ndarray,
                   embed_dim: int = 0, embed_noise: float = 1.0, feature_corr: float = 0.3) -> dict:
  """Pairs whose labels come from a known Bradley-Terry reward on features (and, optionally, an embedding).

  Features of each reply: 1 + 9 * sigmoid of correlated Gaussians (scores in (1, 10) like the LM's expected
  scores); the true reward R*(y) = weights . z(f(y)) with z standardising by the generator's known
  population moments; label ~ Bernoulli(sigmoid(R*(A) - R*(B))). The embedding (for a standard-PM stand-in)
  mixes the features linearly into `embed_dim` dimensions plus Gaussian noise.

  Args:
    seed: generator seed.
    num_pairs: N pairs.
    weights: [F] true weights on standardised features.
    embed_dim: D (0: no embedding).
    embed_noise: noise std of the embedding.
    feature_corr: correlation between any two latent feature Gaussians.

  Returns:
    {'fa', 'fb': [N, F], 'labels': [N], 'reward_a', 'reward_b': [N] true rewards, 'weights': [F],
      'ea', 'eb': [N, D] (if embed_dim)}. Draw train and test pairs in one call and split them, so both share
      the embedding's projection.
  """
  w = np.asarray(weights, np.float64)
  f = w.shape[0]
  rng = np.random.default_rng(seed)
  cov = np.full((f, f), feature_corr) + (1 - feature_corr) * np.eye(f)
  chol = np.linalg.cholesky(cov)

  def draw(n):
    g = rng.normal(size=(n, f)) @ chol.T
    return 1.0 + 9.0 / (1.0 + np.exp(-g)), g

  fa, ga = draw(num_pairs)
  fb, gb = draw(num_pairs)
  # z(f) through the known latent Gaussian (monotone in f): the true reward is linear in it.
  ra, rb = ga @ w, gb @ w
  labels = (rng.random(num_pairs) < 1.0 / (1.0 + np.exp(-(ra - rb)))).astype(np.int32)
  out = {"fa": fa, "fb": fb, "labels": labels, "reward_a": ra, "reward_b": rb, "weights": w}
  if embed_dim:
    proj = rng.normal(size=(f, embed_dim)) / np.sqrt(f)
    out["ea"] = ga @ proj + embed_noise * rng.normal(size=(num_pairs, embed_dim))
    out["eb"] = gb @ proj + embed_noise * rng.normal(size=(num_pairs, embed_dim))
  return out
