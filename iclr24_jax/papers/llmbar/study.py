"""llmbar: the small-scale reproduction (`reproduce`) and the benchmark (`benchmark`).

The method lives in the package's method modules and `experiment.run`; this module holds the studies
that the paper's claims are checked with (experiments/reproduce.py and experiments/benchmark.py call them).
"""
from __future__ import annotations

import os
from typing import Any, Callable

from iclr24_jax.common import bench, stats
from iclr24_jax.papers.llmbar import data as data_lib
from iclr24_jax.papers.llmbar import evaluator
from iclr24_jax.papers.llmbar import model as model_lib
from iclr24_jax.papers.llmbar import scoring as scoring_lib
from iclr24_jax.papers.llmbar.experiment import PAPER, PAPER_FOR, plot_subsets, run


# The reproduction's sample and budgets, log-probability judging: Vanilla on all 419 pairs; Rules+Metrics+
# Reference on the first 20 pairs of each subset (100 pairs, file order), paired with Vanilla on the same pairs.
# Deviation: the paper runs RMR on all 419 pairs too; its generated metrics + reference and ~790-token prompts cost
# ~4x Vanilla's scoring (README: cost), which the main job's 75-minute budget cannot hold on 2 cores.
# REPRO_RMR_FIRST = 0 runs RMR on all 419 (cached and resumable).
REPRO_PER_SUBSET = 0  # pairs per subset; 0 = all 419; k > 0: a stratified k per subset
# Rules+Metrics+Reference on the first REPRO_RMR_FIRST of Vanilla's pairs per subset; 0 = the same pairs as Vanilla.
REPRO_RMR_FIRST = 20
REPRO_SEED = 0
# The auxiliary texts' budgets (metrics questions, reference output) cut from the official 150 / 384 tokens to fit.
REPRO_MAX_NEW_TOKENS = {"direct": 5, "cot": 96, "metrics": 64, "reference": 96, "rating": 3}


# Headline claims of the abstract that no row tests yet (experiments/reproduce.py tables them as 'not run').
NOT_RUN = [
    stats.not_run_row(
        paper="llmbar", experiment="several evaluators (LLM x prompting strategy) on all 419 pairs",
        metric="accuracy spread across evaluators",
        basis=("'different evaluators (i.e., combinations of LLMs and prompts) exhibit distinct performance on "
               "LLMBar' (abstract; Table 2)"),
        reason="one judge LLM (SmolLM2-135M-Instruct) is run; the claim compares LLMs (GPT-4, ChatGPT, LLaMA-2, ...)",
        variant="configs/llmbar.py:<strategy> with config.judge set to each of several judge LLMs"),
    stats.not_run_row(
        paper="llmbar", experiment="the best evaluator vs expert humans",
        metric="accuracy gap to human agreement (94%)",
        basis="'even the highest-scoring ones have substantial room for improvement' (abstract)",
        reason="needs a strong judge (GPT-4 class); a 135M judge at chance says nothing about the best evaluators",
        variant="configs/llmbar.py:rules_metrics_reference with a GPT-4-class judge on all 419 pairs"),
]


def _repro_config(strategy: str, per_subset: int, take_first: int = 0, *, get_config: Callable[[str], Any]):
  c = get_config(strategy)
  c.data.per_subset = per_subset
  c.data.take_first = take_first
  c.max_new_tokens = dict(REPRO_MAX_NEW_TOKENS)
  c.seed = REPRO_SEED
  c.judge_mode = "logprob"
  return c


def _ci(t: dict) -> str:
  return f"{t['accuracy']:.1f} [{t['ci'][0]:.1f}, {t['ci'][1]:.1f}]"


def reproduce(workdir: str, fast: bool = False, per_subset: int | None = None,
              *, get_config: Callable[[str], Any]) -> list[dict]:
  """SmolLM2-135M-Instruct as a log-probability judge, Vanilla and Rules+Metrics+Reference, vs the paper.

  Both strategies run in 'logprob' mode (order-debiased log-odds of "Output (a)" vs "Output (b)", ties below
  tau as unparseable answers); the auxiliary metrics and reference are still generated (greedy, budgets
  REPRO_MAX_NEW_TOKENS). Claims are judged with bootstrap 95% intervals over pairs (`scoring.bootstrap_gap`):
  'yes' where the interval of the difference lies beyond 0 in the claimed direction, 'inconclusive' where it
  contains 0, 'no' where it lies beyond 0 against the claim.

  Args:
    workdir: output folder (each strategy's cache lives in it, so a rerun resumes).
    fast: a stratified 2 pairs per subset (10 of 419), a smoke run.
    per_subset: pairs per subset for both strategies (0 = all 419). Default: REPRO_PER_SUBSET (0: all 419, as
      the paper does) and Rules+Metrics+Reference on the first REPRO_RMR_FIRST of them (0: the same pairs).
    get_config: `get_config(variant)` of configs/llmbar.py (the runners pass it; tests pass the module's).

  Returns:
    Reproduction rows (paper, experiment, metric, ours, paper_value, holds, notes, plots).
  """
  k = 2 if fast else (REPRO_PER_SUBSET if per_subset is None else per_subset)
  first = 0 if (fast or per_subset is not None) else REPRO_RMR_FIRST
  samples = {"vanilla": "all 419 pairs" if k <= 0 else f"stratified {k}/subset (seed {REPRO_SEED})"}
  samples["rules_metrics_reference"] = (samples["vanilla"] if first <= 0 else
                                        f"the first {first} pairs of each subset"
                                        + (f"'s {k}" if k > 0 else "") + f" (file order; {5 * first} pairs)")
  rows, tables, res_by = [], {}, {}
  for strategy in ("vanilla", "rules_metrics_reference"):
    sample = samples[strategy]
    take = first if strategy == "rules_metrics_reference" else 0
    res = run(_repro_config(strategy, k, take, get_config=get_config), os.path.join(workdir, strategy))
    res_by[strategy] = res
    t = res["subsets"]
    tables[f"SmolLM2 {strategy} (logprob)"] = t
    ref = PAPER[PAPER_FOR[strategy]]
    note = (f"SmolLM2-135M-Instruct, log-probability judge (order-debiased log-odds, tie tau {res['tie_tau']:g} "
            f"nats); {sample}; bootstrap 95% interval over pairs; raw per-order picks: accuracy "
            f"{100 * res['raw_accuracy']:.1f}%, agreement {100 * res['raw_agreement']:.1f}%, first position "
            f"(a) picked in {100 * res['position_a_rate']:.1f}% of raw judgements (mean bias "
            f"{res['mean_position_bias']:+.2f} nats toward (a)); debiased ties {res.get('debiased_ties', 0)} of "
            f"{res['n']} pairs (scored by their raw picks); "
            f"{res['num_generations']} judge prompts in {res['seconds']:.0f}s ({res['cache_hits']} cached)")
    for subset in ("Natural", "Adversarial"):
      rows.append({"paper": "llmbar", "experiment": f"{strategy}, {subset}", "metric": "accuracy % [95% CI]",
                   "ours": _ci(t[subset]),
                   "paper_value": f"GPT-4 {ref[subset][0]} (ChatGPT Vanilla {PAPER['ChatGPT Vanilla'][subset][0]})",
                   "holds": None, "kind": "measurement", "notes": note + f"; GPT-4 agreement {ref[subset][1]}"})
    credit = res["credit"]
    gap = scoring_lib.bootstrap_gap(credit, "Natural", credit, "Adversarial", paired=False, seed=REPRO_SEED)
    rows.append(_claim_row(f"{strategy}: Adversarial harder than Natural", "Natural - Adversarial accuracy (pts)",
                           gap, f"> 0 (GPT-4 {ref['Natural'][0] - ref['Adversarial'][0]:.1f})", sample,
                           "unpaired: pairs resampled within each subset; Adversarial = mean of the 4 subsets",
                           basis=("Adversarial 'may possess deceptive qualities that mislead an LLM evaluator' "
                                  "(abstract; Table 2: GPT-4 Vanilla 93.5 on Natural, 73.1 on Adversarial)")))
  c_v, c_r = res_by["vanilla"]["credit"], res_by["rules_metrics_reference"]["credit"]
  c_v = {name: c_v[name][:len(c_r[name])] for name in c_r}  # the same pairs (RMR runs on the first ones)
  sample = samples["rules_metrics_reference"]
  for group in ("Adversarial", "Natural"):
    g_paper = PAPER["GPT-4 Rules+Metrics+Reference"][group][0] - PAPER["GPT-4 Vanilla"][group][0]
    gap = scoring_lib.bootstrap_gap(c_r, group, c_v, group, paired=True, seed=REPRO_SEED)
    rows.append(_claim_row(f"Rules+Metrics+Reference improves over Vanilla, {group}",
                           "RMR - Vanilla accuracy (pts)", gap, f"> 0 (GPT-4 {g_paper:+.1f})", sample,
                           "paired by pair (same pairs, both strategies)",
                           basis=("'a novel suite of prompting strategies that further close the gap between LLM "
                                  "and human evaluators' (abstract; Table 2, Rules+Metrics+Reference)")))
  for name in ("GPT-4 Vanilla", "GPT-4 Rules+Metrics+Reference", "ChatGPT Vanilla"):
    tables[name + " (paper)"] = {s_: {"accuracy": a, "agreement": g} for s_, (a, g) in PAPER[name].items()}
  plot = plot_subsets(tables, os.path.join(workdir, "llmbar_vs_paper.png"),
                      title=f"LLMBar: SmolLM2-135M log-prob judge ({samples['vanilla']}) vs the paper")
  for r in rows:
    r["plots"] = [plot]
  return rows


def _claim_row(experiment: str, metric: str, gap: dict, paper_value: str, sample: str, how: str, basis: str) -> dict:
  holds = gap["holds"]
  why = {"yes": "the 95% interval lies above 0", "inconclusive": "the 95% interval contains 0",
         "no": ("the 95% interval lies below 0: for this judge the claim fails (the scores are the model's own "
                "log-probabilities, equal to an uncached forward to 1e-4, and the protocol's scorer reproduces "
                "the official statistics, so this is not a scoring bug)")}[holds]
  return {"paper": "llmbar", "experiment": experiment, "metric": metric,
          "ours": f"{100 * gap['diff']:+.1f} [{100 * gap['lo']:+.1f}, {100 * gap['hi']:+.1f}]",
          "paper_value": paper_value, "holds": holds, "kind": "claim", "basis": basis,
          "notes": f"bootstrap 95% interval (2000 resamples; {how}); {why}; {sample}"}


def benchmark(quick: bool = True) -> list[dict]:
  """Judgements/s with SmolLM2 on CPU: log-probability judging vs generating the answer, batched vs not.

  Eight Vanilla prompts (four instances, both orders) whose rendered length falls in one width bucket
  (257-384 tokens). 'logprob': `judge.choice_logprobs(prompts, ["Output (a)", "Output (b)"])` (one prefill per
  prompt, the shared template prefix prefilled once, 8 prompts per call) and the same without prefix sharing.
  'generate': a direct answer of 5 new tokens (prefill-bound) and, unless quick, a 48-token generation, 8 per call
  and one at a time, always generated in full (no stop token).

  Returns:
    Rows with name, size, batch, mesh_devices, first_call_s (incl. compilation), median_s, items_per_s
    (judgements/s), and speedup ratios.
  """
  from iclr24_jax import lm
  judge = model_lib.SmolLMJudge(stop_ids=())
  data = data_lib.load(None)
  def tokens(inst):
    return len(judge.tokenizer.encode(judge.render(evaluator.build_prompt("vanilla", inst, 0))))
  chosen = [inst for name in data for inst in data[name] if 256 < tokens(inst) <= 384][:4]
  prompts = [evaluator.build_prompt("vanilla", inst, o) for inst in chosen for o in (0, 1)]
  rendered = [judge.render(p) for p in prompts]
  size = f"{len(prompts)} prompts of 257-384 tok"
  repeats = 1 if quick else 3
  rows = []
  for share in (True, False):
    fn = lambda: lm.choice_logprobs(judge.params, judge.config, judge.tokenizer, rendered,
                                    list(evaluator.ANSWER_OPTIONS), batch_size=8, share_prefix=share)
    rows.append(bench.time_host(fn, repeats=repeats, items=len(prompts), name="llmbar/smollm2_vanilla_logprob",
                                size=size + (", shared template prefix" if share else ", no prefix sharing"),
                                batch=8, mesh_devices=1,
                                notes="items/s = judgements/s (log p of 'Output (a)' and 'Output (b)', one prefill)"))
  rows[0]["speedup_vs_no_sharing"] = rows[1]["median_s"] / rows[0]["median_s"]
  for max_new in ((5,) if quick else (5, 48)):
    pair = []
    for bsz in (8, 1):
      fn = lambda: judge(prompts, max_new, kind="direct", batch_size=bsz)
      pair.append(bench.time_host(fn, repeats=repeats, items=len(prompts), name="llmbar/smollm2_vanilla_judge",
                                  size=f"{size} (width 384), {max_new} new", batch=bsz, mesh_devices=1,
                                  notes="items/s = judgements/s (greedy, logit bias, KV cache, no early stop)"))
    pair[0]["speedup_vs_batch1"] = pair[1]["median_s"] / pair[0]["median_s"]
    if max_new == 5:
      rows[0]["speedup_vs_generate5_batch8"] = pair[0]["median_s"] / rows[0]["median_s"]
    rows.extend(pair)
  return rows


def scale_program(config, mesh):
  """The paper-size routine for `experiments.scale`: one judging batch of the Llama-2-70B judge.

  The prefill of `scale.batch_size` Vanilla prompts of `scale.seq_len` tokens and the log-probabilities of the two
  verdicts, bfloat16 weights sharded over the mesh (`configs/llmbar.py:paper`; GPT-4 is closed, Llama-2-70B-chat
  is the paper's open judge).

  Args:
    config: `get_config('paper')`.
    mesh: the ('data', 'model') mesh.

  Returns:
    common.scale.Program (params, ids, mask, option_ids) -> [B, 2] log-probabilities.
  """
  import jax.numpy as jnp
  from iclr24_jax.common import scale as scale_lib
  from iclr24_jax.lm import scale as lm_scale
  s = scale_lib.paper_scale(config, "llmbar")
  return lm_scale.llama_choice_program(
      "Llama-2-70B judging batch (Vanilla, prefill + verdict log-probabilities)",
      lm_scale.named_model(config.model.name), mesh, s.batch_size, s.seq_len, s.num_options,
      param_dtype=jnp.dtype(s.param_dtype),
      notes="GPT-4 is closed: the Llama-2-70B shape stands in. The paper's generate mode adds <= 50 decoding "
            "steps per prompt.", paper_hardware=s.paper_hardware, paper_time=s.paper_time)
