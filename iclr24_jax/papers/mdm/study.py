"""mdm: the small-scale reproductions (`reproduce_seeds`, its one-seed miniature `reproduce`) and the benchmark.

`reproduce_seeds` is the 3-seed study with the sample judge's learning curve (`--only mdm_seeds`, outside the main
job: registry.EXTENDED); `reproduce`, the main job's, runs the same study at one seed without the curve.

The method lives in the package's method modules and `experiment.run`; this module holds the studies
that the paper's claims are checked with (experiments/reproduce.py and experiments/benchmark.py call them).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import bench
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding, stats
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.mdm import train
from iclr24_jax.papers.mdm.experiment import ARM_NAMES, ARMS, PAPER
from iclr24_jax.papers.mdm.judge import train_judge
from iclr24_jax.papers.mdm.programs import Arm, build, inner_kwargs, load_images, loss_kwargs, step_flops


# The paper sentences the claim rows test.
BASIS_BOTH = ("'uses a NestedUNet architecture ... In addition, MDM enables a progressive training schedule from "
              "lower to higher resolutions, which leads to significant improvements in optimization for "
              "high-resolution generation' (abstract; Sec. 5, Fig. 6)")
BASIS_PROGRESSIVE = ("'MDM enables a progressive training schedule from lower to higher resolutions, which leads to "
                     "significant improvements in optimization for high-resolution generation' (abstract; Sec. 3.3)")
BASIS_NESTED = ("'a diffusion process that denoises inputs at multiple resolutions jointly and uses a NestedUNet "
                "architecture' (abstract; Fig. 6: the nested model alone converges faster than a single-resolution "
                "one)")

# Headline claims of the abstract that no row tests yet (experiments/reproduce.py tables them as 'not run').
NOT_RUN = [
    stats.not_run_row(
        paper=PAPER, experiment="text-to-image at 1024x1024 trained on CC12M; zero-shot generalisation",
        metric="zero-shot FID / CLIP score (COCO)",
        basis=("'we can train a single pixel-space model at resolutions of up to 1024x1024 pixels, demonstrating "
               "strong zero-shot generalization using the CC12M dataset' (abstract)"),
        reason="needs CC12M, a text encoder and accelerator-scale training; the rows run 32x32 class-conditional MNIST",
        variant="configs/mdm.py at the paper's size (4 nested levels 64 -> 1024, text conditioning) on accelerators"),
    stats.not_run_row(
        paper=PAPER, experiment="text-to-video (16x256x256, WebVid-10M)", metric="FVD / qualitative",
        basis=("'We demonstrate the effectiveness of our approach on various benchmarks, including class-conditioned "
               "image generation, high-resolution text-to-image, and text-to-video applications' (abstract)"),
        reason="no video data or video NestedUNet here",
        variant="a video arm of the NestedUNet (time as an extra axis) on WebVid-10M"),
]


def budget_plan(flops: dict[str, float], high_res_steps: int, inner_fraction: float, checkpoints: int) -> dict:
  """The study's budget rule: equal high-resolution steps for every arm, the progressive arm's low-resolution
  pre-training on top, and each arm's equal-FLOPs step count for a measurement row.

  * Every arm (single, nested from scratch, progressive) takes H = `high_res_steps` steps at 32x32 and is
    evaluated after round(H (i + 1) / checkpoints) of them, i < checkpoints.
  * The progressive arm first trains the 8x8 UNet for round(inner_fraction H F_nested / F_inner) steps (a fixed
    fraction of the nested arm's high-res FLOPs), then its H nested steps.
  * Equal FLOPs (the previous rule, now a measurement): the steps each arm gets at the nested arm's H F_nested
    train FLOPs per seed -- nested H, single round(H F_nested / F_single), progressive round(H - inner F_inner /
    F_nested); every arm is also evaluated there.

  Args:
    flops: XLA FLOPs of one train step, {'nested', 'single', 'inner'} (`programs.step_flops`).
    high_res_steps: H.
    inner_fraction: the progressive arm's pre-training FLOPs as a fraction of H nested steps' FLOPs.
    checkpoints: evaluations along the H steps (the last at H).

  Returns:
    dict checkpoints [n] (high-res steps), inner_steps, equal_flops {arm: high-res steps}, eval_steps {arm: sorted
    high-res steps at which the arm is evaluated}, train_flops {arm: FLOPs per seed at H, pre-training included}.

  Raises:
    ValueError: non-positive steps or checkpoints, inner_fraction outside [0, 1), or an equal-FLOPs point of the
      progressive arm before its first nested step.
  """
  h, n_ck, frac = int(high_res_steps), int(checkpoints), float(inner_fraction)
  if h < 1 or not 1 <= n_ck <= h or not 0.0 <= frac < 1.0:
    raise ValueError(f"need high_res_steps >= checkpoints >= 1 and 0 <= inner_fraction < 1; got high_res_steps={h}, "
                     f"checkpoints={n_ck}, inner_fraction={frac}.")
  f_nested, f_single, f_inner = (float(flops[k]) for k in ("nested", "single", "inner"))
  ck = [int(round(h * (i + 1) / n_ck)) for i in range(n_ck)]
  inner = int(round(frac * h * f_nested / f_inner))
  eq = {"nested": h, "single": int(round(h * f_nested / f_single)),
        "progressive": int(round(h - inner * f_inner / f_nested))}
  if eq["progressive"] < 1:
    raise ValueError(f"the progressive arm's {inner} pre-training steps use the whole equal-FLOPs budget; lower "
                     "repro.inner_fraction.")
  return {"checkpoints": ck, "inner_steps": inner, "equal_flops": eq,
          "eval_steps": {arm: sorted(set(ck) | {eq[arm]}) for arm in ARMS},
          "train_flops": {"nested": h * f_nested, "single": h * f_single,
                          "progressive": h * f_nested + inner * f_inner}}


# The main job's miniature: where its notes send the reader for the judged claims.
SEEDS_ROWS = ("the 3-seed rows and the sample judge's learning curve are the extended study's (mdm_seeds, "
              "results/rows/mdm_seeds.json; `python -m experiments.reproduce --only mdm_seeds`)")


def reproduce(workdir: str, fast: bool = False, *, get_config: Callable[[str], Any]) -> list[dict]:
  """The main job's miniature of `reproduce_seeds`: one seed, no sample curve (`get_config('one_seed')`).

  The same three arms at the same equal high-res steps, judge included, at seed 0 only. Its claims are the seeded
  study's, so they are recorded as measurements (`stats.miniature_rows`: the one-seed verdict, 'inconclusive' by
  rule since `stats.judge` needs 3 seeds, stays in the notes, which point to the extended study's rows).

  Args:
    workdir: output folder (created).
    fast: run the 'tiny,one_seed' config variant without the judge.
    get_config: `get_config(variant)` of configs/mdm.py (the runners pass it; tests pass the module's).

  Returns:
    list of reproduction row dicts.
  """
  return stats.miniature_rows(_study(workdir, get_config("tiny,one_seed" if fast else "one_seed"), fast),
                               "1 seed, no sample curve", SEEDS_ROWS)


def reproduce_seeds(workdir: str, fast: bool = False, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Nested + progressive vs nested from scratch vs single resolution at equal high-res steps (3 seeds).

  Outside the main job (`python -m experiments.reproduce --only mdm_seeds`, ~860 CPU-s). The budget rule is
  `budget_plan`'s. With the judge on, the single arm of the first seed then trains on to `repro.curve_steps` (the
  sample judge's learning curve: the budget at which samples become digits).

  Args:
    workdir: output folder (created).
    fast: run the 'tiny' config variant without the judge.
    get_config: `get_config(variant)` of configs/mdm.py (the runners pass it; tests pass the module's).

  Returns:
    list of reproduction row dicts.
  """
  return _study(workdir, get_config("tiny" if fast else ""), fast)


def _study(workdir: str, cfg: Any, fast: bool) -> list[dict]:
  """The study on `cfg` (see `reproduce_seeds`); `fast` leaves the judge out."""
  os.makedirs(workdir, exist_ok=True)
  rp = cfg.repro
  t_start = time.time()
  ds, arrays = load_images(cfg.data)
  nets = build(cfg)
  nested, inner, single = nets["nested"], nets["inner"], nets["single"]
  shape = nets["image_shape"]
  low_shape = train.level_shapes(nested, 1, shape)[1][1:]
  seeds = [int(s) for s in rp.seeds]
  b = int(cfg.batch_size)
  lkw, ikw = loss_kwargs(cfg), inner_kwargs(cfg)
  tx = make_optimizer(cfg.optimizer, 10 ** 6)     # constant learning rate after warm-up: no horizon needed
  flops = {"nested": step_flops(nested, nets["schedules"]["nested"], shape, b, tx, lkw),
           "inner": step_flops(inner, nets["schedules"]["inner"], low_shape, b, tx, ikw),
           "single": step_flops(single, nets["schedules"]["single"], shape, b, tx, lkw)}
  plan = budget_plan(flops, int(rp.high_res_steps), float(rp.inner_fraction), int(rp.checkpoints))

  # Evaluation inputs: held-out digits with fixed (t, noise) inside heldout_mse; sample labels 0..9 cycled.
  n_ev = int(rp.eval_examples)
  n_smp = int(rp.samples_per_seed)
  labels = jnp.arange(n_smp) % 10
  eval_kw = (jnp.asarray(arrays["x_eval"][:n_ev]), jnp.asarray(arrays["y_eval"][:n_ev]), labels)
  s = cfg.sampler
  sample_kw = dict(guidance_scale=s.guidance_scale, num_steps=int(rp.sample_steps), method=s.method,
                   eta=float(s.eta), prediction=cfg.diffusion.prediction, clip_x0=s.clip_x0)
  train_arrays = {"x": jnp.asarray(arrays["x_train"]), "y": jnp.asarray(arrays["y_train"])}
  low_arrays = {"x": train.model_pyramid(nested, train_arrays["x"])[1], "y": train_arrays["y"]}

  arm_nested = Arm(nested, nets["schedules"]["nested"], shape, b, tx, lkw, sample_kw, eval_kw)
  arm_single = Arm(single, nets["schedules"]["single"], shape, b, tx, lkw, sample_kw, eval_kw)
  arm_inner = Arm(inner, nets["schedules"]["inner"], low_shape, b, tx, ikw, sample_kw, eval_kw)

  judge = None if fast else train_judge(cfg.judge, arrays)
  # Per seed: key_init, key_train, key_eval (the sampler's key; the held-out (t, noise) is fixed for all).
  keys = {sd: [jax.random.fold_in(jax.random.key(sd), i) for i in range(3)] for sd in seeds}
  results = {arm: {step: dict() for step in plan["eval_steps"][arm]} for arm in ARMS}  # step -> metric -> [seed]
  samples_last = {}
  timing = {arm: dict(seconds=0.0) for arm in ARMS}
  full = plan["checkpoints"][-1]
  curve, curve_start = [], None

  def record(arm_obj, state, arm, step, sd):
    mse, levels, cons = arm_obj.evaluate(state.params, keys[sd][2])
    rec = results[arm][step]
    rec.setdefault("eps_mse", []).append(float(np.asarray(mse)[0]))
    if len(levels) > 1:
      rec.setdefault("consistency", []).append(float(np.mean(cons)))
    if judge is not None:
      sc = judge.score(np.asarray(levels[0]), np.asarray(labels), jax.random.key(1000 + step))
      for k in ("accuracy", "feature_sw", "feature_sw_floor"):
        rec.setdefault(k, []).append(sc[k])
    if sd == seeds[0] and step == full:
      samples_last[arm] = [np.asarray(lv) for lv in levels]

  def train_through(arm_obj, state, arm, sd, k_train):
    done = 0
    for step in plan["eval_steps"][arm]:
      state, _ = arm_obj.train(state, k_train, train_arrays, step - done)
      done = step
      record(arm_obj, state, arm, step, sd)
    return state, done

  for sd in seeds:
    k_init, k_train, _ = keys[sd]
    # Single resolution and nested from scratch: H high-res steps from a fresh init.
    for arm, arm_obj in (("single", arm_single), ("nested", arm_nested)):
      t0 = time.time()
      state, done = train_through(arm_obj, arm_obj.init(k_init), arm, sd, k_train)
      timing[arm].update(steps=plan["checkpoints"][-1], seconds=timing[arm]["seconds"] + time.time() - t0)
      print(f"[mdm] seed {sd} {arm}: {done} high-res steps, {time.time() - t0:.0f} s", flush=True)
      if arm == "single" and sd == seeds[0]:
        curve_start = (state, done)    # the sample curve continues this run once every arm is done
    # Progressive: the low-resolution UNet first, then H steps of the NestedUNet with it loaded.
    t0 = time.time()
    st_in = arm_inner.init(k_init)
    st_in, _ = arm_inner.train(st_in, k_train, low_arrays, plan["inner_steps"])
    state = arm_nested.init(jax.random.fold_in(k_init, 7), st_in.params)
    train_through(arm_nested, state, "progressive", sd, jax.random.fold_in(k_train, 7))
    timing["progressive"].update(inner_steps=plan["inner_steps"], steps=plan["checkpoints"][-1],
                                 seconds=timing["progressive"]["seconds"] + time.time() - t0)
    print(f"[mdm] seed {sd} progressive: {plan['inner_steps']} 8x8 + {full} high-res steps, {time.time() - t0:.0f} s",
          flush=True)
  if judge is not None and rp.curve_steps:
    sd = seeds[0]
    curve = sample_curve(arm_single, *curve_start, keys[sd][1], train_arrays, [int(v) for v in rp.curve_steps],
                         judge, keys[sd][2], int(rp.curve_samples),
                         log_path=os.path.join(workdir, "sample_curve.json"))
  results = {arm: {st: {k: np.asarray(v) for k, v in rec.items()} for st, rec in recs.items()}
             for arm, recs in results.items()}

  rows = _rows(cfg, results, plan, flops, timing, judge, workdir, samples_last, labels, curve, fast,
               time.time() - t_start)
  return rows if fast else qualify(rows, cfg.model.num_classes, budget_steps=full,
                                   curve_note=_curve_summary(curve, cfg.model.num_classes, plan, len(seeds)))


def sample_curve(arm_obj: Arm, state: Any, done: int, key_train: jax.Array, arrays: dict, steps: list[int],
                 judge: Any, key_sample: jax.Array, num_samples: int, log_path: str | None = None) -> list[dict]:
  """The sample judge's learning curve of one arm and seed: train on to each of `steps`, judge fresh samples.

  Args:
    arm_obj: the arm's compiled programs (`programs.Arm`).
    state: its TrainState after `done` high-res steps.
    done: steps already taken.
    key_train: the seed's training key (the batches follow state.step, so the run continues its own stream).
    arrays: {'x': [N, H, W, C], 'y': [N]} training digits.
    steps: increasing high-res step counts (> done) to evaluate at.
    judge: the `judge.Judge`.
    key_sample: the sampler's key.
    num_samples: samples per point (labels 0..9 cycled).
    log_path: optional JSON file rewritten after every point (the curve so far survives an interrupted run).

  Returns:
    list of {'step', 'eps_mse', 'accuracy', 'feature_sw', 'feature_sw_floor', 'cpu_s_per_step'} (process CPU
    seconds per training step of that stretch, threads included).

  Raises:
    ValueError: steps not increasing past `done`.
  """
  if any(b <= a for a, b in zip([done] + list(steps), steps)):
    raise ValueError(f"curve steps must increase past the {done} steps already taken; got {steps}.")
  labels = jnp.arange(num_samples) % 10
  out = []
  for step in steps:
    c0 = time.process_time()
    state, _ = arm_obj.train(state, key_train, arrays, step - done)
    jax.block_until_ready(state.params)
    per_step = (time.process_time() - c0) / (step - done)
    done = step
    mse, levels, _ = arm_obj.evaluate(state.params, key_sample, labels)
    sc = judge.score(np.asarray(levels[0]), np.asarray(labels), jax.random.key(1000 + step))
    out.append(dict(step=step, eps_mse=float(np.asarray(mse)[0]), cpu_s_per_step=per_step,
                    **{k: sc[k] for k in ("accuracy", "feature_sw", "feature_sw_floor")}))
    if log_path:
      with open(log_path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"[mdm] sample curve {step} steps: accuracy {sc['accuracy']:.2f}, eps-MSE {out[-1]['eps_mse']:.4f}, "
          f"{per_step:.3f} CPU-s/step", flush=True)
  return out


def _curve_summary(curve: list[dict], num_classes: int, plan: dict, num_seeds: int) -> str:
  """One sentence for the rows' notes: where the judge's accuracy clears 2 / C and 0.5 on the curve, and what the
  3-arm study would cost there at the measured CPU seconds per step."""
  if not curve:
    return ""
  pts = ", ".join(f"{c['step']}: {c['accuracy']:.2f}" for c in curve)
  per_step = float(np.median([c["cpu_s_per_step"] for c in curve]))

  def first(th):
    return next((c["step"] for c in curve if c["accuracy"] >= th), None)

  def cost(n):
    # three arms x seeds x n high-res steps (the progressive arm's pre-training is ~a quarter more nested steps)
    return 3 * num_seeds * n * per_step

  chance2, half = first(2.0 / num_classes), first(0.5)
  s = f"Sample-quality budget (single arm, first seed; judge accuracy by high-res step {pts}): "
  s += (f"twice chance at {chance2} steps" if chance2 else f"below twice chance up to {curve[-1]['step']} steps")
  s += (f", 0.5 at {half} steps (the 3-arm x {num_seeds}-seed study there: ~{cost(half):,.0f} CPU-s at the measured "
        f"{per_step:.3f} CPU-s per step)" if half else
        f", below 0.5 up to {curve[-1]['step']} steps (the 3-arm x {num_seeds}-seed study at that many steps alone: "
        f"~{cost(curve[-1]['step']):,.0f} CPU-s at the measured {per_step:.3f} CPU-s per step)")
  return s + ". "


SAMPLE_METRICS = ("MNIST-CNN accuracy on samples", "sliced W2 of CNN features")
QUALIFIED = ("# judged", "# 'no' at this budget", "# inconclusive at this budget")   # `qualify`'s note prefixes
REFERENCES = ("references that rule out a bug in the nesting and the progressive load (tests/papers/test_mdm.py): "
              "with zero-initialised adapters and a trained inner UNet loaded by load_inner, the NestedUNet's "
              "low-resolution output equals the standalone inner UNet's exactly; the joint loss matches a hand "
              "computation; a train step lowers the loss on a fixed batch. ")


def qualify(rows: list[dict], num_classes: int, budget_steps: int, curve_note: str = "") -> list[dict]:
  """Applies the reproduction rule to the comparison rows once every arm's numbers are in.

  A claim is judged only where the run could show it:

  * Sample-quality rows (classifier accuracy, feature sliced W2) are 'inconclusive' when no arm's samples are
    recognisable digits (every arm's mean accuracy below 2 / num_classes, i.e. within twice chance): a difference
    between noise images says nothing about the paper's sample-quality claim.
  * A 'no' that stands names the references that ruled out a bug and the budget it was measured at.
  * A claim measured 'inconclusive' says it is so at this budget, and (sample rows at chance) why.

  Args:
    rows: the rows of `_rows` (dicts with metric, holds, notes and, where compared, judgement['mean_a' / 'mean_b']).
    num_classes: C (chance accuracy 1 / C).
    budget_steps: the high-res steps per arm and seed (stated in the notes).
    curve_note: what the sample judge's learning curve says about the budget (`_curve_summary`), added to the
      notes of every row this rule qualifies.

  Returns:
    The same rows, qualified (new dicts).
  """
  accs = [r for r in rows if r["metric"].startswith("MNIST-CNN accuracy on samples")]
  best = max([max(r["judgement"]["mean_a"], r["judgement"]["mean_b"]) for r in accs] or [1.0])
  at_chance = best < 2.0 / num_classes
  budget = (f"Budget: {budget_steps} high-res steps per arm and seed (the progressive arm's 8x8 pre-training on "
            "top), the first phase of training (the paper trains for hundreds of thousands of steps). ")
  out = []
  for r in rows:
    r = dict(r)
    if (r.get("notes") or "").startswith(QUALIFIED):   # qualified already
      out.append(r)
      continue
    if at_chance and r["metric"].startswith(SAMPLE_METRICS) and r.get("holds") in ("yes", "no"):
      r["notes"] = (f"# judged 'inconclusive', measured '{r['holds']}': no arm's samples are digits yet (best mean "
                    f"accuracy {best:.2f}, chance {1.0 / num_classes:.2f}), so the sample metrics cannot judge "
                    "the claim at this budget. " + curve_note + (r.get("notes") or ""))
      r["holds"] = "inconclusive"
    elif r.get("holds") == "no":
      r["notes"] = ("# 'no' at this budget only: " + REFERENCES + budget + curve_note + (r.get("notes") or ""))
    elif r.get("holds") == "inconclusive" and r.get("kind") == "claim":
      why = (f"no arm's samples are digits yet (best mean accuracy {best:.2f}, chance {1.0 / num_classes:.2f}), so "
             "the sample metrics cannot judge the claim here. " if at_chance and r["metric"].startswith(SAMPLE_METRICS)
             else "")
      r["notes"] = "# inconclusive at this budget: " + why + budget + curve_note + (r.get("notes") or "")
    out.append(r)
  return out


def _mean_se_str(x):
  m, se = stats.mean_se(x)
  return f"{m:.4g}+-{se:.2g}"


def _rows(cfg, results, plan, flops, timing, judge, workdir, samples_last, labels, curve, fast, seconds):
  full = plan["checkpoints"][-1]
  inner = plan["inner_steps"]
  exp = (f"MNIST-5k 32->8 (2 levels), {full} high-res steps per arm (progressive: {inner} 8x8 steps first), "
         f"{len(cfg.repro.seeds)} seeds") if not fast else "tiny digits 16->8 (plumbing check)"
  budget_note = (f"budget rule: equal high-res steps ({full} per arm and seed), the progressive arm's {inner} 8x8 "
                 f"pre-training steps on top; train FLOPs per seed: single {plan['train_flops']['single'] / 1e12:.3f} "
                 f"T, nested {plan['train_flops']['nested'] / 1e12:.3f} T, progressive "
                 f"{plan['train_flops']['progressive'] / 1e12:.3f} T; XLA FLOPs/step (batch {cfg.batch_size}): nested "
                 f"{flops['nested'] / 1e9:.2f} G, single {flops['single'] / 1e9:.2f} G, inner "
                 f"{flops['inner'] / 1e9:.2f} G; measured s: "
                 + ", ".join(f"{k} {v['seconds']:.0f}" for k, v in timing.items()))
  plots = _plot_curves(results, workdir)
  grid = os.path.join(workdir, "samples_final.png")
  _plot_arms(samples_last, np.asarray(labels), grid, full)
  plots = plots + [grid]
  claim = "nested + progressive converges faster than a single-resolution model (Sec. 5, Fig. 6 / Table 4)"
  rows = []
  pr, ne, si = results["progressive"][full], results["nested"][full], results["single"][full]
  if fast:
    rows.append(dict(paper=PAPER, experiment=exp, metric=f"held-out 32x32 eps-MSE after {full} high-res steps",
                     ours=f"progressive {_mean_se_str(pr['eps_mse'])}, nested {_mean_se_str(ne['eps_mse'])}, single "
                          f"{_mean_se_str(si['eps_mse'])}", paper_value=claim, holds=None, kind="measurement",
                     notes=budget_note, plots=plots))
    return rows
  at = f"after {full} high-res steps"
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric=f"held-out high-res eps-MSE {at} (lower is better)",
      a=pr["eps_mse"], b=si["eps_mse"], name_a="nested+progressive", name_b="single-res", direction="less",
      paper_value=claim, notes=budget_note, plots=plots, kind="claim", basis=BASIS_BOTH))
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric=f"MNIST-CNN accuracy on samples of the requested digit ({at})",
      a=pr["accuracy"], b=si["accuracy"], name_a="nested+progressive", name_b="single-res", direction="greater",
      paper_value=claim + "; FID in the paper, a digit classifier here",
      notes=f"{cfg.repro.samples_per_seed} samples/seed, DDIM {cfg.repro.sample_steps} steps, CFG w="
            f"{cfg.sampler.guidance_scale}; the CNN scores {judge.test_accuracy:.3f} on real held-out digits",
      plots=plots, kind="claim", basis=BASIS_BOTH))
  floor = np.mean([pr["feature_sw_floor"], si["feature_sw_floor"]])
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric=f"sliced W2 of CNN features, samples vs real digits ({at})",
      a=pr["feature_sw"], b=si["feature_sw"], name_a="nested+progressive", name_b="single-res", direction="less",
      paper_value=claim + "; FID in the paper", notes=f"data-vs-data floor {floor:.3g} at the same sample size",
      plots=plots, kind="claim", basis=BASIS_BOTH))
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric=f"held-out high-res eps-MSE {at}: progressive vs scratch",
      a=pr["eps_mse"], b=ne["eps_mse"], name_a="nested+progressive", name_b="nested (scratch)", direction="less",
      paper_value="progressive training (low resolution first) speeds up the nested model (Sec. 3.3)",
      notes=budget_note, plots=plots, kind="claim", basis=BASIS_PROGRESSIVE))
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric=f"MNIST-CNN accuracy on samples: progressive vs scratch ({at})",
      a=pr["accuracy"], b=ne["accuracy"], name_a="nested+progressive", name_b="nested (scratch)", direction="greater",
      paper_value="progressive training (low resolution first) speeds up the nested model (Sec. 3.3)",
      notes="", plots=plots, kind="claim", basis=BASIS_PROGRESSIVE))
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric=f"held-out high-res eps-MSE {at}: nested (scratch) vs single",
      a=ne["eps_mse"], b=si["eps_mse"], name_a="nested (scratch)", name_b="single-res", direction="less",
      paper_value="the nested UNet alone (no progressive stage) also beats the single-resolution baseline (Fig. 6)",
      notes=budget_note, plots=plots, kind="claim", basis=BASIS_NESTED))
  # The equal-FLOPs counterpart (the previous rule): every arm at the nested arm's train FLOPs, no verdict.
  eq = plan["equal_flops"]
  at_eq = {arm: results[arm][eq[arm]]["eps_mse"] for arm in ARMS}
  d_ps, d_pn = stats.mean_se(at_eq["progressive"] - at_eq["single"]), stats.mean_se(at_eq["progressive"]
                                                                                     - at_eq["nested"])
  rows.append(dict(
      paper=PAPER, experiment=exp, metric="held-out high-res eps-MSE at equal train FLOPs (the nested arm's "
      f"{plan['train_flops']['nested'] / 1e12:.3f} TFLOP per seed)",
      ours=(", ".join(f"{ARM_NAMES[a]} ({eq[a]} high-res steps) {_mean_se_str(at_eq[a])}" for a in ARMS)
            + f"; progressive - single {d_ps[0]:+.4f}+-{d_ps[1]:.2g}, progressive - scratch {d_pn[0]:+.4f}+-"
              f"{d_pn[1]:.2g} (paired by seed)"),
      paper_value=claim, holds=None, kind="measurement",
      notes=(f"the progressive arm's {inner} 8x8 steps count against its budget here, leaving it "
             f"{eq['progressive']} nested steps against {eq['nested']} (scratch) and {eq['single']} (single); an "
             "evaluation along the same runs as the claim rows, not a separate training"), plots=plots))
  curve_txt = "; ".join(
      f"{st}: " + ", ".join(f"{a} mse {np.mean(results[a][st]['eps_mse']):.3f} acc "
                            f"{np.mean(results[a][st]['accuracy']):.2f}" for a in ARMS)
      for st in plan["checkpoints"])
  rows.append(dict(paper=PAPER, experiment=exp,
                   metric=f"learning curves (mean over seeds) at {', '.join(map(str, plan['checkpoints']))} high-res "
                   "steps", ours=curve_txt, paper_value=claim, holds=None, kind="measurement",
                   notes=f"reproduction wall time {seconds:.0f} s", plots=plots))
  rows.append(dict(paper=PAPER, experiment=exp, metric="cross-level consistency ||avgpool(x32) - x8||^2 of joint "
                   "samples (per pixel, [-1, 1] scale)",
                   ours=f"progressive {_mean_se_str(pr['consistency'])}, nested {_mean_se_str(ne['consistency'])}",
                   paper_value="joint sampling keeps the resolutions consistent (a measurement, no claim)",
                   holds=None, kind="measurement", notes="", plots=[grid]))
  if curve:
    path = _plot_sample_curve(curve, judge.test_accuracy, cfg.model.num_classes, workdir)
    rows.append(dict(
        paper=PAPER, experiment=f"MNIST-5k 32x32, single-resolution arm, seed {cfg.repro.seeds[0]}: sample judge "
        "by training step", metric=f"MNIST-CNN accuracy on {cfg.repro.curve_samples} samples (10 digits cycled) by "
        "high-res step",
        ours="; ".join(f"{c['step']}: acc {c['accuracy']:.2f}, feature SW {c['feature_sw']:.3g}, eps-MSE "
                       f"{c['eps_mse']:.4f}" for c in curve),
        paper_value="(the budget at which the sample-quality rows can judge the claim; no claim)", holds=None,
        kind="measurement",
        notes=(_curve_summary(curve, cfg.model.num_classes, plan, len(cfg.repro.seeds))
               + f"The same run continued past its {plan['eval_steps']['single'][-1]} study steps (same batches, "
               "optimiser and sampler); the "
               f"CNN scores {judge.test_accuracy:.3f} on real held-out digits; feature SW floor "
               f"{np.mean([c['feature_sw_floor'] for c in curve]):.3g}"),
        plots=[path]))
  return rows


def _plot_sample_curve(curve, real_accuracy, num_classes, workdir):
  path = os.path.join(workdir, "sample_curve.png")
  fig, axes = metrics_lib.new_figure(ncols=2, size=(3.6, 3.0))
  steps = [c["step"] for c in curve]
  ax = axes[0, 0]
  ax.plot(steps, [c["accuracy"] for c in curve], marker="o")
  ax.axhline(1.0 / num_classes, color="gray", ls=":", lw=1, label="chance")
  ax.axhline(2.0 / num_classes, color="gray", ls="--", lw=1, label="2 x chance (judging rule)")
  ax.axhline(real_accuracy, color="k", ls="-.", lw=1, label="real digits")
  ax.set_xscale("log")
  ax.set_xlabel("high-res train steps (batch 16)")
  ax.set_title("judge accuracy on samples", fontsize=9)
  ax.legend(fontsize=6)
  ax = axes[0, 1]
  ax.plot(steps, [c["eps_mse"] for c in curve], marker="o")
  ax.set_xscale("log")
  ax.set_xlabel("high-res train steps (batch 16)")
  ax.set_title("held-out 32x32 eps-MSE", fontsize=9)
  fig.suptitle("single-resolution arm, seed 0", fontsize=9)
  metrics_lib.save_figure(fig, path)
  return path


def _plot_curves(results, workdir):
  path = os.path.join(workdir, "curves.png")
  first = results["single"][min(results["single"])]
  keys = [k for k in ("eps_mse", "accuracy", "feature_sw") if first.get(k) is not None]
  fig, axes = metrics_lib.new_figure(ncols=len(keys), size=(3.6, 3.0))
  for ax, k in zip(axes[0], keys):
    for arm in ARMS:
      steps = sorted(results[arm])
      ms = [stats.mean_se(results[arm][st][k]) for st in steps]
      ax.errorbar(steps, [m for m, _ in ms], yerr=[2 * se for _, se in ms], marker="o", capsize=3,
                  label=ARM_NAMES[arm])
    ax.set_xlabel("high-res train steps per seed")
    ax.set_title(k, fontsize=9)
  axes[0, 0].legend(fontsize=7)
  metrics_lib.save_figure(fig, path)
  return [path]


def _plot_arms(samples_last, labels, path, steps, per_class=2):
  order = np.concatenate([np.where(labels == c)[0][:per_class] for c in range(10)])
  tiles = []
  for arm in ARMS:
    tiles.extend(samples_last[arm][0][order])
  grid = (np.stack(tiles) + 1.0) / 2.0
  return metrics_lib.plot_image_grid(grid, path, ncols=len(order),
                                     title=f"seed 0, {steps} high-res steps; rows: "
                                     + " / ".join(ARM_NAMES[a] for a in ARMS))


def benchmark(quick: bool = True, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Train step/s of the NestedUNet vs the single-resolution UNet (same outer size), on 1 and all devices."""
  cfg = get_config("")
  nets = build(cfg)
  lkw = loss_kwargs(cfg)
  tx = make_optimizer(cfg.optimizer, 1000)
  batch_size = 32 if quick else 128
  rng = np.random.default_rng(0)
  x = rng.uniform(-1, 1, (batch_size,) + nets["image_shape"]).astype(np.float32)
  y = (np.arange(batch_size) % 10).astype(np.int32)

  def make_case(mesh, name):
    model, scheds = nets[name], nets["schedules"][name]
    state = jax.jit(lambda k: TrainState.create(train.init_params(k, model, nets["image_shape"]), tx),
                    out_shardings=sharding.replicated_sharding(mesh))(jax.random.key(0))
    fn = loop_lib.compile_step(train.make_train_step(model, scheds, **lkw), mesh)
    return (fn, (state, sharding.shard_batch({"x": x, "y": y}, mesh), jax.random.key(1)),
            dict(items=batch_size, name=f"mdm/{name}_train_step", size="32x32" + ("+8x8" if name == "nested" else ""),
                 batch=batch_size))

  return bench.across_devices(make_case, sizes=("nested", "single"), carry=True, repeats=3 if quick else 10)


def scale_program(config, mesh):
  """The paper-size step for `experiments.scale`: one NestedUNet train step on ImageNet 256 x 256.

  The official 256 x 256 NestedUNet (outer 256 -> 64 around the 64 -> 16 inner UNet with 1 and 5 attention
  layers), class-conditional, v-prediction with the eps-space loss on both levels, mixed ratio 2:1 (the 256 level on
  the first two thirds of the batch), Adam with clipping; float32 parameters and moments FSDP-sharded over 'data',
  the batch over 'data' (`configs/mdm.py:paper`).

  Args:
    config: `get_config('paper')`.
    mesh: the ('data', 'model') mesh.

  Returns:
    common.scale.Program of `train.make_train_step` (state, {'x', 'y'}, key) -> (state, metrics).
  """
  from jax.sharding import NamedSharding, PartitionSpec as P
  from iclr24_jax.common import scale as scale_lib
  from iclr24_jax.diffusion import unet as unet_lib
  s = scale_lib.paper_scale(config, PAPER)
  built = build(config)
  model, scheds = built["nested"], built["schedules"]["nested"]
  size = int(config.data.image_size)
  image_shape = (size, size, 3)                      # ImageNet colour images (build()'s shape is the study's grey)
  tx = make_optimizer(config.optimizer, int(config.num_steps))
  state = jax.eval_shape(lambda: TrainState.create(train.init_params(jax.random.key(0), model, image_shape), tx))
  state_sh = scale_lib.train_state_shardings(state, scale_lib.fsdp_shardings(state.params, mesh), mesh)
  b = int(s.batch_size)
  batch = {"x": jax.ShapeDtypeStruct((b,) + image_shape, jnp.float32), "y": jax.ShapeDtypeStruct((b,), jnp.int32)}
  rep = NamedSharding(mesh, P())
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=rep)
  loss_kw = loss_kwargs(config)
  # Hand count (forward x 3 for a training step): the outer UNet at 256 x 256 on the mixed ratio's first rows, the
  # two zero-initialised 3 x 3 adapters at the 64 x 64 bottleneck (256 -> 256 channels) on those rows, the inner
  # UNet at 64 x 64 on every row.
  outer, inner = model.outer, model.inner           # make_model built the outer with mid_blocks=False
  b_high = int(loss_kw["mixed_ratio"][0] * b) if loss_kw["mixed_ratio"] else b
  low = size // model.factor
  adapters = 2 * 2.0 * low * low * 9 * outer.base_channels * outer.channel_mults[-1] * inner.base_channels
  forward = (b_high * (unet_lib.unet_flops(outer, size, size, 3) + adapters)
             + b * unet_lib.unet_flops(inner, low, low, 3))
  state_abs = scale_lib.abstract(state, state_sh)
  return scale_lib.Program(
      name="MDM NestedUNet 256x256 train step (ImageNet, mixed ratio 2:1)",
      fn=train.make_train_step(model, scheds, **loss_kw),
      args=(state_abs, scale_lib.abstract(batch, scale_lib.batch_shardings(batch, mesh)), key),
      out_shardings=(state_sh, rep), donate_argnums=(0,), carry=True, params=scale_lib.num_elements(state.params),
      items_per_step=b, item="images", hand_flops=3.0 * forward, kind="train", abstract_params=state_abs.params,
      notes="Deviations: a class embedding (1,000 ImageNet labels) instead of the official text path (flan-t5-xl "
            "features, cross-attention in the inner UNet, conditioning_feature_proj_dim 2048); no micro-conditioning "
            "MLP (micro_conditioning scale:256); float32 as the official fp16 0.",
      paper_hardware=s.paper_hardware, paper_time=s.paper_time)
