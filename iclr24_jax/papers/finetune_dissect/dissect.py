"""The estimator: per-token log-likelihood change of finetuning and its topic / style / factual decomposition.

Section 3 of the paper, as reconstructed here (the paper's text is not available offline; the official repository
holds only the finetuning code, so the equations below are written from the paper's description and the issue's
decisions; ambiguities are listed at the end):

  Delta_theta(x)_t = log p_ft(x_t | x_<t) - log p_base(x_t | x_<t)                                 # Eq. (1)

is the per-token log-likelihood ratio of the finetuned and the base model. A text x is generated from three latent
factors, its topic T, its style S and the factual knowledge K it states,

  log p(x) = log p(T) + log p(S | T) + log p(x | T, S, K)                                           # Eq. (2)

and for each original document x the probe set holds controlled-variable versions that change one factor and keep
the others: x^topic (the topic moved out of the domain), x^style (re-styled, e.g. casual), x^cf (counterfactual
facts, same topic and style). Finetuning's effect on each factor is read off the contrast with the original:

  topic   = E_x[ Delta(x) - Delta(x^topic) ]                                                         # Eq. (3)
  style   = E_x[ Delta(x) - Delta(x^style) ]                                                         # Eq. (4)
  factual = E_x[ Delta(x) - Delta(x^cf) ]                                                            # Eq. (5)

where Delta(x) is the per-token mean of Eq. (1) over the text (`reduction='mean'`, the paper's per-token unit) or
its sum (`reduction='sum'`, nats per document; the exact unit of the synthetic grammar). By position,
the same contrasts at each token index t (right-padded texts: t counts tokens from the start):

  c_t = mean_x Delta(x)_t - mean_x Delta(x^v)_t                                                      # Eq. (6)

Ambiguities (Deviation / choice, written down): (a) whether the topic contrast is taken against the original or
the counterfactual: we use the original (every version changes exactly one factor relative to it), so topic +
style + factual need not add up to Delta(x); `total` is returned beside the components. (b) whether the style
component averages several styles (the paper has casual and rap): `decompose` takes one style version; pass
`style_versions=(...)` to average several. (c) per-document pairing: versions are paired by row; a row whose
version was rejected by the probe filter (all-False mask) is dropped from that contrast only.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.lm import scoring

VERSIONS = ("original", "topic", "style", "counterfactual")
COMPONENT_VERSION = {"topic": "topic", "style": "style", "factual": "counterfactual"}


def token_logprob_change(base_params, ft_params, config, ids: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Eq. (1): the per-token log-likelihood ratio log p_ft(x_t | x_<t) - log p_base(x_t | x_<t).

  Args:
    base_params: the base (pretrained) model's parameters.
    ft_params: the finetuned model's parameters (LoRA merged: `lm.lora.merge`), same structure.
    config: the models' `lm.LlamaConfig`.
    ids: [B, T] int token ids.
    mask: [B, T] bool, real tokens (default all).

  Returns:
    [B, T] float32; 0 at padding and at each row's first real token (it has no context).
  """
  ids = jnp.asarray(ids)
  if ids.ndim != 2:
    raise ValueError(f"ids must be [batch, time], got shape {ids.shape}.")
  if mask is not None and tuple(np.shape(mask)) != tuple(ids.shape):
    raise ValueError(f"mask shape {np.shape(mask)} must equal ids shape {ids.shape}.")
  if jnp.issubdtype(ids.dtype, jnp.floating):
    raise ValueError(f"ids must be integer token ids, got dtype {ids.dtype}.")
  return (scoring.token_logprobs(ft_params, config, ids, mask)
          - scoring.token_logprobs(base_params, config, ids, mask))


def _as_mask(masks, name: str, shape: tuple[int, ...]) -> np.ndarray:
  if masks is None:
    return np.ones(shape, bool)
  m = masks.get(name) if isinstance(masks, Mapping) else masks
  if m is None:
    return np.ones(shape, bool)
  m = np.asarray(m).astype(bool)
  if m.shape != shape:
    raise ValueError(f"mask of version '{name}' has shape {m.shape}, its deltas {shape}; they must match.")
  return m


def per_document(delta: np.ndarray, mask: np.ndarray, reduction: str = "mean") -> np.ndarray:
  """Delta(x) per document: the per-token mean (or sum) of Eq. (1) over the real tokens.

  Args:
    delta: [B, T] per-token changes.
    mask: [B, T] bool, the tokens that count (padding and, usually, the first token excluded).
    reduction: 'mean' (per token) or 'sum' (per document).

  Returns:
    [B] float64; NaN for a row without counted tokens (a rejected probe).
  """
  if reduction not in ("mean", "sum"):
    raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}.")
  delta = np.asarray(delta, np.float64)
  m = np.asarray(mask, bool)
  total = np.where(m, delta, 0.0).sum(-1)
  n = m.sum(-1)
  with np.errstate(invalid="ignore", divide="ignore"):
    out = total / n if reduction == "mean" else np.where(n > 0, total, np.nan)
  return np.where(n > 0, out, np.nan)


def by_position(delta: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """Mean of Eq. (1) over documents at each token index: [B, T] -> [T] (NaN where no document has a token).

  Args:
    delta: [B, T] per-token log-likelihood change (Eq. (1)).
    mask: [B, T] bool, the tokens that count.

  Returns:
    [T] float64 mean over the documents with a token at that index.
  """
  delta = np.asarray(delta, np.float64)
  m = np.asarray(mask, bool)
  n = m.sum(0)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(n > 0, np.where(m, delta, 0.0).sum(0) / n, np.nan)


def decompose(deltas: Mapping[str, np.ndarray], masks=None, *, reduction: str = "mean",
              style_versions: Sequence[str] = ("style",)) -> dict:
  """Eqs. (3)-(6): topic, style and factual components of finetuning's log-likelihood change.

  Args:
    deltas: {version name: [B, T] per-token change (Eq. (1))} with 'original', 'topic', 'counterfactual' and the
      style version(s); row b of every version comes from the same source document. Texts are right-padded (token
      index t = t-th token) and versions may differ in length (pad to one T).
    masks: {version name: [B, T] bool}, one [B, T] array for all versions, or None (every token counts). A row
      with no True is a rejected probe and leaves that contrast.
    reduction: 'mean' (per-token Delta, the paper's unit) or 'sum' (per-document nats).
    style_versions: the style version(s); several are averaged per document (e.g. ('casual', 'rap')).

  Returns:
    dict(topic, style, factual, total: floats (total = mean Delta(original)),
         per_document: {topic, style, factual, total: [B] arrays, NaN where a version was rejected},
         by_position: {topic, style, factual: [T] contrasts (Eq. (6)), versions: {name: [T] mean Delta},
                       count: [T] documents with an original token at t},
         num_documents: {component: documents in the contrast}).
  """
  needed = ["original", "topic", "counterfactual", *style_versions]
  missing = [v for v in needed if v not in deltas]
  if missing:
    raise ValueError(f"decompose needs versions {needed}; missing {missing} (got {sorted(deltas)}).")
  arrs = {}
  for name in needed:
    d = np.asarray(deltas[name], np.float64)
    if d.ndim != 2:
      raise ValueError(f"deltas['{name}'] must be [batch, time], got shape {d.shape}.")
    if not np.all(np.isfinite(d)):
      raise ValueError(f"deltas['{name}'] holds NaN or inf: check the log-probabilities (a padded position "
                       "should be 0 and masked, not NaN).")
    arrs[name] = (d, _as_mask(masks, name, d.shape))
  b = arrs["original"][0].shape[0]
  t_max = max(d.shape[1] for d, _ in arrs.values())
  if any(d.shape[0] != b for d, _ in arrs.values()):
    raise ValueError(f"every version needs one row per source document ({b}); got "
                     f"{ {k: v[0].shape[0] for k, v in arrs.items()} }.")

  def pad(x, fill):
    return np.pad(x, ((0, 0), (0, t_max - x.shape[1])), constant_values=fill)

  arrs = {k: (pad(d, 0.0), pad(m, False)) for k, (d, m) in arrs.items()}
  doc = {k: per_document(d, m, reduction) for k, (d, m) in arrs.items()}
  pos = {k: by_position(d, m) for k, (d, m) in arrs.items()}
  style_doc = np.mean(np.stack([doc[s] for s in style_versions]), 0)
  style_pos = np.mean(np.stack([pos[s] for s in style_versions]), 0)
  per_doc = {"topic": doc["original"] - doc["topic"],            # Eq. (3)
             "style": doc["original"] - style_doc,                # Eq. (4)
             "factual": doc["original"] - doc["counterfactual"],  # Eq. (5)
             "total": doc["original"]}
  out = {k: float(np.nanmean(v)) if np.any(np.isfinite(v)) else float("nan") for k, v in per_doc.items()}
  out["per_document"] = per_doc
  out["num_documents"] = {k: int(np.sum(np.isfinite(v))) for k, v in per_doc.items()}
  out["by_position"] = {"topic": pos["original"] - pos["topic"], "style": pos["original"] - style_pos,  # Eq. (6)
                        "factual": pos["original"] - pos["counterfactual"], "versions": pos,
                        "count": arrs["original"][1].sum(0)}
  return out


def early_share(curve: np.ndarray, fraction: float = 0.25, count: np.ndarray | None = None) -> float:
  """Share of a by-position component's absolute mass in the first `fraction` of positions.

  Args:
    curve: [T] a component by position (`decompose(...)['by_position'][name]`).
    fraction: the leading fraction of positions (0.25 = first quarter).
    count: [T] optional documents per position; positions without any are ignored.

  Returns:
    sum_{t < fraction*T'} |c_t| / sum_t |c_t|, T' the number of positions with data (NaN if all zero).
  """
  c = np.abs(np.nan_to_num(np.asarray(curve, np.float64)))
  if count is not None:
    c = c[: int(np.max(np.nonzero(np.asarray(count) > 0)[0], initial=-1)) + 1]
  k = max(1, int(round(fraction * c.size)))
  tot = c.sum()
  return float(c[:k].sum() / tot) if tot > 0 else float("nan")


def half_time(steps: np.ndarray, values: np.ndarray) -> float:
  """The first step at which a component reaches half its final value (linear interpolation between evals).

  Args:
    steps: [E] increasing steps of the evaluations (step 0, the base model with value 0, is implied before them).
    values: [E] the component at those steps.

  Returns:
    The (interpolated) step; NaN if the final value is not positive (nothing learned).
  """
  steps = np.concatenate([[0.0], np.asarray(steps, np.float64)])
  values = np.concatenate([[0.0], np.asarray(values, np.float64)])
  final = values[-1]
  if not np.isfinite(final) or final <= 0:
    return float("nan")
  target = 0.5 * final
  i = int(np.argmax(values >= target))
  if i == 0:
    return float(steps[0])
  v0, v1 = values[i - 1], values[i]
  frac = (target - v0) / (v1 - v0) if v1 != v0 else 1.0
  return float(steps[i - 1] + frac * (steps[i] - steps[i - 1]))
