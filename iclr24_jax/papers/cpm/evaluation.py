"""CPM's evaluation protocols, shared by `experiment.run` and the reproduction study.

  preference_study  held-out accuracy of CPM / standard PM / length only / CPM without length / each single
                    feature, over `seeds` random train/test re-splits of the scored pairs (paired by seed); each
                    pair's correctness averaged over the splits that test it (the unit of a paired bootstrap over
                    pairs).
  bon_study         best-of-n robustness (paper Sec. 4.1, official `reward_scaling_lll.best_of_n`): PM A and PM B
                    are fitted on disjoint halves of the pairs; n samples per prompt are picked by A and scored by B
                    (both z-scored over the samples); the A-B gap of the pick and the A/B pick agreement vs n, and
                    per prompt at n = all samples.
  bon_judge_study   best-of-n quality (official `bon_candidate.py` + `claude_eval.py`): the CPM's and the standard
                    PM's best-of-n picks, each compared with the prompt's first sample by a judge LM (SmolLM2-135M
                    through `lm.SmolLMJudge`, both presentation orders, option log-probabilities, cached), and the
                    CPM pick vs the PM pick (`judge_prompt`, `judge_preferences`, `pairwise_wins`).
  synthetic_study   features with known weights and a known Bradley-Terry reward: weight recovery, accuracy against
                    the Bayes accuracy of the true reward, CPM vs a PM on a noisy high-dimensional embedding, and
                    the true reward of best-of-n picks.
"""
from __future__ import annotations

from typing import Any, Sequence

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
     'pair_mean': {method: [N] each pair's correctness averaged over the splits that test it (NaN: never
     tested)}, 'test_count': [N] int splits testing each pair, 'weights': [S, 14] CPM weights,
     'cv': [S] chosen (penalty, C), 'num_test': int}.

  Raises:
    ValueError: num_train outside [2, N).
  """
  n = len(labels)
  if not 2 <= num_train < n:
    raise ValueError(f"num_train={num_train} must leave test pairs out of {n}.")
  acc: dict[str, list] = {}
  correct: dict[str, np.ndarray] = {}
  pair_sum: dict[str, np.ndarray] = {}
  test_count = np.zeros(n, np.int64)
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
    test_count[te] += 1
    for k, v in res.items():
      acc.setdefault(k, []).append(float(np.mean(v)))
      pair_sum.setdefault(k, np.zeros(n))[te] += np.asarray(v, np.float64)
      if s == seeds[0]:
        correct[k] = v
  # Per pair, over the splits that test it: the unit a bootstrap over pairs resamples (the re-splits share one
  # pool of pairs, so the spread over splits alone leaves out the pool's own sampling error).
  with np.errstate(invalid="ignore", divide="ignore"):
    pair_mean = {k: np.where(test_count > 0, v / test_count, np.nan) for k, v in pair_sum.items()}
  return {"acc": {k: np.asarray(v) for k, v in acc.items()}, "correct": correct, "pair_mean": pair_mean,
          "test_count": test_count, "weights": np.asarray(weights), "cv": chosen, "num_test": n - num_train}


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
    {model: {'curves': [S] dicts of best_of_n_curve, 'corr': [S] Pearson r of A and B rewards,
     'agree_prompt': [S, P] A and B pick the same sample among all n (0/1), 'gap_prompt': [S, P] A's minus B's
     reward of A's pick among all n}}.
  """
  n_pairs = len(labels)
  p, n, f = sample_feats.shape
  out = {"CPM": {"curves": [], "corr": [], "agree_prompt": [], "gap_prompt": []}}
  if sample_embs is not None and ea is not None:
    out["standard PM"] = {"curves": [], "corr": [], "agree_prompt": [], "gap_prompt": []}
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
      # Per prompt at n = all samples: the unit a bootstrap over prompts resamples.
      pick = np.argmax(ra.reshape(p, n), axis=1)
      out[k]["agree_prompt"].append((pick == np.argmax(rb.reshape(p, n), axis=1)).astype(np.float64))
      rows = np.arange(p)
      out[k]["gap_prompt"].append(ra.reshape(p, n)[rows, pick] - rb.reshape(p, n)[rows, pick])
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


# ---------------------------------------------------------------------------------- best-of-n by a judge LM

# The paper's quality evaluation (Sec. 4.3; official mle-train/bon_candidate.py + claude_eval.py): for each
# prompt, each model's best-of-16 pick is compared by a judge LM with a baseline sample, in both presentation
# orders, and a model's win rate over the baseline is what the paper compares across models.
# Deviation: the official judge (Claude-2, temperature 0) writes one 1-10 score per assistant, read by regex and
# averaged over both orders; a 135M judge's greedy text barely depends on the content (lm/annotate.py), so here
# it is asked which answer is better and read by the log-probabilities of the two answers "Assistant 1" /
# "Assistant 2", averaged over both orders (`lm.debiased_preference`: a purely positional judge scores 0).
JUDGE_OPTIONS = ("Assistant 1", "Assistant 2")
BASELINE_SAMPLE = 0   # official: `groupby('prompt')['vanila_score'].idxmax()` on a constant picks each prompt's first


def judge_prompt(history: str, answer_1: str, answer_2: str) -> str:
  """The pairwise judge prompt (one ChatML user turn): the conversation, two answers, which is better.

  The structure and criteria of the official HH judge prompt (`claude_eval.py`: the user's question, the two
  assistants' answers, helpfulness / relevance / accuracy / level of detail, order not to matter), asking for a
  choice instead of two scores (see `JUDGE_OPTIONS`). The transcript keeps its "Human:" / "Assistant:" labels.

  Args:
    history: the HH transcript before the reply.
    answer_1: the answer shown first (as "Assistant 1").
    answer_2: the answer shown second.

  Returns:
    ChatML text for `lm.SmolLMJudge.choice_logprobs` (options `JUDGE_OPTIONS`).
  """
  body = ("Two AI assistants answered the conversation below. Judge the quality of their answers.\n\n"
          f"[Conversation]\n{history.strip()}\n\n[Answer of Assistant 1]\n{answer_1.strip()}\n\n"
          f"[Answer of Assistant 2]\n{answer_2.strip()}\n\n"
          "Consider helpfulness, relevance, accuracy and level of detail; the order of the answers must not sway "
          'you. Which assistant\'s answer is better? Reply "Assistant 1" or "Assistant 2".')
  return f"<|im_start|>user\n{body}<|im_end|>\n"


def judge_preferences(judge, histories: Sequence[str], first: Sequence[str], second: Sequence[str],
                      cache=None) -> np.ndarray:
  """Order-debiased log-odds that the judge prefers `first[i]` over `second[i]` after `histories[i]`.

  Each pair is shown in both orders; the option log-probabilities are cached per prompt (`lm.cached_map`).

  Args:
    judge: an `lm` judge with `choice_logprobs(prompts, options)` and `model_id` (`lm.SmolLMJudge`,
      `lm.FakeJudge`).
    histories: P transcripts.
    first, second: P answers each.
    cache: an `lm.GenerationCache` or None.

  Returns:
    [P] float64 (> 0: `first` preferred; exactly 0 for a purely positional judge).

  Raises:
    ValueError: the three lists differ in length.
  """
  from iclr24_jax import lm
  p = len(histories)
  if len(first) != p or len(second) != p:
    raise ValueError(f"judge_preferences needs one first and one second answer per history; got {p} histories, "
                     f"{len(first)} first and {len(second)} second answers.")
  if p == 0:
    return np.zeros(0)
  prompts = ([judge_prompt(h, a, b) for h, a, b in zip(histories, first, second)]
             + [judge_prompt(h, b, a) for h, a, b in zip(histories, first, second)])
  settings = dict(getattr(judge, "scoring_settings", dict)(), options=list(JUDGE_OPTIONS))
  lp = lm.cached_map(lambda ps: judge.choice_logprobs(ps, list(JUDGE_OPTIONS)), prompts, cache,
                     model_id=judge.model_id, settings=settings, chunk_size=16)
  lp = np.asarray(lp, np.float64).reshape(2 * p, len(JUDGE_OPTIONS))
  return np.asarray(lm.debiased_preference(lp[:p], lp[p:]), np.float64)


def pairwise_wins(pref: np.ndarray, same: np.ndarray) -> np.ndarray:
  """Win (1), loss (0) or tie (1/2) of the first item from judge log-odds; the same sample twice is a tie.

  Args:
    pref: [P] judge log-odds for the first item.
    same: [P] bool, the two items are the same text (not judged).

  Returns:
    [P] float64 in {0, 1/2, 1}.
  """
  pref, same = np.asarray(pref, np.float64), np.asarray(same, bool)
  return np.where(same | (pref == 0.0), 0.5, (pref > 0.0).astype(np.float64))


def bon_judge_study(fa, fb, ea, eb, labels, sample_feats, sample_embs, histories: Sequence[str],
                    samples: Sequence[Sequence[str]], judge, cv: Any, cache=None) -> dict:
  """Best-of-n picks of the CPM and of the standard PM, each judged against the baseline sample by a judge LM.

  Both models are fitted on all the scored pairs (`cross_validate`, `pm.fit_pm`); per prompt each picks the
  sample of highest reward among the n; the judge compares the pick with sample `BASELINE_SAMPLE` (a random
  sample: the official baseline) and, head to head, the CPM's pick with the PM's.

  Args:
    fa, fb, ea, eb, labels: the scored pairs ([N, 14], [N, 14], [N, E] or None, [N, E] or None, [N]).
    sample_feats: [P, n, 14] features of the samples; sample_embs: [P, n, E] or None (no standard PM).
    histories: P prompts (transcripts).
    samples: P lists of n sampled replies.
    judge: an `lm` judge (see `judge_preferences`).
    cv: cross-validation settings (penalties, Cs, num_folds, pad_rows).
    cache: an `lm.GenerationCache` for the judge's log-probabilities, or None.

  Returns:
    {'picks': {model: [P] int}, 'win': {model: [P] win over the baseline sample in {0, 1/2, 1}},
     'pref': {model: [P] judge log-odds (0 where the pick is the baseline)},
     'head_to_head': [P] CPM pick's win over the PM pick (absent without a PM), 'num_judged': int prompts sent}.
  """
  p, n, f = sample_feats.shape
  if len(histories) != p or len(samples) != p or any(len(s) != n for s in samples):
    raise ValueError(f"bon_judge_study needs {p} histories and {p} lists of {n} samples (sample_feats is "
                     f"{sample_feats.shape}).")
  cpm, _ = model_lib.cross_validate(fa, fb, labels, penalties=tuple(cv.penalties), Cs=tuple(cv.Cs),
                                    num_folds=cv.num_folds, pad_rows=cv.pad_rows)
  rewards = {"CPM": np.asarray(model_lib.reward(cpm, sample_feats.reshape(p * n, f))).reshape(p, n)}
  if sample_embs is not None and ea is not None:
    pm, _ = pm_lib.fit_pm(ea, eb, labels, num_folds=cv.num_folds, pad_rows=cv.pad_rows)
    rewards["standard PM"] = np.asarray(model_lib.reward(pm, sample_embs.reshape(p * n, -1))).reshape(p, n)
  picks = {k: np.argmax(r, axis=1) for k, r in rewards.items()}     # the first maximum, as `best_of_n`
  out: dict[str, Any] = {"picks": {}, "win": {}, "pref": {}, "num_judged": 0}

  def versus(first_idx, second_idx):
    a = [samples[i][j] for i, j in enumerate(first_idx)]
    b = [samples[i][j] for i, j in enumerate(second_idx)]
    same = np.asarray([x == y for x, y in zip(a, b)])
    todo = np.flatnonzero(~same)
    pref = np.zeros(p)
    pref[todo] = judge_preferences(judge, [histories[i] for i in todo], [a[i] for i in todo],
                                   [b[i] for i in todo], cache=cache)
    out["num_judged"] += len(todo)
    return pairwise_wins(pref, same), pref

  base = np.full(p, BASELINE_SAMPLE)
  for k, pk in picks.items():
    out["picks"][k] = pk
    out["win"][k], out["pref"][k] = versus(pk, base)
  if "standard PM" in picks:
    out["head_to_head"], _ = versus(picks["CPM"], picks["standard PM"])
  return out
