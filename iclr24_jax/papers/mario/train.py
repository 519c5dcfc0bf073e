"""MaRio end to end on the host: SFT on silver rationales, Quark rounds (sample, score, bin, train), evaluation.

Everything that runs on the device is one of three compiled programs with fixed shapes: the SFT step, the Quark
step ([batch, max_len] rows) and the sampler ([batch, prompt_width + K] prompts, `max_new_tokens`), so a run
compiles each once (plus one greedy sampler for evaluation and the scorers' `choice_logprobs` programs).

  models = mario.train.load_models(config)               # policy base, tokenizer, scorer
  out = mario.train.train_mario(config, models, train_items)   # {'sft': state, 'mario': state, 'history': ...}
  ev = mario.train.evaluate(models, config, out['mario'], test_items, bins=models.codes.best())
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import textdata
from iclr24_jax.lm import llama, lora, tokenizer as tok_lib, train as lm_train
from iclr24_jax.papers.mario import control, quark, rewards as rewards_lib

CHOICES = {"strategyqa": ("yes", "no"), "quarel": ("(A)", "(B)"), "obqa": ("(A)", "(B)", "(C)", "(D)")}


@dataclasses.dataclass
class Models:
  """The frozen base LM (policy init, KL reference and reward scorer), its tokenizer and the code book."""
  params: Any
  config: llama.LlamaConfig
  tokenizer: tok_lib.Tokenizer
  codes: control.ControlCodes
  lora_config: lora.LoraConfig
  scorer_params: Any = None        # fused base params for the reward LMs
  cache: dict = dataclasses.field(default_factory=dict)


def load_items(dataset: str, split: str, data_dir: str | None = None, limit: int = 0, silver_only: bool = False,
               seed: int = 0) -> list[dict]:
  """MaRio items (question, rationale, answer); `limit` > 0 keeps a seeded random subset (order kept).

  Args:
    dataset: 'strategyqa', 'quarel' or 'obqa'.
    split: 'train', 'dev' or 'test'.
    data_dir: the shared data folder; None or '' resolves it (`common.data.shared_data_dir`, env ICLR24_DATA).
    limit: keep this many items (0: all).
    silver_only: keep only items with a real (silver) rationale.
    seed: seed of the subset.

  Returns:
    list of item dicts (question, rationale, answer, ...), in file order.

  Raises:
    FileNotFoundError: the data is missing (the message names the path and the fix).
  """
  items = textdata.load_mario(dataset, split, data_dir=data_dir or None)
  if silver_only:
    items = [it for it in items if it.get("has_rationale", it["rationale"] != "dummy")]
  if limit and limit < len(items):
    keep = np.sort(np.random.default_rng(seed).choice(len(items), size=limit, replace=False))
    items = [items[i] for i in keep]
  return items


def short_items(models: Models, items: Sequence[dict], max_tokens: int) -> list[dict]:
  """The items whose silver response (+ end token) fits in `max_tokens` tokens (0: all).

  # Deviation: the SFT / expert data keep only short silver rationales so that sampled responses reach
  # "So the answer is" within the decoding budget (a response cut before it is invalid).

  Args:
    models: the loaded models (its tokenizer counts the tokens).
    items: MaRio items (`load_items`).
    max_tokens: the most response tokens (formatted silver response + end token); 0 keeps every item.

  Returns:
    list of the items that fit, in order.
  """
  if not max_tokens:
    return list(items)
  tok = models.tokenizer
  return [it for it in items
          if len(tok.encode(" " + rewards_lib.format_response(it["rationale"], it["answer"]), add_bos=False)) + 1
          <= max_tokens]


def tiny_models(config: Any, texts: Sequence[str]) -> Models:
  """A random tiny Llama with a BPE trained on `texts` (the 'tiny' config: seconds on CPU).

  Args:
    config: a configs/mario.py ConfigDict (model.vocab_size, lora_rank / lora_alpha / lora_targets, rewards,
      num_bins, seed).
    texts: training texts for the BPE (questions + rationales).

  Returns:
    Models (random params, the BPE tokenizer with <|im_end|> as EOS, control codes, LoRA config).
  """
  tok = tok_lib.train_bpe(list(texts) + ["<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"],
                          vocab_size=int(config.model.vocab_size),
                          special_tokens=tok_lib.TRAIN_SPECIALS + ("<|im_start|>", "<|im_end|>"))
  # SmolLM2's convention: a response ends with <|im_end|>.
  tok = dataclasses.replace(tok, eos_id=tok.backend.token_to_id("<|im_end|>"))
  mcfg = llama.tiny_config(vocab_size=tok.vocab_size, max_seq_len=512)
  params = llama.init_params(jax.random.key(int(config.seed)), mcfg)
  return _models(config, params, mcfg, tok)


def _models(config, params, mcfg, tok) -> Models:
  codes = control.ControlCodes.from_tokenizer(tok, tuple(config.rewards), int(config.num_bins), accuracy=True)
  lc = lora.LoraConfig(rank=int(config.model.lora_rank), alpha=float(config.model.lora_alpha),
                       targets=tuple(config.model.lora_targets))
  return Models(params=params, config=mcfg, tokenizer=tok, codes=codes, lora_config=lc,
                scorer_params=llama.fuse_params(params))


def load_models(config: Any, texts: Sequence[str] = ()) -> Models:
  """SmolLM2-135M-Instruct (config.model.name 'smollm2') or the tiny random model ('tiny').

  Args:
    config: a configs/mario.py ConfigDict.
    texts: BPE training texts (used by 'tiny' only).

  Returns:
    Models.

  Raises:
    ValueError: an unknown config.model.name.
  """
  if config.model.name == "tiny":
    return tiny_models(config, texts)
  if config.model.name != "smollm2":
    raise ValueError(f"unknown model.name {config.model.name!r}; choose 'smollm2' or 'tiny'.")
  from iclr24_jax.lm import weights
  params, mcfg, tok = weights.load_smollm2()
  return _models(config, params, mcfg, tok)


def init(key: jax.Array, models: Models, config: Any, base: Any = None):
  """LoRA TrainState on `base` (default the pretrained model); B = 0, so the policy starts as the base, and the
  base is also the frozen KL reference.

  Args:
    key: PRNG key of the adapter init.
    models: the loaded models (params, LoRA config).
    config: a configs/mario.py ConfigDict (optimizer.learning_rate, optimizer.max_grad_norm).
    base: host params to put the adapters on (e.g. the merged SFT model); None = models.params.

  Returns:
    TrainState: params = LoRA adapters, extra['base'] = the frozen base; optimizer clip -> Adam.
  """
  tx = optax.chain(optax.clip_by_global_norm(float(config.optimizer.max_grad_norm)),
                   optax.adam(float(config.optimizer.learning_rate)))
  base = models.params if base is None else base
  init_fn = jax.jit(lambda k: lm_train.init_train_state(lm_train.params_from_host(base), tx,
                                                        lora_config=models.lora_config, key=k))
  return init_fn(key)



def _compiled(models: Models, name: str, build: Callable[[], Callable]) -> Callable:
  if name not in models.cache:
    models.cache[name] = build()
  return models.cache[name]


def policy_params(models: Models, state) -> Any:
  """Fused parameters of the policy (base + merged adapters) for sampling.

  Args:
    models: the loaded models (LoRA config; its compiled merge is cached there).
    state: a TrainState of `init` (adapters in params, the base in extra['base']).

  Returns:
    Fused Llama params (`llama.fuse_params` layout) of base + adapters.
  """
  merge = _compiled(models, "merge", lambda: jax.jit(
      lambda base, ad: llama.fuse_params(lora.merge(base, ad, models.lora_config))))
  return merge(state.extra["base"], state.params)


def train_steps(models: Models, config: Any, state, kind: str, questions: Sequence[str], responses: Sequence[str],
                prefixes: Sequence[Sequence[int]] | None, num_steps: int, rng: np.random.Generator,
                history: list | None = None, stage: str = "", lp: Any = None) -> Any:
  """`num_steps` SFT (kind 'sft', prefixes None) or Quark steps on minibatches drawn (shuffled, without
  replacement per epoch) from the rows.

  Args:
    models: the loaded models (tokenizer; the compiled step is cached there).
    config: a configs/mario.py ConfigDict (batch_size, max_len, kl_coef, entropy_coef, log_every).
    state: TrainState of `init`.
    kind: 'sft' (KL / entropy scales 0) or 'quark'.
    questions, responses: N strings each (N >= batch_size).
    prefixes: N control-code id lists of one length K, or None (SFT rows).
    num_steps: steps to run.
    rng: numpy Generator (minibatch order and the step keys).
    history: list that logged metric rows are appended to (every log_every steps and the last), or None.
    stage: name written into the history rows.
    lp: a started `common.loop.ResumableLoop` of this stage (None: nothing saved). Its loop state's step is the
      first step to run; its `extra` holds the minibatch cursor (step-key seed, epoch order, position) and `rng`'s
      state, restored here and updated before every boundary (every config.checkpoint_every steps), where the
      stage's checkpoint of `_carry(state)` is saved when due.

  Returns:
    The TrainState after `num_steps` steps.

  Raises:
    ValueError: an unknown kind, or fewer rows than one batch.
  """
  if kind not in ("sft", "quark"):
    raise ValueError(f"kind must be 'sft' or 'quark', got {kind!r}.")
  # One compiled program for both: SFT is the Quark loss without codes and with the KL / entropy scales at 0.
  step = _compiled(models, "quark_step", lambda: jax.jit(quark.make_quark_step(
      models.config, models.lora_config, kl_coef=float(config.kl_coef), entropy_coef=float(config.entropy_coef)),
      donate_argnums=0))
  scale = np.float32(0.0 if kind == "sft" else 1.0)
  n = len(questions)
  bsz = int(config.batch_size)
  if n < bsz:
    raise ValueError(f"{n} training rows are fewer than one batch ({bsz}).")
  # Every row is encoded once (fixed width max_len), then minibatches are index slices.
  rows = quark.encode_examples(models.tokenizer, questions, responses, prefixes, max_len=int(config.max_len))
  run = lp.run if lp is not None else None
  if run is not None and "cursor" in run.extra:   # a resumed stage: the minibatch stream where it was saved
    cur = run.extra["cursor"]
    rng.bit_generator.state = _rng_state(run.extra["rng"])
    seed, order, pos = int(cur["seed"]), np.asarray(cur["order"], np.int64), int(cur["pos"])
  else:
    seed = int(rng.integers(2 ** 31))
    order, pos = rng.permutation(n), 0
  base_key = jax.random.key(seed)
  every = int(config.get("checkpoint_every", 0) or 0)
  num_steps = int(num_steps)
  for i in range(run.step if run is not None else 0, num_steps):
    if pos + bsz > n:
      order, pos = rng.permutation(n), 0
    idx = order[pos:pos + bsz]
    pos += bsz
    batch = {k: v[idx] for k, v in rows.items()}
    batch.update(kl_scale=scale, entropy_scale=scale)
    state, metrics = step(state, batch, jax.random.fold_in(base_key, i))
    if history is not None and (i % max(int(config.log_every), 1) == 0 or i == num_steps - 1):
      row = {k: float(v) for k, v in jax.device_get(metrics).items()}
      history.append({"stage": stage, "step": i, **row})
      if lp is not None:
        lp.write(i + 1, {f"{stage}/{k}": v for k, v in row.items()})
    if lp is not None and ((every and (i + 1) % every == 0) or i + 1 == num_steps):
      run.extra.update(cursor={"seed": seed, "order": [int(v) for v in order], "pos": pos},
                       rng=_rng_json(rng.bit_generator.state))
      lp.boundary(i + 1, _carry(state))
  return state


def _rng_json(state: dict) -> dict:
  """A numpy bit generator's state with its integers as strings (PCG64's are 128-bit: beyond JSON readers)."""
  return {k: _rng_json(v) if isinstance(v, dict) else (str(v) if isinstance(v, int) else v) for k, v in state.items()}


def _rng_state(saved: dict) -> dict:
  """`_rng_json` undone."""
  return {k: _rng_state(v) if isinstance(v, dict) else (int(v) if isinstance(v, str) and v.lstrip("-").isdigit()
                                                         else v) for k, v in saved.items()}


def _carry(state) -> Any:
  """What a stage saves of a LoRA TrainState: adapters, optimizer state and step, not the frozen base (a function
  of the pretrained model and the earlier stages, rebuilt on resume)."""
  return state.replace(extra=None)


def _resumed(carry, fresh) -> Any:
  """`_carry` undone: the restored adapters on the fresh state's base."""
  return carry.replace(extra=fresh.extra)


def _pool_json(pool: control.DataPool) -> dict:
  return {"questions": list(pool.questions), "responses": list(pool.responses),
          "scores": {k: [float(x) for x in v] for k, v in pool.scores.items()},
          "bins": {k: [int(x) for x in v] for k, v in pool.bins().items()}}


def _pool_load(pool: control.DataPool, saved: dict) -> None:
  """Puts a `_pool_json` pool back (its order and bins as saved: the re-binning is not redone)."""
  pool.questions, pool.responses = list(saved["questions"]), list(saved["responses"])
  pool.scores = {k: np.asarray(v, np.float64) for k, v in saved["scores"].items()}
  pool._bins = {k: np.asarray(v, np.int64) for k, v in saved["bins"].items()}


def _train_stage(stages: Any, name: str, models: Models, config: Any, fresh, kind: str, rows: Callable,
                 num_steps: int, rng: np.random.Generator, timing: dict, seconds_key: str) -> tuple[Any, list[dict]]:
  """One training stage (SFT, a Quark round or a matched-SFT round) as a resumable loop in stages.workdir/name.

  Args:
    stages: a `common.loop.Stages` (None: nothing saved).
    name: the stage's folder and the history rows' stage name.
    models, config, kind, num_steps, rng: as `train_steps`'.
    fresh: the stage's initial TrainState (also the base the restored adapters go on).
    rows: (LoopState) -> (questions, responses, prefixes) the stage trains on; called once per start, it keeps
      what is not a function of the step (a sampled pool) in the loop state's `extra`, or restores it from there.
    timing: {key: seconds}: the stage's training seconds (over every resume) go to `seconds_key`, and what
      `rows` timed into the loop state's extra['timing'] is copied in.
    seconds_key: see timing.

  Returns:
    (the TrainState after the stage, its history rows).

  Raises:
    common.loop.Preempted: SIGTERM / SIGINT stopped the stage (its checkpoint is saved).
  """
  from iclr24_jax.common import loop
  with loop.stage_loop(stages, name, num_steps) as lp:
    carry, run = lp.start(lambda: _carry(fresh))
    state = _resumed(carry, fresh) if (run.step or run.finished) else fresh
    history = run.extra.setdefault("history", [])
    questions, responses, prefixes = rows(run)
    if not run.finished:
      t0 = time.perf_counter()
      state = train_steps(models, config, state, kind, questions, responses, prefixes, num_steps, rng, history,
                          name, lp=lp)
      jax.block_until_ready(state.params)
      run.extra["seconds"] = run.extra.get("seconds", 0.0) + time.perf_counter() - t0
      lp.finish(_carry(state))
    elif "rng" in run.extra:   # a finished stage: the shared draws continue where it left them
      rng.bit_generator.state = _rng_state(run.extra["rng"])
    timing.update({k: v for k, v in run.extra.get("timing", {}).items()})
    timing[seconds_key] = float(run.extra.get("seconds", 0.0))
  return state, history


def generate(models: Models, config: Any, params: Any, questions: Sequence[str],
             bins: Mapping[str, int] | Sequence[Mapping[str, int]] | None, key: jax.Array,
             temperature: float, top_p: float = 1.0) -> list[str]:
  """Responses (text) to `questions`, conditioned on `bins` (one dict for all, a list, or None = no codes).

  Batches of config.sample_batch rows (the last padded with copies); prompts are left-padded to
  prompt_width + K so that coded and uncoded calls share one compiled program per decoding setting.

  Args:
    models: the loaded models (tokenizer, codes; compiled samplers cached there).
    config: a configs/mario.py ConfigDict (prompt_width, sample_batch, max_new_tokens).
    params: fused policy params (`policy_params`).
    questions: N questions.
    bins: {reward: bin} for every row, a list of N such dicts, or None (no codes).
    key: PRNG key (folded with each batch's start index).
    temperature: sampling temperature (0 = greedy).
    top_p: nucleus mass.

  Returns:
    N decoded responses (text after the codes, up to the end token).
  """
  k = models.codes.num_codes
  width = int(config.prompt_width)
  bsz = int(config.sample_batch)
  n_new = int(config.max_new_tokens)
  tok = models.tokenizer
  fn = _compiled(models, f"sample/{temperature}/{top_p}", lambda: jax.jit(functools.partial(
      quark.sample, config=models.config, max_new_tokens=n_new, temperature=float(temperature), top_p=float(top_p),
      stop_ids=(tok.eos_id,), pad_id=tok.pad_id)))
  if bins is None:
    prefixes = None
  elif isinstance(bins, Mapping):
    prefixes = [control.control_prefix(bins, models.codes)] * len(questions)
  else:
    prefixes = [control.control_prefix(b, models.codes) for b in bins]
  out: list[str] = []
  for start in range(0, len(questions), bsz):
    qs = list(questions[start:start + bsz])
    real = len(qs)
    qs += [qs[0]] * (bsz - real)
    if prefixes is None:
      # No codes: the prompt fills all width + K slots; its last K tokens ride in the codes' slots (the
      # concatenation is the same sequence), so coded and uncoded calls share one compiled program.
      ids, mask = quark.encode_prompts(tok, qs, width + k)
      ids, mask, codes = ids[:, :width], mask[:, :width], ids[:, width:]
    else:
      ids, mask = quark.encode_prompts(tok, qs, width)
      pre = list(prefixes[start:start + bsz])
      codes = np.asarray(pre + [pre[0]] * (bsz - real), np.int32)
      if codes.shape[1] != k:
        raise ValueError(f"expected {k} codes per row, got {codes.shape[1]}.")
    res = fn(jax.random.fold_in(key, start), params, prompt_ids=ids, prompt_mask=mask, codes=codes)
    tokens, lengths, stopped = jax.device_get((res.tokens, res.lengths, res.stopped))
    for j in range(real):
      m = int(lengths[j]) - int(bool(stopped[j]))
      out.append(tok.decode([int(t) for t in tokens[j, :m]]).strip())
  return out


def score(models: Models, config: Any, questions: Sequence[str], responses: Sequence[str],
          golds: Sequence[str]) -> dict[str, np.ndarray]:
  """Every reward of config.rewards plus accuracy ({name: [N]}), read from the frozen base LM.

  Args:
    models: the loaded models (scorer params, tokenizer).
    config: a configs/mario.py ConfigDict (data.name picks the answer choices; rewards, score_batch).
    questions, responses, golds: N strings each.

  Returns:
    {name: [N] float64} for config.rewards and 'accuracy'.
  """
  choices = CHOICES[config.data.name]
  names = tuple(config.rewards) + ("accuracy",)
  return rewards_lib.score_responses(models.scorer_params, models.config, models.tokenizer, questions, responses,
                                     golds, choices, rewards=names, batch_size=int(config.score_batch),
                                     memo=models.cache.setdefault("question_only_probs", {}))


def _is_valid(response: str) -> bool:
  return rewards_lib.ANSWER_MARKER in response


def train_mario(config: Any, models: Models, train_items: Sequence[dict], log: Callable[[str], None] = print,
                stages: Any = None) -> dict[str, Any]:
  """SFT, then config.quark_rounds rounds of (sample -> score -> pool -> re-bin -> Quark steps).

  Official (main_n_new.py): the first round samples from the reference policy (the SFT model, no codes), later
  rounds from the policy conditioned on the best codes; top-p config.top_p (the official run: 0.7) at
  config.temperature (1); only responses containing "So the answer is" enter the pool; the silver rationales
  join the pool as expert rollouts.

  Args:
    config: a configs/mario.py ConfigDict.
    models: the loaded models.
    train_items: MaRio items (question, rationale, answer) for SFT and the Quark prompts.
    log: called with one progress line per stage.
    stages: where the stages save (a `common.loop.Stages`; None: nothing saved): 'sft', then per round
      'quark<r>' (its sampled, scored and re-binned pool kept in the loop state) and 'sft_matched<r>', each
      resumable in stages.workdir/<stage>; the minibatch cursors and the numpy draws' state are saved with them,
      so a killed run resumes the uninterrupted run's stream.

  With config.sft_matched = 'pool' (or 'silver') a budget-matched SFT baseline trains beside MaRio: the SFT state
  continues with the SFT loss for the same steps as the Quark rounds, on the very pool rows each round trains on
  without their codes ('pool'), or on the silver rationales of the training questions ('silver'); its minibatch
  stream is its own, so MaRio's run is the same with and without it.

  Returns:
    {'sft': SFT state (adapters on the pretrained base), 'mario': Quark state (adapters on the merged SFT
    model), 'sft_matched': the budget-matched SFT state (None when off), 'history': [metrics rows],
    'pool': DataPool, 'timing': {stage: seconds}}.
  """
  matched = str(config.get("sft_matched", "") or "")
  if matched not in ("", "pool", "silver"):
    raise ValueError(f"config.sft_matched must be '', 'pool' or 'silver', got {matched!r}.")
  rng = np.random.default_rng(int(config.seed))
  key = jax.random.key(int(config.seed))
  key_init, key_sample = jax.random.split(key)
  questions = [it["question"] for it in train_items]
  silver = [rewards_lib.format_response(it["rationale"], it["answer"]) for it in train_items]
  golds = [it["answer"] for it in train_items]
  history: list[dict] = []
  timing: dict[str, float] = {}

  sft_state, rows = _train_stage(stages, "sft", models, config, init(key_init, models, config), "sft",
                                 lambda run: (questions, silver, None), int(config.sft_steps), rng, timing, "sft_s")
  history += rows
  log(f"[mario] SFT: {config.sft_steps} steps in {timing['sft_s']:.0f}s")
  # Quark starts from the SFT model and keeps it as the KL reference (official: --init-model and --ref-model are
  # the SFT checkpoint): the SFT adapters are merged into a new frozen base and fresh adapters train on top.
  merge = _compiled(models, "merge_plain", lambda: jax.jit(lambda b, ad: lora.merge(b, ad, models.lora_config)))
  sft_base = jax.device_get(merge(sft_state.extra["base"], sft_state.params))
  state = init(jax.random.fold_in(key_init, 1), models, config, base=sft_base)
  del sft_base

  pool = control.DataPool(models.codes)
  # A copy: the compiled step donates its state, and the SFT arm is still evaluated afterwards.
  matched_state = jax.tree.map(lambda x: jnp.array(x, copy=True), sft_state) if matched else None
  matched_rng = np.random.default_rng([int(config.seed), 1])   # its own stream: MaRio's draws are unchanged
  n_samples = int(config.samples_per_round)
  for r in range(int(config.quark_rounds)):

    def sample_round(run, r=r):
      """Round r's pool: sampled, scored and re-binned at the round's start, or as the round's checkpoint kept it."""
      if "pool" in run.extra:
        _pool_load(pool, run.extra["pool"])
        return pool.questions, pool.responses, pool.prefixes()
      t0 = time.perf_counter()
      pick = rng.choice(len(train_items), size=min(n_samples, len(train_items)), replace=False)
      qs = [questions[i] for i in pick]
      gs = [golds[i] for i in pick]
      params = policy_params(models, state)
      bins = None if r == 0 else models.codes.best()
      resp = generate(models, config, params, qs, bins, jax.random.fold_in(key_sample, r),
                      temperature=float(config.temperature), top_p=float(config.top_p))
      keep = [i for i, x in enumerate(resp) if _is_valid(x)]
      # The expert rollouts: the silver rationales of the sampled questions (scored once).
      add_q = [qs[i] for i in keep] + ([qs[i] for i in range(len(qs))] if config.expert_rollouts else [])
      add_r = [resp[i] for i in keep] + ([silver[i] for i in pick] if config.expert_rollouts else [])
      add_g = [gs[i] for i in keep] + (gs if config.expert_rollouts else [])
      t_gen = time.perf_counter() - t0
      pool.add(add_q, add_r, score(models, config, add_q, add_r, add_g))
      run.extra["pool"] = _pool_json(pool)
      run.extra["valid"] = [len(keep), len(qs)]
      run.extra["timing"] = {f"round{r}_sample_s": t_gen, f"round{r}_score_s": time.perf_counter() - t0 - t_gen}
      return pool.questions, pool.responses, pool.prefixes()

    state, rows = _train_stage(stages, f"quark{r}", models, config, state, "quark", sample_round,
                               int(config.quark_steps_per_round), rng, timing, f"round{r}_train_s")
    history += rows
    if matched:
      rows_q, rows_r = ((pool.questions, pool.responses) if matched == "pool" else (questions, silver))
      matched_state, rows = _train_stage(stages, f"sft_matched{r}", models, config, matched_state, "sft",
                                         lambda run: (rows_q, rows_r, None), int(config.quark_steps_per_round),
                                         matched_rng, timing, f"round{r}_sft_matched_s")
      history += rows
    log(f"[mario] round {r}: pool {len(pool)}; sample {timing.get(f'round{r}_sample_s', 0.0):.0f}s, "
        f"score {timing.get(f'round{r}_score_s', 0.0):.0f}s, train {timing[f'round{r}_train_s']:.0f}s")
  return {"sft": sft_state, "mario": state, "sft_matched": matched_state, "history": history, "pool": pool,
          "timing": timing}


def evaluate(models: Models, config: Any, state, items: Sequence[dict], bins: Mapping[str, int] | None,
             key: jax.Array | None = None) -> dict[str, Any]:
  """Responses to `items` and per-item rewards: greedy decoding when config.eval_temperature is 0 (the official
  live evaluation, main_n_new.py `eval_test`), else top-p sampling at that temperature.

  Args:
    models: the loaded models.
    config: a configs/mario.py ConfigDict.
    state: TrainState of the policy (`train_mario` output 'sft' or 'mario').
    items: N MaRio items (question, answer).
    bins: {reward: bin} codes for every row (e.g. models.codes.best()), or None (no codes: SFT).
    key: PRNG key of the sampler (unused when greedy); None = key(config.seed + 1000).

  Returns:
    {'responses': [N] str, 'valid': [N] bool, name: [N] float for every reward and 'accuracy'}.
  """
  key = jax.random.key(int(config.seed) + 1000) if key is None else key
  qs = [it["question"] for it in items]
  resp = generate(models, config, policy_params(models, state), qs, bins, key,
                  temperature=float(config.eval_temperature), top_p=float(config.top_p))
  out: dict[str, Any] = {"responses": resp, "valid": np.asarray([_is_valid(r) for r in resp])}
  out.update(score(models, config, qs, resp, [it["answer"] for it in items]))
  return out


def score_silver(models: Models, config: Any, items: Sequence[dict]) -> dict[str, np.ndarray]:
  """The rewards of the items' own rationales (the data set's 'rationale' field): the reference row.

  StrategyQA's train split holds GPT-3's silver rationales (the SFT targets), but its test split holds the
  human-written facts of StrategyQA (the official raw/test.jsonl; GPT-3's test rationales are a separate file,
  gpt3/test_gpt3_responses.jsonl, not in the shared data): on test items this scores the human facts.

  Args:
    models: the loaded models.
    config: a configs/mario.py ConfigDict.
    items: N MaRio items (question, rationale, answer).

  Returns:
    {name: [N] float64} for config.rewards and 'accuracy'.
  """
  resp = [rewards_lib.format_response(it["rationale"], it["answer"]) for it in items]
  return score(models, config, [it["question"] for it in items], resp, [it["answer"] for it in items])
