"""LDCQ experiments: `run` (one config, several seeds vmapped); study.py: `reproduce` (the paper's claims at a CPU scale) and
`benchmark` (Q-learning updates/s; planning decisions/s vs the number of sampled latents).

  python -m experiments.main --config=configs/ldcq.py:tiny --workdir=runs/ldcq
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import data as common_data
from iclr24_jax.common import loop, metrics, stats
from iclr24_jax.diffusion import metrics as diff_metrics
from iclr24_jax.diffusion.unet import MLPDenoiser
from iclr24_jax.papers.ldcq import train as alg
from iclr24_jax.papers.ldcq import data as data_lib
from iclr24_jax.papers.ldcq.model import BCPolicy, QNetwork, SkillVAE
from iclr24_jax.rl import offline as offline_lib
from iclr24_jax.rl import replay

METHODS = {"ldcq": "LDCQ (diffusion prior + Q)", "vae_q": "VAE prior + Q", "latent_bc": "latent BC (VAE prior)",
           "diffusion_prior": "diffusion prior, no Q", "bc": "BC", "random": "random policy (uniform actions)"}
# eval.protocol -> (planner, score) of `alg.evaluate_skills`: 'maze' is the official maze2d evaluation
# (eval/plan_skills_diffusion_maze2d.py: two-stage planner, stop at the goal, score T - t), 'return' the generic
# argmax planner scored by the summed reward of the whole episode.
PROTOCOLS = {"maze": ("maze", "time_to_goal"), "return": ("argmax", "return")}


# --- building blocks ------------------------------------------------------------------------------------------------
def build_spec(config: Any, state_dim: int, action_dim: int, prior: str = "diffusion") -> alg.LDCQSpec:
  """The LDCQSpec of a config (modules and sampler settings).

  Args:
    config: the ldcq ConfigDict (model, diffusion, horizon).
    state_dim: D.
    action_dim: A.
    prior: 'diffusion' (LDCQ) or 'gaussian' (the VAE's own prior).

  Returns:
    alg.LDCQSpec.
  """
  m, d = config.model, config.diffusion
  vae = SkillVAE(state_dim, action_dim, int(m.z_dim), int(m.hidden), int(m.gru_layers), str(m.policy_type))
  den = MLPDenoiser(hidden=int(m.denoiser_hidden), num_blocks=int(m.denoiser_blocks),
                    time_embed_dim=int(m.time_embed_dim))
  q_net = QNetwork(int(m.q_hidden), tuple(int(w) for w in m.q_head))
  return alg.LDCQSpec(vae=vae, denoiser=den, q_net=q_net, horizon=int(config.horizon), prior=prior,
                      schedule=str(d.schedule), num_timesteps=int(d.num_timesteps), beta_start=float(d.beta_start),
                      beta_end=float(d.beta_end), sample_steps=int(d.sample_steps), variance=str(d.variance))


def q_config(config: Any, spec: alg.LDCQSpec, num_segments: int) -> alg.QConfig:
  """The QConfig of a config: discount gamma^H, the q block's settings, epochs of num_segments / batch_size steps.

  Args:
    config: the ldcq ConfigDict (gamma, horizon, q).
    spec: the LDCQSpec (its q_net).
    num_segments: segments in the Q data set (sets steps_per_epoch for PER's beta annealing).

  Returns:
    alg.QConfig.
  """
  q = config.q
  return alg.QConfig(q_net=spec.q_net, discount=float(config.gamma) ** int(config.horizon),
                     batch_size=int(q.batch_size), num_target_samples=int(q.num_target_samples), tau=float(q.tau),
                     max_grad_norm=float(q.max_grad_norm), per_beta0=float(q.per_beta0),
                     per_beta_step=float(q.per_beta_step),
                     steps_per_epoch=max(1, num_segments // int(q.batch_size)))


def get_env(name: str):
  """The evaluation environment (mazes: fixed goal 'G', random start, sparse reward), or None."""
  return offline_lib.make_data_env(name) if name.startswith("maze/") else None


def prepare(config: Any) -> dict[str, Any]:
  """Loads the data, relabels maze rewards to the evaluation goal, cuts H-step segments and fixes the subsets
  (the same for every seed: seeds are paired on the data). The last `holdout` fraction of segments (whole episodes
  at the end of the file) is held out from every training stage."""
  d = config.data
  ds = data_lib.load(d.name, d.kind, int(d.num_transitions), d.path, d.data_dir or None)
  env = get_env(d.name)
  if env is not None and bool(d.relabel_goal):
    ds = data_lib.relabel_maze_rewards(ds, env.goal_cell, env.goal_radius)
  h = int(config.horizon)
  starts = data_lib.segment_starts(ds, h)
  n_hold = int(round(float(d.holdout) * len(starts)))
  cut = ds["observations"].shape[0] - (ds["observations"].shape[0] * float(d.holdout))
  train_starts = starts[starts + h <= cut] if n_hold else starts
  hold_starts = starts[starts >= cut] if n_hold else starts[:0]
  segs = data_lib.make_segments(ds, h, gamma=float(config.gamma), starts=train_starts)
  hold = data_lib.make_segments(ds, h, gamma=float(config.gamma), starts=hold_starts) if len(hold_starts) else None
  rng = np.random.default_rng(0)
  m = segs["states"].shape[0]
  n_diff = int(config.diffusion.num_segments) or m
  n_q = int(config.q.num_segments) or m
  diff_idx = np.sort(rng.choice(m, min(n_diff, m), replace=False))
  q_idx = np.sort(rng.choice(m, min(n_q, m), replace=False))
  train_rows = np.unique((train_starts[:, None] + np.arange(h)).reshape(-1))
  return {"ds": ds, "env": env, "segs": segs, "hold": hold, "diff_idx": diff_idx, "q_idx": q_idx,
          "bc_obs": ds["observations"][train_rows].astype(np.float32),
          "bc_act": ds["actions"][train_rows].astype(np.float32),
          "state_dim": ds["observations"].shape[1], "action_dim": ds["actions"].shape[1]}


def compiled(fn, fast_compile: bool = False):
  """`jax.jit(fn)`; with fast_compile on CPU it lowers and compiles at XLA backend optimisation level 0, once per
  argument structure and shapes (the stages run once or a few chunk shapes, and on this 2-core CPU their
  compilation costs more than the level-0 slowdown).

  Args:
    fn: the function to compile.
    fast_compile: compile at level 0 on CPU.

  Returns:
    a callable with fn's signature.
  """
  jitted = jax.jit(fn)
  if not fast_compile or jax.default_backend() != "cpu":
    return jitted
  cache = {}

  def call(*args):
    leaves, tree = jax.tree.flatten(args)
    sig = (tree, tuple((np.shape(x), str(getattr(x, "dtype", type(x)))) for x in leaves))
    if sig not in cache:
      cache[sig] = loop.compile_fast(jitted, *args, cpu_only=True)
    return cache[sig](*args)

  return call


def _sub(segs: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, jax.Array]:
  return {k: jnp.asarray(v[idx]) for k, v in segs.items()}


def _seed_keys(config: Any, num_seeds: int) -> jax.Array:
  base = jax.random.key(int(config.seed))
  return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(num_seeds))


def _abstract(fn, *args) -> Any:
  """`jax.eval_shape(fn, *args)` placed on the first device: the structure a stage's checkpoint restores into."""
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), jax.eval_shape(fn, *args))


def train_stage(stages: loop.Stages | None, name: str, init: Any, init_args: tuple, chunk: Any, keys: jax.Array,
                data: Any, every: int) -> tuple[Any, list[dict]]:
  """One training stage of every seed, in chunks of `every` steps, resumable in `stages.workdir/name`.

  The stage's state (leading axis [S]) is `init(*init_args)` or the stage's latest checkpoint; each chunk runs
  `chunk(state, keys[:, i:i + n], data)` (the stage's step scanned over the consecutive step keys, vmapped over
  seeds), so a stage cut anywhere draws the stream of one uninterrupted scan. A chunk end is a `ResumableLoop`
  boundary: its row (the chunk's mean of each metric over steps and seeds, 'train/' keys) is logged, and it saves
  when the config's interval is due or SIGTERM / SIGINT came (then `loop.Preempted`).

  Args:
    stages: where the stages save (None: nothing saved).
    name: the stage's folder name.
    init: (*init_args) -> the initial state [S, ...], pure (compiled here once, at XLA level 0 on CPU).
    init_args: its arguments.
    chunk: (state, keys [S, n], data) -> (state, metrics [S, n]), compiled.
    keys: [S, num_steps] the stage's step keys (`alg.stage_keys`, vmapped).
    data: the chunk's data argument.
    every: steps per chunk (and per logged row).

  Returns:
    (final state, the stage's logged rows over every resume).

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped the stage (its checkpoint is saved).
  """
  num_steps = int(keys.shape[1])
  every = max(1, min(int(every) or num_steps, num_steps))
  with loop.stage_loop(stages, name, num_steps) as lp:
    state, run = lp.start(lambda: compiled(init, fast_compile=True)(*init_args), _abstract(init, *init_args))
    while not lp.finished and run.step < num_steps:
      n = min(every, num_steps - run.step)
      state, m = chunk(state, keys[:, run.step:run.step + n], data)
      row = loop.prefix_keys({k: float(np.mean(v)) for k, v in jax.device_get(m).items()}, "train")
      lp.boundary(run.step + n, state, row)
    lp.finish(state)
  return state, run.history


def _q_carry(state: Any) -> Any:
  """A Q state without its buffer's data (the Q data set, recomputed from its key on resume: up to
  M x num_prior_samples latents per seed, far more than the networks): what the Q stage carries and saves."""
  buf = state.extra["buffer"]
  pri = {"tree": buf.tree, "insert": buf.insert, "size": buf.size, "max_priority": buf.max_priority}
  return state.replace(extra={"target": state.extra["target"], "priorities": pri})


def _q_full(carry: Any, data: dict, alpha: float) -> Any:
  """`_q_carry` undone: the buffer rebuilt around the Q data set with the carried priorities."""
  buf = replay.PrioritizedBuffer(data=data, alpha=alpha, **carry.extra["priorities"])
  return carry.replace(extra={"target": carry.extra["target"], "buffer": buf})


def pipeline(config: Any, num_seeds: int | None = None, prep: dict | None = None, methods: tuple | None = None,
             log=print, stages: loop.Stages | None = None) -> dict[str, Any]:
  """Runs every stage for `num_seeds` independent seeds (each stage's step vmapped over seeds and compiled once).

  The training stages (vae, diffusion, q_ldcq, q_vae, bc) run in chunks of config.log_every steps (`train_stage`),
  each resumable in `stages.workdir/<stage>`; the encodings, the Q data sets and the evaluations are functions of
  the trained parameters and their keys, recomputed on a rerun.

  Args:
    config: the ldcq ConfigDict (`configs/ldcq.py`).
    num_seeds: S (None: config.num_seeds).
    prep: the result of `prepare(config)` (None: computed here).
    methods: subset of METHODS to evaluate (None: config.methods).
    log: printer of progress lines.
    stages: where the training stages save (None: nothing saved).

  Returns:
    dict with returns {method: [S, E]} (episode scores of config.eval.protocol: T - t at the goal for 'maze', the
    summed reward for 'return'), scores {method: [S, E]} (those normalised with the rl.offline references, as the
    official script normalises 800 - t with D4RL's), sw {'diffusion', 'gaussian'} [S]
    (held-out sliced W2 to the posterior means), histories, params (the LDCQ agent of every seed, leading axis S),
    seconds per stage, and the held-out latents of seed 0 (for the plot). histories: stage -> logged rows.

  Raises:
    ValueError: an unknown method or eval.protocol.
    loop.Preempted: SIGTERM / SIGINT stopped a training stage (its checkpoint is saved).
  """
  prep = prep or prepare(config)
  methods = tuple(methods or config.methods)
  for m in methods:
    if m not in METHODS:
      raise ValueError(f"unknown LDCQ method '{m}'; choose from {sorted(METHODS)}.")
  s = int(num_seeds or config.num_seeds)
  sd, ad = prep["state_dim"], prep["action_dim"]
  spec_d = build_spec(config, sd, ad, "diffusion")
  spec_g = build_spec(config, sd, ad, "gaussian")
  vae = spec_d.vae
  segs = prep["segs"]
  train = {k: jnp.asarray(segs[k]) for k in ("states", "actions", "next_state")}
  dsub, qsub = _sub(segs, prep["diff_idx"]), _sub(segs, prep["q_idx"])
  keys = _seed_keys(config, s)
  k_vae, k_diff, k_bc, k_qd, k_qg, k_eval, k_sw = (jax.vmap(lambda k, i=i: jax.random.fold_in(k, i))(keys)
                                                   for i in range(7))
  secs, hist, out = {}, {}, {}
  c = config
  jit = lambda fn, short=False: compiled(fn, bool(c.get("fast_compile", False)) or short)  # noqa: E731

  def timed(name, fn, *args):
    t0 = time.time()
    res = jax.block_until_ready(fn(*args))
    secs[name] = time.time() - t0
    log(f"ldcq: {name} done in {secs[name]:.1f}s")
    return res

  every = int(c.log_every)
  stage_keys = lambda k, n: jax.vmap(lambda kk: alg.stage_keys(kk, n))(k)  # noqa: E731  ([S], [S, n])

  def stage_program(step):   # (state, key, data) -> (state, metrics), scanned over keys [n], vmapped over seeds
    return jax.vmap(lambda st, ks, data: alg.train_steps(lambda s_, k_: step(s_, k_, data), st, ks),
                    in_axes=(0, 0, None))

  def timed_stage(name, *args):
    t0 = time.time()
    res = train_stage(stages, name, *args)
    secs[name] = time.time() - t0
    log(f"ldcq: {name} done in {secs[name]:.1f}s")
    return res

  # 1. skill VAE
  v = c.vae
  k_init, keys = stage_keys(k_vae, int(v.num_steps))
  vae_step = lambda st, k, data: alg.vae_step(st, k, data, vae=vae, batch_size=int(v.batch_size),  # noqa: E731
                                              beta=float(v.beta), terminal_loss=bool(v.terminal_loss))
  vae_state, hist["vae"] = timed_stage(
      "vae", jax.vmap(lambda k, data: alg.vae_init(k, vae, data, float(v.learning_rate)), in_axes=(0, None)),
      (k_init, train), jit(stage_program(vae_step)), keys, train, every)
  vae_params = vae_state.params

  # 2. posterior means of the diffusion, Q and held-out segments; the latent diffusion prior on (s_0, z) pairs
  need_diff = "ldcq" in methods or "diffusion_prior" in methods
  hold = prep["hold"]
  hold_j = _sub(hold, np.arange(min(1024, hold["states"].shape[0]))) if hold is not None else None

  def encodings(vp, dsub, qsub, hold_j):
    res = {"z_d": alg.encode(vae, vp, dsub["states"], dsub["actions"])[0],
           "z_q": alg.encode(vae, vp, qsub["states"], qsub["actions"])[0]}
    if hold_j is not None:
      res["z_hold"] = alg.encode(vae, vp, hold_j["states"], hold_j["actions"])[0]
    return res

  pri = timed("encode", jit(jax.vmap(encodings, in_axes=(0, None, None, None)), short=True), vae_params, dsub, qsub,
              hold_j)
  if need_diff:
    d = c.diffusion
    k_init, keys = stage_keys(k_diff, int(d.num_steps))
    pairs = {"s0": dsub["states"][:, 0], "z": pri["z_d"]}   # z: [S, M, Z], one set per seed's VAE
    diff_step = lambda st, k, p: alg.diffusion_step(st, k, p["s0"], p["z"], spec=spec_d,  # noqa: E731
                                                    batch_size=int(d.batch_size))
    diff_init = jax.vmap(lambda k, z: alg.diffusion_init(k, spec_d, pairs["s0"], z, float(d.learning_rate)))
    diff_chunk = jax.vmap(lambda st, ks, p: alg.train_steps(lambda s_, k_: diff_step(s_, k_, p), st, ks),
                          in_axes=(0, 0, {"s0": None, "z": 0}))
    diff_state, hist["diffusion"] = timed_stage("diffusion", diff_init, (k_init, pri["z_d"]),
                                                jit(diff_chunk), keys, pairs, every)
    pri["diffusion"] = diff_state.params

  # 3. Q-learning with latents pre-sampled from each prior at s_H (the Q data set, a function of the priors and
  # k_data, is rebuilt on a rerun; the stage carries the networks and the replay priorities)
  n_q = int(qsub["s0"].shape[0]) if "s0" in qsub else int(qsub["states"].shape[0])
  q = c.q

  def q_data(k, vp, dp, z_q, spec):
    params = alg.LDCQParams(vae=vp, diffusion=dp, spec=spec)
    return alg.q_dataset(k, params, qsub["states"][:, 0], z_q, qsub["reward_sum"], qsub["next_state"],
                         qsub["done"], int(q.num_prior_samples))

  def q_stage(name, k, vp, dp, spec):
    k_data, k_train = jax.vmap(jax.random.split, out_axes=1)(k)
    k_init, keys = stage_keys(k_train, int(q.num_steps))
    data = timed(f"{name}_data", jit(jax.vmap(lambda kk, vp_, dp_, z: q_data(kk, vp_, dp_, z, spec))), k_data, vp,
                 dp, pri["z_q"])
    cfg = q_config(c, spec, n_q)
    alpha = float(q.alpha)
    init = jax.vmap(lambda kk, data: _q_carry(alg.q_init(kk, cfg, alg.make_buffer(data, alpha), data["s0"].shape[1],
                                                         data["z"].shape[1], float(q.learning_rate))))

    def chunk(carry, ks, data):
      st, m = alg.train_steps(lambda s_, k_: alg.q_train_step(s_, None, k_, cfg=cfg), _q_full(carry, data, alpha), ks)
      return _q_carry(st), m

    st, rows = timed_stage(name, init, (k_init, data), jit(jax.vmap(chunk)), keys, data, every)
    return st.params, st.extra["target"], rows

  q_params = {}
  if "ldcq" in methods:
    q_params["ldcq"] = q_stage("q_ldcq", k_qd, vae_params, pri["diffusion"], spec_d)
    hist["q_ldcq"] = q_params["ldcq"][2]
  if "vae_q" in methods:
    q_params["vae_q"] = q_stage("q_vae", k_qg, vae_params, None, spec_g)
    hist["q_vae"] = q_params["vae_q"][2]

  # 4. BC
  if "bc" in methods:
    policy = BCPolicy(ad, int(c.model.bc_hidden))
    rows = {"obs": jnp.asarray(prep["bc_obs"]), "act": jnp.asarray(prep["bc_act"])}
    b = c.bc
    k_init, keys = stage_keys(k_bc, int(b.num_steps))
    bc_step = lambda st, k, r: alg.bc_step(st, k, r["obs"], r["act"], policy=policy,  # noqa: E731
                                           batch_size=int(b.batch_size))
    bc_init = jax.vmap(lambda k, r: alg.bc_init(k, policy, r["obs"], float(b.learning_rate)), in_axes=(0, None))
    bc_state, hist["bc"] = timed_stage("bc", bc_init, (k_init, rows), jit(stage_program(bc_step)),
                                       keys, rows, every)
    bc_params = bc_state.params

  # 5. evaluation (same episode keys for every method: paired starts)
  env = prep["env"]
  returns = {}
  agents = {}
  if "ldcq" in methods:
    qp, qt, _ = q_params["ldcq"]
    agents["ldcq"] = alg.LDCQParams(vae=vae_params, diffusion=pri["diffusion"], q=qp, q_target=qt, spec=spec_d)
  if "vae_q" in methods:
    qp, qt, _ = q_params["vae_q"]
    agents["vae_q"] = alg.LDCQParams(vae=vae_params, q=qp, q_target=qt, spec=spec_g)
  if "latent_bc" in methods:
    agents["latent_bc"] = alg.LDCQParams(vae=vae_params, spec=spec_g)
  if "diffusion_prior" in methods:   # official diffusion_prior_policy: one diffusion-prior sample, no Q
    agents["diffusion_prior"] = alg.LDCQParams(vae=vae_params, diffusion=pri["diffusion"], spec=spec_d)
  e = c.eval
  protocol = str(e.get("protocol", "return"))
  if protocol not in PROTOCOLS:
    raise ValueError(f"unknown LDCQ eval.protocol '{protocol}'; choose one of {sorted(PROTOCOLS)}.")
  planner, score = PROTOCOLS[protocol]
  ep_steps = int(e.episode_steps) or None
  if env is not None and int(e.num_episodes) > 0:
    for name, params in agents.items():
      n = 1 if params.q is None else int(e.num_samples)
      fn = jit(jax.vmap(lambda k, p, n=n: alg.evaluate_skills(
          k, p, env, num_episodes=int(e.num_episodes), num_samples=n, exec_horizon=int(e.exec_horizon),
          episode_steps=ep_steps, planner=planner, score=score)), short=(name != "ldcq"))
      returns[name] = np.asarray(timed(f"eval_{name}", fn, k_eval, params))
    if "bc" in methods:
      fn = jit(jax.vmap(lambda k, p: alg.evaluate_bc(k, policy, p, env, num_episodes=int(e.num_episodes),
                                                     episode_steps=ep_steps, score=score)), short=True)
      returns["bc"] = np.asarray(timed("eval_bc", fn, k_eval, bc_params))
    if "random" in methods:   # the floor: uniform actions, the same protocol and episode starts as every arm
      fn = jit(jax.vmap(lambda k: alg.evaluate_random(k, env, num_episodes=int(e.num_episodes),
                                                      episode_steps=ep_steps, score=score)), short=True)
      returns["random"] = np.asarray(timed("eval_random", fn, k_eval))
    out["scores"] = {k: np.asarray(offline_lib.normalized_score(c.data.name, v.astype(np.float64)))
                     for k, v in returns.items()}
  out["returns"] = returns

  # 6. held-out sliced W2: one prior sample per held-out s_0 vs the encoder's posterior means, joint (s_0, z)
  if hold_j is not None and "ldcq" in methods:
    s0_h = hold_j["states"][:, 0]

    def sw_stage(k, vp, dp, z_hold):
      k_d, k_g, k_dir = jax.random.split(k, 3)
      zd = alg.sample_latents(k_d, alg.LDCQParams(vae=vp, diffusion=dp, spec=spec_d), s0_h, 1)[:, 0]
      zg = alg.sample_latents(k_g, alg.LDCQParams(vae=vp, spec=spec_g), s0_h, 1)[:, 0]
      mu, sd_ = jnp.mean(z_hold, 0), jnp.std(z_hold, 0) + 1e-6
      smu, ssd = jnp.mean(s0_h, 0), jnp.std(s0_h, 0) + 1e-6
      joint = lambda z: jnp.concatenate([(s0_h - smu) / ssd, (z - mu) / sd_], -1)  # noqa: E731
      ref = joint(z_hold)
      return {"diffusion": diff_metrics.sliced_wasserstein(joint(zd), ref, k_dir),
              "gaussian": diff_metrics.sliced_wasserstein(joint(zg), ref, k_dir),
              "samples_diffusion": zd, "samples_gaussian": zg}

    sw = timed("sliced_w2", jit(jax.vmap(sw_stage), short=True), k_sw, vae_params, pri["diffusion"], pri["z_hold"])
    out["sw"] = {"diffusion": np.asarray(sw["diffusion"]), "gaussian": np.asarray(sw["gaussian"])}
    out["latents_seed0"] = {"posterior": np.asarray(pri["z_hold"][0]), "diffusion": np.asarray(sw["samples_diffusion"][0]),
                            "gaussian": np.asarray(sw["samples_gaussian"][0])}
  out.update(hist=hist, seconds=secs, agents=agents, num_seeds=s)
  return out


# --- run ------------------------------------------------------------------------------------------------------------
def _summary(res: dict) -> dict[str, Any]:
  summ = {}
  for k, v in res.get("scores", {}).items():
    per_seed = v.mean(axis=1)
    m, se = stats.mean_se(per_seed)
    summ[k] = {"score_mean": m, "score_se": se, "per_seed": per_seed.tolist(),
               "return_mean": float(res["returns"][k].mean())}
  return summ


def plot_scores(path: str, scores: dict, title: str) -> str:
  """Bar chart of the normalised score per method (mean over seeds, +- se; dots: the seeds).

  Args:
    path: PNG output path.
    scores: {method: [S, E] normalised episode scores}.
    title: the axes title.

  Returns:
    path.
  """
  fig, axes = metrics.new_figure(size=(6.4, 3.4))
  ax = axes[0, 0]
  names = list(scores)
  per_seed = [scores[n].mean(axis=1) for n in names]
  means = [float(np.mean(p)) for p in per_seed]
  ses = [stats.mean_se(p)[1] for p in per_seed]
  ax.bar(range(len(names)), means, yerr=ses, capsize=4, color=["C0", "C1", "C2", "C3", "C4", "C7"][:len(names)])
  for i, p in enumerate(per_seed):
    ax.scatter(np.full(len(p), i), p, color="k", s=8, zorder=3)
  ax.set_xticks(range(len(names)))
  ax.set_xticklabels([METHODS[n].split(" (")[0] for n in names], fontsize=8, rotation=20, ha="right")
  ax.set_ylabel("normalised score (mean over episodes)")
  ax.set_title(title, fontsize=9)
  return metrics.save_figure(fig, path)


def plot_latents(path: str, lat: dict, title: str) -> str:
  """Scatter plots of held-out latents on the first two principal axes of the posterior means.

  Args:
    path: PNG output path.
    lat: {'posterior': [n, Z] encoder means, 'diffusion': [n, Z] and 'gaussian': [n, Z] prior samples}.
    title: the figure title.

  Returns:
    path.
  """
  post = lat["posterior"]
  mu = post.mean(0)
  _, _, vt = np.linalg.svd(post - mu, full_matrices=False)
  proj = lambda z: (z - mu) @ vt[:2].T  # noqa: E731
  fig, axes = metrics.new_figure(ncols=3, size=(9.0, 3.0))
  for ax, (name, z) in zip(axes[0], (("encoder posterior means", post), ("diffusion prior samples", lat["diffusion"]),
                                     ("Gaussian VAE prior samples", lat["gaussian"]))):
    p = proj(z)
    ax.scatter(p[:, 0], p[:, 1], s=2, alpha=0.5)
    ax.set_title(name, fontsize=8)
    ax.set_xlim(np.percentile(proj(post)[:, 0], [0.5, 99.5]) * 1.3)
    ax.set_ylim(np.percentile(proj(post)[:, 1], [0.5, 99.5]) * 1.3)
  fig.suptitle(title, fontsize=9)
  return metrics.save_figure(fig, path)


# The training stages' folders in a workdir (each its checkpoints/ and metrics.jsonl), in the order they run.
STAGES = ("vae", "diffusion", "q_ldcq", "q_vae", "bc")


def run(config: Any, workdir: str) -> dict:
  """The whole LDCQ pipeline for config.num_seeds seeds: results.json (normalised scores per method and seed,
  held-out sliced W2), plots, and per training stage a folder `workdir/<stage>` (vae, diffusion, q_ldcq, q_vae,
  bc) with its metrics.jsonl (losses averaged over seeds and the chunk's steps) and checkpoints.

  Each stage saves every config.checkpoint_every of its steps and/or checkpoint_every_secs seconds at its chunk
  ends (chunks of config.log_every steps) and at its end, marked finished; SIGTERM / SIGINT save at the next chunk
  end and raise `loop.Preempted`. A rerun skips the finished stages and resumes inside the one it was in; its
  results equal an uninterrupted run's.

  Args:
    config: the ldcq ConfigDict (`configs/ldcq.py`).
    workdir: output folder (created; resumes from its stages' checkpoints).

  Returns:
    results dict: env, data_kind, num_seeds, methods (per-method score summary), seconds, sliced_w2_heldout,
    checkpoints (stage -> folder: the agents' parameters are the stages' last checkpoints), plots, wall_seconds.

  Raises:
    loop.Preempted: SIGTERM / SIGINT stopped the run (the stage's checkpoint is saved).
  """
  if config.data.name in data_lib.DATASETS:   # the paper's own data: read first (DataNotFoundError
    data_lib.load(config.data)                  # naming the layout and source when absent)
    raise common_data.paper_data_not_wired("ldcq", config.data)   # run() does not train on it yet
  t_start = time.time()
  os.makedirs(workdir, exist_ok=True)
  res = pipeline(config, stages=loop.Stages.from_config(config, workdir, label="ldcq"))
  results = {"env": config.data.name, "data_kind": config.data.kind, "num_seeds": res["num_seeds"],
             "methods": _summary(res), "seconds": res["seconds"]}
  plots = []
  if res.get("scores"):
    plots.append(plot_scores(os.path.join(workdir, "scores.png"), res["scores"], f"{config.data.name} (LDCQ)"))
  if "sw" in res:
    results["sliced_w2_heldout"] = {k: v.tolist() for k, v in res["sw"].items()}
    plots.append(plot_latents(os.path.join(workdir, "latents.png"), res["latents_seed0"],
                               "held-out latents (first 2 principal axes of the posterior means)"))
  results["checkpoints"] = {stage: os.path.join(workdir, stage, "checkpoints") for stage in STAGES
                            if os.path.isdir(os.path.join(workdir, stage, "checkpoints"))}
  results["plots"] = plots
  results["wall_seconds"] = time.time() - t_start
  metrics.write_results(workdir, results)
  return results
