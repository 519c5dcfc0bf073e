"""daclip: the small-scale reproductions (`reproduce_seeds`, its one-seed miniature `reproduce`) and the benchmark.

`reproduce_seeds` is the 3-seed study (`--only daclip_seeds`, outside the main job: registry.EXTENDED);
`reproduce`, the main job's, runs the same stages at one controller and one restorer seed.

The method lives in the package's method modules and `experiment.run`; this module holds the study that the
paper's claims are checked with (experiments/reproduce.py and experiments/benchmark.py call it).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import bench, stats
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.daclip import experiment
from iclr24_jax.papers.daclip import restoration
from iclr24_jax.papers.daclip import model as model_lib

PAPER = experiment.PAPER
# The paper sentences the claim rows test.
BASIS_RESTORE = ("'Our approach advances state-of-the-art performance on both degradation-specific and unified image "
                 "restoration tasks' (abstract; Tables 1-2, ablation)")
BASIS_TYPE = ("'The controller itself will also output a degradation feature that matches the real corruptions of the "
              "input, yielding a natural classifier for different degradation types' (abstract)")

# Headline claims of the abstract that no row tests yet (experiments/reproduce.py tables them as 'not run').
NOT_RUN = [
    stats.not_run_row(
        paper=PAPER, experiment="degradation-specific restoration: one degradation type per restorer",
        metric="PSNR / SSIM / LPIPS against IR-SDE",
        basis=BASIS_RESTORE, reason="the rows run the unified (multi-degradation) setting only",
        variant="configs/daclip.py with one degradation type per restorer, DA-CLIP vs IR-SDE over seeds"),
]


def _item_row(experiment_name: str, metric: str, a, b, name_a: str, name_b: str, paper_value: str | None,
              kind: str, basis: str = "", notes: str = "", direction: str = "greater", fmt: str = ".3f",
              **extra) -> dict:
  """A row comparing per-item values of two arms on the same test items (paired bootstrap over the items).

  A claim or a check takes the bootstrap's verdict; a measurement keeps it in `judgement` only.
  """
  res = stats.bootstrap_diff(a, b, paired=True, direction=direction)
  ours = (f"{name_a} {res['mean_a']:{fmt}} vs {name_b} {res['mean_b']:{fmt}}; diff {res['diff']:+{fmt}} "
          f"[95% CI {res['lo']:+{fmt}}, {res['hi']:+{fmt}}] ({res['n']} held-out images, paired bootstrap)")
  row = dict(paper=PAPER, experiment=experiment_name, metric=metric, ours=ours, paper_value=paper_value,
             holds=None if kind == "measurement" else res["holds"], notes=notes, judgement=res, kind=kind, **extra)
  if basis:
    row["basis"] = basis
  return row


def _fmt_boot(d: dict, fmt: str) -> str:
  return f"diff {d['diff']:+{fmt}} [95% CI {d['lo']:+{fmt}}, {d['hi']:+{fmt}}]"


# The main job's miniature: where its notes send the reader for the judged claims.
SEEDS_ROWS = ("the seed-judged rows are in the extended study's (daclip_seeds: 3 controller and 3 restorer seeds, "
              "results/rows/daclip_seeds.json; `python -m experiments.reproduce --only daclip_seeds`)")


def reproduce(workdir: str, fast: bool = False, restoration: bool = True,
              *, get_config: Callable[[str], Any]) -> list[dict]:
  """The main job's miniature of `reproduce_seeds`: one controller and one restorer seed (`get_config('one_seed')`).

  The same stages on the same data at one seed. Its claims and checks are the seeded study's, so they are
  recorded as measurements (`stats.miniature_rows`): the one-seed verdict (over seeds 'inconclusive' by rule; a
  paired bootstrap over the held-out images where the row has one) stays in the notes, which point to the
  extended study's judged rows.

  Args:
    workdir: output folder (the run goes to workdir/run).
    fast: the 'tiny,one_seed' config variant.
    restoration: also run the restorers (stage 2).
    get_config: `get_config(variant)` of configs/daclip.py (the runners pass it; tests pass the module's).

  Returns:
    list of reproduction row dicts.
  """
  return stats.miniature_rows(_study(workdir, get_config("tiny,one_seed" if fast else "one_seed"), fast, restoration),
                               "1 seed", SEEDS_ROWS)


def reproduce_seeds(workdir: str, fast: bool = False, restoration: bool = True,
                    *, get_config: Callable[[str], Any]) -> list[dict]:
  """The full study (outside the main job: `python -m experiments.reproduce --only daclip_seeds`).

  3 controller seeds and 3 restorer seeds per condition (about 1,700 CPU-s, too heavy for the main job); see
  `_study`.

  Args:
    workdir: output folder (the run goes to workdir/run).
    fast: the 'tiny' config variant.
    restoration: also run the restorers (stage 2).
    get_config: `get_config(variant)` of configs/daclip.py (the runners pass it; tests pass the module's).

  Returns:
    list of reproduction row dicts.
  """
  return _study(workdir, get_config("tiny" if fast else ""), fast, restoration)


def _study(workdir: str, cfg: Any, fast: bool, restoration: bool) -> list[dict]:
  """DA-CLIP on the 7-type degradation suite of 32x32 MNIST-5k digits (see README.md for the setting).

  (a) degradation-type accuracy of e_d (zero-shot: nearest degradation-name embedding) on held-out degraded
  images, judged against a supervised linear probe on the frozen encoder's features (the claim; per-item paired
  bootstrap of the accuracy averaged over the controller seeds), beside the frozen encoder zero-shot (a check: its
  text tower never saw the degradation words). (b) IR-SDE restorers with no embedding / DA-CLIP / shuffled e_d /
  oracle one-hot, 3 seeds each (paired by seed), judged by the held-out matching loss of every condition and by
  the PSNR of the posterior mean (`restore_samples` chains) of none and DA-CLIP. restoration=False runs (a) only.

  Args:
    workdir: output folder (the run goes to workdir/run, a fast one to workdir/run_tiny).
    cfg: the daclip config (configs/daclip.py).
    fast: a smoke run (the tiny config: no progress lines, its own run folder).
    restoration: also run (b).

  Returns:
    list of reproduction row dicts.
  """
  cfg.restoration = bool(restoration)
  t0 = time.time()
  # The tiny and the full run resume in their own folders: one workdir holds the stages of one config (a rerun
  # with another config is refused, `common.loop.Stages.from_config`).
  res = experiment.run(cfg, os.path.join(workdir, "run_tiny" if fast else "run"), progress=not fast)
  items = res["accuracy_items"]
  plots = res["plots"]
  setting = (f"{res['num_train']} degraded training / {res['num_test']} held-out test digits "
             f"({cfg.data.image_size}x{cfg.data.image_size} grey, 7 degradation types)")
  by_seed = res["accuracy_by_seed"]
  n_ctrl = len(by_seed["ed_zero_shot"])
  seed0 = stats.bootstrap_diff(items["ed_zero_shot"], items["frozen_zero_shot"], paired=True)
  ec_m, ec_se = stats.mean_se(by_seed["content_ec"]) if n_ctrl > 1 else (by_seed["content_ec"][0], float("nan"))
  # e_d's per-item accuracy averaged over the controller seeds: the bootstrap over images then carries both the
  # test-set and the controller-seed variation; the probe is one classifier (the frozen features do not depend on
  # the controller seed).
  ed_items = np.mean(np.asarray(res["accuracy_items_by_seed"]["ed_zero_shot"], float), axis=0)
  probe = res["linear_probe"]
  rows = [
      stats.compare_row(
          paper=PAPER, experiment="degradation-type classification from e_d (zero-shot) vs the frozen CLIP encoder "
          "(zero-shot)", metric="accuracy", a=by_seed["ed_zero_shot"], b=float(np.mean(items["frozen_zero_shot"])),
          name_a="DA-CLIP e_d", name_b="frozen CLIP", paired=False,
          paper_value="DA-CLIP classifies the degradation type near perfectly, where CLIP's image embedding does not "
                      "(Sec. 4, degradation-type classification)",
          kind="check", basis=("a check, not evidence for 'a natural classifier for different degradation types' "
                               "(abstract): the frozen encoder's text tower never saw the degradation words, so it "
                               "is at chance by construction; the claim row is the linear-probe comparison"),
          notes=(f"{setting}; {n_ctrl} controller seeds on one CLIP (fixed, like the paper's pretrained OpenCLIP, so "
                 f"the frozen encoder's accuracy is one number); seed 0 over test images: diff {seed0['diff']:+.3f} "
                 f"[95% CI {seed0['lo']:+.3f}, {seed0['hi']:+.3f}] (paired bootstrap). Chance = 1/7.")),
      _item_row("degradation-type classification: e_d zero-shot vs a supervised linear probe on the frozen encoder",
                "accuracy", ed_items, items["frozen_linear_probe"],
                f"DA-CLIP e_d (zero-shot, mean of {n_ctrl} controllers)", "linear probe on frozen features",
                "DA-CLIP's degradation feature classifies the degradation type (abstract; Sec. 4)", kind="claim",
                basis=BASIS_TYPE + "; judged against the best linear classifier the frozen features allow",
                notes=(f"{setting}. The probe: multinomial logistic regression on the frozen encoder's features of the "
                       f"same {res['num_train']} degraded training images the controller trained on, with their "
                       f"labels, L2 strength chosen by 5-fold cross-validation on them (C = {probe['C']:g}, CV "
                       f"accuracy {probe['cv_accuracy']:.3f}). e_d per controller seed: "
                       + ", ".join(f"{v:.3f}" for v in by_seed["ed_zero_shot"])
                       + ". The bootstrap resamples test images of the seed-averaged per-image accuracy.")),
      _item_row("content (digit) zero-shot accuracy on degraded images: e_c vs the frozen encoder", "accuracy",
                items["content_ec"], items["content_frozen"], "DA-CLIP e_c", "frozen CLIP", None, kind="measurement",
                notes=(f"Measurement: e_c is trained to match the clean caption from the degraded image; seed 0 shown, "
                       f"over {n_ctrl} controller seeds e_c reaches {ec_m:.3f} +- {ec_se:.3f}.")),
  ]
  if "restoration" not in res:
    rows.append(dict(paper=PAPER, experiment="multi-degradation restoration: IR-SDE + DA-CLIP embeddings vs IR-SDE "
                     "without", metric="held-out matching loss / PSNR", ours="not run (restoration=False)",
                     paper_value=None, holds=None, kind="measurement",
                     notes="The restorer stage (IR-SDE UNets + T=100 sampling) was skipped in this run."))
    return rows
  rs = res["restoration"]
  pc, single, inp, loss = rs["per_condition"], rs["single_sample"], rs["input"], rs["heldout_loss"]
  k_samples, steps = int(rs["restore_samples"]), rs["heldout_steps"]
  sampler = {"posterior": "posterior sampler (official test)", "sde": "reverse-SDE sampler"}[
      str(cfg.get("restore_method", "posterior"))]
  base = (f"IR-SDE (T={cfg.sde.T}, lambda=50/255, cosine, eps=0.005), {cfg.num_steps} restorer steps of batch "
          f"{cfg.batch_size}, {cfg.num_seeds} seeds paired (same init, batches and noise per seed)")

  def curve(c):                                     # seed-mean held-out loss after each chunk of training
    return ", ".join(f"{s}: {v:.5f}" for s, v in zip(steps, np.mean(loss[c]["curve"], axis=0)))

  def loss_row(a, b, experiment_name, kind, basis, paper_value, extra=""):
    d = stats.bootstrap_diff(loss[a]["per_image"], loss[b]["per_image"], paired=True, direction="less")
    return stats.compare_row(
        paper=PAPER, experiment=experiment_name, metric="held-out matching loss (L1, lower is better)",
        a=loss[a]["per_seed"], b=loss[b]["per_seed"], name_a=a, name_b=b, direction="less", paired=True,
        paper_value=paper_value, kind=kind, basis=basis,
        notes=(f"{base}; the training objective (official MatchingLoss: L1 between the predicted reverse-SDE step and "
               f"the optimal x*_(t-1)) on the {res['num_test']} held-out images at {rs['heldout_times']} stratified "
               f"times each, the same (t, noise) draws for every model. Per-image paired bootstrap of the seed means: "
               f"{_fmt_boot(d, '.2e')} ({d['holds']}). Seed-mean curve {a}: {curve(a)}; {b}: {curve(b)}." + extra))

  per_type_loss = "; ".join(f"{n}: none {np.mean(loss['none']['per_type'][n]):.5f}, DA-CLIP "
                            f"{np.mean(loss['daclip']['per_type'][n]):.5f}" for n in res["degradations"])
  rows.append(loss_row(
      "daclip", "none", "multi-degradation restoration: IR-SDE + DA-CLIP embeddings vs IR-SDE without", "claim",
      BASIS_RESTORE + "; judged by the held-out matching loss (the restorer's own objective: no sampling noise)",
      "the DA-CLIP embeddings improve the IR-SDE baseline in universal restoration (Tables 1-2, ablation)",
      f" Per degradation (seed mean): {per_type_loss}."))
  per_type = "; ".join(f"{n}: in {inp['per_type'][n]['psnr']:.1f}, none {np.mean(pc['none']['per_type'][n]['psnr']):.1f}, "
                       f"DA-CLIP {np.mean(pc['daclip']['per_type'][n]['psnr']):.1f}" for n in res["degradations"])
  one = {c: stats.mean_se(single[c]["psnr"]) for c in ("none", "daclip")}
  note = (f"{base}, {sampler}; PSNR of the mean of {k_samples} posterior chains per image (an estimate of the "
          f"posterior mean, which PSNR rewards; one sample scores below it by the posterior variance). One chain "
          f"alone: none {stats.fmt_mean_se(*one['none'])}, DA-CLIP {stats.fmt_mean_se(*one['daclip'])} dB. Degraded "
          f"input PSNR {inp['psnr']:.2f} dB. Per degradation (PSNR dB, seed mean): {per_type}.")
  rows.append(stats.compare_row(
      paper=PAPER, experiment="multi-degradation restoration: IR-SDE + DA-CLIP embeddings vs IR-SDE without",
      metric=f"PSNR (dB) of the posterior mean ({k_samples} samples)", a=pc["daclip"]["psnr"], b=pc["none"]["psnr"],
      name_a="DA-CLIP", name_b="no embedding",
      paper_value="the DA-CLIP embeddings improve the IR-SDE baseline in universal restoration (Tables 1-2, ablation)",
      notes=note, plots=plots, kind="claim", basis=BASIS_RESTORE))
  rows.append(stats.compare_row(
      paper=PAPER, experiment="multi-degradation restoration: IR-SDE + DA-CLIP embeddings vs IR-SDE without",
      metric=f"SSIM of the posterior mean ({k_samples} samples)", a=pc["daclip"]["ssim"], b=pc["none"]["ssim"],
      name_a="DA-CLIP", name_b="no embedding", paper_value="as above (SSIM)", kind="measurement",
      notes=f"Same restorations as the PSNR row; degraded input SSIM {inp['ssim']:.3f}."))
  rows.append(loss_row(
      "daclip", "shuffled", "control: DA-CLIP's own e_d vs e_d of another image (shuffled), e_c kept", "check",
      "a control of the mechanism (the image's own degradation embedding), not a paper statement",
      "(implied) the gain comes from the image's own degradation embedding",
      " Shuffled e_d keeps the embedding distribution but breaks its link to the image."))
  shuffled = loss_row("shuffled", "none", "control: shuffled e_d vs no embedding (should not help)", "measurement",
                      "", None)
  shuffled["notes"] = f"Measurement (shuffled better than none? {shuffled['judgement']['holds']}). " + shuffled["notes"]
  rows.append(shuffled)
  oracle = loss_row("oracle", "daclip", "reference: oracle one-hot degradation type (with e_c) vs DA-CLIP",
                    "measurement", "", None)
  oracle["notes"] = (f"Measurement: an upper reference for e_d (oracle better? {oracle['judgement']['holds']}). "
                     f"Run wall time {time.time() - t0:.0f} s. " + oracle["notes"])
  rows.append(oracle)
  return rows


def benchmark(quick: bool = True, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Controller train steps/s and restoration images/s (full T = 100 reverse-SDE chain) at 32x32 and 64x64.

  Random weights (the cost is what is timed); the reproduction's model sizes (configs/daclip.py).
  """
  cfg = get_config("")
  rows = []
  clip_cfg = cfg.clip.model
  for size in (32, 64):
    shape = (size, size, 1)
    dac = model_lib.DaClip(embed_dim=int(clip_cfg.embed_dim), patch_size=int(clip_cfg.image.patch_size),
                           width=int(clip_cfg.image.width), depth=int(clip_cfg.image.depth),
                           heads=int(clip_cfg.image.heads))
    params = dac.init(jax.random.key(0), jnp.zeros((1,) + shape))["params"]
    params = jax.tree_util.tree_map(lambda p: p + 0.01 if p.ndim == 2 else p, params)   # non-zero controls
    state = TrainState.create(params, model_lib.make_controller_optimizer(cfg.controller.optimizer, 100, params))
    bs = 32                                           # the controller batch at 64x64 (257 tokens) stays < 1 GB
    rng = np.random.default_rng(0)
    d = int(clip_cfg.embed_dim)
    unit = lambda v: v / np.linalg.norm(v, axis=1, keepdims=True)  # noqa: E731
    batch = {"image": jnp.asarray(rng.random((bs,) + shape), jnp.float32),
             "caption_emb": jnp.asarray(unit(rng.normal(size=(bs, d))), jnp.float32),
             "degradation_emb": jnp.asarray(unit(rng.normal(size=(bs, d))), jnp.float32)}
    step = jax.jit(model_lib.make_controller_train_step(dac), donate_argnums=0)
    rows.append(bench.time_fn(step, state, batch, jax.random.key(0), repeats=3 if quick else 10, carry=True,
                              items=bs, name="daclip/controller train step (items = images)",
                              size=f"{size}x{size}", batch=bs))
    net, sde, _, init = restoration.make_restorers(cfg, shape, d)
    rparams = init(jax.random.key(1)).params
    nb = 16
    lq = jnp.asarray(rng.random((nb,) + shape), jnp.float32)
    emb = jnp.asarray(rng.normal(size=(nb, d)), jnp.float32)
    fn = jax.jit(lambda k, p, x, c, e: model_lib.restore(k, p, x, model=net, schedule=sde, e_c=c, e_d=e,
                                                         method=str(cfg.restore_method)))
    rows.append(bench.time_fn(fn, jax.random.key(2), rparams, lq, emb, emb, repeats=1 if quick else 3, items=nb,
                              name=f"daclip/restore, T={int(cfg.sde.T)} {cfg.restore_method} steps (items = images)",
                              size=f"{size}x{size}", batch=nb))
  return rows


def scale_program(config, mesh):
  """The paper-size step for `experiments.scale`: one DA-CLIP controller training step on ViT-B/32.

  `model.make_controller_train_step`: the trainable controller (a copy of OpenCLIP's ViT-B/32 image tower) and its
  12 zero-initialised control projections steer the frozen encoder; the content and degradation InfoNCE losses at
  batch 3,136 (4 x 784). Parameters and AdamW moments FSDP-sharded over 'data', the batch over 'data'
  (`configs/daclip.py:paper`).

  Args:
    config: `get_config('paper')`.
    mesh: the ('data', 'model') mesh.

  Returns:
    common.scale.Program of (state, {'image', 'caption_emb', 'degradation_emb'}, key) -> (state, metrics).
  """
  from jax.sharding import NamedSharding, PartitionSpec as P
  from iclr24_jax.common import scale as scale_lib
  from iclr24_jax.vision import clip
  s = scale_lib.paper_scale(config, PAPER)
  m = config.clip.model
  dac = model_lib.daclip_from_clip(clip.create_clip(m, vocab_size=int(m.text.vocab_size)))
  size = int(config.data.image_size)
  params = jax.eval_shape(lambda: dac.init(jax.random.key(0), jnp.zeros((1, size, size, 3)))["params"])
  ctl = config.controller
  tx = model_lib.make_controller_optimizer(ctl.optimizer, int(ctl.num_steps), params)
  state = jax.eval_shape(lambda: TrainState.create(jax.tree.map(jnp.zeros_like, params), tx))
  # The same FSDP rule on the moments as on their parameters (equal shapes, equal shardings); the multi_transform
  # state (AdamW on the trainable labels, nothing for the frozen encoder) is not one `tree_map_params` walks.
  rep = NamedSharding(mesh, P())
  state_sh = state.replace(step=rep, params=scale_lib.fsdp_shardings(state.params, mesh),
                           opt_state=scale_lib.fsdp_shardings(state.opt_state, mesh),
                           extra=scale_lib.replicated(state.extra, mesh))
  b, e = int(s.batch_size), int(m.embed_dim)
  batch = {"image": jax.ShapeDtypeStruct((b, size, size, 3), jnp.float32),
           "caption_emb": jax.ShapeDtypeStruct((b, e), jnp.float32),
           "degradation_emb": jax.ShapeDtypeStruct((b, e), jnp.float32)}
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=rep)
  # Hand count per image: one ViT-B/32 forward = 12 layers x (24 T d^2 + 4 T^2 d) over T = 50 tokens of d = 768,
  # plus the 32 x 32 x 3 -> 768 patch embedding and the 768 -> 512 projection. The controller runs forward and
  # backward (3 forwards); the frozen encoder runs forward and the backward to its inputs only (its weights get no
  # gradient: 2 forwards); the 12 control projections d x d over T tokens, 3 x (2 T d^2) each. The two InfoNCE
  # losses: 2 x [B, B] logits of 2 B^2 x 512, 3x for the backward.
  p, d, depth = int(m.image.patch_size), int(m.image.width), int(m.image.depth)
  n_patch = (size // p) ** 2
  t = 1 + n_patch
  vit = depth * (24.0 * t * d * d + 4.0 * t * t * d) + 2.0 * n_patch * p * p * 3 * d + 2.0 * d * e
  per_image = 5.0 * vit + depth * 3.0 * 2.0 * t * d * d
  hand = b * per_image + 3.0 * 2.0 * (2.0 * b * b * e)
  frozen = scale_lib.num_elements(params["encoder"])
  state_abs = scale_lib.abstract(state, state_sh)
  return scale_lib.Program(
      name="DA-CLIP controller train step (ViT-B/32, batch 3,136)", fn=model_lib.make_controller_train_step(dac),
      args=(state_abs, scale_lib.abstract(batch, scale_lib.batch_shardings(batch, mesh)), key),
      out_shardings=(state_sh, rep), donate_argnums=(0,), carry=True, params=scale_lib.num_elements(params),
      items_per_step=b, item="images", hand_flops=hand, kind="train", abstract_params=state_abs.params,
      notes=f"params: the frozen encoder ({frozen / 1e6:.1f}M) + the trainable controller and projections. "
            "Deviation: the frozen text tower's caption / degradation-name embeddings are inputs (computed once per "
            "text); the official step runs the text tower on every batch. float32 (OpenCLIP: mixed precision).",
      paper_hardware=s.paper_hardware, paper_time=s.paper_time)
