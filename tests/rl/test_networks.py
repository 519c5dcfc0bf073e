"""Actor-critic networks (`rl/networks.py`): shapes and squashing."""
import chex
import jax
import jax.numpy as jnp
import pytest

from iclr24_jax.rl import distributions


@pytest.mark.parametrize("squash,cls", [("tanh", distributions.TanhGaussian), ("clip", distributions.ClippedGaussian),
                                        ("none", distributions.Gaussian)])
def test_gaussian_actor_critic_shapes(squash, cls):
  from iclr24_jax.rl import networks
  model = networks.make_actor_critic(False, 3, {"squash": squash, "policy_hidden": (8,), "value_hidden": (8,)})
  obs = jnp.ones((5, 4))
  params = model.init(jax.random.key(0), obs)["params"]
  assert set(params) == {"policy", "value"}
  dist, value = model.apply({"params": params}, obs)
  assert isinstance(dist, cls)
  chex.assert_shape(dist.mean, (5, 3))
  chex.assert_shape(value, (5,))
  raw = dist.sample(jax.random.key(1))
  act = dist.to_env(raw)
  assert float(jnp.max(jnp.abs(act))) <= (1.0 if squash != "none" else float("inf"))
  chex.assert_shape(dist.log_prob(raw), (5,))
