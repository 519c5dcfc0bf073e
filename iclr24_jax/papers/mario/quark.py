"""MaRio's policy: batches with control codes, the Quark loss, SFT / Quark train steps, and sampling.

Decoder-only policy (SmolLM2 + LoRA; # Deviation: the paper's policy is T5-large, an encoder-decoder). A training
row is  prompt | codes | response  where the prompt is the ChatML question and the K codes are the first response
tokens; the loss counts only the response tokens. The reference policy (the frozen base = the SFT starting point
of the adapters) reads the same row with the codes masked out: positions count real tokens only and masked keys
are never attended to, so its logits equal those of  prompt | response  (tested), aligned token for token with
the policy's. The encoder-decoder path (a T5 with the codes after the decoder start token) is kept for tests.

  batch = mario.encode_examples(tok, questions, responses, prefixes, max_len=96)
  step = mario.make_quark_step(config, lora_config, kl_coef=0.1)           # pure: step(state, batch, key)
  out = mario.sample(key, params, config, prompt_ids, prompt_mask, codes, max_new_tokens=48)
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks
from iclr24_jax.lm import generation, llama, t5
from iclr24_jax.lm import tokenizer as tok_lib
from iclr24_jax.lm import train as lm_train


def prompt_text(question: str) -> str:
  """The policy's prompt: the question as a ChatML user turn, then the assistant header (no system turn)."""
  return f"<|im_start|>user\n{question.strip()}<|im_end|>\n<|im_start|>assistant\n"


def encode_examples(tokenizer, questions: Sequence[str], responses: Sequence[str],
                    prefixes: Sequence[Sequence[int]] | None = None, max_len: int = 96,
                    end_id: int | None = None) -> dict[str, np.ndarray]:
  """Right-padded rows  prompt | codes | response | end  for a decoder-only policy.

  Args:
    tokenizer: the policy's tokenizer.
    questions, responses: N strings each.
    prefixes: N code-id lists of the same length K (None: no codes, the SFT rows).
    max_len: T; a longer row loses the end of its response (the end token then is missing too).
    end_id: the token closing a response (default the tokenizer's EOS: SmolLM2's <|im_end|>).

  Returns:
    {'ids' [N, T] int32, 'mask' [N, T] bool, 'loss_mask' [N, T] bool (response + end tokens),
      'code_mask' [N, T] bool (the codes)}.
  """
  n = len(questions)
  if len(responses) != n or (prefixes is not None and len(prefixes) != n):
    raise ValueError(f"encode_examples needs N questions, responses (and prefixes); got {n}, {len(responses)}, "
                     f"{None if prefixes is None else len(prefixes)}.")
  if prefixes is not None and len({len(p) for p in prefixes}) > 1:
    raise ValueError("every row needs the same number of control codes.")
  end = tokenizer.eos_id if end_id is None else end_id
  rows, loss_rows, code_rows = [], [], []
  for i in range(n):
    p = tokenizer.encode(prompt_text(questions[i]), add_bos=False)
    c = [] if prefixes is None else [int(x) for x in prefixes[i]]
    r = tokenizer.encode(" " + responses[i].strip(), add_bos=False) + [end]
    if len(p) + len(c) >= max_len:
      raise ValueError(f"row {i}: the prompt and codes ({len(p) + len(c)} tokens) leave no room in max_len={max_len}.")
    ids = (p + c + r)[:max_len]
    rows.append(ids)
    loss_rows.append(([0] * (len(p) + len(c)) + [1] * len(r))[:max_len])
    code_rows.append(([0] * len(p) + [1] * len(c) + [0] * len(r))[:max_len])
  ids, mask = tok_lib.pad_sequences(rows, tokenizer.pad_id, max_len=max_len)
  lmask, _ = tok_lib.pad_sequences(loss_rows, 0, max_len=max_len)
  cmask, _ = tok_lib.pad_sequences(code_rows, 0, max_len=max_len)
  return {"ids": ids, "mask": mask, "loss_mask": lmask.astype(bool) & mask, "code_mask": cmask.astype(bool) & mask}


def encode_prompts(tokenizer, questions: Sequence[str], width: int) -> tuple[np.ndarray, np.ndarray]:
  """Left-padded prompt ids [N, width] and mask for `sample` (codes are appended after them).

  Args:
    tokenizer: the policy's tokenizer (`encode`, `pad_id`).
    questions: N questions (each wrapped by `prompt_text`).
    width: P, the prompt width; every prompt must fit.

  Returns:
    (ids [N, P] int32, mask [N, P] bool), left-padded.

  Raises:
    ValueError: a prompt is longer than `width`.
  """
  enc = [tokenizer.encode(prompt_text(q), add_bos=False) for q in questions]
  longest = max((len(e) for e in enc), default=0)
  if longest > width:
    raise ValueError(f"a prompt has {longest} tokens, more than the prompt width {width}; raise it.")
  return tok_lib.pad_sequences(enc, tokenizer.pad_id, max_len=width, padding="left")


def _entropy(logp: jax.Array) -> jax.Array:
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def quark_loss(params: Any, config: Any, batch: Mapping[str, jax.Array], ref_params: Any, *, kl_coef: float = 0.1,
               entropy_coef: float = 0.0, task_coef: float = 0.0) -> tuple[jax.Array, dict]:
  """Quark / MaRio objective: NLL(response | codes) + kl_coef KL(pi || pi_ref) - entropy_coef H(pi) [+ task NLL].

  MaRio Sec. 3 / official `ConditionTrainer.loss` (mario/main_n_new.py:456-492): per response token,
  lm_loss + kl_coef * kl - entropy_coef * entropy, averaged over the response tokens (`reduce_mean(..., masks)`);
  the reference policy reads the response WITHOUT the codes. With `task_coef` > 0 and the batch holding a task
  sequence (`task_ids`, `task_mask`, `task_loss_mask`: prompt | "So the answer is GOLD." without codes), its NLL is
  added (the official glseq loss, task_loss_coef).

  Args:
    params: the policy's parameters (LoRA attached).
    config: `llama.LlamaConfig` (decoder-only) or `t5.T5Config`.
    batch: Llama: ids, mask, loss_mask, code_mask [B, T] (see `encode_examples`). T5: inputs, input_mask,
      labels [B, K + T'] (codes then response), label_mask, loss_mask (no codes), ref_labels [B, T'] and
      ref_label_mask (the response alone; K = the difference of the two widths). Either may hold scalars
      `kl_scale` / `entropy_scale` multiplying the coefficients (0 and 0 with no codes: the SFT loss, so one
      compiled step serves SFT and Quark).
    ref_params: the frozen reference (the LoRA base).
    kl_coef, entropy_coef, task_coef: the coefficients (the official run command: 0.1, 0.0, 0.0; its argparse
      defaults: 0.05, 0.05, 1.0).

  Returns:
    (loss, {'loss', 'nll', 'kl', 'entropy', 'task_nll', 'accuracy', 'tokens'}); negative Python coefficients
    raise HyperparameterError, traced ones out of range give NaN (`common.checks`).
  """
  where = "mario.quark_loss"
  ok = checks.all_ok(*(checks.in_range(where, name, v, 0.0, None, hint="the objective's coefficients are >= 0.")
                       for name, v in (("kl_coef", kl_coef), ("entropy_coef", entropy_coef),
                                       ("task_coef", task_coef))))
  if isinstance(config, t5.T5Config):
    logits, targets, w = t5.label_logits(params, config, batch)
    k = batch["labels"].shape[1] - batch["ref_labels"].shape[1]
    ref_logits, _, _ = t5.label_logits(ref_params, config, {
        "inputs": batch["inputs"], "input_mask": batch.get("input_mask"), "labels": batch["ref_labels"],
        "label_mask": batch["ref_label_mask"]})
    logits, targets, w = logits[:, k:], targets[:, k:], w[:, k:]
  elif isinstance(config, llama.LlamaConfig):
    logits, targets, w = lm_train.causal_target_logits(params, config, batch)
    ref_batch = {"ids": batch["ids"], "mask": batch["mask"] & ~batch["code_mask"], "loss_mask": batch["loss_mask"]}
    ref_logits, _, _ = lm_train.causal_target_logits(ref_params, config, ref_batch)
  else:
    raise TypeError(f"quark_loss supports LlamaConfig and t5.T5Config, got {type(config).__name__}.")
  logp = jax.nn.log_softmax(logits, axis=-1)
  n = jnp.maximum(jnp.sum(w), 1.0)
  nll_tok = -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
  kl_tok = lm_train.token_kl(logits, ref_logits)
  ent_tok = _entropy(logp)
  nll, kl, ent = (jnp.sum(x * w) / n for x in (nll_tok, kl_tok, ent_tok))
  # Optional batch scalars scale the two regularisers (SFT = scales 0 through the same compiled step).
  kl_w = kl_coef * batch.get("kl_scale", 1.0)
  ent_w = entropy_coef * batch.get("entropy_scale", 1.0)
  # official: INK-USC/RationaleMultiRewardDistillation@8f9ff58 mario/main_n_new.py:489-491
  loss = nll + kl_w * kl - ent_w * ent                           # reduce_mean(lm + kl_coef kl - ent_coef H)
  task_nll = jnp.zeros((), jnp.float32)
  if task_coef > 0 and "task_ids" in batch:
    task_nll, _ = lm_train.causal_lm_loss(params, config, {"ids": batch["task_ids"], "mask": batch["task_mask"],
                                                           "loss_mask": batch["task_loss_mask"]})
    # official: INK-USC/RationaleMultiRewardDistillation@8f9ff58 mario/main_n_new.py:492
    loss = loss + task_coef * task_nll
  acc = jnp.sum((jnp.argmax(logits, -1) == targets) * w) / n
  return checks.poison((loss, {"loss": loss, "nll": nll, "kl": kl, "entropy": ent, "task_nll": task_nll,
                               "accuracy": acc, "tokens": jnp.sum(w)}), ok)


def make_quark_step(config: Any, lora_config=None, kl_coef: float = 0.1, entropy_coef: float = 0.0,
                    task_coef: float = 0.0):
  """A pure `step(state, batch, key) -> (state, metrics)` minimising `quark_loss` (compile it yourself).

  Args:
    config: the policy's `llama.LlamaConfig` (or `t5.T5Config`).
    lora_config: `lm.LoraConfig` of the adapters, or None for full finetuning.
    kl_coef, entropy_coef, task_coef: `quark_loss` coefficients.

  Returns:
    `step(state, batch, key) -> (state, metrics)`; batch as in `quark_loss` ([B, T] arrays).
  """
  loss_fn = functools.partial(quark_loss, kl_coef=kl_coef, entropy_coef=entropy_coef, task_coef=task_coef)
  return lm_train.make_train_step(config, lora_config, loss_fn=loss_fn)


def make_sft_step(config: Any, lora_config=None):
  """A pure `step(state, batch, key)`: NLL of the silver "rationale So the answer is X." (the SFT baseline).

  Args:
    config: the policy's `llama.LlamaConfig` (or `t5.T5Config`).
    lora_config: `lm.LoraConfig` of the adapters, or None for full finetuning.

  Returns:
    `step(state, batch, key) -> (state, metrics)`; batch ids / mask / loss_mask [B, T].
  """
  return lm_train.make_train_step(config, lora_config)


def sft_step(state, batch, key, *, config, lora_config=None):
  """One SFT step (pure; `jax.jit(functools.partial(sft_step, config=..., lora_config=...))`).

  Args:
    state: TrainState (`lm.init_train_state`).
    batch: ids / mask / loss_mask [B, T] (`encode_examples` without prefixes), or a T5 batch.
    key: PRNG key (unused: no dropout).
    config: the policy's `llama.LlamaConfig` (or `t5.T5Config`).
    lora_config: `lm.LoraConfig`, or None for full finetuning.

  Returns:
    (state, metrics {'loss', 'accuracy', 'tokens', 'grad_norm'}).
  """
  return make_sft_step(config, lora_config)(state, batch, key)


def quark_step(state, batch, key, *, config, lora_config=None, kl_coef: float = 0.1, entropy_coef: float = 0.0,
               task_coef: float = 0.0):
  """One Quark step on pooled samples with their codes (pure; jit it with the keywords bound).

  Args:
    state: TrainState (`lm.init_train_state`; LoRA adapters as params, the base in extra).
    batch: ids / mask / loss_mask / code_mask [B, T] (`encode_examples` with prefixes), optional scalars
      kl_scale / entropy_scale; or a T5 batch (see `quark_loss`).
    key: PRNG key (unused: no dropout).
    config: the policy's `llama.LlamaConfig` (or `t5.T5Config`).
    lora_config: `lm.LoraConfig`, or None for full finetuning.
    kl_coef, entropy_coef, task_coef: `quark_loss` coefficients.

  Returns:
    (state, metrics of `quark_loss` + 'grad_norm').
  """
  return make_quark_step(config, lora_config, kl_coef, entropy_coef, task_coef)(state, batch, key)


def sample(key: jax.Array, params: Any, config: Any, prompt_ids: jax.Array, prompt_mask: jax.Array,
           codes: jax.Array | None, max_new_tokens: int, temperature: float = 1.0, top_p: float = 0.9,
           stop_ids: Sequence[int] = (), pad_id: int = 0) -> generation.GenerationOutput:
  """Samples responses conditioned on control codes (top-p; temperature 0 = greedy).

  Llama: the K codes are appended after the LEFT-padded prompts (they are the first response tokens) and decoding
  continues after them. T5: `prompt_ids` are the encoder inputs and the codes go right after the decoder start
  token (`t5.generate(decoder_prefix=codes)`; the returned tokens then start with the codes).

  Args:
    key: PRNG key.
    params, config: the policy (merged / fused params are fastest).
    prompt_ids: [B, P] ids (Llama: left-padded); prompt_mask: [B, P] bool.
    codes: [B, K] control-code ids, or None.
    max_new_tokens, temperature, top_p: decoding (static).
    stop_ids: stop tokens (static); pad_id: written after a stop (Llama).

  Returns:
    `GenerationOutput` (Llama: the generated tokens after the codes; T5: codes then generated tokens).
  """
  if isinstance(config, t5.T5Config):
    return t5.generate(params, config, prompt_ids, prompt_mask, key, max_new_tokens, temperature=temperature,
                       top_p=top_p, stop_ids=tuple(stop_ids) or None, decoder_prefix=codes)
  if codes is not None:
    codes = jnp.asarray(codes, jnp.int32)
    if codes.ndim != 2 or codes.shape[0] != prompt_ids.shape[0]:
      raise ValueError(f"codes must be [B={prompt_ids.shape[0]}, K], got shape {codes.shape}.")
    prompt_ids = jnp.concatenate([jnp.asarray(prompt_ids, jnp.int32), codes], axis=1)
    prompt_mask = jnp.concatenate([jnp.asarray(prompt_mask, bool), jnp.ones(codes.shape, bool)], axis=1)
  return generation.generate(params, config, prompt_ids, prompt_mask, key, max_new_tokens, temperature=temperature,
                             top_p=top_p, stop_ids=tuple(stop_ids), pad_id=pad_id)
