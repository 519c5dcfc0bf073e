"""lm_inversion: the small-scale reproduction (`reproduce`) and the benchmark (`benchmark`).

Reproduction: an inverter trained on SmolLM2-135M's next-token distributions of ~2,000 real prompts, evaluated on
500 held-out prompts against (a) a bag of the top tokens of the distribution, (b) the nearest training prompt by KL
between distributions, (c) the inverter fed another prompt's distribution (it must fall to its prior if it reads
the distribution), and top-k access (k = 1, 10, 100). Differences are judged with paired bootstrap intervals over
the test prompts (`common.stats.bootstrap_diff`): one training run, so the interval covers test-set noise, not
training seeds (said in each row).
"""
from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import bench
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.common import stats
from iclr24_jax.common.loop import compile_step
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.configs import lm_inversion as cfg_mod
from iclr24_jax.papers.lm_inversion import data as data_lib
from iclr24_jax.papers.lm_inversion import experiment
from iclr24_jax.papers.lm_inversion import evaluation as inv_metrics
from iclr24_jax.papers.lm_inversion import model as model_lib

PAPER = {"bleu": "59 (Llama-2-7B, full distribution)", "token_f1": "78", "exact_match": "27%"}


def _bar_plot(per: dict, path: str) -> str:
  fig, axes = metrics_lib.new_figure(ncols=2, size=(5.0, 3.5))
  names = list(per)
  for ax, key, scale in ((axes[0, 0], "bleu", 1.0), (axes[0, 1], "token_f1", 100.0)):
    means = [scale * per[n][key].mean() for n in names]
    cis = [stats.bootstrap_ci(scale * per[n][key], n_boot=500) for n in names]
    err = np.array([[m - lo for m, (lo, _) in zip(means, cis)], [hi - m for m, (_, hi) in zip(means, cis)]])
    ax.bar(range(len(names)), means, yerr=err, capsize=3)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_title(f"{key} (95% bootstrap CI)")
  fig.tight_layout()
  return metrics_lib.save_figure(fig, path)


def reproduce(workdir: str, fast: bool = False) -> list[dict]:
  config = cfg_mod.get_config("tiny" if fast else "")
  os.makedirs(workdir, exist_ok=True)
  t0 = time.time()
  prep = experiment.prepare(config, workdir)
  t_dist = prep["seconds_distributions"]
  res = experiment.train(config, prep, os.path.join(workdir, "train"), progress=True)
  t_train = time.time() - t0 - t_dist
  params, unigram = res.state.params, res.state.extra["unigram"]
  refs = prep["test_prompts"]
  test_lp = np.asarray(prep["test_lp"], np.float32)
  preds = {"inverter": experiment.predict(params, test_lp, unigram, prep, config)}
  perm = np.random.default_rng(1).permutation(len(refs))
  perm = np.where(perm == np.arange(len(refs)), np.roll(perm, 1), perm)  # another prompt's distribution
  preds["inverter, shuffled input"] = experiment.predict(params, test_lp[perm], unigram, prep, config)
  for k in config.eval.topk:
    topk = np.asarray(model_lib.topk_access(jnp.asarray(test_lp), int(k)))
    preds[f"inverter, top-{k} access"] = experiment.predict(params, topk, unigram, prep, config)
  preds[f"bag of top-{config.eval.bag_k} tokens"] = data_lib.bag_of_top_tokens(
      test_lp, np.asarray(unigram), prep["target_tok"], int(config.eval.bag_k))
  nearest = data_lib.nearest_by_kl(test_lp, prep["train_lp"])
  preds["nearest train prompt (KL)"] = [prep["train_prompts"][i] for i in nearest]
  per = {name: inv_metrics.per_example(p, refs) for name, p in preds.items()}
  n = len(refs)
  setting = (f"SmolLM2-135M target, {len(prep['train_prompts'])} train / {n} held-out prompts, "
             f"{config.num_steps} steps" if not fast else "tiny random target (smoke run)")
  rows = []
  for key, unit in (("bleu", 1.0), ("token_f1", 100.0), ("exact_match", 100.0)):
    vals = unit * per["inverter"][key]
    lo, hi = stats.bootstrap_ci(vals, n_boot=int(config.eval.bootstrap))
    rows.append(dict(paper="lm_inversion", experiment=setting, metric=f"inverter {key} (mean, 95% CI over prompts)",
                     ours=f"{vals.mean():.2f} [{lo:.2f}, {hi:.2f}]", paper_value=PAPER[key], holds=None,
                     notes="a small T5 trained from scratch on CPU vs the paper's T5-base on 2.3M prompts"))
  claims = [("bag of top-%d tokens" % config.eval.bag_k, "the inverter beats a bag of the distribution's top tokens"),
            ("nearest train prompt (KL)", "the inverter beats the nearest training prompt by KL"),
            ("inverter, shuffled input", "the inverter reads the distribution: another prompt's distribution drops it")]
  for other, claim in claims:
    for key in ("token_f1", "bleu"):
      d = stats.bootstrap_diff(per["inverter"][key], per[other][key], paired=True,
                               n_boot=int(config.eval.bootstrap))
      scale = 100.0 if key == "token_f1" else 1.0
      rows.append(dict(
          paper="lm_inversion", experiment=setting, metric=f"{key}: inverter - {other}",
          ours=f"inverter {scale * d['mean_a']:.2f} vs {scale * d['mean_b']:.2f}; diff {scale * d['diff']:+.2f} "
               f"[{scale * d['lo']:+.2f}, {scale * d['hi']:+.2f}] (paired bootstrap over {n} prompts)",
          paper_value=claim, holds=d["holds"],
          notes="one training run: the interval is over test prompts, not training seeds"))
  for k in config.eval.topk:
    name = f"inverter, top-{k} access"
    rows.append(dict(paper="lm_inversion", experiment=setting, metric=f"token F1 / BLEU with top-{k} access",
                     ours=f"F1 {100 * per[name]['token_f1'].mean():.2f}, BLEU {per[name]['bleu'].mean():.2f}",
                     paper_value="less information -> worse inversion (paper: top-k access, Sec. 6)", holds=None,
                     notes="# Deviation: the full-distribution inverter evaluated on top-k inputs (hidden entries "
                           "-30); the paper trains one inverter per access level"))
  plot = _bar_plot(per, os.path.join(workdir, "lm_inversion_methods.png"))
  rows.append(dict(paper="lm_inversion", experiment=setting, metric="time (s): distributions / training",
                   ours=f"{t_dist:.0f} / {t_train:.0f}", paper_value=None, holds=None,
                   notes=f"{res.steps_per_s or 0:.2f} train steps/s", plots=[plot]))
  return rows


def benchmark(quick: bool = True) -> list[dict]:
  """Target-LM distributions/s (SmolLM2, 64-token prompts) and inverter train step/s (main config), 1 vs N devices."""
  from iclr24_jax import lm
  rows = []
  params, lm_config, tok = lm.load_smollm2()
  fn = jax.jit(lambda ids, mask: jax.nn.log_softmax(lm.llama.forward(params, lm_config, ids, mask, last_only=True)))
  for b in (8, 32):
    ids, mask = tok.encode_batch(["What is the tallest mountain in Europe and how high is it?"] * b, max_len=64)
    rows.append(bench.time_fn(fn, jnp.asarray(ids), jnp.asarray(mask), repeats=3, items=b,
                              name="lm_inversion/target_distributions (items = prompts)", size="64 tokens", batch=b,
                              mesh_devices=1))
  config = cfg_mod.get_config("")
  v = int(lm_config.vocab_size)
  dec_tok = lm.tokenizer.train_bpe(["a short corpus to build a decoder vocabulary for the benchmark"] * 4,
                                   vocab_size=300)
  t5_config = lm.t5.T5Config.from_tokenizer(dec_tok, d_model=config.model.d_model, d_kv=config.model.d_kv,
                                            d_ff=config.model.d_ff, num_layers=config.model.num_layers,
                                            num_heads=config.model.num_heads)
  for bs in ((16, 32) if quick else (16, 32, 64)):
    inverter = model_lib.Inverter(t5_config, config.model.width, model_lib.num_chunks(v, config.model.width),
                                  config.model.bottleneck)

    def make_case(mesh, size, inverter=inverter):
      tx = make_optimizer(config.optimizer, 100)
      state = jax.jit(lambda k: model_lib.init_state(k, inverter, tx, v),
                      out_shardings=sharding.replicated_sharding(mesh))(jax.random.key(0))
      rng = np.random.default_rng(0)
      logits = rng.normal(size=(size, v)).astype(np.float32)
      batch = {"logprobs": np.asarray(jax.nn.log_softmax(logits)),
               "labels": rng.integers(3, 300, size=(size, config.data.label_len)).astype(np.int32),
               "label_mask": np.ones((size, config.data.label_len), bool)}
      step = compile_step(model_lib.make_train_step(inverter), mesh)
      return step, (state, sharding.shard_batch(batch, mesh), jax.random.key(1)), dict(
          name="lm_inversion/inverter_train_step", size=f"V={v}, S={inverter.num_chunks}", batch=size, items=size)
    rows += bench.across_devices(make_case, sizes=(bs,), carry=True, repeats=3)
  return rows
