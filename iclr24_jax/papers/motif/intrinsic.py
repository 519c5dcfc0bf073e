"""Motif's intrinsic reward: normalisation, threshold, episodic count decay, and the combined reward.

  r_hat = (r_phi(m) - mu) / sigma                                   # mu, sigma over the training messages
  r_int = 1[r_hat > eps] * r_hat / N_episode(m)^beta                # [int]: eps a quantile of r_hat, beta = 3
  r     = alpha_ext * r_ext + alpha_int * r_int                      # [sum]
  r_ext = clip(reward_scale * r_env, -reward_clip, reward_clip)     # the PPO's reward processing

([int] and [sum] name the paper's intrinsic and total reward in the code comments below; the threshold is
written with > as in the official learner.) The reward scale multiplies the game reward only: the PPO scales
(and clips) r_env before the hook sees it (`rl.ppo.process_reward`), as sample-factory's actor worker does
(`actor_worker.py:458-459`), and the official learner adds the intrinsic term unscaled
(`learner.py:792-793`: extrinsic_reward * rewards + llm_reward * r_int).

Official run (README, NetHackScore): alpha_ext = alpha_int = 0.1 (`--extrinsic_reward`, `--llm_reward`),
`--reward_scale 0.1` and sample-factory's default `--reward_clip 10`, so one score point weighs 0.01 and one unit
of r_int 0.1 (1:10); beta = 3, eps = the 0.5 quantile of r_hat over the unique training messages; mu and sigma are
the running mean / variance of r_phi over all messages of the training pairs (scripts/train_reward.py,
rlaif/reward_model.py), and the count N_episode(m) includes the current occurrence and restarts with every episode
(obs_wrappers.MessageWrapper).

Deviation: the official learner looks eps up in its saved table of 19 quantiles (0.05 ... 0.95) and crashes for
any other value; here any quantile in [0, 1] is computed from the normalised rewards (`threshold`), and
`eps_quantile=None` disables the threshold (the official '0.0' setting, eps = -1000).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks

QUANTILE_LEVELS = tuple(round(0.05 * i, 2) for i in range(1, 20))  # the official saved quantiles


def fit_normalisation(rewards: Any, unique_rewards: Any = None, levels: Sequence[float] = QUANTILE_LEVELS,
                      weights: Any = None) -> tuple[float, float, np.ndarray]:
  """mu, sigma of r_phi over the training messages and the quantiles of the normalised unique rewards.

  Args:
    rewards: [N] r_phi of every message occurrence in the training pairs (both members of each pair).
    unique_rewards: [U] r_phi of the unique training messages (default: `rewards`); the threshold quantiles
      are taken over these, as the official code does (its sorted_messages list).
    levels: quantile levels in [0, 1].
    weights: optional [N] non-negative weights for `rewards` (e.g. counts of repeated messages).

  Returns:
    (mu, sigma, quantiles [len(levels)] of (unique_rewards - mu) / sigma). sigma is the population standard
    deviation (the official RunningMeanStd's M2 / n).

  Raises:
    ValueError: empty or non-finite rewards, a constant reward (sigma = 0), levels outside [0, 1].
  """
  r = np.asarray(rewards, np.float64).reshape(-1)
  if r.size == 0 or not np.all(np.isfinite(r)):
    raise ValueError("fit_normalisation needs a non-empty array of finite rewards.")
  w = np.ones_like(r) if weights is None else np.asarray(weights, np.float64).reshape(-1)
  if w.shape != r.shape or np.any(w < 0) or w.sum() <= 0:
    raise ValueError(f"weights must be non-negative with the shape of rewards {r.shape}, got {w.shape}.")
  mu = float(np.sum(w * r) / np.sum(w))
  sigma = float(np.sqrt(np.sum(w * (r - mu) ** 2) / np.sum(w)))
  if not sigma > 0:
    raise ValueError("fit_normalisation: the rewards are constant (sigma = 0); the reward model has not learned "
                     "to separate messages.")
  lv = np.asarray(levels, np.float64)
  if np.any((lv < 0) | (lv > 1)):
    raise ValueError(f"quantile levels must lie in [0, 1], got {levels}.")
  u = r if unique_rewards is None else np.asarray(unique_rewards, np.float64).reshape(-1)
  return mu, sigma, np.quantile((u - mu) / sigma, lv).astype(np.float32)


def threshold(normalised_unique: Any, quantile: float | None) -> float:
  """eps = the `quantile` of the normalised unique training rewards (linear interpolation, as torch.quantile);
  None -> -inf (no threshold).

  Args:
    normalised_unique: the normalised rewards (r - mu) / sigma of the unique training messages (any shape).
    quantile: level in [0, 1], or None.

  Returns:
    eps as a float (-inf for None).

  Raises:
    ValueError: quantile outside [0, 1], or no rewards.
  """
  # Deviation: any quantile, computed here (the official reads one of its 19 saved quantiles or crashes).
  if quantile is None:
    return float("-inf")
  if not 0.0 <= float(quantile) <= 1.0:
    raise ValueError(f"eps quantile must be in [0, 1] or None, got {quantile}.")
  x = np.asarray(normalised_unique, np.float64).reshape(-1)
  if x.size == 0:
    raise ValueError("threshold needs at least one normalised reward.")
  return float(np.quantile(x, float(quantile)))


def intrinsic_reward(r: jax.Array, mu: Any, sigma: Any, eps: Any, counts: jax.Array, beta: Any = 3.0) -> jax.Array:
  """r_int = 1[r_hat > eps] r_hat / counts^beta with r_hat = (r - mu) / sigma ([int]).

  Args:
    r: [...] raw reward-model outputs r_phi(m).
    mu, sigma: normalisation (scalars).
    eps: threshold on r_hat (-inf: none).
    counts: [...] N_episode(m) >= 1, including the current occurrence.
    beta: count exponent (official 3).

  Returns:
    [...] float32 intrinsic rewards (0 where r_hat <= eps). A sigma <= 0 or beta < 0 raises eagerly (Python
    numbers) or gives NaN under jit (traced values).
  """
  where = "motif.intrinsic_reward"
  if np.shape(r) != np.shape(counts):
    raise checks.ShapeError(f"{where}: rewards {np.shape(r)} and counts {np.shape(counts)} must have the same "
                            "shape.")
  ok = checks.all_ok(checks.in_range(where, "sigma", sigma, 0.0, None, low_open=True,
                                     hint="the standard deviation of r_phi over the training messages."),
                     checks.in_range(where, "beta", beta, 0.0, None, hint="the count exponent (official 3)."))
  r = jnp.asarray(r, jnp.float32)
  counts = jnp.asarray(counts, jnp.float32)
  r_hat = (r - mu) / sigma
  # counts < 1 cannot occur after a step (the current message is counted); clamp so a reset row is finite.
  return checks.poison(jnp.where(r_hat > eps, r_hat, 0.0) / jnp.maximum(counts, 1.0) ** beta, ok)  # [int]


def combine_rewards(r_ext: jax.Array, r_int: jax.Array, alpha_ext: Any = 0.1, alpha_int: Any = 0.1) -> jax.Array:
  """alpha_ext r_ext + alpha_int r_int ([sum]; official defaults 0.1 and 0.1 on NetHackScore).

  Args:
    r_ext: [...] extrinsic rewards, already multiplied by the PPO's reward_scale (the hooks receive them so).
    r_int: [...] intrinsic rewards, same shape.
    alpha_ext: weight of the extrinsic reward.
    alpha_int: weight of the intrinsic reward.

  Returns:
    [...] float32 combined rewards.

  Raises:
    ValueError: r_ext and r_int of different shapes.
  """
  r_ext, r_int = jnp.asarray(r_ext, jnp.float32), jnp.asarray(r_int, jnp.float32)
  if r_ext.shape != r_int.shape:
    raise checks.ShapeError(f"motif.combine_rewards: r_ext {r_ext.shape} and r_int {r_int.shape} must have the "
                            "same shape.")
  return alpha_ext * r_ext + alpha_int * r_int  # [sum]


class EpisodeMessageCounter:
  """Per-environment episodic message counts N_episode(m) on the host, reset on termination or truncation.

  Args:
    num_envs: N.
  """

  def __init__(self, num_envs: int):
    if num_envs < 1:
      raise ValueError(f"num_envs must be >= 1, got {num_envs}.")
    self.num_envs = num_envs
    self.counts: list[dict[Any, int]] = [dict() for _ in range(num_envs)]

  def update(self, messages: Sequence[Sequence[Any]], done: np.ndarray) -> np.ndarray:
    """Counts messages step by step.

    Args:
      messages: `[T][N]` hashable messages (bytes or str): the message of step t in env i.
      done: [T, N] bool: the episode of env i ended at step t (its counts restart after this step).

    Returns:
      [T, N] int: N_episode(message) including this occurrence.
    """
    done = np.asarray(done, bool)
    t_len = len(messages)
    if done.shape != (t_len, self.num_envs):
      raise ValueError(f"done must be [T, N] = {(t_len, self.num_envs)}, got {done.shape}.")
    out = np.zeros((t_len, self.num_envs), np.int64)
    for t in range(t_len):
      if len(messages[t]) != self.num_envs:
        raise ValueError(f"step {t} has {len(messages[t])} messages; expected {self.num_envs}.")
      for i in range(self.num_envs):
        c = self.counts[i]
        m = messages[t][i]
        c[m] = c.get(m, 0) + 1
        out[t, i] = c[m]
        if done[t, i]:
          c.clear()
    return out


class MotifRewardHook:
  """Stateful host reward hook for `rl.ppo_host.HostPPO(reward_hook=...)` (NetHack).

  For each collected batch: decode the messages, r_phi per unique message (cached), N_episode counts per
  environment (reset on termination / truncation), then [int] and [sum]. HostPPO hands the hook the batch with
  'reward' already scaled (and clipped) by its ppo.reward_scale / reward_clip and uses its output unscaled.

  Args:
    reward_fn: messages [K, 256] uint8 -> r_phi [K] (e.g. functools.partial(message_rewards, params)).
    mu, sigma, eps: normalisation and threshold (see `fit_normalisation`, `threshold`).
    num_envs: N.
    beta, alpha_ext, alpha_int: [int] / [sum] coefficients.
    source: 'next_obs' (default: the message the action produced) or 'obs' (the official learner's choice: the
      message of the observation the action was taken in, i.e. the reward arrives one step late).
  """

  def __init__(self, reward_fn: Callable[[np.ndarray], np.ndarray], mu: float, sigma: float, eps: float,
               num_envs: int, beta: float = 3.0, alpha_ext: float = 0.1, alpha_int: float = 0.1,
               source: str = "next_obs"):
    if source not in ("next_obs", "obs"):
      raise ValueError(f"source must be 'next_obs' or 'obs', got {source!r}.")
    self.reward_fn, self.mu, self.sigma, self.eps = reward_fn, mu, sigma, eps
    self.beta, self.alpha_ext, self.alpha_int, self.source = beta, alpha_ext, alpha_int, source
    self.counter = EpisodeMessageCounter(num_envs)
    self.cache: dict[bytes, float] = {}
    self.last: dict[str, float] = {}

  def get_state(self) -> dict[str, Any]:
    """The hook's state for a checkpoint (JSON-safe): each environment's episodic counts and the r_phi cache.

    Message buffers are written as their bytes without trailing NULs, read as latin-1 (lossless: `set_state` pads
    them back to `length`). The cache is saved too, so a resumed run uses the values the uninterrupted run
    computed instead of recomputing them in other batches.

    Returns:
      dict: length (the buffer length), counts (per environment, [[message, count], ...]), cache
      ([[message, r_phi], ...]).

    Raises:
      ValueError: a key that is not a message buffer (bytes).
    """
    keys = [k for c in self.counter.counts for k in c] + list(self.cache)
    if any(not isinstance(k, bytes) for k in keys):
      raise ValueError("MotifRewardHook.get_state: the counts and cache must be keyed by message bytes.")
    length = max((len(k) for k in keys), default=0)
    enc = lambda k: k.rstrip(b"\0").decode("latin-1")
    return {"length": length, "counts": [[[enc(k), int(v)] for k, v in c.items()] for c in self.counter.counts],
            "cache": [[enc(k), float(v)] for k, v in self.cache.items()]}

  def set_state(self, saved: dict[str, Any]) -> None:
    """Restores a `get_state` dict (the episodic counts and the r_phi cache).

    Args:
      saved: a `get_state` dict of a hook with the same num_envs.

    Raises:
      ValueError: the saved counts are for another number of environments.
    """
    if len(saved["counts"]) != self.counter.num_envs:
      raise ValueError(f"the saved hook state has counts for {len(saved['counts'])} environments; this hook has "
                       f"{self.counter.num_envs}.")
    n = int(saved["length"])
    dec = lambda t: t.encode("latin-1").ljust(n, b"\0")
    self.counter.counts = [{dec(t): int(v) for t, v in c} for c in saved["counts"]]
    self.cache = {dec(t): float(v) for t, v in saved["cache"]}

  def rewards_of(self, messages: np.ndarray) -> np.ndarray:
    """r_phi of messages [..., 256] through the per-message cache -> [...]."""
    flat = np.asarray(messages, np.uint8).reshape(-1, messages.shape[-1])
    keys = [m.tobytes() for m in flat]
    new = [k for k in dict.fromkeys(keys) if k not in self.cache]
    if new:
      vals = np.asarray(self.reward_fn(np.stack([np.frombuffer(k, np.uint8) for k in new])), np.float64)
      self.cache.update(zip(new, vals.tolist()))
    return np.array([self.cache[k] for k in keys], np.float32).reshape(messages.shape[:-1])

  def __call__(self, batch: dict) -> np.ndarray:
    # Deviation: source='next_obs' by default (the transition's own message); the official learner scores the
    # observation the action was taken in ('obs'), one step late.
    msgs = np.asarray(batch[self.source]["message"], np.uint8)               # [T, N, 256]
    done = np.asarray(batch["terminated"], bool) | np.asarray(batch["truncated"], bool)
    t_len, n = msgs.shape[:2]
    keys = [[msgs[t, i].tobytes() for i in range(n)] for t in range(t_len)]
    counts = self.counter.update(keys, done)
    r = self.rewards_of(msgs)
    r_int = np.asarray(intrinsic_reward(r, self.mu, self.sigma, self.eps, counts, self.beta))
    total = np.asarray(combine_rewards(np.asarray(batch["reward"], np.float32), r_int, self.alpha_ext,
                                       self.alpha_int))
    self.last = {"intrinsic_reward": float(r_int.mean()), "intrinsic_positive": float((r_int > 0).mean()),
                 "messages_nonempty": float((msgs[..., 0] != 0).mean())}
    return total
