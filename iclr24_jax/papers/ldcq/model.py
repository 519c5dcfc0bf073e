"""Networks of LDCQ: the skill beta-VAE, the twin latent Q-network and the plain BC policy.

SkillVAE (official models/skill_model.py, `SkillModel` with encoder_type='gru', policy_decoder_type=
'autoregressive', state_decoder_type='mlp', conditional_prior=True):
  encoder   q(z | s_{0:H}, a_{0:H}): state MLP embedding, concatenated with the actions, a bidirectional GRU; the
            features at the last time step give the mean and a softplus standard deviation of z.
  prior     p(z | s_0): MLP -> (mean, softplus std), the Gaussian "VAE prior".
  policy    pi(a | s, z), autoregressive over action dimensions: component i sees (s, a_{<i}, z) and outputs a
            Gaussian over a_i (teacher-forced with the data actions in training, sampled dimension by dimension
            when acting).
  terminal  p(s_H | s_0, z): MLP -> (mean, softplus std) per state dimension (the "abstract dynamics").
QNetwork is the official MLP_Q (state and latent embeddings with LayerNorm + GELU, then a 128-32-1 head);
the twin pair is one set of params stacked on a leading axis [2, ...] and evaluated with `jax.vmap`.
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

# Deviation: a tiny floor on every softplus standard deviation (the official code has none) keeps log-densities
# finite when a unit saturates in float32.
STD_FLOOR = 1e-4


def _std(x: jax.Array) -> jax.Array:
  return nn.softplus(x) + STD_FLOOR


class _MLP(nn.Module):
  """Dense-ReLU stack; the last layer is linear (no activation) when `linear_out`."""

  features: Sequence[int]
  linear_out: bool = False

  @nn.compact
  def __call__(self, x):
    for i, f in enumerate(self.features):
      x = nn.Dense(f)(x)
      if not (self.linear_out and i == len(self.features) - 1):
        x = nn.relu(x)
    return x


class _GaussianHead(nn.Module):
  """x -> 2 ReLU layers -> (mean, std) with separate 2-layer heads, as the official LowLevelPolicy / Prior."""

  hidden: int
  out_dim: int

  @nn.compact
  def __call__(self, x):
    h = _MLP((self.hidden, self.hidden))(x)
    mean = _MLP((self.hidden, self.out_dim), linear_out=True, name="mean")(h)
    std = _std(_MLP((self.hidden, self.out_dim), linear_out=True, name="std")(h))
    return mean, std


class SkillVAE(nn.Module):
  """The skill beta-VAE over H-step segments (see module docstring).

  Attributes:
    state_dim: D.
    action_dim: A.
    z_dim: Z (official 16).
    hidden: width of every layer (official h_dim 256).
    gru_layers: stacked bidirectional GRU layers (official 4).
    policy_type: 'autoregressive' (official default) or 'mlp' (one Gaussian over all action dimensions).
  """

  state_dim: int
  action_dim: int
  z_dim: int = 16
  hidden: int = 256
  gru_layers: int = 4
  policy_type: str = "autoregressive"

  def setup(self):
    if self.policy_type not in ("autoregressive", "mlp"):
      raise ValueError(f"unknown policy_type '{self.policy_type}'; choose 'autoregressive' or 'mlp'.")
    h = self.hidden
    self.enc_embed = _MLP((h, h))
    self.enc_rnn = [nn.Bidirectional(nn.RNN(nn.GRUCell(h)), nn.RNN(nn.GRUCell(h))) for _ in range(self.gru_layers)]
    self.enc_mean = _MLP((h, self.z_dim), linear_out=True)
    self.enc_std = _MLP((h, self.z_dim), linear_out=True)
    self.prior_net = _GaussianHead(h, self.z_dim)
    if self.policy_type == "autoregressive":
      self.policy_heads = [_GaussianHead(h, 1) for _ in range(self.action_dim)]
    else:
      self.policy_heads = [_GaussianHead(h, self.action_dim)]
    self.terminal_net = _GaussianHead(h, self.state_dim)

  def encode(self, states: jax.Array, actions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """q(z | segment).

    Args:
      states: [B, H, D]; actions: [B, H, A].

    Returns:
      (mean [B, Z], std [B, Z]).
    """
    x = jnp.concatenate([self.enc_embed(states), actions], axis=-1)
    for rnn in self.enc_rnn:
      x = rnn(x)                                   # [B, H, 2h]: forward and backward features
    last = x[:, -1]                                # official: feats[:, -1:] of the bidirectional GRU
    return self.enc_mean(last), _std(self.enc_std(last))

  def prior(self, s0: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The Gaussian prior p(z | s_0): s0 [..., D] -> (mean, std) [..., Z]."""
    return self.prior_net(s0)

  def policy(self, states: jax.Array, z: jax.Array, actions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """pi(a | s, z) teacher-forced on `actions` (component i conditions on actions[..., :i]).

    Args:
      states: [..., D]; z: [..., Z] (broadcast against states' leading axes); actions: [..., A].

    Returns:
      (mean, std) [..., A].
    """
    z = jnp.broadcast_to(z, states.shape[:-1] + z.shape[-1:])
    if self.policy_type == "mlp":
      return self.policy_heads[0](jnp.concatenate([states, z], -1))
    means, stds = [], []
    for i, head in enumerate(self.policy_heads):
      m, s = head(jnp.concatenate([states, actions[..., :i], z], -1))
      means.append(m)
      stds.append(s)
    return jnp.concatenate(means, -1), jnp.concatenate(stds, -1)

  def sample_action(self, key: jax.Array, states: jax.Array, z: jax.Array, deterministic: bool = False
                    ) -> jax.Array:
    """Draws a ~ pi(. | s, z) dimension by dimension (the mean when deterministic).

    Args:
      key: randomness; states: [B, D]; z: [B, Z].

    Returns:
      actions [B, A] (unclipped, as the official numpy_policy; the env clips).
    """
    if self.policy_type == "mlp":
      m, s = self.policy_heads[0](jnp.concatenate([states, z], -1))
      return m if deterministic else m + s * jax.random.normal(key, m.shape)
    acts = []
    keys = jax.random.split(key, self.action_dim)
    for i, head in enumerate(self.policy_heads):
      m, s = head(jnp.concatenate([states] + acts + [z], -1))
      acts.append(m if deterministic else m + s * jax.random.normal(keys[i], m.shape))
    return jnp.concatenate(acts, -1)

  def terminal(self, s0: jax.Array, z: jax.Array) -> tuple[jax.Array, jax.Array]:
    """p(s_H | s_0, z): (mean, std) [..., D].

    Args:
      s0: [..., D] segment start states.
      z: [..., Z] skill latents.

    Returns:
      (mean [..., D], std [..., D]) of the terminal state.
    """
    return self.terminal_net(jnp.concatenate([s0, z], -1))

  def __call__(self, states, actions):
    """Touches every submodule (for `init`): returns (posterior mean, prior mean, action mean, terminal mean)."""
    mean, _ = self.encode(states, actions)
    pm, _ = self.prior(states[:, 0])
    am, _ = self.policy(states, mean[:, None], actions)
    tm, _ = self.terminal(states[:, 0], mean)
    return mean, pm, am, tm


class QNetwork(nn.Module):
  """Q(s, z) -> [B] (official MLP_Q: h-h state MLP and h/2-h/2 latent MLP with LayerNorm + GELU, 128-32-1 head).

  Attributes:
    hidden: h (official 256).
    head: widths of the output MLP before the final linear unit (official (128, 32)).
  """

  hidden: int = 256
  head: tuple[int, ...] = (128, 32)

  @nn.compact
  def __call__(self, s: jax.Array, z: jax.Array) -> jax.Array:
    def block(x, widths):
      for w in widths:
        x = nn.gelu(nn.LayerNorm()(nn.Dense(w)(x)), approximate=False)
      return x

    h = jnp.concatenate([block(s, (self.hidden, self.hidden)), block(z, (self.hidden // 2, self.hidden // 2))], -1)
    h = block(h, tuple(self.head))
    return nn.Dense(1)(h)[..., 0]


class BCPolicy(nn.Module):
  """The behaviour-cloning baseline: a Gaussian MLP policy pi(a | s) (ReLU hidden layers)."""

  action_dim: int
  hidden: int = 256
  num_layers: int = 2

  @nn.compact
  def __call__(self, s: jax.Array) -> tuple[jax.Array, jax.Array]:
    h = _MLP((self.hidden,) * self.num_layers)(s)
    return nn.Dense(self.action_dim)(h), _std(nn.Dense(self.action_dim)(h))


def twin_q_init(key: jax.Array, q_net: QNetwork, state_dim: int, z_dim: int) -> Any:
  """Two independently initialised Q params stacked on a leading axis [2, ...].

  Args:
    key: PRNG key.
    q_net: the QNetwork module.
    state_dim: D.
    z_dim: Z.

  Returns:
    params pytree whose leaves have a leading axis of 2.
  """
  keys = jax.random.split(key, 2)
  return jax.vmap(lambda k: q_net.init(k, jnp.zeros((1, state_dim)), jnp.zeros((1, z_dim)))["params"])(keys)


def twin_q_apply(q_net: QNetwork, q_params: Any, s: jax.Array, z: jax.Array) -> jax.Array:
  """Both Q values: q_params [2, ...], s [B, D], z [B, Z] -> [2, B].

  Args:
    q_net: the QNetwork module.
    q_params: twin params (leaves [2, ...]).
    s: [B, D] states.
    z: [B, Z] latents.

  Returns:
    [2, B] float32 Q values.
  """
  return jax.vmap(lambda p: q_net.apply({"params": p}, s, z))(q_params)
