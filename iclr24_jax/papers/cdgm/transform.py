"""Mode-specific normalisation (TVAE/CTGAN `DataTransformer`), fitted on the host and applied in JAX.

Each continuous column gets a Bayesian GMM (sklearn `BayesianGaussianMixture`, 10 components, Dirichlet-process
prior 0.001; components with weight > 0.005 are kept). A value x of mode k is represented by
  alpha = clip((x - mu_k) / (4 sigma_k), -0.99, 0.99)   and the one-hot of k,
and a discrete column by the one-hot of its category. The network's output vector is laid out as
  [alpha: Cc] [component logits: Cc x K] [category logits: Cd x N]
(padded to K components / N categories with masked slots); the official code packs the spans column by column,
which is the same representation in another memory order.

The inverse transform used inside training (official `_reverse_transform_helper` on tensors) is differentiable in
alpha: x = clip(alpha, -1, 1) * 4 * sigma_k + mu_k with k the (detached) hard one-hot, then clipped to the
training range (`enforce_min_max_values=True`).
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

STD_MULTIPLIER = 4.0
MASK_LOGIT = -1e9


@dataclasses.dataclass(frozen=True, eq=False)
class TableTransform:
  """Fitted mode-specific normalisation for a table with D columns.

  Attributes:
    num_features: D.
    cont_idx: [Cc] continuous column indices.
    disc_idx: [Cd] discrete column indices.
    means, stds: [Cc, K] GMM component means / standard deviations (padding: 0 / 1).
    comp_valid: [Cc, K] which components are kept.
    weights: [Cc, K] GMM mixture weights (for the host-side component sampling).
    mins, maxs: [Cc] training range of each continuous column.
    cat_values: [Cd, N] category values (padding 0).
    cat_valid: [Cd, N] which category slots exist.
    cat_freq: [Cd, N] empirical category frequencies (for CTGAN's conditional vector).
  """

  num_features: int
  cont_idx: np.ndarray
  disc_idx: np.ndarray
  means: np.ndarray
  stds: np.ndarray
  comp_valid: np.ndarray
  weights: np.ndarray
  mins: np.ndarray
  maxs: np.ndarray
  cat_values: np.ndarray
  cat_valid: np.ndarray
  cat_freq: np.ndarray

  @property
  def num_cont(self) -> int:
    return int(len(self.cont_idx))

  @property
  def num_disc(self) -> int:
    return int(len(self.disc_idx))

  @property
  def num_components(self) -> int:
    return int(self.means.shape[1])

  @property
  def num_categories(self) -> int:
    return int(self.cat_values.shape[1])

  @property
  def data_dim(self) -> int:
    """Width of the encoded vector: Cc + Cc*K + Cd*N."""
    return self.num_cont * (1 + self.num_components) + self.num_disc * self.num_categories

  def split(self, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """[B, data_dim] -> (alpha [B, Cc], components [B, Cc, K], categories [B, Cd, N])."""
    cc, k, cd, n = self.num_cont, self.num_components, self.num_disc, self.num_categories
    alpha = v[:, :cc]
    comp = v[:, cc:cc + cc * k].reshape(v.shape[0], cc, k)
    cat = v[:, cc + cc * k:].reshape(v.shape[0], cd, n)
    return alpha, comp, cat

  @staticmethod
  def join(alpha: jax.Array, comp: jax.Array, cat: jax.Array) -> jax.Array:
    b = alpha.shape[0]
    return jnp.concatenate([alpha, comp.reshape(b, -1), cat.reshape(b, -1)], axis=1)


def fit_transform(data: np.ndarray, discrete: Sequence[int] = (), max_clusters: int = 10,
                  weight_threshold: float = 0.005, seed: int = 0, max_fit_rows: int | None = None,
                  max_iter: int = 100) -> TableTransform:
  """Fits the per-column Bayesian GMMs / category lists.

  Args:
    data: [N, D] training rows (float).
    discrete: indices of discrete columns (one-hot encoded, not normalised).
    max_clusters: GMM components per continuous column.
    weight_threshold: components with a smaller weight are dropped.
    seed: GMM random_state and subsampling seed.
    max_fit_rows: fit the GMMs on at most this many rows (None: all rows). Deviation for CPU budgets only.
    max_iter: EM iterations (sklearn default 100).

  Returns:
    A `TableTransform`.
  """
  from sklearn.mixture import BayesianGaussianMixture
  data = np.asarray(data, np.float64)
  if data.ndim != 2:
    raise ValueError(f"expected [N, D] data, got shape {data.shape}.")
  if not np.all(np.isfinite(data)):
    raise ValueError("the training table has NaN/inf values; impute or drop them first.")
  d = data.shape[1]
  discrete = sorted(int(i) for i in discrete)
  if any(i < 0 or i >= d for i in discrete):
    raise ValueError(f"discrete column indices {discrete} out of range for {d} columns.")
  cont = [i for i in range(d) if i not in discrete]
  rng = np.random.default_rng(seed)
  fit_rows = data if (max_fit_rows is None or len(data) <= max_fit_rows) else data[
      rng.choice(len(data), max_fit_rows, replace=False)]
  k = max_clusters
  means = np.zeros((len(cont), k))
  stds = np.ones((len(cont), k))
  valid = np.zeros((len(cont), k), bool)
  weights = np.zeros((len(cont), k))
  for i, c in enumerate(cont):
    col = fit_rows[:, c:c + 1]
    n_comp = int(min(k, len(np.unique(col))))
    if n_comp <= 1:  # a constant column: one component with unit scale
      means[i, 0], stds[i, 0], valid[i, 0], weights[i, 0] = float(col[0, 0]), 1.0, True, 1.0
      continue
    gm = BayesianGaussianMixture(n_components=n_comp, weight_concentration_prior_type="dirichlet_process",
                                 weight_concentration_prior=0.001, n_init=1, random_state=seed, max_iter=max_iter)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      gm.fit(col)
    keep = gm.weights_ > weight_threshold
    if not keep.any():
      keep[np.argmax(gm.weights_)] = True
    means[i, :n_comp] = gm.means_.reshape(-1)
    stds[i, :n_comp] = np.sqrt(gm.covariances_.reshape(-1))
    valid[i, :n_comp] = keep
    weights[i, :n_comp] = gm.weights_
  stds = np.maximum(stds, 1e-6)
  cats = [np.unique(data[:, c]) for c in discrete]
  n_max = max([len(v) for v in cats], default=1)
  cat_values = np.zeros((len(discrete), n_max))
  cat_valid = np.zeros((len(discrete), n_max), bool)
  cat_freq = np.zeros((len(discrete), n_max))
  for i, (c, v) in enumerate(zip(discrete, cats)):
    cat_values[i, :len(v)] = v
    cat_valid[i, :len(v)] = True
    cat_freq[i, :len(v)] = [(data[:, c] == u).mean() for u in v]
  return TableTransform(num_features=d, cont_idx=np.array(cont, np.int32), disc_idx=np.array(discrete, np.int32),
                        means=means, stds=stds, comp_valid=valid, weights=weights,
                        mins=data[:, cont].min(0) if cont else np.zeros(0),
                        maxs=data[:, cont].max(0) if cont else np.zeros(0),
                        cat_values=cat_values, cat_valid=cat_valid, cat_freq=cat_freq)


def encode(tf: TableTransform, data: np.ndarray, seed: int = 0) -> np.ndarray:
  """Host-side transform of real rows (component sampled from the GMM posterior, as the official code does).

  Args:
    tf: the fitted transform.
    data: [N, D] rows.
    seed: seed of the component sampling.

  Returns:
    [N, data_dim] float32 encoded rows.
  """
  data = np.asarray(data, np.float64)
  if data.ndim != 2 or data.shape[1] != tf.num_features:
    raise ValueError(f"expected [N, {tf.num_features}] rows, got {data.shape}.")
  rng = np.random.default_rng(seed)
  n = len(data)
  x = data[:, tf.cont_idx]                                        # [N, Cc]
  # Posterior responsibilities of the kept components (plug-in weights x Gaussian likelihood; the official code uses
  # sklearn's predict_proba restricted to the kept components, + 1e-6, renormalised).
  z = (x[:, :, None] - tf.means[None]) / tf.stds[None]
  logp = -0.5 * z ** 2 - np.log(tf.stds[None]) + np.log(np.maximum(tf.weights[None], 1e-300))
  logp = np.where(tf.comp_valid[None], logp, -np.inf)
  logp -= logp.max(-1, keepdims=True)
  p = np.exp(logp) + 1e-6 * tf.comp_valid[None]
  p /= p.sum(-1, keepdims=True)
  u = rng.random((n, tf.num_cont, 1))
  comp = np.minimum((np.cumsum(p, -1) < u).sum(-1), tf.num_components - 1)   # [N, Cc]
  mu = np.take_along_axis(tf.means[None].repeat(n, 0), comp[..., None], -1)[..., 0]
  sd = np.take_along_axis(tf.stds[None].repeat(n, 0), comp[..., None], -1)[..., 0]
  alpha = np.clip((x - mu) / (STD_MULTIPLIER * sd), -0.99, 0.99)
  comp_oh = np.eye(tf.num_components)[comp] if tf.num_cont else np.zeros((n, 0, tf.num_components))
  cat_oh = np.zeros((n, tf.num_disc, tf.num_categories))
  for i, c in enumerate(tf.disc_idx):
    idx = np.searchsorted(tf.cat_values[i, :tf.cat_valid[i].sum()], data[:, c])
    idx = np.clip(idx, 0, tf.cat_valid[i].sum() - 1)
    cat_oh[np.arange(n), i, idx] = 1.0
  out = np.concatenate([alpha, comp_oh.reshape(n, -1), cat_oh.reshape(n, -1)], axis=1)
  return out.astype(np.float32)


def _gumbel_softmax_hard(key: jax.Array, logits: jax.Array, tau: float) -> jax.Array:
  """Straight-through Gumbel-softmax (torch `gumbel_softmax(hard=True)`)."""
  g = jax.random.gumbel(key, logits.shape, logits.dtype)
  soft = jax.nn.softmax((logits + g) / tau, axis=-1)
  hard = jax.nn.one_hot(jnp.argmax(soft, axis=-1), logits.shape[-1], dtype=logits.dtype)
  return hard + soft - jax.lax.stop_gradient(soft)


def masked_logits(tf: TableTransform, raw: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Splits raw network outputs and masks the padded component/category slots."""
  alpha, comp, cat = tf.split(raw)
  comp = jnp.where(jnp.asarray(tf.comp_valid)[None], comp, MASK_LOGIT)
  cat = jnp.where(jnp.asarray(tf.cat_valid)[None], cat, MASK_LOGIT)
  return alpha, comp, cat


def activate(tf: TableTransform, raw: jax.Array, key: jax.Array, tau: float = 0.2) -> jax.Array:
  """tanh on alpha, hard Gumbel-softmax (tau 0.2) on component/category logits (official `_apply_activate`).

  Args:
    tf: the transform.
    raw: [B, data_dim] network outputs.
    key: PRNG key.
    tau: Gumbel temperature.

  Returns:
    [B, data_dim] activated vector (one-hot blocks, straight-through gradients).
  """
  alpha, comp, cat = masked_logits(tf, raw)
  k1, k2 = jax.random.split(key)
  return tf.join(jnp.tanh(alpha), _gumbel_softmax_hard(k1, comp, tau), _gumbel_softmax_hard(k2, cat, tau))


def decode(tf: TableTransform, v: jax.Array) -> jax.Array:
  """Inverse transform of an activated vector to the original feature space.

  Args:
    tf: the transform.
    v: [B, data_dim] activated vector (one-hot component/category blocks).

  Returns:
    [B, D] rows.
  """
  alpha, comp, cat = tf.split(v)
  comp_sel = jax.lax.stop_gradient(comp)  # official: the selected component is detached
  mu = jnp.sum(comp_sel * jnp.asarray(tf.means, v.dtype)[None], -1)
  sd = jnp.sum(comp_sel * jnp.asarray(tf.stds, v.dtype)[None], -1)
  x_cont = jnp.clip(alpha, -1.0, 1.0) * STD_MULTIPLIER * sd + mu
  x_cont = jnp.clip(x_cont, jnp.asarray(tf.mins, v.dtype), jnp.asarray(tf.maxs, v.dtype))
  x_disc = jnp.sum(cat * jnp.asarray(tf.cat_values, v.dtype)[None], -1)
  out = jnp.zeros((v.shape[0], tf.num_features), v.dtype)
  out = out.at[:, tf.cont_idx].set(x_cont)
  return out.at[:, tf.disc_idx].set(x_disc)


def reencode_alpha(tf: TableTransform, x: jax.Array, comp: jax.Array) -> jax.Array:
  """alpha of corrected rows under the given (detached) components (official `_transform` on tensors).

  Args:
    tf: the transform.
    x: [B, D] rows in the original space.
    comp: [B, Cc, K] one-hot components.

  Returns:
    [B, Cc] alpha in [-0.99, 0.99].
  """
  comp_sel = jax.lax.stop_gradient(comp)
  mu = jnp.sum(comp_sel * jnp.asarray(tf.means, x.dtype)[None], -1)
  sd = jnp.sum(comp_sel * jnp.asarray(tf.stds, x.dtype)[None], -1)
  return jnp.clip((x[:, tf.cont_idx] - mu) / (STD_MULTIPLIER * sd), -0.99, 0.99)
