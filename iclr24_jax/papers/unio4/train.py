"""The Uni-O4 pipeline: supervised stage, dynamics, ensemble BC, offline multi-step improvement with OPE-gated
replacement (`run_offline`), and online PPO fine-tuning from the chosen policy and V (`run_online`).

Compiled programs are cached per configuration (and array shapes), so runs on several data sets of one
environment, or a multi-step and a one-step run, share their compilations.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from iclr24_jax.common import optim
from iclr24_jax.papers.unio4 import bc as bc_lib
from iclr24_jax.papers.unio4 import stages
from iclr24_jax.papers.unio4 import critics as critics_lib
from iclr24_jax.papers.unio4 import data as data_lib
from iclr24_jax.papers.unio4 import dynamics as dyn_lib
from iclr24_jax.papers.unio4 import improvement
from iclr24_jax.papers.unio4.ope import ope_per_state
from iclr24_jax.rl import envs as envs_lib
from iclr24_jax.rl import networks, normalization, ppo
from iclr24_jax.rl import rollout as rollout_lib

Callback = Callable[[str, int, dict], None]


# --- environments and evaluation --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)   # one Env object per name: programs jitted for it are reused
def get_env(name: str) -> envs_lib.Env:
  """One shared Env object per name (so jitted evaluation programs are reused)."""
  from iclr24_jax.rl import offline
  return offline.make_data_env(name)


@functools.lru_cache(maxsize=32)   # one jitted function per static value: jit caches by function identity
def evaluation_program(env: envs_lib.Env, policy_module: nn.Module, num_envs: int, obs_clip: float = 10.0):
  """A jitted `(policy_params, obs_stats, key) -> rl.rollout.evaluate(...)` dict with the deterministic policy
  (the mean action, clipped by the distribution's `to_env`), one program per (env, module, num_envs)."""

  @jax.jit
  def go(policy_params, obs_stats, key):
    def pol(k, obs):
      d = policy_module.apply({"params": policy_params}, data_lib.normalize_obs(obs_stats, obs, obs_clip))
      raw = d.mode()
      return raw, d.to_env(raw), {}

    return rollout_lib.evaluate(env, pol, key, num_envs)

  return go


def evaluate_members(env: envs_lib.Env, policy_module: nn.Module, stacked_params: Any,
                     obs_stats: normalization.RunningStats, key: jax.Array, num_episodes: int = 10) -> np.ndarray:
  """Mean deterministic return of each ensemble member over `num_episodes` episodes -> [K]."""
  go = evaluation_program(env, policy_module, int(num_episodes))
  out = []
  for i, p in enumerate(bc_lib.members(stacked_params)):
    out.append(float(go(p, obs_stats, jax.random.fold_in(key, i))["return"]))
  return np.asarray(out)


# --- offline -------------------------------------------------------------------------------------------------------
def _get(cfg: Any, name: str, default: Any = None) -> Any:
  return cfg.get(name, default) if hasattr(cfg, "get") else getattr(cfg, name, default)


def prepare_data(config: Any, dataset: dict) -> data_lib.OfflineData:
  """data.prepare with the config's gamma, reward_scale, state_norm and data.pad_to (0 = no padding)."""
  pad = int(_get(config.data, "pad_to", 0) or 0)
  return data_lib.prepare(dataset, gamma=float(config.gamma), reward_scale=float(config.reward_scale),
                          state_norm=bool(config.state_norm), pad_to=pad or None)


def critic_config(config: Any) -> dict:
  c = dict(config.critic.to_dict() if hasattr(config.critic, "to_dict") else config.critic)
  c["gamma"] = float(config.gamma)
  return c


def pretrain(config: Any, data: data_lib.OfflineData, key: jax.Array, callback: Callback | None = None,
             checkpoints: stages.Checkpoints | None = None) -> dict:
  """The stages before policy improvement: V/Q fitting, the dynamics ensemble, ensemble BC.

  Args:
    config: the unio4 config (critic, dynamics, model, bc, gamma, data.name).
    data: OfflineData.
    key: PRNG key (split into the three stages' keys).
    callback: optional callback(stage, step, row) for logging.
    checkpoints: each stage resumable in `checkpoints.workdir/{critic, dynamics, bc}` (None: nothing saved).

  Returns:
    dict with 'critics' (Critics), 'dynamics' (Dynamics), 'bc_params' (stacked [K, ...]), 'policy' (module),
    'history' ({'critic', 'dynamics', 'bc'} lists of rows), 'seconds' (per stage).
  """
  k_critic, k_dyn, k_bc = jax.random.split(key, 3)
  cb = (lambda stage: (lambda s, row: callback(stage, s, row))) if callback else (lambda stage: None)
  t0 = time.time()
  critics, h_c = critics_lib.fit_value_functions(k_critic, data, critic_config(config),
                                                 log_every=int(config.critic.log_every), callback=cb("critic"),
                                                 checkpoints=checkpoints)
  t1 = time.time()
  term = config.dynamics.get("termination", "") or dyn_lib.termination_for_env(config.data.name)
  dynamics, h_d = dyn_lib.train_dynamics(k_dyn, data, config.dynamics, term, callback=cb("dynamics"),
                                         checkpoints=checkpoints)
  t2 = time.time()
  bc_params, policy, h_b = bc_lib.fit_bc_ensemble(k_bc, data, config.model, config.bc,
                                                  log_every=int(config.bc.log_every), callback=cb("bc"),
                                                  checkpoints=checkpoints)
  t3 = time.time()
  return {"critics": critics, "dynamics": dynamics, "bc_params": bc_params, "policy": policy,
          "history": {"critic": h_c, "dynamics": h_d, "bc": h_b},
          "seconds": {"critic": t1 - t0, "dynamics": t2 - t1, "bc": t3 - t2}}


def improvement_optimizer(config: Any) -> optax.GradientTransformation:
  """Adam, learning rate linearly decayed to 0 over config.num_steps, global-norm clip (per policy: vmapped)."""
  return optim.make_optimizer(config.optimizer, int(config.num_steps))


# The improvement settings that shape the compiled programs (the replacement rule and the evaluation schedule do
# not, so a one-step, a multi-step and a paired-rule run share every compilation).
_PROGRAM_KEYS = ("batch_size", "ope_batch", "ope_horizon", "clip_eps", "omega")


@functools.lru_cache(maxsize=16)   # the jitted programs of one configuration
def _improve_programs(frozen_policy: tuple, frozen_opt: tuple, frozen_imp: tuple, num_steps: int, obs_dim: int,
                      act_dim: int, obs_clip: float):
  pcfg, icfg = optim.thaw(frozen_policy), optim.thaw(frozen_imp)
  policy = bc_lib.make_policy(act_dim, pcfg)
  tx = optim.make_optimizer(ml_collections.ConfigDict(optim.thaw(frozen_opt)), num_steps)
  batch_size, ope_batch, horizon = int(icfg["batch_size"]), int(icfg["ope_batch"]), int(icfg["ope_horizon"])
  kw = dict(policy=policy, clip_eps=float(icfg["clip_eps"]), omega=float(icfg["omega"]), obs_clip=obs_clip)

  @jax.jit
  def init(params):
    return stages.ensemble_state(params, tx, extra={"behaviour": params})

  @functools.partial(jax.jit, static_argnums=4)
  def chunk(state, data, critics, key, n):
    k_data, k_loss = jax.random.split(key)

    def body(st, _):
      b = data_lib.sample(jax.random.fold_in(k_data, st.step), data, batch_size)
      return improvement.offline_ppo_step(st, b["observations"], k_loss, critics=critics, obs_stats=data.obs_stats,
                                          **kw)

    state, m = jax.lax.scan(body, state, None, length=n)
    return state, jax.tree.map(lambda x: jnp.mean(x, axis=0), m)

  def per_state(params, data, critics, dynamics, key):
    """(q_sum, count) [K, B] of every member, all on the same start states and model noise."""
    k_states, k_roll = jax.random.split(key)
    states = data_lib.sample(k_states, data, ope_batch)["observations"]

    def one(p):
      act = lambda s: jnp.clip(policy.apply({"params": p}, data_lib.normalize_obs(data.obs_stats, s, obs_clip)).mean,
                               -1.0, 1.0)
      return ope_per_state(k_roll, dynamics, act, critics.q, states, horizon)

    return jax.vmap(one)(params)

  def score(q_sum, count):
    return jnp.sum(q_sum, -1) / jnp.maximum(jnp.sum(count, -1), 1.0)

  @jax.jit
  def ope(params, data, critics, dynamics, key):
    return score(*per_state(params, data, critics, dynamics, key))

  @jax.jit
  def replace(state, best, scores):
    beh, best, accept = improvement.replace_if_better(state.extra["behaviour"], state.params, best, scores)
    return state.replace(extra={"behaviour": beh}), best, accept

  @jax.jit
  def replace_paired(state, data, critics, dynamics, key, z):
    cand = per_state(state.params, data, critics, dynamics, key)
    beh = per_state(state.extra["behaviour"], data, critics, dynamics, key)
    mean, se = improvement.paired_ope_difference(*cand, *beh)
    new_beh, accept = improvement.replace_if_paired_better(state.extra["behaviour"], state.params, mean, se, z)
    return state.replace(extra={"behaviour": new_beh}), score(*cand), accept, mean, se

  return policy, init, chunk, ope, replace, replace_paired


def _programs(config: Any, data: data_lib.OfflineData):
  icfg = config.improve
  frozen_imp = optim.freeze({k: icfg[k] for k in _PROGRAM_KEYS})
  return _improve_programs(optim.freeze(config.model), optim.freeze(config.optimizer), frozen_imp,
                           int(config.num_steps), data.obs_dim, data.action_dim, float(config.obs_clip))


def score_policies(config: Any, pre: dict, data: data_lib.OfflineData, params: Any, key: jax.Array) -> np.ndarray:
  """The OPE score of every member of stacked `params` [K, ...] (same start states and model noise for all).

  Args:
    config: the unio4 config (improve.ope_batch, improve.ope_horizon, ...).
    pre: output of `pretrain` (critics, dynamics).
    data: OfflineData.
    params: stacked policy params [K, ...].
    key: PRNG key (start states and model noise).

  Returns:
    [K] scores.
  """
  ope = _programs(config, data)[3]
  return np.asarray(ope(params, data, pre["critics"], pre["dynamics"], key))


def improve(config: Any, pre: dict, data: data_lib.OfflineData, key: jax.Array, replace: bool | None = None,
            evaluate_fn: Callable[[Any], np.ndarray] | None = None, callback: Callback | None = None,
            checkpoints: stages.Checkpoints | None = None, name: str = "improve") -> dict:
  """Offline multi-step policy improvement of the BC ensemble with OPE-gated behaviour replacement.

  Args:
    config: the unio4 config (num_steps, optimizer, improve.*). `improve.replace_rule` picks the gate:
      'best' (the official rule: the candidate's OPE score beats the best score so far, each from its own draw of
      start states) or 'paired' (the candidate beats the current behaviour policy, both scored on the same states
      and model noise, by more than `improve.paired_z` standard errors; `improvement.replace_if_paired_better`).
    pre: output of `pretrain`.
    data: OfflineData.
    key: PRNG key.
    replace: override config.improve.replace (False = one-step: the behaviour policies stay the BC policies).
    evaluate_fn: optional stacked_params -> returns [K] in the real environment, called at step 0, every
      improve.env_eval_every steps (0: never in between) and at the end.
    callback: called as callback('improve', step, row) after each OPE check.
    checkpoints: resumable in `checkpoints.workdir/<name>` (None: nothing saved); saves at OPE checks.
    name: the stage's folder name.

  Returns:
    dict with 'params' (final current policies [K]), 'behaviour' ([K]), 'best_ope' [K], 'last_ope' [K],
    'replacements' (total accepted), 'history' (rows per OPE check), 'env_returns' (list of (step, [K])).

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped the stage (its checkpoint is saved).
  """
  icfg = config.improve
  replace = bool(icfg.replace) if replace is None else bool(replace)
  rule = str(_get(icfg, "replace_rule", "best"))
  if rule not in ("best", "paired"):
    raise ValueError(f"unio4: improve.replace_rule must be 'best' or 'paired', got '{rule}'.")
  z = float(_get(icfg, "paired_z", 2.0))
  num_steps, every = int(config.num_steps), int(icfg.eval_every)
  if every < 1 or num_steps < 1:
    raise ValueError(f"unio4: num_steps ({num_steps}) and improve.eval_every ({every}) must be >= 1.")
  policy, init, chunk, ope, repl, repl_paired = _programs(config, data)
  critics, dynamics = pre["critics"], pre["dynamics"]
  k_train, k_ope = jax.random.split(key)
  env_every = int(_get(icfg, "env_eval_every", 0) or 0)

  def fresh():
    st = init(pre["bc_params"])
    best = ope(st.params, data, critics, dynamics, jax.random.fold_in(k_ope, 0))
    return {"state": st, "best": best, "last": best}

  with stages.stage_loop(checkpoints, name, num_steps) as lp:
    # The state pytree holds the policies, the behaviour policies the gate replaced, and the best and last OPE
    # scores [K]; the count of accepted replacements and the real-environment returns go into the loop state's
    # extra (JSON), so a resumed stage makes the same decisions as an uninterrupted one.
    tree, run = lp.start(fresh)
    state, best, last = tree["state"], tree["best"], tree["last"]
    if not lp.finished and run.step == 0:
      env0 = [] if evaluate_fn is None else [[0, np.asarray(evaluate_fn(state.params)).tolist()]]
      run.extra.update(total_acc=0, env_returns=env0)
      lp.write(0, {"ope_best": np.asarray(best).tolist(), "ope": np.asarray(best).tolist(), "accepted": [],
                   "replacements": 0}, show=False)
    total_acc = int(run.extra.get("total_acc", 0))
    while not lp.finished and run.step < num_steps:
      n = min(every, num_steps - run.step)
      state, m = chunk(state, data, critics, k_train, n)
      done = run.step + n
      k_check = jax.random.fold_in(k_ope, done)
      extra = {}
      if replace and rule == "paired":
        state, last, acc, d_mean, d_se = repl_paired(state, data, critics, dynamics, k_check, z)
        best = jnp.where(acc, last, best)
        extra = {"paired_diff": np.asarray(d_mean).tolist(), "paired_se": np.asarray(d_se).tolist()}
      else:
        last = ope(state.params, data, critics, dynamics, k_check)
        acc = None
        if replace:
          state, best, acc = repl(state, best, last)
      accepted = np.zeros(len(np.asarray(last)), bool) if acc is None else np.asarray(acc)
      total_acc += int(accepted.sum())
      m = jax.device_get(m)
      row = {"ope": np.asarray(last).tolist(), "ope_best": np.asarray(best).tolist(),
             "accepted": accepted.astype(int).tolist(), "replacements": total_acc,
             "loss": float(np.mean(m["loss"])), "approx_kl": float(np.mean(m["approx_kl"])),
             "clip_fraction": float(np.mean(m["clip_fraction"])), **extra}
      if evaluate_fn is not None and ((env_every and done % env_every == 0) or done == num_steps):
        run.extra["env_returns"].append([done, np.asarray(evaluate_fn(state.params)).tolist()])
        row["env_return_mean"] = float(np.mean(run.extra["env_returns"][-1][1]))
      run.extra["total_acc"] = total_acc
      lp.boundary(done, {"state": state, "best": best, "last": last}, row, loss_key="loss")
      if callback:
        callback("improve", done, {"step": done, **row})
    lp.finish({"state": state, "best": best, "last": last})
  env_returns = [(int(s), np.asarray(r, np.float64)) for s, r in run.extra.get("env_returns", [])]
  return {"params": state.params, "behaviour": state.extra["behaviour"], "best_ope": np.asarray(best),
          "last_ope": np.asarray(last), "replacements": int(run.extra.get("total_acc", 0)), "history": run.history,
          "env_returns": env_returns, "policy": policy}


def run_offline(config: Any, dataset: dict, key: jax.Array | None = None,
                evaluate_fn: Callable[[Any], np.ndarray] | None = None, callback: Callback | None = None,
                checkpoints: stages.Checkpoints | None = None) -> dict:
  """The whole offline phase of Uni-O4 on a D4RL-style data set.

  Args:
    config: configs/unio4.py config.
    dataset: dict with observations, actions, rewards, next_observations, terminals, timeouts.
    key: PRNG key (default: jax.random.key(config.seed)).
    evaluate_fn: optional stacked policy params -> real-environment returns [K] (for curves).
    callback: optional callback(stage, step, row) for logging.
    checkpoints: every stage resumable in `checkpoints.workdir/<stage>` (None: nothing saved).

  Returns:
    dict with 'data' (OfflineData), everything from `pretrain` and `improve` ('critics', 'dynamics', 'bc_params',
    'params', 'best_ope', 'last_ope', 'history', ...), and 'selected' (the member with the best last OPE score).
  """
  key = jax.random.key(int(config.seed)) if key is None else key
  k_pre, k_imp = jax.random.split(key)
  data = prepare_data(config, dataset)
  pre = pretrain(config, data, k_pre, callback, checkpoints)
  t0 = time.time()
  imp = improve(config, pre, data, k_imp, evaluate_fn=evaluate_fn, callback=callback, checkpoints=checkpoints)
  out = {**pre, **imp, "data": data, "history": {**pre["history"], "improve": imp["history"]}}
  out["seconds"] = {**pre["seconds"], "improve": time.time() - t0}
  out["selected"] = improvement.select_policy(imp["last_ope"], None, int(_get(config.improve, "select_top_k", 3)))
  return out


# --- online ---------------------------------------------------------------------------------------------------------
def two_learning_rate_optimizer(online: Any, total_steps: int) -> optax.GradientTransformation:
  """Separate Adam optimizers (own learning rate, linear decay, gradient clip) for the policy and the value net,
  as the official fine-tuning (lr_a, lr_c)."""
  base = dict(online.optimizer.to_dict() if hasattr(online.optimizer, "to_dict") else online.optimizer)
  pol = ml_collections.ConfigDict({**base, "learning_rate": float(online.policy_lr)})
  val = ml_collections.ConfigDict({**base, "learning_rate": float(online.value_lr)})
  return optax.multi_transform({"policy": optim.make_optimizer(pol, total_steps),
                                "value": optim.make_optimizer(val, total_steps)},
                               {"policy": "policy", "value": "value"})


class FineTunePPO(ppo.PPO):
  """rl.ppo.PPO with the Uni-O4 policy module, a given value module, the offline params as the start, and two
  learning rates; everything else (rollouts, GAE, clipped losses, observation statistics) is the RL core's."""

  def __init__(self, config: Any, env: envs_lib.Env, policy_module: nn.Module, value_module: nn.Module,
               init_params: dict, init_obs_stats: normalization.RunningStats | None = None, mesh: Any = None):
    super().__init__(config, env, init_params=None, init_obs_stats=init_obs_stats, mesh=mesh)
    self.model = networks.ActorCritic(policy_module, value_module)
    self.init_params = init_params
    total = self.num_updates * self.update_epochs * self.num_minibatches
    self.tx = two_learning_rate_optimizer(config, total)


def run_online(config: Any, env: envs_lib.Env, init: dict | None, key: jax.Array | None = None,
               callback: Callback | None = None, mesh: Any = None, checkpoints: stages.Checkpoints | None = None,
               name: str = "online") -> dict:
  """Online PPO: fine-tuning from the offline policy and V (init given) or PPO from scratch (init None).

  Args:
    config: an online config in rl.ppo format (num_steps = PPO updates, ppo.*, optimizer, model) plus
      eval_every (updates between evaluations), eval_episodes, and for fine-tuning policy_lr / value_lr
      (configs/unio4.py: `config.online`; `config.scratch` for PPO from scratch). Given the whole unio4 config,
      its `online` (init given) or `scratch` (init None) part is used.
    env: the environment.
    init: None (scratch: rl.networks actor-critic from config.model), or {'policy': params, 'value': params,
      'policy_module': nn.Module, 'value_module': nn.Module, 'obs_stats': RunningStats or None}. With
      ppo.normalize_obs the given statistics are used (and, being frozen by their count, kept).
    key: PRNG key (default jax.random.key(config.seed)).
    callback: optional callback('online', update, row) after every evaluation.
    mesh: the device mesh of the PPO agent (None: one device).
    checkpoints: resumable in `checkpoints.workdir/<name>` (None: nothing saved); saves at evaluations.
    name: the stage's folder name ('online', 'online_scratch').

  Returns:
    dict with 'env_steps' [E], 'eval_return' [E] (deterministic, starting at update 0), 'updates' [E],
    'train' (per-update metrics), 'params', 'obs_stats', 'seconds'.

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped the stage (its checkpoint is saved).
  """
  if "ppo" not in config and "online" in config:  # the whole unio4 config was passed
    config = config.online if init is not None else config.scratch
  key = jax.random.key(int(_get(config, "seed", 0))) if key is None else key
  if init is None:
    agent = ppo.PPO(config, env, mesh=mesh)
    policy_module = agent.model.policy
  else:
    missing = [k for k in ("policy", "value", "policy_module", "value_module") if k not in init]
    if missing:
      raise ValueError(f"run_online: init lacks {missing}; pass None for PPO from scratch.")
    agent = FineTunePPO(config, env, init["policy_module"], init["value_module"],
                        {"policy": init["policy"], "value": init["value"]}, init.get("obs_stats"), mesh=mesh)
    policy_module = init["policy_module"]
  num_updates, every = int(config.num_steps), int(config.eval_every)
  if every < 1:
    raise ValueError(f"run_online: eval_every must be >= 1, got {every}.")
  k_run, k_eval = jax.random.split(key)
  chunk = jax.jit(agent.train_chunk, static_argnums=1)
  go = evaluation_program(env, policy_module, int(config.eval_episodes), float(agent.p.obs_clip))
  empty = normalization.init(env.spec.obs_shape)
  stats_of = lambda r: r.train_state.extra if agent.p.normalize_obs else empty
  batch = agent.num_envs * agent.rollout_steps
  t0 = time.time()
  ev = lambda r, i: float(go(r.train_state.params["policy"], stats_of(r), jax.random.fold_in(k_eval, i))["return"])
  with stages.stage_loop(checkpoints, name, num_updates) as lp:
    # The saved state is PPO's whole RunnerState (train state, the environments' states, the key, the update
    # count): a resumed stage continues the same episodes. The evaluations and per-update metrics go into the loop
    # state's extra (JSON).
    runner, run = lp.start(lambda: jax.jit(agent.init)(k_run))
    if not lp.finished and run.step == 0:
      run.extra.update(env_steps=[0], eval_return=[ev(runner, 0)], updates=[0], train=[])
      lp.write(0, {"env_steps": 0, "eval_return": run.extra["eval_return"][0]}, show=False)
      if callback:
        callback("online", 0, {"env_steps": 0, "eval_return": run.extra["eval_return"][0]})
    x = run.extra
    while not lp.finished and run.step < num_updates:
      n = min(every, num_updates - run.step)
      runner, m = chunk(runner, n)
      done = run.step + n
      m = jax.device_get(m)
      x["train"].extend({k: float(v[i]) for k, v in m.items()} for i in range(n))
      x["updates"].append(done)
      x["env_steps"].append(done * batch)
      x["eval_return"].append(ev(runner, done))
      row = {"env_steps": x["env_steps"][-1], "eval_return": x["eval_return"][-1],
             "episode_return": float(np.mean(m["episode_return"]))}
      lp.boundary(done, runner, row)
      if callback:
        callback("online", done, row)
    lp.finish(runner)
  return {"env_steps": np.asarray(run.extra["env_steps"]), "eval_return": np.asarray(run.extra["eval_return"]),
          "updates": np.asarray(run.extra["updates"]), "train": run.extra["train"],
          "params": runner.train_state.params, "obs_stats": stats_of(runner), "seconds": time.time() - t0}


def online_init(pre_or_offline: dict, params: Any, config: Any) -> dict:
  """The `init` of run_online from an offline result: the chosen policy params, V and the data statistics."""
  critics = pre_or_offline["critics"]
  return {"policy": params, "value": critics.v_params, "policy_module": pre_or_offline["policy"],
          "value_module": critics.v_module,
          "obs_stats": critics.obs_stats if bool(config.state_norm) else None}
