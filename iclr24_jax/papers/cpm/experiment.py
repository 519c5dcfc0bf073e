"""CPM experiments: `run` (one config); study.py: `reproduce` (CPM vs the standard PM on HH-RLHF with SmolLM2 features,
PM-A / PM-B best-of-n agreement, a synthetic run with known weights), `benchmark` (features/s, fit time vs N).

Studies:
  preference  held-out accuracy of CPM / standard PM / length only / CPM without length / each single feature,
              over `seeds` random train/test re-splits of the scored pairs (paired by seed), with a 95%
              bootstrap interval over the test pairs of the first split.
  bon         best-of-n robustness (paper Sec. 4.1, official `reward_scaling_lll.best_of_n`): PM A and PM B are
              fitted on disjoint halves of the pairs; n samples per prompt are picked by A and scored by B
              (both z-scored over the samples); the A-B gap of the pick and the A/B pick agreement vs n.
  synthetic   features with known weights and a known Bradley-Terry reward: weight recovery, accuracy against
              the Bayes accuracy of the true reward, CPM vs a PM on a noisy high-dimensional embedding, and the
              true reward of best-of-n picks.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from iclr24_jax.common import data as common_data
from iclr24_jax.common import jsonl_cache
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import stats
from iclr24_jax.papers.cpm import data as data_lib
from iclr24_jax.papers.cpm import features as feat
from iclr24_jax.papers.cpm import model as model_lib
from iclr24_jax.papers.cpm import pm as pm_lib
from iclr24_jax.papers.cpm import scoring

LENGTH_COL = len(feat.FEATURES)          # index of the length column in the [.., 14] feature matrices


# ------------------------------------------------------------------------------------------------ scoring


def cache_file(config: Any) -> str | None:
  """The score cache file: config.cache_dir, else $ICLR24_JAX_CACHE/cpm (default ~/.cache/iclr24_jax/cpm);
  None when the cache is off."""
  d = config.get("cache_dir", "")
  if not d:
    root = os.environ.get("ICLR24_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "iclr24_jax"))
    if root == "off":
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


# ------------------------------------------------------------------------------------------ the studies


def _correct(model, fa, fb, y) -> np.ndarray:
  return np.asarray(model_lib.pair_correct(model, fa, fb, y))


def preference_study(fa, fb, ea, eb, labels, num_train: int, seeds, cv: Any) -> dict:
  """Held-out accuracy of CPM and the baselines over random re-splits (see the module docstring).

  Args:
    fa: [N, 14] features of reply A; fb: [N, 14] of reply B.
    ea: [N, E] PM embeddings of reply A, or None (no standard PM); eb: [N, E] of reply B, or None.
    labels: [N] int in {0, 1}, 1 when reply A is preferred.
    num_train: pairs used for training per split (2 <= num_train < N; the rest are the test pairs).
    seeds: split seeds (one random re-split each).
    cv: cross-validation settings (penalties, Cs, num_folds, pad_rows).

  Returns:
    {'acc': {method: [S] test accuracy}, 'correct': {method: [N_test] per-pair 0/1 of the first seed},
     'weights': [S, 14] CPM weights, 'cv': [S] chosen (penalty, C), 'num_test': int}.

  Raises:
    ValueError: num_train outside [2, N).
  """
  n = len(labels)
  if not 2 <= num_train < n:
    raise ValueError(f"num_train={num_train} must leave test pairs out of {n}.")
  acc: dict[str, list] = {}
  correct: dict[str, np.ndarray] = {}
  weights, chosen = [], []
  for s in seeds:
    perm = np.random.default_rng(1000 + s).permutation(n)
    tr, te = perm[:num_train], perm[num_train:]
    res = {}
    cpm, info = model_lib.cross_validate(fa[tr], fb[tr], labels[tr], penalties=tuple(cv.penalties),
                                         Cs=tuple(cv.Cs), num_folds=cv.num_folds, pad_rows=cv.pad_rows)
    res["CPM"] = _correct(cpm, fa[te], fb[te], labels[te])
    weights.append(np.asarray(cpm.weights))
    chosen.append((info["penalty"], info["C"]))
    # CPM without the length feature: the length column zeroed (its weight is then 0 under any penalty), so
    # the same compiled program serves.
    no_len = lambda f: np.concatenate([f[:, :LENGTH_COL], np.zeros_like(f[:, LENGTH_COL:])], axis=1)
    lm_only, _ = model_lib.cross_validate(no_len(fa[tr]), no_len(fb[tr]), labels[tr], penalties=tuple(cv.penalties),
                                          Cs=tuple(cv.Cs), num_folds=cv.num_folds, pad_rows=cv.pad_rows)
    res["CPM without length"] = _correct(lm_only, no_len(fa[te]), no_len(fb[te]), labels[te])
    if ea is not None:
      pm, _ = pm_lib.fit_pm(ea[tr], eb[tr], labels[tr], num_folds=cv.num_folds, pad_rows=cv.pad_rows)
      res["standard PM"] = _correct(pm, ea[te], eb[te], labels[te])
    singles = model_lib.single_feature_correct(fa[tr], fb[tr], labels[tr], fa[te], fb[te], labels[te])
    for j, name in enumerate(feat.ALL_FEATURES):
      res["length only" if name == feat.LENGTH_FEATURE else f"feature: {name}"] = singles[j]
    for k, v in res.items():
      acc.setdefault(k, []).append(float(np.mean(v)))
      if s == seeds[0]:
        correct[k] = v
  return {"acc": {k: np.asarray(v) for k, v in acc.items()}, "correct": correct, "weights": np.asarray(weights),
          "cv": chosen, "num_test": n - num_train}


def _zscore(r: np.ndarray) -> np.ndarray:
  return (r - r.mean()) / (r.std() + 1e-12)


def bon_study(fa, fb, ea, eb, labels, sample_feats, sample_embs, seeds, ns, cv: Any) -> dict:
  """PM-A / PM-B best-of-n over seeds (disjoint halves of the pairs), for CPM and the standard PM.

  Args:
    fa, fb, ea, eb, labels: the scored pairs.
    sample_feats: [P, n, 14] features of the samples; sample_embs: [P, n, E] or None.
    seeds: half-split seeds.
    ns: sample counts of the curve.
    cv: cross-validation settings.

  Returns:
    {model: {'curves': [S] dicts of best_of_n_curve, 'corr': [S] Pearson r of A and B rewards}}.
  """
  n_pairs = len(labels)
  p, n, f = sample_feats.shape
  out = {"CPM": {"curves": [], "corr": []}}
  if sample_embs is not None and ea is not None:
    out["standard PM"] = {"curves": [], "corr": []}
  for s in seeds:
    perm = np.random.default_rng(2000 + s).permutation(n_pairs)
    halves = (perm[:n_pairs // 2], perm[n_pairs // 2:])
    rewards = {k: [] for k in out}
    for h in halves:
      cpm, _ = model_lib.cross_validate(fa[h], fb[h], labels[h], penalties=tuple(cv.penalties), Cs=tuple(cv.Cs),
                                        num_folds=cv.num_folds, pad_rows=cv.pad_rows)
      rewards["CPM"].append(_zscore(np.asarray(model_lib.reward(cpm, sample_feats.reshape(p * n, f)))))
      if "standard PM" in out:
        pm, _ = pm_lib.fit_pm(ea[h], eb[h], labels[h], num_folds=cv.num_folds, pad_rows=cv.pad_rows)
        e = sample_embs.reshape(p * n, -1)
        rewards["standard PM"].append(_zscore(np.asarray(model_lib.reward(pm, e))))
    for k, (ra, rb) in rewards.items():
      out[k]["curves"].append(model_lib.best_of_n_curve(ra.reshape(p, n), rb.reshape(p, n), ns))
      # A constant reward (all weights 0: the CV chose the strongest penalty) has no correlation: count 0.
      out[k]["corr"].append(float(np.corrcoef(ra, rb)[0, 1]) if ra.std() > 0 and rb.std() > 0 else 0.0)
  return out


def synthetic_study(cfg: Any, seeds) -> dict:
  """Known weights and a known reward (see `data.make_synthetic`); per seed: weight cosine, CPM / Bayes / PM
  accuracy on held-out pairs, and the true reward of best-of-n picks by CPM-A vs PM-A.

  Args:
    cfg: the config.synthetic block (weights [F], num_train, num_test, embed_dim, embed_noise, bon_prompts,
      bon_n, penalties, Cs, num_folds, pad_rows).
    seeds: one synthetic draw per seed.

  Returns:
    {key: [S] float64} for cosine, acc_cpm, acc_bayes, acc_pm, bon_true_cpm, bon_true_pm, agree_cpm, agree_pm.
  """
  w = np.asarray(cfg.weights, np.float64)
  res = {k: [] for k in ("cosine", "acc_cpm", "acc_bayes", "acc_pm", "bon_true_cpm", "bon_true_pm",
                         "agree_cpm", "agree_pm")}
  n_bon = cfg.bon_prompts * cfg.bon_n
  for s in seeds:
    # One draw for train, test and the best-of-n samples (the "A" replies of the last n_bon pairs), so all
    # share the embedding's projection.
    d = data_lib.make_synthetic(s, cfg.num_train + cfg.num_test + n_bon, w, embed_dim=cfg.embed_dim,
                                embed_noise=cfg.embed_noise)
    k0 = cfg.num_train + cfg.num_test
    tr, te = np.arange(cfg.num_train), np.arange(cfg.num_train, k0)
    y = d["labels"]
    cpm, _ = model_lib.cross_validate(d["fa"][tr], d["fb"][tr], y[tr], penalties=tuple(cfg.penalties),
                                      Cs=tuple(cfg.Cs), num_folds=cfg.num_folds, pad_rows=cfg.pad_rows)
    wh = np.asarray(cpm.weights)
    res["cosine"].append(float(wh @ w / (np.linalg.norm(wh) * np.linalg.norm(w) + 1e-12)))
    res["acc_cpm"].append(float(np.mean(_correct(cpm, d["fa"][te], d["fb"][te], y[te]))))
    true_margin = d["reward_a"][te] - d["reward_b"][te]
    res["acc_bayes"].append(float(np.mean((true_margin > 0) == (y[te] == 1))))
    pm, _ = pm_lib.fit_pm(d["ea"][tr], d["eb"][tr], y[tr], num_folds=cfg.num_folds, pad_rows=cfg.pad_rows)
    res["acc_pm"].append(float(np.mean(_correct(pm, d["ea"][te], d["eb"][te], y[te]))))
    # Best-of-n: models A and B fitted on disjoint halves of the training pairs; A picks, the truth scores.
    shape = (cfg.bon_prompts, cfg.bon_n)
    f_s, e_s, r_s = d["fa"][k0:], d["ea"][k0:], d["reward_a"][k0:].reshape(shape)
    halves = np.arange(cfg.num_train // 2), np.arange(cfg.num_train // 2, cfg.num_train)
    for name in ("cpm", "pm"):
      rs = []
      for h in halves:
        if name == "cpm":
          m, _ = model_lib.cross_validate(d["fa"][h], d["fb"][h], y[h], penalties=tuple(cfg.penalties),
                                          Cs=tuple(cfg.Cs), num_folds=cfg.num_folds, pad_rows=cfg.pad_rows)
          rs.append(np.asarray(model_lib.reward(m, f_s)).reshape(shape))
        else:
          m, _ = pm_lib.fit_pm(d["ea"][h], d["eb"][h], y[h], num_folds=cfg.num_folds, pad_rows=cfg.pad_rows)
          rs.append(np.asarray(model_lib.reward(m, e_s)).reshape(shape))
      res[f"bon_true_{name}"].append(float(np.mean(model_lib.best_of_n(rs[0], r_s))))
      res[f"agree_{name}"].append(float(np.mean(np.argmax(rs[0], 1) == np.argmax(rs[1], 1))))
  return {k: np.asarray(v) for k, v in res.items()}


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
    t0, c0 = time.perf_counter(), time.process_time()
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
        "ci95_first_split": boot, "weights_mean": pref["weights"].mean(0).tolist(),
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
    bon_s = bon_gen_s = 0.0
    if config.bon.enabled:
      t3 = time.perf_counter()
      prompt_pairs = data_lib.load_pairs(config.bon.num_prompts, seed=config.data.seed,
                                         max_chars=config.data.max_chars, data_dir=config.data.data_dir or None,
                                         skip=n_pool)
      hist, samples = bon_samples(config, prompt_pairs, cache, scorer, log=log)
      bon_gen_s = time.perf_counter() - t3
      flat_h = [h for h, ss in zip(hist, samples) for _ in ss]
      flat_r = [r for ss in samples for r in ss]
      out = scoring.score_features(scorer, flat_h, flat_r, cache=cache, mode=config.mode)
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
                            "corr": v["corr"]} for k, v in bon.items()}
      results["bon"]["example"] = {"history": hist[0], "samples": samples[0][:4]}
      results["plots"].append(_bon_plot(bon, os.path.join(workdir, "best_of_n.png"),
                                        f"best-of-n: PM A picks, PM B judges ({p} prompts x {n} SmolLM2 samples, "
                                        f"{len(seeds)} half-splits)"))
    results["timing"] = {"scorer_load_s": load_s, "score_s": score_s, "score_cpu_s": score_cpu,
                         "tokens": scorer.num_tokens - tok0,
                         "features_per_s": (2 * n_pool * len(feat.FEATURES) / score_s
                                            if scorer.num_tokens > tok0 else None),
                         "fit_s": fit_s, "bon_generation_s": bon_gen_s, "bon_total_s": bon_s}
  elif config.data.name != "synthetic":
    raise ValueError(f"unknown config.data.name {config.data.name!r}; choose 'hh_rlhf' or 'synthetic'.")
  results["timing"] = dict(results.get("timing", {}), wall_s=time.perf_counter() - t_start,
                           cpu_s=time.process_time() - c_start)
  metrics_lib.write_results(workdir, results)
  return results


# ------------------------------------------------------------------------------------------- reproduce


# ------------------------------------------------------------------------------------------- benchmark
