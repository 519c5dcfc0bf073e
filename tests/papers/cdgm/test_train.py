"""C-DGM training (`papers/cdgm/train.py`): several seeds in one program equal one fit per seed."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers.cdgm import model as model_lib
from iclr24_jax.papers.cdgm import train as train_lib
from .helpers import _adam


def test_fit_seeds_matches_one_fit_per_seed(generated_setup):
  table, tf, enc, layer = generated_setup
  # Unconstrained: the seed axis is what is tested, and the layer-free step compiles in a fraction of the time.
  m = model_lib.TVAE(tf, None, "unconstrained", _adam(1e-3), embedding_dim=8, compress_dims=(16,),
                     decompress_dims=(16,), batch_size=50)
  data = {"x": jnp.asarray(enc)}
  keys = jax.vmap(jax.random.key)(jnp.arange(3))
  many = train_lib.fit_seeds(m, data, 12, keys, log_every=6)          # two chunks of 6: one compilation
  assert jax.tree.leaves(many.state.params)[0].shape[0] == 3
  assert [r["step"] for r in many.history] == [6, 12] and len(many.history[0]["train/loss"]) == 3
  one = train_lib.fit(m, data, 12, jax.random.key(2), log_every=6).state
  chex.assert_trees_all_close(jax.tree.map(lambda x: x[2], many.state.params), one.params, rtol=1e-4, atol=1e-5)
  other = jax.tree.map(lambda x: x[0], many.state.params)              # another seed: really another run
  assert not np.allclose(np.asarray(other["sigma"]), np.asarray(one.params["sigma"])) or not np.allclose(
      np.asarray(jax.tree.leaves(other)[0]), np.asarray(jax.tree.leaves(one.params)[0]))
  with pytest.raises(ValueError, match=r"\[S\] array of keys"):
    train_lib.fit_seeds(m, data, 2, jax.random.key(0))
