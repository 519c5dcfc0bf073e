"""The synthetic study: a tiny Llama pretrained on the grammar's general mix, finetuned on its domain mix (full or
LoRA), with the probe versions scored every `eval_every` steps. Whole runs are pure functions of a key, so seeds
are a `jax.vmap` and each method is one compiled program (lax.scan over evaluation chunks and steps).

  base, tables, pre_loss = jax.jit(jax.vmap(make_pretrain(spec, cfg, ...)))(keys)        # [S, ...]
  deltas, loss = jax.jit(jax.vmap(make_finetune(spec, cfg, lora_config, ...)))(keys, base, tables, probes)
  # deltas: [S, E, 4, N, T] = Eq. (1) on the versions ('original', 'topic', 'style', 'counterfactual')
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax import lm
from iclr24_jax.lm import train as lm_train
from iclr24_jax.papers.finetune_dissect import dissect
from iclr24_jax.papers.finetune_dissect import grammar

# The official LoRA targets (config/train_lora.yaml): every attention and MLP projection.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_optimizer(learning_rate: float, num_steps: int, warmup_frac: float = 0.1, grad_clip: float = 1.0,
                   weight_decay: float = 0.0) -> optax.GradientTransformation:
  """The official trainer's optimizer: AdamW, linear warmup over `warmup_frac` of the steps then linear decay to 0,
  global-norm clipping (official: warmup_ratio 0.1, scheduler linear, gradient_clip_val 1.0, HF weight decay 0).

  Args:
    learning_rate: peak learning rate (reached after the warmup).
    num_steps: total optimizer steps (warmup + decay).
    warmup_frac: share of `num_steps` spent warming up from 0 (at least one step).
    grad_clip: global-norm clip applied before AdamW.
    weight_decay: AdamW decoupled weight decay.

  Returns:
    optax.GradientTransformation: clip -> AdamW(warmup-then-linear-decay schedule).
  """
  warm = max(1, int(round(warmup_frac * num_steps)))
  sched = optax.join_schedules([optax.linear_schedule(0.0, learning_rate, warm),
                                optax.linear_schedule(learning_rate, 0.0, max(1, num_steps - warm))], [warm])
  return optax.chain(optax.clip_by_global_norm(grad_clip), optax.adamw(sched, weight_decay=weight_decay))


def model_config(spec: grammar.GrammarSpec, model: Any, max_seq_len: int = 64) -> lm.LlamaConfig:
  """The tiny Llama for a grammar.

  Args:
    spec: the grammar (its `vocab_size` and `seq_len` size the embedding and the RoPE table).
    model: mapping (e.g. `config.model`) with hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size.
    max_seq_len: the RoPE table's length at least (e.g. the longer pretraining documents' seq_len).

  Returns:
    lm.LlamaConfig with tied embeddings and max_seq_len = max(max_seq_len, spec.seq_len).
  """
  return lm.LlamaConfig(vocab_size=spec.vocab_size, hidden_size=int(model["hidden_size"]),
                        num_layers=int(model["num_layers"]), num_heads=int(model["num_heads"]),
                        num_kv_heads=int(model["num_kv_heads"]), intermediate_size=int(model["intermediate_size"]),
                        rope_base=10000.0, max_seq_len=max(int(max_seq_len), spec.seq_len), tie_embeddings=True)


def pretrain_spec(spec: grammar.GrammarSpec, pretrain: Any) -> grammar.GrammarSpec:
  """The grammar of the pretraining documents: the study's, with `pretrain['num_sentences']` sentences if given.

  Longer pretraining documents put more of their topic and style words after the first, where reading the context
  pays (ln V_t instead of ln(T V_t) per topic word): the tiny Llama learns to read it within the budget, which it
  did not on the study's 4-sentence documents (measured: 3,000 steps at batch 32 left every topic word at
  ln(T V_t)). Finetuning and the probes keep the study's length.

  Args:
    spec: the study's grammar.
    pretrain: mapping (e.g. `config.pretrain`), optionally with num_sentences (0 or absent: the study's).

  Returns:
    grammar.GrammarSpec (the same vocabulary and facts; only num_sentences may differ).
  """
  k = int(pretrain.get("num_sentences", 0) or 0)
  return dataclasses.replace(spec, num_sentences=k) if k else spec


def lora_config(rank: int, alpha_over_rank: float = 2.0, targets=LORA_TARGETS) -> lm.LoraConfig:
  """LoRA with alpha = alpha_over_rank * rank (official rank 8, alpha 16: the same scale 2 at every rank).

  Args:
    rank: adapter rank r.
    alpha_over_rank: alpha / r (the adapter scale).
    targets: projection names that get adapters (default: every attention and MLP projection).

  Returns:
    lm.LoraConfig.
  """
  return lm.LoraConfig(rank=int(rank), alpha=float(alpha_over_rank) * int(rank), targets=tuple(targets))


def scale_layer_init(params, scale: float):
  """Multiplies every kernel of the transformer layers (attention and MLP projections) by `scale`; embeddings and
  norms are left as they are.

  Args:
    params: `lm.init_params` output.
    scale: the factor (1.0 returns the parameters unchanged).

  Returns:
    The parameter pytree with scaled layer kernels.
  """
  if scale == 1.0:
    return params
  layers = [{name: ({**p, "kernel": p["kernel"] * scale} if isinstance(p, dict) and "kernel" in p else p)
             for name, p in layer.items()} for layer in params["layers"]]
  return {**params, "layers": layers}


def make_pretrain_chunks(spec: grammar.GrammarSpec, config: lm.LlamaConfig, *, steps: int, batch_size: int,
                         learning_rate: float, init_scale: float = 1.0) -> tuple[Callable, Callable]:
  """`make_pretrain` as two pure pieces, so a driver can run the steps in chunks (and save between them).

  `init(key) -> (state, tables)` builds the world's facts and the TrainState; `run(state, key, tables, start, n)
  -> (state, losses [n])` runs steps start .. start + n - 1 (`n` static). Step i draws its batch from
  `fold_in(key_data, i)`, so chunks of any size compose to the whole run.

  Args:
    spec, config, steps, batch_size, learning_rate, init_scale: as in `make_pretrain` (`steps` sizes the schedule).

  Returns:
    (init, run): pure, jittable and vmappable over keys (`run` with `in_axes=(0, 0, 0, None)` and `n` static).
  """
  tx = make_optimizer(learning_rate, steps)
  step_fn = lm_train.make_train_step(config)

  def init(key):
    key_facts, key_init, _ = jax.random.split(key, 3)
    tables = grammar.fact_tables(key_facts, spec)
    params = scale_layer_init(lm.init_params(key_init, config), float(init_scale))
    return lm_train.init_train_state(params, tx), tables

  def run(state, key, tables, start, n: int):
    key_data = jax.random.split(key, 3)[2]

    def body(state, i):
      ids = grammar.sample_documents(jax.random.fold_in(key_data, i), spec, batch_size, tables, "general")
      state, m = step_fn(state, {"ids": ids, "mask": jnp.ones_like(ids, bool)}, key_data)
      return state, m["loss"]

    return jax.lax.scan(body, state, start + jnp.arange(n))

  return init, run


def make_pretrain(spec: grammar.GrammarSpec, config: lm.LlamaConfig, *, steps: int, batch_size: int,
                  learning_rate: float, init_scale: float = 1.0) -> Callable:
  """`pretrain(key) -> (params, tables, loss [steps])`: random init, `steps` full-model steps on the general mix.

  The key is split into the world's facts (`grammar.fact_tables`), the init and the data stream. One program:
  `make_pretrain_chunks`' pieces with a single chunk of every step.

  Args:
    spec: the grammar of the pretraining documents (`pretrain_spec`).
    config: the Llama (`model_config`).
    steps: full-model AdamW steps (`make_optimizer` schedule over them).
    batch_size: documents per step B (each [spec.seq_len] tokens).
    learning_rate: peak learning rate.
    init_scale: factor on the initial layer kernels (`scale_layer_init`; `lm.init_params` draws them with std 0.02,
      GPT-2's value for width 768).

  Returns:
    pure `pretrain(key)` -> (params pytree, tables {'general' [G], 'domain' [D], 'counterfactual' [D]},
    losses [steps] float32); jittable and vmappable over keys.
  """
  init, run = make_pretrain_chunks(spec, config, steps=steps, batch_size=batch_size, learning_rate=learning_rate,
                                   init_scale=init_scale)

  def pretrain(key):
    state, tables = init(key)
    state, losses = run(state, key, tables, 0, steps)
    return state.params, tables, losses

  return pretrain


FIT_SLOTS = ("first_style", "later_style", "first_topic", "later_topic", "subject", "value")


def base_fit(params, config: lm.LlamaConfig, spec: grammar.GrammarSpec, tables: dict, key: jax.Array,
             num_documents: int = 512) -> dict[str, jax.Array]:
  """How well a model fits the general mix: its mean loss on fresh documents, overall and by slot, to be read
  beside `grammar.general_entropy(spec)` (a base that models the grammar matches it).

  Args:
    params: the model (e.g. a pretrained base).
    config: its `lm.LlamaConfig`.
    spec: the grammar of the documents scored (num_sentences >= 2).
    tables: `grammar.fact_tables` output.
    key: PRNG key of the fresh documents.
    num_documents: documents scored.

  Returns:
    {'per_token': mean loss over the seq_len - 1 scored tokens, and each of `FIT_SLOTS`: the mean loss at that
    slot (first / later topic and style words, subjects, values)}: float32 scalars (jittable, vmappable).

  Raises:
    ValueError: num_sentences < 2.
  """
  if spec.num_sentences < 2:
    raise ValueError(f"base_fit needs num_sentences >= 2 (later topic / style words); got {spec.num_sentences}.")
  ids = grammar.sample_documents(key, spec, num_documents, tables, "general")
  nll = -lm.token_logprobs(params, config, ids)
  ps, pt, pj, pv = (spec.positions(k) for k in range(4))
  return {"per_token": nll[:, 1:].mean(), "first_style": nll[:, ps[0]].mean(), "later_style": nll[:, ps[1:]].mean(),
          "first_topic": nll[:, pt[0]].mean(), "later_topic": nll[:, pt[1:]].mean(), "subject": nll[:, pj].mean(),
          "value": nll[:, pv].mean()}


def make_finetune_chunks(spec: grammar.GrammarSpec, config: lm.LlamaConfig, lora: lm.LoraConfig | None, *,
                         steps: int, eval_every: int, batch_size: int, learning_rate: float, warmup_frac: float = 0.1,
                         grad_clip: float = 1.0) -> tuple[Callable, Callable]:
  """`make_finetune` as two pure pieces, so a driver can run its evaluation chunks a few at a time.

  `init(key, base_params) -> state` (the TrainState; LoRA adapters drawn from the key);
  `run(state, key, base_params, tables, probes, start, n) -> (state, (deltas [n, V, N, T], losses [n * eval_every]))`
  runs evaluation chunks start .. start + n - 1 (`n` static), each `eval_every` steps then the probe scoring. Step
  i draws its batch from `fold_in(key_data, i)`, so chunks compose to the whole run.

  Args:
    spec, config, lora, steps, eval_every, batch_size, learning_rate, warmup_frac, grad_clip: as in `make_finetune`.

  Returns:
    (init, run): pure, jittable and vmappable over seeds.

  Raises:
    ValueError: `steps` is not a multiple of `eval_every`.
  """
  if steps % eval_every:
    raise ValueError(f"finetune steps ({steps}) must be a multiple of eval_every ({eval_every}).")
  tx = make_optimizer(learning_rate, steps, warmup_frac, grad_clip)
  step_fn = lm_train.make_train_step(config, lora)

  def init(key, base_params):
    key_lora = jax.random.split(key)[0]
    return lm_train.init_train_state(base_params, tx, lora_config=lora, key=key_lora if lora else None)

  def run(state, key, base_params, tables, probes, start, n: int):
    key_data = jax.random.split(key)[1]
    flat = probes.reshape(-1, probes.shape[-1])

    def train_chunk(state, c):
      def body(state, i):
        ids = grammar.sample_documents(jax.random.fold_in(key_data, i), spec, batch_size, tables, "domain")
        state, m = step_fn(state, {"ids": ids, "mask": jnp.ones_like(ids, bool)}, key_data)
        return state, m["loss"]
      state, losses = jax.lax.scan(body, state, c * eval_every + jnp.arange(eval_every))
      ft = lm_train.model_params(state, lora)
      delta = dissect.token_logprob_change(base_params, ft, config, flat)
      return state, (delta.reshape(probes.shape), losses)

    state, (deltas, losses) = jax.lax.scan(train_chunk, state, start + jnp.arange(n))
    return state, (deltas, losses.reshape(-1))

  return init, run


def make_finetune(spec: grammar.GrammarSpec, config: lm.LlamaConfig, lora: lm.LoraConfig | None, *, steps: int,
                  eval_every: int, batch_size: int, learning_rate: float, warmup_frac: float = 0.1,
                  grad_clip: float = 1.0) -> Callable:
  """`finetune(key, base_params, tables, probes) -> (deltas [E, V, N, T], loss [steps])`.

  Finetunes the base on the domain mix (full when `lora` is None, else LoRA adapters), and after every
  `eval_every` steps scores the probe versions: Eq. (1) with `dissect.token_logprob_change` (LoRA merged).
  One program: `make_finetune_chunks`' pieces with a single chunk of every evaluation.

  Args:
    spec: the grammar.
    config: the Llama (`model_config`).
    lora: adapters (`lora_config` / `method_lora`), or None for full finetuning.
    steps: finetuning steps; a multiple of `eval_every`.
    eval_every: steps between probe evaluations (E = steps / eval_every evaluations).
    batch_size: domain documents per step.
    learning_rate, warmup_frac, grad_clip: as in `make_optimizer`.

  Args (of the returned function):
    key: PRNG key (adapter init, data stream).
    base_params: the pretrained model.
    tables: the world's facts (`grammar.fact_tables`).
    probes: [V, N, T] int32 probe documents, versions in `dissect.VERSIONS` order.

  Returns:
    pure `finetune(key, base_params, tables, probes)` -> (deltas [E, V, N, T] float32, losses [steps] float32);
    jittable and vmappable over seeds.

  Raises:
    ValueError: `steps` is not a multiple of `eval_every`.
  """
  init, run = make_finetune_chunks(spec, config, lora, steps=steps, eval_every=eval_every, batch_size=batch_size,
                                   learning_rate=learning_rate, warmup_frac=warmup_frac, grad_clip=grad_clip)

  def finetune(key, base_params, tables, probes):
    state = init(key, base_params)
    _, (deltas, losses) = run(state, key, base_params, tables, probes, 0, steps // eval_every)
    return deltas, losses

  return finetune


def make_probes(key: jax.Array, spec: grammar.GrammarSpec, tables: dict, num_documents: int) -> jax.Array:
  """[V, N, T] probe documents: N fresh domain documents and their versions (`dissect.VERSIONS` order).

  Args:
    key: PRNG key (the documents and the versions' other topic / style).
    spec: the grammar; the probes are drawn fully on the domain topic and style.
    tables: `grammar.fact_tables` output (true and counterfactual values).
    num_documents: N.

  Returns:
    [V, N, T] int32 ids, V = len(dissect.VERSIONS), T = spec.seq_len.
  """
  kd, kv = jax.random.split(key)
  on_domain = dataclasses.replace(spec, domain_topic_prob=1.0, domain_style_prob=1.0)
  ids = grammar.sample_documents(kd, on_domain, num_documents, tables, "domain")
  versions = grammar.probe_versions(kv, spec, ids, tables)
  return jnp.stack([versions[v] for v in dissect.VERSIONS])


def components(deltas: np.ndarray, reduction: str = "mean") -> dict[str, np.ndarray]:
  """Decomposes every (seed, evaluation) of a run.

  Args:
    deltas: [S, E, V, N, T] from `make_finetune` (vmapped over seeds).
    reduction: as in `dissect.decompose`.

  Returns:
    {'topic', 'style', 'factual', 'total': [S, E]; 'by_position': {component: [S, T] at the last evaluation}}.
  Position 0 (BOS, no prediction) is masked out.
  """
  deltas = np.asarray(deltas)
  s, e = deltas.shape[:2]
  mask = np.ones(deltas.shape[-2:], bool)
  mask[:, 0] = False
  out = {k: np.zeros((s, e)) for k in ("topic", "style", "factual", "total")}
  pos = {k: [] for k in ("topic", "style", "factual")}
  for i in range(s):
    for j in range(e):
      d = dissect.decompose({v: deltas[i, j, n] for n, v in enumerate(dissect.VERSIONS)}, mask, reduction=reduction)
      for k in out:
        out[k][i, j] = d[k]
      if j == e - 1:
        for k in pos:
          pos[k].append(d["by_position"][k])
  out["by_position"] = {k: np.stack(v) for k, v in pos.items()}
  return out


def spec_from_config(data: Any) -> grammar.GrammarSpec:
  """The GrammarSpec of `config.data`.

  Args:
    data: mapping with the GrammarSpec size fields (num_topics, ..., num_sentences) and optionally
      domain_topic_prob / domain_style_prob (default 0.8).

  Returns:
    grammar.GrammarSpec.
  """
  fields = {f: int(data[f]) for f in ("num_topics", "topic_vocab", "num_styles", "style_vocab",
                                      "num_general_subjects", "num_domain_subjects", "num_values", "num_sentences")}
  for f in ("domain_topic_prob", "domain_style_prob"):
    fields[f] = float(data.get(f, 0.8))
  return grammar.GrammarSpec(**fields)


def method_lora(method: str, lora: Any) -> lm.LoraConfig | None:
  """'full' -> None; 'lora<r>' -> `lora_config(r, ...)`.

  Args:
    method: 'full' or 'lora<rank>' (e.g. 'lora8').
    lora: mapping (e.g. `config.lora`) with alpha_over_rank and targets.

  Returns:
    lm.LoraConfig, or None for 'full'.

  Raises:
    ValueError: a method that is neither 'full' nor 'lora<digits>'.
  """
  if method == "full":
    return None
  m = method[4:] if method.startswith("lora") else ""
  if not m.isdigit():
    raise ValueError(f"unknown method {method!r}; use 'full' or 'lora<rank>' (e.g. 'lora8').")
  return lora_config(int(m), float(lora["alpha_over_rank"]), tuple(lora["targets"]))


def _pretrain_staged(config: Any, pre_spec: grammar.GrammarSpec, cfg: lm.LlamaConfig, keys: jax.Array,
                     stages: Any) -> tuple[Any, dict, np.ndarray]:
  """The pretraining of every seed as the stage 'pretrain': chunks of `config.log_every` steps (one vmapped program
  each); its state is the TrainState [S] with the losses so far, so a resumed stage ends as an uninterrupted one."""
  from iclr24_jax.common import loop
  steps = int(config.pretrain.steps)
  init, run = make_pretrain_chunks(pre_spec, cfg, steps=steps, batch_size=int(config.pretrain.batch_size),
                                   learning_rate=float(config.pretrain.learning_rate),
                                   init_scale=float(config.pretrain.get("init_scale", 1.0)))
  state0, tables = jax.jit(jax.vmap(init))(keys)   # the tables are a function of the keys: rebuilt on resume
  calls = {}

  def call(carry, start, n):
    if n not in calls:
      def chunk(carry, keys, tables, start):
        st, losses = jax.vmap(lambda s, k, t: run(s, k, t, start, n))(carry["state"], keys, tables)
        return {"state": st, "losses": jax.lax.dynamic_update_slice_in_dim(carry["losses"], losses, start, 1)}
      calls[n] = jax.jit(chunk)
    return calls[n](carry, keys, tables, jnp.int32(start))

  every = _chunk_size(config, "log_every", steps)
  with loop.stage_loop(stages, "pretrain", steps) as lp:
    carry, rs = lp.start(lambda: {"state": state0, "losses": jnp.zeros((keys.shape[0], steps), jnp.float32)})
    while not lp.finished and rs.step < steps:
      n = min(every, steps - rs.step)
      t0 = time.perf_counter()
      carry = jax.block_until_ready(call(carry, rs.step, n))
      rs.extra["seconds"] = rs.extra.get("seconds", 0.0) + time.perf_counter() - t0
      losses = np.asarray(carry["losses"][:, rs.step:rs.step + n])
      lp.boundary(rs.step + n, carry, {"pretrain/loss": float(losses.mean())}, loss_key="pretrain/loss")
    lp.finish(carry)
  return carry["state"].params, tables, np.asarray(carry["losses"])


def _finetune_staged(config: Any, fn_chunks: tuple[Callable, Callable], method: str, keys: jax.Array, base: Any,
                     tables: dict, probes: jax.Array, stages: Any) -> tuple[np.ndarray, np.ndarray, float]:
  """One method's finetuning of every seed as the stage 'finetune_<method>': one evaluation chunk (`eval_every`
  steps and the probe scoring) per call; its state is the TrainState [S] with the deltas and losses so far."""
  from iclr24_jax.common import loop
  init, run = fn_chunks
  steps, eval_every = int(config.num_steps), int(config.eval_every)
  num_evals = steps // eval_every
  calls = {}

  def call(carry, start, n):
    if n not in calls:
      def chunk(carry, keys, base, tables, probes, start):
        st, (deltas, losses) = jax.vmap(lambda s, k, b, t, p: run(s, k, b, t, p, start, n))(
            carry["state"], keys, base, tables, probes)
        return {"state": st,
                "deltas": jax.lax.dynamic_update_slice_in_dim(carry["deltas"], deltas, start, 1),
                "losses": jax.lax.dynamic_update_slice_in_dim(carry["losses"], losses, start * eval_every, 1)}
      calls[n] = jax.jit(chunk)
    return calls[n](carry, keys, base, tables, probes, jnp.int32(start))

  def fresh():
    s = keys.shape[0]
    return {"state": jax.jit(jax.vmap(init))(keys, base),
            "deltas": jnp.zeros((s, num_evals, *probes.shape[1:]), jnp.float32),
            "losses": jnp.zeros((s, steps), jnp.float32)}

  with loop.stage_loop(stages, f"finetune_{method}", steps) as lp:
    carry, rs = lp.start(fresh)
    while not lp.finished and rs.step < steps:
      c = rs.step // eval_every
      t0 = time.perf_counter()
      carry = jax.block_until_ready(call(carry, c, 1))
      rs.extra["seconds"] = rs.extra.get("seconds", 0.0) + time.perf_counter() - t0
      comp = components(np.asarray(carry["deltas"][:, c:c + 1]))
      row = {f"{method}/{k}": float(comp[k].mean()) for k in ("topic", "style", "factual", "total")}
      row[f"{method}/loss"] = float(np.asarray(carry["losses"][:, rs.step:rs.step + eval_every]).mean())
      lp.boundary(rs.step + eval_every, carry, row, loss_key=f"{method}/loss")
    lp.finish(carry)
  return np.asarray(carry["deltas"]), np.asarray(carry["losses"]), float(rs.extra.get("seconds", 0.0))


def _chunk_size(config: Any, key: str, steps: int) -> int:
  """`config[key]` steps per compiled call (the log interval), at most `steps`; checks that the checkpoint interval
  falls on a chunk boundary (else it would never be due)."""
  n = max(1, min(int(config.get(key, 0) or steps), steps))
  every = int(config.get("checkpoint_every", 0) or 0)
  if every % n:
    raise ValueError(f"checkpoint_every ({every}) must be a multiple of {key} ({n}): saves happen at chunk "
                     f"boundaries; set --config.checkpoint_every to a multiple of {n}.")
  return n


def synthetic_study(config: Any, progress: Callable[[str], None] | None = None, stages: Any = None) -> dict:
  """Pretrains `config.num_seeds` tiny Llamas on the general mix (one vmapped program) and finetunes each with
  every method of `config.methods`; returns the components over steps.

  With `stages` (a `common.loop.Stages`), pretraining and each method's finetuning are resumable stages
  ('pretrain', 'finetune_<method>') in chunks of `log_every` / `eval_every` steps that save every
  `checkpoint_every` steps and on SIGTERM / SIGINT; a finished stage restores without training. Without, each is
  one compiled program (the chunks compose to the same steps).

  Args:
    config: a configs/finetune_dissect.py ConfigDict (data, model, pretrain, optimizer, lora, methods, num_seeds,
      num_steps, eval_every, seed; log_every and checkpoint_every with `stages`).
    progress: called with one line of text after pretraining and after each method; None for silence.
    stages: `common.loop.Stages` (where the stages save), or None (nothing saved).

  Returns:
    dict(steps [E], pretrain_loss [S, P], base_fit {'per_token' and `FIT_SLOTS`: [S] the base's loss on fresh
    documents}, entropy (`grammar.general_entropy` of the study's grammar), methods: {method: dict(topic, style,
    factual, total [S, E], by_position {component: [S, T]}, loss [S, steps], seconds)}, spec, model_config).

  Raises:
    ValueError: with `stages`, a checkpoint_every that is no multiple of log_every and eval_every.
    common.loop.Preempted: SIGTERM / SIGINT stopped a stage (its checkpoint is saved).
  """
  spec = spec_from_config(config.data)
  pre_spec = pretrain_spec(spec, config.pretrain)
  cfg = model_config(spec, config.model, max_seq_len=max(64, pre_spec.seq_len))
  seeds = int(config.num_seeds)
  root = jax.random.key(int(config.seed))
  key_pre, key_probe, key_ft = jax.random.split(root, 3)
  key_fit = jax.random.fold_in(key_probe, 1)
  if stages is not None:
    _chunk_size(config, "eval_every", int(config.num_steps))
  t0 = time.time()
  if stages is None:
    pre = jax.jit(jax.vmap(make_pretrain(pre_spec, cfg, steps=int(config.pretrain.steps),
                                         batch_size=int(config.pretrain.batch_size),
                                         learning_rate=float(config.pretrain.learning_rate),
                                         init_scale=float(config.pretrain.get("init_scale", 1.0)))))
    base, tables, pre_loss = jax.block_until_ready(pre(jax.random.split(key_pre, seeds)))
  else:
    base, tables, pre_loss = _pretrain_staged(config, pre_spec, cfg, jax.random.split(key_pre, seeds), stages)
  # The base's fit on fresh documents of the study's grammar (the fact tables are the same in both specs).
  num_fit = int(config.data.get("num_fit_documents", 512))
  fit = jax.jit(jax.vmap(lambda p, tb, k: base_fit(p, cfg, spec, tb, k, num_fit)))
  fit = {k: np.asarray(v) for k, v in fit(base, tables, jax.random.split(key_fit, seeds)).items()}
  if progress:
    progress(f"pretrained {seeds} seeds in {time.time() - t0:.1f}s: fresh-document loss {fit['per_token'].round(4)} "
             f"(grammar entropy {grammar.general_entropy(spec)['per_token']:.4f}), later topic words "
             f"{fit['later_topic'].round(3)} (ln V_t = {np.log(spec.topic_vocab):.3f})")
  probes = jax.vmap(lambda k, tb: make_probes(k, spec, tb, int(config.data.num_probe_documents)))(
      jax.random.split(key_probe, seeds), tables)
  opt = config.optimizer
  out = {"steps": np.arange(1, int(config.num_steps) // int(config.eval_every) + 1) * int(config.eval_every),
         "pretrain_loss": np.asarray(pre_loss), "base_fit": fit, "entropy": grammar.general_entropy(spec),
         "methods": {}, "spec": spec, "model_config": cfg}
  for method in config.methods:
    t0 = time.time()
    sizes = dict(steps=int(config.num_steps), eval_every=int(config.eval_every), batch_size=int(opt.batch_size),
                 learning_rate=float(opt.learning_rate), warmup_frac=float(opt.warmup_frac),
                 grad_clip=float(opt.grad_clip))
    lora = method_lora(method, config.lora)
    # Same finetuning data stream and probes for every method (paired by seed).
    keys = jax.random.split(key_ft, seeds)
    if stages is None:
      fn = jax.jit(jax.vmap(make_finetune(spec, cfg, lora, **sizes)))
      deltas, loss = jax.block_until_ready(fn(keys, base, tables, probes))
      seconds = time.time() - t0
    else:
      deltas, loss, seconds = _finetune_staged(config, make_finetune_chunks(spec, cfg, lora, **sizes), method, keys,
                                               base, tables, probes, stages)
    comp = components(np.asarray(deltas))
    comp["loss"] = np.asarray(loss)
    comp["seconds"] = seconds
    out["methods"][method] = comp
    if progress:
      progress(f"{method}: {comp['seconds']:.1f}s; final topic {comp['topic'][:, -1].round(3)} style "
               f"{comp['style'][:, -1].round(3)} factual {comp['factual'][:, -1].round(3)}")
  return out


def claims(study: dict) -> dict:
  """Per-seed numbers behind the paper's claims (judged in `study.reproduce` with `common.stats`).

  Args:
    study: `synthetic_study` output (steps [E]; per method topic / style / factual [S, E] and by_position [S, T]).

  Returns:
    {method: {half_{topic,style,factual}: [S] steps to half the final value, early_{...}: [S] share of |c_t| in
    the first 25% of positions, final_{...}: [S] final values, final_total: [S] the originals' final change}}.
  """
  res = {}
  steps = study["steps"]
  for method, comp in study["methods"].items():
    r = {}
    for k in ("topic", "style", "factual"):
      vals = comp[k]
      r[f"half_{k}"] = np.array([dissect.half_time(steps, v) for v in vals])
      r[f"early_{k}"] = np.array([dissect.early_share(c[1:]) for c in comp["by_position"][k]])
      r[f"final_{k}"] = vals[:, -1]
    r["final_total"] = comp["total"][:, -1]
    res[method] = r
  return res
