"""Helpers shared by the LDCQ test modules: a tiny skill VAE, learnable segments, a spec, twin Q nets."""
import jax
import jax.numpy as jnp

from iclr24_jax.diffusion.unet import MLPDenoiser
from iclr24_jax.papers import ldcq


def _tiny_vae(d=3, a=2, z=4):
  return ldcq.SkillVAE(d, a, z_dim=z, hidden=16, gru_layers=1)


def _segments(key, b=32, h=5, d=3, a=2):
  k1, k2, k3 = jax.random.split(key, 3)
  states = jax.random.normal(k1, (b, h, d))
  # actions a deterministic function of the state plus a per-segment offset (a learnable skill structure)
  offset = jax.random.normal(k2, (b, 1, a))
  actions = jnp.tanh(states[..., :a] + offset)
  return {"states": states, "actions": actions, "next_state": jax.random.normal(k3, (b, d))}


def _spec(vae, prior="gaussian", schedule="linear", hidden=16, q_hidden=16, **kw):
  return ldcq.LDCQSpec(vae=vae, denoiser=MLPDenoiser(hidden=hidden, num_blocks=2, time_embed_dim=32),
                       q_net=ldcq.QNetwork(q_hidden, (16, 8)), prior=prior, schedule=schedule, **kw)


def _q_setup(key, d=3, z=2):
  q_net = ldcq.QNetwork(16, (16, 8))
  params = ldcq.twin_q_init(key, q_net, d, z)
  return q_net, params
