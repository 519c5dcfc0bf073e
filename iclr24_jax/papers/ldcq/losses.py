"""LDCQ's losses: the skill beta-VAE, the latent diffusion prior, the batch-constrained Q target, behaviour cloning.

  vae_loss               action NLL + beta KL(q(z|tau) || p(z|s_0)) / H + terminal-state NLL / H   (Sec. 4.1)
  latent_diffusion_loss  x0-prediction DDPM loss with min(SNR, 5) weighting on (s_0, z) pairs       (Sec. 4.2)
  q_target               r_{0:H} + gamma^H (1 - done) min_j Q'_j(s_H, z*), z* = argmax over latents sampled
                         from the prior at s_H (batch-constrained)                                   (Eq. 6, Alg. 1)
  bc_loss                Gaussian NLL of the data actions (the BC baseline)
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import checks
from iclr24_jax.diffusion import train as diff_training
from iclr24_jax.diffusion.schedules import Schedule
from iclr24_jax.papers.ldcq.model import BCPolicy, QNetwork, SkillVAE, twin_q_apply

LOG_2PI = jnp.log(2.0 * jnp.pi)


def gaussian_log_prob(x: jax.Array, mean: jax.Array, std: jax.Array) -> jax.Array:
  """Elementwise log N(x; mean, std^2) (same shape as x).

  Args:
    x: values, any shape.
    mean: means, broadcastable to x.
    std: standard deviations (> 0), broadcastable to x.

  Returns:
    log-densities of the broadcast shape (NaN under jit where std <= 0; eager calls raise).
  """
  ok = checks.require("ldcq.gaussian_log_prob", checks.xp(std).asarray(std) > 0, checks.HyperparameterError,
                      "std must be > 0.")
  return checks.poison(-0.5 * (((x - mean) / std) ** 2 + LOG_2PI) - jnp.log(std), ok)


def gaussian_kl(mean_q: jax.Array, std_q: jax.Array, mean_p: jax.Array, std_p: jax.Array) -> jax.Array:
  """Elementwise KL(N(mean_q, std_q^2) || N(mean_p, std_p^2)).

  Args:
    mean_q: q's means, any shape.
    std_q: q's standard deviations (> 0).
    mean_p: p's means (broadcastable).
    std_p: p's standard deviations (> 0).

  Returns:
    KL values (>= 0) of the broadcast shape (not summed); NaN under jit where a std is <= 0 (eager calls raise).
  """
  where = "ldcq.gaussian_kl"
  ok = checks.all_ok(
      checks.require(where, checks.xp(std_q).asarray(std_q) > 0, checks.HyperparameterError, "std_q must be > 0."),
      checks.require(where, checks.xp(std_p).asarray(std_p) > 0, checks.HyperparameterError, "std_p must be > 0."))
  return checks.poison(jnp.log(std_p / std_q) + (std_q ** 2 + (mean_q - mean_p) ** 2) / (2.0 * std_p ** 2) - 0.5,
                       ok)


def _check_segments(states: jax.Array, actions: jax.Array, where: str = "ldcq.vae_loss") -> None:
  checks.shapes(where, states=(states, "B H D"), actions=(actions, "B H A"))
  checks.nonempty(where, "states", np.shape(states)[0], "segments")
  checks.nonempty(where, "states", np.shape(states)[1], "steps per segment (H)")


def vae_loss(params: Any, vae: SkillVAE, batch: dict[str, jax.Array], key: jax.Array, *, beta: float = 0.05,
             terminal_loss: bool = True) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The skill VAE's negative ELBO on a batch of H-step segments (official SkillModel.get_losses).

  loss = -mean_{b,t} sum_a log pi(a_t | s_t, z) + beta * mean_b sum_z KL(q(z|tau) || p(z|s_0)) / H
         [+ -mean_b sum_d log p(s_H | s_0, sg(z)) / H]                     # Eq. (2) of the paper, official scaling

  Args:
    params: the SkillVAE params.
    vae: the module.
    batch: states [B, H, D], actions [B, H, A]; with terminal_loss also next_state [B, D] (s_H).
    key: draws z ~ q(z | tau) (reparameterised).
    beta: the KL weight (official 0.05).
    terminal_loss: add the terminal-state (abstract dynamics) NLL; z is stopped there as in the official code.

  Returns:
    (loss, metrics: loss, action_nll, kl, terminal_nll).
  """
  states, actions = batch["states"], batch["actions"]
  _check_segments(states, actions)
  if terminal_loss:
    checks.shapes("ldcq.vae_loss", states=(states, "B H D"), next_state=(batch.get("next_state"), "B D"))
  checks.in_range("ldcq.vae_loss", "beta", beta, 0.0, None, hint="the KL weight (official 0.05).")
  horizon = states.shape[1]

  def fwd(vae_mod):
    mean_q, std_q = vae_mod.encode(states, actions)
    z = mean_q + std_q * jax.random.normal(key, mean_q.shape)
    a_mean, a_std = vae_mod.policy(states, z[:, None], actions)
    mean_p, std_p = vae_mod.prior(states[:, 0])
    out = {"action_nll": -jnp.mean(jnp.sum(gaussian_log_prob(actions, a_mean, a_std), -1)),
           "kl": jnp.mean(jnp.sum(gaussian_kl(mean_q, std_q, mean_p, std_p), -1)) / horizon}
    if terminal_loss:
      t_mean, t_std = vae_mod.terminal(states[:, 0], jax.lax.stop_gradient(z))
      out["terminal_nll"] = -jnp.mean(jnp.sum(gaussian_log_prob(batch["next_state"], t_mean, t_std), -1)) / horizon
    return out

  m = nn.apply(fwd, vae)({"params": params})
  loss = m["action_nll"] + beta * m["kl"] + m.get("terminal_nll", 0.0)
  return loss, {"loss": loss, **m}


def latent_diffusion_loss(params: Any, denoiser: Any, schedule: Schedule, states: jax.Array, latents: jax.Array,
                          key: jax.Array, *, min_snr_gamma: float = 5.0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The latent diffusion prior's loss: x0-prediction, weight min(SNR_t, 5) (official loss_on_batch, predict_noise=0).

  L = E_{t, eps} [ min(SNR_t, gamma) * mean_z (f(z_t, t, s_0) - z)^2 ],  z_t = sqrt(abar_t) z + sqrt(1 - abar_t) eps.

  Args:
    params: the denoiser's params.
    denoiser: an `MLPDenoiser` called as denoiser(z_t, t, cond=s_0).
    schedule: the DDPM schedule.
    states: [B, D] the segments' first states s_0 (the condition).
    latents: [B, Z] the encoder's posterior means (the official diffusion training data).
    key: draws t and eps.
    min_snr_gamma: gamma of min-SNR (official 5).

  Returns:
    (loss, aux of `diffusion_loss`).
  """
  where = "ldcq.latent_diffusion_loss"
  checks.shapes(where, states=(states, "B D"), latents=(latents, "B Z"))
  checks.nonempty(where, "states", np.shape(states)[0], "segments")
  checks.in_range(where, "min_snr_gamma", min_snr_gamma, 0.0, None, low_open=True, hint="min-SNR's gamma "
                  "(official 5).")
  fn = lambda z_t, t: denoiser.apply({"params": params}, z_t, t, cond=states)  # noqa: E731
  return diff_training.diffusion_loss(fn, latents, key, schedule, prediction="x0", weighting="min_snr",
                                      min_snr_gamma=min_snr_gamma)


def q_target(q_net: QNetwork, target_params: Any, rewards: jax.Array, next_states: jax.Array,
             next_latents: jax.Array, dones: jax.Array, *, discount: float) -> dict[str, jax.Array]:
  """The batch-constrained double-Q target of both Q-networks (official DDQN.learn with PER).

  For net j the maximising latent is chosen by the *other* target net among the K latents sampled from the
  prior at s_H (official get_max_skills(net=1-j)), and valued by the minimum of both target nets:
    z*_j = argmax_k Q'_{1-j}(s_H, z_k),   y_j = r + discount * (1 - done) * min(Q'_0, Q'_1)(s_H, z*_j).
  Only the given latents can be chosen: the max never leaves the prior's support.   # Eq. (6)

  Compile it once (q_net is static; a traced discount is allowed):

    target_fn = jax.jit(functools.partial(ldcq.q_target, q_net))
    out = target_fn(target_params, rewards, next_states, next_latents, dones, discount=0.99 ** 10)

  Args:
    q_net: the Q module.
    target_params: twin target params [2, ...].
    rewards: [B] the segment's (discounted) reward sum r_{0:H}.
    next_states: [B, D] s_H.
    next_latents: [B, K, Z] latents sampled from the prior at s_H.
    dones: [B] 1 where the segment ended in a terminal state (0 / 1, float or bool).
    discount: gamma^H in [0, 1].

  Returns:
    dict(targets [2, B], z_star [2, B, Z], index [2, B] (the chosen k), q_next [2, B, K]). A discount outside
    [0, 1] or dones outside {0, 1} raise named errors eagerly (a Python discount always) and give NaN targets
    under jit / vmap; NaN rewards give NaN targets.
  """
  where = "ldcq.q_target"
  checks.shapes(where, rewards=(rewards, "B"), next_states=(next_states, "B D"), next_latents=(next_latents, "B K Z"),
                dones=(dones, "B"))
  checks.nonempty(where, "next_latents", np.shape(next_latents)[1], "latents per state (K)")
  ok = checks.all_ok(
      checks.in_range(where, "discount", discount, 0.0, 1.0, hint="gamma^H of the H-step target."),
      checks.labels_in(where, "dones", dones, (0, 1), "1 where the segment ended in a terminal state."))
  b, k, zd = next_latents.shape
  s_rep = jnp.repeat(next_states, k, axis=0)
  q_next = twin_q_apply(q_net, target_params, s_rep, next_latents.reshape(b * k, zd)).reshape(2, b, k)
  index = jnp.argmax(q_next[::-1], axis=-1)                       # net j selects with target net 1 - j
  q_min = jnp.minimum(q_next[0], q_next[1])                       # [B, K]
  value = jnp.take_along_axis(q_min[None], index[..., None], axis=-1)[..., 0]   # [2, B]
  targets = rewards[None] + discount * (1.0 - dones.astype(jnp.float32))[None] * value
  z_star = jnp.take_along_axis(next_latents[None], index[..., None, None], axis=2)[:, :, 0]
  out = {"targets": jax.lax.stop_gradient(targets), "z_star": z_star, "index": index, "q_next": q_next}
  return checks.poison(out, ok, int_fill=-1)


def bc_loss(params: Any, policy: BCPolicy, states: jax.Array, actions: jax.Array
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Behaviour cloning: -mean_b sum_a log pi(a | s) for states [B, D], actions [B, A].

  Args:
    params: BCPolicy params (differentiated).
    policy: the BCPolicy module (-> mean [B, A], std [B, A]).
    states: [B, D] float32.
    actions: [B, A] float32 data actions.

  Returns:
    (scalar loss, {'loss': loss}).
  """
  checks.shapes("ldcq.bc_loss", states=(states, "B D"), actions=(actions, "B A"))
  mean, std = policy.apply({"params": params}, states)
  loss = -jnp.mean(jnp.sum(gaussian_log_prob(actions, mean, std), -1))
  return loss, {"loss": loss}

