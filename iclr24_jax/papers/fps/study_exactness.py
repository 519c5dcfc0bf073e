"""FPS exactness studies: samplers against exact posteriors.

`exactness_study`: FPS (DDPM and c-rate DDIM kernels, c-rates, particle counts, FPS's and the telescoping weights)
and DPS with the exact GMM denoiser against the exact GMM posterior (`gmm_problem`, `PosteriorSummary`,
`posterior_metrics`, `seed_metrics`, `group_floor`; plots `plot_exactness`, `plot_samples_2d`).
`gaussian_limit_study`: what FPS samples with infinitely many particles for a Gaussian prior (exact Kalman filters).
`experiment.run` calls both (config.task 'exactness' / 'both'); `study.reproduce` turns them into rows. This module
imports only method modules (`programs.py`, `exact.py`, `operators.py`, `smc.py`, ...), never `experiment` or `study`.
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.diffusion import gmm as gmm_lib
from iclr24_jax.diffusion import metrics as dm
from iclr24_jax.diffusion import samplers, schedules
from iclr24_jax.papers.fps import exact, operators, smc
from iclr24_jax.papers.fps.programs import compile_call, dps_runs_fn, fps_runs_fn

_sliced_w2 = jax.jit(dm.sliced_wasserstein, static_argnames=("num_projections", "p"))
NUM_PROJECTIONS = 256
KEY_DIRECTIONS = 7    # the sliced W2's directions: jax.random.key(7), the same for every sampler


class PosteriorSummary:
  """What the metrics need of an exact posterior mixture: the mixture itself and its moments (float64)."""

  def __init__(self, gmm: gmm_lib.GaussianMixture):
    self.gmm = gmm
    self.weights = np.asarray(gmm.weights, np.float64)
    self.mean = np.asarray(gmm.mean(), np.float64)
    self.cov = np.asarray(gmm.covariance(), np.float64)

  def draws(self, key: jax.Array, num: int, n: int) -> list[np.ndarray]:
    """`num` independent exact draws [n, D] (the library's `GaussianMixture.sample`).

    Args:
      key: PRNG key (split into num keys).
      num: number of draws.
      n: points per draw.

    Returns:
      list of num float64 numpy arrays [n, D].
    """
    return [np.asarray(self.gmm.sample(k, n), np.float64) for k in jax.random.split(key, num)]


def posterior_metrics(post: PosteriorSummary, x, refs, a, x_pooled=None) -> dict[str, float]:
  """Errors of samples against the exact posterior mixture and its draws refs (list of [R, D]).

  x [R, D] holds one sample per run (used for the sliced W2 to the refs); x_pooled [R * M, D] (default x) holds every
  final particle of every run -- exchangeable with the first, so its moments and mixture fractions estimate the
  same output distribution with less noise. Metrics: mean_err ||mean - E[x | y]||; cov_err
  ||Cov - Cov[x | y]||_F / ||Cov[x | y]||_F; weight_tv: total variation between the fractions of samples assigned
  (most responsible component, `diffusion.metrics.component_frequencies`) to each posterior component and the
  posterior weights; obs_var_ratio: tr(A Cov A^T) / tr(A Cov[x | y] A^T), the spread of the measured coordinates;
  sw: `diffusion.metrics.sliced_wasserstein` of x to each ref on fixed directions, averaged over the refs (one
  draw's mixture fractions make a single distance noisy).

  Args:
    post: PosteriorSummary of the exact posterior.
    x: [R, D] one sample per run.
    refs: list of exact posterior draws, each [>= R, D] (its first R rows are used).
    a: [k, D] measurement matrix.
    x_pooled: optional [R * M, D] all particles (default x).

  Returns:
    dict of floats: mean_err, cov_err, weight_tv, obs_var_ratio, sw.
  """
  x = np.asarray(x, np.float64)
  xp = x if x_pooled is None else np.asarray(x_pooled, np.float64)
  a = np.asarray(a, np.float64)
  cov_hat = np.cov(xp, rowvar=False)
  freq = np.asarray(dm.component_frequencies(post.gmm, jnp.asarray(xp, jnp.float32)), np.float64)
  key = jax.random.key(KEY_DIRECTIONS)
  sw = [float(_sliced_w2(jnp.asarray(x, jnp.float32), jnp.asarray(r[:len(x)], jnp.float32), key,
                         num_projections=NUM_PROJECTIONS)) for r in refs]
  return {"mean_err": float(np.linalg.norm(xp.mean(0) - post.mean)),
          "cov_err": float(np.linalg.norm(cov_hat - post.cov) / np.linalg.norm(post.cov)),
          "weight_tv": float(0.5 * np.sum(np.abs(freq - post.weights))),
          "obs_var_ratio": float(np.trace(a @ cov_hat @ a.T) / np.trace(a @ post.cov @ a.T)),
          "sw": float(np.mean(sw))}


SEED_KEYS = ("weight_tv", "obs_var_ratio", "sw_ratio", "cov_err")


def seed_metrics(post: PosteriorSummary, x_runs, refs, a, num_seeds: int, floor_sw: float) -> dict[str, list]:
  """Per-seed metrics: the R independent runs split into `num_seeds` equal groups, each judged like a sampler.

  Args:
    x_runs: [R, M, D] (or [R, D]: one sample per run) final particles of R independent runs.
    refs: list of exact draws [R, D]; each group g uses the same rows of every ref.
    floor_sw: the exact-vs-exact sliced W2 at the group size (see `group_floor`).

  Returns:
    {metric: [num_seeds] values} for SEED_KEYS (sw_ratio = group SW / floor_sw).
  """
  x_runs = np.asarray(x_runs, np.float64)
  if x_runs.ndim == 2:
    x_runs = x_runs[:, None]
  groups = np.array_split(np.arange(x_runs.shape[0]), num_seeds)
  out = {k: [] for k in SEED_KEYS}
  for g in groups:
    met = posterior_metrics(post, x_runs[g, 0], [r[g] for r in refs], a,
                            x_pooled=x_runs[g].reshape(-1, x_runs.shape[-1]))
    met["sw_ratio"] = met["sw"] / floor_sw
    for k in SEED_KEYS:
      out[k].append(met[k])
  return out


def group_floor(refs, num_seeds: int) -> float:
  """Exact-vs-exact sliced W2 at the seed-group size: each group of draw i against the same group of draw j != i.

  Args:
    refs: list of (>= 2) exact draws, each [R, D].
    num_seeds: number of row groups (np.array_split of the R rows).

  Returns:
    the mean sliced W2 over groups and ordered pairs (i, j), i != j (float).
  """
  key = jax.random.key(KEY_DIRECTIONS)
  groups = np.array_split(np.arange(refs[0].shape[0]), num_seeds)
  vals = [float(_sliced_w2(jnp.asarray(refs[i][g], jnp.float32), jnp.asarray(refs[j][g], jnp.float32), key,
                           num_projections=NUM_PROJECTIONS))
          for g in groups for i in range(len(refs)) for j in range(len(refs)) if i != j]
  return float(np.mean(vals))


def gmm_problem(dim: int, cfg: Any):
  """The study's prior, operator and measurements: returns (prior, operator, y_of_sigma, description).

  Args:
    dim: D; 2 gives the ring GMM with A = [1, 0] and y = cfg.ring_y; other D a random 4-component GMM with a
      Gaussian A [cfg.obs_dim_8d, D] / sqrt(D) and y = A x_true + sigma n (fixed x_true, n).
    cfg: the config.exactness block (ring_y, obs_dim_8d).

  Returns:
    (GaussianMixture prior, operators.Dense, y_of_sigma: sigma -> float32 [k] measurement, description str).
  """
  if dim == 2:
    prior = gmm_lib.ring_gmm()
    op = operators.Dense(np.array([[1.0, 0.0]]))
    y_val = float(cfg.ring_y)
    # y = first coordinate = 1.5: two ring components (at 60 and 300 degrees, prior weights 2/21 and 6/21) fit it.
    return prior, op, (lambda sigma: jnp.asarray([y_val], jnp.float32)), f"2-D ring GMM (K=6), y = x_1 = {y_val}"
  rng = np.random.default_rng(dim)
  prior = gmm_lib.make_gmm(jax.random.key(dim), dim, 4)
  k = int(cfg.obs_dim_8d)
  a = rng.standard_normal((k, dim)) / np.sqrt(dim)
  op = operators.Dense(a)
  x_true = np.asarray(prior.sample(jax.random.key(100 + dim), 1))[0]
  n = rng.standard_normal(k)
  return prior, op, (lambda sigma: jnp.asarray(a @ x_true + sigma * n, jnp.float32)), \
      f"{dim}-D GMM (K=4), y = A x + sigma n with A [{k}, {dim}] Gaussian"


DPS_SPLITS = ("val", "test")   # DPS's runs: the validation runs choose zeta, the test runs are scored


def tune_dps(post: PosteriorSummary, x_val: dict, x_test: dict, refs_val, refs_test, a, floor_sw: float,
             seed_floor: float, num_seeds: int) -> dict[str, Any]:
  """DPS's step size chosen on validation runs and scored on test runs (which the choice never sees).

  zeta = argmin over the grid of the validation runs' sliced W2 to independent exact draws (`refs_val`); the
  rows then use the test runs at that zeta, scored like FPS against `refs_test`. The test runs' SW / floor at
  every zeta is kept as a diagnostic (what an oracle choosing on the test runs would have seen); it plays no part
  in the choice.

  Args:
    post: PosteriorSummary of the exact posterior.
    x_val: {zeta: [R, D]} DPS samples of the validation runs (one per run).
    x_test: {zeta: [R, D]} DPS samples of the test runs (other keys), the same zetas.
    refs_val: list of exact draws [>= R, D] for the validation score, independent of `refs_test`.
    refs_test: list of exact draws [>= R, D] the test runs (and FPS) are scored against.
    a: [k, D] measurement matrix.
    floor_sw: exact-vs-exact sliced W2 at R points (the sw_ratio denominator).
    seed_floor: the same at the seed-group size (`group_floor`).
    num_seeds: seed groups of the test runs (`seed_metrics`).

  Returns:
    {'zeta': the chosen step size, 'val_sw_by_zeta': {zeta: validation SW}, 'test': `posterior_metrics` of the
    chosen zeta's test runs plus sw_ratio, 'test_seeds': their `seed_metrics`, 'test_sw_ratio_by_zeta':
    {zeta: test SW / floor} (diagnostic)}.

  Raises:
    ValueError: the two splits hold different zetas, or no zeta at all.
  """
  if not x_val or set(x_val) != set(x_test):
    raise ValueError(f"validation and test runs need the same non-empty zeta grid; got {sorted(x_val)} and "
                     f"{sorted(x_test)}.")
  val_sw = {float(z): posterior_metrics(post, x, refs_val, a)["sw"] for z, x in x_val.items()}
  zeta = min(val_sw, key=val_sw.get)
  test = {float(z): posterior_metrics(post, x, refs_test, a) for z, x in x_test.items()}
  for met in test.values():
    met["sw_ratio"] = met["sw"] / floor_sw
  return {"zeta": zeta, "val_sw_by_zeta": val_sw, "test": test[zeta],
          "test_seeds": seed_metrics(post, x_test[zeta], refs_test, a, num_seeds, seed_floor),
          "test_sw_ratio_by_zeta": {z: m["sw_ratio"] for z, m in test.items()}}


def _config_label(sampler: str, c: float, weights: str, small_sigma: float | None = None) -> str:
  label = f"{sampler} c={c}" + (" telescoping" if weights == "telescoping" else "")
  return label + (f" sigma={small_sigma}" if small_sigma is not None else "")


def exactness_study(cfg: Any, workdir: str, progress: bool = True) -> dict:
  """FPS (DDPM and c-rate DDIM kernels, c-rates, particle counts, FPS's and the telescoping weights) and DPS against
  the exact GMM posterior.

  For every dimension: C configurations x R independent runs; each run contributes one sample (its first
  particle) to the sliced W2 and all its particles to the moments and mixture fractions; the same metrics on other
  exact draws give the Monte Carlo floor. The R runs are also split into `num_seeds` groups judged separately
  (per-seed values for `common.stats`). The c sweep (rates other than 0.95) runs up to `sweep_max_particles`,
  the small-sigma configurations up to `full_grid_max_particles`, the 'ddim' kernel up to `ddim_max_particles`;
  the telescoping weights run at c = 0.95.

  Args:
    cfg: the fps ConfigDict (schedule, exactness: dims, num_runs, num_steps, particles, rates, sigma,
      sigma_small, num_seeds, weights, ...).
    workdir: folder for the plots.
    progress: print progress lines.

  Returns:
    {'dims': {D: {description, runs, num_steps, sigmas, num_seeds, posterior_weights, floor, floor_seeds,
    fps: {label: {M: metrics}}, fps_seeds, dps}}, 'plots': [png paths]}.
  """
  e = cfg.exactness
  sched = schedules.from_config(cfg.schedule)
  n_seeds = int(e.num_seeds)
  weights_list = tuple(e.get("weights", ("fps",)))
  out: dict[str, Any] = {"dims": {}}
  for di, dim in enumerate(e.dims):
    runs = int(e.num_runs[min(di, len(e.num_runs) - 1)])
    prior, op, y_of, desc = gmm_problem(int(dim), e)
    den = gmm_lib.gmm_denoiser(prior, sched)
    _, a_t, a_s = samplers.sampling_grid(sched, int(e.num_steps))
    sigmas = {"main": float(e.sigma), "small": float(e.sigma_small)}
    posts = {n: PosteriorSummary(exact.gmm_posterior(prior, op, y_of(s), s)) for n, s in sigmas.items()}
    refs = {n: p.draws(jax.random.key(1000 + int(dim) + 17 * i), 5, runs) for i, (n, p) in enumerate(posts.items())}
    a_mat = np.asarray(op.matrix())
    # The Monte Carlo floor: each exact draw judged like a sampler against the other four (averaged over the five).
    floors, seed_floors, floor_seeds = {}, {}, {}
    for n in sigmas:
      per = [posterior_metrics(posts[n], refs[n][i], refs[n][:i] + refs[n][i + 1:], a_mat)
             for i in range(len(refs[n]))]
      floors[n] = {k: float(np.mean([m[k] for m in per])) for k in per[0]}
      seed_floors[n] = group_floor(refs[n], n_seeds)
      floor_seeds[n] = seed_metrics(posts[n], refs[n][0], refs[n][1:], a_mat, n_seeds, seed_floors[n])
    # Configurations: (label, sampler, c, sigma name, weights).
    all_configs = []
    for smp in e.samplers:
      for w in weights_list:
        for c in e.rates:
          if w == "fps" or float(c) == 0.95:
            all_configs.append((_config_label(smp, float(c), w), smp, float(c), "main", w))
        all_configs.append((_config_label(smp, 0.95, w, sigmas["small"]), smp, 0.95, "small", w))
    res = {"description": desc, "runs": runs, "num_steps": int(e.num_steps), "sigmas": sigmas, "num_seeds": n_seeds,
           "posterior_weights": {n: p.weights.round(4).tolist() for n, p in posts.items()},
           "floor": floors, "floor_seeds": floor_seeds, "fps": {}, "fps_seeds": {}, "dps": {}, "samples": {}}
    for m in e.particles:
      t0 = time.perf_counter()
      configs = [cf for cf in all_configs
                 if (cf[3] == "main" or int(m) <= int(e.full_grid_max_particles))
                 and (cf[2] == 0.95 or int(m) <= int(e.sweep_max_particles))
                 and (cf[1] == "ddpm" or int(m) <= int(e.get("ddim_max_particles", 10 ** 9)))]
      fn = fps_runs_fn(den, sched, op, int(m), int(e.num_steps))
      keys = jax.vmap(lambda i: jax.random.split(jax.random.fold_in(jax.random.key(dim * 7919 + int(m)), i), runs)
                      )(jnp.arange(len(configs)))
      ys = jnp.stack([y_of(sigmas[cf[3]]) for cf in configs])
      sig = jnp.asarray([sigmas[cf[3]] for cf in configs], jnp.float32)
      cs = jnp.asarray([cf[2] for cf in configs], jnp.float32)
      rates = jnp.stack([smc.kernel_rates(cf[1], cf[2], a_t, a_s) for cf in configs])
      tele = jnp.asarray([float(cf[4] == "telescoping") for cf in configs], jnp.float32)
      args = (keys, ys, sig, cs, rates, tele)
      small = int(m) * runs * len(configs) * int(e.num_steps) <= float(e.fast_compile_below)
      xs, ess = jax.device_get(compile_call(fn, *args, fast_compile=small)(*args))
      for i, (label, smp, c, sname, w) in enumerate(configs):
        met = posterior_metrics(posts[sname], xs[i][:, 0], refs[sname][1:], a_mat,
                                x_pooled=xs[i].reshape(-1, xs.shape[-1]))
        met["sw_ratio"] = met["sw"] / floors[sname]["sw"]
        met["mean_ess_fraction"] = float(np.mean(ess[i]))
        res["fps"].setdefault(label, {})[int(m)] = met
        res["fps_seeds"].setdefault(label, {})[int(m)] = seed_metrics(posts[sname], xs[i], refs[sname][1:], a_mat,
                                                                      n_seeds, seed_floors[sname])
        if dim == 2 and sname == "main" and c == 0.95 and smp == "ddpm":
          res["samples"][f"FPS {smp}{' tele' if w == 'telescoping' else ''} M={m}"] = np.asarray(xs[i][:, 0])
      if progress:
        print(f"[fps] exactness {dim}-D M={m}: {len(configs)} configs x {runs} runs in "
              f"{time.perf_counter() - t0:.1f}s", flush=True)
    # DPS: its step size zeta is chosen on validation runs (their own keys) scored against validation exact draws,
    # then the test runs (other keys) are scored against the same exact draws as FPS (`tune_dps`). Both splits and
    # both noise levels run as one compiled program.
    t0 = time.perf_counter()
    dfn = dps_runs_fn(den, sched, op, runs, int(e.num_steps))
    zetas = [float(z) for z in e.dps_zetas]
    dconf = [(split, s, z) for split in DPS_SPLITS for s in sigmas for z in zetas]
    dkeys = jnp.concatenate([jax.random.split(jax.random.fold_in(jax.random.key(dim * 31), i), len(sigmas) * len(zetas))
                             for i in range(len(DPS_SPLITS))])
    dargs = (dkeys, jnp.stack([y_of(sigmas[s]) for _, s, _ in dconf]), jnp.asarray([z for *_, z in dconf], jnp.float32))
    small = runs * len(dconf) * int(e.num_steps) <= float(e.fast_compile_below)
    xd = jax.device_get(compile_call(dfn, *dargs, fast_compile=small)(*dargs))
    for j, sname in enumerate(sigmas):
      x_split = {split: {z: np.asarray(xd[i]) for i, (sp, sn, z) in enumerate(dconf) if sp == split and sn == sname}
                 for split in DPS_SPLITS}
      refs_val = posts[sname].draws(jax.random.key(3000 + int(dim) + 17 * j), 2, runs)
      res["dps"][sname] = tune_dps(posts[sname], x_split["val"], x_split["test"], refs_val, refs[sname][1:], a_mat,
                                   floors[sname]["sw"], seed_floors[sname], n_seeds)
      if dim == 2 and sname == "main":
        zeta = res["dps"][sname]["zeta"]
        res["samples"][f"DPS zeta={zeta:g}"] = x_split["test"][zeta]
    if progress:
      print(f"[fps] exactness {dim}-D DPS: {len(dconf)} configs (validation + test) x {runs} runs in "
            f"{time.perf_counter() - t0:.1f}s", flush=True)
    res["samples"]["exact posterior"] = np.asarray(refs["main"][0])
    out["dims"][int(dim)] = res
  out["plots"] = [plot_exactness(out, cfg, os.path.join(workdir, "exactness.png"))]
  if 2 in out["dims"]:
    out["plots"].append(plot_samples_2d(out["dims"][2], os.path.join(workdir, "exactness_2d_samples.png")))
  for r in out["dims"].values():
    r.pop("samples", None)
  return out


def plot_exactness(out: dict, cfg: Any, path: str) -> str:
  """Error vs number of particles per dimension (4 metrics), FPS lines, DPS (best zeta) dashed, floor dotted.

  Args:
    out: the (partial) result of `exactness_study`: its 'dims' entries' fps, dps and floor metrics.
    cfg: the fps ConfigDict.
    path: PNG output path.

  Returns:
    path.
  """
  metrics = [("weight_tv", "mixture weight TV"), ("cov_err", "rel. covariance error"),
             ("obs_var_ratio", "Var(Ax) / exact"), ("sw_ratio", "sliced W2 / floor")]
  dims = list(out["dims"])
  fig, axes = metrics_lib.new_figure(ncols=len(metrics), nrows=len(dims), size=(3.4, 2.8))
  for ri, dim in enumerate(dims):
    res = out["dims"][dim]
    for ci, (key, name) in enumerate(metrics):
      ax = axes[ri, ci]
      for label, per_m in res["fps"].items():
        ms = sorted(per_m)
        small = "sigma=" in label
        ls = ":" if small else ("-." if "telescoping" in label else "-")
        ax.plot(ms, [per_m[m][key] for m in ms], marker="o", ms=3, lw=1, ls=ls,
                label=("FPS " + label) if not small else f"FPS {label.split(' sigma')[0]}, small sigma")
      zeta = res["dps"]["main"]["zeta"]
      ax.axhline(res["dps"]["main"]["test"][key], color="k", ls="--", lw=1,
                 label=f"DPS (zeta={zeta:g}, chosen on validation runs)")
      floor = 1.0 if key in ("sw_ratio", "obs_var_ratio") else res["floor"]["main"][key]
      ax.axhline(floor, color="gray", ls=":", lw=1, label="exact (floor / ratio 1)")
      if key == "obs_var_ratio":
        ax.set_yscale("log")
      ax.set_xscale("log")
      ax.set_xlabel("particles M")
      ax.set_title(f"{dim}-D: {name}", fontsize=9)
      if ri == 0 and ci == len(metrics) - 1:
        ax.legend(fontsize=6, loc="upper right")
  fig.suptitle(f"FPS vs the exact posterior (exact GMM denoiser, {cfg.exactness.num_steps} steps, "
               f"sigma={cfg.exactness.sigma})", fontsize=10)
  return metrics_lib.save_figure(fig, path)


def plot_samples_2d(res: dict, path: str) -> str:
  """Scatter plots of the 2-D posterior samples (exact, FPS at several M, DPS).

  Args:
    res: one dimension's result of `exactness_study` with its 'samples' {name: [n, 2]}, description and sigmas.
    path: PNG output path.

  Returns:
    path.
  """
  items = list(res["samples"].items())
  fig, axes = metrics_lib.new_figure(ncols=len(items), size=(2.6, 2.6))
  for ax, (name, x) in zip(axes[0], items):
    ax.scatter(x[:, 0], x[:, 1], s=2, alpha=0.5)
    ax.set_xlim(0, 3.2)
    ax.set_ylim(-4, 4)
    ax.set_title(name, fontsize=8)
  fig.suptitle(res["description"] + f", sigma={res['sigmas']['main']}", fontsize=9)
  return metrics_lib.save_figure(fig, path)


# ============================================================================ Gaussian prior: M -> infinity


def gaussian_limit_study(cfg: Any, workdir: str) -> dict:
  """What FPS samples with infinitely many particles, for a Gaussian prior (exact Kalman filter of its HMM).

  2-D Gaussian prior, A = [1, 0.5], one ground truth; for each noise level sigma, number of steps N and c-rate, S
  measurement sequences are drawn and each is filtered exactly; the equal mixture over sequences (law of total
  variance) is FPS's output distribution at M = infinity with the exact denoiser. Its mean / covariance, and the
  variance of the measured coordinate A x, are compared with the exact posterior. Rows (key 'filter'):
    'fps': FPS's HMM (`exact.kalman_reference`) with the 'ddpm' / 'ddim' kernel, and with the exact reverse kernel
      ('exact': only the emission model differs from the next row);
    'noise_tracking': `exact.noise_tracking_kalman` on the same sequences (the exact posterior, ratio 1);
    'telescoping': the M -> infinity limit of weights='telescoping' (`exact.telescoping_reference`);
    'none' (sigma None): A = 0, the sampler's own error (the chain's output law vs the prior).
  The c sweep (`exactness.rates`) runs at the largest N.

  Args:
    cfg: the fps ConfigDict (schedule, exactness block).
    workdir: folder for the plot.

  Returns:
    {'rows': [dicts], 'plots': [png path], 'prior_mean': [2], 'prior_cov': [2, 2]} (lists).
  """
  e = cfg.exactness
  sched = schedules.from_config(cfg.schedule)
  rng = np.random.default_rng(0)
  mean0 = np.array([0.5, -0.3])
  l = rng.standard_normal((2, 2))
  cov0 = l @ l.T + 0.5 * np.eye(2)
  a = np.array([[1.0, 0.5]])
  op = operators.Dense(a)
  x_true = rng.multivariate_normal(mean0, cov0)
  noise = rng.standard_normal(1)
  seqs = jax.jit(jax.vmap(lambda k, y, c, a_t, a_s: smc.measurement_sequence(k, op, y, a_t, a_s, c),
                          (0, None, None, None, None)))
  rows = []
  big = max(int(n) for n in e.gaussian_steps)
  for n_steps in e.gaussian_steps:
    n_steps = int(n_steps)
    _, a_t, a_s = samplers.sampling_grid(sched, n_steps)
    for c in (e.rates if n_steps == big else (0.95,)):
      c = float(c)
      for sampler in ("ddpm", "ddim"):
        m, p = exact.chain_moments(mean0, cov0, a_t, a_s, sampler=sampler, c=c)
        rows.append({"steps": n_steps, "filter": "none", "sampler": sampler, "c": c, "sigma": None,
                     "mean_err": float(np.linalg.norm(m - mean0)),
                     "cov_rel_err": float(np.linalg.norm(p - cov0) / np.linalg.norm(cov0)),
                     "obs_var_ratio": float((a @ p @ a.T)[0, 0] / (a @ cov0 @ a.T)[0, 0])})
      for sigma in e.gaussian_sigmas:
        y = a @ x_true + sigma * noise
        pm, pc = exact.gaussian_posterior(mean0, cov0, a, y, sigma)
        y0, ys = jax.device_get(seqs(jax.random.split(jax.random.key(5), int(e.gaussian_sequences)),
                                     jnp.asarray(y, jnp.float32), c, a_t, a_s))
        ys = np.asarray(ys, np.float64)
        ys[:, -1] = y           # the float32 bridge ends at y up to rounding; the float64 filters see y itself
        post_std = float(np.sqrt(np.trace(pc)))

        def summary(filt, sampler, mu, cov):
          return {"steps": n_steps, "filter": filt, "sampler": sampler, "c": c, "sigma": float(sigma),
                  "mean_err": float(np.linalg.norm(mu - pm)),
                  "mean_err_over_post_std": float(np.linalg.norm(mu - pm) / post_std),
                  "cov_rel_err": float(np.linalg.norm(cov - pc) / np.linalg.norm(pc)),
                  "obs_var_fps": float((a @ cov @ a.T)[0, 0]), "obs_var_exact": float((a @ pc @ a.T)[0, 0]),
                  "obs_var_ratio": float((a @ cov @ a.T)[0, 0] / (a @ pc @ a.T)[0, 0])}

        # FPS's HMM (independent emissions) with each sampler's kernel and with the exact reverse kernel.
        for sampler in ("ddpm", "ddim", "exact"):
          ms, p = exact.kalman_reference(mean0, cov0, a, sigma, y0, ys, a_t, a_s, sampler=sampler, c=c)
          row = summary("fps", sampler, *exact.moments_over_sequences(ms, p))
          rows.append(row)
        # The filter that knows the y_t share one noise draw (exact kernel): the exact posterior on every sequence.
        ms, p = exact.noise_tracking_kalman(mean0, cov0, a, sigma, y0, ys, a_t, a_s)
        rows.append(summary("noise_tracking", "exact", *exact.moments_over_sequences(ms, p)))
        # The telescoping weights' M -> infinity limit (independent of the sequences).
        for sampler in ("ddpm", "ddim"):
          rows.append(summary("telescoping", sampler,
                              *exact.telescoping_reference(mean0, cov0, a, sigma, y, a_t, a_s, sampler=sampler, c=c)))
  path = os.path.join(workdir, "gaussian_limit.png")
  fig, axes = metrics_lib.new_figure(ncols=2, size=(3.8, 3.0))
  for sampler, ax in zip(("ddpm", "ddim"), axes[0]):
    curves = sorted({(r["steps"], r["c"]) for r in rows if r["sampler"] == sampler})
    for n_steps, c in curves:
      for filt, ls in (("fps", "-"), ("telescoping", "-.")):
        pts = [(r["sigma"], r["obs_var_ratio"]) for r in rows if r["sampler"] == sampler and r["steps"] == n_steps
               and r["c"] == c and r["sigma"] is not None and r["filter"] == filt]
        if pts and (filt == "fps" or c == 0.95):
          ax.plot(*zip(*pts), marker="o", ms=3, ls=ls, label=f"{filt}, {n_steps} steps, c={c}")
    big_nt = [(r["sigma"], r["obs_var_ratio"]) for r in rows if r["filter"] == "noise_tracking"
              and r["steps"] == big and r["c"] == 0.95]
    ax.plot(*zip(*big_nt), marker="x", color="k", ls="none", label="noise-tracking Kalman (exact)")
    ax.axhline(1.0, color="gray", ls=":", lw=1, label="exact")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measurement noise sigma")
    ax.set_ylabel("Var(A x) FPS(M = inf) / exact")
    ax.set_title(f"{sampler.upper()} kernel, Gaussian prior, exact denoiser, M = inf", fontsize=9)
    ax.legend(fontsize=6)
  metrics_lib.save_figure(fig, path)
  return {"rows": rows, "plots": [path], "prior_mean": mean0.tolist(), "prior_cov": cov0.tolist()}
