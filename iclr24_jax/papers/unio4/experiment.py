"""Uni-O4 experiments: `run` (one config: offline, then optional online), `reproduce` (the paper's claims at a CPU
scale) and `benchmark` (offline update steps/s, online env steps/s, 1 and 8 devices).

  python -m experiments.main --config=configs/unio4.py:tiny --workdir=runs/unio4
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from iclr24_jax.common import bench, metrics, sharding
from iclr24_jax.papers.unio4 import algorithm, bc as bc_lib
from iclr24_jax.papers.unio4 import common, improvement
from iclr24_jax.papers.unio4 import data as data_lib
from iclr24_jax.papers.unio4.critics import Critics, critic_modules
from iclr24_jax.papers.unio4.model import init_ensemble
from iclr24_jax.rl import normalization
from iclr24_jax.rl import offline as offline_lib


def _dataset(config: Any) -> dict:
  d = config.data
  return offline_lib.get_dataset(d.name, d.kind, int(d.num_transitions), cache_dir=(d.data_dir or None))


def _norm(env_name: str, returns: Any) -> np.ndarray:
  return np.asarray(offline_lib.normalized_score(env_name, np.asarray(returns, np.float64)))


def _data_score(env_name: str, ds: dict) -> float:
  """Mean normalised return of the data set's complete episodes (ended by a terminal or a timeout)."""
  ends = np.nonzero(np.asarray(ds["terminals"]) | np.asarray(ds["timeouts"]))[0]
  if len(ends) == 0:
    return float("nan")
  csum = np.concatenate([[0.0], np.cumsum(np.asarray(ds["rewards"], np.float64))])
  starts = np.concatenate([[0], ends[:-1] + 1])
  return float(np.mean(_norm(env_name, csum[ends + 1] - csum[starts])))


def _stats(config: Any, ds: dict) -> normalization.RunningStats:
  return data_lib.frozen_stats(ds["observations"]) if bool(config.state_norm) else \
      normalization.init(np.asarray(ds["observations"]).shape[1:])


def _evaluator(config: Any, env: Any, ds: dict, key: jax.Array):
  policy = bc_lib.make_policy(env.spec.action_dim, config.model)
  stats = _stats(config, ds)
  return lambda params: algorithm.evaluate_members(env, policy, params, stats, key, int(config.eval_episodes))


def _save_final(workdir: str, config: Any, off: dict) -> str:
  from iclr24_jax.common.checkpoint import Checkpointer
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=1, config=config)
  c = off["critics"]
  tree = {"policies": off["params"], "behaviour": off["behaviour"], "bc": off["bc_params"], "v": c.v_params,
          "q": c.q_params}
  ckpt.save(int(config.num_steps), jax.device_get(tree))
  ckpt.close()
  return os.path.join(workdir, "checkpoints")


def run(config: Any, workdir: str) -> dict:
  """Offline Uni-O4 on config.data, then (online.num_steps > 0) PPO fine-tuning from the chosen member, and PPO
  from scratch beside it when online.compare_scratch. Writes metrics.jsonl, results.json, plots, a checkpoint.
  `eval_episodes = 0` skips the real-environment evaluation of the offline members (the OPE alone picks the one
  handed to fine-tuning; no offline plot)."""
  t_start = time.time()
  os.makedirs(workdir, exist_ok=True)
  writer = metrics.MetricWriter(workdir)
  env_name = config.data.name
  ds = _dataset(config)
  env = algorithm.get_env(env_name)
  key = jax.random.key(int(config.seed))
  k_off, k_eval, k_on, k_scr = jax.random.split(key, 4)
  progress = metrics.Progress(int(config.num_steps), name="unio4 improve")

  def callback(stage, step, row):
    writer.write(step, {"stage": stage, **{k: v for k, v in row.items() if k != "step"}})
    if stage == "improve":
      progress.update(step, row.get("loss"))

  # eval_episodes = 0: no real-environment evaluation (the OPE alone picks the member; no offline plot)
  evaluate_fn = _evaluator(config, env, ds, k_eval) if int(config.eval_episodes) > 0 else None
  off = algorithm.run_offline(config, ds, k_off, evaluate_fn=evaluate_fn, callback=callback)
  results = {"env": env_name, "data_kind": config.data.kind, "best_ope": off["best_ope"].tolist(),
             "last_ope": off["last_ope"].tolist(), "replacements": off["replacements"], "seconds": off["seconds"]}
  plots = []
  if evaluate_fn is not None:
    bc_ret = off["env_returns"][0][1]
    final_ret = off["env_returns"][-1][1]
    sel = improvement.select_policy(off["last_ope"], final_ret, int(config.improve.select_top_k))
    results.update({"bc_return": bc_ret.tolist(), "bc_score_mean": float(np.mean(_norm(env_name, bc_ret))),
                    "unio4_return": final_ret.tolist(),
                    "unio4_score_mean": float(np.mean(_norm(env_name, final_ret))),
                    "selected": sel, "selected_score": float(_norm(env_name, final_ret[sel]))})
    plots.append(_plot_offline(os.path.join(workdir, "offline_curves.png"), env_name,
                               {"Uni-O4 (multi-step)": off["env_returns"]}, bc_ret))
  else:
    sel = off["selected"]
    results["selected"] = sel
  if int(config.online.num_steps) > 0:
    init = algorithm.online_init(off, bc_lib.members(off["params"])[sel], config)
    cb = lambda stage, step, row: writer.write(step, {"stage": "online", **row})
    on = algorithm.run_online(config.online, env, init, k_on, callback=cb)
    curves = {"PPO from Uni-O4": on}
    results["online_eval_return"] = on["eval_return"].tolist()
    results["online_env_steps"] = on["env_steps"].tolist()
    if bool(config.online.compare_scratch):
      cb = lambda stage, step, row: writer.write(step, {"stage": "online_scratch", **row})
      scr = algorithm.run_online(config.scratch, env, None, k_scr, callback=cb)
      curves["PPO from scratch"] = scr
      results["scratch_eval_return"] = scr["eval_return"].tolist()
      results["scratch_env_steps"] = scr["env_steps"].tolist()
    plots.append(_plot_online(os.path.join(workdir, "online_curves.png"), env_name, curves))
  if int(config.checkpoint_every) >= 0:
    results["checkpoint"] = _save_final(workdir, config, off)
  results["plots"] = plots
  results["wall_seconds"] = time.time() - t_start
  metrics.write_results(workdir, results)
  return results


# --- plots ----------------------------------------------------------------------------------------------------------
def _plot_offline(path: str, env_name: str, runs: dict, bc_returns: Any, title: str | None = None) -> str:
  fig, axes = metrics.new_figure(size=(5.0, 3.4))
  ax = axes[0, 0]
  for label, pts in runs.items():
    xs = [s for s, _ in pts]
    ys = [float(np.mean(_norm(env_name, r))) for _, r in pts]
    ax.plot(xs, ys, marker="o", label=label)
  ax.axhline(float(np.mean(_norm(env_name, bc_returns))), color="gray", ls="--", label="BC ensemble")
  ax.set_xlabel("offline improvement steps")
  ax.set_ylabel("normalised return (mean of K members)")
  ax.set_title(title or f"{env_name} offline")
  ax.legend(fontsize=8)
  return metrics.save_figure(fig, path)


def _plot_online(path: str, env_name: str, curves: dict, title: str | None = None) -> str:
  fig, axes = metrics.new_figure(size=(5.0, 3.4))
  ax = axes[0, 0]
  for label, c in curves.items():
    ax.plot(np.asarray(c["env_steps"]) / 1e3, _norm(env_name, c["eval_return"]), marker=".", label=label)
  ax.set_xlabel("online env steps (thousands)")
  ax.set_ylabel("normalised return (deterministic)")
  ax.set_title(title or f"{env_name} online")
  ax.legend(fontsize=8)
  return metrics.save_figure(fig, path)


# --- reproduction ---------------------------------------------------------------------------------------------------
def reproduction_config(fast: bool = False) -> ml_collections.ConfigDict:
  """The CPU-scale settings of `reproduce` (the official values scaled down; see README)."""
  from iclr24_jax.configs import unio4 as cfg_mod
  c = cfg_mod.get_config("online")
  c.model.hidden = (256, 256)
  c.critic.update(dict(v_hidden=(256, 256), q_hidden=(256, 256), batch_size=256, num_steps=3000, log_every=1000,
                       v_lr=3e-4, q_lr=3e-4, tau=0.05))
  c.bc.update(dict(batch_size=256, num_steps=3000, log_every=1000, lr=1e-3))
  c.dynamics.update(dict(num_members=5, num_elites=3, hidden=(128, 128, 128),
                         weight_decays=(2.5e-5, 5e-5, 7.5e-5, 1e-4), max_steps=1500, eval_every=500, patience=3))
  c.num_steps = 1000
  c.improve.update(dict(batch_size=256, eval_every=100, ope_batch=256, ope_horizon=50, env_eval_every=200))
  c.eval_episodes = 10
  c.online.num_steps = 60
  c.online.eval_every = 5
  c.online.policy_lr = 2e-5
  c.scratch.num_steps = 60
  c.scratch.eval_every = 5
  if fast:
    c.model.hidden = (32, 32)
    c.critic.update(dict(v_hidden=(32, 32), q_hidden=(32, 32), batch_size=64, num_steps=100, log_every=50))
    c.bc.update(dict(batch_size=64, num_steps=100, log_every=50))
    c.dynamics.update(dict(num_members=3, num_elites=2, hidden=(16, 16), weight_decays=(2.5e-5, 5e-5, 1e-4),
                           batch_size=64, max_steps=50, eval_every=25))
    c.num_steps = 40
    c.improve.update(dict(batch_size=64, eval_every=20, ope_batch=16, ope_horizon=5, env_eval_every=0))
    c.eval_episodes = 2
    c.online.num_steps = 2
    c.online.eval_every = 1
    c.online.eval_episodes = 2
    c.online.ppo.update(dict(num_envs=8, rollout_steps=8, update_epochs=1, num_minibatches=2))
    c.online.compare_scratch = False
  return c


def reproduce(workdir: str, fast: bool = False) -> list[dict]:
  """Offline: multi-step Uni-O4 vs one-step (behaviour never replaced) vs the BC ensemble on brax
  inverted_pendulum 'medium' and 'random' data; offline-to-online: PPO fine-tuning from the Uni-O4 policy and V vs
  PPO from scratch (no initial drop, faster rise). One seed; normalised returns (rl.offline references)."""
  t_start = time.time()
  os.makedirs(workdir, exist_ok=True)
  c = reproduction_config(fast)
  env_name = c.data.name
  env = algorithm.get_env(env_name)
  kinds = ("medium",) if fast else ("medium", "random", "medium-replay")  # fold_in(key, index): keep the order
  rows, offline_plots, chosen = [], [], None
  key = jax.random.key(0)
  for di, kind in enumerate(kinds):
    c.data.kind = kind
    ds = _dataset(c)
    c.data.pad_to = 100_000 if not fast else 0  # one compiled program for every data set
    k = jax.random.fold_in(key, di)
    k_pre, k_multi, k_one, k_eval = jax.random.split(k, 4)
    data = algorithm.prepare_data(c, ds)
    pre = algorithm.pretrain(c, data, k_pre)
    ev = lambda p: algorithm.evaluate_members(env, pre["policy"], p, data.obs_stats, k_eval, int(c.eval_episodes))
    t_imp = time.time()
    multi = algorithm.improve(c, pre, data, k_multi, replace=True, evaluate_fn=ev)
    t_one = time.time()
    one = algorithm.improve(c, pre, data, k_one, replace=False, evaluate_fn=ev)
    secs = {**pre["seconds"], "multi-step": t_one - t_imp, "one-step": time.time() - t_one}
    bc_s = _norm(env_name, multi["env_returns"][0][1])
    multi_s = _norm(env_name, multi["env_returns"][-1][1])
    one_s = _norm(env_name, one["env_returns"][-1][1])
    path = _plot_offline(os.path.join(workdir, f"offline_{kind}.png"), env_name,
                         {"multi-step (Uni-O4)": multi["env_returns"], "one-step (no replacement)": one["env_returns"]},
                         multi["env_returns"][0][1], title=f"{env_name} {kind}: offline improvement")
    offline_plots.append(path)
    stamp = (f"K=4 members, {c.eval_episodes} episodes each; critics {c.critic.num_steps} steps ({c.critic.mode}), BC "
             f"{c.bc.num_steps}, {c.num_steps} improvement steps, OPE every {c.improve.eval_every} "
             f"({multi['replacements']} replacements); per member BC {np.round(bc_s, 1).tolist()}, "
             f"one-step {np.round(one_s, 1).tolist()}, multi-step {np.round(multi_s, 1).tolist()}; "
             f"{int(data.num_rows)} transitions (data episodes score {_data_score(env_name, ds):.1f}); seconds "
             + ", ".join(f"{k} {v:.0f}" for k, v in secs.items()))
    rows.append({"paper": "unio4", "experiment": f"offline {kind} (brax inverted_pendulum): multi-step vs BC",
                 "metric": "normalised return, mean of 4 members", "ours": f"{multi_s.mean():.1f} vs {bc_s.mean():.1f}",
                 "paper_value": "multi-step improvement beats the BC policy (D4RL hopper-medium BC 52.9 -> Uni-O4 "
                                "104.4 in the paper's Table 1)",
                 "holds": None if fast else bool(multi_s.mean() > bc_s.mean()), "notes": stamp, "plots": [path]})
    rows.append({"paper": "unio4", "experiment": f"offline {kind} (brax inverted_pendulum): multi-step vs one-step",
                 "metric": "normalised return, mean of 4 members",
                 "ours": f"{multi_s.mean():.1f} vs {one_s.mean():.1f}",
                 "paper_value": "multi-step (OPE-gated behaviour replacement) beats one-step improvement",
                 "holds": None if fast else bool(multi_s.mean() > one_s.mean()),
                 "notes": "one-step = the same run with the behaviour policies never replaced (BPPO-like anchor)",
                 "plots": [path]})
    if kind == "medium":
      sel = improvement.select_policy(multi["last_ope"], multi["env_returns"][-1][1], int(c.improve.select_top_k))
      chosen = (pre, bc_lib.members(multi["params"])[sel], float(multi["env_returns"][-1][1][sel]))
  if fast:  # the online programs (brax PPO) compile for ~15 s of CPU each; the slow tests run them
    rows.append({"paper": "unio4", "experiment": "offline-to-online", "metric": "-", "ours": None,
                 "paper_value": "no initial drop; faster rise than PPO from scratch", "holds": None,
                 "notes": "skipped in fast mode", "plots": []})
    rows[0]["notes"] += f"; reproduce wall time {time.time() - t_start:.0f}s"
    metrics.write_results(workdir, {"rows": rows})
    return rows
  # offline-to-online
  c.data.kind = "medium"
  pre, params, _ = chosen
  init = algorithm.online_init(pre, params, c)
  k_on, k_scr = jax.random.split(jax.random.fold_in(key, 99))
  on = algorithm.run_online(c.online, env, init, k_on)
  curves = {"PPO from Uni-O4 (policy + V)": on}
  on_s = _norm(env_name, on["eval_return"])
  if bool(c.online.compare_scratch):
    scr = algorithm.run_online(c.scratch, env, None, k_scr)
    curves["PPO from scratch"] = scr
    scr_s = _norm(env_name, scr["eval_return"])
  path = _plot_online(os.path.join(workdir, "online.png"), env_name, curves,
                      title=f"{env_name}: offline-to-online")
  early = on_s[1:max(2, len(on_s) // 4 + 1)]
  drop = float(on_s[0] - np.min(early))
  rows.append({"paper": "unio4", "experiment": "offline-to-online (inverted_pendulum medium): initial drop",
               "metric": "normalised return at start -> min over the first quarter of fine-tuning",
               "ours": f"{on_s[0]:.1f} -> {np.min(early):.1f}",
               "paper_value": "no initial performance drop when online PPO starts from the offline policy",
               "holds": None if fast else bool(drop <= 10.0),
               "notes": (f"holds = the drop is at most 10 normalised points (eval noise: {c.online.eval_episodes} "
                         f"episodes); {c.online.num_steps} PPO updates of "
                         f"{c.online.ppo.num_envs * c.online.ppo.rollout_steps} "
                         f"env steps, lr actor {c.online.policy_lr} / critic {c.online.value_lr}, clip "
                         f"{c.online.ppo.clip_eps}; {on['seconds']:.0f}s"), "plots": [path]})
  if bool(c.online.compare_scratch):
    auc_on, auc_scr = float(np.mean(on_s)), float(np.mean(scr_s))
    rows.append({"paper": "unio4", "experiment": "offline-to-online (inverted_pendulum medium): rise vs scratch",
                 "metric": "mean normalised return over the online run (area under the curve)",
                 "ours": f"{auc_on:.1f} vs {auc_scr:.1f} (final {on_s[-1]:.1f} vs {scr_s[-1]:.1f})",
                 "paper_value": "fine-tuning from Uni-O4 rises faster than PPO from scratch",
                 "holds": None if fast else bool(auc_on > auc_scr),
                 "notes": f"scratch = the RL core's tuned inverted_pendulum PPO preset (same env steps); "
                          f"{scr['seconds']:.0f}s",
                 "plots": [path]})
  rows[0]["notes"] += f"; reproduce wall time {time.time() - t_start:.0f}s"
  metrics.write_results(workdir, {"rows": rows})
  return rows


# --- benchmark ------------------------------------------------------------------------------------------------------
def _synthetic_critics(obs_dim: int, act_dim: int, spec: dict, key: jax.Array) -> Critics:
  v_module, q_module = critic_modules(spec)
  vp = v_module.init(key, jnp.zeros((1, obs_dim)))["params"]
  qp = q_module.init(jax.random.fold_in(key, 1), jnp.zeros((1, obs_dim)), jnp.zeros((1, act_dim)))["params"]
  return Critics(vp, qp, normalization.init((obs_dim,)), v_module, q_module)


def benchmark(quick: bool = True) -> list[dict]:
  """Offline improvement step (K = 4 policies, hopper sizes, official widths) at two batch sizes and online PPO
  fine-tuning updates (brax inverted_pendulum) on 1 and all devices (batch / environments split over 'data')."""
  from iclr24_jax.configs import unio4 as cfg_mod
  c = cfg_mod.get_config("")
  rows = []
  n_all = len(jax.devices())
  dev_counts = sorted({1, n_all})
  obs_dim, act_dim, k = 11, 3, int(c.bc.num_policies)
  crit_spec = algorithm.critic_config(c)
  key = jax.random.key(0)
  critics = _synthetic_critics(obs_dim, act_dim, crit_spec, key)
  policy = bc_lib.make_policy(act_dim, c.model)
  params_host = jax.device_get(init_ensemble(key, policy, k, jnp.zeros((1, obs_dim))))
  tx = algorithm.improvement_optimizer(c)
  stats = normalization.init((obs_dim,))
  for n_dev in dev_counts:
    mesh = sharding.make_mesh(devices=jax.devices()[:n_dev])
    rep, dat = sharding.replicated_sharding(mesh), sharding.data_sharding(mesh)
    for batch in ((512, 2048) if quick else (512, 2048, 8192)):
      fresh = lambda: jax.tree.map(jnp.asarray, params_host)  # new buffers: the step donates its state
      state = jax.device_put(common.ensemble_state(fresh(), tx, extra={"behaviour": fresh()}), rep)
      obs = jax.device_put(jax.random.normal(key, (batch, obs_dim)), dat)
      step = jax.jit(lambda s, o, kk: improvement.offline_ppo_step(s, o, kk, policy=policy, critics=critics,
                                                                   obs_stats=stats, clip_eps=0.25, omega=0.7),
                     in_shardings=(rep, dat, rep), out_shardings=(rep, rep), donate_argnums=0)
      rows.append(bench.time_fn(step, state, obs, jax.random.key(1), carry=True, repeats=5 if quick else 20,
                                items=batch * k, name="unio4/offline_ppo_step (K=4, 256x3 policies, IQL critics "
                                "512x3 / 2x1024x2)", size=f"obs {obs_dim}, act {act_dim}", batch=batch,
                                mesh_devices=n_dev))
  # online: PPO fine-tuning updates on brax inverted_pendulum
  env = algorithm.get_env("brax/inverted_pendulum")
  on = cfg_mod.get_config("").online
  on.num_steps = 10
  on.ppo.update(dict(update_epochs=2, num_minibatches=4))
  ip_policy = bc_lib.make_policy(1, c.model)
  v_module, _ = critic_modules(crit_spec)
  init = {"policy": ip_policy.init(key, jnp.zeros((1, 4)))["params"], "value": v_module.init(key, jnp.zeros((1, 4)))
          ["params"]}
  for n_dev in dev_counts:
    for num_envs in ((64,) if quick else (64, 256)):
      on.ppo.num_envs = num_envs
      mesh = sharding.make_mesh(devices=jax.devices()[:n_dev])
      agent = algorithm.FineTunePPO(on, env, ip_policy, v_module, init, data_lib.frozen_stats(np.random.default_rng(0)
                                                                                               .normal(size=(64, 4))),
                                    mesh=mesh)
      runner = jax.jit(agent.init)(jax.random.key(2))
      upd = jax.jit(agent.update, donate_argnums=0)
      rows.append(bench.time_fn(upd, runner, carry=True, repeats=3 if quick else 10,
                                items=num_envs * int(on.ppo.rollout_steps),
                                name="unio4/online PPO update (rollout + 2 epochs x 4 minibatches), brax "
                                     "inverted_pendulum spring", size=f"{num_envs} envs x {on.ppo.rollout_steps} steps",
                                batch=num_envs * int(on.ppo.rollout_steps), mesh_devices=n_dev))
  return rows
