"""Ensemble behaviour cloning with the disagreement term (official BC_ensemble.py, `joint_loss`).

For K Gaussian policies and a data pair (s, a), policy i minimises (the official code, kl_bc='data'):

    L_i = mean_(s,a) [ -log pi_i(a|s) - alpha * ( log pi_i(a|s) - sg( max_{j != i} log pi_j(a|s) ) ) ]

with sg = stop-gradient (`max_prob_a.detach()`), alpha = 0.1. Because the max term is a constant for policy i,
grad L_i = -(1 + alpha) grad log pi_i(a|s): the term rescales the behaviour-cloning gradient. Adam is invariant to
that scale, so the members follow the same trajectories as with alpha = 0 (up to Adam's epsilon): the ensemble's
diversity comes from the members' different initialisations (tested). The official update is sequential over a
shuffled order within a step (later members see some already-updated log-probs in the max); here all members are
updated simultaneously, which changes nothing for the gradients above.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from iclr24_jax.common import checks, optim
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.unio4 import stages
from iclr24_jax.papers.unio4 import data as data_lib
from iclr24_jax.papers.unio4.model import GaussianPolicy, ensemble_size, init_ensemble, policy_from_params, stack_trees


def _as_stacked(params_list_or_stacked: Any) -> Any:
  if isinstance(params_list_or_stacked, (list, tuple)):
    return stack_trees(list(params_list_or_stacked))
  return params_list_or_stacked


def ensemble_bc_loss(params_list_or_stacked: Any, batch: dict, alpha: float, *,
                     policy: nn.Module | None = None) -> tuple[jax.Array, dict]:
  """The ensemble BC loss, summed over the K policies (each policy's gradient comes only from its own L_i).

  Args:
    params_list_or_stacked: a list of K policy params or params stacked with a leading axis K.
    batch: dict with 'obs' [B, D] (already normalised) and 'actions' [B, A] (env actions).
    alpha: weight of the disagreement term (0 = plain BC per member).
    policy: the policy module (default: unio4.GaussianPolicy inferred from the params' shapes).

  Returns:
    (sum_i L_i, metrics: 'bc_loss' [K] per-policy L_i, 'nll' [K] mean -log pi_i(a|s), 'max_other_logp' [K]).
  """
  params = _as_stacked(params_list_or_stacked)
  k = ensemble_size(params)
  obs, act = batch["obs"], batch["actions"]
  checks.shapes("unio4.ensemble_bc_loss", obs=(obs, "B D"), actions=(act, "B A"))
  checks.in_range("unio4.ensemble_bc_loss", "alpha", alpha, 0.0, None, hint="the disagreement weight (0 = BC).")
  policy = policy or policy_from_params(jax.tree.map(lambda x: x[0], params))
  dists = jax.vmap(lambda p: policy.apply({"params": p}, obs))(params)  # leaves [K, B, A]
  logp = dists.log_prob(act[None])  # [K, B]
  nll = -logp
  if k == 1 or alpha == 0.0:
    per = jnp.mean(nll, axis=-1)
    return jnp.sum(per), {"bc_loss": per, "nll": per, "max_other_logp": jnp.zeros((k,))}
  # max_{j != i} log pi_j(a|s) [K, B]: the diagonal (j = i) masked out, then stop-gradient (official .detach()).
  others = jnp.where(jnp.eye(k, dtype=bool)[:, :, None], -jnp.inf, logp[None])  # [i, j, B]
  max_other = jax.lax.stop_gradient(jnp.max(others, axis=1))
  # Eq. (6): ensemble BC with the disagreement term, f = max over the other members (here in the official
  # code's form). official: Lei-Kun/Uni-O4@1eecc45 BC_ensemble.py:104-130 (kl_type='heuristic')
  per = jnp.mean(nll - alpha * (logp - max_other), axis=-1)  # official joint_loss, kl_bc='data'
  return jnp.sum(per), {"bc_loss": per, "nll": jnp.mean(nll, axis=-1), "max_other_logp": jnp.mean(max_other, -1)}


def bc_step(state: TrainState, batch: dict, *, policy: nn.Module, alpha: float) -> tuple[TrainState, dict]:
  """One optimizer step of every ensemble member on `ensemble_bc_loss` (state from stages.ensemble_state).

  Args:
    state: TrainState over stacked params [K, ...] with per-member optimizer state.
    batch: {'obs' [B, D] normalised, 'actions' [B, A]}.

  Returns:
    (new state, metrics with 'loss' and per-policy 'bc_loss' [K], 'nll' [K]).
  """
  (loss, m), grads = jax.value_and_grad(ensemble_bc_loss, has_aux=True)(state.params, batch, alpha, policy=policy)
  return stages.ensemble_apply_gradients(state, grads), {"loss": loss, **m}


def make_policy(action_dim: int, config: Any) -> GaussianPolicy:
  """The GaussianPolicy of a policy config (hidden, activation, log_std_bounds)."""
  return GaussianPolicy(int(action_dim), tuple(config["hidden"]), config["activation"],
                        tuple(config["log_std_bounds"]))


@functools.lru_cache(maxsize=32)   # the jitted programs of one configuration
def _programs(frozen_policy: tuple, frozen_bc: tuple, obs_dim: int, act_dim: int):
  pcfg, bcfg = optim.thaw(frozen_policy), optim.thaw(frozen_bc)
  policy = make_policy(act_dim, pcfg)
  tx = optax.adam(float(bcfg["lr"]))
  kw = dict(policy=policy, alpha=float(bcfg["alpha"]))
  batch_size, k = int(bcfg["batch_size"]), int(bcfg["num_policies"])

  @jax.jit
  def init(key):
    params = init_ensemble(key, policy, k, jnp.zeros((1, obs_dim)), identical=bool(bcfg.get("identical_init")))
    return stages.ensemble_state(params, tx)

  @functools.partial(jax.jit, static_argnums=3)
  def chunk(state, data, key, n):
    def body(st, _):
      b = data_lib.sample(jax.random.fold_in(key, st.step), data, batch_size)
      batch = {"obs": data_lib.normalize_obs(data.obs_stats, b["observations"]), "actions": b["actions"]}
      return bc_step(st, batch, **kw)

    state, m = jax.lax.scan(body, state, None, length=n)
    return state, jax.tree.map(lambda x: jnp.mean(x, axis=0), m)

  return policy, init, chunk


def fit_bc_ensemble(key: jax.Array, data: data_lib.OfflineData, policy_config: Any, bc_config: Any,
                    log_every: int = 0, callback: Callable[[int, dict], None] | None = None,
                    checkpoints: stages.Checkpoints | None = None) -> tuple[Any, GaussianPolicy, list[dict]]:
  """Trains the K behaviour policies jointly (the BC stage).

  Args:
    key: PRNG key; data: OfflineData.
    policy_config: hidden, activation, log_std_bounds.
    bc_config: num_policies (K), alpha, lr, batch_size, num_steps, identical_init (optional).
    log_every: steps per compiled chunk / logged row.
    callback: called as callback(step, row) after each chunk.
    checkpoints: resumable in `checkpoints.workdir/bc` (None: nothing saved).

  Returns:
    (stacked params [K, ...], policy module, history rows {'step', 'loss', 'nll_mean'}).

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped the stage (its checkpoint is saved).
  """
  if int(bc_config["num_policies"]) < 1:
    raise ValueError(f"unio4 bc.num_policies must be >= 1, got {bc_config['num_policies']}.")
  policy, init, chunk = _programs(optim.freeze(policy_config), optim.freeze(bc_config), data.obs_dim,
                                  data.action_dim)
  num_steps = int(bc_config["num_steps"])
  k_init, k_train = jax.random.split(key)
  state, history = stages.run_in_chunks(
      chunk, lambda: init(k_init), data, k_train, num_steps, log_every,
      lambda m: {"loss": float(m["loss"]), "nll_mean": float(m["nll"].mean())}, callback, checkpoints, "bc")
  return state.params, policy, history


def pairwise_disagreement(params: Any, policy: nn.Module, obs: jax.Array) -> jax.Array:
  """Mean over pairs i < j and states of |mean_i(s) - mean_j(s)| (a diversity measure of the ensemble)."""
  means = jax.vmap(lambda p: policy.apply({"params": p}, obs).mean)(_as_stacked(params))  # [K, B, A]
  k = means.shape[0]
  if k < 2:
    return jnp.zeros(())
  d = jnp.mean(jnp.abs(means[:, None] - means[None]), axis=(-1, -2))  # [K, K]
  return jnp.sum(jnp.triu(d, 1)) / (k * (k - 1) / 2)


def members(params: Any) -> Sequence[Any]:
  """The K members of stacked params as a list."""
  return [jax.tree.map(lambda x, i=i: x[i], params) for i in range(ensemble_size(params))]
