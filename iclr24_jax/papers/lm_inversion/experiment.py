"""lm_inversion experiment: `run(config, workdir)` trains an inverter on SmolLM2's next-token distributions of
real prompts and evaluates it on held-out prompts (the study with baselines and intervals is in `study.py`)."""
from __future__ import annotations

import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import data as common_data
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.lm import t5
from iclr24_jax.lm import tokenizer as tok_lib
from iclr24_jax.papers.lm_inversion import data as data_lib
from iclr24_jax.papers.lm_inversion import evaluation as inv_metrics
from iclr24_jax.papers.lm_inversion import model as model_lib


def load_target(config: Any):
  """The target LM: SmolLM2-135M-Instruct, or a tiny random Llama with a 512-token BPE ('tiny').

  Args:
    config: the config (target.name 'smollm2' | 'tiny_random', target.path, target.seed, target.vocab_size).

  Returns:
    (params, LlamaConfig, tokenizer).
  """
  from iclr24_jax import lm
  if config.target.name == "smollm2":
    return lm.load_smollm2(config.target.get("path") or None)
  if config.target.name == "tiny_random":
    # a tiny random Llama with a small BPE trained on StrategyQA questions: a fast, self-contained target for tests
    from iclr24_jax.common import textdata
    texts = [r["question"] for r in textdata.load_mario("strategyqa", "train")[:500]]
    tok = tok_lib.train_bpe(texts, vocab_size=int(config.target.get("vocab_size", 512)))
    cfg = lm.tiny_config(vocab_size=tok.vocab_size)
    return lm.init_params(jax.random.key(int(config.target.seed)), cfg), cfg, tok
  raise ValueError(f"unknown target.name {config.target.name!r}; choose 'smollm2' or 'tiny_random'.")


def cache_location(config: Any, cache_dir: str | None = None) -> str:
  """Where the distribution and sample caches live.

  Args:
    config: the config (data.cache_dir).
    cache_dir: an explicit folder (wins).

  Returns:
    `cache_dir`, else config.data.cache_dir, else $ICLR24_LM_INVERSION_CACHE, else results/cache/lm_inversion in
    the repository (ignored by git; kept between runs so distributions and samples are computed once).
  """
  return cache_dir or config.data.get("cache_dir") or os.environ.get("ICLR24_LM_INVERSION_CACHE") or os.path.join(
      str(common_data.repo_root()), "results", "cache", "lm_inversion")


def prepare(config: Any, cache_dir: str | None = None) -> dict:
  """Prompts, their split, cached target distributions (and sampled continuations), the decoder tokenizer, labels.

  Args:
    config: the lm_inversion config (`iclr24_jax.configs.lm_inversion`).
    cache_dir: the cache folder for distributions and samples (see `cache_location`).

  Returns:
    dict(train_prompts [N], test_prompts [M], train_lp [N, V] float16 memmap, test_lp [M, V], target_tok, dec_tok,
         t5_config, inverter, train_labels / train_label_mask [N, T], vocab_size V, seconds_distributions,
         train_samples [N] / test_samples [M] strings and seconds_samples (when config.samples.new_tokens > 0),
         labels_cut {'train', 'test'}: prompts longer than label_len - 1 decoder tokens, cut in the labels).
  """
  params, lm_config, target_tok = load_target(config)
  prompts = data_lib.load_prompts(target_tok, config.data.max_tokens, config.data.get("data_dir") or None,
                                  tuple(config.data.sources))
  if config.data.get("max_prompts", 0):
    prompts = prompts[: int(config.data.max_prompts)]
  train_p, test_p = data_lib.split_prompts(prompts, int(config.data.num_test), config.data.get("num_train") or None,
                                           seed=int(config.data.split_seed))
  cache_dir = cache_location(config, cache_dir)
  t0 = time.time()
  model_id = f"{config.target.name}-{config.target.get('seed', 0)}"
  train_lp = data_lib.target_distributions(params, lm_config, target_tok, train_p, cache_dir, model_id,
                                           config.data.max_tokens, config.data.lm_batch_size)
  if config.data.get("train_used", 0):
    # the distribution cache holds num_train prompts; train on its first train_used (a prefix of the same split)
    train_p, train_lp = train_p[: int(config.data.train_used)], train_lp[: int(config.data.train_used)]
  test_lp = data_lib.target_distributions(params, lm_config, target_tok, test_p, cache_dir, model_id,
                                          config.data.max_tokens, config.data.lm_batch_size)
  seconds = time.time() - t0
  out = {}
  sc = config.get("samples")
  if sc is not None and int(sc.new_tokens) > 0:
    from iclr24_jax.lm import llama
    t0 = time.time()
    gen_params = llama.fuse_params(params)
    kw = dict(model_id=model_id, max_tokens=int(config.data.max_tokens), new_tokens=int(sc.new_tokens),
              temperature=float(sc.temperature), seed=int(sc.seed), batch_size=int(sc.batch_size))
    out["train_samples"] = data_lib.target_samples(gen_params, lm_config, target_tok, train_p, cache_dir, **kw)
    out["test_samples"] = data_lib.target_samples(gen_params, lm_config, target_tok, test_p, cache_dir, **kw)
    out["seconds_samples"] = time.time() - t0
    del gen_params
  dec_tok = tok_lib.train_bpe(train_p, vocab_size=int(config.model.decoder_vocab))
  t5_config = t5.T5Config.from_tokenizer(dec_tok, d_model=config.model.d_model, d_kv=config.model.d_kv,
                                         d_ff=config.model.d_ff, num_layers=config.model.num_layers,
                                         num_heads=config.model.num_heads)
  v = int(lm_config.vocab_size)
  inverter = model_lib.Inverter(t5_config, int(config.model.width),
                                model_lib.num_chunks(v, int(config.model.width), bool(config.model.official_padding)),
                                int(config.model.bottleneck), float(config.model.dropout_rate))
  label_len = int(config.data.label_len)
  labels, label_mask = data_lib.encode_labels(dec_tok, train_p, label_len)
  # Prompts longer than label_len - 1 decoder tokens are cut in training, and a prediction is at most label_len
  # tokens, so the metrics compare a cut prediction with the whole test prompt: count them (results 'labels_cut').
  cut = {name: int(sum(len(dec_tok.encode(t, add_bos=False)) > label_len - 1 for t in ps))
         for name, ps in (("train", train_p), ("test", test_p))}
  return dict(train_prompts=train_p, test_prompts=test_p, train_lp=train_lp, test_lp=test_lp, target_tok=target_tok,
              dec_tok=dec_tok, t5_config=t5_config, inverter=inverter, train_labels=labels,
              train_label_mask=label_mask, vocab_size=v, seconds_distributions=seconds, labels_cut=cut, **out)


def train(config: Any, prep: dict, workdir: str | None = None, progress: bool = True) -> loop_lib.LoopResult:
  """Trains one inverter on the full distributions with `common.loop.train_loop` (K steps per compiled call).

  Args:
    config: the config (seed, num_steps, batch_size, optimizer, model, mesh, log_every, steps_per_call).
    prep: `prepare(config)`.
    workdir: metrics and checkpoints (None: nothing written).
    progress: print a progress line.

  Returns:
    common.loop.LoopResult (state.params {'projection', 't5'}, state.extra['unigram'] [V]).
  """
  inverter = prep["inverter"]
  n = len(prep["train_prompts"])
  bs = int(config.batch_size)
  if n < bs:
    raise ValueError(f"{n} training prompts for batch_size={bs}: lower the batch size or add prompts.")
  tx = make_optimizer(config.optimizer, int(config.num_steps))
  rng_seed = int(config.seed)

  def batches(step: int) -> dict:
    idx = _order(rng_seed, step, n, bs)  # sorted: memmap reads in file order
    return {"logprobs": np.asarray(prep["train_lp"][idx]), "labels": prep["train_labels"][idx],
            "label_mask": prep["train_label_mask"][idx]}

  return loop_lib.train_loop(
      init_fn=lambda k: model_lib.init(k, inverter, tx, prep["vocab_size"]),
      train_step=model_lib.make_train_step(inverter, bool(config.model.official_padding)),
      batches=batches, num_steps=int(config.num_steps), key=jax.random.key(rng_seed), workdir=workdir,
      mesh=sharding.make_mesh(config.get("mesh")), log_every=int(config.log_every),
      config=config, progress=progress, steps_per_call=int(config.get("steps_per_call", 1)), name="lm_inversion",
      **loop_lib.checkpoint_options(config))


def predict(params: Any, logprobs: np.ndarray, unigram: jax.Array, prep: dict, config: Any,
            batch_size: int = 64) -> list[str]:
  """Greedy inversions of [N, V] distributions by one inverter, decoded to text with the decoder tokenizer.

  Args:
    params: the inverter's params; logprobs: [N, V]; unigram: [V] its unigram estimate.
    prep: `prepare(config)`; config: the config (label_len); batch_size: prompts per compiled call.

  Returns:
    N predicted prompts.
  """
  inverter = prep["inverter"]
  fn = jax.jit(lambda p, lp, u: model_lib.invert(p, lp, u, inverter=inverter, max_len=int(config.data.label_len),
                                                 official_padding=bool(config.model.official_padding)))
  texts = []
  for s in range(0, len(logprobs), batch_size):
    chunk = np.asarray(logprobs[s:s + batch_size], np.float32)
    real = len(chunk)
    if real < batch_size:
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - real, 0)])
    out = fn(params, jnp.asarray(chunk), unigram)
    texts += prep["dec_tok"].decode_batch(np.asarray(out.tokens)[:real], np.asarray(out.mask)[:real])
  return [t.strip() for t in texts]


def _order(seed: int, step: int, n: int, bs: int) -> np.ndarray:
  """Indices of training batch `step` for a model with this seed (a fresh permutation each epoch, sorted)."""
  epoch, pos = divmod(step * bs, n - n % bs)
  order = np.random.default_rng([seed, epoch]).permutation(n)
  return np.sort(order[pos:pos + bs])


def train_inverters(config: Any, prep: dict, arms: list[dict], progress: bool = True
                    ) -> tuple[Any, loop_lib.LoopResult]:
  """Trains M distribution inverters at once (one compiled `vmap`-ed step, `model.make_multi_train_step`).

  Model m is initialised from key fold_in(key(config.seed), seed_m), reads its own batch order (seeded by
  seed_m, as `train`), and sees the full distribution (k_m = 0) or its top-k access (vec2text's rule, `topk_access`
  after the unigram is subtracted, k = k_m) in training, so an access level gets its own inverter. Arms with the same seed share init and batches: they
  differ only in access.

  Args:
    config: the lm_inversion config (num_steps, batch_size, optimizer, model).
    prep: `prepare(config)`.
    arms: M dicts {'seed': int, 'k': int (0 = full distribution)}.
    progress: print a progress line.

  Returns:
    (stacked TrainState with a leading [M] axis (params, extra['unigram'] [M, V]), the LoopResult).
  """
  inverter, n, bs, v = prep["inverter"], len(prep["train_prompts"]), int(config.batch_size), prep["vocab_size"]
  if n < bs:
    raise ValueError(f"{n} training prompts for batch_size={bs}: lower the batch size or add prompts.")
  m = len(arms)
  seeds = [int(a["seed"]) for a in arms]
  ks = [int(a.get("k", 0)) for a in arms]
  tx = make_optimizer(config.optimizer, int(config.num_steps))
  k_max = max(ks)

  def batches(step: int) -> dict:
    lps, labels, masks = [], [], []
    for seed in seeds:
      idx = _order(seed, step, n, bs)
      lps.append(np.asarray(prep["train_lp"][idx], np.float32))
      labels.append(prep["train_labels"][idx])
      masks.append(prep["train_label_mask"][idx])
    out = {"logprobs": np.stack(lps, 1), "labels": np.stack(labels, 1), "label_mask": np.stack(masks, 1)}
    if k_max:   # each model's access level, one per row (leaves [B, M]: the batch axis first)
      out["topk"] = np.broadcast_to(np.asarray(ks, np.int32)[None], (bs, m)).copy()
    return out

  seed_arr = jnp.asarray(seeds)

  def init_fn(key):
    keys = jax.vmap(lambda s: jax.random.fold_in(key, s))(seed_arr)
    return jax.vmap(lambda k: model_lib.init(k, inverter, tx, v))(keys)

  res = loop_lib.train_loop(
      init_fn=init_fn, train_step=model_lib.make_multi_train_step(
          model_lib.make_train_step(inverter, bool(config.model.official_padding), topk_max=k_max), m),
      batches=batches, num_steps=int(config.num_steps), key=jax.random.key(int(config.seed)), workdir=None,
      mesh=sharding.make_mesh(config.get("mesh")), log_every=int(config.log_every), progress=progress,
      name=f"lm_inversion x{m}")
  return res.state, res


def predict_models(params: Any, unigrams: jax.Array, logprobs: np.ndarray, ks: list[int], prep: dict, config: Any,
                   batch_size: int = 64) -> list[list[str]]:
  """Greedy inversions by M stacked inverters, model m reading access k_m (0 = full) of the same distributions.

  Args:
    params: stacked inverter params (leading [M] axis, from `train_inverters`).
    unigrams: [M, V] each model's unigram estimate.
    logprobs: [N, V] distributions (a float16 memmap is fine).
    ks: M access levels (0 = full distribution).
    prep: `prepare(config)`.
    config: the config (label_len: decoded tokens).
    batch_size: prompts per compiled call.

  Returns:
    M lists of N predicted prompts.
  """
  inverter, m = prep["inverter"], len(ks)
  k_max = max(ks)
  one = lambda p, lp, u, k: model_lib.invert(  # noqa: E731
      p, lp, u, inverter=inverter, max_len=int(config.data.label_len),
      official_padding=bool(config.model.official_padding), topk=k if k_max else None, topk_max=k_max or None)
  fn = jax.jit(jax.vmap(one, in_axes=(0, None, 0, 0)))
  k_rows = jnp.broadcast_to(jnp.asarray(ks, jnp.int32)[:, None], (m, batch_size))
  texts: list[list[str]] = [[] for _ in range(m)]
  for s in range(0, len(logprobs), batch_size):
    chunk = np.asarray(logprobs[s:s + batch_size], np.float32)
    real = len(chunk)
    if real < batch_size:
      chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - real, 0)])
    out = fn(params, jnp.asarray(chunk), unigrams, k_rows)
    toks, masks = np.asarray(out.tokens), np.asarray(out.mask)
    for i in range(m):
      texts[i] += [t.strip() for t in prep["dec_tok"].decode_batch(toks[i, :real], masks[i, :real])]
  return texts


def train_sample_inverters(config: Any, prep: dict, seeds: list[int], progress: bool = True
                           ) -> tuple[Any, loop_lib.LoopResult]:
  """Trains the sample-inversion baseline (a T5 reading the sampled continuation), one model per seed, vmapped.

  Same T5 size, vocabulary, steps, batch size, optimizer and per-seed batch order as `train_inverters`, so the
  two are paired by seed.

  Args:
    config: the config (samples.input_len: encoder tokens).
    prep: `prepare(config)` with train_samples.
    seeds: the seeds.
    progress: print a progress line.

  Returns:
    (stacked TrainState [M], LoopResult).
  """
  if "train_samples" not in prep:
    raise ValueError("prep has no sampled continuations: set config.samples.new_tokens > 0 and rerun prepare.")
  t5_config, n, bs = prep["t5_config"], len(prep["train_prompts"]), int(config.batch_size)
  ids, mask = data_lib.encode_samples(prep["dec_tok"], prep["train_samples"], int(config.samples.input_len))
  tx = make_optimizer(config.optimizer, int(config.num_steps))

  def batches(step: int) -> dict:
    idx = [_order(int(s), step, n, bs) for s in seeds]
    return {"inputs": np.stack([ids[i] for i in idx], 1), "input_mask": np.stack([mask[i] for i in idx], 1),
            "labels": np.stack([prep["train_labels"][i] for i in idx], 1),
            "label_mask": np.stack([prep["train_label_mask"][i] for i in idx], 1)}

  seed_arr = jnp.asarray([int(s) for s in seeds])

  def init_fn(key):
    keys = jax.vmap(lambda s: jax.random.fold_in(key, s))(seed_arr)
    return jax.vmap(lambda k: model_lib.init_sample_state(k, t5_config, tx))(keys)

  res = loop_lib.train_loop(
      init_fn=init_fn, train_step=model_lib.make_multi_train_step(model_lib.make_sample_train_step(t5_config),
                                                                  len(seeds)),
      batches=batches, num_steps=int(config.num_steps), key=jax.random.key(int(config.seed) + 1), workdir=None,
      mesh=sharding.make_mesh(config.get("mesh")), log_every=int(config.log_every), progress=progress,
      name=f"lm_inversion samples x{len(seeds)}")
  return res.state, res


def predict_samples(params: Any, texts: list[str], prep: dict, config: Any, batch_size: int = 64
                    ) -> list[list[str]]:
  """Greedy inversions of sampled continuations by M stacked sample-inversion T5s.

  Args:
    params: stacked {'t5': ...} (leading [M] axis).
    texts: N continuations.
    prep, config: as `predict_models`.
    batch_size: rows per compiled call.

  Returns:
    M lists of N predicted prompts.
  """
  t5_config = prep["t5_config"]
  ids, mask = data_lib.encode_samples(prep["dec_tok"], texts, int(config.samples.input_len))
  fn = jax.jit(jax.vmap(lambda p, i, mk: model_lib.invert_samples(p, i, mk, t5_config=t5_config,
                                                                  max_len=int(config.data.label_len)),
                        in_axes=(0, None, None)))
  m = jax.tree.leaves(params)[0].shape[0]
  out_texts: list[list[str]] = [[] for _ in range(m)]
  for s in range(0, len(ids), batch_size):
    ci, cm = ids[s:s + batch_size], mask[s:s + batch_size]
    real = len(ci)
    if real < batch_size:
      ci = np.concatenate([ci, np.repeat(ci[-1:], batch_size - real, 0)])
      cm = np.concatenate([cm, np.repeat(cm[-1:], batch_size - real, 0)])
    out = fn(params, jnp.asarray(ci), jnp.asarray(cm))
    toks, masks = np.asarray(out.tokens), np.asarray(out.mask)
    for i in range(m):
      out_texts[i] += [t.strip() for t in prep["dec_tok"].decode_batch(toks[i, :real], masks[i, :real])]
  return out_texts


def run(config: Any, workdir: str) -> dict:
  """Prepares the data, trains one inverter, inverts the held-out prompts; writes results.json and examples.

  Args:
    config: the lm_inversion config ('' or 'tiny').
    workdir: output folder (metrics.jsonl, results.json, examples.jsonl).

  Returns:
    dict(test {bleu, token_f1, exact_match}, num_train, num_test, num_chunks, steps_per_s, final_train_loss,
         seconds_distributions).
  """
  if config.data.name in data_lib.DATASETS:   # the paper's own data: read first (DataNotFoundError
    data_lib.load(config.data)                  # naming the layout and source when absent)
    raise common_data.paper_data_not_wired("lm_inversion", config.data)   # run() does not train on it yet
  os.makedirs(workdir, exist_ok=True)
  prep = prepare(config)
  res = train(config, prep, workdir)
  params, unigram = res.state.params, res.state.extra["unigram"]
  preds = predict(params, prep["test_lp"], unigram, prep, config)
  scores = inv_metrics.metrics(preds, prep["test_prompts"])
  results = {"test": scores, "num_train": len(prep["train_prompts"]), "num_test": len(prep["test_prompts"]),
             "num_chunks": prep["inverter"].num_chunks, "steps_per_s": res.steps_per_s,
             "final_train_loss": next((r["train/loss"] for r in reversed(res.history) if "train/loss" in r), None),
             "seconds_distributions": prep["seconds_distributions"], "labels_cut": prep["labels_cut"]}
  metrics_lib.write_results(workdir, results)
  with open(os.path.join(workdir, "examples.jsonl"), "w") as f:
    for p, r in list(zip(preds, prep["test_prompts"]))[:50]:
      f.write(json.dumps({"prediction": p, "reference": r}) + "\n")
  return results
