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
from iclr24_jax.common import metrics, stats
from iclr24_jax.diffusion import metrics as diff_metrics
from iclr24_jax.diffusion.unet import MLPDenoiser
from iclr24_jax.papers.ldcq import train as alg
from iclr24_jax.papers.ldcq import data as data_lib
from iclr24_jax.papers.ldcq.model import BCPolicy, QNetwork, SkillVAE
from iclr24_jax.rl import offline as offline_lib

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
  """`jax.jit(fn)`; with fast_compile on CPU each call lowers and compiles at XLA backend optimisation level 0
  (the stages run once, and on this 2-core CPU their compilation costs more than the level-0 slowdown).

  Args:
    fn: the function to compile.
    fast_compile: compile at level 0 on CPU (recompiles on every call: use for one-shot stages only).

  Returns:
    a callable with fn's signature.
  """
  jitted = jax.jit(fn)
  if not fast_compile or jax.default_backend() != "cpu":
    return jitted
  return lambda *args: jitted.lower(*args).compile({"xla_backend_optimization_level": 0})(*args)


def _sub(segs: dict[str, np.ndarray], idx: np.ndarray) -> dict[str, jax.Array]:
  return {k: jnp.asarray(v[idx]) for k, v in segs.items()}


def _seed_keys(config: Any, num_seeds: int) -> jax.Array:
  base = jax.random.key(int(config.seed))
  return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.arange(num_seeds))


def pipeline(config: Any, num_seeds: int | None = None, prep: dict | None = None, methods: tuple | None = None,
             log=print) -> dict[str, Any]:
  """Runs every stage for `num_seeds` independent seeds (each stage one jitted program vmapped over seeds).

  Args:
    config: the ldcq ConfigDict (`configs/ldcq.py`).
    num_seeds: S (None: config.num_seeds).
    prep: the result of `prepare(config)` (None: computed here).
    methods: subset of METHODS to evaluate (None: config.methods).
    log: printer of progress lines.

  Returns:
    dict with returns {method: [S, E]} (episode scores of config.eval.protocol: T - t at the goal for 'maze', the
    summed reward for 'return'), scores {method: [S, E]} (those normalised with the rl.offline references, as the
    official script normalises 800 - t with D4RL's), sw {'diffusion', 'gaussian'} [S]
    (held-out sliced W2 to the posterior means), histories, params (the LDCQ agent of every seed, leading axis S),
    seconds per stage, and the held-out latents of seed 0 (for the plot).

  Raises:
    ValueError: an unknown method or eval.protocol.
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
  vae, den = spec_d.vae, spec_d.denoiser
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

  # 1. skill VAE
  vae_fn = jit(jax.vmap(lambda k, data: alg.train_vae(
      k, vae, data, num_steps=int(c.vae.num_steps), batch_size=int(c.vae.batch_size),
      learning_rate=float(c.vae.learning_rate), beta=float(c.vae.beta), terminal_loss=bool(c.vae.terminal_loss)),
      in_axes=(0, None)))
  vae_params, hist["vae"] = timed("vae", vae_fn, k_vae, train)

  # 2. latent diffusion prior on (s_0, posterior mean) pairs; posterior means of the Q and held-out segments
  need_diff = "ldcq" in methods or "diffusion_prior" in methods
  hold = prep["hold"]
  hold_j = _sub(hold, np.arange(min(1024, hold["states"].shape[0]))) if hold is not None else None

  def prior_stage(k, vp, dsub, qsub, hold_j):
    z_d, _ = alg.encode(vae, vp, dsub["states"], dsub["actions"])
    z_q, _ = alg.encode(vae, vp, qsub["states"], qsub["actions"])
    res = {"z_q": z_q}
    if hold_j is not None:
      res["z_hold"] = alg.encode(vae, vp, hold_j["states"], hold_j["actions"])[0]
    if need_diff:
      res["diffusion"], res["hist"] = alg.train_diffusion(
          k, spec_d, dsub["states"][:, 0], z_d, num_steps=int(c.diffusion.num_steps),
          batch_size=int(c.diffusion.batch_size), learning_rate=float(c.diffusion.learning_rate))
    return res

  pri = timed("prior", jit(jax.vmap(prior_stage, in_axes=(0, 0, None, None, None))), k_diff, vae_params, dsub,
              qsub, hold_j)
  if need_diff:
    hist["diffusion"] = pri["hist"]

  # 3. Q-learning with latents pre-sampled from each prior at s_H
  n_q = int(qsub["s0"].shape[0]) if "s0" in qsub else int(qsub["states"].shape[0])

  def q_stage(k, vp, dp, z_q, spec):
    k_data, k_train = jax.random.split(k)
    params = alg.LDCQParams(vae=vp, diffusion=dp, spec=spec)
    data = alg.q_dataset(k_data, params, qsub["states"][:, 0], z_q, qsub["reward_sum"], qsub["next_state"],
                         qsub["done"], int(c.q.num_prior_samples))
    st, h = alg.train_q(k_train, q_config(c, spec, n_q), data, num_steps=int(c.q.num_steps),
                        learning_rate=float(c.q.learning_rate), alpha=float(c.q.alpha))
    return st.params, st.extra["target"], h

  q_params = {}
  if "ldcq" in methods:
    fn = jit(jax.vmap(lambda k, vp, dp, z: q_stage(k, vp, dp, z, spec_d)))
    q_params["ldcq"] = timed("q_ldcq", fn, k_qd, vae_params, pri["diffusion"], pri["z_q"])
    hist["q_ldcq"] = q_params["ldcq"][2]
  if "vae_q" in methods:
    fn = jit(jax.vmap(lambda k, vp, z: q_stage(k, vp, None, z, spec_g)))
    q_params["vae_q"] = timed("q_vae", fn, k_qg, vae_params, pri["z_q"])
    hist["q_vae"] = q_params["vae_q"][2]

  # 4. BC
  if "bc" in methods:
    policy = BCPolicy(ad, int(c.model.bc_hidden))
    obs, act = jnp.asarray(prep["bc_obs"]), jnp.asarray(prep["bc_act"])
    fn = jit(jax.vmap(lambda k: alg.train_bc(k, policy, obs, act, num_steps=int(c.bc.num_steps),
                                                 batch_size=int(c.bc.batch_size),
                                                 learning_rate=float(c.bc.learning_rate))), short=True)
    bc_params, hist["bc"] = timed("bc", fn, k_bc)

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
  out.update(hist=alg.to_numpy(hist), seconds=secs, agents=agents, num_seeds=s)
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


def _log_history(writer: metrics.MetricWriter, hist: dict, every: int) -> None:
  for stage, h in hist.items():
    n = len(next(iter(h.values())))
    for i in range(0, n, max(1, every)):
      writer.write(i, {"stage": stage, **{f"train/{k}": float(np.mean(v[:, i])) for k, v in h.items()
                                          if np.ndim(v) == 2}})


def run(config: Any, workdir: str) -> dict:
  """The whole LDCQ pipeline for config.num_seeds seeds: writes metrics.jsonl (losses averaged over seeds),
  results.json (normalised scores per method and seed, held-out sliced W2), plots and a checkpoint of the agents.

  Args:
    config: the ldcq ConfigDict (`configs/ldcq.py`).
    workdir: output folder (created; a rerun replaces the checkpoint).

  Returns:
    results dict: env, data_kind, num_seeds, methods (per-method score summary), seconds, sliced_w2_heldout,
    checkpoint, plots, wall_seconds.
  """
  if config.data.name in data_lib.DATASETS:   # the paper's own data: read first (DataNotFoundError
    data_lib.load(config.data)                  # naming the layout and source when absent)
    raise common_data.paper_data_not_wired("ldcq", config.data)   # run() does not train on it yet
  t_start = time.time()
  os.makedirs(workdir, exist_ok=True)
  writer = metrics.MetricWriter(workdir)
  res = pipeline(config)
  _log_history(writer, res["hist"], int(config.log_every))
  results = {"env": config.data.name, "data_kind": config.data.kind, "num_seeds": res["num_seeds"],
             "methods": _summary(res), "seconds": res["seconds"]}
  plots = []
  if res.get("scores"):
    plots.append(plot_scores(os.path.join(workdir, "scores.png"), res["scores"], f"{config.data.name} (LDCQ)"))
  if "sw" in res:
    results["sliced_w2_heldout"] = {k: v.tolist() for k, v in res["sw"].items()}
    plots.append(plot_latents(os.path.join(workdir, "latents.png"), res["latents_seed0"],
                               "held-out latents (first 2 principal axes of the posterior means)"))
  if int(config.checkpoint_every) >= 0:
    import shutil
    from iclr24_jax.common.checkpoint import Checkpointer
    shutil.rmtree(os.path.join(workdir, "checkpoints"), ignore_errors=True)  # a rerun replaces the final agents
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=1, config=config)
    tree = {k: {"vae": a.vae, "diffusion": a.diffusion, "q": a.q, "q_target": a.q_target}
            for k, a in res["agents"].items() if k in ("ldcq", "vae_q")}
    ckpt.save(int(config.q.num_steps), jax.device_get(tree))
    ckpt.close()
    results["checkpoint"] = os.path.join(workdir, "checkpoints")
  results["plots"] = plots
  results["wall_seconds"] = time.time() - t_start
  metrics.write_results(workdir, results)
  return results
