"""Motif on NetHack (nle 1.3.0): message data from a random and a scripted agent, and agents trained with
host-loop PPO on the extrinsic score, the intrinsic reward, or both.

The official run uses APPO (sample-factory) for 2e9 steps on `NetHackScore-v1` (its own task class with a
fixed eat action); here `NetHackScore-v0` of nle runs under `rl.ppo_host.HostPPO` for a CPU-sized budget.
`nethack_pipeline` chains it all: messages -> pairs -> annotations -> reward model -> agents per reward setting.
"""
from __future__ import annotations

import collections
import time
from typing import Any, Sequence

import jax
import numpy as np

from iclr24_jax.papers.motif import annotation, intrinsic, reward_model, toy, train
from iclr24_jax.papers.motif.annotators import annotate, cache_path
from iclr24_jax.rl import nethack, ppo_host

# Action indices of NetHackScore-v0 (nle TASK_ACTIONS): 0 MORE, 1-8 compass moves, 9-16 long moves,
# 17 UP '<', 18 DOWN '>', 19 WAIT, 20 KICK, 21 EAT, 22 SEARCH.
LONG_MOVES = tuple(range(9, 17))
DOWN, SEARCH, MORE = 18, 22, 0
BLOCKED = ("It's a wall.", "It's solid stone.", "You can't move diagonally", "This door is locked.",
           "That door is closed.", "blocks your path", "is in the way")


class ScriptedExplorer:
  """A simple scripted NetHack agent: walks far in one direction until blocked, then picks another; goes
  down when standing on a staircase; searches now and then; answers prompts with MORE (escape-like).

  Args:
    num_envs: N; seed: numpy seed.
  """

  def __init__(self, num_envs: int, seed: int = 0):
    self.rng = np.random.default_rng(seed)
    self.direction = self.rng.choice(LONG_MOVES, num_envs)

  def __call__(self, messages: list[str]) -> np.ndarray:
    acts = np.empty(len(messages), np.int64)
    for i, m in enumerate(messages):
      if "staircase down here" in m:
        acts[i] = DOWN
      elif m.endswith("?") or "[yn" in m or "--More--" in m:
        acts[i] = MORE
      elif any(b in m for b in BLOCKED) or self.rng.random() < 0.05:
        self.direction[i] = self.rng.choice(LONG_MOVES)
        acts[i] = self.direction[i]
      elif self.rng.random() < 0.05:
        acts[i] = SEARCH
      else:
        acts[i] = self.direction[i]
    return acts


def collect_messages(num_envs: int = 4, num_steps: int = 250, policy: str = "random", seed: int = 0,
                     max_episode_steps: int | None = None) -> dict[str, Any]:
  """Messages of every step of host rollouts (the observation data set the pairs are drawn from).

  Args:
    num_envs: parallel games; num_steps: steps per game; policy: 'random' or 'scripted'; seed: games and agent.
    max_episode_steps: nle's time limit (None: nle's default).

  Returns:
    dict: messages (list of str, one per step and game), steps_per_s, episode_returns (finished episodes).
  """
  if policy not in ("random", "scripted"):
    raise ValueError(f"policy must be 'random' or 'scripted', got {policy!r}.")
  env = nethack.NetHackVecEnv(num_envs=num_envs, seed=seed, max_episode_steps=max_episode_steps)
  rng = np.random.default_rng(seed)
  agent = ScriptedExplorer(num_envs, seed)
  obs = env.reset()
  msgs, returns = [], []
  t0 = time.perf_counter()
  for _ in range(num_steps):
    current = nethack.decode_messages(obs["message"])
    a = rng.integers(0, env.num_actions, num_envs) if policy == "random" else agent(current)
    obs, _, term, trunc, info = env.step(a)
    msgs.extend(nethack.decode_messages(info["final_obs"]["message"]))
    returns.extend(info["episode_return"][term | trunc].tolist())
  dt = time.perf_counter() - t0
  env.close()
  return {"messages": msgs, "steps_per_s": num_envs * num_steps / dt, "episode_returns": returns}


def message_reward_fn(params: Any, model: reward_model.RewardModel | None = None):
  """NetHack message buffers [K, 256] -> r_phi [K], through the same text -> bytes path as the training data
  (trailing spaces stripped, latin-1).

  Args:
    params: reward-model params.
    model: the RewardModel (None: the default).

  Returns:
    fn(buffers: uint8 [K, 256]) -> numpy float32 [K].
  """

  def fn(buffers: np.ndarray) -> np.ndarray:
    return reward_model.message_rewards(params, toy.caption_bytes(nethack.decode_messages(buffers)), model)

  return fn


def _floats(row: dict) -> dict:
  """A logged row back as numbers: metrics.jsonl writes non-finite floats as strings ('nan')."""
  return {k: float(v) if isinstance(v, str) else v for k, v in row.items() if k != "step"}


def train_agents(config: Any, hooks: dict[str, dict[str, Any]], num_updates: int, seed: int = 0,
                 num_envs: int = 4, max_episode_steps: int | None = None, stages: Any = None,
                 every: int = 0) -> dict[str, dict[str, Any]]:
  """HostPPO on NetHackScore with the Motif reward hook, one agent per reward setting (alpha_int = 0 gives the
  extrinsic-only agent). The settings share one environment and one compiled agent; each starts from the same
  params and the same games (the environment's seed streams restart).

  Each setting is the resumable stage `agents_<setting>` (a `common.loop.ResumableLoop` in
  `stages.workdir/agents_<setting>`, one row per PPO update): its checkpoint holds the TrainState (params, Adam
  state, step) and, as JSON, what the next update depends on besides it: the games mid-episode
  (`NetHackVecEnv.get_state`: replayed on restore), the hook's episodic counts and r_phi cache, the message
  counts of the results and the per-update rows. Update u draws its keys from fold_in(key, u), so a resumed stage
  continues the uninterrupted run's stream. A finished stage restores without training.

  Args:
    config: a PPO config (the configs/ppo.py `ppo_defaults()` layout).
    hooks: setting name -> MotifRewardHook keyword arguments except num_envs (reward_fn, mu, sigma, eps, beta,
      alpha_ext, alpha_int).
    num_updates: PPO updates per setting; seed: games and params; num_envs: games.
    max_episode_steps: nle's time limit (None: nle's default).
    stages: where the stages save (a `common.loop.Stages`; None: nothing saved).
    every: save every N updates (0: not by updates; `stages.every_secs` and SIGTERM / SIGINT still save).

  Returns:
    setting -> dict: history (per-update metrics), env_steps, steps_per_s (collect + hook + learn, wall, over
    every resume), episode_returns, message statistics (unique messages, fraction non-empty), intrinsic
    statistics of the hook.

  Raises:
    common.loop.Preempted: SIGTERM / SIGINT stopped a stage (its checkpoint is saved).
    rl.nethack.ReplayMismatch: a saved game could not be replayed here.
  """
  from iclr24_jax.common import loop
  # Deviation: nle's NetHackScore-v0, host-loop PPO and the small NetHackNet policy instead of the official
  # NetHackScore-v1 (fixed eat action), APPO with V-trace and a CNN + LSTM policy.
  env = nethack.NetHackVecEnv(num_envs=num_envs, seed=seed, max_episode_steps=max_episode_steps)
  model = nethack.NetHackNet(env.num_actions, crop=9, glyph_dim=16, msg_dim=32, hidden=256)
  agent = ppo_host.HostPPO(config, env, model)
  key = jax.random.key(seed + 1)
  results = {}
  try:
    for name, hook_args in hooks.items():
      hook = intrinsic.MotifRewardHook(num_envs=num_envs, **hook_args)
      seen = collections.Counter()

      def counting_hook(batch, hook=hook, seen=seen):
        for m in nethack.decode_messages(batch["next_obs"]["message"].reshape(-1, nethack.MESSAGE_LEN)):
          seen[m] += 1
        return hook(batch)

      agent.reward_hook = counting_hook
      env.reset(seed=seed)                      # the same games for every setting
      initial = agent.init(jax.random.key(seed))  # the same initial params
      with loop.stage_loop(stages, f"agents_{name}", num_updates, every_steps=every) as lp:
        state, run = lp.start(lambda: initial, target=initial)
        if run.step and not lp.finished:      # resumed mid-stage: the games, the hook and the counts of then
          agent.restore_env(run.extra["env"])
          hook.set_state(run.extra["hook"])
          seen.update(dict(run.extra["seen"]))  # (insertion order kept: most_common breaks ties by it)
        while not lp.finished and run.step < num_updates:
          t0 = time.perf_counter()
          state, m = agent.update(state, run.step, key)
          run.extra["seconds"] = run.extra.get("seconds", 0.0) + time.perf_counter() - t0
          m.update({f"hook/{k}": v for k, v in hook.last.items()})
          run.extra.update(env=agent.env_state(), hook=hook.get_state(), seen=list(seen.items()))
          lp.boundary(run.step + 1, state, m, loss_key="loss")
        lp.finish(state)
      history = [_floats(h) for h in run.history]
      steps = num_updates * num_envs * agent.rollout_steps
      returns = [h["episode_return"] for h in history if h["episodes"] > 0 and np.isfinite(h["episode_return"])]
      seen = collections.Counter(dict(run.extra.get("seen", [])))
      total = sum(seen.values())
      results[name] = {
          "history": history, "env_steps": steps, "steps_per_s": steps / max(run.extra.get("seconds", 0.0), 1e-9),
          "episode_returns": returns, "unique_messages": len(seen),
          "nonempty_fraction": 1.0 - seen.get("", 0) / max(total, 1),
          "extrinsic_per_step": float(np.mean([h["extrinsic_reward"] for h in history])),
          "intrinsic_per_step": float(np.mean([h["hook/intrinsic_reward"] for h in history])),
          "top_messages": seen.most_common(8)}
  finally:
    env.close()
  return results


def agent_config(config: Any) -> Any:
  """The HostPPO config of the NetHack agents: config.nethack.agent with the nethack block's budget.

  Args:
    config: the motif ConfigDict (nethack: updates, rollout_steps, agent).

  Returns:
    a PPO ConfigDict (the configs/ppo.py `ppo_defaults()` layout), a copy.
  """
  nh = config.nethack
  c = nh.agent.copy_and_resolve_references()
  c.num_steps = int(nh.updates)
  # Official --reward_scale 0.1 on the game reward only (the hook's intrinsic term is not scaled) and
  # sample-factory's default --reward_clip 10, which the official run keeps.
  c.ppo.update(dict(rollout_steps=int(nh.rollout_steps), num_minibatches=4, update_epochs=2, reward_scale=0.1,
                    reward_clip=10.0))
  return c


def nethack_pipeline(config: Any, workdir: str, judge: Any, judge_name: str,
                     settings: Sequence[str] = ("extrinsic", "intrinsic", "both"),
                     stages: Any = None) -> dict[str, Any]:
  """NetHack: messages of a random and a scripted agent -> pairs -> annotations -> reward model -> HostPPO
  agents per reward setting (a CPU-sized budget: measurements, no claims).

  Args:
    config: the motif ConfigDict (nethack block, intrinsic, seed, ...).
    workdir: folder of the annotation cache (unless annotation.cache_dir).
    judge: the annotation judge.
    judge_name: its cache name.
    settings: reward settings to train: 'extrinsic', 'intrinsic', 'both'.
    stages: where the reward model and the agents save (a `common.loop.Stages`: stages 'reward_model' and
      'agents_<setting>', see `train.fit_from_records` and `train_agents`; None: nothing saved). The messages are
      collected again on a resume (seeded games: the same data) and the annotations come from their cache.

  Returns:
    dict: collect_steps_per_s, num_messages, unique_messages, annotated_pairs, decided_pairs, annotate_seconds,
    reward (accuracies), mu, sigma, eps, runs (per setting), ranked_messages [(reward, text)].
  """
  nh = config.nethack
  max_steps = int(nh.max_episode_steps) or None
  data = []
  rates = {}
  for pol in ("random", "scripted"):
    col = collect_messages(int(nh.num_envs), int(nh.collect_steps), pol, int(config.seed), max_steps)
    data += col["messages"]
    rates[pol] = col["steps_per_s"]
  pairs = train.sample_pairs(data, int(nh.num_pairs), int(config.seed))
  path = cache_path(config, workdir, "nethack_" + judge_name.replace("/", "_"))
  t0 = time.perf_counter()
  records = annotate(config, pairs, annotation.GOALS.get(nh.goal, nh.goal), judge, judge_name, path,
                     max_unique=int(nh.max_unique_pairs))
  annotate_s = time.perf_counter() - t0
  fitted = train.fit_from_records(config, records, jax.random.key(int(config.seed)), oracle=False, stages=stages)
  fit = fitted["fit"]
  agent_cfg = agent_config(config)
  hooks = {kind: dict(reward_fn=message_reward_fn(fit["params"], fitted["model"]), mu=fit["mu"],
                      sigma=fit["sigma"], eps=fit["eps"], beta=float(config.intrinsic.beta),
                      alpha_ext=0.0 if kind == "intrinsic" else float(nh.alpha_ext),
                      alpha_int=0.0 if kind == "extrinsic" else float(nh.alpha_int)) for kind in settings}
  runs = train_agents(agent_cfg, hooks, int(nh.updates), int(config.seed), int(nh.num_envs), max_steps,
                      stages=stages, every=int(nh.get("checkpoint_every", 0) or 0))
  n_decided = sum(r["label"] in (0, 1) for r in records)
  return {"collect_steps_per_s": rates, "num_messages": len(data), "unique_messages": len(set(data)),
          "annotated_pairs": len(records), "decided_pairs": n_decided, "annotate_seconds": annotate_s,
          "reward": {k: fitted[k] for k in ("train_accuracy", "heldout_accuracy", "heldout_n")},
          "mu": fit["mu"], "sigma": fit["sigma"], "eps": fit["eps"], "runs": runs,
          "ranked_messages": sorted(zip(fit["rewards"].tolist(), fitted["train"]["texts"]), reverse=True)}
