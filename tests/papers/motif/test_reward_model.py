"""Motif reward model (`papers/motif/reward_model.py`): the preference loss by hand, label targets, shapes, the
official forward, a train step (1 vs 8 devices)."""
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from iclr24_jax.common import checks, sharding
from iclr24_jax.papers import motif
from iclr24_jax.papers.motif import toy


class _FirstByteReward(nn.Module):
  """r(message) = w[first byte]: lets a test set the rewards of a pair exactly."""

  @nn.compact
  def __call__(self, message):
    w = self.param("w", nn.initializers.zeros, (256,))
    return w[message[:, 0].astype(jnp.int32)]


def _pairs_batch():
  m1 = np.zeros((3, 8), np.uint8)
  m2 = np.zeros((3, 8), np.uint8)
  m1[:, 0], m2[:, 0] = 65, 66                                  # 'A' vs 'B' in every pair
  return {"message_1": m1, "message_2": m2, "label": np.array([0, 1, 2], np.int32)}


def test_preference_loss_hand_computed():
  model = _FirstByteReward()
  params = {"w": jnp.zeros(256).at[65].set(1.0)}               # r(A) = 1, r(B) = 0
  loss, m = jax.jit(lambda p, b: motif.preference_loss(p, b, model))(params, _pairs_batch())
  # label 0 (first better): -log softmax(1, 0)[0] = log(1 + e^-1) = 0.313262
  # label 1 (second better): -log softmax(1, 0)[1] = log(1 + e) = 1.313262
  # label 2 (tie, 0.5 / 0.5): (0.313262 + 1.313262) / 2 = 0.813262;  mean of the three = 0.813262
  np.testing.assert_allclose(loss, 0.813262, atol=1e-4)
  np.testing.assert_allclose(m["accuracy"], 0.5, atol=1e-6)   # decided pairs: label 0 right, label 1 wrong
  b = dict(_pairs_batch(), weight=np.array([1.0, 0.0, 0.0], np.float32))
  np.testing.assert_allclose(motif.preference_loss(params, b, model)[0], 0.313262, atol=1e-4)
  # all-equal rewards: log 2 whatever the labels
  np.testing.assert_allclose(motif.preference_loss({"w": jnp.zeros(256)}, _pairs_batch(), model)[0], np.log(2),
                             atol=1e-4)
  # the indexed form (unique messages + pair indices) gives the same loss
  idx = {"messages": np.stack([_pairs_batch()["message_1"][0], _pairs_batch()["message_2"][0]]),
         "pairs": np.array([[0, 1]] * 3), "label": np.array([0, 1, 2])}
  np.testing.assert_allclose(motif.preference_loss(params, idx, model)[0], loss, rtol=1e-6)
  with pytest.raises(ValueError, match="message_1"):
    motif.preference_loss(params, {"label": np.zeros(3)}, model)


def test_label_targets_official_convention():
  np.testing.assert_array_equal(motif.label_targets(jnp.array([0, 1, 2])), [0.0, 1.0, 0.5])
  # UNKOWN = 3 pairs are masked out of the official PairsDataset, so they are not a tie: a named error eagerly,
  # NaN targets under jit.
  with pytest.raises(checks.LabelError, match=r"\{0, 1, 2\}"):
    motif.label_targets(jnp.array([0, 3]))
  assert np.isnan(np.asarray(jax.jit(motif.label_targets)(jnp.array([0, 3])))).all()


_SMALL = motif.RewardModel(embed_dim=8, hidden=16, trunk=32)


def test_reward_model_shapes_and_nul_padding():
  params = jax.jit(lambda k: _SMALL.init(k, jnp.zeros((1, 256), jnp.uint8))["params"])(jax.random.key(0))
  msgs = jnp.asarray(motif.caption_bytes(["You kill the newt!", "", "It's a wall."]))
  r = jax.jit(_SMALL.apply)({"params": params}, msgs)
  chex.assert_shape(r, (3,))
  chex.assert_tree_all_finite(r)
  # padding_idx = 0: the NUL character embeds to zero and gets no gradient
  g = jax.jit(jax.grad(lambda p: jnp.sum(_SMALL.apply({"params": p}, msgs))))(params)
  emb_grad = g["message_cnn"]["char_embed"]["embedding"]
  np.testing.assert_array_equal(emb_grad[0], 0.0)
  assert np.abs(emb_grad[ord("Y")]).sum() > 0
  # official 'lt_cnn' sizes: 5 x 64 features into fc, 512-wide trunk
  full = jax.eval_shape(motif.init_params, jax.random.key(0))
  chex.assert_shape(full["message_cnn"]["fc"]["kernel"], (320, 128))
  chex.assert_shape(full["trunk_2"]["kernel"], (256, 512))
  with pytest.raises(ValueError, match="\\[B, L\\]"):
    _SMALL.apply({"params": params}, jnp.zeros((256,), jnp.uint8))


def _official_reward_forward(sd, messages):
  """numpy forward of the official reward model (rlaif/reward_model.py RewardSharedWeights with the 'lt_cnn'
  TorchBeastEncoder of rl_baseline/encoders_nle.py), in torch layout: Conv1d weights [out, in, k], Linear
  weights [out, in], channel-major Flatten."""
  def conv(x, name):                                          # nn.Conv1d, no padding: x [B, C, L]
    w, b = sd[name + ".weight"], sd[name + ".bias"]
    k = w.shape[-1]
    windows = np.stack([x[:, :, t:t + k] for t in range(x.shape[-1] - k + 1)], axis=-1)   # [B, C, k, L']
    return np.einsum("bckt,ock->bot", windows, w) + b[None, :, None]
  relu = lambda x: np.maximum(x, 0.0)
  def pool(x):                                                # nn.MaxPool1d(3, 3): floor mode
    n = x.shape[-1] // 3
    return x[:, :, :3 * n].reshape(x.shape[0], x.shape[1], n, 3).max(-1)
  linear = lambda x, name: x @ sd[name + ".weight"].T + sd[name + ".bias"]
  x = sd["encoder.char_lt.weight"][messages.astype(np.int64)].transpose(0, 2, 1)   # [B, E, 256]
  x = pool(relu(conv(x, "encoder.conv1")))                    # conv1, then conv2_6_fc: ReLU, MaxPool first
  x = pool(relu(conv(x, "encoder.conv2_6_fc.2")))
  for name in ("encoder.conv2_6_fc.5", "encoder.conv2_6_fc.7", "encoder.conv2_6_fc.9", "encoder.conv2_6_fc.11"):
    x = relu(conv(x, name))
  x = pool(x).reshape(x.shape[0], -1)                         # Flatten of [B, C, 5]: index c * 5 + l
  x = relu(linear(x, "encoder.conv2_6_fc.15"))
  x = linear(relu(linear(x, "encoder.fc.0")), "encoder.fc.2")
  return linear(relu(x), "reward_fn.1")[:, 0]


def test_reward_model_matches_official_forward():
  # Random weights in the official layout at the official sizes (E 32, H 64, encoder_hidden_dim 512); the
  # padding row 0 of the embedding is zero, as torch's padding_idx keeps it.
  rng = np.random.default_rng(0)
  shapes = {"encoder.char_lt.weight": (256, 32), "encoder.conv1.weight": (64, 32, 7),
            "encoder.conv2_6_fc.2.weight": (64, 64, 7), "encoder.conv2_6_fc.15.weight": (128, 320),
            "encoder.fc.0.weight": (256, 128), "encoder.fc.2.weight": (512, 256), "reward_fn.1.weight": (1, 512),
            "policy_head.weight": (3, 3)}                       # an unrelated key: ignored
  for i in (5, 7, 9, 11):
    shapes[f"encoder.conv2_6_fc.{i}.weight"] = (64, 64, 3)
  sd = {k: (rng.normal(0, 1, v) / np.sqrt(np.prod(v[1:]) if k != "encoder.char_lt.weight" else 1.0)).astype(
      np.float32) for k, v in shapes.items()}                   # unit-variance activations (fan-in scaling)
  for k in list(sd):
    if k.endswith(".weight") and k != "encoder.char_lt.weight" and k != "policy_head.weight":
      sd[k[:-len("weight")] + "bias"] = rng.normal(0, 0.1, sd[k].shape[0]).astype(np.float32)
  sd["encoder.char_lt.weight"][0] = 0.0
  msgs = motif.caption_bytes(["You kill the newt!", "", "It's a wall.", "Welcome to the Dungeons of Doom " * 6])
  params = motif.params_from_official(sd)
  ours = jax.jit(motif.RewardModel().apply)({"params": params}, jnp.asarray(msgs))
  ref = _official_reward_forward(sd, msgs)
  assert np.std(ref) > 1e-2                                   # distinct messages get distinct rewards
  np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="lacks"):
    motif.params_from_official({"encoder.char_lt.weight": sd["encoder.char_lt.weight"]})


def test_reward_step_lowers_loss_and_one_vs_eight_devices():
  msgs = motif.caption_bytes(toy.CAPTIONS)
  n = len(toy.CAPTIONS)
  pairs = np.array([(i, j) for i in range(n) for j in range(n) if i < j], np.int32)
  labels = np.array([toy.oracle_preference(toy.CAPTIONS[i], toy.CAPTIONS[j]) for i, j in pairs], np.int32)
  batch = {"messages": jnp.asarray(msgs), "pairs": jnp.asarray(pairs), "label": jnp.asarray(labels)}
  params = jax.jit(lambda k: _SMALL.init(k, jnp.zeros((1, 256), jnp.uint8))["params"])(jax.random.key(0))
  tx = optax.adam(3e-3)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(p, o, b):
    (loss, _), g = jax.value_and_grad(lambda q: motif.preference_loss(q, b, _SMALL), has_aux=True)(p)
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), o, loss

  opt, losses = tx.init(params), []
  p = params
  for _ in range(12):
    p, opt, loss = step(p, opt, batch)
    losses.append(float(loss))
  assert losses[-1] < losses[0] - 0.05, losses
  # the loss of a batch sharded over 8 devices equals the single-device loss
  mesh = sharding.make_mesh(devices=jax.devices()[:8])
  direct = {"message_1": msgs[pairs[:, 0]], "message_2": msgs[pairs[:, 1]], "label": labels}  # 120 pairs
  one = jax.jit(lambda q, b: motif.preference_loss(q, b, _SMALL)[0])(p, direct)
  spec = NamedSharding(mesh, P("data"))
  sharded = jax.tree.map(lambda x: jax.device_put(x, spec), direct)
  eight = jax.jit(lambda q, b: motif.preference_loss(q, b, _SMALL)[0])(p, sharded)
  np.testing.assert_allclose(eight, one, rtol=1e-5)
