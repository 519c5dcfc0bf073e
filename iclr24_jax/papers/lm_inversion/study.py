"""lm_inversion: the small-scale reproductions (`reproduce_seeds`, its one-seed miniature `reproduce`), the benchmark.

`reproduce_seeds` is the study below (`--only lm_inversion_seeds`, outside the main job: registry.EXTENDED);
`reproduce`, the main job's, runs it at one seed without the top-k arms, on the same prompts and caches.

Reproduction: distribution inverters trained on SmolLM2-135M's next-token distributions of ~2,000 real prompts
(3 seeds, and one inverter trained per top-k access level k = 1, 10, 100, in one vmapped program), evaluated on 500
held-out prompts against (a) a bag of the distribution's top tokens, (b) the nearest training prompt by KL,
(c) the inverter fed another prompt's distribution (it must fall to its prior if it reads the distribution), and
(d) the paper's sample-inversion baseline: a T5 of the same size and budget reading 16 tokens sampled from the
target after the prompt (3 seeds), with its own control: the same T5s fed another prompt's samples. The comparison
with (d) is a claim only where that control shows the sample inverter reads its input (beyond its prior);
otherwise "distribution beats samples" would only say "a model that reads its input beats one at its prior", and
the row is a measurement. Claims are judged on the per-seed means, paired by seed
(`common.stats.compare_row`), beside paired bootstrap intervals over the test prompts of the seed-averaged
per-prompt scores (`common.stats.bootstrap_diff`).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import bench
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.common import stats
from iclr24_jax.common.loop import compile_step
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.papers.lm_inversion import data as data_lib
from iclr24_jax.papers.lm_inversion import experiment
from iclr24_jax.papers.lm_inversion import evaluation as inv_metrics
from iclr24_jax.papers.lm_inversion import model as model_lib

PAPER = {"bleu": "59 (Llama-2-7B, full distribution)", "token_f1": "78", "exact_match": "27%"}
UNIT = {"bleu": 1.0, "token_f1": 100.0, "exact_match": 100.0}
INV, SHUF, KL, SAMPLES = "inverter", "inverter, shuffled input", "nearest train prompt (KL)", "sample inversion (T5)"
SAMPLES_SHUF = "sample inversion, shuffled input"
# The paper sentences the claim rows test; the baselines the paper does not have give measurements.
BASIS_INFO = ("'next-token probabilities contain a surprising amount of information about the preceding text' "
              "(abstract)")
BASIS_SAMPLES = ("inverting the next-token distribution beats inverting sampled outputs (the paper's results table, "
                 "'sample inverter' baseline)")
NOT_IN_PAPER = "a baseline the paper does not have: a measurement, its verdict is reported, not counted"

# Headline claims of the abstract that no row tests yet (experiments/reproduce.py tables them as 'not run').
NOT_RUN = [
    stats.not_run_row(
        paper="lm_inversion", experiment="recovering the full probability vector by search (logit-bias access)",
        metric="error of the recovered vector; inversion F1 from it",
        basis=("'even without predictions for every token in the vocabulary we can recover the probability vector "
               "through search' (abstract)"),
        reason="the top-k rows fill the hidden entries with a constant; no arm recovers them by search",
        variant="an lm_inversion arm that queries the target with logit biases to rebuild the vector, then inverts it"),
    stats.not_run_row(
        paper="lm_inversion", experiment="Llama-2-7B target, T5-base inverter on 2.3M prompts",
        metric="BLEU / token F1 / exact match", paper_value="59 / 78 / 27%",
        basis=("'On Llama-2 7b, our inversion method reconstructs prompts with a BLEU of 59 and token-level F1 of 78 "
               "and recovers 27% of prompts exactly' (abstract)"),
        reason="CPU budget: a small T5 from scratch on 2,000 prompts of SmolLM2-135M (the measurement rows above)",
        variant=("configs/lm_inversion.py at the paper's sizes (Llama-2-7B target, T5-base, 2.3M prompts) on "
                 "accelerators")),
]


def _bar_plot(per: dict, path: str) -> str:
  """Seed-averaged per-prompt BLEU and token F1 of each method with 95% bootstrap intervals over prompts."""
  fig, axes = metrics_lib.new_figure(ncols=2, size=(6.0, 3.8))
  names = list(per)
  for ax, key in ((axes[0, 0], "bleu"), (axes[0, 1], "token_f1")):
    vals = [UNIT[key] * per[n][key] for n in names]
    means = [v.mean() for v in vals]
    cis = [stats.bootstrap_ci(v, n_boot=500) for v in vals]
    err = np.array([[m - lo for m, (lo, _) in zip(means, cis)], [hi - m for m, (_, hi) in zip(means, cis)]])
    ax.bar(range(len(names)), means, yerr=np.maximum(err, 0), capsize=3)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_title(f"{key} (95% bootstrap CI)")
  fig.tight_layout()
  return metrics_lib.save_figure(fig, path)


def _scores(preds: list[list[str]], refs: list[str]) -> tuple[dict, dict]:
  """Per-seed means {metric: [S]} and seed-averaged per-prompt scores {metric: [N]} of S prediction lists."""
  per = [inv_metrics.per_example(p, refs) for p in preds]
  seed_means = {k: np.array([UNIT[k] * d[k].mean() for d in per]) for k in UNIT}
  item = {k: np.mean([d[k] for d in per], axis=0) for k in UNIT}
  return seed_means, item


# The main job's miniature: where its notes send the reader for the judged claims.
SEEDS_ROWS = ("the seed-judged claims are in the extended study's rows (lm_inversion_seeds: 3 seeds and the top-k "
              "arms, results/rows/lm_inversion_seeds.json; `python -m experiments.reproduce --only "
              "lm_inversion_seeds`)")


def reproduce(workdir: str, fast: bool = False, *, get_config: Callable[[str], Any]) -> list[dict]:
  """The main job's miniature of the study: one seed, no top-k arms (`get_config('one_seed')`).

  The same study as `reproduce_seeds` on the same prompts, cached distributions and samples, at one seed. Its
  claims and checks are the seeded study's, so they are recorded as measurements (`stats.miniature_rows`: the
  one-seed verdict, 'inconclusive' by rule since `stats.judge` needs 3 seeds, and the per-prompt bootstrap
  intervals stay in the notes, which point to the extended study's judged rows).

  Args:
    workdir: where the plot goes.
    fast: the 'tiny,one_seed' config: a smoke run of the whole pipeline.
    get_config: `get_config(variant)` of configs/lm_inversion.py (the runners pass it; tests pass the module's).

  Returns:
    Row dicts (paper, experiment, metric, ours, paper_value, holds, kind, notes[, plots]).
  """
  return stats.miniature_rows(_study(workdir, get_config("tiny,one_seed" if fast else "one_seed"), fast),
                               "1 seed, no top-k arms", SEEDS_ROWS)


def reproduce_seeds(workdir: str, fast: bool = False, *, get_config: Callable[[str], Any]) -> list[dict]:
  """The full study (outside the main job: `python -m experiments.reproduce --only lm_inversion_seeds`).

  3 seeds of the inverter and of the sample inverter, one inverter per top-k access level (see the module
  docstring); about 3,300 CPU-s with cold caches, too heavy for the main job.

  Args:
    workdir: where the plot goes.
    fast: the 'tiny' config (a random tiny target, a few steps): a smoke run of the whole pipeline.
    get_config: `get_config(variant)` of configs/lm_inversion.py (the runners pass it; tests pass the module's).

  Returns:
    Row dicts (paper, experiment, metric, ours, paper_value, holds, kind, notes[, plots]).
  """
  return _study(workdir, get_config("tiny" if fast else ""), fast)


def _study(workdir: str, config: Any, fast: bool) -> list[dict]:
  """Runs the study on `config` and returns its rows (see the module docstring)."""
  os.makedirs(workdir, exist_ok=True)
  prep = experiment.prepare(config)
  t_dist, t_samp = prep["seconds_distributions"], prep.get("seconds_samples", 0.0)
  seeds = [int(s) for s in config.seeds]
  arms = [dict(seed=s, k=0) for s in seeds] + [dict(seed=seeds[0], k=int(k)) for k in config.eval.topk]
  ks = [a["k"] for a in arms]
  ns = len(seeds)
  t0 = time.time()
  states, res = experiment.train_inverters(config, prep, arms)
  s_states, s_res = experiment.train_sample_inverters(config, prep, seeds)
  t_train = time.time() - t0
  t0 = time.time()
  refs, test_lp = prep["test_prompts"], prep["test_lp"]
  n = len(refs)
  unigrams = states.extra["unigram"]
  outs = experiment.predict_models(states.params, unigrams, test_lp, ks, prep, config)
  perm = data_lib.derangement(n, seed=1)          # row i reads prompt perm[i] != i: another prompt's input
  shuffled = np.asarray(test_lp)[perm]
  outs_shuf = experiment.predict_models(states.params, unigrams, shuffled, ks, prep, config)
  sample_outs = experiment.predict_samples(s_states.params, prep["test_samples"], prep, config)
  # The sample inverters' own control: the same permutation, another prompt's sampled continuation.
  sample_outs_shuf = experiment.predict_samples(s_states.params, [prep["test_samples"][i] for i in perm], prep,
                                                config)
  bag_k = int(config.eval.bag_k)
  bags = [data_lib.bag_of_top_tokens(test_lp, np.asarray(unigrams[i]), prep["target_tok"], bag_k) for i in range(ns)]
  nearest = data_lib.nearest_by_kl(test_lp, prep["train_lp"])
  t_eval = time.time() - t0
  bag = f"bag of top-{bag_k} tokens"
  seed_means, item = {}, {}
  for name, preds in ((INV, outs[:ns]), (SHUF, outs_shuf[:ns]), (bag, bags), (SAMPLES, sample_outs),
                      (SAMPLES_SHUF, sample_outs_shuf), (KL, [[prep["train_prompts"][i] for i in nearest]])):
    seed_means[name], item[name] = _scores(preds, refs)
  topk_names = []
  for j, k in enumerate(config.eval.topk):
    name = f"inverter trained on top-{k}"
    seed_means[name], item[name] = _scores([outs[ns + j]], refs)
    topk_names.append(name)
  ref0 = f"{INV} (seed {seeds[0]})"
  seed_means[ref0], item[ref0] = _scores([outs[0]], refs)

  setting = (f"SmolLM2-135M target, {len(prep['train_prompts'])} train / {n} held-out prompts, "
             f"{config.num_steps} steps x {config.batch_size}, {ns} seeds" if not fast
             else "tiny random target (smoke run)")
  boot = int(config.eval.bootstrap)
  rows = []
  for key in UNIT:
    m, se = stats.mean_se(seed_means[INV][key])
    lo, hi = stats.bootstrap_ci(UNIT[key] * item[INV][key], n_boot=boot)
    rows.append(dict(paper="lm_inversion", experiment=setting, metric=f"inverter {key}",
                     ours=f"{m:.2f} +- {se:.2f} over {ns} seeds; per-prompt 95% CI (seed-averaged) [{lo:.2f}, {hi:.2f}]",
                     paper_value=PAPER[key], holds=None, kind="measurement",
                     notes=("a small T5 trained from scratch on CPU vs the paper's T5-base on 2.3M prompts; "
                            "metrics as the official evaluation (sacrebleu corpus BLEU per prompt without effective "
                            "order, case-sensitive token-set F1); labels and predictions cut at "
                            f"{config.data.label_len} decoder tokens ({prep['labels_cut']['test']} of {n} test "
                            "prompts are longer)")))
  kl_note = ("# 'no' checked against references before writing it: a train step memorises a fixed batch (test), "
             "the shuffled control shows the inverter reads its input, and the KL baseline recovers planted "
             f"neighbours exactly (test); the budget ({config.num_steps} steps on {len(prep['train_prompts'])} prompts vs "
             "millions) and the templated "
             "near-duplicate questions (QuaRel / OpenBookQA) favour the nearest neighbour. ")
  def compare(a, other, key, claim, kind, basis, note=""):
    """inverter-style arm `a` vs `other` on `key`: judged over seeds, with a per-prompt paired bootstrap."""
    b = seed_means[other][key]
    b = float(b[0]) if len(b) == 1 else b  # the KL baseline does not depend on the seed
    d = stats.bootstrap_diff(UNIT[key] * item[a][key], UNIT[key] * item[other][key], paired=True, n_boot=boot)
    name_a = "inverter" if a == INV else a
    row = stats.compare_row(
        paper="lm_inversion", experiment=setting, metric=f"{key}: {name_a} vs {other}",
        a=seed_means[a][key], b=b, name_a=name_a, name_b=other, paper_value=claim, paired=True, kind=kind,
        basis=basis,
        notes=note + f"per-prompt paired bootstrap of the seed-averaged scores over {n} prompts: diff "
                     f"{d['diff']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}] ({d['holds']})")
    if kind == "measurement":
      row["notes"] += f"; verdict against this baseline (not counted): '{row['judgement']['holds']}'"
    return row

  sample_note = ("# Deviation: the sample inverter reads one 16-token continuation sampled at T=1 (special tokens "
                 "forbidden); the paper's reads sampled Llama-2 outputs. Same T5 size, vocabulary, steps and batch "
                 "order. ")
  for key in ("token_f1", "bleu"):
    rows.append(compare(INV, SHUF, key, "the inverter reads the distribution: another prompt's distribution drops it",
                        "claim", BASIS_INFO))
  for key in ("token_f1", "bleu"):
    rows.append(compare(INV, bag, key, "the inverter beats a bag of the distribution's top tokens", "measurement",
                        NOT_IN_PAPER))
  for key in ("token_f1", "bleu"):
    # The control first: does the sample inverter read its input, or sit at the prior its decoder learned?
    control = compare(SAMPLES, SAMPLES_SHUF, key, "(control) the sample inverter reads its samples: another "
                      "prompt's samples drop it", "check",
                      "a control of the baseline (does it read its input?), not a paper statement", sample_note)
    reads = control["holds"] == "yes"
    rows.append(control)
    rows.append(compare(
        INV, SAMPLES, key, "inverting the distribution beats inverting sampled text (paper: logits > sample "
        "inversion)", "claim" if reads else "measurement", BASIS_SAMPLES if reads else (
            "not judged as the paper's claim: its control (the row above) does not show the sample inverter reading "
            "its samples, so this compares the inverter with a decoder near its prior"),
        sample_note + ("" if reads else "the sample inverter's own control is not 'yes' (the row above): a "
                       "measurement until a sample inverter that reads its input is compared; ")))
  for key in ("token_f1", "bleu"):
    row = compare(INV, KL, key, "the inverter beats the nearest training prompt by KL", "measurement",
                  NOT_IN_PAPER)
    if row["judgement"]["holds"] == "no":
      row["notes"] = kl_note + row["notes"]
    rows.append(row)
  for name, k in zip(topk_names, config.eval.topk):
    d = {key: stats.bootstrap_diff(UNIT[key] * item[ref0][key], UNIT[key] * item[name][key], paired=True,
                                   n_boot=boot) for key in ("token_f1", "bleu")}
    rows.append(dict(
        paper="lm_inversion", experiment=setting, metric=f"top-{k} access, an inverter trained on it",
        ours=(f"F1 {seed_means[name]['token_f1'][0]:.2f}, BLEU {seed_means[name]['bleu'][0]:.2f}; full-distribution "
              f"inverter (same seed) minus it: F1 {d['token_f1']['diff']:+.2f} [{d['token_f1']['lo']:+.2f}, "
              f"{d['token_f1']['hi']:+.2f}], BLEU {d['bleu']['diff']:+.2f} [{d['bleu']['lo']:+.2f}, "
              f"{d['bleu']['hi']:+.2f}] (paired bootstrap over {n} prompts)"),
        paper_value="less access -> worse inversion (paper Sec. 6: top-k access)", holds=None, kind="measurement",
        notes=f"one seed per access level (seed {seeds[0]}: same init and batches as the full inverter); vec2text's "
              f"rule in training and evaluation: top-k of the distribution minus the unigram estimate, kept values "
              f"shifted by {model_lib.TOPK_FILL:g}, every other entry {model_lib.TOPK_FILL:g}; a measurement, not "
              "a seed-judged claim"))
  plot = _bar_plot(item, os.path.join(workdir, "lm_inversion_methods.png"))
  rows.append(dict(paper="lm_inversion", experiment=setting,
                   metric="time (s): distributions / samples / training / evaluation",
                   ours=f"{t_dist:.0f} / {t_samp:.0f} / {t_train:.0f} / {t_eval:.0f}", paper_value=None, holds=None,
                   kind="measurement",
                   notes=(f"{len(arms)} inverters at {res.steps_per_s or 0:.2f} steps/s and {ns} sample T5s at "
                          f"{s_res.steps_per_s or 0:.2f} steps/s (vmapped); distributions and samples come from the "
                          "cache after the first run"), plots=[plot]))
  return rows


def benchmark(quick: bool = True, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Target-LM distributions/s (SmolLM2, 64-token prompts) and inverter train step/s (main config), 1 vs N devices.

  Args:
    quick: batch sizes 16 and 32 only (else also 64).
    get_config: `get_config(variant)` of configs/lm_inversion.py (the runners pass it; tests pass the module's).

  Returns:
    `common.bench` rows (name, size, batch, items/s, 1 and N devices).
  """
  from iclr24_jax import lm
  rows = []
  params, lm_config, tok = lm.load_smollm2()
  fn = jax.jit(lambda ids, mask: jax.nn.log_softmax(lm.llama.forward(params, lm_config, ids, mask, last_only=True)))
  for b in (8, 32):
    ids, mask = tok.encode_batch(["What is the tallest mountain in Europe and how high is it?"] * b, max_len=64)
    rows.append(bench.time_fn(fn, jnp.asarray(ids), jnp.asarray(mask), repeats=3, items=b,
                              name="lm_inversion/target_distributions (items = prompts)", size="64 tokens", batch=b,
                              mesh_devices=1))
  config = get_config("")
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
      state = jax.jit(lambda k: model_lib.init(k, inverter, tx, v),
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


def scale_program(config, mesh):
  """The paper-size step for `experiments.scale`: one T5-base inverter step on Llama-2-7B distributions.

  16 distributions over 32,000 tokens per step, unrolled into 42 pseudo-embeddings of width 768, prompts of up to
  128 tokens, AdamW (`configs/lm_inversion.py:paper`). The projection's weights are sharded by size (FSDP), T5's
  by name (`lm.scale.param_shardings`).

  Args:
    config: `get_config('paper')`.
    mesh: the ('data', 'model') mesh.

  Returns:
    common.scale.Program of `model.make_train_step` (state, batch, key) -> (state, metrics).
  """
  from jax.sharding import NamedSharding, PartitionSpec as P
  from iclr24_jax.common import scale as scale_lib
  from iclr24_jax.lm import scale as lm_scale
  s = scale_lib.paper_scale(config, "lm_inversion")
  m = config.model
  vocab = int(config.target.vocab_size)
  t5_config = lm_scale.named_model(m.name, vocab_size=int(m.decoder_vocab))
  chunks = model_lib.num_chunks(vocab, int(m.width), bool(m.official_padding))
  inverter = model_lib.Inverter(t5_config, width=int(m.width), num_chunks=chunks, bottleneck=int(m.bottleneck),
                                dropout_rate=float(m.dropout_rate))
  tx = make_optimizer(config.optimizer, config.num_steps)
  state = jax.eval_shape(lambda: model_lib.init(jax.random.key(0), inverter, tx, vocab))
  rep = NamedSharding(mesh, P())
  params_sh = {"projection": scale_lib.fsdp_shardings(state.params["projection"], mesh),
               "t5": lm_scale.param_shardings(state.params["t5"], mesh)}
  state_sh = scale_lib.train_state_shardings(state, params_sh, mesh, extra={"unigram": rep})
  state_abs = scale_lib.abstract(state, state_sh)
  b, t = s.batch_size, int(config.data.label_len)
  batch = {"logprobs": jax.ShapeDtypeStruct((b, vocab), jnp.float32),
           "labels": jax.ShapeDtypeStruct((b, t), jnp.int32),
           "label_mask": jax.ShapeDtypeStruct((b, t), jnp.bool_)}
  batch_abs = scale_lib.abstract(batch, scale_lib.batch_shardings(batch, mesh))
  d, w, h = t5_config.d_model, int(m.width), int(m.bottleneck)
  projection = 2 * b * chunks * (w * w + w * h + h * d)  # sequence_weights, fc1, fc2 (forward)
  flops = lm_scale.t5_flops(t5_config, b, chunks, t) + 3 * projection
  step = model_lib.make_train_step(inverter, official_padding=bool(m.official_padding))
  return scale_lib.Program(
      name="T5-base inverter step (Llama-2-7B distributions)", fn=step,
      args=(state_abs, batch_abs, jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=rep)),
      out_shardings=(state_sh, rep), donate_argnums=(0,), params=scale_lib.num_elements(state.params),
      items_per_step=b * (chunks + t), hand_flops=flops, kind="train", carry=True,
      abstract_params=state_abs.params, notes="float32 compute (the official trains with bf16 autocast).",
      paper_hardware=s.paper_hardware, paper_time=s.paper_time)
