"""Action distributions as small pytrees: categorical, diagonal Gaussian, tanh-squashed and clipped Gaussian.

Every distribution works on *raw* actions, the value that is sampled and stored in a trajectory, and maps
it to the action the environment sees with `to_env(raw)`:

- `Categorical`: raw = env action = an integer index.
- `Gaussian` (`squash='none'`): raw = env action.
- `ClippedGaussian` (`squash='clip'`, PureJaxRL / CleanRL style): raw ~ N(mean, std); the environment gets
  `clip(raw, low, high)`; log-probs and entropy are the Gaussian's of the raw sample.
- `TanhGaussian` (`squash='tanh'`, brax / SAC style): raw = u ~ N(mean, std); the environment gets
  `tanh(u)` in [-1, 1]; log p(a) = log N(u) - sum log(1 - tanh(u)^2). The entropy has no closed form: its
  one-sample estimate -log p(tanh(u)) is returned (its expectation is the exact entropy).

All shapes: leading batch dims `[...]`, event dim `[A]` for continuous actions, `[K]` logits for discrete.
"""
from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp

LOG_2PI = math.log(2.0 * math.pi)


@flax.struct.dataclass
class Categorical:
  """Categorical over K actions from unnormalised logits [..., K]."""

  logits: jax.Array

  @property
  def log_probs_all(self) -> jax.Array:
    """[..., K] normalised log-probabilities."""
    return jax.nn.log_softmax(self.logits, axis=-1)

  def sample(self, key: jax.Array) -> jax.Array:
    """Returns [...] int32 action indices."""
    return jax.random.categorical(key, self.logits, axis=-1).astype(jnp.int32)

  def mode(self) -> jax.Array:
    """The most likely action [...] (argmax of the logits), int32."""
    return jnp.argmax(self.logits, axis=-1).astype(jnp.int32)

  def log_prob(self, raw: jax.Array) -> jax.Array:
    """log pi(a) [...] for integer actions [...]."""
    raw = raw.astype(jnp.int32)
    return jnp.take_along_axis(self.log_probs_all, raw[..., None], axis=-1)[..., 0]

  def entropy(self, key: jax.Array | None = None) -> jax.Array:
    """-sum_k p_k log p_k [...] (closed form; `key` unused)."""
    del key
    logp = self.log_probs_all
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)

  def to_env(self, raw: jax.Array) -> jax.Array:
    """The environment action of a raw action: the index itself, [...]."""
    return raw


@flax.struct.dataclass
class Gaussian:
  """Diagonal Gaussian N(mean, exp(log_std)^2) over [..., A]; raw action = env action."""

  mean: jax.Array
  log_std: jax.Array

  def sample(self, key: jax.Array) -> jax.Array:
    """A raw action mean + std z, z ~ N(0, I): [..., A] of mean's shape and dtype."""
    return self.mean + jnp.exp(self.log_std) * jax.random.normal(key, self.mean.shape, self.mean.dtype)

  def mode(self) -> jax.Array:
    """The mean [..., A] (the most likely raw action)."""
    return self.mean

  def log_prob(self, raw: jax.Array) -> jax.Array:
    """sum_i [-(x_i - mu_i)^2 / (2 s_i^2) - log s_i - log(2 pi)/2] -> [...]."""
    z = (raw - self.mean) * jnp.exp(-self.log_std)
    return jnp.sum(-0.5 * z * z - self.log_std - 0.5 * LOG_2PI, axis=-1)

  def entropy(self, key: jax.Array | None = None) -> jax.Array:
    """sum_i [log s_i + (1 + log 2 pi) / 2] -> [...] (closed form)."""
    del key
    log_std = jnp.broadcast_to(self.log_std, self.mean.shape)
    return jnp.sum(log_std + 0.5 * (1.0 + LOG_2PI), axis=-1)

  def to_env(self, raw: jax.Array) -> jax.Array:
    """The environment action of a raw action [..., A]: the raw action itself."""
    return raw


@flax.struct.dataclass
class ClippedGaussian(Gaussian):
  """Gaussian whose samples are clipped into [low, high] for the environment only."""

  low: float = flax.struct.field(pytree_node=False, default=-1.0)
  high: float = flax.struct.field(pytree_node=False, default=1.0)

  def mode(self) -> jax.Array:
    """The mean [..., A] (raw; `to_env` clips it)."""
    return self.mean

  def to_env(self, raw: jax.Array) -> jax.Array:
    """clip(raw, low, high) [..., A]: the action the environment sees."""
    return jnp.clip(raw, self.low, self.high)


def _log1m_tanh_sq(u: jax.Array) -> jax.Array:
  """log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|."""
  return 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))


@flax.struct.dataclass
class TanhGaussian(Gaussian):
  """a = tanh(u), u ~ N(mean, std); raw = u (pre-squash) so log-probs never need atanh."""

  def mode(self) -> jax.Array:
    """The raw mode: the mean [..., A] (the env action is tanh(mean))."""
    return self.mean  # raw mode; the env action is tanh(mean)

  def log_prob(self, raw: jax.Array) -> jax.Array:
    """log p(tanh(u)) = log N(u) - sum_i log(1 - tanh(u_i)^2) -> [...] (change of variables)."""
    return super().log_prob(raw) - jnp.sum(_log1m_tanh_sq(raw), axis=-1)

  def log_prob_action(self, action: jax.Array, eps: float = 1e-6) -> jax.Array:
    """log p(a) [...] for squashed actions a in (-1, 1) (e.g. from an offline data set); a is clipped by eps.

    Args:
      action: [..., A] env actions in [-1, 1].
      eps: actions are clipped to [-1 + eps, 1 - eps] before atanh.

    Returns:
      [...] log-densities of the squashed distribution.
    """
    a = jnp.clip(action, -1.0 + eps, 1.0 - eps)
    return self.log_prob(jnp.arctanh(a))

  def entropy(self, key: jax.Array | None = None) -> jax.Array:
    """One-sample estimate of H[tanh(u)] = H[N] + E[log(1 - tanh(u)^2)] -> [...].

    Args:
      key: draws the sample; None uses u = mean (a deterministic, biased proxy).
    """
    u = self.mean if key is None else self.sample(key)
    return super().entropy() + jnp.sum(_log1m_tanh_sq(u), axis=-1)

  def to_env(self, raw: jax.Array) -> jax.Array:
    """tanh(raw) [..., A] in (-1, 1): the action the environment sees."""
    return jnp.tanh(raw)


def make_gaussian(mean: jax.Array, log_std: jax.Array, squash: str = "tanh", low: float = -1.0,
                  high: float = 1.0) -> Gaussian:
  """A Gaussian policy distribution with the given squashing.

  Args:
    mean: [..., A].
    log_std: [..., A] or [A].
    squash: 'tanh' (TanhGaussian), 'clip' (ClippedGaussian into [low, high]) or 'none' (Gaussian).

  Returns:
    The distribution.
  """
  log_std = jnp.broadcast_to(log_std, mean.shape)
  if squash == "tanh":
    return TanhGaussian(mean, log_std)
  if squash == "clip":
    return ClippedGaussian(mean, log_std, low=low, high=high)
  if squash == "none":
    return Gaussian(mean, log_std)
  raise ValueError(f"unknown squash '{squash}'; choose 'tanh', 'clip' or 'none'.")
