"""Uni-O4 networks (`papers/unio4/model.py`) and the dynamics ensemble (`papers/unio4/dynamics.py`): shapes,
dtypes, bounds, termination functions."""
import chex
import jax
import jax.numpy as jnp

from iclr24_jax.papers import unio4


def test_shapes_and_dtypes():
  key = jax.random.key(0)
  obs, act = jnp.zeros((5, 4)), jnp.zeros((5, 2))
  pol = unio4.GaussianPolicy(2, (8,))
  d = pol.apply(pol.init(key, obs), obs)
  chex.assert_shape([d.mean, d.log_std], (5, 2))
  assert float(d.log_std.min()) >= -5.0 and float(d.log_std.max()) <= 0.0
  assert float(jnp.abs(d.mean).max()) <= 1.0
  q = unio4.QNetwork((8,), num_q=2)
  out = q.apply(q.init(key, obs, act), obs, act)
  chex.assert_shape(out, (2, 5))
  chex.assert_type(out, jnp.float32)
  member = unio4.DynamicsMember(5, (8,))
  params = {"members": jax.vmap(lambda k: member.init(k, jnp.zeros((1, 6)))["params"])(jax.random.split(key, 3)),
            "max_logvar": jnp.full((5,), 0.5), "min_logvar": jnp.full((5,), -10.0)}
  dyn = unio4.Dynamics(params, jnp.zeros(6), jnp.ones(6), jnp.asarray([0, 2]), member, "hopper")
  mean, logvar = jax.jit(lambda d: d.predict(obs, act))(dyn)
  chex.assert_shape([mean, logvar], (2, 5, 5))
  nxt, rew, term = jax.jit(lambda d: d.step(key, obs, act))(dyn)
  chex.assert_shape(nxt, (5, 4))
  chex.assert_shape([rew, term], (5,))
  assert term.dtype == jnp.bool_
  assert unio4.termination_for_env("brax/inverted_pendulum") == "inverted_pendulum"
  assert unio4.termination_for_env("gymnax/CartPole-v1") == "none"
