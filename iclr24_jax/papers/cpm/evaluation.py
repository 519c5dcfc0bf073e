"""CPM's evaluation protocols, shared by `experiment.run` and the reproduction study.

  preference_study  held-out accuracy of CPM / standard PM / length only / CPM without length / each single
                    feature, over `seeds` random train/test re-splits of the scored pairs (paired by seed), with a
                    95% bootstrap interval over the test pairs of the first split.
  bon_study         best-of-n robustness (paper Sec. 4.1, official `reward_scaling_lll.best_of_n`): PM A and PM B
                    are fitted on disjoint halves of the pairs; n samples per prompt are picked by A and scored by B
                    (both z-scored over the samples); the A-B gap of the pick and the A/B pick agreement vs n.
  synthetic_study   features with known weights and a known Bradley-Terry reward: weight recovery, accuracy against
                    the Bayes accuracy of the true reward, CPM vs a PM on a noisy high-dimensional embedding, and
                    the true reward of best-of-n picks.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from iclr24_jax.papers.cpm import data as data_lib
from iclr24_jax.papers.cpm import features as feat
from iclr24_jax.papers.cpm import model as model_lib
from iclr24_jax.papers.cpm import pm as pm_lib


LENGTH_COL = len(feat.FEATURES)          # index of the length column in the [.., 14] feature matrices


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
