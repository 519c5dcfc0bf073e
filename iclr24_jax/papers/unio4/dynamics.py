"""The learned dynamics ensemble used by the offline policy evaluation (official dynamics/ and models/, taken from
MOBILE): Gaussian members predicting (s' - s, r) from standardised [s, a], trained by Gaussian NLL with learned
log-variance bounds and per-layer weight decay, early-stopped on a hold-out set, the best `num_elites` members
kept; a step samples every elite's Gaussian and picks one elite per state at random; a hand-written termination
function of the environment marks terminal states.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import optim
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.unio4 import stages
from iclr24_jax.papers.unio4 import data as data_lib
from iclr24_jax.papers.unio4.model import DynamicsMember, soft_clamp


# --- termination functions (MOBILE's utils/termination_fns.py, for the brax versions of the envs) -----------------
def _finite(next_obs: jax.Array) -> jax.Array:
  return jnp.all(jnp.isfinite(next_obs), axis=-1)


def termination_none(obs: jax.Array, action: jax.Array, next_obs: jax.Array) -> jax.Array:
  """Never terminal (except non-finite predictions)."""
  return ~_finite(next_obs)


def termination_inverted_pendulum(obs: jax.Array, action: jax.Array, next_obs: jax.Array) -> jax.Array:
  """brax inverted_pendulum: done when |pole angle| = |obs[1]| > 0.2."""
  return ~(_finite(next_obs) & (jnp.abs(next_obs[..., 1]) <= 0.2))


def termination_hopper(obs: jax.Array, action: jax.Array, next_obs: jax.Array) -> jax.Array:
  """brax/gym hopper: healthy while z = obs[0] > 0.7, |angle| = |obs[1]| < 0.2 and |obs[1:]| < 100."""
  z, angle = next_obs[..., 0], next_obs[..., 1]
  healthy = (_finite(next_obs) & jnp.all(jnp.abs(next_obs[..., 1:]) < 100.0, axis=-1) & (z > 0.7)
             & (jnp.abs(angle) < 0.2))
  return ~healthy


TERMINATIONS: dict[str, Callable] = {"none": termination_none, "inverted_pendulum": termination_inverted_pendulum,
                                     "hopper": termination_hopper}


def termination_for_env(env_name: str) -> str:
  """The termination function name of an environment ('brax/hopper' -> 'hopper'; unknown -> 'none')."""
  base = env_name.split("/")[-1].split("-")[0]
  return base if base in TERMINATIONS else "none"


@flax.struct.dataclass
class Dynamics:
  """A trained dynamics ensemble (raw states in, raw states out).

  Attributes:
    params: {'members': stacked member params [E, ...], 'max_logvar': [O], 'min_logvar': [O]} with O = D + 1.
    input_mean, input_std: [D + A] standardisation of [s, a] (fitted on the training rows).
    elites: [num_elites] int32 indices of the members used by `step`.
    module: DynamicsMember (static); termination: a key of TERMINATIONS (static).
  """

  params: Any
  input_mean: jax.Array
  input_std: jax.Array
  elites: jax.Array
  module: nn.Module = flax.struct.field(pytree_node=False)
  termination: str = flax.struct.field(pytree_node=False, default="none")

  def predict(self, obs: jax.Array, action: jax.Array, members: jax.Array | None = None
              ) -> tuple[jax.Array, jax.Array]:
    """Gaussian predictions of [s', r] by the chosen members (default: the elites).

    Args:
      obs: [B, D]; action: [B, A]; members: indices [M].

    Returns:
      (mean [M, B, D + 1] with s added to the state part, log-variance [M, B, D + 1]).
    """
    members = self.elites if members is None else members
    p = jax.tree.map(lambda x: x[members], self.params["members"])
    x = (jnp.concatenate([obs, action], -1) - self.input_mean) / self.input_std
    mean, raw = jax.vmap(lambda q: self.module.apply({"params": q}, x))(p)
    logvar = soft_clamp(raw, self.params["min_logvar"], self.params["max_logvar"])
    mean = mean.at[..., :-1].add(obs)
    return mean, logvar

  def step(self, key: jax.Array, obs: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One imagined step: each elite samples from its Gaussian; one elite is drawn per state.

    Args:
      key: PRNG key; obs: [B, D] raw; action: [B, A].

    Returns:
      (next_obs [B, D], reward [B], terminal [B] bool).
    """
    k_noise, k_pick = jax.random.split(key)
    mean, logvar = self.predict(obs, action)
    samples = mean + jnp.exp(0.5 * logvar) * jax.random.normal(k_noise, mean.shape)
    pick = jax.random.randint(k_pick, (obs.shape[0],), 0, mean.shape[0])
    s = samples[pick, jnp.arange(obs.shape[0])]
    next_obs, reward = s[:, :-1], s[:, -1]
    return next_obs, reward, TERMINATIONS[self.termination](obs, action, next_obs)


def dynamics_loss(params: Any, inputs: jax.Array, targets: jax.Array, *, module: nn.Module,
                  weight_decays: tuple[float, ...], logvar_coef: float = 0.01) -> tuple[jax.Array, jax.Array]:
  """MOBILE's ensemble loss: sum over members of mean[(mu - y)^2 exp(-logvar)] + mean[logvar], plus per-layer L2
  (0.5 * wd_l * sum W_l^2) and 0.01 * (sum max_logvar - sum min_logvar).

  Args:
    params: dynamics params; inputs: [E, B, D + A] standardised; targets: [E, B, D + 1] (delta s, r).

  Returns:
    (loss, per-member mean squared error [E]).
  """
  mean, raw = jax.vmap(lambda p, x: module.apply({"params": p}, x))(params["members"], inputs)
  logvar = soft_clamp(raw, params["min_logvar"], params["max_logvar"])
  mse_inv = jnp.mean(jnp.square(mean - targets) * jnp.exp(-logvar), axis=(1, 2))
  var_loss = jnp.mean(logvar, axis=(1, 2))
  layers = params["members"]["MLP_0"]
  decay = sum(0.5 * wd * jnp.sum(jnp.square(layers[f"Dense_{i}"]["kernel"])) for i, wd in enumerate(weight_decays))
  loss = jnp.sum(mse_inv + var_loss) + decay
  loss = loss + logvar_coef * (jnp.sum(params["max_logvar"]) - jnp.sum(params["min_logvar"]))
  return loss, jax.lax.stop_gradient(jnp.mean(jnp.square(mean - targets), axis=(1, 2)))


@functools.lru_cache(maxsize=16)   # the jitted programs of one configuration
def _programs(frozen_cfg: tuple, obs_dim: int, act_dim: int):
  cfg = optim.thaw(frozen_cfg)
  hidden = tuple(cfg["hidden"])
  wds = tuple(float(w) for w in cfg["weight_decays"])
  if len(wds) != len(hidden) + 1:
    raise ValueError(f"unio4 dynamics.weight_decays needs len(hidden) + 1 = {len(hidden) + 1} values, got {len(wds)}.")
  out = obs_dim + 1
  module = DynamicsMember(out, hidden, cfg["activation"])
  e, bs = int(cfg["num_members"]), int(cfg["batch_size"])
  tx = optax.adam(float(cfg["lr"]))

  @jax.jit
  def init(key):
    members = jax.vmap(lambda k: module.init(k, jnp.zeros((1, obs_dim + act_dim)))["params"])(
        jax.random.split(key, e))
    params = {"members": members, "max_logvar": jnp.full((out,), 0.5), "min_logvar": jnp.full((out,), -10.0)}
    return TrainState.create(params, tx)

  @functools.partial(jax.jit, static_argnums=5)
  def chunk(state, inputs, targets, train_idx, key, n):
    def body(st, _):
      idx = train_idx[jax.random.randint(jax.random.fold_in(key, st.step), (e, bs), 0, train_idx.shape[0])]
      (loss, mse), g = jax.value_and_grad(dynamics_loss, has_aux=True)(st.params, inputs[idx], targets[idx],
                                                                       module=module, weight_decays=wds)
      return st.apply_gradients(g), {"loss": loss, "train_mse": jnp.mean(mse)}

    state, m = jax.lax.scan(body, state, None, length=n)
    return state, jax.tree.map(jnp.mean, m)

  @jax.jit
  def holdout_mse(params, inputs, targets):
    mean, _ = jax.vmap(lambda p: module.apply({"params": p}, inputs))(params["members"])
    return jnp.mean(jnp.square(mean - targets[None]), axis=(1, 2))

  @jax.jit
  def keep_improved(best, params, improved):
    pick = lambda b, p: jnp.where(improved.reshape((-1,) + (1,) * (p.ndim - 1)), p, b)
    members = jax.tree.map(pick, best["members"], params["members"])
    return {"members": members, "max_logvar": params["max_logvar"], "min_logvar": params["min_logvar"]}

  return module, init, chunk, holdout_mse, keep_improved


def train_dynamics(key: jax.Array, data: data_lib.OfflineData, config: Any, termination: str = "none",
                   callback: Callable[[int, dict], None] | None = None,
                   checkpoints: stages.Checkpoints | None = None) -> tuple[Dynamics, list[dict]]:
  """Fits the dynamics ensemble with hold-out early stopping and elite selection.

  Args:
    key: PRNG key; data: OfflineData (raw states are modelled; its normalisation is not used here).
    config: num_members, num_elites, hidden, activation, weight_decays, lr, batch_size, max_steps, eval_every
      (steps between hold-out checks, ~ one epoch), patience (checks without > 1% improvement before stopping),
      holdout (max hold-out rows; at most 20% of the data).
    termination: a key of TERMINATIONS.
    callback: called as callback(step, row) after each hold-out check.
    checkpoints: resumable in `checkpoints.workdir/dynamics` (None: nothing saved).

  Returns:
    (Dynamics, history rows {'step', 'loss', 'train_mse', 'holdout_mse'}).

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped the stage (its checkpoint is saved).

  Deviation: each member draws its own uniform minibatches (MOBILE iterates over a per-member bootstrap resample
  in epochs); a "hold-out check" happens every `eval_every` steps instead of after each epoch.
  """
  if termination not in TERMINATIONS:
    raise ValueError(f"unknown termination '{termination}'; choose one of {sorted(TERMINATIONS)}.")
  e, n_el = int(config["num_members"]), int(config["num_elites"])
  if not 1 <= n_el <= e:
    raise ValueError(f"unio4 dynamics: need 1 <= num_elites ({n_el}) <= num_members ({e}).")
  module, init, chunk, holdout_mse, keep_improved = _programs(optim.freeze(config), data.obs_dim, data.action_dim)
  n = int(data.num_rows)
  obs = np.asarray(data.observations[:n])
  act = np.asarray(data.actions[:n])
  nxt = np.asarray(data.next_observations[:n])
  rew = np.asarray(data.rewards[:n])
  inputs = np.concatenate([obs, act], -1)
  targets = np.concatenate([nxt - obs, rew[:, None]], -1)
  k_split, k_init, k_train = jax.random.split(key, 3)
  perm = np.asarray(jax.random.permutation(k_split, n))
  n_hold = max(1, min(int(0.2 * n), int(config["holdout"])))
  hold, train = perm[:n_hold], perm[n_hold:]
  mean = inputs[train].mean(0)
  std = inputs[train].std(0)
  std = np.where(std < 1e-12, 1.0, std)
  inputs_std = jnp.asarray((inputs - mean) / std, jnp.float32)
  targets_j = jnp.asarray(targets, jnp.float32)
  # Fixed-size index arrays (cyclic padding to the padded data size) keep the compiled chunk reusable.
  pad = int(data.observations.shape[0])
  train_idx = jnp.asarray(np.resize(train, pad), jnp.int32)
  max_steps, every, patience = int(config["max_steps"]), int(config["eval_every"]), int(config["patience"])
  hold_in, hold_t = inputs_std[hold], targets_j[hold]
  with stages.stage_loop(checkpoints, "dynamics", max_steps) as lp:
    # The state holds the training state and the best members; the early-stopping decisions (each member's best
    # hold-out error, checks since the last improvement) go into the loop state's extra as JSON.
    state, run = lp.start(lambda: (lambda st: {"train": st, "best": st.params})(init(k_init)))
    best_loss = np.asarray(run.extra.get("best_loss", np.full(e, 1e10)), np.float64)
    since = int(run.extra.get("since", 0))
    while not lp.finished and run.step < max_steps and since < patience:
      m = min(every, max_steps - run.step)
      train, met = chunk(state["train"], inputs_std, targets_j, train_idx, k_train, m)
      h = np.asarray(holdout_mse(train.params, hold_in, hold_t))
      improved = (best_loss - h) / best_loss > 0.01
      best_loss = np.where(improved, h, best_loss)
      state = {"train": train, "best": keep_improved(state["best"], train.params, jnp.asarray(improved))}
      since = 0 if improved.any() else since + 1
      run.extra.update(best_loss=best_loss.tolist(), since=since)
      row = {**{k: float(v) for k, v in jax.device_get(met).items()},
             "holdout_mse": float(np.sort(best_loss)[:n_el].mean())}
      if since >= patience:   # early stop: this check's row ends the stage, saved by finish at its step
        lp.finish(state, step=run.step + m, row=row)
      else:
        lp.boundary(run.step + m, state, row)
      if callback:
        callback(run.step, {"step": run.step, **row})
    lp.finish(state, step=run.step)
  best, history = state["best"], run.history
  elites = np.argsort(best_loss)[:n_el].astype(np.int32)
  dyn = Dynamics(best, jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32), jnp.asarray(elites), module,
                 termination)
  return dyn, history
