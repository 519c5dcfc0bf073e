"""cpm: the small-scale reproduction (`reproduce`) and the benchmark (`benchmark`).

The method lives in the package's method modules and `experiment.run`; this module holds the studies
that the paper's claims are checked with (experiments/reproduce.py and experiments/benchmark.py call them).
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import stats
from iclr24_jax.papers.cpm import data as data_lib
from iclr24_jax.papers.cpm import model as model_lib
from iclr24_jax.papers.cpm import scoring
from iclr24_jax.papers.cpm.experiment import run


# Headline claims of the abstract that no row tests yet (experiments/reproduce.py tables them as 'not run'). "best-of-n
# samples obtained using CPMs tend to be preferred" is now the judge-LM row of `reproduce`; the generalisation claim
# is tested on HH-RLHF only, not on the paper's second data set.
NOT_RUN = [
    stats.not_run_row(
        paper="cpm", experiment="SHP: CPM vs standard PM", metric="held-out preference accuracy",
        paper_value="CPMs generalise better than standard PMs on SHP as on HH-RLHF",
        basis="'CPMs not only improve generalization ... than standard PMs' (abstract; the paper's second data set, SHP)",
        reason="SHP is not in the shared data, and run() trains on HH-RLHF pairs only (cpm.data.load reads SHP from a "
               "user's path)",
        variant="configs/cpm.py with data.name='shp' once run() takes SHP pairs"),
]

BASIS_GENERALISE = "'CPMs not only improve generalization ... than standard PMs' (abstract)"
BASIS_JUDGE = ("'best-of-n samples obtained using CPMs tend to be preferred over samples obtained using "
               "conventional PMs' (abstract; the official evaluation: mle-train/bon_candidate.py picks, "
               "claude_eval.py judge, win rate over a random sample)")


def paired_bootstrap_row(*, experiment: str, metric: str, a, b, name_a: str, name_b: str, unit: str,
                         paper_value: str, kind: str, basis: str = "", notes: str = "", a_by_seed=None,
                         b_by_seed=None, direction: str = "greater", **extra) -> dict:
  """A row for "mean a > mean b" (or <) over items (pairs, prompts), judged by the paired bootstrap over the items.

  `stats.bootstrap_diff` (2000 resamples, 95% percentile interval): 'yes' / 'no' when the interval of the mean
  difference lies on one side of 0, else 'inconclusive'. Per-seed values, when given, are judged as well
  (`stats.judge`, paired by seed) and go to the notes and `judgement_seeds` only: seeds that re-split one pool
  share its items, so their spread leaves out the items' own sampling error.

  Args:
    experiment, metric, paper_value, basis, notes: the row's labels.
    a, b: [M] per-item values of each arm (the same items), e.g. a pair's correctness averaged over the splits
      that test it, or a prompt's win over the baseline sample.
    name_a, name_b: arm names.
    unit: what an item is, plural ('pairs', 'prompts').
    kind: 'claim' / 'check' (judged) or 'measurement' (holds None; the numbers stay in `judgement`).
    a_by_seed, b_by_seed: optional [S] per-seed means of each arm.
    direction: 'greater' (the claim is a > b) or 'less'.
    **extra: more columns (plots=[...]).

  Returns:
    A reproduction row dict (paper, experiment, metric, ours, paper_value, holds, kind, basis, notes, judgement
    (+ judgement_seeds)).
  """
  boot = stats.bootstrap_diff(a, b, paired=True, direction=direction)
  ours = (f"{name_a} {boot['mean_a']:.3f} vs {name_b} {boot['mean_b']:.3f}; diff {boot['diff']:+.3f} "
          f"[{boot['lo']:+.3f}, {boot['hi']:+.3f}] (95% paired bootstrap over {boot['n']} {unit})")
  row = dict(paper="cpm", experiment=experiment, metric=metric, ours=ours, paper_value=paper_value,
             holds=None if kind == "measurement" else boot["holds"], kind=kind, notes=notes,
             judgement=dict(boot, direction=direction, unit=unit,
                            a=[float(x) for x in np.ravel(a)], b=[float(x) for x in np.ravel(b)]))
  if basis:
    row["basis"] = basis
  if a_by_seed is not None:
    seeds = stats.judge(a_by_seed, b_by_seed, paired=True, direction=direction)
    row["judgement_seeds"] = dict(seeds, a=[float(x) for x in a_by_seed], b=[float(x) for x in b_by_seed])
    seed_note = (f"per split ({seeds['n']} re-splits of one pool, paired): {name_a} "
                 f"{stats.fmt_mean_se(seeds['mean_a'], seeds['se_a'])} vs {name_b} "
                 f"{stats.fmt_mean_se(seeds['mean_b'], seeds['se_b'])}, diff {seeds['diff']:+.3f}+-"
                 f"{seeds['se_diff']:.2g}"
                 + ("" if kind == "measurement" else f" ({seeds['holds']} by 2 SE; that SE leaves out the pool's "
                                                     "sampling error)"))
    row["notes"] = f"{notes}; {seed_note}" if notes else seed_note
  row.update(extra)
  return row


def _ms(d: dict) -> str:
  return stats.fmt_mean_se(d["mean"], d["se"])


def reproduce(workdir: str, fast: bool = False, *, get_config: Callable[[str], Any]) -> list[dict]:
  """The reproduction rows (see the module docstring); `fast` runs the tiny config (fake scorer).

  Args:
    workdir: output folder.
    fast: run the 'tiny' config instead of 'repro'.
    get_config: `get_config(variant)` of configs/cpm.py (the runners pass it; tests pass the module's).

  Returns:
    list of reproduction row dicts.
  """
  config = get_config("tiny" if fast else "repro")
  res = run(config, workdir)
  P = "cpm"
  rows: list[dict] = []
  syn = res.get("synthetic")
  if syn:
    sc = config.synthetic
    rows.append(stats.compare_row(
        paper=P, experiment=f"synthetic: 14 features, known weights, {sc.num_train} train pairs",
        metric="held-out accuracy", a=syn["acc_cpm"]["per_seed"], b=syn["acc_pm"]["per_seed"], name_a="CPM",
        name_b=f"PM on a {sc.embed_dim}-dim noisy embedding",
        paper_value="CPMs generalise better than standard PMs (low-dimensional interpretable features)", kind="check",
        basis=("a check, not evidence for 'CPMs ... improve generalization' (abstract): the PM reads a noisier, "
               "higher-dimensional copy of the latents the CPM's 14 features measure, so it generalises worse by "
               "construction"),
        notes=(f"why a check: the PM reads a {sc.embed_dim}-dim embedding of the same latents the CPM's 14 features "
               f"measure, with noise of scale {sc.embed_noise} added (data.make_synthetic), so it has more to "
               f"estimate from noisier inputs and generalises worse by construction; Bayes accuracy of the true "
               f"reward {_ms(syn['acc_bayes'])}; {sc.num_test} test pairs per seed")))
    rows.append({"paper": P, "experiment": "synthetic: weight recovery", "metric": "cosine(fitted w, true w)",
                 "ours": stats.fmt_mean_se(syn["cosine"]["mean"], syn["cosine"]["se"]),
                 "paper_value": "(check) the logistic fit recovers the generating weights",
                 "holds": "yes" if syn["cosine"]["mean"] - 2 * syn["cosine"]["se"] > 0.9 else "inconclusive",
                 "kind": "check", "basis": "verifies the logistic fit against the known generating weights",
                 "notes": f"{len(syn['cosine']['per_seed'])} seeds; reference: the known generating weights"})
    rows.append(stats.compare_row(
        paper=P, experiment=f"synthetic: best-of-{sc.bon_n} over {sc.bon_prompts} prompts, PM A vs PM B",
        metric="A/B pick agreement", a=syn["agree_cpm"]["per_seed"], b=syn["agree_pm"]["per_seed"], name_a="CPM",
        name_b="PM", paper_value="CPMs are more robust to over-optimisation (PM A and PM B agree more)", kind="check",
        basis=("a check, not evidence for 'more robust to overoptimization' (abstract): two PMs fitted on disjoint "
               "halves of a noisier, higher-dimensional copy of the same latents agree less by construction"),
        notes=f"true reward of the A pick: CPM {_ms(syn['bon_true_cpm'])}, PM {_ms(syn['bon_true_pm'])}"))
  pref = res.get("preference")
  if pref:
    acc = pref["acc"]
    setting = (f"HH-RLHF harmless test, {pref['num_train']} train / {pref['num_test']} test pairs, features: "
               f"{config.scorer} ({config.mode}, '{config.template}' prompts)")
    plots = [p for p in res["plots"] if p.endswith(("accuracy.png", "cpm_weights.png", "best_of_n.png"))]
    # Judged over the pairs: each pair's correctness averaged over the re-splits that test it, resampled by a
    # paired bootstrap (the re-splits share one pool, so their spread alone leaves out its sampling error).
    pm_ = pref["pair_mean"]
    tested = [i for i, c in enumerate(pref["test_count"]) if c > 0]
    per_pair = {k: np.asarray([v[i] for i in tested], np.float64) for k, v in pm_.items()}
    pool = (f"{len(tested)} of {pref['num_pairs']} pairs tested by at least one of {len(acc['CPM']['per_seed'])} "
            f"random {pref['num_train']}/{pref['num_test']} re-splits; the bootstrap resamples pairs with the splits' "
            "fitted models held fixed, so the fits' variance over training sets enters only through the average "
            "over splits")
    if "standard PM" in acc:
      rows.append(paired_bootstrap_row(
          experiment=setting, metric="held-out preference accuracy", a=per_pair["CPM"], b=per_pair["standard PM"],
          name_a="CPM", name_b="standard PM (linear head on frozen SmolLM2)", unit="pairs",
          paper_value="CPMs generalise better than standard PMs (HH-RLHF, SHP; Flan-T5 / GPT-3.5 features)",
          kind="claim", basis=BASIS_GENERALISE, notes=pool, a_by_seed=acc["CPM"]["per_seed"],
          b_by_seed=acc["standard PM"]["per_seed"], plots=plots))
    rows.append(paired_bootstrap_row(
        experiment=setting, metric="held-out preference accuracy", a=per_pair["CPM"], b=per_pair["length only"],
        name_a="CPM", name_b="length only", unit="pairs", paper_value="-", kind="measurement",
        notes=("a measurement, not a paper claim; CPM without the length feature "
               + stats.fmt_mean_se(acc["CPM without length"]["mean"], acc["CPM without length"]["se"])
               + " over splits"),
        a_by_seed=acc["CPM"]["per_seed"], b_by_seed=acc["length only"]["per_seed"]))
    single = sorted(((k[len("feature: "):], v["mean"], v["se"]) for k, v in acc.items() if k.startswith("feature: ")),
                    key=lambda t: -t[1])
    rows.append({"paper": P, "experiment": setting, "metric": "single-feature held-out accuracy (best 4 / worst 2)",
                 "ours": "; ".join(f"{k} {m:.3f}+-{s:.2g}" for k, m, s in single[:4] + single[-2:]),
                 "paper_value": "-", "holds": None, "kind": "measurement",
                 "notes": "each feature alone (sign fitted on train); all 13 in results.json"})
    bon = res.get("bon")
    if bon and "standard PM" in bon:
      last = -1
      ag = {k: [c[last] for c in bon[k]["agreement"]] for k in ("CPM", "standard PM")}
      gap = {k: [a[last] - b[last] for a, b in zip(bon[k]["score_a"], bon[k]["score_b"])] for k in ag}
      n_max = bon["CPM"]["n"][last]
      source = "SmolLM2 samples" if config.scorer == "smollm2" else "pool replies (fake scorer)"
      exp = (f"best-of-n on HH prompts ({config.bon.num_prompts} prompts x {config.bon.n} {source}), PM A / "
             f"PM B on disjoint halves")
      # Judged over the prompts (each prompt's value averaged over the half-splits), as the HH accuracy over pairs.
      per_prompt = {m: {k: np.mean(np.asarray(bon[k][m], np.float64), axis=0) for k in ag}
                    for m in ("agree_prompt", "gap_prompt")}
      rows.append(paired_bootstrap_row(
          experiment=exp, metric=f"A/B pick agreement at n={n_max}", a=per_prompt["agree_prompt"]["CPM"],
          b=per_prompt["agree_prompt"]["standard PM"], name_a="CPM", name_b="standard PM", unit="prompts",
          paper_value="CPMs are more robust to over-optimisation than standard PMs", kind="claim",
          basis="'CPMs ... are more robust to overoptimization than standard PMs' (abstract)",
          notes=("corr(A, B) over samples: CPM " + stats.fmt_mean_se(*stats.mean_se(bon["CPM"]["corr"]))
                 + ", PM " + stats.fmt_mean_se(*stats.mean_se(bon["standard PM"]["corr"]))),
          a_by_seed=ag["CPM"], b_by_seed=ag["standard PM"]))
      rows.append(paired_bootstrap_row(
          experiment=exp, metric=f"A-B score gap of the pick at n={n_max} (z-scored)",
          a=per_prompt["gap_prompt"]["CPM"], b=per_prompt["gap_prompt"]["standard PM"], name_a="CPM",
          name_b="standard PM", unit="prompts", direction="less",
          paper_value="the PM-B score of PM-A's pick lags less behind for CPMs (Fig. 2)", kind="claim",
          basis="'CPMs ... are more robust to overoptimization than standard PMs' (abstract; Fig. 2)",
          a_by_seed=gap["CPM"], b_by_seed=gap["standard PM"]))
    bj = res.get("bon_judge")
    if bj and "standard PM" in bj["win"]:
      win = {k: np.asarray(v, np.float64) for k, v in bj["win"].items()}
      h2h = np.asarray(bj["head_to_head"], np.float64)
      h2h_ci = stats.bootstrap_ci(h2h, n_boot=2000, seed=0)
      same = {k: int(np.sum(np.asarray(bj["picks"][k]) == bj["baseline_sample"])) for k in win}
      human = bj.get("human_agreement")
      human_note = ""
      if human:
        lo, hi = stats.bootstrap_ci(human, n_boot=2000, seed=0)
        human_note = (f"; the judge agrees with the HH-RLHF human label on {np.mean(human):.3f} [{lo:.3f}, {hi:.3f}] "
                      f"of {len(human)} scored pairs (chance 0.5)")
      rows.append(paired_bootstrap_row(
          experiment=(f"best-of-{bj['n']} on {bj['num_prompts']} HH prompts (SmolLM2 samples), each pick vs the "
                      f"prompt's first sample, judged by {'SmolLM2-135M' if 'SmolLM2' in bj['judge'] else bj['judge']} "
                      "(both orders, option log-probabilities)"),
          metric="judge win rate over a random sample", a=win["CPM"], b=win["standard PM"], name_a="CPM pick",
          name_b="standard PM pick", unit="prompts", paper_value="CPM picks preferred by the judge (Claude-2)",
          kind="claim", basis=BASIS_JUDGE,
          notes=(f"models fitted on all {res['preference']['num_pairs']} scored pairs; a win counts 1, a loss 0, a "
                 f"tie or the pick being the baseline sample 1/2 (CPM {same['CPM']}, PM {same['standard PM']} "
                 f"prompts); head to head the CPM pick beats the PM pick in {np.mean(h2h):.3f} [{h2h_ci[0]:.3f}, "
                 f"{h2h_ci[1]:.3f}]{human_note}; a 135M judge is a weak proxy for the paper's Claude-2, and "
                 f"{bj['num_prompts']} prompts are few: the row is the honest test at this scale, not the paper's")))
    t = res["timing"]
    hh = next(i for i, r in enumerate(rows) if r["experiment"] == setting)
    rows[hh]["notes"] = (rows[hh].get("notes", "") + f"; run {t['wall_s']:.0f}s wall / {t['cpu_s']:.0f}s CPU"
                         + (f", scoring {t['score_s']:.0f}s ({t['features_per_s']:.1f} features/s)"
                            if t.get("features_per_s") else ", scores from the cache"))
  # The rule of the library: 'no' only where a reference has ruled out a bug. Here the fit equals
  # scikit-learn's (tests) and the feature scores equal lm.choice_logprobs (tests), so a 'no' on HH-RLHF
  # stands for the setting (a 135M feature extractor, a frozen-backbone PM), and says so.
  for r in rows:
    if r.get("holds") == "no" and r["experiment"].startswith(("HH-RLHF", "best-of-n")):
      r["notes"] = (r.get("notes") or "") + ("; 'no' checked against references: the logistic fit equals "
                                             "scikit-learn's and the scores equal lm.choice_logprobs (tests)")
  return rows


BENCH_WEIGHTS = (1.2, 0.8, 0.0, 0.6, 0.0, 0.9, 0.0, 0.4, -0.7, -0.5, -0.3, -0.6, 0.0, 0.3)

_FIRST_CALL = """
import os, sys, time
sys.path.insert(0, os.getcwd())
if os.environ.get("ICLR24_JAX_COMPILATION_CACHE") != "0":
  from iclr24_jax.common.compile_cache import enable_compilation_cache
  enable_compilation_cache()
import numpy as np
from iclr24_jax.papers.cpm import data, model
d = data.make_synthetic(0, {n}, {weights})
t0, c0 = time.perf_counter(), time.process_time()
model.cross_validate(d["fa"], d["fb"], d["labels"])
print(time.perf_counter() - t0, time.process_time() - c0)
"""


def _first_call_s(n: int, cached: bool) -> tuple[float | None, float | None]:
  """A user's first `cross_validate` call (tracing and compilation) in a fresh process: compilation cache off, or
  on (a first process fills the cache, the second is timed: its executable loads from disk whole,
  `compile_cache.cached_call`). Returns (wall s, CPU s)
  ((None, None) if the child failed)."""
  import os
  import subprocess
  import sys
  env = dict(os.environ, ICLR24_JAX_COMPILATION_CACHE="1" if cached else "0")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  try:
    for _ in range(2 if cached else 1):
      out = subprocess.run([sys.executable, "-c", _FIRST_CALL.format(n=n, weights=BENCH_WEIGHTS)], env=env,
                           cwd=root, capture_output=True, text=True, timeout=600, check=True)
    wall, cpu = out.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)
  except Exception:  # noqa: BLE001  (reported as missing, never guessed)
    return None, None


def official_grid_search(x: np.ndarray, labels: np.ndarray, solvers=("liblinear", "saga")):
  """The official model selection (`fit_logistic.train_model_g`): scikit-learn's GridSearchCV over penalty
  {l1, l2} x C logspace(-5, 5, 12) x the solvers, cv=8 (StratifiedKFold(8)), accuracy, all cores.

  Args:
    x: [N, F] float64 pooled-standardised pair differences.
    labels: [N] in {0, 1}.
    solvers: the official grid lists ('liblinear', 'saga').

  Returns:
    the fitted GridSearchCV.
  """
  import warnings
  from sklearn.linear_model import LogisticRegression
  from sklearn.model_selection import GridSearchCV
  from sklearn.pipeline import Pipeline
  grid = {"classifier__penalty": ["l1", "l2"], "classifier__C": np.logspace(-5, 5, 12),
          "classifier__solver": list(solvers)}
  search = GridSearchCV(Pipeline([("classifier", LogisticRegression(fit_intercept=False, random_state=42))]), grid,
                        cv=8, scoring="accuracy", n_jobs=-1)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")   # the official script silences saga's convergence warnings the same way
    return search.fit(x, labels)


def model_selection_vs_sklearn(n: int, repeats: int = 3) -> list[dict]:
  """`cross_validate` against the official GridSearchCV on the same pairs (synthetic, 14 features), side by side.

  Both run the official grid with the same StratifiedKFold(8) folds; calls alternate (medians of `repeats`
  after one untimed call each), so both see the same machine load. Rows: the full official grid (liblinear and
  saga) and liblinear alone, with ratio = scikit-learn's median / ours, whether the chosen (penalty, C) agrees,
  and the largest difference of the two CV tables (mean fold accuracy).

  Args:
    n: pairs.
    repeats: timed calls per side.

  Returns:
    rows (name, size, median_s, cpu_s, first_call_s, first_call_cpu_s (cache off), first_call_cached_s,
    first_call_cached_cpu_s (target <= 1 s), peer, peer_median_s,
    ratio, same_choice,
    same_choice_up_to_ties, table_max_diff, load).
  """
  import os
  import statistics
  d = data_lib.make_synthetic(0, n, BENCH_WEIGHTS)
  pooled = np.concatenate([d["fa"], d["fb"]])
  mean, std = pooled.mean(0), pooled.std(0) + model_lib.STD_EPS
  x = (d["fa"] - mean) / std - (d["fb"] - mean) / std          # the official train_model_g input (float64)
  (first, first_cpu), (first_cached, first_cached_cpu) = _first_call_s(n, cached=False), _first_call_s(n, cached=True)
  ours = lambda: model_lib.cross_validate(d["fa"], d["fb"], d["labels"])
  _, info = ours()
  rows = []
  for solvers in (("liblinear", "saga"), ("liblinear",)):
    official_grid_search(x, d["labels"], solvers)              # untimed: starts the worker pool
    t_ours, t_peer, cpu_ours = [], [], []
    for _ in range(repeats):
      t0, c0 = time.perf_counter(), time.process_time()
      ours()
      t_ours.append(time.perf_counter() - t0)
      cpu_ours.append(time.process_time() - c0)
      t0 = time.perf_counter()
      search = official_grid_search(x, d["labels"], solvers)
      t_peer.append(time.perf_counter() - t0)
    res = search.cv_results_
    diff = 0.0
    for i, params in enumerate(res["params"]):
      j = int(np.argmin(np.abs(np.asarray(model_lib.OFFICIAL_CS) - params["classifier__C"])))
      diff = max(diff, abs(res["mean_test_score"][i] - info["table"][params["classifier__penalty"]][j]))
    best = search.best_params_
    same = (info["penalty"], info["C"]) == (best["classifier__penalty"], best["classifier__C"])
    # A different choice is a tie when scikit-learn's choice scores, in our table, within the tables' largest
    # difference of our best (liblinear stops at tol 1e-4, so a fold can differ by one borderline pair).
    j_best = int(np.argmin(np.abs(np.asarray(model_lib.OFFICIAL_CS) - best["classifier__C"])))
    tie = info["cv_accuracy"] - info["table"][best["classifier__penalty"]][j_best] <= diff + 1e-12
    med, peer = statistics.median(t_ours), statistics.median(t_peer)
    rows.append({"name": "cpm/model_selection", "size": f"N={n} pairs, F=14", "median_s": med,
                 "cpu_s": statistics.median(cpu_ours), "first_call_s": first, "first_call_cpu_s": first_cpu,
                 "first_call_cached_s": first_cached, "first_call_cached_cpu_s": first_cached_cpu,
                 "peer": "scikit-learn GridSearchCV (" + " + ".join(solvers) + ", n_jobs=-1)", "peer_median_s": peer,
                 "ratio": peer / med, "target": ">= 2" if len(solvers) == 2 else "-",
                 "same_choice": bool(same), "same_choice_up_to_ties": bool(same or tie),
                 "table_max_diff": diff, "load": os.getloadavg()[0], "repeats": repeats, "mesh_devices": 1,
                 "notes": f"ours {info['penalty']} C={info['C']:.3g} cv {info['cv_accuracy']:.4f}; scikit-learn "
                          f"{best['classifier__penalty']} {best['classifier__solver']} C={best['classifier__C']:.3g} "
                          f"cv {search.best_score_:.4f}; first calls in a fresh process (compilation cache off / on)"})
  return rows


def benchmark(quick: bool = True) -> list[dict]:
  """The official model selection against scikit-learn side by side, `fit` time vs N, and features scored per
  second with SmolLM2 (13 features of a reply per prefill)."""
  from iclr24_jax.common import bench
  rows = []
  for n in (1000, 10_000):
    rows += model_selection_vs_sklearn(n, repeats=3 if quick else 7)
  rng = np.random.default_rng(0)
  for n in ((100, 1000, 10_000) if quick else (100, 1000, 10_000, 100_000)):
    fa, fb = rng.normal(size=(n, 14)), rng.normal(size=(n, 14))
    y = (rng.random(n) < 0.5).astype(np.int32)
    for pen in ("l2", "l1"):
      fn = jax.jit(functools.partial(model_lib.fit, penalty=pen, C=1.0))
      r = bench.time_fn(fn, jnp.asarray(fa), jnp.asarray(fb), jnp.asarray(y), repeats=3, items=n,
                        name=f"cpm/fit_{pen}", size=f"N={n} pairs, F=14")
      rows.append(r)
  try:
    scorer = scoring.SmolLMScorer(template="short", batch_size=4)
  except Exception as e:  # noqa: BLE001  (no SmolLM2 file: report and skip)
    rows.append({"name": "cpm/smollm2_features", "error": str(e)[:200]})
    return rows
  pairs = data_lib.load_pairs(8 if quick else 32, seed=123, max_chars=600)
  hs = [p["history"] for p in pairs]
  rs = [p["reply_a"] for p in pairs]
  scorer.score(hs[:4], rs[:4])  # compile
  t0, c0, k0 = time.perf_counter(), time.process_time(), scorer.num_tokens
  scorer.score(hs, rs)
  dt, cpu = time.perf_counter() - t0, time.process_time() - c0
  rows.append({"name": "cpm/smollm2_features", "size": f"{len(rs)} replies x 13 features, 'short' prompts",
               "median_s": dt, "items_per_s": len(rs) * 13 / dt, "cpu_s": cpu,
               "tokens_per_s": (scorer.num_tokens - k0) / dt, "tokens_per_reply": (scorer.num_tokens - k0) / len(rs)})
  return rows


def scale_program(config, mesh):
  """The paper-size routine for `experiments.scale`: one feature-scoring step of the Flan-T5-XL extractor.

  `scale.batch_size` feature prompts of `scale.enc_len` tokens encoded once, with the distribution of the first
  answer token over '1'..'10' (`configs/cpm.py:paper`); float32 weights as the official pipeline loads them.

  Args:
    config: `get_config('paper')`.
    mesh: the ('data', 'model') mesh.

  Returns:
    common.scale.Program (params, enc_ids, enc_mask, option_ids) -> [B, 10] log-probabilities.
  """
  from iclr24_jax.common import scale as scale_lib
  from iclr24_jax.lm import scale as lm_scale
  s = scale_lib.paper_scale(config, "cpm")
  return lm_scale.t5_choice_program(
      "Flan-T5-XL feature scoring step (13 features x replies, first answer token)", lm_scale.named_model(s.model),
      mesh, s.batch_size, s.enc_len, s.num_options, param_dtype=jnp.dtype(s.param_dtype),
      notes="GPT-3.5, the paper's other extractor, is closed; Flan-T5-XL is the official code's default.",
      paper_hardware=s.paper_hardware, paper_time=s.paper_time)
