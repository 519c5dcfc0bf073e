"""CPM experiments: `run` (one config); study.py: `reproduce` (CPM vs the standard PM on HH-RLHF with SmolLM2 features,
PM-A / PM-B best-of-n agreement, a synthetic run with known weights), `benchmark` (features/s, fit time vs N).

The evaluation protocols `run` applies (preference, best-of-n, synthetic) are in `evaluation.py`.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from iclr24_jax.common import compile_cache
from iclr24_jax.common import data as common_data
from iclr24_jax.common import jsonl_cache
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import stats
from iclr24_jax.papers.cpm import data as data_lib
from iclr24_jax.papers.cpm import features as feat
from iclr24_jax.papers.cpm import model as model_lib
from iclr24_jax.papers.cpm import scoring
from iclr24_jax.papers.cpm.evaluation import (BASELINE_SAMPLE, bon_judge_study, bon_study, judge_preferences,
                                             pairwise_wins, preference_study, synthetic_study)


# ------------------------------------------------------------------------------------------------ scoring


def cache_file(config: Any) -> str | None:
  """The score cache file: config.cache_dir, else $ICLR24_JAX_CACHE/cpm (default ~/.cache/iclr24_jax/cpm);
  None when the cache is off."""
  d = config.get("cache_dir", "")
  if not d:
    root = compile_cache.cache_root()
    if root is None:
      return None
    d = os.path.join(root, "cpm")
  return os.path.join(d, "scores.jsonl")


def make_scorer(config: Any):
  """The feature scorer a config names: 'smollm2' (SmolLM2-135M-Instruct from `iclr24_jax.lm`) or 'fake'."""
  if config.scorer == "fake":
    return scoring.FakeScorer()
  if config.scorer == "smollm2":
    return scoring.SmolLMScorer(template=config.template, batch_size=config.score_batch)
  raise ValueError(f"unknown config.scorer {config.scorer!r}; choose 'smollm2' or 'fake'.")


def judge_cache_file(config: Any) -> str | None:
  """The judge's cache (`lm.GenerationCache`): judge.jsonl beside the score cache; None when the cache is off."""
  path = cache_file(config)
  return None if path is None else os.path.join(os.path.dirname(path), "judge.jsonl")


def make_judge(config: Any, scorer=None):
  """The judge LM config.bon.judge names: 'smollm2' (`lm.SmolLMJudge`, sharing a SmolLM2 scorer's weights),
  'fake' (`lm.FakeJudge`, chance level: a hash of the prompt and option), or None for ''."""
  from iclr24_jax import lm
  name = config.bon.get("judge", "")
  if not name:
    return None
  if name == "fake":
    return lm.FakeJudge(seed=config.seed)
  if name == "smollm2":
    if isinstance(scorer, scoring.SmolLMScorer):
      return lm.SmolLMJudge(scorer.params, scorer.config, scorer.tokenizer, batch_size=config.bon.judge_batch)
    return lm.SmolLMJudge(batch_size=config.bon.judge_batch)
  raise ValueError(f"unknown config.bon.judge {name!r}; choose 'smollm2', 'fake' or '' (no judge).")


def score_pairs(scorer, pairs: list[dict], cache: scoring.ScoreCache, mode: str = "expected",
                log=print) -> dict[str, np.ndarray]:
  """Features [N, 14] (13 LM features + length) and PM embeddings of both replies of every pair.

  Args:
    scorer: a `scoring.SmolLMScorer` or `FakeScorer`.
    pairs: N dicts with 'history', 'reply_a', 'reply_b', 'label' (1: reply A preferred, 0: B).
    cache: ScoreCache of per-reply scores (new scores are added).
    mode: 'expected' (expected score under the answer distribution) or 'parse' (greedy text + regex).
    log: printer of progress lines.

  Returns:
    {'fa', 'fb': [N, 14], 'ea', 'eb': [N, E] or None, 'labels': [N], 'complete': [N] bool}.
  """
  hist = [p["history"] for p in pairs] * 2
  reps = [p["reply_a"] for p in pairs] + [p["reply_b"] for p in pairs]
  t0, n0 = time.perf_counter(), scorer.num_tokens

  def progress(done, total):
    dt = time.perf_counter() - t0
    log(f"  scored {done}/{total} new replies ({done * len(feat.FEATURES) / max(dt, 1e-9):.1f} features/s, "
        f"{(scorer.num_tokens - n0) / max(dt, 1e-9):.0f} tokens/s)")
  out = scoring.score_features(scorer, hist, reps, cache=cache, mode=mode, progress=progress)
  n = len(pairs)
  f = feat.feature_matrix({k: out["scores"][:, j] for j, k in enumerate(feat.FEATURES)}, reps)
  emb = out["embedding"]
  fa, fb = f[:n], f[n:]
  return {"fa": fa, "fb": fb, "ea": None if emb is None else emb[:n], "eb": None if emb is None else emb[n:],
          "labels": np.asarray([p["label"] for p in pairs], np.int32),
          "complete": model_lib.complete_pairs(fa, fb)}


# ------------------------------------------------------------------------------------------ BoN samples


def bon_samples(config: Any, pairs_for_prompts: list[dict], cache: scoring.ScoreCache, scorer, log=print
                ) -> tuple[list[str], list[list[str]]]:
  """n samples per prompt (SmolLM2, sampled; cached) or, for the fake scorer, replies drawn from the pool.

  Args:
    config: the cpm ConfigDict (scorer, bon: num_prompts P, n, temperature, top_p, max_new_tokens, seed).
    pairs_for_prompts: pairs whose first P histories are the prompts (and, for 'fake', whose replies form the pool).
    cache: ScoreCache that also stores generated samples.
    scorer: the scorer (its LM generates the samples).
    log: printer of progress lines.

  Returns:
    (histories [P], samples [P][n]).
  """
  b = config.bon
  hist = [p["history"] for p in pairs_for_prompts[:b.num_prompts]]
  if config.scorer == "fake":
    rng = np.random.default_rng(0)
    pool = [p[k] for p in pairs_for_prompts for k in ("reply_a", "reply_b")]
    return hist, [[pool[i] for i in rng.integers(0, len(pool), b.n)] for _ in hist]
  from iclr24_jax import lm
  tok = scorer.tokenizer
  rendered = [tok.apply_chat_template(data_lib.history_messages(h), add_generation_prompt=True) for h in hist]
  settings = dict(n=b.n, temperature=b.temperature, top_p=b.top_p, max_new_tokens=b.max_new_tokens, seed=b.seed)
  keys = [scoring.ScoreCache.key(scorer.model_id, "bon", r, settings) for r in rendered]
  gen = None
  t0 = time.perf_counter()

  def generate(idx: list[int]) -> list[list[str]]:   # one prompt per call (chunk_size 1): n samples, its own seed
    nonlocal gen
    if gen is None:
      gen = lm.Generator(scorer.params, scorer.config, tok, chat=False, batch_size=b.n)
    texts = gen([rendered[idx[0]]] * b.n, max_new_tokens=b.max_new_tokens, temperature=b.temperature,
                top_p=b.top_p, seed=b.seed + idx[0])
    return [[t.strip() for t in texts]]

  def progress(done: int, total: int) -> None:
    if done == total:
      log(f"  generated {total} x {b.n} samples in {time.perf_counter() - t0:.0f}s")

  samples = jsonl_cache.cached_map(generate, range(len(keys)), keys, cache, chunk_size=1, progress=progress,
                                   what="prompt")
  return hist, samples


# ------------------------------------------------------------------------------------------------- plots


def _acc_plot(pref: dict, path: str, title: str) -> str:
  names = list(pref["acc"])
  fig, axes = metrics_lib.new_figure(size=(7.5, 4.2))
  ax = axes[0, 0]
  means = [np.mean(pref["acc"][k]) for k in names]
  ses = [stats.mean_se(pref["acc"][k])[1] for k in names]
  colors = ["C3" if k == "CPM" else "C0" if k == "standard PM" else "C2" if k == "length only" else "0.6"
            for k in names]
  ax.barh(np.arange(len(names)), means, xerr=ses, color=colors)
  ax.axvline(0.5, color="k", lw=0.8, ls="--")
  ax.set_yticks(np.arange(len(names)))
  ax.set_yticklabels(names, fontsize=7)
  ax.invert_yaxis()
  ax.set_xlabel("held-out preference accuracy (mean +- SE over splits)")
  ax.set_title(title, fontsize=9)
  return metrics_lib.save_figure(fig, path)


def _bon_plot(bon: dict, path: str, title: str) -> str:
  fig, axes = metrics_lib.new_figure(ncols=2, size=(9.0, 3.6))
  for k, c in zip(bon, ("C3", "C0")):
    curves = bon[k]["curves"]
    ns = curves[0]["n"]
    for key, ls in (("score_a", "-"), ("score_b", "--")):
      v = np.asarray([cv[key] for cv in curves])
      axes[0, 0].errorbar(ns, v.mean(0), yerr=v.std(0, ddof=1) / np.sqrt(len(v)) if len(v) > 1 else None,
                          color=c, ls=ls, label=f"{k}: {'A (picks)' if key == 'score_a' else 'B (judges)'}")
    v = np.asarray([cv["agreement"] for cv in curves])
    axes[0, 1].errorbar(ns, v.mean(0), yerr=v.std(0, ddof=1) / np.sqrt(len(v)) if len(v) > 1 else None, color=c,
                        label=k)
  axes[0, 0].set_xscale("log", base=2)
  axes[0, 0].set_xlabel("n")
  axes[0, 0].set_ylabel("z-scored reward of the best-of-n pick")
  axes[0, 0].legend(fontsize=7)
  axes[0, 1].set_xscale("log", base=2)
  axes[0, 1].set_xlabel("n")
  axes[0, 1].set_ylabel("P(A and B pick the same sample)")
  axes[0, 1].legend(fontsize=7)
  fig.suptitle(title, fontsize=9)
  return metrics_lib.save_figure(fig, path)


def _weights_plot(weights: np.ndarray, path: str, title: str) -> str:
  fig, axes = metrics_lib.new_figure(size=(6.5, 3.8))
  ax = axes[0, 0]
  m = weights.mean(0)
  se = weights.std(0, ddof=1) / np.sqrt(len(weights)) if len(weights) > 1 else None
  ax.barh(np.arange(len(m)), m, xerr=se, color=["C3" if v > 0 else "C0" for v in m])
  ax.set_yticks(np.arange(len(m)))
  ax.set_yticklabels(feat.ALL_FEATURES, fontsize=7)
  ax.invert_yaxis()
  ax.axvline(0, color="k", lw=0.8)
  ax.set_xlabel("CPM coefficient (standardised features)")
  ax.set_title(title, fontsize=9)
  return metrics_lib.save_figure(fig, path)


# ------------------------------------------------------------------------------------------------- run


def _summarise(v) -> dict:
  m, se = stats.mean_se(v)
  return {"mean": m, "se": se, "per_seed": [float(x) for x in np.ravel(v)]}


def run(config: Any, workdir: str, log=print) -> dict:
  """Runs the studies a config asks for; writes results.json and plots into `workdir`.

  Args:
    config: the cpm ConfigDict (`configs/cpm.py`): num_seeds, synthetic, data, scorer, cv, bon, ...
    workdir: output folder (created).
    log: printer of progress lines.

  Returns:
    {'synthetic': ..., 'preference': ..., 'bon': ..., 'timing': ...} (numbers as lists / floats).
  """
  if config.data.name in data_lib.DATASETS:   # the paper's own data: read first (DataNotFoundError when absent)
    data_lib.load(config.data)
    if config.data.name != "hh_rlhf":
      raise common_data.paper_data_not_wired("cpm", config.data)   # run() trains on HH-RLHF pairs only
  os.makedirs(workdir, exist_ok=True)
  t_start, c_start = time.perf_counter(), time.process_time()
  seeds = list(range(config.num_seeds))
  results: dict[str, Any] = {"config": json.loads(config.to_json_best_effort()), "plots": []}
  if config.synthetic.enabled:
    t0 = time.perf_counter()
    syn = synthetic_study(config.synthetic, seeds)
    results["synthetic"] = {k: _summarise(v) for k, v in syn.items()}
    results["synthetic"]["seconds"] = time.perf_counter() - t0
    log(f"synthetic: cosine {syn['cosine'].mean():.3f}, CPM {syn['acc_cpm'].mean():.3f} vs Bayes "
        f"{syn['acc_bayes'].mean():.3f} vs PM {syn['acc_pm'].mean():.3f}")
  if config.data.name == "hh_rlhf":
    cache = scoring.ScoreCache(cache_file(config))
    t0 = time.perf_counter()
    scorer = make_scorer(config)
    load_s = time.perf_counter() - t0
    n_pool = config.data.num_train + config.data.num_test
    pairs = data_lib.load_pairs(n_pool, seed=config.data.seed, max_chars=config.data.max_chars,
                                data_dir=config.data.data_dir or None)
    log(f"hh_rlhf: {n_pool} pairs; scoring {2 * n_pool} replies x {len(feat.FEATURES)} features "
        f"({config.scorer}, mode {config.mode}); cache {cache.path} ({len(cache)} entries)")
    t1, c1, tok0 = time.perf_counter(), time.process_time(), scorer.num_tokens
    sc = score_pairs(scorer, pairs, cache, mode=config.mode, log=log)
    score_s, score_cpu = time.perf_counter() - t1, time.process_time() - c1
    pair_tokens = scorer.num_tokens - tok0   # the pairs' alone (the best-of-n samples are scored later)
    keep = sc["complete"]
    fa, fb, y = sc["fa"][keep], sc["fb"][keep], sc["labels"][keep]
    ea = None if sc["ea"] is None else sc["ea"][keep]
    eb = None if sc["eb"] is None else sc["eb"][keep]
    num_train = min(config.data.num_train, int(keep.sum()) - 2)
    t2 = time.perf_counter()
    pref = preference_study(fa, fb, ea, eb, y, num_train, seeds, config.cv)
    fit_s = time.perf_counter() - t2
    boot = {}
    for k, v in pref["correct"].items():
      boot[k] = stats.bootstrap_ci(v, n_boot=2000, seed=0)
    results["preference"] = {
        "num_pairs": int(keep.sum()), "dropped_incomplete": int((~keep).sum()), "num_train": num_train,
        "num_test": pref["num_test"], "acc": {k: _summarise(v) for k, v in pref["acc"].items()},
        "ci95_first_split": boot,
        # Each pair's correctness averaged over the splits that test it (None: never tested), the unit of the
        # paired bootstrap over pairs the study judges CPM vs the standard PM with.
        "pair_mean": {k: [None if np.isnan(x) else float(x) for x in v] for k, v in pref["pair_mean"].items()
                      if not k.startswith("feature: ")},
        "test_count": pref["test_count"].tolist(),
        "weights_mean": pref["weights"].mean(0).tolist(),
        "weights_names": list(feat.ALL_FEATURES), "cv_choice": pref["cv"],
        "chosen_vs_rejected_mean_features": {
            "chosen": np.where(y[:, None] == 1, fa, fb).mean(0).tolist(),
            "rejected": np.where(y[:, None] == 1, fb, fa).mean(0).tolist()}}
    results["plots"].append(_acc_plot(pref, os.path.join(workdir, "accuracy.png"),
                                      f"HH-RLHF harmless: {num_train} train / {pref['num_test']} test pairs, "
                                      f"{len(seeds)} splits, features by {config.scorer}"))
    results["plots"].append(_weights_plot(pref["weights"], os.path.join(workdir, "cpm_weights.png"),
                                          "CPM coefficients (HH-RLHF, mean over splits)"))
    log("accuracy: " + ", ".join(f"{k} {np.mean(v):.3f}" for k, v in pref["acc"].items()
                                 if not k.startswith("feature")))
    bon_s = bon_gen_s = judge_s = bon_gen_cpu = bon_score_cpu = 0.0
    if config.bon.enabled:
      t3, c3 = time.perf_counter(), time.process_time()
      prompt_pairs = data_lib.load_pairs(config.bon.num_prompts, seed=config.data.seed,
                                         max_chars=config.data.max_chars, data_dir=config.data.data_dir or None,
                                         skip=n_pool)
      hist, samples = bon_samples(config, prompt_pairs, cache, scorer, log=log)
      bon_gen_s, bon_gen_cpu = time.perf_counter() - t3, time.process_time() - c3
      flat_h = [h for h, ss in zip(hist, samples) for _ in ss]
      flat_r = [r for ss in samples for r in ss]
      c5 = time.process_time()
      out = scoring.score_features(scorer, flat_h, flat_r, cache=cache, mode=config.mode)
      bon_score_cpu = time.process_time() - c5
      sf = feat.feature_matrix({k: out["scores"][:, j] for j, k in enumerate(feat.FEATURES)}, flat_r)
      if np.isnan(sf).any():   # parse mode: a missing feature of a sample -> its column mean (logged)
        log(f"  {int(np.isnan(sf).any(1).sum())} samples with a missing feature: filled with the column mean")
        sf = np.where(np.isnan(sf), np.nanmean(sf, 0, keepdims=True), sf)
      p, n = len(hist), config.bon.n
      se = None if out["embedding"] is None else out["embedding"].reshape(p, n, -1)
      bon = bon_study(fa, fb, ea, eb, y, sf.reshape(p, n, -1), se, seeds, tuple(config.bon.ns), config.cv)
      bon_s = time.perf_counter() - t3
      results["bon"] = {k: {"n": list(map(int, v["curves"][0]["n"])),
                            **{m: [c[m].tolist() for c in v["curves"]] for m in ("score_a", "score_b", "agreement")},
                            "corr": v["corr"], "agree_prompt": np.asarray(v["agree_prompt"]).tolist(),
                            "gap_prompt": np.asarray(v["gap_prompt"]).tolist()} for k, v in bon.items()}
      results["bon"]["example"] = {"history": hist[0], "samples": samples[0][:4]}
      judge = make_judge(config, scorer)
      if judge is not None:
        t4, c4 = time.perf_counter(), time.process_time()
        jpath = judge_cache_file(config)
        from iclr24_jax import lm
        jcache = None if jpath is None else lm.GenerationCache(jpath)
        jd = bon_judge_study(fa, fb, ea, eb, y, sf.reshape(p, n, -1), se, hist, samples, judge, config.cv,
                             cache=jcache)
        results["bon_judge"] = {
            "judge": judge.model_id, "baseline_sample": BASELINE_SAMPLE, "num_prompts": p, "n": n,
            "num_judged": jd["num_judged"],
            **{k: {m: np.asarray(v[m]).tolist() for m in v} for k, v in jd.items() if isinstance(v, dict)},
            **({"head_to_head": jd["head_to_head"].tolist()} if "head_to_head" in jd else {})}
        # The judge against the human labels of the scored pairs (chosen vs rejected): how much its verdicts
        # can say at all.
        k = min(int(config.bon.get("judge_check_pairs", 0)), len(pairs))
        if k:
          chosen = [p_["reply_a"] if p_["label"] == 1 else p_["reply_b"] for p_ in pairs[:k]]
          rejected = [p_["reply_b"] if p_["label"] == 1 else p_["reply_a"] for p_ in pairs[:k]]
          pref_h = judge_preferences(judge, [p_["history"] for p_ in pairs[:k]], chosen, rejected, cache=jcache)
          results["bon_judge"]["human_agreement"] = pairwise_wins(pref_h, np.zeros(k, bool)).tolist()
        results["bon_judge"]["cpu_s"] = time.process_time() - c4
        judge_s = results["bon_judge"]["seconds"] = time.perf_counter() - t4
        log("judge: win rate over the baseline sample " + ", ".join(
            f"{k} {np.mean(v):.3f}" for k, v in jd["win"].items()))
      results["plots"].append(_bon_plot(bon, os.path.join(workdir, "best_of_n.png"),
                                        f"best-of-n: PM A picks, PM B judges ({p} prompts x {n} SmolLM2 samples, "
                                        f"{len(seeds)} half-splits)"))
    results["timing"] = {"scorer_load_s": load_s, "score_s": score_s, "score_cpu_s": score_cpu,
                         "tokens": pair_tokens,
                         "features_per_s": (2 * n_pool * len(feat.FEATURES) / score_s if pair_tokens else None),
                         "fit_s": fit_s, "bon_generation_s": bon_gen_s, "bon_generation_cpu_s": bon_gen_cpu,
                         "bon_score_cpu_s": bon_score_cpu, "bon_total_s": bon_s, "judge_s": judge_s}
  elif config.data.name != "synthetic":
    raise ValueError(f"unknown config.data.name {config.data.name!r}; choose 'hh_rlhf' or 'synthetic'.")
  results["timing"] = dict(results.get("timing", {}), wall_s=time.perf_counter() - t_start,
                           cpu_s=time.process_time() - c_start)
  metrics_lib.write_results(workdir, results)
  return results
