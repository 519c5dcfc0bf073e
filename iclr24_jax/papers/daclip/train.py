"""DA-CLIP training stages 0 and 1 at CPU scale: the digit data, stage-0 CLIP, the DA-CLIP controller, embeddings.

`load_data` (degraded digit pairs), `train_scan` (a chunked, compiled training loop: `log_every` steps per
`lax.scan`), `train_clip` (stage 0 on clean digits and captions), `text_tables`, `train_controller` (stage 1),
`embed` (content / degradation embeddings e_c, e_d of LQ images) and `degradation_accuracy` (zero-shot type
and content accuracy). Stage 2, the IR-SDE restoration pipeline, is in `restoration.py`; `experiment.run` chains
them; the reproduction study and the benchmark are in `study.py`.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_lib
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.daclip import degradations as deg
from iclr24_jax.papers.daclip import model as model_lib
from iclr24_jax.vision import clip

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def digit_captions(labels) -> list[str]:
  """Clean-content captions of digits: 'a handwritten digit seven'."""
  return [f"a handwritten digit {DIGIT_WORDS[int(k)]}" for k in labels]


# ----------------------------------------------------------------------------------------------------------------
# A chunked, compiled training loop over steps (batches drawn on device from arrays passed as arguments)
# ----------------------------------------------------------------------------------------------------------------


def chunk_runner(step_fn: Callable, sample_fn: Callable, key: jax.Array, scan: bool | None = None) -> Callable:
  """run_chunk(state, data, start, n) -> (state, mean metrics): n steps, step i keyed by fold_in(key, start + i).

  Args:
    step_fn: step(state, batch, key) -> (state, metrics).
    sample_fn: sample(data, key) -> batch (drawn on device from the arrays in `data`).
    key: the stream's key; step i uses fold_in(key, i).
    scan: True runs the n steps as one jitted loop; False as a host loop of one jitted step (`common.loop.repeat_step`;
      not donated: a state may hold arrays forwarded from the caller, e.g. frozen CLIP weights). None = False on CPU
      (`common.loop.loop_grads_are_slow`: XLA:CPU runs the conv
      backward passes of these ViT / UNet steps 8-20x slower inside a loop), True on accelerators.

  Returns:
    run_chunk(state, data, start, n).
  """
  def one(state, i, data):
    k = jax.random.fold_in(key, i)
    return step_fn(state, sample_fn(data, k), k)

  runner = loop_lib.repeat_step(one, loop=scan)
  return lambda state, data, start, n: runner(state, start, n, data)


def train_scan(step_fn: Callable | None, sample_fn: Callable | None, state: Any, data: Any, key: jax.Array,
               num_steps: int, chunk: int, writer: metrics_lib.MetricWriter | None = None, prefix: str = "train",
               progress: bool = True, runner: Callable | None = None,
               on_chunk: Callable[[Any, int], dict] | None = None,
               lp: loop_lib.ResumableLoop | None = None) -> tuple[Any, list[dict]]:
  """Runs `num_steps` of state, metrics = step_fn(state, sample_fn(data, k), k) in chunks of `chunk` steps
  (`chunk_runner`: a jitted lax.scan per chunk on accelerators, a host loop of one jitted step on CPU).

  Args:
    step_fn: pure train step (state, batch, key) -> (state, metrics).
    sample_fn: (data, key) -> batch (on device; data is a pytree of arrays).
    state: initial state (any pytree, e.g. a vmapped TrainState).
    data: arrays the batches are drawn from (passed as arguments, not baked into the program).
    key: PRNG key; step i uses fold_in(key, i).
    num_steps: steps in total; chunk: steps per compiled call (the last chunk may be shorter: one more compile).
    writer: optional MetricWriter; the mean metrics of each chunk are written at its last step.
    prefix: metric-name prefix.
    runner: a prebuilt `chunk_runner` (reuse one compiled program across several runs of the same shapes).
    on_chunk: optional on_chunk(state, steps_done) -> dict of floats, called after every chunk (e.g. a held-out
      evaluation); its entries join the chunk's logged row (prefixed).
    lp: an entered `common.loop.ResumableLoop` (a stage of `loop.Stages`): the loop starts from its latest
      checkpoint (a finished stage returns its saved state and rows without training), logs each chunk's row to
      it instead of `writer` / the progress line, saves at chunk ends when due, and saves the final state. The
      steps are keyed by the step index and the data are arguments, so a resumed stage draws what an
      uninterrupted one does. None: nothing is saved (the studies' path).

  Returns:
    (final state, list of logged rows: with `lp`, every row of the stage over all its resumes).

  Raises:
    common.loop.Preempted: with `lp`, SIGTERM / SIGINT stopped the loop (its checkpoint is saved).
  """

  done, rows = 0, []
  if lp is not None:
    initial = state
    state, run = lp.start(lambda: initial, target=initial)
    if lp.finished:
      return state, list(run.history)
    done, rows = run.step, run.history        # RunLog appends each boundary's row to run.history
  run_chunk = runner if runner is not None else chunk_runner(step_fn, sample_fn, key)
  prog = metrics_lib.Progress(num_steps, name=prefix, enabled=progress and lp is None)
  while done < num_steps:
    n = min(chunk, num_steps - done)
    state, m = run_chunk(state, data, done, n)
    done += n
    row = loop_lib.prefix_keys({k: float(np.mean(v)) for k, v in jax.device_get(m).items()}, prefix)
    if on_chunk is not None:
      row.update(loop_lib.prefix_keys({k: float(v) for k, v in on_chunk(state, done).items()}, prefix))
    if lp is not None:
      lp.boundary(done, state, row, loss_key=f"{prefix}/loss")
      continue
    rows.append({"step": done, **row})
    if writer is not None:
      writer.write(done, row)
    prog.update(done, row.get(f"{prefix}/loss"))
  if lp is not None:
    lp.finish(state)
  return state, list(rows)


def stage(stages: loop_lib.Stages | None, name: str, num_steps: int):
  """The `ResumableLoop` of stage `name` in `stages` (a context manager), or a null context when `stages` is None.

  Args:
    stages: where the stages save (None: nothing saved, `train_scan` runs without a loop).
    name: the stage's folder under `stages.workdir`.
    num_steps: the stage's steps.

  Returns:
    a context manager yielding the ResumableLoop, or None.
  """
  return contextlib.nullcontext() if stages is None else stages.loop(name, int(num_steps))


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def load_data(cfg: Any) -> dict:
  """Clean digits split into train / test (fixed shuffle by cfg.seed), the degraded train suite (uniform types)
  and a balanced test suite (test_per_type images of each type, distinct clean images)."""
  x, y = deg.load_clean_digits(int(cfg.data.image_size), cfg.data.name)
  order = np.random.default_rng(1234).permutation(len(x))
  x, y = x[order], y[order]
  n_train, n_test = int(cfg.data.num_train), int(cfg.data.num_test)
  n_types = len(deg.DEGRADATIONS)
  per_type = int(cfg.data.test_per_type)
  if n_train + n_test > len(x) or n_types * per_type > n_test:
    raise ValueError(f"data: num_train={n_train} + num_test={n_test} must fit {len(x)} images and num_test >= "
                     f"{n_types} x test_per_type={per_type}.")
  x_tr, y_tr = x[:n_train], y[:n_train]
  x_te, y_te = x[n_train:n_train + n_types * per_type], y[n_train:n_train + n_types * per_type]
  train = deg.make_suite(x_tr, seed=int(cfg.seed) * 1000 + 1, copies=int(cfg.data.train_copies))
  train["label"] = y_tr[train["index"]]
  test = deg.make_suite(x_te, seed=int(cfg.seed) * 1000 + 2, types=np.repeat(np.arange(n_types), per_type))
  test["label"] = y_te[test["index"]]
  return {"clean_x": x_tr, "clean_y": y_tr, "train": train, "test": test}


# ----------------------------------------------------------------------------------------------------------------
# Stage 0: CLIP on clean digits; stage 1: the controller
# ----------------------------------------------------------------------------------------------------------------


def train_clip(cfg: Any, data: dict, key: jax.Array, writer=None, progress=True,
               stages: loop_lib.Stages | None = None) -> tuple[clip.CLIP, Any, Any]:
  """Stage 0: a small CLIP (ViT image tower, transformer text tower) on clean digits with captions.

  Args:
    cfg: the daclip ConfigDict (clip: model, optimizer, num_steps, batch_size; log_every).
    data: `load_data` output (clean_x [N, H, W, 1] in [0, 1], clean_y [N] digit labels).
    key: PRNG key.
    writer: optional MetricWriter for the loss curve (without `stages`).
    progress: print progress lines.
    stages: where the stage 'clip' saves and resumes (`train_scan`'s lp); None: nothing saved.

  Returns:
    (clip model, trained params, tokenizer).

  Raises:
    common.loop.Preempted: SIGTERM / SIGINT stopped the stage (its checkpoint is saved).
  """
  names = list(deg.DEGRADATIONS)
  tok = clip.WordTokenizer.build(digit_captions(range(10)) + names)
  model = clip.create_clip(cfg.clip.model, tok.vocab_size)
  max_len = int(cfg.clip.model.text.max_len)
  cap_ids = jnp.asarray(tok.encode(digit_captions(range(10)), max_len))            # [10, L]
  steps = int(cfg.clip.num_steps)
  tx = clip.make_optimizer(cfg.clip.optimizer, steps)
  shape = data["clean_x"].shape[1:]
  state = jax.jit(lambda k: clip.init(k, model, shape, (max_len,), jnp.int32, tx))(key)
  bs = int(cfg.clip.batch_size)

  def sample(d, k):
    idx = jax.random.randint(k, (bs,), 0, d["x"].shape[0])
    return {"image": d["x"][idx], "text": cap_ids[d["y"][idx]]}

  arrays = {"x": jnp.asarray(data["clean_x"]), "y": jnp.asarray(data["clean_y"])}
  with stage(stages, "clip", steps) as lp:
    state, _ = train_scan(clip.make_train_step(model), sample, state, arrays, jax.random.fold_in(key, 1), steps,
                          max(1, int(cfg.log_every)), writer, "clip", progress, lp=lp)
  return model, state.params, tok


def text_tables(clip_model: clip.CLIP, clip_params: Any, tok: clip.WordTokenizer, max_len: int) -> tuple:
  """Frozen unit-norm text embeddings of the 10 digit captions [10, D] and the degradation names [K, D].

  Args:
    clip_model: the trained CLIP.
    clip_params: its params.
    tok: its WordTokenizer.
    max_len: token length of the text tower.

  Returns:
    (caption embeddings [10, D], degradation-name embeddings [K, D]) as jax arrays.
  """
  cap = clip.encode_texts(clip_model, clip_params, tok.encode(digit_captions(range(10)), max_len))
  names = clip.encode_texts(clip_model, clip_params, tok.encode(list(deg.DEGRADATIONS), max_len))
  return jnp.asarray(cap), jnp.asarray(names)


def train_controller(cfg: Any, clip_model: clip.CLIP, clip_params: Any, data: dict, cap_emb, name_emb,
                     key: jax.Array, writer=None, progress=True, stages: loop_lib.Stages | None = None,
                     name: str = "controller") -> tuple[model_lib.DaClip, Any]:
  """Stage 1: the DA-CLIP controller on the degraded train suite (the CLIP weights stay frozen).

  Args:
    cfg: the daclip ConfigDict (controller: optimizer, num_steps, batch_size; log_every).
    clip_model: the trained CLIP (ViT image tower).
    clip_params: its params.
    data: `load_data` output; data['train'] holds lq [N, H, W, 1], label [N] (digit), type [N] (degradation).
    cap_emb: [10, D] caption embeddings (`text_tables`).
    name_emb: [K, D] degradation-name embeddings.
    key: PRNG key.
    writer: optional MetricWriter (without `stages`).
    progress: print progress lines.
    stages: where the stage `name` saves and resumes (`train_scan`'s lp); None: nothing saved.
    name: the stage's folder and the logged rows' prefix.

  Returns:
    (DaClip module, trained DaClip params).

  Raises:
    common.loop.Preempted: SIGTERM / SIGINT stopped the stage (its checkpoint is saved).
  """
  dac = model_lib.daclip_from_clip(clip_model)
  params = model_lib.init_daclip_params(dac, clip_params, data["train"]["lq"].shape[1:])
  steps = int(cfg.controller.num_steps)
  state = TrainState.create(params, model_lib.make_controller_optimizer(cfg.controller.optimizer, steps, params))
  bs = int(cfg.controller.batch_size)

  def sample(d, k):
    idx = jax.random.randint(k, (bs,), 0, d["lq"].shape[0])
    return {"image": d["lq"][idx], "caption_emb": cap_emb[d["label"][idx]],
            "degradation_emb": name_emb[d["type"][idx]]}

  tr = data["train"]
  arrays = {k: jnp.asarray(tr[k]) for k in ("lq", "label", "type")}
  with stage(stages, name, steps) as lp:
    state, _ = train_scan(model_lib.make_controller_train_step(dac), sample, state, arrays, key, steps,
                          max(1, int(cfg.log_every)), writer, name, progress, lp=lp)
  return dac, state.params


@functools.lru_cache(maxsize=8)   # one jitted function per static value: jit caches by function identity
def _embed_fn(dac: model_lib.DaClip):
  return jax.jit(lambda p, x: dac.apply({"params": p}, x) + (dac.apply({"params": p}, x, method="encode_frozen"),))


def embed(dac: model_lib.DaClip, params: Any, images: np.ndarray, batch_size: int = 512) -> dict[str, np.ndarray]:
  """e_c, e_d (DA-CLIP) and the frozen encoder's embedding e_frozen, each [N, D] unnormalised, in fixed batches.

  Args:
    dac: the DaClip module.
    params: its params.
    images: [N, H, W, C] float32 in [0, 1].
    batch_size: rows per compiled call (the last batch is zero-padded when N > batch_size).

  Returns:
    {'e_c', 'e_d', 'e_frozen'}: numpy [N, D] each.
  """
  fn = _embed_fn(dac)
  outs = {"e_c": [], "e_d": [], "e_frozen": []}
  n = len(images)
  for s in range(0, n, batch_size):
    xb = np.asarray(images[s:s + batch_size])
    pad = batch_size - len(xb) if n > batch_size else 0
    if pad:
      xb = np.concatenate([xb, np.zeros((pad,) + xb.shape[1:], xb.dtype)])
    e_c, e_d, e_f = jax.device_get(fn(params, jnp.asarray(xb)))
    for k, v in zip(("e_c", "e_d", "e_frozen"), (e_c, e_d, e_f)):
      outs[k].append(np.asarray(v)[:len(xb) - pad])
  return {k: np.concatenate(v) for k, v in outs.items()}


def degradation_accuracy(emb_test: dict, test: dict, name_emb, cap_emb) -> dict:
  """Per-item zero-shot correctness [N_test] of: e_d (nearest degradation name), the frozen encoder (nearest
  degradation name), and digit (content) zero-shot from e_c vs the frozen encoder on the degraded test images.
  The supervised reference on the frozen features is `linear_probe`.

  Args:
    emb_test: `embed` output of the test suite.
    test: the test suite (type, label [N_test]).
    name_emb: [K, D] degradation-name embeddings.
    cap_emb: [10, D] caption embeddings.

  Returns:
    {'ed_zero_shot', 'frozen_zero_shot', 'content_ec', 'content_frozen'}: float [N_test] 0/1 arrays.
  """
  name_emb, cap_emb = np.asarray(name_emb), np.asarray(cap_emb)
  return {"ed_zero_shot": (np.argmax(_unit(emb_test["e_d"]) @ name_emb.T, 1) == test["type"]).astype(float),
          "frozen_zero_shot": (np.argmax(_unit(emb_test["e_frozen"]) @ name_emb.T, 1) == test["type"]).astype(float),
          "content_ec": (np.argmax(_unit(emb_test["e_c"]) @ cap_emb.T, 1) == test["label"]).astype(float),
          "content_frozen": (np.argmax(_unit(emb_test["e_frozen"]) @ cap_emb.T, 1) == test["label"]).astype(float)}


def _unit(v: np.ndarray) -> np.ndarray:
  return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


PROBE_CS = (1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3, 1e4)


def linear_probe(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                 cs=PROBE_CS, folds: int = 5, seed: int = 0) -> tuple[np.ndarray, dict]:
  """A supervised linear probe (multinomial logistic regression) on fixed features, its L2 strength chosen by
  stratified k-fold cross-validation on the training set only.

  Features are unit-normalised (CLIP's cosine geometry) and then standardised with the training set's mean and
  std, so one grid of C serves any embedding scale. The probe is the fair reference for "e_d classifies the
  degradation": how well the frozen encoder's features already separate the types when a classifier is trained
  on them with labels, at its best regularisation.

  Args:
    x_train: [N, D] training features; y_train: [N] int labels.
    x_test: [M, D] test features; y_test: [M] int labels.
    cs: inverse regularisation strengths to choose from.
    folds: cross-validation folds.
    seed: fold shuffling seed.

  Returns:
    (correct [M] float 0/1, {'C': chosen C, 'cv_accuracy': its mean cross-validated accuracy}).
  """
  from sklearn.linear_model import LogisticRegression
  from sklearn.model_selection import StratifiedKFold, cross_val_score
  import threadpoolctl
  xtr, xte = _unit(np.asarray(x_train, np.float64)), _unit(np.asarray(x_test, np.float64))
  mean, std = xtr.mean(0), xtr.std(0) + 1e-12
  xtr, xte = (xtr - mean) / std, (xte - mean) / std
  y_train = np.asarray(y_train)
  folds_ = StratifiedKFold(folds, shuffle=True, random_state=seed)
  # One BLAS thread: these fits are small (N x 64), and a multi-threaded BLAS beside JAX's threads on a busy CPU
  # spent ~80x the CPU time of one thread (measured: 1.9 vs 0.02 CPU-s a fit).
  with threadpoolctl.threadpool_limits(limits=1):
    cv = [float(cross_val_score(LogisticRegression(C=c, max_iter=5000), xtr, y_train, cv=folds_).mean())
          for c in cs]
    best = int(np.argmax(cv))                                  # the first (strongest regularisation) of any tie
    probe = LogisticRegression(C=cs[best], max_iter=5000).fit(xtr, y_train)
  c, cv_acc = float(cs[best]), cv[best]
  return (probe.predict(xte) == np.asarray(y_test)).astype(float), {"C": c, "cv_accuracy": cv_acc}
