"""Uni-O4 experiment: `run` (one config: offline, then optional online fine-tuning) and the helpers the study
shares (data set, normalised score, plots).

The reproduction (the paper's claims at a CPU scale, 3 seeds) and the benchmark are in `study.py`.

Why not `common.loop.train_loop`: every stage already runs K steps per compiled call (lax.scan chunks
with on-device minibatches drawn from the resident data set), and the improvement stage is gated every
`improve.eval_every` steps by an OPE in a learned model that can *replace the behaviour policy* inside the state:
a decision train_loop's eval/keep_best (which only copies parameters out) cannot make. Online PPO is `rl.ppo`'s own
compiled `train_chunk`. Each stage still runs on `common.loop`'s pieces (one `ResumableLoop` per stage, through
`stages.Checkpoints`): checkpoints, metrics.jsonl, preemption and exact resume.

  python -m experiments.main --config=configs/unio4.py:tiny --workdir=runs/unio4
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import numpy as np

from iclr24_jax.common import data as common_data
from iclr24_jax.common import metrics
from iclr24_jax.papers.unio4 import bc as bc_lib, stages, train
from iclr24_jax.papers.unio4 import improvement
from iclr24_jax.papers.unio4 import data as data_lib
from iclr24_jax.rl import normalization
from iclr24_jax.rl import offline as offline_lib

# The stages of a run, each resumable in its own folder of the workdir (in this order).
STAGES = ("critic", "dynamics", "bc", "improve", "online", "online_scratch")


def dataset(config: Any) -> dict:
  """The offline data set config.data names (rl.offline, cached): observations [N, D], actions [N, A], ..."""
  d = config.data
  return offline_lib.get_dataset(d.name, d.kind, int(d.num_transitions), cache_dir=(d.data_dir or None))


def norm(env_name: str, returns: Any) -> np.ndarray:
  """Normalised scores [...] (100 = expert, 0 = random; rl.offline references) of raw returns [...]."""
  return np.asarray(offline_lib.normalized_score(env_name, np.asarray(returns, np.float64)))


def data_score(env_name: str, ds: dict) -> float:
  """Mean normalised return of the data set's complete episodes (ended by a terminal or a timeout)."""
  ends = np.nonzero(np.asarray(ds["terminals"]) | np.asarray(ds["timeouts"]))[0]
  if len(ends) == 0:
    return float("nan")
  csum = np.concatenate([[0.0], np.cumsum(np.asarray(ds["rewards"], np.float64))])
  starts = np.concatenate([[0], ends[:-1] + 1])
  return float(np.mean(norm(env_name, csum[ends + 1] - csum[starts])))


def _stats(config: Any, ds: dict) -> normalization.RunningStats:
  return data_lib.frozen_stats(ds["observations"]) if bool(config.state_norm) else \
      normalization.init(np.asarray(ds["observations"]).shape[1:])


def _evaluator(config: Any, env: Any, ds: dict, key: jax.Array):
  policy = bc_lib.make_policy(env.spec.action_dim, config.model)
  stats = _stats(config, ds)
  return lambda params: train.evaluate_members(env, policy, params, stats, key, int(config.eval_episodes))


def checkpoints(config: Any, workdir: str) -> stages.Checkpoints:
  """Where and how often the run's stages save: `workdir/<stage>`, every config.checkpoint_every steps of the
  stage and/or config.checkpoint_every_secs seconds (both 0: only each stage's final save).

  Args:
    config: the unio4 config.
    workdir: the run's folder.

  Returns:
    stages.Checkpoints.
  """
  return stages.Checkpoints.from_config(config, workdir, label="unio4")


def run(config: Any, workdir: str) -> dict:
  """Offline Uni-O4 on config.data, then (online.num_steps > 0) PPO fine-tuning from the chosen member, and PPO
  from scratch beside it when online.compare_scratch.

  Writes results.json and plots in workdir, and per stage a folder `workdir/<stage>` (critic, dynamics, bc,
  improve, online, online_scratch) with its metrics.jsonl and checkpoints (`common.loop.ResumableLoop`: saves every
  config.checkpoint_every steps of the stage and/or checkpoint_every_secs seconds, and at its end marked finished;
  SIGTERM / SIGINT save at the next chunk end and stop). A killed run resumes inside the stage it was in, with the
  gate's decisions restored, and skips the finished stages. `eval_episodes = 0` skips the real-environment
  evaluation of the offline members (the OPE alone picks the one handed to fine-tuning; no offline plot).

  Args:
    config: the unio4 ConfigDict (`configs/unio4.py`).
    workdir: the run's folder (created; resumes from its checkpoints).

  Returns:
    results dict: env, data_kind, best_ope / last_ope [K], replacements, per-stage seconds, the real-environment
    returns and scores (eval_episodes > 0), online curves, checkpoints (stage -> folder), plots, wall_seconds.

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped the run (the stage's checkpoint is saved).
  """
  if config.data.name in data_lib.DATASETS:   # the paper's own data: read first (DataNotFoundError
    data_lib.load(config.data)                  # naming the layout and source when absent)
    raise common_data.paper_data_not_wired("unio4", config.data)   # run() does not train on it yet
  t_start = time.time()
  os.makedirs(workdir, exist_ok=True)
  ckpt = checkpoints(config, workdir)
  env_name = config.data.name
  ds = dataset(config)
  env = train.get_env(env_name)
  key = jax.random.key(int(config.seed))
  k_off, k_eval, k_on, k_scr = jax.random.split(key, 4)
  # eval_episodes = 0: no real-environment evaluation (the OPE alone picks the member; no offline plot)
  evaluate_fn = _evaluator(config, env, ds, k_eval) if int(config.eval_episodes) > 0 else None
  off = train.run_offline(config, ds, k_off, evaluate_fn=evaluate_fn, checkpoints=ckpt)
  results = {"env": env_name, "data_kind": config.data.kind, "best_ope": off["best_ope"].tolist(),
             "last_ope": off["last_ope"].tolist(), "replacements": off["replacements"], "seconds": off["seconds"]}
  plots = []
  if evaluate_fn is not None:
    bc_ret = off["env_returns"][0][1]
    final_ret = off["env_returns"][-1][1]
    sel = improvement.select_policy(off["last_ope"], final_ret, int(config.improve.select_top_k))
    results.update({"bc_return": bc_ret.tolist(), "bc_score_mean": float(np.mean(norm(env_name, bc_ret))),
                    "unio4_return": final_ret.tolist(),
                    "unio4_score_mean": float(np.mean(norm(env_name, final_ret))),
                    "selected": sel, "selected_score": float(norm(env_name, final_ret[sel]))})
    plots.append(plot_offline(os.path.join(workdir, "offline_curves.png"), env_name,
                               {"Uni-O4 (multi-step)": off["env_returns"]}, bc_ret))
  else:
    sel = off["selected"]
    results["selected"] = sel
  if int(config.online.num_steps) > 0:
    init = train.online_init(off, bc_lib.members(off["params"])[sel], config)
    on = train.run_online(config.online, env, init, k_on, checkpoints=ckpt, name="online")
    curves = {"PPO from Uni-O4": on}
    results["online_eval_return"] = on["eval_return"].tolist()
    results["online_env_steps"] = on["env_steps"].tolist()
    if bool(config.online.compare_scratch):
      scr = train.run_online(config.scratch, env, None, k_scr, checkpoints=ckpt, name="online_scratch")
      curves["PPO from scratch"] = scr
      results["scratch_eval_return"] = scr["eval_return"].tolist()
      results["scratch_env_steps"] = scr["env_steps"].tolist()
    plots.append(plot_online(os.path.join(workdir, "online_curves.png"), env_name, curves))
  # The final offline ensemble (policies, behaviour policies) is improve's last checkpoint; V and Q are critic's.
  results["checkpoints"] = {stage: os.path.join(workdir, stage, "checkpoints") for stage in STAGES
                            if os.path.isdir(os.path.join(workdir, stage, "checkpoints"))}
  results["plots"] = plots
  results["wall_seconds"] = time.time() - t_start
  metrics.write_results(workdir, results)
  return results


# --- plots ----------------------------------------------------------------------------------------------------------
def plot_offline(path: str, env_name: str, runs: dict, bc_returns: Any, title: str | None = None) -> str:
  """Normalised return (mean of K members) vs improvement step for {label: [(step, returns [K]), ...]}, the BC
  ensemble's [K] returns as a line; writes `path` (PNG) and returns it."""
  fig, axes = metrics.new_figure(size=(5.0, 3.4))
  ax = axes[0, 0]
  for label, pts in runs.items():
    xs = [s for s, _ in pts]
    ys = [float(np.mean(norm(env_name, r))) for _, r in pts]
    ax.plot(xs, ys, marker="o", label=label)
  ax.axhline(float(np.mean(norm(env_name, bc_returns))), color="gray", ls="--", label="BC ensemble")
  ax.set_xlabel("offline improvement steps")
  ax.set_ylabel("normalised return (mean of K members)")
  ax.set_title(title or f"{env_name} offline")
  ax.legend(fontsize=8)
  return metrics.save_figure(fig, path)


def plot_online(path: str, env_name: str, curves: dict, title: str | None = None) -> str:
  """Normalised evaluation return vs online env steps for {label: run_online output}; writes `path` (PNG)."""
  fig, axes = metrics.new_figure(size=(5.0, 3.4))
  ax = axes[0, 0]
  for label, c in curves.items():
    ax.plot(np.asarray(c["env_steps"]) / 1e3, norm(env_name, c["eval_return"]), marker=".", label=label)
  ax.set_xlabel("online env steps (thousands)")
  ax.set_ylabel("normalised return (deterministic)")
  ax.set_title(title or f"{env_name} online")
  ax.legend(fontsize=8)
  return metrics.save_figure(fig, path)
