"""Motif experiment: `run(config, workdir)` runs the whole pipeline on the toy captioned gridworld (data set of
captions -> annotated pairs -> reward model -> intrinsic reward -> PPO agents for each reward setting, vmapped
over seeds) or on NetHack (variant 'nethack').

The pieces (`toy_dataset`, `make_judge`, `annotate`, `fit_from_records`, `toy_agents`, `nethack_pipeline`) are
what `study.reproduce` composes.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.papers.motif import annotation, nethack_motif, pipeline, reward_model, toy
from iclr24_jax.rl import rollout as rollout_lib

# Keyword values for NetHack messages: a stand-in judge for offline smoke runs only (not an annotator).
NETHACK_KEYWORDS = {"You kill": 2.0, "gold": 1.0, "staircase": 1.0, "descend": 2.0, "You see here": 0.5,
                    "wall": -1.0, "solid stone": -1.0, "can't": -1.0, "hurts": -1.0, "bites": -1.0}


def keyword_value(message: str) -> float:
  """Sum of NETHACK_KEYWORDS values of the keywords in a message (the 'keywords' stand-in judge)."""
  return float(sum(v for k, v in NETHACK_KEYWORDS.items() if k in message))


def toy_env(config: Any) -> toy.CaptionedGridWorld:
  """The toy CaptionedGridWorld of config.env (height, width, max_episode_steps, noise_prob).

  Args:
    config: the motif ConfigDict.

  Returns:
    toy.CaptionedGridWorld.
  """
  e = config.env
  return toy.CaptionedGridWorld(int(e.height), int(e.width), int(e.max_episode_steps), float(e.noise_prob))


def reward_net(config: Any) -> reward_model.RewardModel:
  """The RewardModel of config.model (embed_dim, hidden, trunk).

  Args:
    config: the motif ConfigDict.

  Returns:
    reward_model.RewardModel.
  """
  m = config.model
  return reward_model.RewardModel(int(m.embed_dim), int(m.hidden), int(m.trunk))


def toy_dataset(config: Any, env: toy.CaptionedGridWorld, key: jax.Array) -> list[str]:
  """Captions of every step of a random and a scripted agent (the observation data set), as strings: one
  rollout of 2 x data.num_envs environments, the first half acting at random, the second half scripted.

  Args:
    config: the motif ConfigDict (data: num_envs, num_steps, scripted_epsilon).
    env: the toy world.
    key: PRNG key of the rollout.

  Returns:
    list of num_steps * 2 num_envs caption strings (step-major).
  """
  d = config.data
  n = int(d.num_envs)
  rand, script = rollout_lib.random_policy(env), toy.scripted_policy(env, float(d.scripted_epsilon))

  def mixed(k, obs):
    k1, k2 = jax.random.split(k)
    a = jnp.concatenate([rand(k1, obs[:n])[0], script(k2, obs[n:])[0]])
    return a, a, {}

  ids = toy.collect_captions(env, mixed, key, 2 * n, int(d.num_steps))
  return [toy.CAPTIONS[i] for i in ids]


_LM_CACHE: dict = {}


def load_lm() -> tuple[Any, Any, Any]:
  """SmolLM2-135M-Instruct (fused params), loaded once per process."""
  if "smollm2" not in _LM_CACHE:
    from iclr24_jax import lm
    params, config, tok = lm.load_smollm2()
    _LM_CACHE["smollm2"] = (lm.fuse_params(params), config, tok)
  return _LM_CACHE["smollm2"]


def make_judge(config: Any, kind: str | None = None) -> tuple[Any, str]:
  """The annotator named by config.annotation.annotator (or `kind`) and its cache name.

  kinds: 'smollm2' (debiased log-odds), 'generate' (SmolLM2 text + official parser), 'oracle' (toy oracle),
  'keywords' (a keyword stand-in for NetHack smoke runs).

  Args:
    config: the motif ConfigDict (annotation: annotator, tau, batch_size, widths, temperature, top_p,
      max_new_tokens).
    kind: overrides config.annotation.annotator.

  Returns:
    (judge, name): the annotation judge and the name its cached annotations are stored under.

  Raises:
    ValueError: unknown kind.
  """
  a = config.annotation
  kind = kind or a.annotator
  if kind == "oracle":
    values = dict(zip(toy.CAPTIONS, toy.caption_values().tolist()))

    def value(c):
      if c not in values:
        raise ValueError(f"the oracle knows only the toy's captions, got {c!r}.")
      return values[c]

    return annotation.OracleJudge(value), "oracle"
  if kind == "keywords":
    return annotation.OracleJudge(keyword_value), "keywords"
  if kind == "smollm2":
    params, lm_config, tok = load_lm()
    judge = annotation.LogprobJudge(params, lm_config, tok, tau=float(a.tau), batch_size=int(a.batch_size),
                                    widths=tuple(a.widths), system=annotation.SYSTEM_PROMPT)
    return judge, f"smollm2-135m-q4_1/logprob/tau={float(a.tau)}/sys=motif"
  if kind == "generate":
    from iclr24_jax import lm
    params, lm_config, tok = load_lm()
    gen = lm.Generator(params, lm_config, tok, chat=False, batch_size=int(a.batch_size))

    def generate(prompts):
      return gen(list(prompts), max_new_tokens=int(a.max_new_tokens), temperature=float(a.temperature),
                 top_p=float(a.top_p), seed=0)

    name = f"smollm2-135m-q4_1/generate/t={a.temperature}/p={a.top_p}/n={a.max_new_tokens}/sys=motif"
    return annotation.GenerateJudge(generate, tok, system=annotation.SYSTEM_PROMPT), name
  raise ValueError(f"unknown annotator '{kind}'; choose 'smollm2', 'generate', 'oracle' or 'keywords'.")


def cache_path(config: Any, workdir: str, name: str) -> str:
  """Where the annotation JSONL lives: config.annotation.cache_dir (shared across runs) or the workdir.

  Args:
    config: the motif ConfigDict.
    workdir: the run folder (used when annotation.cache_dir is empty).
    name: the cache's name (judge name with '/' replaced).

  Returns:
    the path '<root>/motif_annotations_<name>.jsonl'.
  """
  root = config.annotation.get("cache_dir") or workdir
  return os.path.join(root, f"motif_annotations_{name}.jsonl")


def annotate(config: Any, pairs: Sequence[tuple[str, str]], task: str, judge: Any, judge_name: str,
             path: str | None, max_unique: int | None = None, verbose: bool = True) -> list[dict]:
  """Annotates pairs through the resumable cache. With `max_unique`, only pairs among the first `max_unique`
  distinct non-identical pairs (in data order) are kept (a CPU budget for the LLM).

  Args:
    config: the motif ConfigDict (not read).
    pairs: (caption_1, caption_2) string pairs (identical pairs are kept).
    task: the task description given to the judge.
    judge: the annotation judge (`make_judge`).
    judge_name: its cache name.
    path: the JSONL cache file, or None (memory only).
    max_unique: the budget of distinct non-identical pairs, or None.
    verbose: print progress lines.

  Returns:
    list of annotation record dicts (caption_1, caption_2, label 0 / 1 / 2 / None, ...), one per kept pair.
  """
  pairs = list(pairs)
  if max_unique is not None:
    allowed: dict[tuple[str, str], None] = {}
    for a, b in pairs:
      if a != b and (a, b) not in allowed and len(allowed) < max_unique:
        allowed[(a, b)] = None
    pairs = [p for p in pairs if p[0] == p[1] or p in allowed]
  cache = annotation.AnnotationCache(path)
  t0 = time.perf_counter()

  def progress(done, total):
    if verbose:
      print(f"  annotate [{judge_name}] {done}/{total} new pairs ({time.perf_counter() - t0:.0f} s)", flush=True)

  return annotation.annotate_pairs(pairs, task, judge, judge_name, cache, chunk_size=16, progress=progress)


def label_agreement(records: Sequence[dict]) -> dict[str, Any]:
  """Agreement of an annotator's labels with the toy oracle over distinct non-identical pairs.

  Returns:
    dict: n (distinct pairs the oracle decides), agreement (label equal to the oracle's), correct [n] (0/1),
    tie_rate (annotator ties among all distinct pairs), unparsed (labels None).
  """
  seen, correct, ties, unparsed, total = set(), [], 0, 0, 0
  for r in records:
    key = (r["caption_1"], r["caption_2"])
    if r["caption_1"] == r["caption_2"] or key in seen:
      continue
    seen.add(key)
    total += 1
    ties += r["label"] == annotation.TIE
    unparsed += r["label"] is None
    o = toy.oracle_preference(*key)
    if o != annotation.TIE:
      correct.append(float(r["label"] == o))
  return {"n": len(correct), "agreement": float(np.mean(correct)) if correct else float("nan"),
          "correct": correct, "tie_rate": ties / max(total, 1), "unparsed": unparsed, "distinct_pairs": total}


def fit_from_records(config: Any, records: Sequence[dict], key: jax.Array, oracle: bool = True) -> dict[str, Any]:
  """Reward model + normalisation from annotation records, with held-out pair accuracy.

  Args:
    config: the motif ConfigDict (data.holdout, seed, reward_steps, optimizer.learning_rate,
      intrinsic.eps_quantile, model).
    records: annotation records.
    key: PRNG key of the reward model.
    oracle: also score against the toy oracle (toy world only).

  Returns:
    dict: fit (pipeline.fit_reward output), train / heldout arrays, heldout_accuracy (vs the annotator's
    labels), heldout_oracle_accuracy (toy only), train_accuracy, caption_rewards [NUM_CAPTIONS] (toy only).
  """
  data = pipeline.to_arrays(records)
  train, held = pipeline.split_by_pair(data, float(config.data.holdout), seed=int(config.seed))
  net = reward_net(config)
  fit = pipeline.fit_reward(key, train, int(config.reward_steps), float(config.optimizer.learning_rate),
                            config.intrinsic.eps_quantile, net)
  out = {"fit": fit, "train": train, "heldout": held, "model": net}
  out["train_accuracy"], _ = reward_model.pair_accuracy(fit["rewards"], train["pairs"], train["labels"])
  out["heldout_accuracy"], out["heldout_n"] = reward_model.pair_accuracy(fit["rewards"], held["pairs"],
                                                                        held["labels"])
  if oracle:
    texts = data["texts"]
    olab = np.array([toy.oracle_preference(texts[a], texts[b]) for a, b in held["pairs"]], np.int32)
    out["heldout_oracle_accuracy"], out["heldout_oracle_n"] = reward_model.pair_accuracy(
        fit["rewards"], held["pairs"], olab)
    out["caption_rewards"] = reward_model.message_rewards(fit["params"], toy.caption_bytes(), net)
  return out


def toy_settings(config: Any, fits: dict[str, dict], settings: Sequence[tuple[str, str]]) -> dict[str, jax.Array]:
  """Stacked reward settings for `pipeline.make_toy_train`: one row per (label source, kind), kind in
  'intrinsic' (alpha_ext 0), 'extrinsic' (alpha_int 0) or 'both'.

  Args:
    config: the motif ConfigDict (intrinsic: beta, alpha_ext, alpha_int).
    fits: {label source: `fit_from_records` output} (unused for 'extrinsic' rows).
    settings: S (label source, kind) pairs.

  Returns:
    dict of float32 arrays with leading axis S: caption_rewards [S, NUM_CAPTIONS], mu, sigma, eps, beta,
    alpha_ext, alpha_int [S].

  Raises:
    ValueError: an unknown kind.
  """
  i = config.intrinsic
  rows = []
  for source, kind in settings:
    if kind not in ("intrinsic", "extrinsic", "both"):
      raise ValueError(f"unknown reward setting '{kind}'; choose intrinsic, extrinsic or both.")
    if kind == "extrinsic":
      table, mu, sigma, eps = np.zeros(toy.NUM_CAPTIONS, np.float32), 0.0, 1.0, 0.0
    else:
      f = fits[source]
      table, mu, sigma, eps = f["caption_rewards"], f["fit"]["mu"], f["fit"]["sigma"], f["fit"]["eps"]
    rows.append(dict(caption_rewards=np.asarray(table, np.float32), mu=mu, sigma=sigma,
                     eps=max(eps, -1e30), beta=float(i.beta),
                     alpha_ext=0.0 if kind == "intrinsic" else float(i.alpha_ext),
                     alpha_int=0.0 if kind == "extrinsic" else float(i.alpha_int)))
  return {k: jnp.asarray(np.stack([np.asarray(r[k], np.float32) for r in rows])) for k in rows[0]}


def toy_agents(config: Any, env: toy.CaptionedGridWorld, settings: dict[str, jax.Array], key: jax.Array,
               num_seeds: int) -> dict[str, Any]:
  """PPO agents for every setting x seed in one jitted, vmapped program (seed s shares its key across
  settings: paired comparisons).

  Args:
    config: the motif ConfigDict (agent, eval_envs).
    env: the toy world.
    settings: `toy_settings` output (leading axis S).
    key: PRNG key (split into num_seeds seed keys).
    num_seeds: seeds per setting.

  Returns:
    dict of numpy arrays: final stats [S, num_seeds] (success, key, unlock, bumps, locked, length), curves
    [S, num_seeds, num_updates] (episode_return = success of episodes finished in each rollout), seconds,
    env_steps.
  """
  n_set = int(settings["alpha_ext"].shape[0])
  train = pipeline.make_toy_train(config.agent, env, int(config.eval_envs))
  keys = jax.random.split(key, num_seeds)
  rep = lambda x: jnp.repeat(x, num_seeds, axis=0)
  flat_settings = jax.tree.map(rep, settings)
  flat_keys = jnp.tile(keys, n_set)
  t0 = time.perf_counter()
  out = jax.device_get(jax.jit(jax.vmap(train))(flat_keys, flat_settings))
  seconds = time.perf_counter() - t0
  shape = lambda x: np.asarray(x).reshape((n_set, num_seeds) + np.asarray(x).shape[1:])
  return {"final": {k: shape(v) for k, v in out["final"].items()},
          "curves": {k: shape(v) for k, v in out["curve"].items()}, "seconds": seconds,
          "env_steps": n_set * num_seeds * int(config.agent.num_steps) * int(config.agent.ppo.num_envs)
          * int(config.agent.ppo.rollout_steps)}


def plot_toy(agents: dict, names: Sequence[str], path: str, title: str) -> str:
  """Success rate (mean +- SE over seeds) per setting and the training curves.

  Args:
    agents: `toy_agents` output.
    names: S setting labels, in the settings' order.
    path: PNG output path.
    title: the left panel's title.

  Returns:
    path.
  """
  fig, axes = metrics_lib.new_figure(ncols=2, size=(10.0, 3.6))
  s = agents["final"]["success"]
  n = s.shape[1]
  ax = axes[0, 0]
  ax.bar(range(len(names)), s.mean(1), yerr=s.std(1, ddof=1) / np.sqrt(n) if n > 1 else None, capsize=3)
  ax.set_xticks(range(len(names)))
  ax.set_xticklabels(names, rotation=20, fontsize=7)
  ax.set_ylabel(f"success rate (final policy, {n} seeds)")
  ax.set_title(title, fontsize=9)
  ax = axes[0, 1]
  for i, name in enumerate(names):
    ax.plot(agents["curves"]["episode_return"][i].mean(0), label=name)
  ax.set_xlabel("PPO update")
  ax.set_ylabel("extrinsic return of finished episodes")
  ax.legend(fontsize=6)
  return metrics_lib.save_figure(fig, path)


def nethack_pipeline(config: Any, workdir: str, judge: Any, judge_name: str,
                     settings: Sequence[str] = ("extrinsic", "intrinsic", "both")) -> dict[str, Any]:
  """NetHack: messages of a random and a scripted agent -> pairs -> annotations -> reward model -> HostPPO
  agents per reward setting (a CPU-sized budget: measurements, no claims).

  Args:
    config: the motif ConfigDict (nethack block, intrinsic, seed, ...).
    workdir: folder of the annotation cache (unless annotation.cache_dir).
    judge: the annotation judge.
    judge_name: its cache name.
    settings: reward settings to train: 'extrinsic', 'intrinsic', 'both'.

  Returns:
    dict: collect_steps_per_s, num_messages, unique_messages, annotated_pairs, decided_pairs, annotate_seconds,
    reward (accuracies), mu, sigma, eps, runs (per setting), ranked_messages [(reward, text)].
  """
  from iclr24_jax.rl import ppo
  nh = config.nethack
  max_steps = int(nh.max_episode_steps) or None
  data = []
  rates = {}
  for pol in ("random", "scripted"):
    col = nethack_motif.collect_messages(int(nh.num_envs), int(nh.collect_steps), pol, int(config.seed), max_steps)
    data += col["messages"]
    rates[pol] = col["steps_per_s"]
  pairs = pipeline.sample_pairs(data, int(nh.num_pairs), int(config.seed))
  path = cache_path(config, workdir, "nethack_" + judge_name.replace("/", "_"))
  t0 = time.perf_counter()
  records = annotate(config, pairs, annotation.GOALS.get(nh.goal, nh.goal), judge, judge_name, path,
                     max_unique=int(nh.max_unique_pairs))
  annotate_s = time.perf_counter() - t0
  fitted = fit_from_records(config, records, jax.random.key(int(config.seed)), oracle=False)
  fit = fitted["fit"]
  agent_cfg = ppo.default_config()
  agent_cfg.num_steps = int(nh.updates)
  agent_cfg.ppo.update(dict(rollout_steps=int(nh.rollout_steps), num_minibatches=4, update_epochs=2,
                            reward_scale=0.1))  # official --reward_scale 0.1
  hooks = {kind: dict(reward_fn=nethack_motif.message_reward_fn(fit["params"], fitted["model"]), mu=fit["mu"],
                      sigma=fit["sigma"], eps=fit["eps"], beta=float(config.intrinsic.beta),
                      alpha_ext=0.0 if kind == "intrinsic" else float(nh.alpha_ext),
                      alpha_int=0.0 if kind == "extrinsic" else float(nh.alpha_int)) for kind in settings}
  runs = nethack_motif.train_agents(agent_cfg, hooks, int(nh.updates), int(config.seed), int(nh.num_envs),
                                    max_steps)
  n_decided = sum(r["label"] in (0, 1) for r in records)
  return {"collect_steps_per_s": rates, "num_messages": len(data), "unique_messages": len(set(data)),
          "annotated_pairs": len(records), "decided_pairs": n_decided, "annotate_seconds": annotate_s,
          "reward": {k: fitted[k] for k in ("train_accuracy", "heldout_accuracy", "heldout_n")},
          "mu": fit["mu"], "sigma": fit["sigma"], "eps": fit["eps"], "runs": runs,
          "ranked_messages": sorted(zip(fit["rewards"].tolist(), fitted["train"]["texts"]), reverse=True)}


def run(config: Any, workdir: str) -> dict:
  """The Motif pipeline for config.env.name ('toy' or 'nethack'); writes results.json, metrics.jsonl, plots.

  Args:
    config: the motif ConfigDict (`configs/motif.py`).
    workdir: output folder (created).

  Returns:
    results dict (JSON-ready): toy: annotator, captions, pairs, agreement_with_oracle, reward_model, agents,
    agent_seconds, env_steps, plots; nethack: the `nethack_pipeline` summary.

  Raises:
    ValueError: unknown env.name, or the oracle annotator on NetHack.
  """
  os.makedirs(workdir, exist_ok=True)
  key = jax.random.key(int(config.seed))
  k_data, k_reward, k_agents = jax.random.split(key, 3)
  if config.env.name == "nethack":
    kind = config.annotation.annotator
    if kind == "oracle":
      raise ValueError("the oracle annotator exists only for the toy world; use annotator 'smollm2', "
                       "'generate' or 'keywords' for NetHack.")
    judge, name = make_judge(config)
    res = nethack_pipeline(config, workdir, judge, name)
    writer = metrics_lib.MetricWriter(workdir)
    for kind_, r in res["runs"].items():
      for h in r["history"]:
        writer.write(int(h["update"]), {f"{kind_}/{k}": v for k, v in h.items() if isinstance(v, (int, float))})
    results = {k: v for k, v in res.items() if k != "runs"}
    results["runs"] = {k: {kk: vv for kk, vv in r.items() if kk != "history"} for k, r in res["runs"].items()}
    metrics_lib.write_results(workdir, metrics_lib.to_python(results))
    return metrics_lib.to_python(results)
  if config.env.name != "toy":
    raise ValueError(f"unknown env.name '{config.env.name}'; choose 'toy' or 'nethack'.")
  env = toy_env(config)
  captions = toy_dataset(config, env, k_data)
  pairs = pipeline.sample_pairs(captions, int(config.data.num_pairs), int(config.seed))
  judge, name = make_judge(config)
  task = config.annotation.task or toy.TASK
  records = annotate(config, pairs, task, judge, name, cache_path(config, workdir, name.replace("/", "_")))
  agree = label_agreement(records)
  fitted = fit_from_records(config, records, k_reward)
  settings = [(name, s) for s in config.intrinsic.settings]
  agents = toy_agents(config, env, toy_settings(config, {name: fitted}, settings), k_agents, int(config.num_seeds))
  names = [s for _, s in settings]
  writer = metrics_lib.MetricWriter(workdir)
  curves = agents["curves"]["episode_return"].mean(1)
  for u in range(curves.shape[1]):
    if (u + 1) % max(1, int(config.log_every)) == 0 or u + 1 == curves.shape[1]:
      writer.write(u + 1, {f"train/{n}/episode_return": float(curves[i, u]) for i, n in enumerate(names)})
  plot = plot_toy(agents, names, os.path.join(workdir, "toy_success.png"), f"toy world, labels: {name}")
  fit = fitted["fit"]
  results = {
      "annotator": name, "captions": len(captions), "pairs": len(records),
      "agreement_with_oracle": {k: v for k, v in agree.items() if k != "correct"},
      "reward_model": {"train_accuracy": fitted["train_accuracy"], "heldout_accuracy": fitted["heldout_accuracy"],
                       "heldout_n": fitted["heldout_n"],
                       "heldout_oracle_accuracy": fitted["heldout_oracle_accuracy"],
                       "mu": fit["mu"], "sigma": fit["sigma"], "eps": fit["eps"],
                       "normalised_caption_rewards": dict(zip(toy.CAPTIONS, ((fitted["caption_rewards"] - fit["mu"])
                                                                              / fit["sigma"]).tolist()))},
      "agents": {n: {k: v[i].tolist() for k, v in agents["final"].items()} for i, n in enumerate(names)},
      "agent_seconds": agents["seconds"], "env_steps": agents["env_steps"], "plots": [plot],
  }
  results = metrics_lib.to_python(results)
  metrics_lib.write_results(workdir, results)
  with open(os.path.join(workdir, "annotations.json"), "w") as f:
    json.dump(records, f)
  return results
