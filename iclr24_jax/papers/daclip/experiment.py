"""DA-CLIP end to end at CPU scale: stage-0 CLIP -> DA-CLIP controller -> IR-SDE restorers -> PSNR / SSIM.

`run(config, workdir)` trains, evaluates and writes results.json and plots. Each training stage is one compiled
`lax.scan` per chunk of `log_every` steps (a host loop of one jitted step on CPU), a resumable stage in its own
folder `workdir/<stage>` (its checkpoints and metrics.jsonl: `common.loop.Stages`): clip, controller (and
controller_s<k> for the further controller seeds), restorer_<condition>_s<seed>. A killed run resumes inside the
stage it was in and skips the finished ones. The restorers of every (condition, seed) pair are trained one after
another through one compiled program (paired: a seed shares its init, batches and sampling noise across
conditions).  The reproduction and the benchmark that call this live in `study.py`.

Where things are: stages 0-1 (data, CLIP, controller, embeddings, degradation accuracy) in `train.py`; stage 2,
the IR-SDE restoration pipeline (`make_restorers`, `train_restorers`, `restore_all`, `score`) in
`restoration.py`. This module keeps `run` and its two plots.
"""
from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from iclr24_jax.common import data as common_data
from iclr24_jax.common import loop
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.papers.daclip import degradations as deg
from iclr24_jax.papers.daclip.restoration import (condition_tables, heldout_draws, restore_all, score,
                                                  train_restorers)
from iclr24_jax.papers.daclip.train import (degradation_accuracy, embed, linear_probe, load_data, text_tables,
                                            train_clip, train_controller)
from iclr24_jax.papers.daclip import data as daclip_data

PAPER = "daclip"
CONDITIONS = ("none", "daclip", "shuffled", "oracle")


def plot_examples(test: dict, restored: np.ndarray, conditions, num_seeds: int, path: str) -> str:
  """One row per degradation: clean, degraded, then each condition's restoration (seed 0).

  Args:
    test: the test suite (gt, lq, type).
    restored: [C * S, N, H, W, C] restorations.
    conditions: C condition names.
    num_seeds: S.
    path: PNG output path.

  Returns:
    path.
  """
  rows = []
  for k in range(len(deg.DEGRADATIONS)):
    i = int(np.where(test["type"] == k)[0][0])
    rows += [test["gt"][i], test["lq"][i]] + [restored[ci * num_seeds, i] for ci in range(len(conditions))]
  return metrics_lib.plot_image_grid(np.clip(np.stack(rows), 0, 1), path, ncols=2 + len(conditions),
                                     title="clean | degraded | " + " | ".join(conditions))


def plot_heldout_curves(steps, curve: np.ndarray, conditions, num_seeds: int, path: str) -> str:
  """Held-out matching loss against training steps: one line per condition (mean over seeds, +- SE band).

  Args:
    steps: [K] step counts.
    curve: [C * S, K] held-out loss of each model after each chunk.
    conditions: C condition names.
    num_seeds: S.
    path: PNG output path.

  Returns:
    path.
  """
  fig, axes = metrics_lib.new_figure(size=(4.8, 3.2))
  ax = axes[0, 0]
  for ci, c in enumerate(conditions):
    v = np.asarray(curve[ci * num_seeds:(ci + 1) * num_seeds])
    m = v.mean(0)
    se = v.std(0, ddof=1) / np.sqrt(len(v)) if len(v) > 1 else np.zeros_like(m)
    ax.plot(steps, m, marker="o", label=c)
    ax.fill_between(steps, m - se, m + se, alpha=0.2)
  ax.set_xlabel("restorer training step")
  ax.set_ylabel("held-out L1 matching loss")
  ax.set_yscale("log")
  ax.legend(fontsize=7)
  return metrics_lib.save_figure(fig, path)


def plot_psnr_by_type(scores: dict, conditions, path: str) -> str:
  """Grouped bars of PSNR per degradation type: the degraded input, then each condition (mean over seeds).

  Args:
    scores: `score` output.
    conditions: condition names to plot.
    path: PNG output path.

  Returns:
    path.
  """
  fig, axes = metrics_lib.new_figure(size=(7.0, 3.2))
  ax = axes[0, 0]
  names = list(deg.DEGRADATIONS)
  width = 0.8 / (len(conditions) + 1)
  xs = np.arange(len(names))
  ax.bar(xs, [scores["input"]["per_type"][n]["psnr"] for n in names], width, label="degraded input", color="0.7")
  for ci, c in enumerate(conditions):
    vals = [np.mean(scores["per_condition"][c]["per_type"][n]["psnr"]) for n in names]
    ax.bar(xs + (ci + 1) * width, vals, width, label=c)
  ax.set_xticks(xs + 0.4)
  ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
  ax.set_ylabel("PSNR (dB)")
  ax.legend(fontsize=6)
  return metrics_lib.save_figure(fig, path)


# ----------------------------------------------------------------------------------------------------------------
# run
# ----------------------------------------------------------------------------------------------------------------


def run(config: ml_collections.ConfigDict, workdir: str, progress: bool = True) -> dict:
  """Stage 0 CLIP -> stage 1 controller -> degradation accuracy -> stage 2 restorers -> PSNR / SSIM.

  Returns (and writes to workdir/results.json): degradation / content accuracies (means and per-item 0/1
  lists, per controller seed) and the linear probe's choice; the held-out matching loss of every restorer (per
  seed, per image, per degradation, and its curve over training); PSNR / SSIM of the mean of
  `restore_samples` posterior chains and of one chain for the conditions in `restore_conditions` (per seed, per
  degradation); the degraded inputs' PSNR / SSIM, timings and plot paths.

  Every training stage saves in `workdir/<stage>` every config.checkpoint_every of its steps and/or
  checkpoint_every_secs seconds (at chunk ends), and on SIGTERM / SIGINT; a rerun restores the finished stages
  without training and resumes the one it was in, so its results equal an uninterrupted run's. The evaluations
  between stages are functions of the stages' parameters and the config's keys, and are recomputed.

  Args:
    config: the daclip ConfigDict (`configs/daclip.py`); restoration=False skips stage 2.
    workdir: output folder (created).
    progress: print progress lines.

  Returns:
    the results dict above.

  Raises:
    ValueError: `restore_conditions` names a condition that is not in `conditions`.
    common.loop.Preempted: SIGTERM / SIGINT stopped a stage (its checkpoint is saved).
  """
  if config.data.name in daclip_data.DATASETS:   # the paper's own data: read first (DataNotFoundError
    daclip_data.load(config.data)                  # naming the layout and source when absent)
    raise common_data.paper_data_not_wired("daclip", config.data)   # run() does not train on it yet
  t0 = time.time()
  os.makedirs(workdir, exist_ok=True)
  stages = loop.Stages.from_config(config, workdir, label=PAPER)
  stages = dataclasses.replace(stages, progress=stages.progress and progress)
  key = jax.random.key(int(config.seed))
  key_clip, key_ctrl, key_rest, key_sample = jax.random.split(key, 4)
  key_eval = jax.random.fold_in(key, 5)          # the held-out draws: shared by every restorer, no training key
  conditions = tuple(config.conditions)
  restored_conditions = tuple(config.restore_conditions)
  unknown = [c for c in restored_conditions if c not in conditions]
  if unknown:                                    # checked before any training: a typo must not cost a run
    raise ValueError(f"restore_conditions {unknown} are not among the trained conditions {conditions}; pick them "
                     "from config.conditions.")
  data = load_data(config)
  timings = {}

  t = time.time()
  clip_model, clip_params, tok = train_clip(config, data, key_clip, None, progress, stages=stages)
  cap_emb, name_emb = text_tables(clip_model, clip_params, tok, int(config.clip.model.text.max_len))
  timings["clip_s"] = time.time() - t
  t = time.time()
  dac, dac_params = train_controller(config, clip_model, clip_params, data, cap_emb, name_emb, key_ctrl, None,
                                     progress, stages=stages)
  timings["controller_s"] = time.time() - t

  t = time.time()
  emb_train = embed(dac, dac_params, data["train"]["lq"])
  emb_test = embed(dac, dac_params, data["test"]["lq"])
  acc = degradation_accuracy(emb_test, data["test"], name_emb, cap_emb)
  # The supervised reference: a linear probe on the frozen encoder's features of the degraded training images,
  # its regularisation chosen by cross-validation on them (the frozen features are the same for every seed).
  acc["frozen_linear_probe"], probe_info = linear_probe(emb_train["e_frozen"], data["train"]["type"],
                                                        emb_test["e_frozen"], data["test"]["type"])
  timings["embed_s"] = time.time() - t

  # (a) over controller seeds: seed 0 is the controller above (its embeddings feed stage 2); more seeds retrain
  # stage 1 only (the CLIP stays fixed, like the paper's pretrained OpenCLIP).
  seed_keys = ("ed_zero_shot", "content_ec")
  by_seed = {k: [float(acc[k].mean())] for k in seed_keys}
  items_by_seed = {k: [acc[k].tolist()] for k in seed_keys}
  t = time.time()
  for s in range(1, int(config.controller.get("seeds", 1))):
    dac_s, params_s = train_controller(config, clip_model, clip_params, data, cap_emb, name_emb,
                                       jax.random.fold_in(key_ctrl, s), None, progress, stages=stages,
                                       name=f"controller_s{s}")
    acc_s = degradation_accuracy(embed(dac_s, params_s, data["test"]["lq"]), data["test"], name_emb, cap_emb)
    for k in seed_keys:
      by_seed[k].append(float(acc_s[k].mean()))
      items_by_seed[k].append(acc_s[k].tolist())
  timings["controller_seeds_s"] = time.time() - t

  results = {"paper": PAPER, "degradations": list(deg.DEGRADATIONS), "conditions": list(conditions),
             "accuracy_by_seed": by_seed, "accuracy_items_by_seed": items_by_seed, "linear_probe": probe_info,
             "accuracy": {k: float(v.mean()) for k, v in acc.items()},
             "accuracy_items": {k: v.tolist() for k, v in acc.items()},
             "name_emb_max_cos": float(np.max(np.asarray(name_emb) @ np.asarray(name_emb).T
                                              - 2 * np.eye(len(deg.DEGRADATIONS)))),
             "num_test": int(len(data["test"]["lq"])), "num_train": int(len(data["train"]["lq"])),
             "timings": timings, "plots": []}
  if config.get("restoration", True):
    t = time.time()
    cond_tr, ctx_tr = condition_tables(emb_train, data["train"]["type"], conditions, seed=int(config.seed) + 11)
    cond_te, ctx_te = condition_tables(emb_test, data["test"]["type"], conditions, seed=int(config.seed) + 12)
    test = data["test"]
    times, noise = heldout_draws(key_eval, len(test["gt"]), test["gt"].shape[1:], int(config.sde.T),
                                 int(config.heldout_times))
    heldout_in = {"gt": jnp.asarray(test["gt"]), "lq": jnp.asarray(test["lq"]), "cond": jnp.asarray(cond_te),
                  "ctx": jnp.asarray(ctx_te), "times": jnp.asarray(times), "noise": jnp.asarray(noise)}
    net, sde, states, heldout = train_restorers(config, data, cond_tr, ctx_tr, key_rest, None, progress,
                                                heldout=heldout_in, stages=stages)
    timings["restorers_s"] = time.time() - t
    s_count = int(config.num_seeds)
    losses = {}
    for ci, c in enumerate(conditions):
      per_image = heldout["per_image"][ci * s_count:(ci + 1) * s_count]                     # [S, N]
      losses[c] = {"per_seed": per_image.mean(1).tolist(), "per_image": per_image.mean(0).tolist(),
                   "curve": heldout["curve"][ci * s_count:(ci + 1) * s_count].tolist(),
                   "per_type": {name: per_image[:, test["type"] == k].mean(1).tolist()
                                for k, name in enumerate(deg.DEGRADATIONS)}}
    t = time.time()
    mean, first = restore_all(config, net, sde, states.params, test, cond_te, ctx_te, key_sample,
                              conditions=[conditions.index(c) for c in restored_conditions],
                              num_samples=int(config.restore_samples))
    timings["restore_s"] = time.time() - t
    scores = score(mean, test, restored_conditions, s_count)
    scores["single_sample"] = score(first, test, restored_conditions, s_count)["per_condition"]
    scores["restore_samples"] = int(config.restore_samples)
    scores["heldout_loss"] = losses
    scores["heldout_steps"] = heldout["steps"]
    scores["heldout_times"] = int(config.heldout_times)
    results["restoration"] = scores
    results["plots"] = [plot_examples(test, mean, restored_conditions, s_count,
                                      os.path.join(workdir, "restorations.png")),
                        plot_psnr_by_type(scores, restored_conditions,
                                          os.path.join(workdir, "psnr_by_degradation.png")),
                        plot_heldout_curves(heldout["steps"], heldout["curve"], conditions, s_count,
                                            os.path.join(workdir, "heldout_loss.png"))]
  results["wall_s"] = time.time() - t0
  metrics_lib.write_results(workdir, results)
  return results
