"""Motif end to end on captions: pair data set -> annotations -> reward model -> normalisation -> RL reward.

Shared by the toy world (pure JAX, `make_toy_train`) and NetHack (host loop, `intrinsic.MotifRewardHook`).
The toy world's run pieces built from a config are here too: `toy_env`, `toy_dataset` (captions of a random and a
scripted agent), `reward_net` and `fit_from_records` (reward model from annotation records), `toy_settings` and
`toy_agents` (PPO agents for every reward setting x seed in one vmapped program). NetHack's pipeline is
`nethack_motif.nethack_pipeline`; the annotators are in `annotators.py`.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.papers.motif import intrinsic, reward_model, toy
from iclr24_jax.rl import ppo
from iclr24_jax.rl import rollout as rollout_lib


def sample_pairs(captions: Sequence[str], num_pairs: int, seed: int = 0) -> list[tuple[str, str]]:
  """Pairs of captions drawn uniformly (with replacement) from an observation data set of captions.

  Args:
    captions: one caption per observation (frequencies matter, as in the official data set of pairs).
    num_pairs: P.
    seed: numpy seed.

  Returns:
    [(caption_1, caption_2)] * P.
  """
  if len(captions) < 2:
    raise ValueError(f"need at least 2 captions to draw pairs, got {len(captions)}.")
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, len(captions), size=(num_pairs, 2))
  return [(captions[i], captions[j]) for i, j in idx]


def to_arrays(records: Sequence[dict], length: int = reward_model.MESSAGE_LEN) -> dict[str, Any]:
  """Annotation records -> training arrays over unique messages; unparsable labels (None) are dropped.

  Args:
    records: annotation dicts with 'caption_1', 'caption_2' (str) and 'label' (0, 1, 2 or None).
    length: message buffer length.

  Returns:
    dict: messages [M, length] uint8 (unique), texts [M] str, pairs [P, 2] int32, labels [P] int32,
    weights [P] float32 (multiplicity of each unique (pair, label)), occurrences [M] float32 (how often each
    message appears in the kept pairs; for the normalisation's mu and sigma).

  Raises:
    ValueError: no record has a label.
  """
  kept = [r for r in records if r["label"] is not None]
  if not kept:
    raise ValueError("no annotated pair has a label (every answer was unparsable).")
  texts = list(dict.fromkeys([c for r in kept for c in (r["caption_1"], r["caption_2"])]))
  index = {t: i for i, t in enumerate(texts)}
  uniq: dict[tuple[int, int, int], int] = {}
  for r in kept:
    k = (index[r["caption_1"]], index[r["caption_2"]], int(r["label"]))
    uniq[k] = uniq.get(k, 0) + 1
  pairs = np.array([[a, b] for a, b, _ in uniq], np.int32).reshape(-1, 2)
  labels = np.array([l for _, _, l in uniq], np.int32)
  weights = np.array(list(uniq.values()), np.float32)
  occ = np.zeros(len(texts), np.float32)
  np.add.at(occ, pairs[:, 0], weights)
  np.add.at(occ, pairs[:, 1], weights)
  return dict(messages=toy.caption_bytes(texts, length), texts=texts, pairs=pairs, labels=labels, weights=weights,
              occurrences=occ)


def split_by_pair(data: dict, holdout: float, seed: int = 0) -> tuple[dict, dict]:
  """Splits unique unordered caption pairs into train / held-out (a held-out pair never appears in training,
  in either order).

  Args:
    data: the `to_arrays` dict.
    holdout: fraction of unique unordered pairs held out, in [0, 1].
    seed: shuffle seed.

  Returns:
    (train, held_out): copies of data with their own pairs [P', 2], labels, weights and occurrences [M]
    (messages and texts are shared).
  """
  rng = np.random.default_rng(seed)
  unordered = [tuple(sorted(p)) for p in data["pairs"].tolist()]
  keys = sorted(set(unordered))
  rng.shuffle(keys)
  n_hold = int(round(holdout * len(keys)))
  hold = set(keys[:n_hold])
  mask = np.array([u in hold for u in unordered], bool)

  def part(m):
    d = dict(data)
    d.update(pairs=data["pairs"][m], labels=data["labels"][m], weights=data["weights"][m])
    occ = np.zeros(len(data["texts"]), np.float32)
    np.add.at(occ, d["pairs"][:, 0], d["weights"])
    np.add.at(occ, d["pairs"][:, 1], d["weights"])
    d["occurrences"] = occ
    return d

  return part(~mask), part(mask)


def fit_reward(key: jax.Array, data: dict, num_steps: int, learning_rate: float, eps_quantile: float | None,
               model: reward_model.RewardModel | None = None, stages: Any = None, every: int = 0) -> dict[str, Any]:
  """Reward model + normalisation + threshold from training arrays (see `to_arrays`).

  Args:
    key: PRNG key.
    data: the (training) `to_arrays` dict.
    num_steps: Adam steps of the reward model.
    learning_rate: Adam step size.
    eps_quantile: threshold quantile of the normalised rewards, or None (no threshold).
    model: the RewardModel (None: the default).
    stages, every: the resumable stage of `reward_model.fit_reward_model` (None: nothing saved).

  Returns:
    dict: params, rewards [M] (r_phi of data['messages']), mu, sigma, quantiles, eps, history.
  """
  params, hist = reward_model.fit_reward_model(key, data["messages"], data["pairs"], data["labels"],
                                               data["weights"], num_steps, learning_rate, model, stages=stages,
                                               every=every)
  r = reward_model.message_rewards(params, data["messages"], model)
  seen = data["occurrences"] > 0
  # mu, sigma over every message occurrence of the training pairs; quantiles over the unique training messages.
  mu, sigma, q = intrinsic.fit_normalisation(r[seen], r[seen], weights=data["occurrences"][seen])
  eps = intrinsic.threshold((r[seen] - mu) / sigma, eps_quantile)
  return dict(params=params, rewards=r, mu=mu, sigma=sigma, quantiles=q, eps=eps, history=hist)


# ------------------------------------------------------------------------------------------- toy world RL
def toy_reward_fn(caption_rewards: jax.Array, mu: Any, sigma: Any, eps: Any, alpha_ext: Any, alpha_int: Any,
                  beta: Any, max_episode_steps: int):
  """A `ppo.make_train(reward_fn=...)` hook for the toy world: [int] and [sum] (intrinsic.py) from the caption of each step.

  Args:
    caption_rewards: [NUM_CAPTIONS] r_phi of every toy caption (arrays may be traced: vmap over settings).
    mu, sigma, eps, alpha_ext, alpha_int, beta: see intrinsic.intrinsic_reward / combine_rewards.
    max_episode_steps: the env's time limit (decodes the count from the observation).
  """

  def reward_fn(tr: rollout_lib.Transition) -> jax.Array:
    # The caption of the transition (pre-reset next observation) and its episodic count, [int] and [sum] (intrinsic.py).
    cap, cnt = toy.caption_and_count(tr.next_obs, max_episode_steps)
    r = jnp.asarray(caption_rewards)[cap]
    r_int = intrinsic.intrinsic_reward(r, mu, sigma, eps, cnt, beta)
    return intrinsic.combine_rewards(tr.reward, r_int, alpha_ext, alpha_int)

  return reward_fn


def make_toy_train(config: Any, env: toy.CaptionedGridWorld, eval_envs: int = 64):
  """train(key, setting) -> metrics: PPO on the toy world with the Motif reward, pure (vmap over seeds and
  settings).

  `setting` is a dict of scalars / arrays: caption_rewards [C], mu, sigma, eps, alpha_ext, alpha_int, beta.
  Returns {'curve': per-update dict of [num_updates] arrays, 'final': episode_stats of the final policy}.

  Args:
    config: the PPO ConfigDict of the toy agent.
    env: the CaptionedGridWorld.
    eval_envs: environments of the final `toy.episode_stats`.

  Returns:
    the pure train(key, setting) function above.
  """

  def train(key, setting):
    fn = toy_reward_fn(setting["caption_rewards"], setting["mu"], setting["sigma"], setting["eps"],
                       setting["alpha_ext"], setting["alpha_int"], setting["beta"], env.spec.max_episode_steps)
    agent = ppo.PPO(config, env=env, reward_fn=fn)
    k_train, k_eval = jax.random.split(key)
    out = agent.train(k_train)
    ts = out["runner_state"].train_state
    final = toy.episode_stats(env, agent.policy_fn(ts.params, ts.extra, deterministic=False), k_eval, eval_envs)
    m = out["metrics"]
    return {"curve": {"episode_return": m["episode_return"], "reward": m["reward"]}, "final": final}

  return train


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


def fit_from_records(config: Any, records: Sequence[dict], key: jax.Array, oracle: bool = True,
                     stages: Any = None) -> dict[str, Any]:
  """Reward model + normalisation from annotation records, with held-out pair accuracy.

  Args:
    config: the motif ConfigDict (data.holdout, seed, reward_steps, optimizer.learning_rate,
      intrinsic.eps_quantile, model).
    records: annotation records.
    key: PRNG key of the reward model.
    oracle: also score against the toy oracle (toy world only).
    stages: where the reward model's fit saves (a `common.loop.Stages`, stage 'reward_model'; None: nothing
      saved; its steps per chunk: config.checkpoint_every).

  Returns:
    dict: fit (`fit_reward` output), train / heldout arrays, heldout_accuracy (vs the annotator's
    labels), heldout_oracle_accuracy (toy only), train_accuracy, caption_rewards [NUM_CAPTIONS] (toy only).
  """
  data = to_arrays(records)
  train, held = split_by_pair(data, float(config.data.holdout), seed=int(config.seed))
  net = reward_net(config)
  fit = fit_reward(key, train, int(config.reward_steps), float(config.optimizer.learning_rate),
                   config.intrinsic.eps_quantile, net, stages=stages, every=int(config.get("checkpoint_every", 0) or 0))
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


def oracle_values_fit(config: Any, records: Sequence[dict]) -> dict[str, Any]:
  """The study's no-model arm: the toy oracle's progress values used directly as r_phi (no reward model).

  The values (goal 3, unlock 2, key 1, bump -1, else 0) replace the learned r_phi; normalisation and threshold
  are fitted as for a learned model (`fit_reward`: mu, sigma over the message occurrences of the training
  pairs, eps the `intrinsic.eps_quantile` of r_hat over the unique training messages), so the arm differs from
  the learned arms only in where r_phi comes from.

  Args:
    config: the motif ConfigDict (data.holdout, seed, intrinsic.eps_quantile).
    records: annotation records (their captions and train split fix mu, sigma and eps; labels are unused).

  Returns:
    dict shaped like `fit_from_records` output for `toy_settings` / `study.rank_note`: fit (mu, sigma,
    quantiles, eps, rewards [M] of the data's messages), train, caption_rewards [NUM_CAPTIONS].

  Raises:
    ValueError: a record caption that is not a toy caption, or no training message.
  """
  data = to_arrays(records)
  train, _ = split_by_pair(data, float(config.data.holdout), seed=int(config.seed))
  values = toy.caption_values()
  for t in data["texts"]:
    if t not in toy.CAPTIONS:
      raise ValueError(f"oracle_values_fit: caption {t!r} is not a toy caption; the oracle values exist only "
                       "for the toy world.")
  r = np.array([values[toy.CAPTIONS.index(t)] for t in data["texts"]], np.float32)
  seen = train["occurrences"] > 0
  if not seen.any():
    raise ValueError("oracle_values_fit: the training split has no message.")
  mu, sigma, q = intrinsic.fit_normalisation(r[seen], r[seen], weights=train["occurrences"][seen])
  eps = intrinsic.threshold((r[seen] - mu) / sigma, config.intrinsic.eps_quantile)
  return {"fit": dict(rewards=r, mu=mu, sigma=sigma, quantiles=q, eps=eps), "train": train,
          "caption_rewards": values}


def toy_settings(config: Any, fits: dict[str, dict], settings: Sequence[tuple[str, str]]) -> dict[str, jax.Array]:
  """Stacked reward settings for `make_toy_train`: one row per (label source, kind), kind in
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
               num_seeds: int, stages: Any = None, names: Sequence[str] | None = None) -> dict[str, Any]:
  """PPO agents for every setting x seed in one jitted, vmapped program (seed s shares its key across
  settings: paired comparisons).

  The updates run in chunks of `config.agent.checkpoint_every` (0: all at once) as the stage 'agents' (a
  `common.loop.ResumableLoop` in `stages.workdir/agents`): the checkpoint holds every agent's whole RunnerState
  (networks, optimizer, environments mid-episode, key) and the curves so far, so a resumed stage continues the
  uninterrupted run's stream. Rows log the mean episode return per setting every `config.log_every` updates.

  Args:
    config: the motif ConfigDict (agent, eval_envs, log_every).
    env: the toy world.
    settings: `toy_settings` output (leading axis S).
    key: PRNG key (split into num_seeds seed keys).
    num_seeds: seeds per setting.
    stages: where the stage saves (a `common.loop.Stages`; None: nothing saved).
    names: S setting labels for the rows' keys (default the settings' indices).

  Returns:
    dict of numpy arrays: final stats [S, num_seeds] (success, key, unlock, bumps, locked, length), curves
    [S, num_seeds, num_updates] (episode_return = success of episodes finished in each rollout), seconds,
    env_steps.

  Raises:
    common.loop.Preempted: SIGTERM / SIGINT stopped the stage (its checkpoint is saved).
  """
  from iclr24_jax.common import loop
  n_set = int(settings["alpha_ext"].shape[0])
  eval_envs = int(config.eval_envs)
  keys = jax.random.split(key, num_seeds)
  rep = lambda x: jnp.repeat(x, num_seeds, axis=0)
  flat_settings = jax.tree.map(rep, settings)
  flat_keys = jnp.tile(keys, n_set)

  def agent(setting):
    fn = toy_reward_fn(setting["caption_rewards"], setting["mu"], setting["sigma"], setting["eps"],
                       setting["alpha_ext"], setting["alpha_int"], setting["beta"], env.spec.max_episode_steps)
    return ppo.PPO(config.agent, env=env, reward_fn=fn)

  num_updates = agent(jax.tree.map(lambda x: x[0], flat_settings)).num_updates

  def init_one(k, setting):   # the first half of `make_toy_train`'s key split trains, the second evaluates
    return {"runner": agent(setting).init(jax.random.split(k)[0]),
            "curve": {"episode_return": jnp.zeros(num_updates), "reward": jnp.zeros(num_updates)}}

  def chunk_one(state, setting, start, n):
    runner, m = agent(setting).train_chunk(state["runner"], n)
    put = lambda full, part: jax.lax.dynamic_update_slice_in_dim(full, part.astype(full.dtype), start, 0)
    return {"runner": runner, "curve": {k: put(v, m[k]) for k, v in state["curve"].items()}}

  def final_one(state, k, setting):
    ts = state["runner"].train_state
    policy = agent(setting).policy_fn(ts.params, ts.extra, deterministic=False)
    return toy.episode_stats(env, policy, jax.random.split(k)[1], eval_envs)

  chunk_fns: dict[int, Any] = {}
  every = int(config.agent.get("checkpoint_every", 0) or 0)
  chunk = max(1, min(every or num_updates, num_updates))
  log_every = max(1, int(config.get("log_every", 1) or 1))
  names = [str(v) for v in names] if names is not None else [str(i) for i in range(n_set)]
  with loop.stage_loop(stages, "agents", num_updates, every_steps=every) as lp:
    state, run = lp.start(lambda: jax.jit(jax.vmap(init_one))(flat_keys, flat_settings))
    while not lp.finished and run.step < num_updates:
      n, start = min(chunk, num_updates - run.step), run.step
      if n not in chunk_fns:
        chunk_fns[n] = jax.jit(jax.vmap(lambda st, se, s0, n=n: chunk_one(st, se, s0, n), in_axes=(0, 0, None)))
      t0 = time.perf_counter()
      state = jax.block_until_ready(chunk_fns[n](state, flat_settings, jnp.int32(start)))
      run.extra["seconds"] = run.extra.get("seconds", 0.0) + time.perf_counter() - t0
      ret = np.asarray(jax.device_get(state["curve"]["episode_return"])).reshape(n_set, num_seeds, -1).mean(1)
      rows = {u: {f"train/{names[i]}/episode_return": float(ret[i, u - 1]) for i in range(n_set)}
              for u in range(start + 1, start + n + 1) if u % log_every == 0 or u == num_updates}
      for u in sorted(rows)[:-1] if start + n in rows else sorted(rows):
        lp.write(u, rows[u])
      lp.boundary(start + n, state, rows.get(start + n))
    lp.finish(state)
  t0 = time.perf_counter()
  final = jax.device_get(jax.jit(jax.vmap(final_one))(state, flat_keys, flat_settings))
  seconds = float(run.extra.get("seconds", 0.0)) + time.perf_counter() - t0
  curve = jax.device_get(state["curve"])
  shape = lambda x: np.asarray(x).reshape((n_set, num_seeds) + np.asarray(x).shape[1:])
  return {"final": {k: shape(v) for k, v in final.items()},
          "curves": {k: shape(v) for k, v in curve.items()}, "seconds": seconds,
          "env_steps": n_set * num_seeds * int(config.agent.num_steps) * int(config.agent.ppo.num_envs)
          * int(config.agent.ppo.rollout_steps)}
