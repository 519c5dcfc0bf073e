"""LDCQ: sampling latents from the prior, the batch-constrained Q update, acting, and the training stages.

  spec = LDCQSpec(vae=SkillVAE(...), denoiser=MLPDenoiser(...), q_net=QNetwork(...), horizon=H)
  params = LDCQParams(vae=..., diffusion=..., q=..., q_target=..., spec=spec)
  z = sample_latents(key, params, states, n)          # [B, n, Z] from the diffusion (or Gaussian VAE) prior
  z = act(key, params, state, num_samples)            # [B, Z]: argmax_z min(Q_0, Q_1)(s, z) over n prior samples
  z = act_maze(key, params, state, num_samples)       # [B, Z]: the official maze2d two-stage planner
  q_state, metrics = q_train_step(q_state, None, key, cfg=QConfig(...))   # prioritised replay inside the state

Every function is pure and un-jitted; the stage trainers (`train_vae`, `train_diffusion`, `train_bc`, `train_q`)
run their whole loop in one `lax.scan`, so a caller can `jax.vmap` them over seeds and jit once. Each is an init and
a step (`vae_init` / `vae_step`, ...) scanned over `stage_keys`; a driver that checkpoints mid-stage runs
`train_steps` over consecutive slices of those keys (`experiment.pipeline`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from iclr24_jax.common import checks
from iclr24_jax.common.train_state import TrainState
from iclr24_jax.diffusion import samplers, schedules
from iclr24_jax.diffusion.unet import MLPDenoiser
from iclr24_jax.papers.ldcq import losses
from iclr24_jax.papers.ldcq.model import BCPolicy, QNetwork, SkillVAE, twin_q_apply, twin_q_init
from iclr24_jax.rl import replay

PRIORS = ("diffusion", "gaussian")


@dataclasses.dataclass(frozen=True)
class LDCQSpec:
  """The static part of an LDCQ agent: modules and the diffusion sampler's settings.

  Attributes:
    vae: the SkillVAE.
    denoiser: the latent denoiser (MLPDenoiser, x0-prediction, conditioned on s_0 via cond=).
    q_net: the Q network.
    horizon: H, the skill length.
    prior: 'diffusion' (LDCQ) or 'gaussian' (the VAE's p(z | s_0): the "VAE prior" baselines).
    schedule: 'linear' (official: betas beta_start..beta_end over num_timesteps) or 'cosine' (reaches noise).
    num_timesteps: T (official 100).
    beta_start, beta_end: the linear betas (official 1e-4, 0.02).
    sample_steps: reverse steps when sampling (0: all T, the official sampler; fewer strides the DDPM chain).
    variance: DDPM's reverse variance: 'beta' (official: sqrt(beta_t) z) or 'posterior'.
  """

  vae: SkillVAE
  denoiser: MLPDenoiser
  q_net: QNetwork
  horizon: int = 10
  prior: str = "diffusion"
  schedule: str = "linear"
  num_timesteps: int = 100
  beta_start: float = 1e-4
  beta_end: float = 0.02
  sample_steps: int = 0
  variance: str = "beta"

  def __post_init__(self):
    if self.prior not in PRIORS:
      raise ValueError(f"unknown LDCQ prior '{self.prior}'; choose one of {PRIORS}.")
    if self.schedule not in ("linear", "cosine"):
      raise ValueError(f"unknown LDCQ diffusion schedule '{self.schedule}'; choose 'linear' or 'cosine'.")

  def make_schedule(self) -> schedules.DiscreteSchedule:
    """The DDPM schedule. Deviation (documented): the official linear schedule (1e-4..0.02, T = 100) ends at
    abar_T ~ 0.37, not at noise, while sampling starts from N(0, I); it is kept as the default (the official
    run), and 'cosine' is the schedule that reaches noise. Deviation: the official ddpm_schedules
    (models/diffusion_models.py:399-428) also multiplies abar by an unused beta_0 = beta_start, so its abar_t is
    (1 - 1e-4) times this one's abar_{t-1}; the reverse step is otherwise the official one (tested)."""
    if self.schedule == "linear":
      return schedules.linear_beta_schedule(self.num_timesteps, self.beta_start, self.beta_end)
    return schedules.cosine_beta_schedule(self.num_timesteps)


@flax.struct.dataclass
class LDCQParams:
  """An agent's parameters (a pytree) with its static spec.

  Attributes:
    vae: SkillVAE params.
    diffusion: denoiser params (None with the Gaussian prior).
    q: twin online Q params stacked [2, ...] (None: no Q, the latent-BC policy).
    q_target: twin target Q params [2, ...] (acting uses the online twin `q` when given, as the official
      evaluation does; these only when `q` is None).
    spec: the LDCQSpec (static).
  """

  vae: Any
  diffusion: Any = None
  q: Any = None
  q_target: Any = None
  spec: LDCQSpec = flax.struct.field(pytree_node=False, default=None)


def _as_batch(states: jax.Array, where: str = "ldcq") -> tuple[jax.Array, bool]:
  if np.ndim(states) not in (1, 2):
    raise checks.ShapeError(f"{where}: states must be [D] or [B, D]; got shape {np.shape(states)}.")
  states = jnp.asarray(states, jnp.float32)
  if states.ndim == 1:
    return states[None], True
  return states, False


def sample_latents(key: jax.Array, params: LDCQParams, states: jax.Array, n: int) -> jax.Array:
  """n latents per state from the agent's prior p(z | s).

  Diffusion prior: DDPM ancestral sampling (`diffusion.samplers.sample`, method 'ddpm', x0-prediction, the
  official reverse variance beta_t) of the MLPDenoiser conditioned on s. Gaussian prior: z ~ N(mu(s), sigma(s)^2).

  Args:
    key: randomness.
    params: LDCQParams.
    states: [B, D] (or [D]).
    n: samples per state.

  Returns:
    latents [B, n, Z] (or [n, Z] for a single state).
  """
  where = "ldcq.sample_latents"
  spec = params.spec
  s, single = _as_batch(states, where)
  b = s.shape[0]
  z_dim = spec.vae.z_dim
  n = checks.static_int(where, "n", n, low=1)
  if spec.prior == "gaussian":
    mean, std = spec.vae.apply({"params": params.vae}, s, method=SkillVAE.prior)
    z = mean[:, None] + std[:, None] * jax.random.normal(key, (b, n, z_dim))
  else:
    if params.diffusion is None:
      raise ValueError("this agent has prior='diffusion' but no diffusion params; train the prior first.")
    cond = jnp.repeat(s, n, axis=0)
    den = lambda z_t, t, c: spec.denoiser.apply({"params": params.diffusion}, z_t, t, cond=c)  # noqa: E731
    z = samplers.sample(key, den, spec.make_schedule(), (b * n, z_dim), method="ddpm", prediction="x0",
                        variance=spec.variance, num_steps=spec.sample_steps or None, cond=cond).reshape(b, n, z_dim)
  return z[0] if single else z


def q_values(params: LDCQParams, states: jax.Array, latents: jax.Array, target: bool = True) -> jax.Array:
  """min(Q_0, Q_1)(s, z) for states [B, D] and latents [B, N, Z] -> [B, N] (target nets by default).

  Args:
    params: LDCQParams (spec.q_net, q and q_target twin params).
    states: [B, D] float32.
    latents: [B, N, Z] candidate latents per state.
    target: use the target twin (True) or the online twin (False).

  Returns:
    [B, N] float32 pessimistic Q values.
  """
  checks.shapes("ldcq.q_values", states=(states, "B D"), latents=(latents, "B N Z"))
  b, n, zd = latents.shape
  qp = params.q_target if target else params.q
  q = twin_q_apply(params.spec.q_net, qp, jnp.repeat(states, n, axis=0), latents.reshape(b * n, zd))
  return jnp.min(q, axis=0).reshape(b, n)


def _acting_q(params: LDCQParams) -> Any:
  """The twin Q params acting scores with: the online nets (official evaluation: plan_skills_diffusion*.py sets
  `target_net_j = q_net_j` before acting), the target nets only when no online nets are given."""
  return params.q if params.q is not None else params.q_target


def act(key: jax.Array, params: LDCQParams, state: jax.Array, num_samples: int) -> jax.Array:
  """LDCQ's high-level policy (the generic planner): sample `num_samples` latents from the prior at the state and
  take the one with the highest min(Q_0, Q_1) (official q_policy of eval/plan_skills_diffusion.py,
  get_max_skills(is_eval=True), scored by the online nets as the official evaluation does). Without Q params the
  first sample is returned: with the Gaussian prior that is latent BC, with the diffusion prior the official
  `diffusion_prior_policy` (one prior sample, no Q).

  Args:
    key: randomness.
    params: LDCQParams.
    state: [B, D] or [D].
    num_samples: N latents per state.

  Returns:
    the chosen latent [B, Z] (or [Z]).
  """
  s, single = _as_batch(state, "ldcq.act")
  num_samples = checks.static_int("ldcq.act", "num_samples", num_samples, low=1)
  qp = _acting_q(params)
  z = sample_latents(key, params, s, 1 if qp is None else num_samples)      # [B, N, Z]
  if qp is None:
    best = z[:, 0]
  else:
    idx = jnp.argmax(q_values(params, s, z, target=params.q is None), axis=-1)
    best = jnp.take_along_axis(z, idx[:, None, None], axis=1)[:, 0]
  return best[0] if single else best


def act_maze(key: jax.Array, params: LDCQParams, state: jax.Array, num_samples: int) -> jax.Array:
  """The maze2d planner (official q_policy of eval/plan_skills_diffusion_maze2d.py:39-87): sample N latents z1 at
  the state, predict each skill's end state s_H = mean of the terminal decoder p(s_H | s, z1), sample one latent z2
  from the prior at each predicted s_H, score (s_H, z2) with min(Q_0, Q_1) and return the best z2 (the second-stage
  skill is the one executed from the current state, as the official script does). Without Q params: one prior
  sample at the state (the official `diffusion_prior_policy` / latent BC).

  Args:
    key: randomness.
    params: LDCQParams (spec.vae supplies the terminal decoder).
    state: [B, D] or [D].
    num_samples: N first-stage latents per state.

  Returns:
    the chosen latent [B, Z] (or [Z]).
  """
  s, single = _as_batch(state)
  qp = _acting_q(params)
  if qp is None:
    best = sample_latents(key, params, s, 1)[:, 0]
    return best[0] if single else best
  b, d = s.shape
  k_first, k_second = jax.random.split(key)
  z1 = sample_latents(k_first, params, s, num_samples)                       # [B, N, Z]
  s_rep = jnp.repeat(s, num_samples, axis=0)                                 # official repeat_interleave
  s_end, _ = params.spec.vae.apply({"params": params.vae}, s_rep, z1.reshape(b * num_samples, -1),
                                   method=SkillVAE.terminal)                 # [B N, D] predicted s_H (mean)
  z2 = sample_latents(k_second, params, s_end, 1)[:, 0]                      # [B N, Z]: one latent per s_H
  q = jnp.min(twin_q_apply(params.spec.q_net, qp, s_end, z2), axis=0).reshape(b, num_samples)
  idx = jnp.argmax(q, axis=-1)
  best = z2.reshape(b, num_samples, -1)[jnp.arange(b), idx]
  return best[0] if single else best


PLANNERS = {"argmax": act, "maze": act_maze}


def low_level_action(key: jax.Array, params: LDCQParams, state: jax.Array, z: jax.Array,
                     deterministic: bool = False) -> jax.Array:
  """a ~ pi(a | s, z) [B, A] for states [B, D], latents [B, Z] (sampled, as the official numpy_policy).

  Args:
    key: PRNG key.
    params: LDCQParams (spec.vae and its params).
    state: [B, D] float32 states.
    z: [B, Z] skill latents.
    deterministic: take the decoder's mean action instead of sampling.

  Returns:
    [B, A] float32 actions.
  """
  return params.spec.vae.apply({"params": params.vae}, key, state, z, deterministic, method=SkillVAE.sample_action)


# --- Q-learning ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class QConfig:
  """Static settings of the Q update (official DDQN defaults in brackets).

  Attributes:
    q_net: the Q module.
    discount: gamma^H of the target.
    batch_size: [128].
    num_target_samples: latents drawn (without replacement) from the K stored per s_H for each update [100 of 1000].
    tau: Polyak step 1 - 0.995 [target <- 0.995 target + 0.005 online, every step].
    max_grad_norm: per-network gradient clipping [1].
    per_beta0, per_beta_step, steps_per_epoch: PER importance exponent beta = min(1, 0.3 + 0.01 * epoch).
    priority_eps: added to the squared TD errors [5e-6]; a drawn item's new priority is the mean over the two
      nets of (TD^2 + eps) (official: (prios_0 + prios_1) / 2). Items enter the buffer at 100 (`make_buffer`).
    batch_sharding: None, or the sharding (e.g. NamedSharding(mesh, P('data'))) the batch drawn from the buffer
      is constrained to. Over a mesh the draw's indices are replicated, so without it every device computes the
      whole batch; with it the update is data-parallel. Values are unchanged.
  """

  q_net: QNetwork
  discount: float
  batch_size: int = 128
  num_target_samples: int = 100
  tau: float = 0.005
  max_grad_norm: float = 1.0
  per_beta0: float = 0.3
  per_beta_step: float = 0.01
  steps_per_epoch: int = 1000
  priority_eps: float = 5e-6
  batch_sharding: Any = None

  def __post_init__(self):
    where = "ldcq.QConfig"
    checks.in_range(where, "discount", self.discount, 0.0, 1.0, hint="gamma^H of the H-step target.")
    checks.in_range(where, "tau", self.tau, 0.0, 1.0, hint="the Polyak step (official 0.005).")
    checks.in_range(where, "max_grad_norm", self.max_grad_norm, 0.0, None, low_open=True)
    checks.in_range(where, "priority_eps", self.priority_eps, 0.0, None)
    checks.static_int(where, "batch_size", self.batch_size, low=1)
    checks.static_int(where, "num_target_samples", self.num_target_samples, low=1)
    checks.static_int(where, "steps_per_epoch", self.steps_per_epoch, low=1)


def q_init(key: jax.Array, cfg: QConfig, buffer: replay.PrioritizedBuffer | None, state_dim: int, z_dim: int,
           learning_rate: float = 1e-3) -> TrainState:
  """A Q TrainState: params = twin online Q [2, ...]; extra = {'target': twin target (a copy), 'buffer': buffer}.

  Args:
    key: PRNG key.
    cfg: QConfig (its q_net).
    buffer: the prioritised buffer of the Q data set, or None (batches passed to `q_train_step`).
    state_dim: D.
    z_dim: Z.
    learning_rate: Adam step size.

  Returns:
    TrainState (params leaves carry a leading twin axis of 2).
  """
  q = twin_q_init(key, cfg.q_net, state_dim, z_dim)
  target = jax.tree.map(jnp.copy, q)  # own buffers: a caller may donate the state
  return TrainState.create(q, optax.adam(learning_rate), extra={"target": target, "buffer": buffer})


def _clip_per_net(grads: Any, max_norm: float) -> tuple[Any, jax.Array]:
  """Clips each twin's gradient to global norm max_norm separately (official: clip_grad_norm_ per network)."""
  norms = jax.vmap(optax.global_norm)(grads)                       # [2]
  scale = jnp.minimum(1.0, max_norm / jnp.maximum(norms, 1e-12))
  return jax.tree.map(lambda g: g * scale.reshape((2,) + (1,) * (g.ndim - 1)), grads), norms


def q_train_step(state: TrainState, batch: dict[str, jax.Array] | None, key: jax.Array, *, cfg: QConfig
                 ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One LDCQ Q update of both networks (official DDQN.learn, PER branch).

  With batch=None the batch is drawn from the prioritised buffer in state.extra['buffer'] (alpha in the buffer,
  beta annealed per epoch) and the priorities of the drawn items become the mean squared TD error of the two nets
  + eps; a given batch (uniform replay) has importance weights 1.

  Args:
    state: from `q_init`.
    batch: None, or s0 [B, D], z [B, Z], reward [B], next_state [B, D], done [B], next_latents [B, K, Z].
    key: randomness (folded with state.step).
    cfg: QConfig.

  Returns:
    (new state, metrics: loss, td_error, q_mean, target_mean, grad_norm).
  """
  key = jax.random.fold_in(key, state.step)
  k_sample, k_perm = jax.random.split(key)
  buf = state.extra["buffer"]
  if batch is None:
    if buf is None:
      raise ValueError("q_train_step needs a batch or a prioritised buffer in state.extra['buffer'].")
    epoch = state.step // cfg.steps_per_epoch
    beta = jnp.minimum(1.0, cfg.per_beta0 + cfg.per_beta_step * epoch)
    # Official NaivePrioritizedBuffer.sample: P(i) = p_i^alpha / sum p^alpha, weights (N P(i))^-beta / max over the
    # batch. Deviation: rl.replay draws the batch with stratified uniforms on its sum-tree (one per equal slice of
    # the mass; each item's expected count is still B P(i)) where the official draws i.i.d. (np.random.choice).
    batch, idx, weights = replay.prioritized_sample(buf, k_sample, cfg.batch_size, beta=beta)
    if cfg.batch_sharding is not None:
      batch, weights = jax.lax.with_sharding_constraint((batch, weights), cfg.batch_sharding)
  else:
    idx, weights = None, jnp.ones_like(batch["reward"])
  k_total = batch["next_latents"].shape[1]
  n_t = min(cfg.num_target_samples, k_total)
  perm = jax.random.permutation(k_perm, k_total)[:n_t]            # one subset for the batch (official randperm)
  tgt = losses.q_target(cfg.q_net, state.extra["target"], batch["reward"], batch["next_state"],
                        batch["next_latents"][:, perm], batch["done"], discount=cfg.discount)

  def loss_fn(qp):
    q = twin_q_apply(cfg.q_net, qp, batch["s0"], batch["z"])       # [2, B]
    sq = (q - tgt["targets"]) ** 2
    return jnp.sum(jnp.mean(sq * weights[None], axis=1)), (q, sq)  # sum of the two nets' losses

  (loss, (q, sq)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  grads, norms = _clip_per_net(grads, cfg.max_grad_norm)
  new = state.apply_gradients(grads)
  target = optax.incremental_update(new.params, state.extra["target"], cfg.tau)   # Polyak averaging
  if idx is not None:
    buf = replay.prioritized_update(buf, idx, jnp.mean(sq + cfg.priority_eps, axis=0))
  new = new.replace(extra={"target": target, "buffer": buf})
  return new, {"loss": loss / 2, "td_error": jnp.mean(jnp.sqrt(sq)), "q_mean": jnp.mean(q),
               "target_mean": jnp.mean(tgt["targets"]), "grad_norm": jnp.max(norms)}


# --- stage trainers (one lax.scan each) ---------------------------------------------------------------------------
# Each stage is `<stage>_init(key, ...) -> TrainState` and a pure `<stage>_step(state, key, ...) -> (state, metrics)`;
# `train_<stage>` runs them as one lax.scan over `stage_keys`. A driver that saves mid-stage runs `train_steps` over
# consecutive slices of the same keys, so a stage cut into chunks draws the stream of the one scan.
def _batches(key: jax.Array, n: int, batch_size: int) -> jax.Array:
  return jax.random.randint(key, (batch_size,), 0, n)


def stage_keys(key: jax.Array, num_steps: int) -> tuple[jax.Array, jax.Array]:
  """A stage trainer's init key and its per-step keys.

  Args:
    key: the stage's PRNG key.
    num_steps: the stage's steps.

  Returns:
    (init key, step keys [num_steps]).
  """
  k_init, k_train = jax.random.split(key)
  return k_init, jax.random.split(k_train, num_steps)


def train_steps(step_fn: Any, state: Any, keys: jax.Array) -> tuple[Any, dict[str, jax.Array]]:
  """`state, metrics = step_fn(state, key)` for each of `keys` [n], as one lax.scan.

  Args:
    step_fn: (state, key) -> (state, metrics), pure.
    state: the stage's state.
    keys: [n] step keys (a slice of `stage_keys`' second output).

  Returns:
    (state after n steps, metrics with leaves [n]).
  """
  return jax.lax.scan(step_fn, state, keys)


def vae_init(key: jax.Array, vae: SkillVAE, segs: dict[str, jax.Array], learning_rate: float = 5e-5) -> TrainState:
  """The skill VAE's TrainState (Adam), initialised on two segments of `segs` (see `train_vae`)."""
  params = vae.init(key, segs["states"][:2], segs["actions"][:2])["params"]
  return TrainState.create(params, optax.adam(learning_rate))


def vae_step(state: TrainState, key: jax.Array, segs: dict[str, jax.Array], *, vae: SkillVAE, batch_size: int = 128,
             beta: float = 0.05, terminal_loss: bool = True) -> tuple[TrainState, dict[str, jax.Array]]:
  """One Adam step of the skill VAE on a minibatch of segments drawn uniformly with replacement.

  Args:
    state: from `vae_init`.
    key: this step's key (the minibatch and the latent sample).
    segs: {'states': [M, H, D], 'actions': [M, H, A], 'next_state': [M, D]} float32 segments.
    vae: the SkillVAE module.
    batch_size: segments per step.
    beta: weight of the KL term (`losses.vae_loss`).
    terminal_loss: also fit the terminal-state head.

  Returns:
    (new state, `losses.vae_loss` metrics).
  """
  k_b, k_l = jax.random.split(key)
  i = _batches(k_b, segs["states"].shape[0], batch_size)
  batch = {"states": segs["states"][i], "actions": segs["actions"][i], "next_state": segs["next_state"][i]}
  (_, met), g = jax.value_and_grad(losses.vae_loss, has_aux=True)(state.params, vae, batch, k_l, beta=beta,
                                                                   terminal_loss=terminal_loss)
  return state.apply_gradients(g), met


def train_vae(key: jax.Array, vae: SkillVAE, segs: dict[str, jax.Array], *, num_steps: int, batch_size: int = 128,
              learning_rate: float = 5e-5, beta: float = 0.05, terminal_loss: bool = True
              ) -> tuple[Any, dict[str, jax.Array]]:
  """Trains the skill VAE on segments (states [M, H, D], actions [M, H, A], next_state [M, D]) with Adam.

  Args:
    key: PRNG key (init and training).
    vae: the SkillVAE module.
    segs: {'states': [M, H, D], 'actions': [M, H, A], 'next_state': [M, D]} float32 segments.
    num_steps: Adam steps (one lax.scan of `vae_step`), minibatches drawn uniformly with replacement.
    batch_size: segments per step.
    learning_rate: Adam step size.
    beta: weight of the KL term (`losses.vae_loss`).
    terminal_loss: also fit the terminal-state head.

  Returns:
    (params, metrics with leaves [num_steps]).
  """
  k_init, keys = stage_keys(key, num_steps)
  step = lambda st, k: vae_step(st, k, segs, vae=vae, batch_size=batch_size, beta=beta,  # noqa: E731
                                terminal_loss=terminal_loss)
  st, hist = train_steps(step, vae_init(k_init, vae, segs, learning_rate), keys)
  return st.params, hist


def encode(vae: SkillVAE, params: Any, states: jax.Array, actions: jax.Array, chunk: int = 4096
           ) -> tuple[jax.Array, jax.Array]:
  """Posterior (mean, std) [M, Z] of every segment, in chunks (lax.map) to bound memory.

  Args:
    vae: the SkillVAE module.
    params: its params.
    states: [M, H, D] segment states.
    actions: [M, H, A] segment actions.
    chunk: segments per encoder call (the last chunk is zero-padded).

  Returns:
    (mean [M, Z], std [M, Z]).
  """
  m = states.shape[0]
  c = min(chunk, m)
  pad = (-m) % c
  s = jnp.concatenate([states, jnp.zeros((pad,) + states.shape[1:], states.dtype)]).reshape((-1, c) + states.shape[1:])
  a = jnp.concatenate([actions, jnp.zeros((pad,) + actions.shape[1:], actions.dtype)]).reshape(
      (-1, c) + actions.shape[1:])
  mean, std = jax.lax.map(lambda x: vae.apply({"params": params}, x[0], x[1], method=SkillVAE.encode), (s, a))
  return mean.reshape(-1, mean.shape[-1])[:m], std.reshape(-1, std.shape[-1])[:m]


def diffusion_init(key: jax.Array, spec: LDCQSpec, s0: jax.Array, latents: jax.Array,
                   learning_rate: float = 1e-4) -> TrainState:
  """The latent denoiser's TrainState (Adam), initialised on the first pair of (s0 [M, D], latents [M, Z])."""
  params = spec.denoiser.init(key, latents[:1], jnp.zeros((1,), jnp.int32), cond=s0[:1])["params"]
  return TrainState.create(params, optax.adam(learning_rate))


def diffusion_step(state: TrainState, key: jax.Array, s0: jax.Array, latents: jax.Array, *, spec: LDCQSpec,
                   batch_size: int = 128) -> tuple[TrainState, dict[str, jax.Array]]:
  """One Adam step of `latent_diffusion_loss` on pairs drawn with replacement.

  Args:
    state: from `diffusion_init`.
    key: this step's key (the minibatch, the diffusion time and noise).
    s0: [M, D] segment start states (the condition).
    latents: [M, Z] the segments' posterior latents.
    spec: LDCQSpec (its denoiser and schedule).
    batch_size: pairs per step.

  Returns:
    (new state, {'loss'}).
  """
  k_b, k_l = jax.random.split(key)
  i = _batches(k_b, s0.shape[0], batch_size)
  (loss, _), g = jax.value_and_grad(losses.latent_diffusion_loss, has_aux=True)(
      state.params, spec.denoiser, spec.make_schedule(), s0[i], latents[i], k_l)
  return state.apply_gradients(g), {"loss": loss}


def train_diffusion(key: jax.Array, spec: LDCQSpec, s0: jax.Array, latents: jax.Array, *, num_steps: int,
                    batch_size: int = 128, learning_rate: float = 1e-4) -> tuple[Any, dict[str, jax.Array]]:
  """Trains the latent diffusion prior on (s_0 [M, D], z [M, Z]) pairs with `latent_diffusion_loss`.

  Args:
    key: PRNG key (init and training).
    spec: LDCQSpec (its denoiser and schedule).
    s0: [M, D] segment start states (the condition).
    latents: [M, Z] the segments' posterior latents.
    num_steps: Adam steps (one lax.scan of `diffusion_step`).
    batch_size: pairs per step (drawn with replacement).
    learning_rate: Adam step size.

  Returns:
    (denoiser params, {'loss': [num_steps]}).
  """
  k_init, keys = stage_keys(key, num_steps)
  step = lambda st, k: diffusion_step(st, k, s0, latents, spec=spec, batch_size=batch_size)  # noqa: E731
  st, hist = train_steps(step, diffusion_init(k_init, spec, s0, latents, learning_rate), keys)
  return st.params, hist


def bc_init(key: jax.Array, policy: BCPolicy, observations: jax.Array, learning_rate: float = 1e-3) -> TrainState:
  """The BC policy's TrainState (Adam), initialised on the first row of observations [N, D]."""
  return TrainState.create(policy.init(key, observations[:1])["params"], optax.adam(learning_rate))


def bc_step(state: TrainState, key: jax.Array, observations: jax.Array, actions: jax.Array, *, policy: BCPolicy,
            batch_size: int = 256) -> tuple[TrainState, dict[str, jax.Array]]:
  """One Adam step of `losses.bc_loss` on rows drawn with replacement (observations [N, D], actions [N, A]).

  Returns:
    (new state, {'loss'}).
  """
  i = _batches(key, observations.shape[0], batch_size)
  (loss, _), g = jax.value_and_grad(losses.bc_loss, has_aux=True)(state.params, policy, observations[i], actions[i])
  return state.apply_gradients(g), {"loss": loss}


def train_bc(key: jax.Array, policy: BCPolicy, observations: jax.Array, actions: jax.Array, *, num_steps: int,
             batch_size: int = 256, learning_rate: float = 1e-3) -> tuple[Any, dict[str, jax.Array]]:
  """Behaviour cloning of the data actions (the BC baseline).

  Args:
    key: PRNG key (init and training).
    policy: the BCPolicy module.
    observations: [N, D] float32.
    actions: [N, A] float32.
    num_steps: Adam steps (one lax.scan of `bc_step`).
    batch_size: rows per step (drawn with replacement).
    learning_rate: Adam step size.

  Returns:
    (policy params, {'loss': [num_steps]}).
  """
  k_init, keys = stage_keys(key, num_steps)
  step = lambda st, k: bc_step(st, k, observations, actions, policy=policy, batch_size=batch_size)  # noqa: E731
  st, hist = train_steps(step, bc_init(k_init, policy, observations, learning_rate), keys)
  return st.params, hist


def q_dataset(key: jax.Array, params: LDCQParams, s0: jax.Array, z: jax.Array, reward: jax.Array,
              next_state: jax.Array, done: jax.Array, num_samples: int, chunk: int = 512) -> dict[str, jax.Array]:
  """The Q data set: each segment's (s_0, posterior mean z, r_{0:H}, s_H, done) and `num_samples` latents
  pre-sampled from the agent's prior at s_H (official collect_offline_q_learning_dataset: 1000 per state).

  Args:
    key: PRNG key.
    params: LDCQParams with a trained diffusion prior.
    s0: [M, D] segment start states.
    z: [M, Z] posterior mean latents.
    reward: [M] discounted segment rewards.
    next_state: [M, D] states s_H after the segment.
    done: [M] terminal flags.
    num_samples: K latents per next state.
    chunk: next states per sampling call (the last chunk is zero-padded).

  Returns:
    dict of [M, ...] arrays; next_latents [M, K, Z].
  """
  m = s0.shape[0]
  c = min(chunk, m)
  pad = (-m) % c
  padded = jnp.concatenate([next_state, jnp.zeros((pad, next_state.shape[1]), next_state.dtype)]).reshape(
      -1, c, next_state.shape[1])
  keys = jax.random.split(key, padded.shape[0])
  lat = jax.lax.map(lambda x: sample_latents(x[0], params, x[1], num_samples), (keys, padded))
  lat = lat.reshape(-1, num_samples, lat.shape[-1])[:m]
  return {"s0": s0, "z": z, "reward": reward, "next_state": next_state, "done": done, "next_latents": lat}


# Official NaivePrioritizedBuffer.push (training/per_utils.py:18): the first item enters at priority 100 and every
# later one at the running maximum, so the whole data set starts at 100 while updated items drop to their squared
# TD error: untouched items stay ~ (100 / TD^2)^alpha times likelier to be drawn.
INITIAL_PRIORITY = 100.0


def make_buffer(data: dict[str, jax.Array], alpha: float = 0.6,
                initial_priority: float = INITIAL_PRIORITY) -> replay.PrioritizedBuffer:
  """A prioritised buffer holding the whole Q data set, every item at priority 100 (official
  NaivePrioritizedBuffer.push).

  Args:
    data: the `q_dataset` dict (leaves [M, ...]).
    alpha: priority exponent.
    initial_priority: the raw priority of every item (official 100).

  Returns:
    PrioritizedBuffer of capacity M, full.
  """
  example = jax.tree.map(lambda x: x[0], data)
  m = data["s0"].shape[0]
  buf = replay.prioritized_init(example, m, alpha=alpha)
  return replay.prioritized_add(buf, data, priorities=jnp.full((m,), initial_priority, jnp.float32))


def train_q(key: jax.Array, cfg: QConfig, data: dict[str, jax.Array], *, num_steps: int, learning_rate: float = 1e-3,
            alpha: float = 0.6) -> tuple[TrainState, dict[str, jax.Array]]:
  """Fits the twin Q-networks with prioritised replay over the Q data set for num_steps updates.

  Args:
    key: PRNG key (init and training).
    cfg: QConfig.
    data: the `q_dataset` dict.
    num_steps: Q updates (one lax.scan of `q_train_step`).
    learning_rate: Adam step size.
    alpha: priority exponent of the buffer.

  Returns:
    (final Q TrainState, metrics with leaves [num_steps]).
  """
  k_init, keys = stage_keys(key, num_steps)
  buf = make_buffer(data, alpha)
  state = q_init(k_init, cfg, buf, data["s0"].shape[1], data["z"].shape[1], learning_rate)
  return train_steps(lambda st, k: q_train_step(st, None, k, cfg=cfg), state, keys)


# --- evaluation in a JAX env (PointMaze) --------------------------------------------------------------------------
SCORES = ("return", "time_to_goal")


def _episode_scores(ret: jax.Array, t_hit: jax.Array, steps: int, score: str) -> jax.Array:
  """[E] scores of finished episodes: the summed reward, or the official maze2d score steps - t at the first
  rewarded step t (0-based, eval/plan_skills_diffusion_maze2d.py:355-358), 0 for an episode that never got there."""
  if score == "return":
    return ret
  return jnp.where(t_hit >= 0, steps - t_hit, 0).astype(jnp.float32)


def _check_score(score: str) -> None:
  if score not in SCORES:
    raise ValueError(f"unknown LDCQ evaluation score '{score}'; choose one of {SCORES}.")


def evaluate_skills(key: jax.Array, params: LDCQParams, env: Any, *, num_episodes: int, num_samples: int,
                    exec_horizon: int, episode_steps: int | None = None, deterministic_policy: bool = False,
                    planner: str = "argmax", score: str = "return") -> jax.Array:
  """Episode scores [E] of the skill agent: replan every exec_horizon steps, run the low-level policy.

  All episodes run in parallel; the planning is one batched call over the episodes (a `lax.while_loop` over
  replans that stops once every episode is over, an inner scan over the executed steps). `env` offers
  reset_core / step_core (an rl.envs.Env, e.g. PointMaze).

  Two protocols (the `experiment` config's eval.protocol picks a pair):
    planner='maze', score='time_to_goal': the official maze2d evaluation (eval/plan_skills_diffusion_maze2d.py):
      the two-stage `act_maze` planner, an episode stops at its first rewarded step t and scores
      episode_steps - t (official: 800 - t), 0 if it never gets there.
    planner='argmax', score='return': the generic `act` (argmax of min-Q over prior samples at the state) and the
      summed reward over the whole episode (no stop at the goal).

  Args:
    key: PRNG key.
    params: LDCQParams (Q params None: one prior sample per replan: latent BC / the diffusion prior alone).
    env: the environment (reset_core, step_core, spec.max_episode_steps).
    num_episodes: E.
    num_samples: latents drawn per replan.
    exec_horizon: low-level steps per latent.
    episode_steps: episode length T (None: env.spec.max_episode_steps).
    deterministic_policy: low-level mean actions.
    planner: 'argmax' (`act`) or 'maze' (`act_maze`).
    score: 'return' or 'time_to_goal'.

  Returns:
    float32 [E] episode scores.

  Raises:
    ValueError: unknown planner or score.
  """
  if planner not in PLANNERS:
    raise ValueError(f"unknown LDCQ planner '{planner}'; choose one of {sorted(PLANNERS)}.")
  _check_score(score)
  plan_fn = PLANNERS[planner]
  stop_at_goal = score == "time_to_goal"
  steps = int(episode_steps or env.spec.max_episode_steps)
  n_plans = math.ceil(steps / exec_horizon)
  k_reset, k_run = jax.random.split(key)
  core, obs = jax.vmap(env.reset_core)(jax.random.split(k_reset, num_episodes))
  ret = jnp.zeros((num_episodes,), jnp.float32)
  t_hit = jnp.full((num_episodes,), -1, jnp.int32)

  def plan(carry):
    p, core, obs, ret, t_hit = carry
    k_act, k_steps = jax.random.split(jax.random.fold_in(k_run, p))
    z = plan_fn(k_act, params, obs, num_samples)

    def inner(c, ys):
      core, obs, ret, t_hit = c
      j, kk = ys
      t = p * exec_horizon + j
      k_pi, k_env = jax.random.split(kk)
      a = low_level_action(k_pi, params, obs, z, deterministic_policy)
      core2, obs2, r, _ = jax.vmap(env.step_core)(jax.random.split(k_env, num_episodes), core, a)
      live = (t < steps) & ((t_hit < 0) | (not stop_at_goal))     # official: a done episode takes no more steps
      core2 = jax.tree.map(lambda new, old: jnp.where(live.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
                           core2, core)
      t_hit = jnp.where(live & (t_hit < 0) & (r > 0), t, t_hit)
      return (core2, jnp.where(live[:, None], obs2, obs), ret + jnp.where(live, r, 0.0), t_hit), None

    (core, obs, ret, t_hit), _ = jax.lax.scan(inner, (core, obs, ret, t_hit),
                                              (jnp.arange(exec_horizon), jax.random.split(k_steps, exec_horizon)))
    return p + 1, core, obs, ret, t_hit

  def more(carry):
    p, t_hit = carry[0], carry[4]
    return (p < n_plans) & ~(stop_at_goal & jnp.all(t_hit >= 0))

  _, _, _, ret, t_hit = jax.lax.while_loop(more, plan, (jnp.zeros((), jnp.int32), core, obs, ret, t_hit))
  return _episode_scores(ret, t_hit, steps, score)


def evaluate_policy(key: jax.Array, policy_fn: Any, env: Any, *, num_episodes: int,
                    episode_steps: int | None = None, score: str = "return") -> jax.Array:
  """Episode scores [E] of a flat (state -> action) policy, scored as `evaluate_skills`.

  The episode starts come from the same key split as `evaluate_skills` (reset with `split(split(key)[0], E)`), so
  every method evaluated with one key starts its episodes from the same states (paired comparisons).

  Args:
    key: PRNG key.
    policy_fn: (key, obs [E, D]) -> actions [E, A]; the key is this step's own (unused by a deterministic policy).
    env: the environment (reset_core, step_core, spec.max_episode_steps).
    num_episodes: E.
    episode_steps: episode length T (None: env.spec.max_episode_steps).
    score: 'return' (summed reward) or 'time_to_goal' (T - t at the first rewarded step, the episode stops there).

  Returns:
    float32 [E] episode scores.

  Raises:
    ValueError: unknown score.
  """
  _check_score(score)
  stop_at_goal = score == "time_to_goal"
  steps = int(episode_steps or env.spec.max_episode_steps)
  k_reset, k_run = jax.random.split(key)
  core, obs = jax.vmap(env.reset_core)(jax.random.split(k_reset, num_episodes))

  def body(c, xs):
    core, obs, ret, t_hit = c
    t, k = xs
    a = policy_fn(jax.random.fold_in(k, 1), obs)      # the environment keeps split(k, E): its noise is shared
    core2, obs2, r, _ = jax.vmap(env.step_core)(jax.random.split(k, num_episodes), core, a)
    live = (t_hit < 0) | (not stop_at_goal)
    core2 = jax.tree.map(lambda new, old: jnp.where(live.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
                         core2, core)
    t_hit = jnp.where(live & (t_hit < 0) & (r > 0), t, t_hit)
    return (core2, jnp.where(live[:, None], obs2, obs), ret + jnp.where(live, r, 0.0), t_hit), None

  init = (core, obs, jnp.zeros((num_episodes,), jnp.float32), jnp.full((num_episodes,), -1, jnp.int32))
  (_, _, ret, t_hit), _ = jax.lax.scan(body, init, (jnp.arange(steps), jax.random.split(k_run, steps)))
  return _episode_scores(ret, t_hit, steps, score)


def evaluate_bc(key: jax.Array, policy: BCPolicy, params: Any, env: Any, *, num_episodes: int,
                episode_steps: int | None = None, score: str = "return") -> jax.Array:
  """Episode scores [E] of the BC policy (its mean action), scored as `evaluate_skills`.

  Args:
    key: PRNG key.
    policy: the BCPolicy module.
    params: its params.
    env: the environment (reset_core, step_core, spec.max_episode_steps).
    num_episodes: E.
    episode_steps: episode length T (None: env.spec.max_episode_steps).
    score: 'return' (summed reward) or 'time_to_goal' (T - t at the first rewarded step, the episode stops there).

  Returns:
    float32 [E] episode scores.
  """
  return evaluate_policy(key, lambda k, obs: policy.apply({"params": params}, obs)[0], env,
                         num_episodes=num_episodes, episode_steps=episode_steps, score=score)


def evaluate_random(key: jax.Array, env: Any, *, num_episodes: int, episode_steps: int | None = None,
                    score: str = "return") -> jax.Array:
  """Episode scores [E] of the uniform random policy (actions ~ U[action_low, action_high]^A of env.spec, the
  policy D4RL's normalisation calls 0 and `rl.offline`'s 'random' data kind), scored as `evaluate_skills` from
  the same episode starts: the floor every arm is read against.

  Args:
    key: PRNG key.
    env: the environment (reset_core, step_core, spec with action_dim, action_low, action_high,
      max_episode_steps).
    num_episodes: E.
    episode_steps: episode length T (None: env.spec.max_episode_steps).
    score: 'return' or 'time_to_goal'.

  Returns:
    float32 [E] episode scores.

  Raises:
    ValueError: a discrete action space (this floor is for continuous control), or an unknown score.
  """
  spec = env.spec
  if spec.discrete:
    raise ValueError(f"evaluate_random draws continuous actions; {spec.name} has a discrete action space.")
  shape = (num_episodes, int(spec.action_dim))
  policy_fn = lambda k, obs: jax.random.uniform(k, shape, minval=spec.action_low,  # noqa: E731
                                                maxval=spec.action_high)
  return evaluate_policy(key, policy_fn, env, num_episodes=num_episodes, episode_steps=episode_steps, score=score)


def to_numpy(tree: Any) -> Any:
  """A pytree of device arrays as host numpy arrays (same structure)."""
  return jax.tree.map(np.asarray, jax.device_get(tree))
