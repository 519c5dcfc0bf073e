"""finetune_dissect: the small-scale reproduction (`reproduce`) and the benchmark (`benchmark`).

(a) The estimator against a closed form: `decompose` on the analytic grammar's log-probabilities before and after
    known changes of its topic prior, style prior and fact table (max error over the three components).
(b) The synthetic study: tiny Llamas pretrained on the grammar's general mix, finetuned on its domain mix (full,
    LoRA rank 1 and 8; 3 seeds, paired by seed), the paper's claims judged with `common.stats`:
    topic and style reach half their final value before factual knowledge does; factual grows with capacity
    (rank 1 < rank 8 < full) while topic and style need little (rank-1 / full ratio higher than factual's); topic
    and style act at the start of a text (share of |contrast| in the first 25% of positions above factual's).
(c) Real text (`real_text=True`, on in the main job; ~300 CPU-s with 108 rewrites to write, ~130 once cached):
    SmolLM2-135M-Instruct rewrites of 36 MaRio StrategyQA questions and rationales (cached), MiniLM-filtered,
    and the components after a short LoRA finetuning of SmolLM2 on 48 domain documents, with bootstrap
    intervals over documents; 3 finetuning seeds, the claim rows judged on per-seed means.
"""
from __future__ import annotations

import math
import os
import time
from typing import Any, Callable

import jax
import numpy as np

from iclr24_jax.common import bench
from iclr24_jax.common import stats
from iclr24_jax.papers.finetune_dissect import dissect
from iclr24_jax.papers.finetune_dissect import experiment
from iclr24_jax.papers.finetune_dissect import finetune
from iclr24_jax.papers.finetune_dissect import grammar
from iclr24_jax.papers.finetune_dissect import real

PAPER = "finetune_dissect"
# Why the synthetic rows are checks: a synthetic grammar fixes its answer when it is written. Topic and style are one
# shared prior each (once the base reads the context, finetuning needs one logit shift per factor, on the first topic /
# style word), the domain's facts are 512 associations the base has never seen. Per-document topic variation or facts
# with shared structure would only fix a different answer (whatever relative complexity the factors are given decides
# speed, capacity and position), so these rows verify that the estimator and the training recover what the design
# implies, and the paper's claims are judged on real text (held-out probes) or listed as not run.
DESIGN = ("one shared prior each against 512 fact items the base has never seen, so the outcome is fixed by the "
          "grammar's design (any synthetic grammar fixes its own answer)")
SPEED = ("a check, not evidence for 'topic and style priors ... are learned rapidly' (abstract): " + DESIGN)
CAPACITY = ("a check, not evidence for 'require little model capacity' / 'factual knowledge ... requires significant "
            "model capacity' (abstract): " + DESIGN)
POSITION = ("a check, not evidence for 'primarily at the beginning of a text' (abstract): in the grammar only the "
            "first topic / style word is left to the prior once a model reads the context (the base does: see the "
            "base-fit row), by its design")
SHARE = ("not evidence against 'actual knowledge learning only contributes to a small fraction of the total "
         "probability change' (abstract): the grammar's domain is 512 facts worth up to ln(num_values) nats each, "
         "four per document, against one topic and one style prior shift per document, so facts dominate by design; "
         "the real-text held-out rows judge the claim")
BASE_FIT = ("verifies the pretrained base: a base that has not learned to read the context turns the topic and style "
            "rows into 'learn an output bias' (every topic word pays the prior)")
REAL = real.REAL

# Headline claims of the abstract that no row tests yet (experiments/reproduce.py tables them as 'not run').
NOT_RUN = [
    stats.not_run_row(
        paper=PAPER, experiment="real text: topic and style learning speed and capacity",
        metric="steps to half the final value; LoRA rank 1 / full",
        basis=("'the adaptation of topic and style priors behave akin to learning simple features: they are learned "
               "rapidly and require little model capacity' (abstract)"),
        reason="tested only on the synthetic grammar, where it holds by construction (check rows)",
        variant="configs/finetune_dissect.py real-text arm with LoRA ranks 1 / 8 and full, evaluated along finetuning"),
    stats.not_run_row(
        paper=PAPER, experiment="real text: factual learning speed and capacity",
        metric="steps to half the final value; LoRA rank 1 / full",
        basis=("'factual knowledge is learned stably but slowly and requires significant model capacity to learn' "
               "(abstract)"),
        reason="tested only on the synthetic grammar, where it holds by construction (check rows)",
        variant="configs/finetune_dissect.py real-text arm with LoRA ranks 1 / 8 and full, evaluated along finetuning"),
    stats.not_run_row(
        paper=PAPER, experiment="topic and style learned independently", metric="components under single shifts",
        basis="'They are also learned independently' (abstract)",
        reason="no arm shifts topic alone or style alone to compare with shifting both",
        variant="a topic-only and a style-only domain mix of the grammar (and of the real-text rewrites) vs both"),
    stats.not_run_row(
        paper=PAPER, experiment="real text: where in a document topic and style change",
        metric="share of |contrast| in the first 25% of positions",
        basis="'They are also learned independently and primarily at the beginning of a text sequence' (abstract)",
        reason="the real-text study does not break its components down by position",
        variant=("configs/finetune_dissect.py real-text arm with dissect.decompose(...)['by_position'] judged over "
                 "seeds")),
]


def analytic_recovery_error(seed: int = 0, num_documents: int = 64) -> float:
  """Max |decompose - truth| over topic, style, factual after simultaneous random changes of the grammar's topic
  prior, style prior and fact table (truth from the changes alone; nats per document).

  Args:
    seed: seeds the grammar's fact tables, the documents, their probe versions and the random changes.
    num_documents: N on-domain documents probed.

  Returns:
    The largest absolute error of the three components (0 up to float rounding when `decompose` is exact).
  """
  spec = grammar.GrammarSpec(domain_topic_prob=1.0, domain_style_prob=1.0)   # probes: on-domain documents
  key = jax.random.key(seed)
  tables = grammar.fact_tables(jax.random.fold_in(key, 1), spec)
  ids = grammar.sample_documents(jax.random.fold_in(key, 2), spec, num_documents, tables, "domain")
  probes = {k: np.asarray(v) for k, v in grammar.probe_versions(jax.random.fold_in(key, 3), spec, ids,
                                                                tables).items()}
  rng = np.random.default_rng(seed)
  gp0 = grammar.general_params(spec, tables, confidence=0.9)
  u_t, u_s = rng.normal(size=spec.num_topics), rng.normal(size=spec.num_styles)
  a = rng.normal(size=spec.num_domain_subjects)
  gp1 = grammar.shift_params(gp0, spec, tables, u_t, u_s, a)
  deltas = {v: grammar.analytic_token_logprobs(gp1, spec, x) - grammar.analytic_token_logprobs(gp0, spec, x)
            for v, x in probes.items()}
  mask = np.ones(probes["original"].shape, bool)
  mask[:, 0] = False
  out = dissect.decompose(deltas, mask, reduction="sum")
  ps, pt, pj = (spec.positions(k) for k in range(3))
  t_o = (probes["topic"][:, pt[0]] - spec.topic_start) // spec.topic_vocab
  s_o = (probes["style"][:, ps[0]] - spec.style_start) // spec.style_vocab
  dsub = probes["original"][:, pj] - spec.subject_start - spec.num_general_subjects
  truth = {"topic": np.mean(u_t[spec.domain_topic] - u_t[t_o]), "style": np.mean(u_s[spec.domain_style] - u_s[s_o]),
           "factual": np.mean(a[dsub].sum(-1))}
  return float(max(abs(out[k] - v) for k, v in truth.items()))


def base_fit_row(study: dict, experiment: str, tol: float = 0.05) -> dict:
  """The check that the pretrained bases model the grammar: on fresh documents, every seed's loss is within `tol`
  nats/token of the grammar's entropy and its later topic and style words within `tol` of ln V_t and ln V_s (a base
  that ignores the context pays ln(T V_t) and ln(S V_s) there).

  Args:
    study: `finetune.synthetic_study` output (base_fit {slot: [S]}, entropy, spec).
    experiment: the row's experiment label.
    tol: tolerance in nats (per token; per topic / style word).

  Returns:
    A check row: holds 'yes' when every seed meets all three bounds, else 'no'.
  """
  fit, ent, spec = study["base_fit"], study["entropy"], study["spec"]
  gaps = {"loss - entropy": fit["per_token"] - ent["per_token"],
          "later topic - ln V_t": fit["later_topic"] - ent["later_topic"],
          "later style - ln V_s": fit["later_style"] - ent["later_style"]}
  ok = all(bool(np.all(np.abs(g) < tol)) for g in gaps.values())
  fmt = lambda v: "/".join(f"{x:.3f}" for x in np.ravel(v))
  ours = (f"loss {fmt(fit['per_token'])} vs entropy {ent['per_token']:.3f}; later topic words "
          f"{fmt(fit['later_topic'])} vs ln {spec.topic_vocab} = {ent['later_topic']:.3f}; later style words "
          f"{fmt(fit['later_style'])} vs ln {spec.style_vocab} = {ent['later_style']:.3f} (per seed)")
  return dict(paper=PAPER, experiment=experiment, metric="pretrained base on fresh general-mix documents (nats)",
              ours=ours, paper_value="(check) the base models the grammar before finetuning",
              holds="yes" if ok else "no", kind="check", basis=BASE_FIT,
              notes=(f"tolerance {tol} nats on every seed; first topic word {fmt(fit['first_topic'])} vs "
                     f"ln(T V_t) = {ent['first_topic']:.3f}, values {fmt(fit['value'])} vs {ent['value']:.3f}; max "
                     "|gap| " + ", ".join(f"{k} {np.max(np.abs(g)):.3f}" for k, g in gaps.items())),
              judgement={k: [float(x) for x in np.ravel(v)] for k, v in gaps.items()})


def prior_shift_row(study: dict, experiment: str, tol: float = 0.1) -> dict:
  """The check that finetuning learns the domain mix's topic and style priors where the grammar puts them: the
  by-position contrast at the first topic (style) word against its closed form, on every seed and method.

  The domain mix gives its topic probability p and each other topic (1 - p) / (T - 1), the general mix 1 / T each, so
  a model that has learned the domain mix (and reads the context) changes the first topic word's log-probability
  by ln(p T) in the original and ln((1 - p) T / (T - 1)) in the topic version: the contrast is
  ln(p (T - 1) / (1 - p)) (ln 12 for p 0.8, T 4), and likewise ln(p (S - 1) / (1 - p)) for the style (ln 8, S 3).

  Args:
    study: `finetune.synthetic_study` output (per method by_position {component: [S, T]}; spec).
    experiment: the row's experiment label.
    tol: tolerance in nats.

  Returns:
    A check row: 'yes' when every seed and method is within `tol` of both closed forms, else 'no'.
  """
  spec = study["spec"]
  truth = {"topic": math.log(spec.domain_topic_prob * (spec.num_topics - 1) / (1 - spec.domain_topic_prob)),
           "style": math.log(spec.domain_style_prob * (spec.num_styles - 1) / (1 - spec.domain_style_prob))}
  where = {"topic": int(spec.positions(1)[0]), "style": int(spec.positions(0)[0])}
  got = {m: {k: np.asarray(c["by_position"][k])[:, where[k]] for k in truth} for m, c in study["methods"].items()}
  err = max(float(np.max(np.abs(v[k] - truth[k]))) for v in got.values() for k in truth)
  fmt = lambda v: "/".join(f"{x:.2f}" for x in v)
  ours = "; ".join(f"{m}: topic {fmt(v['topic'])}, style {fmt(v['style'])}" for m, v in got.items())
  return dict(paper=PAPER, experiment=experiment,
              metric="contrast at the first topic / style word after finetuning (nats), per seed",
              ours=f"{ours} vs closed form topic {truth['topic']:.3f}, style {truth['style']:.3f}",
              paper_value="(check) finetuning learns the domain's topic and style priors",
              holds="yes" if err < tol else "no", kind="check",
              basis="verifies the trained pipeline against the grammar's closed form (the domain mix's prior ratios)",
              notes=f"max |error| {err:.3f} nats over seeds and methods (tolerance {tol}); the closed form assumes "
                    "the model has learned the domain mix's priors exactly",
              judgement={m: {k: [float(x) for x in v[k]] for k in truth} for m, v in got.items()})


def synthetic_rows(study: dict, plots: list[str]) -> list[dict]:
  """The rows of the synthetic study (module docstring, (b)): the base-fit check, the speed, capacity and position
  checks, and the factual share of the change (measurements).

  Args:
    study: `finetune.synthetic_study`'s result (per method [seeds, evaluations] component curves, steps,
      pretrain_loss [seeds, steps], base_fit, entropy).
    plots: plot paths attached to every row.

  Returns:
    Row dicts judged with `common.stats.compare_row` (paired by seed).
  """
  cl = finetune.claims(study)
  n = study["pretrain_loss"].shape[0]
  exp = f"synthetic grammar, tiny Llama ({n} seeds, paired)"
  rows = [base_fit_row(study, exp), prior_shift_row(study, exp)]
  for method in [m for m in ("full", "lora8") if m in cl]:
    for k in ("topic", "style"):
      rows.append(stats.compare_row(
          paper=PAPER, experiment=f"{exp}: {method}", metric=f"steps to half the final value: factual vs {k}",
          a=cl[method]["half_factual"], b=cl[method][f"half_{k}"], name_a="factual", name_b=k,
          paper_value=f"{k} priors are learned fast, factual knowledge slowly", direction="greater", plots=plots,
          kind="check", basis=SPEED,
          notes=f"half-time = first (interpolated) step where the component reaches 50% of its value at step "
                f"{int(study['steps'][-1])}; evaluations every {int(study['steps'][0])} steps"))
  if "lora1" in cl and "lora8" in cl:
    rows.append(stats.compare_row(
        paper=PAPER, experiment=exp, metric="final factual component (nats/token): LoRA rank 8 vs rank 1",
        a=cl["lora8"]["final_factual"], b=cl["lora1"]["final_factual"], name_a="rank 8", name_b="rank 1",
        paper_value="factual knowledge needs capacity (grows with rank)", direction="greater", plots=plots,
        kind="check", basis=CAPACITY))
  if "full" in cl and "lora8" in cl:
    rows.append(stats.compare_row(
        paper=PAPER, experiment=exp, metric="final factual component (nats/token): full vs LoRA rank 8",
        a=cl["full"]["final_factual"], b=cl["lora8"]["final_factual"], name_a="full", name_b="rank 8",
        paper_value="factual knowledge needs capacity (full > low rank)", direction="greater", plots=plots,
        kind="check", basis=CAPACITY))
  if "full" in cl and "lora1" in cl:
    full, r1 = cl["full"], cl["lora1"]
    for k in ("topic", "style"):
      rows.append(stats.compare_row(
          paper=PAPER, experiment=exp, metric=f"rank-1 LoRA / full final value: {k} vs factual",
          a=r1[f"final_{k}"] / full[f"final_{k}"], b=r1["final_factual"] / full["final_factual"], name_a=k,
          name_b="factual", paper_value=f"{k} needs little capacity, factual knowledge much", direction="greater",
          plots=plots, kind="check", basis=CAPACITY))
  for method in [m for m in ("full", "lora8") if m in cl]:
    for k in ("topic", "style"):
      rows.append(stats.compare_row(
          paper=PAPER, experiment=f"{exp}: {method}", metric=f"share of |contrast| in the first 25% of positions: "
          f"{k} vs factual", a=cl[method][f"early_{k}"], b=cl[method]["early_factual"], name_a=k, name_b="factual",
          paper_value=f"{k} is learned mostly at the beginning of a text", direction="greater", plots=plots,
          kind="check", basis=POSITION,
          notes="after the last finetuning step; a uniform spread would give 0.25 "
                "(the grammar's facts sit at every 5th token)"))
  for method in [m for m in ("full", "lora8", "lora1") if m in cl]:
    share = cl[method]["final_factual"] / cl[method]["final_total"]
    m, se = stats.mean_se(share)
    rows.append(dict(
        paper=PAPER, experiment=f"{exp}: {method}", metric="factual share of the total change (factual / total)",
        ours=f"{stats.fmt_mean_se(m, se)} ({n} seeds)", paper_value="factual knowledge is a small fraction",
        holds=None, kind="measurement", basis=SHARE, plots=plots,
        notes=(("facts dominate the synthetic full finetune" if m > 0.5 else "facts are below half of the change")
               + f" (per seed {', '.join(f'{x:.2f}' for x in share)}); after the last finetuning step; {SHARE}")))
  return rows


def reproduce(workdir: str, fast: bool = False, real_text: bool = True,
              *, get_config: Callable[[str], Any]) -> list[dict]:
  """(a) the closed-form check, (b) the synthetic study, (c) real text (module docstring).

  Args:
    workdir: output folder for plots (created).
    fast: a shorter synthetic study (160 finetuning and 300 pretraining steps) and no real text.
    real_text: run (c) (ignored when `fast`: it needs SmolLM2 and MiniLM).
    get_config: `get_config(variant)` of configs/finetune_dissect.py (the runners pass it; tests pass the module's).

  Returns:
    Row dicts (paper, experiment, metric, ours, paper_value, holds, notes[, plots]).
  """
  os.makedirs(workdir, exist_ok=True)
  rows: list[dict] = []
  err = analytic_recovery_error()
  rows.append(dict(paper=PAPER, experiment="analytic grammar: known prior and fact-table changes",
                   metric="max |decompose - truth| (nats/document), topic, style, factual", ours=f"{err:.2e}",
                   paper_value="(check) the estimator recovers known changes", holds="yes" if err < 1e-5 else "no",
                   kind="check", basis="verifies the estimator against the grammar's closed form",
                   notes="reference: the closed form of the grammar (the changes' log-odds); tolerance 1e-5"))
  cfg = get_config("")
  if fast:
    cfg.num_steps = 160
    cfg.pretrain.steps = 300
  t0 = time.time()
  study = finetune.synthetic_study(cfg, progress=print)
  plots = [experiment.plot_curves(study, os.path.join(workdir, "components.png")),
           experiment.plot_positions(study, os.path.join(workdir, "by_position.png"))]
  rows += synthetic_rows(study, plots)
  print(f"synthetic study: {time.time() - t0:.0f}s")
  if real_text and not fast:
    rows += real_text_rows(workdir)
  return rows


def benchmark(quick: bool = True, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Finetuning tokens/s, full vs LoRA (rank 8), for the synthetic study's tiny Llama on 1 and all devices (batch
  sharded over the mesh)."""
  from iclr24_jax.common import sharding
  from iclr24_jax.common.loop import compile_step
  from iclr24_jax.lm import train as lm_train
  cfg = get_config("")
  spec = finetune.spec_from_config(cfg.data)
  mcfg = finetune.model_config(spec, cfg.model)
  tables = grammar.fact_tables(jax.random.key(0), spec)
  rows = []
  batch_size = 64
  for method in ("full", "lora8", "lora1"):
    lora = finetune.method_lora(method, cfg.lora)

    def make_case(mesh, _, lora=lora, method=method):
      tx = finetune.make_optimizer(1e-3, 100)
      params = jax.jit(lambda k: finetune.lm.init_params(k, mcfg))(jax.random.key(1))
      state = jax.jit(lambda p: lm_train.init_train_state(p, tx, lora_config=lora, key=jax.random.key(2) if lora
                                                          else None),
                      out_shardings=sharding.replicated_sharding(mesh))(params)
      ids = np.asarray(grammar.sample_documents(jax.random.key(3), spec, batch_size, tables, "domain"))
      batch = sharding.shard_batch({"ids": ids, "mask": np.ones_like(ids, bool)}, mesh)
      step = compile_step(lm_train.make_train_step(mcfg, lora), mesh)
      return step, (state, batch, jax.random.key(4)), dict(
          items=batch_size * spec.seq_len, name=f"{PAPER}/{method}_train_step_tokens",
          size=f"tiny Llama d{mcfg.hidden_size} L{mcfg.num_layers}, {batch_size}x{spec.seq_len} tokens",
          batch=batch_size)
    rows += bench.across_devices(make_case, carry=True, repeats=5 if quick else 20)
  return rows


def scale_program(config, mesh):
  """The paper-size step for `experiments.scale`: Llama-2-7B full finetuning at the official run's sizes.

  64 sequences of 1,024 tokens per step, float32 master weights and AdamW moments sharded over the mesh, the
  forward / backward on a bfloat16 copy with every layer rematerialised (`configs/finetune_dissect.py:paper`).

  Args:
    config: `get_config('paper')` (its `scale` block and optimizer).
    mesh: the ('data', 'model') mesh the program is sharded over.

  Returns:
    common.scale.Program of `lm.train.make_train_step` (state, batch, key) -> (state, metrics).
  """
  import jax.numpy as jnp
  from iclr24_jax.common import scale as scale_lib
  from iclr24_jax.lm import scale as lm_scale
  s = scale_lib.paper_scale(config, PAPER)
  if s.method != "full":
    raise ValueError(f"scale.method={s.method!r}: the compiled paper step is full finetuning ('full'); LoRA "
                     "adapters need the list form of the layers.")
  model = lm_scale.named_model(config.model.name, remat=s.remat)
  opt = config.optimizer
  tx = finetune.make_optimizer(opt.learning_rate, config.num_steps, opt.warmup_frac, opt.grad_clip, opt.weight_decay)
  b, t = s.batch_size, s.seq_len
  return lm_scale.train_program(
      "Llama-2-7B full finetuning step (AdamW, bf16 compute, remat)", model, tx, mesh, lm_scale.causal_batch(b, t),
      param_dtype=jnp.dtype(s.param_dtype), compute_dtype=jnp.dtype(s.compute_dtype),
      hand_flops=lm_scale.llama_flops(model, b, t), items_per_step=b * t,
      notes="FSDP shards weights, gradients and moments (the official ZeRO-2 shards moments only).",
      paper_hardware=s.paper_hardware, paper_time=s.paper_time)


def _paired_bootstrap_row(*, experiment: str, metric: str, a: np.ndarray, b: np.ndarray, a_by_seed, b_by_seed,
                          name_a: str, name_b: str, paper_value: str, kind: str, basis: str, notes: str) -> dict:
  """A row for "mean a > mean b" over documents, judged by the paired bootstrap over documents
  (`stats.bootstrap_diff`) of the seed-averaged per-document values; the per-seed judgement (`stats.judge`,
  paired by seed) goes in the notes and under `judgement_seeds`.

  Args:
    experiment, metric, paper_value, basis, notes: the row's labels (notes are prefixed with the per-seed numbers).
    a, b: [N] seed-averaged per-document values of each arm (the same documents).
    a_by_seed, b_by_seed: [S] per-seed means over the same documents.
    name_a, name_b: arm names.
    kind: 'claim' (judged) or 'measurement' (holds None; the numbers stay in `judgement`).

  Returns:
    A reproduction row dict.
  """
  boot = stats.bootstrap_diff(a, b, paired=True, direction="greater")
  seeds = stats.judge(a_by_seed, b_by_seed, paired=True, direction="greater")
  ours = (f"{name_a} {boot['mean_a']:+.4f} vs {name_b} {boot['mean_b']:+.4f}; diff {boot['diff']:+.4f} "
          f"[{boot['lo']:+.4f}, {boot['hi']:+.4f}] (95% paired bootstrap over {boot['n']} documents, "
          f"seed-averaged)")
  seed_note = (f"per seed ({seeds['n']} finetuning seeds, paired): diff {seeds['diff']:+.4f} +- "
               f"{seeds['se_diff']:.4f} ({seeds['holds']}; the seeds share the documents, so their SE leaves out "
               f"the documents' sampling error)")
  return dict(paper=PAPER, experiment=experiment, metric=metric, ours=ours, paper_value=paper_value,
              holds=None if kind == "measurement" else boot["holds"], kind=kind, basis=basis,
              notes=f"{notes}; {seed_note}" if notes else seed_note,
              judgement=dict(boot, direction="greater", unit="documents"),
              judgement_seeds=dict(seeds, a=[float(x) for x in a_by_seed], b=[float(x) for x in b_by_seed]))


def real_text_rows(workdir: str, settings: dict | None = None) -> list[dict]:
  """`rows_from_run(real.run_real_text(workdir, settings))`.

  Args:
    workdir: as in `real.run_real_text`.
    settings: as in `real.run_real_text`.

  Returns:
    list of reproduction row dicts (see `rows_from_run`).
  """
  return rows_from_run(real.run_real_text(workdir, settings))


def rows_from_run(res: dict) -> list[dict]:
  """Rows of a real-text run: acceptance rates and components (measurements) of both probe arms, and the
  abstract's comparisons on signed mean contrasts (style vs factual, topic vs factual where >= 3 documents have
  both, factual vs half the total): claims on the held-out probes, measurements on the in-set ones.

  Args:
    res: `real.run_real_text` output (arms {arm: parts, parts_by_seed, report, documents}, report, losses, settings,
      cache_path).

  Returns:
    list of reproduction row dicts (paper, experiment, metric, ours, paper_value, holds, kind, basis, notes).
  """
  rep, s = res["report"], res["settings"]
  n_seeds = len(res["losses"])
  exp = (f"real text: StrategyQA, SmolLM2-135M-Instruct LoRA r{s['lora_rank']} {s['steps']} steps on "
         f"{s['num_train_documents']} documents, {n_seeds} finetuning seeds")
  acc = "; ".join(f"{v} {r['accepted']}/{r['total']} (mean cos {r['mean_cosine']:.2f})" for v, r in rep.items())
  per_arm = "; ".join(f"{arm}: " + ", ".join(f"{v} {r['accepted']}/{r['total']}" for v, r in a["report"].items())
                      for arm, a in res["arms"].items())
  first = np.mean([ls[0] for ls in res["losses"]])
  last = np.mean([np.mean(ls[-3:]) for ls in res["losses"]])
  rows = [dict(paper=PAPER, experiment=exp, metric="rewrites kept by the MiniLM filter", ours=acc,
               paper_value="(ChatGPT rewrites, not filtered)", holds=None, kind="measurement",
               notes=f"{per_arm}; thresholds fixed in probes.FILTER_RULES before any rewrite was read; rewrites "
                     f"cached in {os.path.basename(res['cache_path'])}; finetuning loss {first:.3f} -> {last:.3f} "
                     f"(seed mean)")]
  for arm in real.ARMS:
    a = res["arms"][arm]
    parts, by_seed = a["parts"], a["parts_by_seed"]
    pd = parts["per_document"]
    arm_exp = f"{exp}; {ARM_LABEL[arm]}"
    for k in ("topic", "style", "factual", "total"):
      ok = np.isfinite(pd[k])
      v = pd[k][ok]
      per_seed = [float(np.mean(p["per_document"][k][ok])) for p in by_seed] if ok.any() else []
      m, se = stats.mean_se(per_seed) if v.size else (float("nan"), float("nan"))
      lo, hi = stats.bootstrap_ci(v) if v.size > 1 else (float("nan"), float("nan"))
      rows.append(dict(paper=PAPER, experiment=arm_exp, metric=f"{k} component, signed mean (nats/token)",
                       ours=(f"{m:+.4f} +- {se:.4f} over {n_seeds} seeds ({v.size} of {a['documents']} documents)"
                             if v.size else f"no data (0 of {a['documents']} documents)"),
                       paper_value="topic and style dominate the change; factual is a small part", holds=None,
                       kind="measurement",
                       notes=(f"95% bootstrap interval over documents of the seed-averaged change: [{lo:+.4f}, "
                              f"{hi:+.4f}]" if v.size > 1 else "")))
    kind = "claim" if arm == "held_out" else "measurement"
    for k in ("topic", "style"):
      both = np.isfinite(pd[k]) & np.isfinite(pd["factual"])
      if both.sum() < 3:
        continue
      rows.append(_paired_bootstrap_row(
          experiment=arm_exp, metric=f"{k} vs factual, signed mean over {int(both.sum())} documents (nats/token)",
          a=pd[k][both], b=pd["factual"][both],
          a_by_seed=[float(np.mean(p["per_document"][k][both])) for p in by_seed],
          b_by_seed=[float(np.mean(p["per_document"]["factual"][both])) for p in by_seed],
          name_a=k, name_b="factual", paper_value=f"{k} shift exceeds factual knowledge's", kind=kind, basis=REAL,
          notes=("documents where both rewrites passed the filter; signed contrasts (a mean of absolute "
                 "per-document contrasts would reward the noisier rewrite)"
                 + ("" if arm == "held_out" else f"; {IN_SET_NOTE}"))))
    ok = np.isfinite(pd["factual"])
    if ok.sum() >= 3:
      fac, tot = pd["factual"][ok], pd["total"][ok]
      lo, hi = _ratio_ci(fac, tot)
      rows.append(_paired_bootstrap_row(
          experiment=arm_exp, metric=(f"factual share of the total change: total / 2 vs factual, {int(ok.sum())} "
                                      "documents (nats/token)"),
          a=0.5 * tot, b=fac, a_by_seed=[0.5 * float(np.mean(p["per_document"]["total"][ok])) for p in by_seed],
          b_by_seed=[float(np.mean(p["per_document"]["factual"][ok])) for p in by_seed],
          name_a="total/2", name_b="factual", paper_value="factual knowledge is a small fraction of the total change",
          kind=kind, basis=REAL,
          notes=(f"factual / total = {np.mean(fac) / np.mean(tot):.2f} [{lo:.2f}, {hi:.2f}] (ratio of means, 95% "
                 "bootstrap over documents); judged as factual < total / 2, the weakest reading of 'a small "
                 "fraction'; documents with a kept counterfactual"
                 + ("" if arm == "held_out" else f"; {IN_SET_NOTE}"))))
  return rows


def _ratio_ci(num: np.ndarray, den: np.ndarray, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
  """95% percentile bootstrap interval over documents of mean(num) / mean(den) (paired resampling)."""
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, num.size, size=(n_boot, num.size))
  with np.errstate(divide="ignore", invalid="ignore"):
    r = num[idx].mean(1) / den[idx].mean(1)
  lo, hi = np.nanquantile(r, [0.025, 0.975])
  return float(lo), float(hi)


ARM_LABEL = {"held_out": "held-out probes (documents not finetuned on)",
             "in_set": "in-set probes (documents of the finetuning set)"}


IN_SET_NOTE = ("not a claim: these probed texts were finetuned on, so Delta(original) holds their memorised wording "
               "and every rewrite's contrast grows with how far it departs from that wording, whatever factor it "
               "changes; the held-out arm carries the claim")
