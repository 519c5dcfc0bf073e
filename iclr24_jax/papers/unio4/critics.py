"""The supervised stage: V(s) and Q(s, a) fitted on the offline data (official critic.py).

Two modes:
- 'sarsa' (the official default, `is_iql=False`): V regresses the Monte-Carlo return-to-go (MSE), Q is fitted by
  SARSA, r + gamma * not_done * Q_target(s', a') with the data's next action a', a soft-updated target network
  (tau = 0.005 every 2 steps). One Q head.
- 'iql': V by expectile regression (tau = 0.7) on min_j Q_target_j(s, a) - V(s); Q heads (double Q) regress
  r + gamma * not_done * V(s'); V is updated first and Q's target uses the updated V, as in the official code.

`Critics` bundles the fitted params with their modules; `advantage(s, a) = Q(s, a) - V(s)` is what the offline
policy improvement uses (min over the Q heads).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from iclr24_jax.common import checks, optim
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.unio4 import stages
from iclr24_jax.papers.unio4 import data as data_lib
from iclr24_jax.papers.unio4.model import QNetwork
from iclr24_jax.rl import networks, normalization

MODES = ("sarsa", "iql")


@flax.struct.dataclass
class Critics:
  """Fitted V and Q with their modules; all methods take raw states (normalised inside).

  Attributes:
    v_params, q_params: params of `v_module` (ValueNet) and `q_module` (QNetwork, heads [num_q]).
    obs_stats: input normalisation statistics.
  """

  v_params: Any
  q_params: Any
  obs_stats: normalization.RunningStats
  v_module: nn.Module = flax.struct.field(pytree_node=False)
  q_module: nn.Module = flax.struct.field(pytree_node=False)
  obs_clip: float = flax.struct.field(pytree_node=False, default=10.0)

  def value(self, obs: jax.Array) -> jax.Array:
    """V(s) [...] for raw states [..., D]."""
    return self.v_module.apply({"params": self.v_params}, data_lib.normalize_obs(self.obs_stats, obs, self.obs_clip))

  def q(self, obs: jax.Array, action: jax.Array) -> jax.Array:
    """min over heads Q(s, a) [...] for raw states [..., D] and actions [..., A]."""
    heads = self.q_module.apply({"params": self.q_params}, data_lib.normalize_obs(self.obs_stats, obs, self.obs_clip),
                                action)
    return jnp.min(heads, axis=0)

  def advantage(self, obs: jax.Array, action: jax.Array) -> jax.Array:
    """Q(s, a) - V(s) [...]."""
    return self.q(obs, action) - self.value(obs)


@flax.struct.dataclass
class CriticState:
  """Training state of the supervised stage: V and Q TrainStates and the target Q params."""

  v: TrainState
  q: TrainState
  q_target: Any


def expectile_loss(diff: jax.Array, expectile: float) -> jax.Array:
  """IQL's asymmetric square: |tau - 1(diff < 0)| * diff^2, elementwise (diff = target - prediction).

  Args:
    diff: [...] target - prediction.
    expectile: tau in (0, 1) (a Python number is checked at once; a traced one gives NaN outside).

  Returns:
    [...] weighted squares.
  """
  ok = checks.in_range("unio4.expectile_loss", "expectile", expectile, 0.0, 1.0, low_open=True, high_open=True,
                       hint="IQL's expectile tau (0.5 is the mean).")
  # official: Lei-Kun/Uni-O4@1eecc45 critic.py:296-298 (expectile_loss)
  weight = jnp.where(diff > 0, expectile, 1.0 - expectile)
  return checks.poison(weight * jnp.square(diff), ok)


def value_loss(v_params: Any, q_target: Any, batch: dict, *, v_module: nn.Module, q_module: nn.Module,
               mode: str, expectile: float = 0.7) -> jax.Array:
  """V loss on a normalised batch.

  Args:
    v_params: V params; q_target: target Q params (used by 'iql').
    batch: dict with 'obs' [B, D] (normalised), 'actions' [B, A], 'returns' [B].
    mode: 'sarsa' (MSE to the Monte-Carlo return) or 'iql' (expectile of min_j Q_target_j(s, a) - V(s)).

  Returns:
    scalar loss.
  """
  v = v_module.apply({"params": v_params}, batch["obs"])
  if mode == "sarsa":
    # official: Lei-Kun/Uni-O4@1eecc45 critic.py:44-45 (V on the return)
    return jnp.mean(jnp.square(v - batch["returns"]))
  target = jax.lax.stop_gradient(jnp.min(q_module.apply({"params": q_target}, batch["obs"], batch["actions"]), 0))
  # official: Lei-Kun/Uni-O4@1eecc45 critic.py:302-309 (IQL V)
  return jnp.mean(expectile_loss(target - v, expectile))


def q_loss(q_params: Any, q_target: Any, v_params: Any, batch: dict, *, v_module: nn.Module, q_module: nn.Module,
           mode: str, gamma: float) -> jax.Array:
  """Q loss on a normalised batch: sum over heads of the mean squared TD error.

  Targets: 'sarsa' y = r + gamma * not_done * min_j Q_target_j(s', a'); 'iql' y = r + gamma * not_done * V(s').

  Args:
    batch: dict with 'obs', 'next_obs' (normalised), 'actions', 'next_actions', 'rewards', 'not_done'.

  Returns:
    scalar loss.
  """
  if mode == "sarsa":
    nxt = jnp.min(q_module.apply({"params": q_target}, batch["next_obs"], batch["next_actions"]), 0)
  else:
    nxt = v_module.apply({"params": v_params}, batch["next_obs"])
  # official: Lei-Kun/Uni-O4@1eecc45 critic.py:186-191 (SARSA Q), 317-327 (IQL Q)
  y = jax.lax.stop_gradient(batch["rewards"] + gamma * batch["not_done"] * nxt)
  q = q_module.apply({"params": q_params}, batch["obs"], batch["actions"])  # [num_q, B]
  return jnp.sum(jnp.mean(jnp.square(q - y[None]), axis=-1))


def critic_step(state: CriticState, batch: dict, *, v_module: nn.Module, q_module: nn.Module, mode: str,
                gamma: float, tau: float, target_update_freq: int, expectile: float = 0.7
                ) -> tuple[CriticState, dict]:
  """One V update then one Q update (Q's 'iql' target uses the updated V), then the soft target update every
  `target_update_freq` steps: target <- tau * Q + (1 - tau) * target.

  Args:
    state: CriticState; batch: normalised batch (see `q_loss`).

  Returns:
    (new state, {'v_loss', 'q_loss'}).
  """
  vl, gv = jax.value_and_grad(value_loss)(state.v.params, state.q_target, batch, v_module=v_module,
                                          q_module=q_module, mode=mode, expectile=expectile)
  v = state.v.apply_gradients(gv)
  ql, gq = jax.value_and_grad(q_loss)(state.q.params, state.q_target, v.params, batch, v_module=v_module,
                                      q_module=q_module, mode=mode, gamma=gamma)
  q = state.q.apply_gradients(gq)
  do = (q.step % target_update_freq) == 0
  q_target = jax.tree.map(lambda p, t: jnp.where(do, tau * p + (1.0 - tau) * t, t), q.params, state.q_target)
  return CriticState(v=v, q=q, q_target=q_target), {"v_loss": vl, "q_loss": ql}


def critic_modules(spec: dict) -> tuple[nn.Module, nn.Module]:
  """The value and Q network modules a critic spec describes.

  Args:
    spec: the critic spec (v_hidden, q_hidden, activation, mode 'sarsa'|'iql', double_q).

  Returns:
    (value module [B, S] -> [B], Q module [B, S], [B, A] -> [B] or [2, B] with double Q).
  """
  v_module = networks.ValueNet(tuple(spec["v_hidden"]), spec["activation"])
  num_q = 2 if (spec["mode"] == "iql" and spec["double_q"]) else 1
  q_module = QNetwork(tuple(spec["q_hidden"]), spec["activation"], num_q)
  return v_module, q_module


@functools.lru_cache(maxsize=32)   # the jitted programs of one configuration
def _programs(frozen_spec: tuple, obs_dim: int, act_dim: int) -> tuple[Callable, Callable]:
  """Jitted (init, chunk) of the supervised stage for one configuration (cached: reused across data sets)."""
  spec = optim.thaw(frozen_spec)
  v_module, q_module = critic_modules(spec)
  tx_v, tx_q = optax.adam(float(spec["v_lr"])), optax.adam(float(spec["q_lr"]))
  kw = dict(v_module=v_module, q_module=q_module, mode=spec["mode"], gamma=float(spec["gamma"]),
            tau=float(spec["tau"]), target_update_freq=int(spec["target_update_freq"]),
            expectile=float(spec["expectile"]))
  batch_size = int(spec["batch_size"])

  @jax.jit
  def init(key):
    k_v, k_q = jax.random.split(key)
    obs, act = jnp.zeros((1, obs_dim)), jnp.zeros((1, act_dim))
    vp = v_module.init(k_v, obs)["params"]
    qp = q_module.init(k_q, obs, act)["params"]
    return CriticState(TrainState.create(vp, tx_v), TrainState.create(qp, tx_q), qp)

  @functools.partial(jax.jit, static_argnums=3)
  def chunk(state, data, key, n):
    def body(st, i):
      b = data_lib.sample(jax.random.fold_in(key, i), data, batch_size)
      norm = lambda o: data_lib.normalize_obs(data.obs_stats, o)
      batch = {"obs": norm(b["observations"]), "next_obs": norm(b["next_observations"]), "actions": b["actions"],
               "next_actions": b["next_actions"], "rewards": b["rewards"], "not_done": b["not_done"],
               "returns": b["returns"]}
      return critic_step(st, batch, **kw)

    state, m = jax.lax.scan(body, state, state.v.step + jnp.arange(n))
    return state, jax.tree.map(jnp.mean, m)

  return init, chunk


def critic_spec(config: Any) -> dict:
  """The fields of a critic config that define the programs (validated)."""
  c = dict(config.to_dict() if hasattr(config, "to_dict") else config)
  if c.get("mode") not in MODES:
    raise ValueError(f"unio4 critic.mode must be one of {MODES}, got {c.get('mode')!r}.")
  keys = ("mode", "v_hidden", "q_hidden", "activation", "double_q", "v_lr", "q_lr", "batch_size", "gamma", "tau",
          "target_update_freq", "expectile")
  missing = [k for k in keys if k not in c]
  if missing:
    raise ValueError(f"unio4 critic config lacks {missing}.")
  return {k: c[k] for k in keys}


def fit_value_functions(key: jax.Array, data: data_lib.OfflineData, config: Any, log_every: int = 0,
                        callback: Callable[[int, dict], None] | None = None,
                        checkpoints: stages.Checkpoints | None = None) -> tuple[Critics, list[dict]]:
  """Fits V and Q on the offline data (the supervised stage of Uni-O4).

  Args:
    key: PRNG key.
    data: OfflineData (see data.prepare).
    config: critic config: mode ('sarsa' | 'iql'), v_hidden, q_hidden, activation, double_q, v_lr, q_lr,
      batch_size, num_steps, gamma, tau, target_update_freq, expectile.
    log_every: steps per compiled chunk / logged row (default: num_steps / 10).
    callback: called as callback(step, metrics) after each chunk.
    checkpoints: resumable in `checkpoints.workdir/critic` (None: nothing saved).

  Returns:
    (Critics, history: list of {'step', 'v_loss', 'q_loss'} rows).

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped the stage (its checkpoint is saved).
  """
  spec = critic_spec(config)
  num_steps = int(config["num_steps"])
  if num_steps < 1:
    raise ValueError(f"unio4 critic.num_steps must be >= 1, got {num_steps}.")
  init, chunk = _programs(optim.freeze(spec), data.obs_dim, data.action_dim)
  k_init, k_train = jax.random.split(key)
  state, history = stages.run_in_chunks(chunk, lambda: init(k_init), data, k_train, num_steps, log_every,
                                        lambda m: {k: float(v) for k, v in m.items()}, callback, checkpoints,
                                        "critic")
  v_module, q_module = critic_modules(spec)
  return Critics(state.v.params, state.q.params, data.obs_stats, v_module, q_module), history
