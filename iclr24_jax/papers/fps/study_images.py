"""FPS image study: PSNR / SSIM of FPS vs DPS vs plain DDIM vs the pseudo-inverse on digits inverse problems.

`image_study` (a trained diffusion prior, `make_operator` for the tasks, `sample_scores`, the plot `plot_images`).
`experiment.run` calls it (config.task 'images' / 'both'); `study.reproduce` turns it into rows. This module
imports only method modules (`programs.py`, `operators.py`, `smc.py`, ...), never `experiment` or `study`.
"""
from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.diffusion import samplers
from iclr24_jax.papers.fps import baselines, model as model_lib, operators, smc
from iclr24_jax.papers.fps.programs import compile_call, dps_runs_fn, fps_runs_fn

IMAGE_METHODS = ("fps", "fps_ddpm", "fps_ddim", "fps_m1", "fps_tele", "dps", "ddim", "pinv")


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


def split_images(x_pool: np.ndarray, num_test: int, num_val: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Disjoint test and validation images drawn from one pool (the digits test split, which the prior never saw).

  The test images are `default_rng(seed).choice(len(pool), num_test, replace=False)` (the same images whatever
  num_val is); the validation images are then drawn by the same generator from the images left over, so a
  baseline's hyperparameter is tuned on images the comparison never scores.

  Args:
    x_pool: [N, S, S, 1] candidate images.
    num_test: images the methods are scored on.
    num_val: images for tuning (0: none).
    seed: the generator's seed.

  Returns:
    (test [num_test, S, S, 1], validation [num_val, S, S, 1]).

  Raises:
    ValueError: the pool holds fewer than num_test + num_val images.
  """
  n = x_pool.shape[0]
  if num_test < 1 or num_val < 0 or num_test + num_val > n:
    raise ValueError(f"need 1 <= num_test and 0 <= num_val with num_test + num_val <= {n} images in the pool; got "
                     f"num_test={num_test}, num_val={num_val}: lower images.num_images or images.num_val_images.")
  rng = np.random.default_rng(seed)
  test_idx = rng.choice(n, num_test, replace=False)
  rest = np.setdiff1d(np.arange(n), test_idx)
  val_idx = rng.choice(rest, num_val, replace=False) if num_val else rest[:0]
  return x_pool[test_idx], x_pool[val_idx]


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
  the FPS variants with the same particle count share one compiled program (the kernel rates are data). DPS's step
  size is picked from images.dps_zetas by mean PSNR on `num_val_images` validation images (disjoint from the test
  images, `split_images`), then DPS runs on the test images at that step size only. FPS and DPS run the same
  number of sampler steps (fps.num_steps).

  Args:
    cfg: the fps ConfigDict (data, schedule, fps, images, seed, use_cache).
    workdir: folder for the prior's cache (workdir/prior) and images.png.
    progress: print progress lines.

  Returns:
    {'prior': training info, 'tasks': {task: {scores: {method: `sample_scores`}, dps_val_psnr_by_zeta (mean PSNR
    of each zeta on the validation images), dps_zeta (the one chosen there), mean_ess_fraction, seconds,
    seconds_by_stage}}, 'num_images', 'num_val_images', 'num_steps', 'samples_per_image', 'sigma',
    'plots': [png path]}.

  Raises:
    ValueError: an unknown method in images.methods, DPS with several step sizes and no validation images, or
      more test + validation images than the pool holds.
  """
  ic, fc = cfg.images, cfg.fps
  methods = list(ic.methods)
  unknown = set(methods) - set(IMAGE_METHODS)
  if unknown:
    raise ValueError(f"unknown image methods {sorted(unknown)}; choose from {IMAGE_METHODS}.")
  n = int(ic.num_images)
  n_val = int(ic.get("num_val_images", 0))
  if "dps" in methods and len(ic.dps_zetas) > 1 and n_val == 0:
    raise ValueError("DPS's step size is chosen from images.dps_zetas on validation images, never on the test "
                     "images: set images.num_val_images > 0 (or give a single zeta).")
  t0 = time.perf_counter()
  model, params, sched, info = model_lib.get_prior(cfg, os.path.join(workdir, "prior"), use_cache=bool(cfg.use_cache),
                                                   progress=progress)
  t_prior = time.perf_counter() - t0
  den = model_lib.make_denoiser(model, params)
  _, x_test = model_lib.load_images(cfg.data)
  k_runs = int(ic.get("samples_per_image", 1))
  x_true, x_val = split_images(x_test, n, n_val, int(cfg.seed))
  shape = x_true.shape[1:]
  steps, clip = int(fc.num_steps), (float(fc.clip_x0) if fc.get("clip_x0") else None)
  _, a_t, a_s = samplers.sampling_grid(sched, steps)
  out: dict[str, Any] = {"prior": {**info, "seconds": t_prior}, "tasks": {}, "num_images": n, "num_val_images": n_val,
                         "num_steps": steps, "samples_per_image": k_runs, "sigma": float(ic.sigma)}
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
    samples, ess_info, stage_secs = {}, {}, {}
    variants = {nm: v for nm, v in all_variants.items() if nm != "fps_tele" or task in tele_tasks}
    if "pinv" in methods:
      # truncated-SVD pseudo-inverse: singular values below sigma (relative to the largest) are dropped
      samples["pinv"] = np.clip(np.asarray(op.pseudo_inverse(y, rcond=float(ic.sigma))), -1, 1)[:, None]
    if ddim_x is not None:
      samples["ddim"] = ddim_x
    for m in sorted({v[0] for v in variants.values()}):
      t_stage = time.perf_counter()
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
      stage_secs[f"fps M={m}"] = time.perf_counter() - t_stage
    dps_val, zeta = {}, None
    if "dps" in methods:
      # The step size is chosen on the validation images (their own measurements), then DPS runs on the test
      # images at that zeta only: the comparison never sees a test-tuned baseline. One compiled program per shape.
      zetas = [float(z) for z in ic.dps_zetas]
      dfn = dps_runs_fn(den, sched, op, k_runs, steps, clip_x0=clip)
      t_stage = time.perf_counter()
      if len(zetas) > 1:
        key_val = jax.random.fold_in(key, 5)
        y_val = jax.vmap(op.measure, (0, 0, None))(jax.random.split(key_val, n_val), jnp.asarray(x_val),
                                                   float(ic.sigma))
        vargs = (jax.random.split(jax.random.fold_in(key_val, 99), n_val * len(zetas)),
                 jnp.tile(y_val, (len(zetas),) + (1,) * (y_val.ndim - 1)),
                 jnp.repeat(jnp.asarray(zetas, jnp.float32), n_val))
        xv = np.asarray(compile_call(dfn, *vargs)(*vargs)).reshape((len(zetas), n_val, k_runs) + shape)
        dps_val = {z: float(np.mean(metrics_lib.psnr(xv[j].reshape((-1,) + shape), np.repeat(x_val, k_runs, 0))))
                   for j, z in enumerate(zetas)}        # mean PSNR over the validation images and their samples
      zeta = max(dps_val, key=dps_val.get) if dps_val else zetas[0]
      stage_secs["dps tuning"] = time.perf_counter() - t_stage
      t_stage = time.perf_counter()
      dargs = (jax.random.split(jax.random.fold_in(key, 99), n), y, jnp.full((n,), zeta, jnp.float32))
      samples["dps"] = np.asarray(compile_call(dfn, *dargs)(*dargs))      # [n, k, ...]
      stage_secs["dps"] = time.perf_counter() - t_stage
    scores = {name: sample_scores(xs_, x_true, op, y) for name, xs_ in samples.items()}
    out["tasks"][task] = {"scores": scores, "dps_val_psnr_by_zeta": dps_val, "dps_zeta": zeta,
                          "mean_ess_fraction": ess_info, "seconds": time.perf_counter() - t1,
                          "seconds_by_stage": stage_secs}
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
