"""The `ppo` experiment: PPO on JAX environments, offline data sets and their reference returns.

  run(config, workdir)        trains PPO from a configs/ppo.py config; metrics.jsonl, checkpoints/ (resumable),
                              results.json, curves.png

The reproduction and the benchmark are in `study.py`.
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from iclr24_jax.common import loop
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


def _runner_target(agent: ppo.PPO, key: jax.Array, mesh: Any) -> Any:
  """The RunnerState's structure with the shardings `agent.init` gives it (environments over the mesh's 'data'
  axis, the rest replicated; one device without a mesh): what a checkpoint restores into."""
  shapes = jax.eval_shape(agent.init, key)
  if mesh is None:
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one), shapes)
  rep, env = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  place = lambda sh: lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh)  # noqa: E731
  return shapes.replace(train_state=jax.tree.map(place(rep), shapes.train_state),
                        env_state=jax.tree.map(place(env), shapes.env_state),
                        key=place(rep)(shapes.key), update=place(rep)(shapes.update))


def run(config: Any, workdir: str) -> dict:
  """Trains PPO in chunks of `log_every` updates (one jitted scan each), evaluating every `eval_every`.

  Writes workdir/metrics.jsonl (train/* per chunk, eval/* at evaluations), checkpoints/, results.json and
  curves.png. The checkpoint is PPO's whole RunnerState (train state, the environments' states, the key, the
  update count; `common.loop.ResumableLoop`), saved every config.checkpoint_every updates and/or
  checkpoint_every_secs seconds at chunk ends and at the end; SIGTERM / SIGINT save at the next chunk end and raise
  `loop.Preempted`. A resumed run continues the same episodes and reports what an uninterrupted run reports; a
  finished workdir returns its stored results without training.

  Args:
    config: the PPO ConfigDict (`configs/ppo.py`): env, agent hyper-parameters, seed, log_every, eval_every,
      checkpoint_every, checkpoint_every_secs, eval_episodes, optional mesh {'data', 'model'} (1 x 1 or absent: no
      mesh).
    workdir: output folder (created; resumes from its checkpoints).

  Returns:
    results dict: eval_return (deterministic policy), random_return, final train episode return, env_steps,
    env_steps_per_s, compile_s, save_s (seconds the loop was blocked by checkpoint saves).

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped the run (the checkpoint of the update it names is saved).
  """
  os.makedirs(workdir, exist_ok=True)
  mesh = _mesh(config)
  agent = ppo.PPO(config, mesh=mesh)
  key = jax.random.key(int(config.seed))
  key_run, key_eval = jax.random.split(key)
  log_every = max(1, int(config.log_every))
  eval_every = int(config.get("eval_every", 0)) or agent.num_updates
  n_eval = int(config.get("eval_episodes", 32))
  opts = loop.checkpoint_options(config)

  t0 = time.perf_counter()
  chunk_fns: dict[int, Any] = {}
  random_policy = rollout_lib.random_policy(agent.env)

  @jax.jit
  def eval_fn(p, s, k):  # the policy and, as a baseline, uniform random actions (one compiled program)
    k_pol, k_rand = jax.random.split(k)
    ev = agent.evaluate(p, s, k_pol, num_envs=n_eval, deterministic=True)
    ev["random_return"] = rollout_lib.evaluate(agent.env, random_policy, k_rand, n_eval)["return"]
    return ev

  def evaluate(runner, u):
    ts = runner.train_state
    ev = jax.device_get(eval_fn(ts.params, ts.extra, jax.random.fold_in(key_eval, u)))
    return {k: float(ev[k]) for k in ("return", "return_std", "length", "random_return")}

  with loop.ResumableLoop(workdir, num_steps=agent.num_updates, name=f"ppo {agent.env.spec.name}",
                          every_steps=opts["checkpoint_every"], every_secs=opts["checkpoint_every_secs"],
                          max_to_keep=opts.get("max_to_keep", 3), config=config,
                          progress=jax.process_index() == 0) as lp:
    runner, run = lp.start(lambda: jax.jit(agent.init)(key_run), _runner_target(agent, key_run, mesh))
    start = run.step
    x = run.extra
    x.setdefault("compile_s", 0.0)
    x.setdefault("train_s", 0.0)
    x.setdefault("timed_updates", 0)
    while not lp.finished and run.step < agent.num_updates:
      n = min(log_every, agent.num_updates - run.step)
      if n not in chunk_fns:
        tc = time.perf_counter()
        chunk_fns[n] = jax.jit(lambda r, n=n: agent.train_chunk(r, n)).lower(runner).compile()
        x["compile_s"] += time.perf_counter() - tc
      tr = time.perf_counter()
      runner, m = chunk_fns[n](runner)
      m = jax.device_get(m)
      x["train_s"] += time.perf_counter() - tr
      x["timed_updates"] += n
      u = run.step + n
      row = loop.prefix_keys({k: float(np.mean(v)) for k, v in m.items()}, "train")
      row["train/last_episode_return"] = float(np.asarray(m["last_episode_return"])[-1])
      row["train/env_steps"] = float(np.asarray(m["env_steps"])[-1])
      if u % eval_every == 0 or u == agent.num_updates:
        run.final_eval = evaluate(runner, u)
        row.update({"eval/return": run.final_eval["return"], "eval/return_std": run.final_eval["return_std"],
                    "eval/length": run.final_eval["length"]})
      lp.boundary(u, runner, row, loss_key="train/loss")
    if run.final_eval is None:   # num_steps = 0: the initial policy's evaluation
      run.final_eval = evaluate(runner, run.step)
    lp.finish(runner)
  final_eval, rows = run.final_eval, run.history
  env_steps = agent.num_updates * agent.num_envs * agent.rollout_steps
  results = {"env": agent.env.spec.name, "eval_return": final_eval["return"],
             "eval_return_std": final_eval["return_std"], "random_return": final_eval["random_return"],
             "train_last_episode_return": rows[-1].get("train/last_episode_return") if rows else None,
             "env_steps": env_steps, "updates": agent.num_updates, "resumed_from_update": start,
             "compile_s": x["compile_s"], "train_s": x["train_s"], "save_s": run.save_seconds,
             "total_s": time.perf_counter() - t0,
             "env_steps_per_s": (x["timed_updates"] * agent.num_envs * agent.rollout_steps / x["train_s"])
             if x["train_s"] else None}
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
