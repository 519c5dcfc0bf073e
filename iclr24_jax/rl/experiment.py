"""The `ppo` experiment: PPO on JAX environments, offline data sets and their reference returns.

  run(config, workdir)        trains PPO from a configs/ppo.py config; metrics.jsonl, results.json, curves.png
  reproduce(workdir, fast)    CartPole solved; brax inverted_pendulum well above random; offline data sets and
                              their normalised scores; the recorded reference returns
  benchmark(quick)            env-steps/s of the rollout (gymnax, brax) on 1 and all devices; PPO update steps/s
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from iclr24_jax.common import bench
from iclr24_jax.common import checkpoint as ckpt_lib
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.rl import envs as envs_lib
from iclr24_jax.rl import offline, ppo
from iclr24_jax.rl import rollout as rollout_lib

CARTPOLE_THRESHOLD = 475.0  # gym's CartPole-v1 reward_threshold


def _mesh(config: Any):
  m = config.get("mesh", None)
  if m is None or (int(m.get("data", 1)) == 1 and int(m.get("model", 1)) == 1):
    return None
  mesh = sharding.make_mesh(m)
  return mesh


def run(config: Any, workdir: str) -> dict:
  """Trains PPO in chunks of `log_every` updates (one jitted scan each), evaluating every `eval_every`.

  Writes workdir/metrics.jsonl (train/* per chunk, eval/* at evaluations), checkpoints/ (train state and update
  count; a resumed run restarts its environments), results.json and curves.png.

  Args:
    config: the PPO ConfigDict (`configs/ppo.py`): env, agent hyper-parameters, seed, log_every, eval_every,
      checkpoint_every, eval_episodes, optional mesh {'data', 'model'} (1 x 1 or absent: no mesh).
    workdir: output folder (created; resumes from its checkpoints).

  Returns:
    results dict: eval_return (deterministic policy), random_return, final train episode return, env_steps,
    env_steps_per_s, compile_s.
  """
  os.makedirs(workdir, exist_ok=True)
  mesh = _mesh(config)
  agent = ppo.PPO(config, mesh=mesh)
  key = jax.random.key(int(config.seed))
  key_run, key_eval = jax.random.split(key)
  log_every = max(1, int(config.log_every))
  eval_every = int(config.get("eval_every", 0)) or agent.num_updates
  ckpt_every = int(config.get("checkpoint_every", 0))
  n_eval = int(config.get("eval_episodes", 32))

  t0 = time.perf_counter()
  runner = jax.jit(agent.init)(key_run)
  checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), config=config)
  start = 0
  if checkpointer.latest_step() is not None:
    target = {"train_state": runner.train_state, "update": runner.update}
    restored = checkpointer.restore(target)
    runner = runner.replace(train_state=restored["train_state"], update=restored["update"])
    start = int(restored["update"])
  writer = metrics_lib.open_writer(workdir, start)
  chunk_fns: dict[int, Any] = {}
  random_policy = rollout_lib.random_policy(agent.env)

  @jax.jit
  def eval_fn(p, s, k):  # the policy and, as a baseline, uniform random actions (one compiled program)
    k_pol, k_rand = jax.random.split(k)
    ev = agent.evaluate(p, s, k_pol, num_envs=n_eval, deterministic=True)
    ev["random_return"] = rollout_lib.evaluate(agent.env, random_policy, k_rand, n_eval)["return"]
    return ev
  prog = metrics_lib.Progress(agent.num_updates, start=start, name=f"ppo {agent.env.spec.name}")
  compile_s, run_s, steps_done = None, 0.0, 0
  u = start
  final_eval = None
  while u < agent.num_updates:
    n = min(log_every, agent.num_updates - u)
    if n not in chunk_fns:
      tc = time.perf_counter()
      chunk_fns[n] = jax.jit(lambda r, n=n: agent.train_chunk(r, n)).lower(runner).compile()
      compile_s = (compile_s or 0.0) + time.perf_counter() - tc
    tr = time.perf_counter()
    runner, m = chunk_fns[n](runner)
    m = jax.device_get(m)
    run_s += time.perf_counter() - tr
    steps_done += n
    u += n
    row = loop_lib.prefix_keys({k: float(np.mean(v)) for k, v in m.items()}, "train")
    row["train/last_episode_return"] = float(np.asarray(m["last_episode_return"])[-1])
    row["train/env_steps"] = float(np.asarray(m["env_steps"])[-1])
    if u % eval_every == 0 or u == agent.num_updates:
      ts = runner.train_state
      ev = jax.device_get(eval_fn(ts.params, ts.extra, jax.random.fold_in(key_eval, u)))
      row.update({"eval/return": float(ev["return"]), "eval/return_std": float(ev["return_std"]),
                  "eval/length": float(ev["length"])})
      final_eval = ev
    writer.write(u, row)
    prog.update(u, loss=row.get("train/loss"))
    if ckpt_every and u % ckpt_every == 0:
      checkpointer.save(u, {"train_state": runner.train_state, "update": runner.update})
  checkpointer.save(agent.num_updates, {"train_state": runner.train_state, "update": runner.update})
  checkpointer.close()
  if final_eval is None:
    ts = runner.train_state
    final_eval = jax.device_get(eval_fn(ts.params, ts.extra, jax.random.fold_in(key_eval, u)))
  env_steps = agent.num_updates * agent.num_envs * agent.rollout_steps
  writer.close()
  rows = metrics_lib.read_jsonl(writer.path)
  results = {"env": agent.env.spec.name, "eval_return": float(final_eval["return"]),
             "eval_return_std": float(final_eval["return_std"]), "random_return": float(final_eval["random_return"]),
             "train_last_episode_return": rows[-1].get("train/last_episode_return") if rows else None,
             "env_steps": env_steps, "updates": agent.num_updates, "resumed_from_update": start,
             "compile_s": compile_s, "train_s": run_s, "total_s": time.perf_counter() - t0,
             "env_steps_per_s": (steps_done * agent.num_envs * agent.rollout_steps / run_s) if run_s else None}
  if isinstance(agent.env, envs_lib.BraxEnv):
    results["brax_backend"] = agent.env.backend
  metrics_lib.write_results(workdir, results)
  if jax.process_index() == 0 and rows:
    _plot_returns(rows, os.path.join(workdir, "curves.png"), f"PPO {agent.env.spec.name}")
  return results


def _plot_returns(rows: list[dict], path: str, title: str) -> str:
  fig, axes = metrics_lib.new_figure(size=(5.0, 3.2))
  ax = axes[0, 0]
  xs = [r["train/env_steps"] for r in rows if "train/last_episode_return" in r]
  ax.plot(xs, [r["train/last_episode_return"] for r in rows if "train/last_episode_return" in r],
          label="train (last finished episode, mean over envs)")
  ev = [(r["train/env_steps"], r["eval/return"]) for r in rows if "eval/return" in r]
  if ev:
    ax.plot(*zip(*ev), "o-", label="eval (deterministic)")
  ax.set_xlabel("env steps")
  ax.ticklabel_format(style="sci", axis="x", scilimits=(0, 0))
  ax.set_ylabel("episode return")
  ax.set_title(title)
  ax.legend(fontsize=7)
  return metrics_lib.save_figure(fig, path)


# --- reproduction ---------------------------------------------------------------------------------------------
def _cartpole(workdir: str, fast: bool) -> dict:
  c = ppo.preset_config("cartpole")
  num_seeds = 1 if fast else 4
  if fast:
    c.num_steps = 30
  agent = ppo.PPO(c)
  n_eval = 20 if fast else 100

  def one(k):
    out = agent.train(k)
    ts = out["runner_state"].train_state
    ev = agent.evaluate(ts.params, ts.extra, jax.random.fold_in(k, 1), num_envs=n_eval, deterministic=True)
    ev_s = agent.evaluate(ts.params, ts.extra, jax.random.fold_in(k, 2), num_envs=n_eval, deterministic=False)
    return ev["return"], ev_s["return"], out["metrics"]["last_episode_return"], out["metrics"]["env_steps"]

  t0 = time.perf_counter()
  det, sto, curves, steps = jax.device_get(jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(0), num_seeds)))
  secs = time.perf_counter() - t0
  fig, axes = metrics_lib.new_figure(size=(5.0, 3.2))
  for s in range(num_seeds):
    axes[0, 0].plot(steps[s], curves[s], label=f"seed {s}")
  axes[0, 0].axhline(CARTPOLE_THRESHOLD, color="k", ls="--", lw=0.8)
  axes[0, 0].set_xlabel("env steps")
  axes[0, 0].ticklabel_format(style="sci", axis="x", scilimits=(0, 0))
  axes[0, 0].set_ylabel("train episode return")
  axes[0, 0].set_title("PPO on gymnax CartPole-v1")
  axes[0, 0].legend(fontsize=7)
  plot = metrics_lib.save_figure(fig, os.path.join(workdir, "cartpole_curves.png"))
  ours = float(np.mean(det))
  return {"paper": "ppo", "experiment": f"gymnax CartPole-v1, {int(steps[0, -1])} env steps, {num_seeds} seeds",
          "metric": f"mean eval return ({n_eval} episodes/seed, deterministic policy)", "ours": ours,
          "paper_value": f">= {CARTPOLE_THRESHOLD:.0f} (CartPole-v1's reward threshold, 'solved')",
          "holds": None if fast else bool(ours >= CARTPOLE_THRESHOLD), "kind": "check",
          "notes": f"per seed deterministic {np.round(det, 1).tolist()}, stochastic policy "
                   f"{np.round(sto, 1).tolist()}; {secs:.0f} s incl. compile", "plots": [plot]}


def _brax_and_data(workdir: str, fast: bool) -> list[dict]:
  rows = []
  env_name = "brax/inverted_pendulum"
  cache = os.path.join(workdir, "offline_cache")
  cfg = ppo.preset_config("inverted_pendulum")
  if fast:
    cfg.num_steps = 10
  t0 = time.perf_counter()
  run_ = offline.train_data_agent(env_name, seed=0, cache_dir=cache, num_chunks=5 if fast else 15, config=cfg,
                                  progress=False)
  secs = time.perf_counter() - t0
  env = offline.make_data_env(env_name)
  rand = float(jax.jit(lambda k: rollout_lib.evaluate(env, rollout_lib.random_policy(env), k, 32))(
      jax.random.key(11))["return"])
  final = float(run_["eval_returns"][-1])
  fig, axes = metrics_lib.new_figure(size=(5.0, 3.2))
  axes[0, 0].plot(run_["env_steps"], run_["eval_returns"], "o-", label="PPO (deterministic eval, 16 episodes)")
  axes[0, 0].axhline(rand, color="r", ls="--", lw=0.8, label="random policy")
  axes[0, 0].set_xlabel("env steps")
  axes[0, 0].ticklabel_format(style="sci", axis="x", scilimits=(0, 0))
  axes[0, 0].set_ylabel("return")
  axes[0, 0].set_title("PPO on brax inverted_pendulum (spring)")
  axes[0, 0].legend(fontsize=7)
  plot = metrics_lib.save_figure(fig, os.path.join(workdir, "inverted_pendulum_curve.png"))
  rows.append({"paper": "ppo", "experiment": f"brax inverted_pendulum (spring backend), {int(run_['env_steps'][-1])} "
               "env steps", "metric": "eval return (max 1000)", "ours": final,
               "paper_value": "well above random (here: >= 500, half the maximum)",
               "holds": None if fast else bool(final >= 500.0), "kind": "check",
               "notes": f"random policy {rand:.1f}; {secs:.0f} s incl. compile", "plots": [plot]})
  # Offline data sets from this agent (the same seed and config as the recorded data agent), scored with the
  # recorded reference returns (reference_returns.json), as a user of offline.normalized_score would.
  n = 2_000 if fast else 20_000
  lo, hi = offline.reference_returns(env_name)
  for kind in ("random", "medium", "medium-replay", "expert"):
    ds = _dataset_from_run(env, run_, kind, n, rand)
    rets = offline.episode_returns(ds, complete_only=True)
    mean_r = float(rets.mean()) if rets.size else float("nan")
    rows.append({"paper": "ppo", "experiment": f"offline data {env_name}-{kind} ({len(ds['rewards'])} rows)",
                 "metric": "normalised score of the data's episodes", "ours": offline.normalized_score(env_name, mean_r),
                 "paper_value": {"random": "~0 (D4RL random)", "medium": "~33 (D4RL: about 1/3 of expert)",
                                 "medium-replay": "between random and medium", "expert": "~100"}[kind],
                 "holds": None, "kind": "measurement",
                 "notes": f"{rets.size} complete episodes, mean return {mean_r:.1f}; recorded R_random {lo:.1f}, "
                          f"R_expert {hi:.1f}"})
  return rows


def _dataset_from_run(env, run_, kind, n, r_random):
  key = jax.random.key({"random": 0, "medium": 1, "medium-replay": 2, "expert": 3}[kind])
  if kind == "random":
    return offline.collect(env, rollout_lib.random_policy(env), n, key, num_envs=4)
  mid = offline._medium_index(run_["eval_returns"], r_random, float(np.max(run_["eval_returns"])))
  if kind == "medium":
    return offline.collect_agent(run_["agent"], run_["params"][mid], run_["obs_stats"][mid], n, key, num_envs=4)
  if kind == "expert":
    return offline.collect_agent(run_["agent"], run_["params"][-1], run_["obs_stats"][-1], n, key, num_envs=4)
  rep = run_["replay"]
  rows = np.nonzero(rep["chunk"] <= mid)[0][-n:]
  return {k: v[rows] for k, v in rep.items() if k != "chunk"}


def _maze_rows(workdir: str, fast: bool) -> list[dict]:
  rows = []
  n = 3_000 if fast else 30_000
  for layout in ("umaze",) if fast else ("umaze", "medium"):
    env_name = f"maze/{layout}"
    ref = offline.measure_reference_returns(env_name, num_episodes=16 if fast else 64)
    rows.append({"paper": "ppo", "experiment": f"{env_name}: reference returns (measured now)",
                 "metric": "R_expert (waypoint controller)", "ours": ref["expert"],
                 "paper_value": {"umaze": "D4RL maze2d-umaze: 161.86 (random 23.85)",
                                 "medium": "D4RL maze2d-medium: 277.39 (random 13.13)"}[layout],
                 "holds": None, "kind": "measurement",
                 "notes": f"R_random {ref['random']:.1f}; own dynamics and layout, so only the "
                                         "ordering random << expert is comparable"})
    for kind in ("random", "noisy"):
      ds = offline.get_dataset(env_name, kind, n, cache_dir=os.path.join(workdir, "offline_cache"))
      rows.append({"paper": "ppo", "experiment": f"offline data {env_name}-{kind} ({n} rows)",
                   "metric": "mean reward per step (sparse goal reward)", "ours": float(np.mean(ds["rewards"])),
                   "paper_value": "noisy controller data reaches goals, random data rarely", "holds": None,
                   "kind": "measurement",
                   "notes": f"{int(ds['timeouts'].sum())} episodes"})
  return rows


def _recorded_rows() -> list[dict]:
  rows = []
  for env_name, e in sorted(offline.reference_table().items()):
    if env_name.startswith("d4rl/"):
      continue
    rows.append({"paper": "ppo", "experiment": f"{env_name}: recorded reference returns (reference_returns.json)",
                 "metric": "R_random / R_expert", "ours": f"{e['random']:.1f} / {e['expert']:.1f}",
                 "paper_value": e.get("d4rl_analogue", "-"), "holds": None, "kind": "measurement",
                 "notes": e.get("how", "")})
  return rows


def reproduce(workdir: str, fast: bool = False) -> list[dict]:
  """CartPole solved, inverted_pendulum well above random, offline data sets, reference returns.

  Args:
    workdir: output folder (created).
    fast: shorter runs; the brax rows (inverted_pendulum, its offline data sets) are replaced by one
      'skipped' row.

  Returns:
    list of reproduction row dicts (paper, experiment, metric, ours, paper_value, holds, notes).
  """
  os.makedirs(workdir, exist_ok=True)
  rows = [_cartpole(workdir, fast)]
  if fast:  # brax compiles take tens of seconds on CPU: the fast smoke run leaves them out
    rows.append({"paper": "ppo", "experiment": "brax inverted_pendulum + its offline data sets", "metric": "-",
                 "ours": None, "paper_value": "well above random", "holds": None, "kind": "measurement",
                 "notes": "skipped with --fast (brax compilation alone exceeds the fast budget on CPU)"})
  else:
    rows += _brax_and_data(workdir, fast)
  rows += _maze_rows(workdir, fast)
  rows += _recorded_rows()
  return rows


# --- benchmark ----------------------------------------------------------------------------------------------------
def _rollout_fn(env, model, num_steps):
  def fn(params, env_state, key):
    pol = rollout_lib.actor_critic_policy(model, params)
    state, tr = rollout_lib.rollout(env, pol, env_state, key, num_steps)
    return state, jnp.sum(tr.reward)
  return fn


def benchmark(quick: bool = True) -> list[dict]:
  """Rollout env-steps/s (gymnax CartPole, brax inverted_pendulum; actor-critic policy) on 1 and all devices,
  and PPO update steps/s (CartPole; one update = rollout + GAE + epochs of minibatch SGD)."""
  rows = []
  num_steps = 32
  cases = [("gymnax/CartPole-v1", (64, 1024) if quick else (64, 1024, 8192)),
           ("brax/inverted_pendulum", (64,) if quick else (64, 1024))]
  if not quick:
    cases.append(("brax/hopper", (64, 1024)))
  for env_name, sizes in cases:
    env = envs_lib.make_env(env_name)
    from iclr24_jax.rl import networks
    model = networks.make_actor_critic(env.spec.discrete, env.spec.action_dim)
    params = model.init(jax.random.key(0), jnp.zeros((1,) + env.spec.obs_shape))["params"]
    fn = _rollout_fn(env, model, num_steps)
    state_first = lambda env_state, p, key, fn=fn: fn(p, env_state, key)  # noqa: E731  (carry feeds args[0])

    def make_case(mesh, b, env=env, env_name=env_name, params=params, state_first=state_first):
      rep, dat = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
      jfn = jax.jit(state_first, in_shardings=(dat, rep, rep), out_shardings=(dat, rep), donate_argnums=(0,))
      state = jax.jit(lambda k: env.reset_batch(k, b), out_shardings=dat)(jax.random.key(1))
      cols = dict(items=b * num_steps, name=f"ppo/rollout {env_name}", size=f"T={num_steps}", batch=b)
      if isinstance(env, envs_lib.BraxEnv):
        cols["backend"] = f"{jax.default_backend()} (brax {env.backend})"
      return jfn, (state, jax.device_put(params, rep), jax.random.key(2)), cols

    rows += bench.across_devices(make_case, sizes=sizes, carry=True, repeats=3 if quick else 10)
  for preset in ("cartpole",) if quick else ("cartpole", "inverted_pendulum"):
    c = ppo.preset_config(preset)
    agent = ppo.PPO(c)
    runner = jax.jit(agent.init)(jax.random.key(0))
    upd = jax.jit(agent.update, donate_argnums=(0,))
    rows.append(bench.time_fn(upd, runner, repeats=5 if quick else 20, carry=True,
                              items=agent.num_envs * agent.rollout_steps, name=f"ppo/update {c.env.name}",
                              size=f"{agent.update_epochs}x{agent.num_minibatches} minibatches",
                              batch=agent.num_envs * agent.rollout_steps, mesh_devices=1))
  return rows
