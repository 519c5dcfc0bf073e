"""Co-Boosting as pure functions: hard-sample synthesis, ensemble re-weighting, adversarial distillation.

One server epoch of the official `datafree_kd.py --method co_boosting` (checked line by line):
  1. synthesis (`COBOOSTSynthesizer.synthesize`): re-initialise the generator, draw z ~ N(0, I) [B, nz] and
     uniform targets y [B]; optimise (generator params, z) with Adam(lr_g, betas 0.5/0.999) for g_steps on
     L = oh * L_H + adv * L_A (hardness-weighted ensemble CE + adversarial KL at T = 3); the generator's
     gradient is clipped to norm 10 (z's is not); the batch with the lowest loss seen is kept.
  2. ensemble re-weighting (epochs > 0, before the new batch joins the pool): one pass over the pool in
     shuffled minibatches, w <- clip(w - mu * 0.99^epoch * sign(dCE(f_ens(x; w), y)/dw), 0, 1).
  3. the batch joins the pool (which only grows).
  4. distillation (`cb_kd_train`): one pass over the pool; each minibatch is moved one signed-gradient step
     of size eps = 8/255 along a random direction of the ensemble's softmax(logits / 4) (output-diversified
     sampling, ODS: the direction is random, not the one that increases the server/ensemble KL), then the
     server follows SGD(momentum 0.9, weight decay 1e-4, gradient clipped to norm 10) on
     KL(ensemble || server) at T = 4, with a per-epoch cosine learning rate.

DENSE-like baseline (the official `--method dense`): the same loop with plain CE (h = 0), the adversarial KL
masked to samples where server and ensemble disagree, fixed uniform weights and no ODS perturbation.

The BN-statistics regulariser of the official code (`--bn`, DeepInversion hooks) defaults to 0 and its hooks
are removed when it is 0; it is not implemented here (the foundation's client CNNs/MLPs have no BN layers).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import optim
from iclr24_jax.common import sharding
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.papers.coboosting import losses
from iclr24_jax.papers.coboosting.model import ClientSet, Generator, generate, init_generator
from iclr24_jax.vision.classify import apply_model

Teacher = dict  # {'clients': client params (stacked tree or tuple), 'weights': [C]}


@dataclasses.dataclass(frozen=True)
class Method:
  """Static description of a Co-Boosting (or DENSE-like) server training; hashable, used as a jit key.

  Attributes (official defaults in brackets):
    clients: the client models (never trained here).
    server: the server classifier.
    generator: the synthetic-data generator.
    num_classes: K.
    nz: latent size [256].
    hardness: h of L_H [1]; 0 = plain CE (DENSE).
    oh_weight: weight of L_H [1].
    adv_weight: weight of L_A [1].
    adv_temperature: T of L_A [3].
    adv_mask: DENSE's disagreement mask on L_A [False for Co-Boosting, True for DENSE].
    lr_g: generator/latent Adam learning rate [1e-3]; betas (0.5, 0.999).
    gen_grad_clip: max norm of the generator gradient [10].
    weighted: re-weight the ensemble [True; False = fixed uniform weights].
    mu: ensemble-weight step size [0.01], decayed by mu_decay ** epoch [0.99].
    ods: perturb pool samples before distillation [True].
    ods_eps: the perturbation size [8/255].
    ods_temperature: temperature of the ODS softmax [4].
    kd_temperature: T of the distillation KL [4].
    kd_momentum: server SGD momentum [0.9].
    kd_weight_decay: server weight decay [1e-4].
    kd_grad_clip: max norm of the server gradient [10].
  """

  clients: ClientSet
  server: nn.Module
  generator: Generator
  num_classes: int = 10
  nz: int = 256
  hardness: float = 1.0
  oh_weight: float = 1.0
  adv_weight: float = 1.0
  adv_temperature: float = 3.0
  adv_mask: bool = False
  lr_g: float = 1e-3
  gen_grad_clip: float = 10.0
  weighted: bool = True
  mu: float = 0.01
  mu_decay: float = 0.99
  ods: bool = True
  ods_eps: float = 8.0 / 255.0
  ods_temperature: float = 4.0
  kd_temperature: float = 4.0
  kd_momentum: float = 0.9
  kd_weight_decay: float = 1e-4
  kd_grad_clip: float = 10.0

  def gen_tx(self) -> optax.GradientTransformation:
    return optax.adam(self.lr_g, b1=0.5, b2=0.999)

  def server_tx(self) -> optax.GradientTransformation:
    """torch SGD(momentum, weight_decay) after grad-norm clipping; the learning rate is applied in the step.

    The same object is returned for equal settings (it is static data of the TrainState, so a fresh object
    would force a recompilation of every step).
    """
    return _server_tx(self.kd_grad_clip, self.kd_weight_decay, self.kd_momentum)


@optim.memoized_optimizer
def _server_tx(grad_clip: float, weight_decay: float, momentum: float) -> optax.GradientTransformation:
  parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip else []
  if weight_decay:
    parts.append(optax.add_decayed_weights(weight_decay))  # torch SGD adds wd * param to the gradient
  parts.append(optax.trace(decay=momentum) if momentum else optax.identity())  # torch momentum buffer
  return optax.chain(*parts)


def dense_like(method: Method) -> Method:
  """The DENSE-like baseline of the same run: plain CE, masked L_A, fixed uniform weights, no ODS."""
  return dataclasses.replace(method, hardness=0.0, adv_mask=True, weighted=False, ods=False)


# ----------------------------------------------------------------------------------------------- forward


def teacher_logits(method: Method, teacher: Teacher, x: jax.Array) -> jax.Array:
  """The weighted ensemble's logits [B, K] for inputs x [B, ...]."""
  return losses.ensemble_logits(method.clients.logits(teacher["clients"], x), teacher["weights"])


def server_logits(method: Method, params: Any, extra: Any, x: jax.Array) -> jax.Array:
  """The server's logits [B, K] in eval mode."""
  out, _ = apply_model(method.server, params, extra, x, train=False)
  return out


# ------------------------------------------------------------------------------------ ensemble weighting


def update_weights(weights: jax.Array, client_logits: jax.Array, labels: jax.Array, step_size: jax.Array | float
                   ) -> tuple[jax.Array, jax.Array]:
  """One signed-gradient step on the ensemble weights, clipped to [0, 1] (official `wa_steps` loop).

  w <- clip(w - step * sign(d CE(f_ens(x; w), y) / dw), 0, 1). The weights are not renormalised: the ensemble
  divides by their sum. (The official code also clamps w - w_start to [-1, 1], which is a no-op for weights
  in [0, 1] and step <= 1.)

  Args:
    weights: current weights [C].
    client_logits: per-client logits [C, B, K] of a pool minibatch.
    labels: the pool's synthesis targets [B].
    step_size: mu * mu_decay ** epoch.

  Returns:
    (new weights [C], the ensemble CE before the step).
  """
  def ce(w):
    return jnp.mean(losses.cross_entropy(losses.ensemble_logits(client_logits, w), labels))
  loss, grad = jax.value_and_grad(ce)(weights)
  # official: rong-dai/Co-Boosting@b95d715 datafree/synthesis/coboost.py:146-153 (weight step)
  return jnp.clip(weights - step_size * jnp.sign(grad), 0.0, 1.0), loss


def weight_step(method: Method, teacher: Teacher, batch: dict, step_size: jax.Array) -> tuple[Teacher, dict]:
  """`update_weights` on one pool minibatch {'x': [B, ...], 'y': [B]}; client params pass through unchanged."""
  cl = method.clients.logits(teacher["clients"], batch["x"])
  w, loss = update_weights(teacher["weights"], cl, batch["y"], step_size)
  return {"clients": teacher["clients"], "weights": w}, {"ensemble_ce": loss}


# ------------------------------------------------------------------------------------------ synthesis


@flax.struct.dataclass
class SynthState:
  """One epoch's synthesis: generator, latents and targets, Adam state, and the best batch so far.

  Attributes:
    params, batch_stats: generator variables (batch_stats are unused: BN runs on batch statistics).
    z: latents [B, nz] (optimised together with the generator).
    targets: target classes [B].
    opt_state: Adam state of (params, z).
    step: iterations done.
    best_loss: lowest loss seen.
    best_x: the generated batch [B, S, S, C] at that loss.
  """

  params: Any
  batch_stats: Any
  z: jax.Array
  targets: jax.Array
  opt_state: Any
  step: jax.Array
  best_loss: jax.Array
  best_x: jax.Array


def init_synthesis(key: jax.Array, method: Method, batch_size: int, image_shape: tuple[int, ...]) -> SynthState:
  """A freshly initialised generator (official `reset_model`), z ~ N(0, I) and uniform targets.

  Args:
    key: this epoch's key.
    method: the run's Method.
    batch_size: B (official synthesis_batch_size = 128).
    image_shape: (S, S, C) of the real data.
  """
  k_gen, k_z, k_y = jax.random.split(key, 3)
  variables = init_generator(k_gen, method.generator, method.nz)
  z = jax.random.normal(k_z, (batch_size, method.nz), jnp.float32)
  # The official Co-Boosting synthesizer leaves the random targets unsorted (DENSE sorts them; no effect).
  targets = jax.random.randint(k_y, (batch_size,), 0, method.num_classes)
  params = variables["params"]
  return SynthState(params=params, batch_stats=variables.get("batch_stats", {}), z=z, targets=targets,
                    opt_state=method.gen_tx().init((params, z)), step=jnp.zeros((), jnp.int32),
                    best_loss=jnp.asarray(jnp.inf, jnp.float32),
                    best_x=jnp.zeros((batch_size,) + tuple(image_shape), jnp.float32))


def knobs(method: Method) -> dict:
  """The method's numeric switches as arrays: {'hardness', 'adv_mask', 'ods_eps'}.

  Passing them to the steps as arguments (instead of reading them from the static Method) lets Co-Boosting
  and the DENSE-like baseline share one compiled program (`Compiled` does this).
  """
  return {"hardness": jnp.asarray(method.hardness, jnp.float32),
          "adv_mask": jnp.asarray(1.0 if method.adv_mask else 0.0, jnp.float32),
          "ods_eps": jnp.asarray(method.ods_eps if method.ods else 0.0, jnp.float32)}


def generator_loss(method: Method, gen_params: Any, batch_stats: Any, z: jax.Array, targets: jax.Array,
                   teacher: Teacher, server_params: Any, server_extra: Any = None, knob: dict | None = None):
  """L = oh * L_H(f_ens(G(z)), y) + adv * L_A(f_S(G(z)), f_ens(G(z))) -> (loss, (images, metrics)).

  Args:
    method: the run's Method.
    gen_params, batch_stats: generator variables.
    z: latents [B, nz].
    targets: [B].
    teacher: {'clients', 'weights'} (held fixed: only the generator and z receive gradients).
    server_params, server_extra: the server (fixed).
    knob: optional runtime {'hardness', 'adv_mask'} overriding the Method's (see `knobs`).
  """
  x = generate(method.generator, {"params": gen_params, "batch_stats": batch_stats}, z)
  t = teacher_logits(method, teacher, x)
  s = server_logits(method, server_params, server_extra, x)
  if knob is None:
    l_h = losses.hard_sample_loss(t, targets, method.hardness)
    mask = losses.disagreement_mask(s, t) if method.adv_mask else None
  else:
    l_h = losses.hard_sample_loss(t, targets, knob["hardness"])
    mask = knob["adv_mask"] * losses.disagreement_mask(s, t) + (1.0 - knob["adv_mask"])
  l_a = losses.adversarial_loss(s, t, method.adv_temperature, mask)
  # official: rong-dai/Co-Boosting@b95d715 datafree/synthesis/coboost.py:114 (bn = 0)
  loss = method.oh_weight * l_h + method.adv_weight * l_a
  metrics = {"gen_loss": loss, "hard_ce": l_h, "adv_kl": -l_a,
             "ensemble_acc_on_targets": jnp.mean((jnp.argmax(t, -1) == targets).astype(jnp.float32))}
  return loss, (x, metrics)


def _clip_tree(tree: Any, max_norm: float) -> Any:
  if not max_norm:
    return tree
  norm = optax.global_norm(tree)
  scale = jnp.minimum(1.0, max_norm / (norm + 1e-6))  # torch clip_grad_norm_ uses max_norm / (norm + 1e-6)
  return jax.tree.map(lambda g: g * scale, tree)


def synthesis_step(method: Method, state: SynthState, teacher: Teacher, server_params: Any,
                   server_extra: Any = None, knob: dict | None = None) -> tuple[SynthState, dict]:
  """One Adam step of (generator, z) on `generator_loss`; keeps the lowest-loss batch (pre-step images).

  Args:
    method: the run's Method.
    state: SynthState.
    teacher: {'clients', 'weights'}.
    server_params, server_extra: the server.
    knob: optional runtime switches (see `knobs`).

  Returns:
    (new state, metrics {'gen_loss', 'hard_ce', 'adv_kl', 'ensemble_acc_on_targets'}).
  """
  grad_fn = jax.value_and_grad(generator_loss, argnums=(1, 3), has_aux=True)
  (loss, (x, metrics)), (g_params, g_z) = grad_fn(method, state.params, state.batch_stats, state.z, state.targets,
                                                  teacher, server_params, server_extra, knob)
  g_params = _clip_tree(g_params, method.gen_grad_clip)  # official: clip_grad_norm_(generator.parameters(), 10)
  tx = method.gen_tx()
  updates, opt_state = tx.update((g_params, g_z), state.opt_state, (state.params, state.z))
  params, z = optax.apply_updates((state.params, state.z), updates)
  better = loss < state.best_loss
  new = state.replace(params=params, z=z, opt_state=opt_state, step=state.step + 1,
                      best_loss=jnp.where(better, loss, state.best_loss),
                      best_x=jnp.where(better, jax.lax.stop_gradient(x), state.best_x))
  return new, metrics


def hard_sample_synthesis(method: Method, key: jax.Array, teacher: Teacher, server_params: Any, server_extra: Any,
                          batch_size: int, image_shape: tuple[int, ...], g_steps: int
                          ) -> tuple[SynthState, dict]:
  """A whole synthesis phase as one `lax.fori_loop` (for accelerators and nesting in user code).

  On CPU prefer calling a jitted `synthesis_step` from Python (what `fit` does): XLA:CPU runs convolution
  backward passes far slower inside loop bodies.
  """
  state = init_synthesis(key, method, batch_size, image_shape)

  def body(_, carry):
    s, _m = carry
    return synthesis_step(method, s, teacher, server_params, server_extra)

  zeros = {k: jnp.zeros((), jnp.float32) for k in ("gen_loss", "hard_ce", "adv_kl", "ensemble_acc_on_targets")}
  return jax.lax.fori_loop(0, g_steps, body, (state, zeros))


# --------------------------------------------------------------------------------------- distillation


def ods_perturb(logits_fn: Callable[[jax.Array], jax.Array], x: jax.Array, key: jax.Array, eps: float,
                temperature: float = 4.0) -> jax.Array:
  """Output-diversified sampling step (official `cb_kd_train`): x + eps * sign(grad_x <r, softmax(f(x)/T)>).

  r ~ U(-1, 1)^[B, K] is a random direction in the teacher's output space, so the step spreads the pool
  samples around the ensemble's decision regions; it does not maximise the server/ensemble KL. No clipping
  to the image range (as in the official code).

  Args:
    logits_fn: x [B, ...] -> teacher logits [B, K].
    x: inputs [B, ...].
    key: randomness of r.
    eps: step size (official 8/255).
    temperature: softmax temperature (official 4).

  Returns:
    Perturbed inputs [B, ...] (no gradient flows through them).
  """
  k = jax.eval_shape(logits_fn, x).shape[-1]  # the class count only: no forward pass traced for it
  # official: rong-dai/Co-Boosting@b95d715 datafree_kd.py:313-319 (ODS)
  r = jax.random.uniform(key, (x.shape[0], k), minval=-1.0, maxval=1.0)
  g = jax.grad(lambda v: jnp.sum(r * jax.nn.softmax(logits_fn(v) / temperature, axis=-1)))(x)
  return jax.lax.stop_gradient(x + eps * jnp.sign(g))


def init(key: jax.Array, method: Method, input_shape: tuple[int, ...]) -> TrainState:
  """The server's TrainState (fresh init; tx = clip -> weight decay -> momentum, lr applied per step).

  Args:
    key: init key.
    method: the run's Method (its `server` module and `server_tx`).
    input_shape: one image's shape, e.g. (8, 8, 1).

  Returns:
    TrainState (step 0; extra = {'batch_stats': ...} when the server has batch statistics, else {}).
  """
  variables = method.server.init({"params": key}, jnp.zeros((1,) + tuple(input_shape), jnp.float32), train=False)
  extra = {"batch_stats": variables["batch_stats"]} if "batch_stats" in variables else {}
  return TrainState.create(variables["params"], method.server_tx(), extra=extra)



def distill_step(method: Method, state: TrainState, teacher: Teacher, batch: dict, key: jax.Array,
                 learning_rate: jax.Array | float, knob: dict | None = None) -> tuple[TrainState, dict]:
  """One server update on a pool minibatch: ODS perturbation (if on) then KD at T = kd_temperature.

  Args:
    method: the run's Method.
    state: server TrainState (tx from `Method.server_tx`).
    teacher: {'clients', 'weights'} (not updated).
    batch: {'x': [B, ...]} (labels, if present, are not used by the loss).
    key: the run's distillation key (folded with state.step here).
    learning_rate: this epoch's learning rate.
    knob: optional runtime {'ods_eps'} (0 = no perturbation) overriding the Method's (see `knobs`).

  Returns:
    (new state, metrics {'kd_loss', 'agreement'}).
  """
  key = jax.random.fold_in(key, state.step)
  x = batch["x"]
  if knob is not None or method.ods:
    eps = knob["ods_eps"] if knob is not None else method.ods_eps
    x = ods_perturb(functools.partial(teacher_logits, method, teacher), x, key, eps, method.ods_temperature)
  t = jax.lax.stop_gradient(teacher_logits(method, teacher, x))

  def loss_fn(params):
    s, new_extra = apply_model(method.server, params, state.extra, x, train=True, key=key)
    return losses.kd_loss(s, t, method.kd_temperature), (s, new_extra)

  (loss, (s, new_extra)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
  updates = jax.tree.map(lambda u: -learning_rate * u, updates)
  new = state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates), opt_state=opt_state,
                      extra=new_extra)
  agree = jnp.mean((jnp.argmax(s, -1) == jnp.argmax(t, -1)).astype(jnp.float32))
  return new, {"kd_loss": loss, "agreement": agree}


def cosine_lr(base_lr: float, epoch: int, epochs: int) -> float:
  """torch CosineAnnealingLR(T_max=epochs), stepped once per epoch."""
  return 0.5 * base_lr * (1.0 + math.cos(math.pi * epoch / max(epochs, 1)))


# ---------------------------------------------------------------------------------------------- driver


@dataclasses.dataclass
class FitResult:
  server: TrainState
  weights: np.ndarray          # final ensemble weights [C]
  pool_x: np.ndarray           # synthetic pool [epochs * B, S, S, C]
  pool_y: np.ndarray           # its targets [epochs * B]
  history: list[dict]          # one row per epoch (over every resume): 'step' = 'epoch' = the epoch's number
  weight_history: np.ndarray   # [epochs, C]
  seconds: float               # wall seconds in the epoch loop (over every resume)


@flax.struct.dataclass
class FitState:
  """Everything a resumed server training continues from: what is not a function of the epoch.

  The pool is a fixed-size buffer (every epoch adds one batch), so the state keeps one shape over the run and a
  checkpoint of any epoch restores into it; rows from `epoch * B` on are zeros not yet used.

  Attributes:
    server: the server TrainState (its step counts distillation steps; folded into the distillation key).
    weights: the ensemble weights [C].
    pool_x: the synthetic pool [epochs * B, S, S, C].
    pool_y: its synthesis targets [epochs * B] (int32).
  """

  server: TrainState
  weights: jax.Array
  pool_x: jax.Array
  pool_y: jax.Array


def canonical(method: Method) -> Method:
  """`method` with its runtime switches (hardness, adv_mask, ods, weighted) reset: the compilation key."""
  return dataclasses.replace(method, hardness=1.0, adv_mask=False, ods=True, ods_eps=0.0, weighted=True)


class Compiled:
  """The jitted steps of one (canonical) Method on one mesh (params replicated, batches sharded over 'data').

  The steps take the runtime switches (`knobs`) as arguments, so Co-Boosting and the DENSE-like baseline
  share these programs. Kept in a cache keyed by (canonical method, mesh, batch_size, image_shape), so seeds,
  Dirichlet alphas and baselines reuse compilations. The pool stays on device (replicated): `pool_add` writes an
  epoch's batch into the buffer, `pool_batch` gathers a minibatch of a pool array, sharded over 'data'.
  """

  def __init__(self, method: Method, mesh, batch_size: int, image_shape: tuple[int, ...]):
    method = canonical(method)
    self.method, self.mesh = method, mesh
    rep = sharding.replicated_sharding(mesh)
    dat = sharding.data_sharding(mesh)
    self.rep, self.dat = rep, dat
    synth_sh = SynthState(params=rep, batch_stats=rep, z=dat, targets=dat, opt_state=rep, step=rep, best_loss=rep,
                          best_x=dat)
    self.init_synth = jax.jit(functools.partial(init_synthesis, method=method, batch_size=batch_size,
                                                image_shape=tuple(image_shape)), out_shardings=synth_sh)
    self.synth_step = jax.jit(functools.partial(synthesis_step, method),
                              in_shardings=(synth_sh, rep, rep, rep, rep), out_shardings=(synth_sh, rep),
                              donate_argnums=(0,))
    self.weight_step = jax.jit(functools.partial(weight_step, method), in_shardings=(rep, dat, rep),
                               out_shardings=(rep, rep))
    self.distill_step = jax.jit(functools.partial(distill_step, method),
                                in_shardings=(rep, rep, dat, rep, rep, rep), out_shardings=(rep, rep),
                                donate_argnums=(0,))
    self.init = jax.jit(functools.partial(init, method=method, input_shape=tuple(image_shape)), out_shardings=rep)
    self.server_logits = jax.jit(functools.partial(server_logits, method))
    self.teacher_logits = jax.jit(functools.partial(teacher_logits, method))
    self.pool_add = jax.jit(
        lambda px, py, x, y, start: (jax.lax.dynamic_update_slice_in_dim(px, x.astype(px.dtype), start, 0),
                                     jax.lax.dynamic_update_slice_in_dim(py, y.astype(py.dtype), start, 0)),
        out_shardings=(rep, rep), donate_argnums=(0, 1))
    self.pool_batch = jax.jit(lambda buf, idx: buf[idx], out_shardings=dat)


def compiled(method: Method, mesh, batch_size: int, image_shape: tuple[int, ...]) -> Compiled:
  """Cached `Compiled` for (canonical(method), mesh, batch_size, image_shape)."""
  return _compiled(canonical(method), mesh, int(batch_size), tuple(image_shape))


@functools.lru_cache(maxsize=16)   # the compiled programs of one (method, mesh, sizes)
def _compiled(method: Method, mesh, batch_size: int, image_shape: tuple[int, ...]) -> Compiled:
  return Compiled(method, mesh, batch_size, image_shape)


def _batches(n: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
  """Shuffled fixed-size index batches covering 0..n-1 once (the last batch wraps around; a deviation from
  the official smaller last batch that keeps one compiled shape; it never happens when the pool grows by a
  multiple of batch_size)."""
  perm = rng.permutation(n)
  nb = -(-n // batch_size)
  idx = np.resize(perm, nb * batch_size)
  return [idx[i * batch_size:(i + 1) * batch_size].astype(np.int32) for i in range(nb)]


def fit(method: Method, client_params: Any, *, key: jax.Array, input_shape: tuple[int, ...], epochs: int,
        g_steps: int, batch_size: int, kd_lr: float, init_weights: np.ndarray | None = None, mesh=None,
        eval_fn: Callable[[TrainState, np.ndarray], dict] | None = None, eval_every: int = 1,
        workdir: str | None = None, name: str = "coboosting", progress: bool = False, checkpoint_every: int = 0,
        checkpoint_every_secs: float = 0.0, max_to_keep: int = 3, config: Any = None) -> FitResult:
  """Trains the server with Co-Boosting (or the baseline `method` describes) for `epochs` epochs.

  This is Co-Boosting's own epoch loop, not `common.loop.train_loop`: an epoch is three phases with
  different states (g_steps generator/synthesis steps, one pass of ensemble re-weighting over the whole
  pool, one pass of distillation over it), and the pool grows by a batch every epoch, so the number of
  steps per epoch changes and there is no single (state, batch) step for train_loop to scan. The compiled
  pieces are the per-phase steps of `compiled`; the best-epoch accuracy is read from `history` by callers.

  With a workdir the loop is resumable and preemptible through `common.loop`'s pieces, an epoch being a step:
  `CheckpointHook` saves `FitState` (server, ensemble weights, the pool: the state that is not a function of the
  epoch) every `checkpoint_every` epochs and/or `checkpoint_every_secs` seconds, and at the end marked finished;
  `RunLog` writes `workdir/metrics.jsonl` (one row per epoch) and keeps the history in the loop state;
  SIGTERM / SIGINT save at the next epoch's end and raise `loop.Preempted`. Synthesis keys, pool shuffles and the
  distillation key are functions of the epoch and the server step, so a resumed run repeats the uninterrupted
  one; a rerun of a finished workdir returns its stored result without training.

  Args:
    method: the Method (see `dense_like` for the baseline).
    client_params: the clients' params (stacked tree or tuple); read, never updated.
    key: the run's key (split into server init, synthesis and distillation keys).
    input_shape: (S, S, C).
    epochs: server epochs (official 200).
    g_steps: generator steps per epoch (official 30).
    batch_size: synthesis and distillation batch size (official 128).
    kd_lr: base SGD learning rate of the server (official 0.01), cosine-annealed over the epochs.
    init_weights: starting ensemble weights [C] (default uniform 1/C, as the official code).
    mesh: device mesh (default: all devices on 'data'); batch_size must divide by its 'data' size.
    eval_fn: (server state, weights [C]) -> dict of metrics, called every `eval_every` epochs and at the end.
    eval_every: epochs between evaluations.
    workdir: metrics.jsonl and checkpoints/ go here (None: nothing written, no resume).
    name: the progress line's label.
    progress: print a progress line.
    checkpoint_every: save every N epochs (0: not by epochs).
    checkpoint_every_secs: also save when this many seconds passed since the last save (0: not by time).
    max_to_keep: checkpoints kept.
    config: recorded beside the checkpoints on the first start.

  Returns:
    FitResult.

  Raises:
    ValueError: batch_size not divisible by the mesh's data devices, or init_weights not of shape [C].
    loop.Preempted: a stop was requested; the checkpoint of the epoch it names is saved.
  """
  from iclr24_jax.common import loop as loop_lib   # common.loop imports orbax; the pure pieces above do not
  mesh = sharding.make_mesh() if mesh is None else mesh
  n_data = mesh.shape[sharding.DATA_AXIS]
  if batch_size % n_data:
    raise ValueError(f"batch_size {batch_size} must be divisible by the mesh's {n_data} data devices.")
  num_clients = method.clients.num_clients
  comp = compiled(method, mesh, int(batch_size), tuple(input_shape))
  key_server, key_synth, key_kd, key_shuffle = jax.random.split(key, 4)
  shuffle_seed = int(np.asarray(jax.random.bits(key_shuffle, (), dtype=np.uint32)))
  weights = (np.full(num_clients, 1.0 / num_clients, np.float32) if init_weights is None
             else np.asarray(init_weights, np.float32))
  if weights.shape != (num_clients,):
    raise ValueError(f"init_weights must have shape ({num_clients},), got {weights.shape}.")
  capacity = int(epochs) * int(batch_size)

  def fresh() -> FitState:
    pool = jax.device_put((np.zeros((capacity,) + tuple(input_shape), np.float32), np.zeros((capacity,), np.int32)),
                          comp.rep)
    return FitState(server=comp.init(key_server), weights=jax.device_put(weights, comp.rep), pool_x=pool[0],
                    pool_y=pool[1])

  hook = None
  if workdir is not None:
    hook = loop_lib.CheckpointHook(os.path.join(workdir, "checkpoints"), every_steps=checkpoint_every,
                                   every_secs=checkpoint_every_secs, max_to_keep=max_to_keep, config=config)
  try:
    got = None
    if hook is not None:
      got = hook.restore_latest(jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=comp.rep),
                                             jax.eval_shape(fresh)))
    state, run = got if got is not None else (fresh(), loop_lib.LoopState())
    run.extra.setdefault("weight_history", [])
    if not run.finished:
      log = loop_lib.RunLog(workdir, run, num_steps=int(epochs), name=name, progress=progress)
      try:
        state = _epochs(method, comp, state, run, log, hook, client_params=client_params, key_synth=key_synth,
                        key_kd=key_kd, shuffle_seed=shuffle_seed, epochs=int(epochs), g_steps=int(g_steps),
                        batch_size=int(batch_size), kd_lr=float(kd_lr), eval_fn=eval_fn, eval_every=int(eval_every))
      finally:
        log.close()
  finally:
    if hook is not None:
      hook.close()
  pool_x, pool_y = jax.device_get((state.pool_x, state.pool_y))
  return FitResult(server=state.server, weights=np.asarray(jax.device_get(state.weights)), pool_x=np.asarray(pool_x),
                   pool_y=np.asarray(pool_y), history=run.history,
                   weight_history=np.asarray(run.extra["weight_history"], np.float32).reshape(-1, num_clients),
                   seconds=run.train_seconds)


def _epochs(method: Method, comp: Compiled, state: FitState, run: Any, log: Any, hook: Any, *, client_params: Any,
            key_synth: jax.Array, key_kd: jax.Array, shuffle_seed: int, epochs: int, g_steps: int, batch_size: int,
            kd_lr: float, eval_fn: Callable | None, eval_every: int) -> FitState:
  """`fit`'s epoch loop from `run.step` to `epochs`, with its saves and stops; returns the last state."""
  from iclr24_jax.common import loop as loop_lib
  mesh = comp.mesh
  teacher = {"clients": sharding.replicate(client_params, mesh), "weights": state.weights}
  knob = sharding.replicate(knobs(method), mesh)
  server, pool_x, pool_y = state.server, state.pool_x, state.pool_y
  stop_check = loop_lib.StopCheck()
  where = hook.directory if hook is not None else None
  with loop_lib.stop_on_signals():
    stop = stop_check(run.step)
    if stop:
      raise loop_lib.Preempted(None, stop, where)
    for epoch in range(run.step, epochs):
      t0 = time.perf_counter()
      # (1) hard-sample synthesis with a re-initialised generator.
      synth = comp.init_synth(jax.random.fold_in(key_synth, epoch))
      g_metrics = []
      for _ in range(g_steps):
        synth, m = comp.synth_step(synth, teacher, server.params, server.extra, knob)
        g_metrics.append(m)
      t_synth = time.perf_counter() - t0
      rng = np.random.default_rng([shuffle_seed, epoch])
      n_pool = epoch * batch_size   # the pool of the earlier epochs
      # (2) ensemble re-weighting on the pool of earlier epochs (official: skipped at epoch 0).
      w_metrics = []
      if method.weighted and epoch > 0:
        step_size = jnp.asarray(method.mu * method.mu_decay ** epoch, jnp.float32)
        for idx in _batches(n_pool, batch_size, rng):
          batch = {"x": comp.pool_batch(pool_x, idx), "y": comp.pool_batch(pool_y, idx)}
          teacher, m = comp.weight_step(teacher, batch, step_size)
          w_metrics.append(m)
      # (3) the kept batch joins the pool.
      pool_x, pool_y = comp.pool_add(pool_x, pool_y, synth.best_x, synth.targets, np.int32(n_pool))
      # (4) distillation over the whole pool.
      lr = jnp.asarray(cosine_lr(kd_lr, epoch, epochs), jnp.float32)
      kd_metrics = []
      t1 = time.perf_counter()
      for idx in _batches(n_pool + batch_size, batch_size, rng):
        server, m = comp.distill_step(server, teacher, {"x": comp.pool_batch(pool_x, idx)}, key_kd, lr, knob)
        kd_metrics.append(m)
      row = {"epoch": epoch + 1, "pool_size": n_pool + batch_size, "kd_lr": float(lr)}
      for prefix, ms in (("synth", g_metrics), ("weights", w_metrics), ("kd", kd_metrics)):
        if ms:
          ms = jax.device_get(ms)
          row.update(loop_lib.prefix_keys({k: float(np.mean([mm[k] for mm in ms])) for k in ms[-1]}, prefix))
      w_now = np.asarray(jax.device_get(teacher["weights"]))
      row["time/synthesis_s"] = t_synth
      row["time/distill_s"] = time.perf_counter() - t1
      row["time/epoch_s"] = time.perf_counter() - t0
      if eval_fn is not None and ((epoch + 1) % max(eval_every, 1) == 0 or epoch + 1 == epochs):
        row.update(eval_fn(server, w_now))
      run.extra["weight_history"].append(w_now.tolist())
      log.write(epoch + 1, row, loss_key="kd/kd_loss")
      run.step = epoch + 1
      state = FitState(server=server, weights=teacher["weights"], pool_x=pool_x, pool_y=pool_y)
      stop = stop_check(epoch + 1)
      if hook is not None:
        hook.step_boundary(epoch + 1, state, run, num_steps=epochs, stop=stop)
      elif stop and epoch + 1 < epochs:
        raise loop_lib.Preempted(epoch + 1, stop, None)
    if hook is not None:
      hook.finish(epochs, state, run)
    stop = stop or stop_check(epochs)
    if stop:   # a signal during the last epoch: the finished run is saved; stop before the next phase
      raise loop_lib.Preempted(epochs, stop, where)
  return state
