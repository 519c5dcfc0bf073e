"""FPS's image prior (`papers/fps/model.py`): the prior's diffusion train step lowers the loss."""
import chex
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.configs import fps as fps_config
from iclr24_jax.papers.fps import programs
from .helpers import SCHED


def test_prior_train_step_lowers_loss():
  import optax
  from iclr24_jax.diffusion import train, unet
  cfg = fps_config.get_config("tiny_images")
  model = unet.create_model(cfg.model)
  x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (16, 16, 16, 1)), jnp.float32)
  tx = optax.adam(3e-3)
  state0 = jax.jit(lambda k: train.init(k, model, (16, 16, 1), tx))(jax.random.key(0))
  traced_step = chex.assert_max_traces(train.make_train_step(model, SCHED), n=1)
  # one compile at XLA level 0 (compile-bound on CPU; values agree with the default level to rounding)
  step = programs.compile_call(jax.jit(traced_step), state0, {"x": x}, jax.random.key(1))
  state = state0
  for _ in range(20):
    state, _ = step(state, {"x": x}, jax.random.key(1))   # the step folds state.step into the key
  # the same fixed (t, eps) draw before and after training
  loss_fn = jax.jit(lambda p: train.diffusion_loss(lambda xt, t: model.apply({"params": p}, xt, t), x,
                                                      jax.random.key(9), SCHED)[0])
  loss = programs.compile_call(loss_fn, state0.params)
  assert float(loss(state.params)) < float(loss(state0.params))
