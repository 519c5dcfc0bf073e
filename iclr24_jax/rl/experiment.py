"""The `ppo` experiment: PPO on JAX environments, offline data sets and their reference returns.

  run(config, workdir)        trains PPO from a configs/ppo.py config; metrics.jsonl, results.json, curves.png

The reproduction and the benchmark are in `study.py`.
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np

from iclr24_jax.common import checkpoint as ckpt_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.rl import envs as envs_lib
from iclr24_jax.rl import ppo
from iclr24_jax.rl import rollout as rollout_lib


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
  writer = metrics_lib.MetricWriter(workdir, resume_step=start if start else None)
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
    row = {f"train/{k}": float(np.mean(v)) for k, v in m.items()}
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
