"""fps: the small-scale reproduction (`reproduce`) and the benchmark (`benchmark`).

The studies themselves are in `study_exactness.py` and `study_images.py` (launched through `experiment.run`);
this module runs them at the reproduction's settings and turns their results into judged rows
(experiments/reproduce.py and experiments/benchmark.py call `reproduce` and `benchmark`).
"""
from __future__ import annotations

import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections

from iclr24_jax.common import bench
from iclr24_jax.common import sharding
from iclr24_jax.common import stats
from iclr24_jax.diffusion import schedules, unet
from iclr24_jax.papers.fps import operators, smc
from iclr24_jax.papers.fps.experiment import PAPER, run


def _fps_line(per_m: dict, key: str) -> str:
  return ", ".join(f"M={m}: {per_m[m][key]:.3g}" for m in sorted(per_m))


CRITERION = (0.8, 1.25)   # Var(A x) / exact counted as "the exact spread"
# The paper sentences the claim rows test, and the basis of the checks of our own additions.
EXACT = "'guarantees accurate samples from the Bayesian posterior as particle counts rise' (abstract; Sec. 3)"
BETTER = ("'better or comparable results than leading zero-shot diffusion posterior samplers on tasks like image "
          "inpainting, super-resolution, and motion deblur' (abstract; Tables 1-2)")
BEYOND = "beyond the paper: verifies our telescoping-weight correction, not a paper statement"

# Headline claims of the abstract that no row tests at the paper's scale (experiments/reproduce.py tables them).
NOT_RUN = [
    stats.not_run_row(
        paper="fps", experiment="FFHQ / ImageNet 256x256 inverse problems against DPS and the paper's baselines",
        metric="LPIPS / PSNR / FID at 1000 steps (paper Tables 1-2)", paper_value="Tables 1-2",
        basis=BETTER, reason=("the image rows are a proxy: 16x16 digits, a small MLP prior, 250 steps; no pretrained "
                              "256x256 ADM checkpoints or LPIPS / FID networks here, and `experiment.run` does not "
                              "sample on the ffhq / imagenet folders `fps.data.load` reads yet"),
        variant="configs/fps.py:official with data.name='ffhq' (or 'imagenet') and a pretrained 256x256 prior"),
]


def range_verdict(values, lo: float = CRITERION[0], hi: float = CRITERION[1], z: float = 2.0) -> str:
  """'yes' if mean +- z se of the per-seed values lies inside [lo, hi], 'no' if entirely outside, else
  'inconclusive' (the range analogue of `common.stats.verdict`; a single value needs no se).

  Args:
    values: per-seed values (a sequence of floats).
    lo: lower end of the accepted range.
    hi: upper end.
    z: standard errors on each side of the mean.

  Returns:
    'yes' | 'no' | 'inconclusive'.
  """
  m, se = stats.mean_se(values)
  if m - z * se >= lo and m + z * se <= hi:
    return "yes"
  if m + z * se < lo or m - z * se > hi:
    return "no"
  return "inconclusive"


# Beside every row run at 100 steps: the over-confidence measured here is that of the paper's equations (x_s
# conditioned on y_s at the same noise level), which this package implements; the official code indexes one level
# off, and at 100 steps that turns the other way.
OFFICIAL_INDEXING_NOTE = (
    "these rows use the paper's indexing (x_s conditioned on y_s at the same noise level); the official code "
    "conditions x_{t-1} on y_t with variance abar_t sigma^2, weights with abar_{t-1} sigma^2 and returns x0_hat "
    "unconditioned at the end: at 100 steps and sigma = 0.05 that indexing is OVER-dispersed (1.78x the exact "
    "posterior variance along range(A); the independent fidelity review's Gaussian check), not over-confident")


def _indexing_note(num_steps: int) -> str:
  """OFFICIAL_INDEXING_NOTE for a configuration run at 100 steps (or fewer), else ''."""
  return f"; {OFFICIAL_INDEXING_NOTE}" if int(num_steps) <= 100 else ""


def _with_reference(row: dict, note: str) -> dict:
  """Appends the reference that rules out a bug to a row whose verdict is 'no'."""
  if row.get("holds") == "no":
    row["notes"] = f"{row['notes']}; {note}"
  return row


def _seeds_str(values) -> str:
  m, se = stats.mean_se(values)
  return f"{stats.fmt_mean_se(m, se)} ({len(values)} seeds)"


def reproduce(workdir: str, fast: bool = False, *, get_config: Callable[[str], Any]) -> list[dict]:
  """The exactness table (2-D / 8-D, FPS's and the telescoping weights), the Gaussian M -> infinity limit (FPS's
  HMM, the noise-tracking Kalman filter, the telescoping limit), and the digits image tasks.

  Claims are judged with `common.stats` on seeds (the independent runs split into `exactness.num_seeds` groups);
  the image comparisons are paired over test images (bootstrap). 'no' is written only where a closed-form reference
  rules out a bug: the Gaussian prior's exact limits (`exact.noise_tracking_kalman` = the exact posterior to 1e-9 on
  the same sequences; `exact.kalman_reference` = FPS's limit, which the particle filter matches in the tests).

  Args:
    workdir: output folder (created).
    fast: a smoke run (2 particle counts, 30 steps, one image task on 4 images, 200 prior steps); verdicts None.
    get_config: `get_config(variant)` of configs/fps.py (the runners pass it; tests pass the module's).

  Returns:
    list of reproduction row dicts.
  """
  os.makedirs(workdir, exist_ok=True)
  cfg = get_config("")
  cfg.task = "both"
  if fast:
    cfg.exactness.update(dict(particles=(1, 50), num_runs=(128, 64), num_steps=30, rates=(0.95,),
                              dps_zetas=(0.3,), gaussian_steps=(30,), gaussian_sequences=10))
    cfg.images.update(dict(tasks=("inpainting",), num_images=4, num_val_images=2, dps_zetas=(0.3, 1.0)))
    cfg.fps.num_steps = 20
    cfg.train_steps = 200
  res = run(cfg, workdir, progress=not fast)
  rows: list[dict] = []
  ex = res["exactness"]
  plots_ex = ex["plots"]
  gl = res["gaussian_limit"]
  big = max(x["steps"] for x in gl["rows"])
  judge = (lambda v: v) if not fast else (lambda v: None)
  lo_c, hi_c = CRITERION
  ref_note = ("reference that rules out a bug: for a Gaussian prior the exact limits are closed forms -- FPS's HMM "
              "(Kalman filter, matched by the particle filter in the tests) is over-confident while the noise-tracking "
              "Kalman filter on the same sequences is the exact posterior (ratio 1.000); see the Gaussian rows")
  for dim, r in ex["dims"].items():
    main, main_s = r["fps"]["ddpm c=0.95"], r["fps_seeds"]["ddpm c=0.95"]
    tele, tele_s = r["fps"].get("ddpm c=0.95 telescoping"), r["fps_seeds"].get("ddpm c=0.95 telescoping")
    ms = sorted(main)
    lo, hi = ms[0], ms[-1]
    floor = r["floor"]["main"]
    dps_r = r["dps"]["main"]
    best = dps_r["zeta"]
    dps, dps_s = dps_r["test"], dps_r["test_seeds"]
    n_s = r["num_seeds"]
    common = (f"{r['description']}, sigma={r['sigmas']['main']}, {r['num_steps']} DDPM steps, {r['runs']} runs "
              f"(= {n_s} seeds of {r['runs'] // n_s}){_indexing_note(r['num_steps'])}")
    row = stats.compare_row(
        paper=PAPER, experiment=f"exactness {dim}-D: FPS-DDPM (c=0.95) mixture weights as particles grow",
        metric=f"mixture-weight TV to the exact posterior, M={hi} vs M={lo}", a=main_s[hi]["weight_tv"],
        b=main_s[lo]["weight_tv"], name_a=f"M={hi}", name_b=f"M={lo}", direction="less", paired=False,
        paper_value="asymptotically exact as the particle count rises (Sec. 3, Thm.); error falls with M",
        kind="claim", basis=EXACT,
        notes=(f"{common}. Pooled TV {_fps_line(main, 'weight_tv')} (floor {floor['weight_tv']:.3f}); telescoping "
               f"{_fps_line(tele, 'weight_tv') if tele else '-'}; exact weights {r['posterior_weights']['main']}"),
        plots=plots_ex)
    row["holds"] = judge(row["holds"])
    rows.append(_with_reference(row, ref_note))
    for name, per_m, per_s, claim in (
        ("FPS-DDPM, paper weights", main, main_s,
         "FPS samples the exact posterior for M -> infinity with exact scores (ratio 1)"),
        ("FPS-DDPM, telescoping weights (beyond the paper)", tele, tele_s,
         "the corrected filter is asymptotically exact (criterion: reaches 0.8-1.25 at this M)")):
      if per_m is None:
        continue
      verdict = range_verdict(per_s[hi]["obs_var_ratio"])
      rows.append({"paper": PAPER, "experiment": f"exactness {dim}-D: spread along A, {name}, M={hi}",
                   "metric": "tr Cov(A x) / exact (per seed)",
                   "kind": "check" if "telescoping" in name else "claim",
                   "basis": BEYOND if "telescoping" in name else EXACT,
                   "ours": f"{_seeds_str(per_s[hi]['obs_var_ratio'])}; pooled {per_m[hi]['obs_var_ratio']:.3f}",
                   "paper_value": claim, "holds": judge(verdict),
                   "notes": (f"criterion {lo_c}-{hi_c} (mean +- 2 se over seeds inside / outside); pooled ratio "
                             f"{_fps_line(per_m, 'obs_var_ratio')}; SW/floor {_fps_line(per_m, 'sw_ratio')}; "
                             f"weight TV {_fps_line(per_m, 'weight_tv')}; mean ESS/M {_fps_line(per_m, 'mean_ess_fraction')}; "
                             f"exact-vs-exact draw {floor['obs_var_ratio']:.3f}; DPS (zeta {best:g}, from "
                             f"validation runs) {dps['obs_var_ratio']:.3g}"
                             + (f"; {ref_note}" if verdict == "no" and "paper" in name else "")
                             + ("; finite-M error: the telescoping increments have infinite variance where the "
                                "kernel variance exceeds abar_t sigma^2 (every early step: abar_T sigma^2 ~ 1e-5), so "
                                "convergence in M is slow; reference: its M = infinity limit is exact (closed form, "
                                "Gaussian rows) and the particle filter matches that closed form on a grid where the "
                                "weights have finite variance (tests)" if "telescoping" in name else "")),
                   "plots": plots_ex})
    row = stats.compare_row(
        paper=PAPER, experiment=f"exactness {dim}-D: FPS-DDPM M={hi} vs the exact posterior (sliced W2)",
        metric="sliced W2 / exact-vs-exact floor (per seed), vs the criterion 1.5", a=main_s[hi]["sw_ratio"], b=1.5,
        name_a=f"FPS M={hi}", name_b="criterion", direction="less",
        paper_value="FPS samples the exact posterior for M -> infinity (ratio -> 1)", kind="claim", basis=EXACT,
        notes=(f"floor = exact draws of the seed-group size judged the same way; pooled SW/floor {main[hi]['sw_ratio']:.3g}; "
               f"telescoping {_seeds_str(tele_s[hi]['sw_ratio']) if tele_s else '-'}; rel. cov err "
               f"{main[hi]['cov_err']:.3f} (floor {floor['cov_err']:.3f}); mean ESS/M {main[hi]['mean_ess_fraction']:.2f}"),
        plots=plots_ex)
    row["holds"] = judge(row["holds"])
    rows.append(_with_reference(row, ref_note))
    # DPS's official configs fix zeta per image task; on the GMMs it is chosen from a grid on validation runs.
    zeta_val = ", ".join(f"{z:g}: {v:.3g}" for z, v in dps_r["val_sw_by_zeta"].items())
    zeta_test = ", ".join(f"{z:g}: {v:.3g}" for z, v in dps_r["test_sw_ratio_by_zeta"].items())
    row = stats.compare_row(
        paper=PAPER, experiment=f"exactness {dim}-D: FPS-DDPM M={hi} vs DPS (zeta={best:g}, chosen on validation runs)",
        metric="sliced W2 / floor (per seed)", a=main_s[hi]["sw_ratio"], b=dps_s["sw_ratio"],
        name_a=f"FPS M={hi}", name_b="DPS", direction="less", paired=False,
        paper_value="FPS is more accurate than DPS-style guidance", kind="claim", basis=BETTER,
        notes=(f"FPS and DPS both run {r['num_steps']} steps (official 1000) with the exact denoiser; DPS's zeta "
               f"chosen from {list(cfg.exactness.dps_zetas)} by sliced W2 on {r['runs']} validation runs (their own "
               f"keys) against 2 independent exact draws, then scored on {r['runs']} test runs (other keys) against "
               f"FPS's exact draws: validation SW by zeta {zeta_val}; test SW/floor by zeta (never used for the "
               f"choice) {zeta_test}; DPS test pooled SW/floor {dps['sw_ratio']:.3g}, weight TV "
               f"{dps['weight_tv']:.3f}, rel. cov err {dps['cov_err']:.3f}, Var(A x)/exact "
               f"{dps['obs_var_ratio']:.3g}; the tuning is per observation (the same y as the test runs), which "
               "still favours DPS over a step size carried across problems; "
               f"telescoping M={hi}: {_seeds_str(tele_s[hi]['sw_ratio']) if tele_s else '-'}"),
        plots=plots_ex)
    row["holds"] = judge(row["holds"])
    rows.append(_with_reference(row, ref_note))
    for label, per_m in r["fps"].items():
      if label in ("ddpm c=0.95", "ddpm c=0.95 telescoping"):
        continue
      rows.append({"paper": PAPER, "experiment": f"exactness {dim}-D: FPS {label}",
                   "metric": f"Var(A x) / exact at M={max(per_m)}", "ours": per_m[max(per_m)]["obs_var_ratio"],
                   "paper_value": "(c = 0.95 and the c-rate DDIM kernel are the official defaults)", "holds": None,
                   "kind": "measurement",
                   "notes": (f"Var(A x) / exact {_fps_line(per_m, 'obs_var_ratio')}; SW/floor "
                             f"{_fps_line(per_m, 'sw_ratio')}; weight TV {_fps_line(per_m, 'weight_tv')}; "
                             f"rel. cov err {_fps_line(per_m, 'cov_err')}"),
                   "plots": plots_ex})
  # Gaussian prior, M = infinity (closed forms; no Monte Carlo error beyond the average over measurement sequences).
  n_seq = cfg.exactness.gaussian_sequences

  def grow(filt, sampler, sigma, steps=big, c=0.95):
    return next(x for x in gl["rows"] if x["filter"] == filt and x["sampler"] == sampler and x["sigma"] == sigma
                and x["steps"] == steps and x["c"] == c)

  small_steps = min(x["steps"] for x in gl["rows"])
  for sigma in sorted({x["sigma"] for x in gl["rows"] if x["sigma"] is not None}):
    f = grow("fps", "ddpm", sigma)
    ctrl = next(x for x in gl["rows"] if x["sigma"] is None and x["steps"] == big and x["sampler"] == "ddpm"
                and x["c"] == 0.95)
    sweep = [x for x in gl["rows"] if x["sigma"] == sigma and x["steps"] == big and x["filter"] == "fps"
             and x["sampler"] == "ddpm"]
    v = range_verdict([f["obs_var_ratio"]])
    rows.append({"paper": PAPER, "experiment": f"Gaussian prior, M = infinity: FPS's HMM (Kalman), DDPM kernel, "
                 f"c=0.95, {big} steps, sigma={sigma}",
                 "metric": "Var(A x) of FPS's output / exact posterior", "ours": f["obs_var_ratio"],
                 "paper_value": "asymptotically exact for M -> infinity with exact scores (ratio 1)",
                 "holds": judge(v), "kind": "claim", "basis": EXACT,
                 "notes": (f"criterion {lo_c}-{hi_c}; closed form averaged over {n_seq} measurement sequences; "
                           f"mean err / posterior std {f['mean_err_over_post_std']:.3f}; same HMM with the c-rate DDIM "
                           f"kernel {grow('fps', 'ddim', sigma)['obs_var_ratio']:.3g}, with the EXACT reverse kernel "
                           f"{grow('fps', 'exact', sigma)['obs_var_ratio']:.3g} (so the kernel is not the cause); "
                           f"noise-tracking Kalman on the same sequences {grow('noise_tracking', 'exact', sigma)['obs_var_ratio']:.6f}; "
                           f"by c: " + ", ".join(f"c={x['c']}: {x['obs_var_ratio']:.3g}" for x in sweep)
                           + f"; at {small_steps} steps {grow('fps', 'ddpm', sigma, small_steps)['obs_var_ratio']:.3g} "
                           f"(more steps, more over-confident{_indexing_note(small_steps)}); sampler-only (A = 0) "
                           f"rel. cov error "
                           f"{ctrl['cov_rel_err']:.3f}" + (f"; {ref_note}" if v == "no" else "")),
                 "plots": gl["plots"]})
    nt = grow("noise_tracking", "exact", sigma)
    ok = abs(nt["obs_var_ratio"] - 1) < 1e-6 and nt["mean_err_over_post_std"] < 1e-6
    rows.append({"paper": PAPER, "experiment": f"Gaussian prior: noise-tracking Kalman filter (state (x_t, n)), "
                 f"{big} steps, sigma={sigma}",
                 "metric": "Var(A x) / exact posterior (same sequences as FPS's row)", "ours": nt["obs_var_ratio"],
                 "paper_value": "(beyond the paper) the shared-noise model is the exact posterior (ratio 1)",
                 "holds": judge("yes" if ok else "no"), "kind": "check",
                 "basis": ("verifies the exact reference (a Kalman filter that tracks the shared noise), not a paper "
                           "statement"),
                 "notes": (f"mean err / posterior std {nt['mean_err_over_post_std']:.2e}, rel. cov err "
                           f"{nt['cov_rel_err']:.2e}; FPS's HMM differs only in its emissions (independent "
                           f"N(y_t; A x_t, abar_t sigma^2) per step) and gives {f['obs_var_ratio']:.3g}"),
                 "plots": gl["plots"]})
    t_ddpm, t_ddim = grow("telescoping", "ddpm", sigma), grow("telescoping", "ddim", sigma)
    rows.append({"paper": PAPER, "experiment": f"Gaussian prior, M = infinity: telescoping weights (beyond the paper), "
                 f"DDPM kernel, {big} steps, sigma={sigma}",
                 "metric": "Var(A x) / exact posterior", "ours": t_ddpm["obs_var_ratio"],
                 "paper_value": "(beyond the paper) the corrected filter is asymptotically exact",
                 "holds": judge(range_verdict([t_ddpm["obs_var_ratio"]])), "kind": "check", "basis": BEYOND,
                 "notes": (f"criterion {lo_c}-{hi_c}; closed form (p_chain(x_0) N(y; A x_0, sigma^2)); mean err / "
                           f"posterior std {t_ddpm['mean_err_over_post_std']:.3g}; with the c-rate DDIM kernel "
                           f"{t_ddim['obs_var_ratio']:.3g} (the kernel's own bias: its chain output misses the prior); at "
                           f"{small_steps} steps {grow('telescoping', 'ddpm', sigma, small_steps)['obs_var_ratio']:.3g}"),
                 "plots": gl["plots"]})
  im = res["images"]
  fc = cfg.fps
  for task, t in im["tasks"].items():
    sc = t["scores"]
    exp = (f"digits 16x16 {task}, sigma={im['sigma']}, {im['num_images']} images x {im['samples_per_image']} "
           f"samples, {im['num_steps']} steps")
    n_val = im.get("num_val_images", 0)
    tuning = (f"DPS zeta {t['dps_zeta']} chosen from {list(cfg.images.dps_zetas)} by mean PSNR on {n_val} validation "
              f"images disjoint from the test images (validation PSNR by zeta: "
              + ", ".join(f"{z:g}: {v:.2f}" for z, v in t["dps_val_psnr_by_zeta"].items()) + ")"
              if t.get("dps_val_psnr_by_zeta") else f"DPS zeta {t.get('dps_zeta')} (fixed)")
    steps_note = (f"FPS and DPS both run {im['num_steps']} sampler steps" + (
        f" (the official code runs 1000: {1000 / im['num_steps']:.3g}x fewer here, to fit the CPU budget)"
        if im["num_steps"] < 1000 else " (the official 1000 or more)"))
    fps_name = f"FPS ({fc.sampler.upper()} kernel, c={fc.c}, M={fc.num_particles})"
    for metric, unit in (("psnr", "dB"), ("ssim", "")):
      others = ("; mean over samples (+- se over images): " + "; ".join(
          f"{k} {v[metric]:.3g}+-{v[metric + '_se']:.2g}" for k, v in sc.items())
          + "; of the mean of the samples (an E[x|y] estimate): " + "; ".join(
          f"{k} {v[metric + '_avg']:.3g}" for k, v in sc.items() if metric + "_avg" in v)
          + f"; {tuning}; {steps_note}; mean ESS/M "
          + ", ".join(f"{k} {v:.2f}" for k, v in t["mean_ess_fraction"].items())
          + f"; prior {'cached' if im['prior'].get('cached') else 'trained'}")
      holds, ours = None, sc["fps"][metric]
      if "dps" in sc:
        bd = stats.bootstrap_diff(sc["fps"][f"{metric}_per_image"], sc["dps"][f"{metric}_per_image"])
        holds = judge(bd["holds"])
        ours = (f"FPS {sc['fps'][metric]:.4g} vs DPS {sc['dps'][metric]:.4g}; diff {bd['diff']:+.3g} "
                f"[{bd['lo']:+.3g}, {bd['hi']:+.3g}] (95% bootstrap over {bd['n']} images, paired)")
      rows.append(_with_reference(
          {"paper": PAPER, "experiment": exp, "metric": f"{metric.upper()} {unit} of {fps_name}".replace("  ", " "),
           "ours": ours,
           "paper_value": "FPS better than DPS-style guidance (paper Tables 1-2, FFHQ / ImageNet 256x256)",
           "holds": holds, "kind": "claim" if "dps" in sc else "measurement", "basis": BETTER,
           "notes": others.lstrip("; ") + _indexing_note(im["num_steps"]), "plots": im["plots"]},
          "references that rule out a bug: the operators' SVDs and the closed-form conditioning match dense "
          "matrices, the c-rate kernel matches the core DDIM/DDPM kernels and the filter matches the exact Kalman "
          "limit (tests); the gap is the method with this prior at this scale (16x16 digits, MLP prior)"))
      if "fps_tele" in sc:
        bd = stats.bootstrap_diff(sc["fps_tele"][f"{metric}_per_image"], sc["fps"][f"{metric}_per_image"])
        rows.append({"paper": PAPER, "experiment": exp,
                     "metric": f"{metric.upper()} {unit} of FPS with telescoping weights vs the paper's".replace("  ", " "),
                     "ours": (f"telescoping {sc['fps_tele'][metric]:.4g} vs paper weights {sc['fps'][metric]:.4g}; "
                              f"diff {bd['diff']:+.3g} [{bd['lo']:+.3g}, {bd['hi']:+.3g}] (95% bootstrap over "
                              f"{bd['n']} images, paired)"),
                     "paper_value": "(beyond the paper; no claim)", "holds": None, "kind": "measurement",
                     "notes": (f"same kernel, particles and measurements; mean ESS/M telescoping "
                               f"{t['mean_ess_fraction'].get('fps_tele', float('nan')):.2f} vs "
                               f"{t['mean_ess_fraction'].get('fps', float('nan')):.2f}; E[x|y] estimate (mean of samples) "
                               f"{sc['fps_tele'].get(metric + '_avg', float('nan')):.4g} vs "
                               f"{sc['fps'].get(metric + '_avg', float('nan')):.4g}"),
                     "plots": im["plots"]})
  return rows


def benchmark(quick: bool = True, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Particles x steps per second of `fps.sample` vs the number of particles M and the image size.

  The denoiser is the image tasks' MLP with random weights (the cost per particle is what is timed), the operator
  a 5 x 5 Gaussian blur (FFT SVD). Particles are vmapped inside one filter; independent images are sharded over
  the mesh's 'data' axis (each runs its own filter): one image on 1 device, and (largest M, smallest size) one
  image per device on all devices. items = images x M x steps.
  """
  cfg = get_config("")
  sched = schedules.from_config(cfg.schedule)
  steps = 10 if quick else 50
  sizes = (16, 32) if quick else (16, 32, 64)
  particles = (1, 8, 64, 256) if quick else (1, 8, 64, 256, 1024)
  model = unet.create_model(ml_collections.ConfigDict({**cfg.model.to_dict()}))
  params_of = {s: model.init(jax.random.key(0), jnp.zeros((1, s, s, 1)), jnp.zeros((1,)))["params"] for s in sizes}

  def make_case(mesh, size_m):
    size, m = size_m
    shape, n_dev, params = (size, size, 1), mesh.devices.size, params_of[size]
    den = lambda x, t: model.apply({"params": params}, x, t)  # noqa: E731
    op = operators.GaussianBlur(5, 1.0, shape)
    data = sharding.data_sharding(mesh)
    fn = jax.jit(jax.vmap(lambda k, y: smc.sample(k, den, sched, op, y, 0.05, m, steps)),
                 in_shardings=(data, data), out_shardings=data)
    keys = jax.device_put(jax.random.split(jax.random.key(1), n_dev), data)
    ys = jax.device_put(jnp.zeros((n_dev,) + op.y_shape), data)
    return fn, (keys, ys), dict(items=n_dev * m * steps, name="fps/sample (items = particle-steps)",
                                size=f"{size}x{size}, M={m}", batch=n_dev, particles=m, num_steps=steps)

  repeats = 3 if quick else 5
  rows = bench.across_devices(make_case, sizes=[(s, m) for s in sizes for m in particles], counts=(1,),
                              repeats=repeats)
  more = [n for n in bench.device_counts() if n > 1]   # all devices: the smallest image, the most particles
  return rows + bench.across_devices(make_case, sizes=[(sizes[0], particles[-1])], counts=more, repeats=repeats)


def scale_program(config, mesh):
  """The paper-size routine for `experiments.scale`: FPS on FFHQ 256 x 256 with the official ADM prior.

  `fps.smc.sample` (measurement sequence, then the particle filter: 1000 c-rate DDIM steps of the 93.6M-parameter
  UNet on 5 particles, multinomial resampling at every step) for 4x super-resolution, vmapped over
  `scale.batch_size` images sharded over 'data' (one image per device, as the official one-image-per-GPU script);
  the UNet's parameters are replicated (375 MB in float32). `configs/fps.py:paper`.

  Args:
    config: `get_config('paper')`.
    mesh: the ('data', 'model') mesh.

  Returns:
    common.scale.Program of fn(params, y [N, 64, 64, 3], keys [N]) -> particles [N, 5, 256, 256, 3] (kind
    'inference').
  """
  from jax.sharding import NamedSharding, PartitionSpec as P
  from iclr24_jax.common import scale as scale_lib
  s = scale_lib.paper_scale(config, PAPER)
  model = unet.create_model(config.model)
  sched = schedules.from_config(config.schedule)
  size = int(config.data.image_size)
  x_shape = (size, size, 3)
  if s.task != "super_resolution":
    raise ValueError(f"scale.task={s.task!r}: the compiled paper routine is 'super_resolution'.")
  op = operators.SuperResolution(int(config.images.sr_factor), x_shape)
  f = config.fps

  def denoiser(params, x_t, t):
    # learn_sigma: the network's first 3 channels are eps, the last 3 the variance interpolation (unused by the
    # c-rate DDIM kernel, as in the official DDIM.p_sample).
    return model.apply({"params": params}, x_t, t)[..., :3]

  def fps_batch(params, y, keys):
    one = lambda k, yi: smc.sample(k, lambda x, t: denoiser(params, x, t), sched, op, yi, float(config.images.sigma),
                                   int(f.num_particles), int(f.num_steps), c=float(f.c), sampler=f.sampler,
                                   resampling=f.resampling, clip_x0=float(f.clip_x0))
    return jax.vmap(one)(keys, y)

  params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1,) + x_shape), jnp.zeros((1,)))["params"])
  data = NamedSharding(mesh, P("data"))
  params_abs = scale_lib.abstract(params, scale_lib.replicated(params, mesh))
  n = int(s.batch_size)
  y = jax.ShapeDtypeStruct((n,) + tuple(op.y_shape), jnp.float32, sharding=data)
  keys = jax.ShapeDtypeStruct((n,), jax.random.key(0).dtype, sharding=data)
  m, steps = int(f.num_particles), int(f.num_steps)
  # Hand count: the UNet forward (unet_flops: 388 GFLOP at 256 x 256) once per particle and step; the operator's
  # SVD products and the resampling are elementwise (not counted).
  hand = float(n * m * steps * unet.unet_flops(model, size, size, 3))
  return scale_lib.Program(
      name=f"FPS-SMC sampler, FFHQ ADM UNet 256x256, {m} particles x {steps} steps", fn=fps_batch,
      args=(params_abs, y, keys), out_shardings=data, params=scale_lib.num_elements(params), items_per_step=n,
      item="images", hand_flops=hand, kind="inference", abstract_params=params_abs,
      notes="One image's filter per device; parameters replicated (375 MB float32). Deviation: the sinusoidal "
            "time features are 256 wide (ADM: 128; +65k parameters).",
      paper_hardware=s.paper_hardware, paper_time=s.paper_time)
