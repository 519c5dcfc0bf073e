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
  """The target LM (params, LlamaConfig, tokenizer): SmolLM2-135M-Instruct, or a tiny random Llama ('tiny')."""
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


def prepare(config: Any, workdir: str | None = None) -> dict:
  """Prompts, their split, cached target distributions, the decoder tokenizer and the label arrays.

  Returns:
    dict(train_prompts, test_prompts, train_lp [N, V] float16, test_lp [M, V], target_tok, dec_tok, t5_config,
         inverter, train_labels/train_label_mask [N, T], vocab_size, seconds_distributions).
  """
  params, lm_config, target_tok = load_target(config)
  prompts = data_lib.load_prompts(target_tok, config.data.max_tokens, config.data.get("data_dir") or None,
                                  tuple(config.data.sources))
  if config.data.get("max_prompts", 0):
    prompts = prompts[: int(config.data.max_prompts)]
  train_p, test_p = data_lib.split_prompts(prompts, int(config.data.num_test), config.data.get("num_train") or None,
                                           seed=int(config.data.split_seed))
  cache_dir = config.data.get("cache_dir") or os.path.join(
      str(common_data.repo_root()), "results", "cache", "lm_inversion")
  t0 = time.time()
  model_id = f"{config.target.name}-{config.target.get('seed', 0)}"
  train_lp = data_lib.target_distributions(params, lm_config, target_tok, train_p, cache_dir, model_id,
                                           config.data.max_tokens, config.data.lm_batch_size)
  test_lp = data_lib.target_distributions(params, lm_config, target_tok, test_p, cache_dir, model_id,
                                          config.data.max_tokens, config.data.lm_batch_size)
  seconds = time.time() - t0
  dec_tok = tok_lib.train_bpe(train_p, vocab_size=int(config.model.decoder_vocab))
  t5_config = t5.T5Config.from_tokenizer(dec_tok, d_model=config.model.d_model, d_kv=config.model.d_kv,
                                         d_ff=config.model.d_ff, num_layers=config.model.num_layers,
                                         num_heads=config.model.num_heads)
  v = int(lm_config.vocab_size)
  inverter = model_lib.Inverter(t5_config, int(config.model.width),
                                model_lib.num_chunks(v, int(config.model.width), bool(config.model.official_padding)),
                                int(config.model.bottleneck), float(config.model.dropout_rate))
  labels, label_mask = encode_labels(dec_tok, train_p, int(config.data.label_len))
  return dict(train_prompts=train_p, test_prompts=test_p, train_lp=train_lp, test_lp=test_lp, target_tok=target_tok,
              dec_tok=dec_tok, t5_config=t5_config, inverter=inverter, train_labels=labels,
              train_label_mask=label_mask, vocab_size=v, seconds_distributions=seconds)


def encode_labels(tok: Any, texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray]:
  """Decoder targets: the text's tokens then EOS, cut to `length` (EOS kept last), right-padded.

  Returns:
    (labels [N, length] int32, label_mask [N, length] bool).
  """
  labels = np.full((len(texts), length), tok.pad_id, np.int32)
  mask = np.zeros((len(texts), length), bool)
  for i, t in enumerate(texts):
    ids = tok.encode(t, add_bos=False)[: length - 1] + [tok.eos_id]
    labels[i, :len(ids)] = ids
    mask[i, :len(ids)] = True
  return labels, mask


def train(config: Any, prep: dict, workdir: str | None = None, progress: bool = True) -> loop_lib.LoopResult:
  """Trains the inverter with `common.loop.train_loop` (K steps per compiled call)."""
  inverter = prep["inverter"]
  n = len(prep["train_prompts"])
  bs = int(config.batch_size)
  if n < bs:
    raise ValueError(f"{n} training prompts for batch_size={bs}: lower the batch size or add prompts.")
  tx = make_optimizer(config.optimizer, int(config.num_steps))
  rng_seed = int(config.seed)

  def batches(step: int) -> dict:
    epoch, pos = divmod(step * bs, n - n % bs)
    order = np.random.default_rng([rng_seed, epoch]).permutation(n)
    idx = np.sort(order[pos:pos + bs])  # sorted: memmap reads in file order
    return {"logprobs": np.asarray(prep["train_lp"][idx]), "labels": prep["train_labels"][idx],
            "label_mask": prep["train_label_mask"][idx]}

  return loop_lib.train_loop(
      init_fn=lambda k: model_lib.init_state(k, inverter, tx, prep["vocab_size"]),
      train_step=model_lib.make_train_step(inverter, bool(config.model.official_padding)),
      batches=batches, num_steps=int(config.num_steps), key=jax.random.key(rng_seed), workdir=workdir,
      mesh=sharding.make_mesh(config.get("mesh")), log_every=int(config.log_every),
      checkpoint_every=int(config.checkpoint_every), config=config, progress=progress,
      steps_per_call=int(config.get("steps_per_call", 1)), name="lm_inversion")


def predict(params: Any, logprobs: np.ndarray, unigram: jax.Array, prep: dict, config: Any,
            batch_size: int = 64) -> list[str]:
  """Greedy inversions of [N, V] distributions, decoded to text with the decoder tokenizer."""
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


def run(config: Any, workdir: str) -> dict:
  """Prepares the data, trains the inverter, inverts the held-out prompts; writes results.json and examples."""
  os.makedirs(workdir, exist_ok=True)
  prep = prepare(config, workdir)
  res = train(config, prep, workdir)
  params, unigram = res.state.params, res.state.extra["unigram"]
  preds = predict(params, prep["test_lp"], unigram, prep, config)
  scores = inv_metrics.metrics(preds, prep["test_prompts"])
  results = {"test": scores, "num_train": len(prep["train_prompts"]), "num_test": len(prep["test_prompts"]),
             "num_chunks": prep["inverter"].num_chunks, "steps_per_s": res.steps_per_s,
             "final_train_loss": next((r["train/loss"] for r in reversed(res.history) if "train/loss" in r), None),
             "seconds_distributions": prep["seconds_distributions"]}
  metrics_lib.write_results(workdir, results)
  with open(os.path.join(workdir, "examples.jsonl"), "w") as f:
    for p, r in list(zip(preds, prep["test_prompts"]))[:50]:
      f.write(json.dumps({"prediction": p, "reference": r}) + "\n")
  return results
