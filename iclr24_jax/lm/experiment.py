"""The `lm` family experiment: `run(config, workdir)` finetunes a causal LM (LoRA or full) on embedded text
(configs/lm.py). The SmolLM2 sanity figures and the throughput benchmark are in `study.py`.
"""
from __future__ import annotations

import functools
import os
import pathlib
from typing import Any

import jax
import numpy as np

from iclr24_jax.common import loop, optim, sharding
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.lm import corpus, generation, llama, lora, train, weights
from iclr24_jax.lm import tokenizer as tok_lib


def _build_model(config) -> tuple[llama.Params, llama.LlamaConfig, tok_lib.Tokenizer]:
  m = config.model
  if m.name == "smollm2":
    return weights.load_smollm2(m.gguf_path or None)
  if m.name == "tiny_llama":
    texts = list(corpus.TRAIN_TEXTS) + [q + " " + a for q, a in corpus.QA_PAIRS]
    tok = tok_lib.train_bpe(texts, vocab_size=int(m.vocab_size))
    cfg = llama.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=m.hidden_size, num_layers=m.num_layers,
                            num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, intermediate_size=m.intermediate_size,
                            rope_base=10000.0, max_seq_len=m.max_seq_len)
    params = jax.jit(llama.init_params, static_argnums=1)(jax.random.key(config.seed), cfg)
    return params, cfg, tok
  raise ValueError(f"unknown config.model.name '{m.name}'; choose 'smollm2' or 'tiny_llama'.")


def _texts(config) -> tuple[list[str], list[str]]:
  if config.data.get("data_dir"):
    d = pathlib.Path(config.data.data_dir)
    if not d.exists():
      raise FileNotFoundError(f"config.data.data_dir '{d}' does not exist; give a folder of .txt files "
                              "(one paragraph per line) or leave it empty for the embedded texts.")
    lines = [ln.strip() for f in sorted(d.glob("*.txt")) for ln in f.read_text().splitlines() if ln.strip()]
    if len(lines) < 2:
      raise ValueError(f"{d} holds fewer than 2 non-empty lines of text.")
    return lines[:-1], lines[-1:]
  return list(corpus.TRAIN_TEXTS), [corpus.HELD_OUT_TEXT]


def make_examples(config, tok: tok_lib.Tokenizer) -> tuple[list, list, list[str]]:
  """(train examples, eval examples, sample prompts); an example is (ids, loss_mask) lists.

  Args:
    config: the lm experiment ConfigDict (config.data.name 'qa' or 'paragraphs'; paragraphs read
      config.data.data_dir when set, else the built-in corpus).
    tok: the model's Tokenizer.

  Returns:
    (train, eval, prompts): train / eval are lists of (ids: list[int], loss_mask: list[int] of 0/1, same
    length); 'qa' examples are the chat-templated question (mask 0) then the answer + EOS (mask 1),
    'paragraphs' examples are whole texts (mask 1). prompts are str (held-out questions, or each eval
    text's first six words).

  Raises:
    ValueError: unknown config.data.name.
  """
  def qa(pairs):
    out = []
    for q, a in pairs:
      p = tok.encode(tok.apply_chat_template(q))
      t = tok.encode(a) + ([tok.eos_id] if tok.eos_id is not None else [])
      out.append((p + t, [0] * len(p) + [1] * len(t)))
    return out

  if config.data.name == "qa":
    return qa(corpus.QA_PAIRS), qa(corpus.HELD_OUT_QA), [q for q, _ in corpus.HELD_OUT_QA]
  if config.data.name == "paragraphs":
    train_texts, eval_texts = _texts(config)
    enc = lambda ts: [(tok.encode(t), [1] * len(tok.encode(t))) for t in ts]  # noqa: E731
    prompts = [" ".join(t.split()[:6]) for t in eval_texts]
    return enc(train_texts), enc(eval_texts), prompts
  raise ValueError(f"unknown config.data.name '{config.data.name}'; choose 'qa' or 'paragraphs'.")


def _pack(examples, rows: np.ndarray, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
  ids = np.full((len(rows), seq_len), pad_id, np.int32)
  mask = np.zeros((len(rows), seq_len), bool)
  loss_mask = np.zeros((len(rows), seq_len), bool)
  for i, r in enumerate(rows):
    toks, lm = examples[int(r)]
    n = min(len(toks), seq_len)
    ids[i, :n], mask[i, :n], loss_mask[i, :n] = toks[:n], True, np.asarray(lm[:n], bool)
  return {"ids": ids, "mask": mask, "loss_mask": loss_mask}


def run(config: Any, workdir: str) -> dict:
  """Finetunes config.model on config.data; writes metrics.jsonl, checkpoints, results.json, curves.png.

  Args:
    config: the lm experiment ConfigDict (`configs/lm.py`): model, data, lora, optimizer, mesh, batch_size,
      seq_len, num_steps, log/eval/checkpoint cadence, seed, max_new_tokens.
    workdir: output folder (a run resumes from its checkpoints).

  Returns:
    results dict: model, lora, trainable_params, eval_loss_before / after, eval_perplexity_before / after,
    samples (prompt -> generated text), steps_per_s, num_steps, resumed_from_step.
  """
  params, cfg, tok = _build_model(config)
  train_ex, eval_ex, prompts = make_examples(config, tok)
  mesh = sharding.make_mesh(config.mesh)
  lora_cfg = (lora.LoraConfig(rank=config.lora.rank, alpha=config.lora.alpha, targets=tuple(config.lora.targets))
              if config.lora.enabled else None)
  tx = optim.make_optimizer(config.optimizer, config.num_steps)
  n_data = mesh.shape[sharding.DATA_AXIS]
  eval_rows = np.arange(-(-len(eval_ex) // n_data) * n_data) % len(eval_ex)
  eval_batch = _pack(eval_ex, eval_rows, config.seq_len, tok.pad_id)
  eval_weight = np.zeros(len(eval_rows), bool)
  eval_weight[:len(eval_ex)] = True
  eval_batch["loss_mask"] &= eval_weight[:, None]  # padding rows (copies) do not count

  def batches(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([config.seed, step])
    return _pack(train_ex, rng.integers(0, len(train_ex), config.batch_size), config.seq_len, tok.pad_id)

  eval_step = jax.jit(train.make_eval_step(cfg, lora_cfg))

  def eval_fn(state):
    return {"loss": float(eval_step(state, eval_batch)["loss"])}

  def init_fn(key):
    return train.init_train_state(train.params_from_host(params), tx, lora_config=lora_cfg, key=key)

  before = jax.jit(functools.partial(train.causal_lm_loss, config=cfg))(params, batch=eval_batch)[0]
  res = loop.train_loop(init_fn=init_fn, train_step=train.make_train_step(cfg, lora_cfg),
                        batches=batches, num_steps=config.num_steps, key=jax.random.key(config.seed),
                        workdir=workdir, mesh=mesh, log_every=config.log_every, eval_every=config.eval_every,
                        eval_fn=eval_fn, config=config, **loop.checkpoint_options(config))
  final = jax.jit(train.model_params, static_argnums=1)(res.state, lora_cfg)
  after = res.final_eval["eval/loss"]
  chat = config.data.name == "qa"
  gen = generation.Generator(final, cfg, tok, chat=chat, batch_size=max(len(prompts), 1), max_prompt_len=64)
  samples = gen(prompts, max_new_tokens=config.max_new_tokens)
  results = {"model": config.model.name, "lora": lora_cfg is not None,
             "trainable_params": (lora.num_params(res.state.params) if lora_cfg else llama.num_params(params)),
             "eval_loss_before": float(before), "eval_loss_after": float(after),
             "eval_perplexity_before": float(np.exp(before)), "eval_perplexity_after": float(np.exp(after)),
             "samples": dict(zip(prompts, samples)), "steps_per_s": res.steps_per_s, "num_steps": config.num_steps,
             "resumed_from_step": res.start_step}
  metrics_lib.write_results(workdir, results)
  if jax.process_index() == 0:
    rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    metrics_lib.plot_curves(rows, ["train/loss", "eval/loss"], os.path.join(workdir, "curves.png"),
                            title=f"{config.model.name} {'LoRA' if lora_cfg else 'full'} finetuning")
  return results
