"""FPS experiments: the exactness study (exact GMM denoiser vs the exact posterior), the Gaussian M -> infinity
limit (Kalman), and image inverse problems on digits with a trained diffusion prior.

run(config, workdir): config.task = 'exactness' (default) | 'images' | 'both' (tiny); writes results.json and PNGs.
study.py holds reproduce(workdir, fast) (the reproduction rows) and benchmark(quick) (particles x steps per
second vs number of particles and image size, 1 and all devices).
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
from iclr24_jax.papers.fps import baselines, exact, model as model_lib, operators, smc

PAPER = "fps"
IMAGE_METHODS = ("fps", "fps_ddpm", "fps_ddim", "fps_m1", "fps_tele", "dps", "ddim", "pinv")


def compile_call(fn, *args, fast_compile: bool = True):
  """Lowers and compiles a jitted `fn` for `args`; on CPU with `fast_compile`, at XLA backend optimisation level 0.

  The image study's programs run for about a second and took 8-13 s to compile at the default level on this
  2-core machine; level 0 compiles 3-4x faster and runs about 2x slower, a net win for one-shot calls.

  Args:
    fn: a jax.jit-wrapped function.
    *args: example arguments (their shapes / dtypes / shardings fix the compiled program).
    fast_compile: use optimisation level 0 on CPU (ignored on other backends).

  Returns:
    the compiled executable; call it with arguments like `args`.
  """
  lowered = fn.lower(*args)
  if fast_compile and jax.default_backend() == "cpu":
    try:
      return lowered.compile({"xla_backend_optimization_level": 0})
    except Exception:  # pragma: no cover - an XLA without the option
      pass
  return lowered.compile()


# ================================================================================== exactness (GMM prior)


def fps_runs_fn(denoiser, schedule, operator, num_particles: int, num_steps: int, clip_x0=None,
                resampling: str = "multinomial"):
  """A jitted f(keys [C, R], y [C, *y_shape], sigma [C], c [C], rates [C, N], tele [C])
  -> (x [C, R, M, *x_shape], ess [C, R]).

  Each of the C configurations (a measurement, a noise level, a bridge c-rate, kernel rates and the weights: tele
  = 0 FPS's, 1 telescoping -- so both kernels and both weightings share one program) runs R independent FPS
  samplers with M = `num_particles` particles; a run returns its final (equally weighted) particles -- the official
  code returns the first one -- and its mean ESS / M.

  Args:
    denoiser: (x_t [B, ...], t [B]) -> eps prediction.
    schedule: the diffusion schedule.
    operator: the linear measurement operator A.
    num_particles: M.
    num_steps: N, sampler steps.
    clip_x0: None, a float c or a (lo, hi) pair.
    resampling: 'multinomial' | 'systematic' | 'stratified'.

  Returns:
    the jitted f above (ess as a fraction of M, in (0, 1]).
  """
  times, a_t, a_s = samplers.sampling_grid(schedule, num_steps)

  def one(key, y, sigma, c, rates, tele):
    key_y, key_f = jax.random.split(key)
    y_start, ys = smc.measurement_sequence(key_y, operator, y, a_t, a_s, c)
    x, info = smc.particle_filter(key_f, denoiser, operator, y_start, ys, times, a_t, a_s, sigma, num_particles,
                                  rates=rates, resampling=resampling, clip_x0=clip_x0, weights=tele)
    return x, jnp.mean(info["ess"]) / num_particles

  flat = jax.vmap(one)   # one vmap over C * R runs (a nested vmap compiles about twice as slowly on CPU)

  def run(keys, y, sigma, c, rates, tele):
    n_c, n_r = keys.shape
    rep = lambda a: jnp.repeat(a, n_r, axis=0)  # noqa: E731
    x, ess = flat(keys.reshape(-1), rep(y), rep(sigma), rep(c), rep(rates), rep(tele))
    return x.reshape((n_c, n_r) + x.shape[1:]), ess.reshape(n_c, n_r)

  return jax.jit(run)


def dps_runs_fn(denoiser, schedule, operator, num_samples: int, num_steps: int, clip_x0=None):
  """A jitted f(keys [C], y [C, *y_shape], zeta [C]) -> DPS samples [C, num_samples, *x_shape].

  Args:
    denoiser: (x_t [B, ...], t [B]) -> eps prediction.
    schedule: the diffusion schedule.
    operator: the linear measurement operator A.
    num_samples: samples per configuration.
    num_steps: sampler steps.
    clip_x0: None, a float c or a (lo, hi) pair.

  Returns:
    the jitted f above (one vmapped DPS run per configuration, step size zeta).
  """
  return jax.jit(jax.vmap(lambda k, y, z: baselines.dps_sample(k, denoiser, schedule, operator, y, num_samples,
                                                               num_steps, z, clip_x0=clip_x0)))


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
    # DPS with a grid of step sizes; the best (oracle, by SW) is reported as the baseline.
    dfn = dps_runs_fn(den, sched, op, runs, int(e.num_steps))
    dconf = [(z, s) for s in sigmas for z in e.dps_zetas]
    dargs = (jax.random.split(jax.random.key(dim * 31), len(dconf)), jnp.stack([y_of(sigmas[s]) for _, s in dconf]),
             jnp.asarray([z for z, _ in dconf], jnp.float32))
    small = runs * len(dconf) * int(e.num_steps) <= float(e.fast_compile_below)
    xd = jax.device_get(compile_call(dfn, *dargs, fast_compile=small)(*dargs))
    for sname in sigmas:
      by_zeta = {}
      for i, (z, sn) in enumerate(dconf):
        if sn == sname:
          met = posterior_metrics(posts[sname], xd[i], refs[sname][1:], a_mat)
          met["sw_ratio"] = met["sw"] / floors[sname]["sw"]
          by_zeta[float(z)] = (met, i)
      best = min(by_zeta, key=lambda z: by_zeta[z][0]["sw"])
      res["dps"][sname] = {"best_zeta": best, "best": by_zeta[best][0],
                           "best_seeds": seed_metrics(posts[sname], xd[by_zeta[best][1]], refs[sname][1:], a_mat,
                                                      n_seeds, seed_floors[sname]),
                           "by_zeta": {str(z): m for z, (m, _) in by_zeta.items()}}
      if dim == 2 and sname == "main":
        res["samples"][f"DPS zeta={best}"] = np.asarray(xd[by_zeta[best][1]])
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
      best = res["dps"]["main"]["best_zeta"]
      ax.axhline(res["dps"]["main"]["best"][key], color="k", ls="--", lw=1, label=f"DPS (best zeta={best})")
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


# ======================================================================================== image tasks


def make_operator(task: str, icfg: Any, shape: tuple[int, ...]) -> operators.LinearOperator:
  """The image task's operator on x_shape `shape` ([S, S, 1]).

  Args:
    task: 'inpainting' (centred box_size box masked), 'super_resolution' (factor sr_factor), 'gaussian_blur'
      or 'motion_blur'.
    icfg: the config.images block (box_size, sr_factor, blur_kernel, blur_std, motion_kernel, motion_angle,
      motion_length).
    shape: x's shape [S, S, 1].

  Returns:
    the operators.LinearOperator.

  Raises:
    ValueError: unknown task.
  """
  if task == "inpainting":
    mask = np.ones(shape, np.float32)
    b, s = int(icfg.box_size), shape[0]
    lo = (s - b) // 2
    mask[lo:lo + b, lo:lo + b] = 0.0          # a centred box (official: 128 x 128 box on 256 x 256)
    return operators.Inpainting(mask)
  if task == "super_resolution":
    return operators.SuperResolution(int(icfg.sr_factor), shape)
  if task == "gaussian_blur":
    return operators.GaussianBlur(int(icfg.blur_kernel), float(icfg.blur_std), shape)
  if task == "motion_blur":
    return operators.MotionBlur(int(icfg.motion_kernel), shape, angle=float(icfg.motion_angle),
                                length=float(icfg.motion_length))
  raise ValueError(f"unknown image task '{task}'; choose inpainting, super_resolution, gaussian_blur, motion_blur.")


def sample_scores(samples, x_true, op, y) -> dict[str, float]:
  """PSNR / SSIM of samples [n, k, S, S, 1] (k samples per image) against x_true [n, S, S, 1].

  psnr / ssim: the per-sample values averaged over the k samples of an image, then over images (se over images);
  psnr_first: the first sample only (the official protocol, one sample per image); psnr_avg / ssim_avg: of the mean
  of the k samples (an estimate of E[x | y], which favours smooth estimates); measurement_residual: mean
  ||A x - y|| over samples.

  Args:
    samples: [n, k, S, S, 1] in [-1, 1].
    x_true: [n, S, S, 1] in [-1, 1].
    op: the task's operator.
    y: [n, *y_shape] measurements.

  Returns:
    dict: psnr, psnr_se, ssim, ssim_se, psnr_per_image [n], ssim_per_image [n] (lists), psnr_first,
    samples_per_image, measurement_residual, and psnr_avg / ssim_avg when k > 1.
  """
  samples = np.asarray(samples)
  n, k = samples.shape[:2]
  p, s = metrics_lib.psnr_ssim(samples.reshape((n * k,) + samples.shape[2:]), np.repeat(x_true, k, axis=0))
  p, s = p.reshape(n, k), s.reshape(n, k)
  se = lambda v: float(np.std(v, ddof=1) / np.sqrt(n)) if n > 1 else 0.0  # noqa: E731
  res = np.linalg.norm((np.asarray(op.forward(jnp.asarray(samples))) - np.asarray(y)[:, None]).reshape(n, k, -1),
                       axis=-1)
  out = {"psnr": float(p.mean()), "psnr_se": se(p.mean(1)), "ssim": float(s.mean()), "ssim_se": se(s.mean(1)),
         "psnr_per_image": p.mean(1).tolist(), "ssim_per_image": s.mean(1).tolist(),
         "psnr_first": float(p[:, 0].mean()), "samples_per_image": int(k),
         "measurement_residual": float(res.mean())}
  if k > 1:
    pa, sa = metrics_lib.psnr_ssim(samples.mean(1), x_true)
    out.update(psnr_avg=float(pa.mean()), ssim_avg=float(sa.mean()))
  return out


def image_study(cfg: Any, workdir: str, progress: bool = True) -> dict:
  """PSNR / SSIM of FPS vs DPS vs plain DDIM vs the pseudo-inverse on digits inverse problems.

  Every sampling method draws `samples_per_image` independent samples per test image (FPS: the first particle of
  independent filters, as the official code returns); scores average over them (see `sample_scores`). Per task,
  the FPS variants with the same particle count share one compiled program (the kernel rates are data) and the
  DPS step sizes another.

  Args:
    cfg: the fps ConfigDict (data, schedule, fps, images, seed, use_cache).
    workdir: folder for the prior's cache (workdir/prior) and images.png.
    progress: print progress lines.

  Returns:
    {'prior': training info, 'tasks': {task: {scores: {method: `sample_scores`}, dps_psnr_by_zeta,
    dps_best_zeta, mean_ess_fraction, seconds}}, 'num_images', 'num_steps', 'samples_per_image', 'sigma',
    'plots': [png path]}.

  Raises:
    ValueError: an unknown method in images.methods.
  """
  ic, fc = cfg.images, cfg.fps
  t0 = time.perf_counter()
  model, params, sched, info = model_lib.get_prior(cfg, os.path.join(workdir, "prior"), use_cache=bool(cfg.use_cache),
                                                   progress=progress)
  t_prior = time.perf_counter() - t0
  den = model_lib.make_denoiser(model, params)
  _, x_test = model_lib.load_images(cfg.data)
  n = int(ic.num_images)
  k_runs = int(ic.get("samples_per_image", 1))
  x_true = x_test[np.random.default_rng(cfg.seed).choice(len(x_test), n, replace=False)]
  shape = x_true.shape[1:]
  steps, clip = int(fc.num_steps), (float(fc.clip_x0) if fc.get("clip_x0") else None)
  _, a_t, a_s = samplers.sampling_grid(sched, steps)
  out: dict[str, Any] = {"prior": {**info, "seconds": t_prior}, "tasks": {}, "num_images": n, "num_steps": steps,
                         "samples_per_image": k_runs, "sigma": float(ic.sigma)}
  methods = list(ic.methods)
  unknown = set(methods) - set(IMAGE_METHODS)
  if unknown:
    raise ValueError(f"unknown image methods {sorted(unknown)}; choose from {IMAGE_METHODS}.")
  # FPS variants: name -> (particles, sampler). 'fps' is the configured sampler with M = fps.num_particles;
  # 'fps_ddpm' / 'fps_ddim' force a kernel (skipped when it is the configured one: identical to 'fps');
  # 'fps_m1' is the particle-free FPS (M = 1) with the configured sampler.
  # 'fps_tele' is the configured sampler with the telescoping weights (beyond the paper), on the tasks in
  # images.telescoping_tasks.
  m_cfg = int(fc.num_particles)
  all_variants = {"fps": (m_cfg, fc.sampler, 0.0), "fps_ddpm": (m_cfg, "ddpm", 0.0),
                  "fps_ddim": (m_cfg, "ddim", 0.0), "fps_m1": (1, fc.sampler, 0.0),
                  "fps_tele": (m_cfg, fc.sampler, 1.0)}
  all_variants = {name: v for name, v in all_variants.items() if name in methods and name != f"fps_{fc.sampler}"}
  tele_tasks = tuple(ic.get("telescoping_tasks", ic.tasks))
  recon_all = {}
  ddim_x = None
  if "ddim" in methods:   # unconditional samples ignore y: one set serves every task
    fn = jax.jit(lambda k: baselines.ddim_sample(k, den, sched, shape, n * k_runs, steps, clip_x0=clip))
    key = jax.random.key(cfg.seed + 11)
    ddim_x = np.asarray(compile_call(fn, key)(key)).reshape((n, k_runs) + shape)
  for ti, task in enumerate(ic.tasks):
    t1 = time.perf_counter()
    op = make_operator(task, ic, shape)
    key = jax.random.key(cfg.seed * 1000 + ti)
    y = jax.vmap(op.measure, (0, 0, None))(jax.random.split(key, n), jnp.asarray(x_true), float(ic.sigma))
    samples, ess_info = {}, {}
    variants = {nm: v for nm, v in all_variants.items() if nm != "fps_tele" or task in tele_tasks}
    if "pinv" in methods:
      # truncated-SVD pseudo-inverse: singular values below sigma (relative to the largest) are dropped
      samples["pinv"] = np.clip(np.asarray(op.pseudo_inverse(y, rcond=float(ic.sigma))), -1, 1)[:, None]
    if ddim_x is not None:
      samples["ddim"] = ddim_x
    for m in sorted({v[0] for v in variants.values()}):
      names = [name for name, v in variants.items() if v[0] == m]
      c_total = n * len(names)                                   # configurations: (variant, image)
      fn = fps_runs_fn(den, sched, op, m, steps, clip_x0=clip, resampling=fc.resampling)
      keys = jax.vmap(lambda i: jax.random.split(jax.random.fold_in(jax.random.fold_in(key, 7 + m), i), k_runs))(
          jnp.arange(c_total))                                   # [C, k runs]
      rates = jnp.concatenate([jnp.broadcast_to(smc.kernel_rates(variants[nm][1], float(fc.c), a_t, a_s),
                                                (n, steps)) for nm in names])
      tele = jnp.repeat(jnp.asarray([variants[nm][2] for nm in names], jnp.float32), n)
      args = (keys, jnp.tile(y, (len(names),) + (1,) * (y.ndim - 1)), jnp.full((c_total,), float(ic.sigma)),
              jnp.full((c_total,), float(fc.c)), rates, tele)
      x, ess = jax.device_get(compile_call(fn, *args)(*args))   # x [C, k, M, ...]
      for j, nm in enumerate(names):
        samples[nm] = np.asarray(x[j * n:(j + 1) * n, :, 0])   # the first particle of each run: [n, k, ...]
        ess_info[nm] = float(np.mean(ess[j * n:(j + 1) * n]))
    dps_scores = {}
    if "dps" in methods:
      zetas = [float(z) for z in ic.dps_zetas]
      dfn = dps_runs_fn(den, sched, op, k_runs, steps, clip_x0=clip)
      dargs = (jax.random.split(jax.random.fold_in(key, 99), n * len(zetas)),
               jnp.tile(y, (len(zetas),) + (1,) * (y.ndim - 1)), jnp.repeat(jnp.asarray(zetas, jnp.float32), n))
      xd = np.asarray(compile_call(dfn, *dargs)(*dargs))          # [zetas * n, k, ...]
      by_zeta = {z: xd[j * n:(j + 1) * n] for j, z in enumerate(zetas)}
      dps_scores = {z: float(np.mean(metrics_lib.psnr(v[:, 0], x_true))) for z, v in by_zeta.items()}
      samples["dps"] = by_zeta[max(dps_scores, key=dps_scores.get)]
    scores = {name: sample_scores(xs_, x_true, op, y) for name, xs_ in samples.items()}
    out["tasks"][task] = {"scores": scores, "dps_psnr_by_zeta": dps_scores,
                          "dps_best_zeta": max(dps_scores, key=dps_scores.get) if dps_scores else None,
                          "mean_ess_fraction": ess_info, "seconds": time.perf_counter() - t1}
    recon_all[task] = (np.asarray(y), {name: xs_[:, 0] for name, xs_ in samples.items()}, op)
    if progress:
      print(f"[fps] images {task}: " + ", ".join(
          f"{k} {v['psnr']:.2f}dB" + (f" (mean-of-samples {v['psnr_avg']:.2f})" if "psnr_avg" in v else "")
          for k, v in scores.items()) + f" ({time.perf_counter() - t1:.1f}s)", flush=True)
  out["plots"] = [plot_images(x_true, recon_all, os.path.join(workdir, "images.png"))]
  return out


def _show_measurement(op, y):
  """A measurement as an image in [-1, 1] for display (super-resolution: nearest upsampling)."""
  if isinstance(op, operators.SuperResolution):
    return np.repeat(np.repeat(y, op.factor, 0), op.factor, 1)
  return y


def plot_images(x_true, recon_all: dict, path: str, num: int = 3) -> str:
  """Rows: task x first `num` images; columns: truth, measurement, then each method.

  Args:
    x_true: [n, S, S, 1] in [-1, 1].
    recon_all: {task: (y [n, ...], {method: [n, S, S, 1] first samples}, operator)}.
    path: PNG output path.
    num: images shown per task (capped at n).

  Returns:
    path.
  """
  tasks = list(recon_all)
  names = []   # every method of any task, in first-seen order (a method run on some tasks only leaves blanks)
  for _, recon, _ in recon_all.values():
    names += [nm for nm in recon if nm not in names]
  cols = ["truth", "measurement"] + names
  num = min(num, x_true.shape[0])
  fig, axes = metrics_lib.new_figure(ncols=len(cols), nrows=len(tasks) * num, size=(1.1, 1.1))
  for ti, task in enumerate(tasks):
    y, recon, op = recon_all[task]
    for j in range(num):
      row = ti * num + j
      imgs = [x_true[j], _show_measurement(op, y[j])] + [recon[nm][j] if nm in recon else None for nm in names]
      for ci, img in enumerate(imgs):
        ax = axes[row, ci]
        if img is not None:
          ax.imshow(np.clip((img[..., 0] + 1) / 2, 0, 1), cmap="gray", vmin=0, vmax=1)
        ax.set_xticks([])
        ax.set_yticks([])
        if row == 0:
          ax.set_title(cols[ci], fontsize=6)
        if ci == 0 and j == 0:
          ax.set_ylabel(task.replace("_", "\n"), fontsize=6)
  return metrics_lib.save_figure(fig, path)


# ============================================================================================== run


def run(config: Any, workdir: str, progress: bool = True) -> dict:
  """Runs the configured study (config.task: 'exactness' | 'images' | 'both') and writes results.json + PNGs.

  Args:
    config: the fps ConfigDict (`configs/fps.py`).
    workdir: output folder (created).
    progress: print progress lines.

  Returns:
    results dict: paper, task, exactness and gaussian_limit (exactness / both), images (images / both), seconds.

  Raises:
    ValueError: unknown config.task.
  """
  os.makedirs(workdir, exist_ok=True)
  if config.task not in ("exactness", "images", "both"):
    raise ValueError(f"config.task must be 'exactness', 'images' or 'both', got '{config.task}'.")
  results: dict[str, Any] = {"paper": PAPER, "task": config.task}
  t0 = time.perf_counter()
  if config.task in ("exactness", "both"):
    results["exactness"] = exactness_study(config, workdir, progress)
    results["gaussian_limit"] = gaussian_limit_study(config, workdir)
  if config.task in ("images", "both"):
    results["images"] = image_study(config, workdir, progress)
  results["seconds"] = time.perf_counter() - t0
  metrics_lib.write_results(workdir, results)
  return results


# ======================================================================================== reproduce


# ======================================================================================== benchmark
