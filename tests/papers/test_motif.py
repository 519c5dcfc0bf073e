"""Motif (Klissarov, D'Oro et al., ICLR 2024): the answer parser on official and malformed answers, the
preference loss against hand-computed numbers, the intrinsic reward's threshold and count decay, the episodic
counter and the NetHack reward hook, the annotation cache across an interrupted run, the order-debiased judge,
the toy world's events and oracle, a reward-model step that lowers the loss, 1 vs 8 devices, and smoke runs."""
import json
import os

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
from iclr24_jax.papers.motif import annotation, experiment, intrinsic, reward_model, toy, train
from iclr24_jax.rl import ppo
from iclr24_jax.rl import rollout as rollout_lib


# ----------------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("text, expected", [
    ('Analysis ... Finally, ("best_description": 1)', 0),
    ('("best_description": 2)', 1),
    ('("best_description": None)', 2),
    ('{"best_description": none}', 2),
    ('BEST_DESCRIPTION: 2', 1),
    ('the best description is 1.', 0),          # one free word between the key and the answer (official regex)
    ('Best_Description":1 and later ("best_description": 2)', 0),  # the first answer counts
])
def test_parse_preference_official_formats(text, expected):
  assert motif.parse_preference(text) == expected


@pytest.mark.parametrize("text", ["", "I prefer the first one.", "1", '("best_description": 3)',
                                  '("best_message": 1)', "best_description", None, 12])
def test_parse_preference_malformed_is_none(text):
  assert motif.parse_preference(text) is None


def test_annotation_prompt_fields_and_errors():
  p = motif.annotation_prompt("You kill the newt!", "It's a wall.", "defaultgoal")
  assert '"description_1":\n"You kill the newt!"' in p and '"description_2":\n"It\'s a wall."' in p
  assert annotation.GOALS["defaultgoal"] in p and '("best_description": None)' in p
  assert "reach the treasure" in motif.annotation_prompt("a", "b", "reach the treasure")  # free-text task
  with pytest.raises(TypeError, match="str"):
    motif.annotation_prompt(b"bytes", "x")
  assert motif.label_from_margin(0.3, 0.1) == 0 and motif.label_from_margin(-0.3, 0.1) == 1
  assert motif.label_from_margin(0.05, 0.1) == 2
  with pytest.raises(ValueError, match="finite"):
    motif.label_from_margin(float("nan"), 0.1)


# ------------------------------------------------------------------------------------------ loss by hand
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


# ----------------------------------------------------------------------------------------- reward model
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


# ------------------------------------------------------------------------------------- intrinsic reward
def test_fit_normalisation_hand_computed():
  mu, sigma, q = motif.fit_normalisation([1.0, 2.0, 3.0, 4.0], levels=(0.0, 0.5, 1.0))
  # mu = 2.5, sigma = sqrt(((1.5^2 + 0.5^2) * 2) / 4) = sqrt(1.25) = 1.118034; extremes +-1.5 / 1.118 = +-1.341641
  np.testing.assert_allclose([mu, sigma], [2.5, 1.118034], rtol=1e-6)
  np.testing.assert_allclose(q, [-1.341641, 0.0, 1.341641], rtol=1e-5)
  mu_w, sigma_w, _ = motif.fit_normalisation([1.0, 2.0, 3.0, 4.0], weights=[2, 0, 0, 2])
  np.testing.assert_allclose([mu_w, sigma_w], [2.5, 1.5], rtol=1e-6)
  assert len(motif.fit_normalisation(np.arange(10.0))[2]) == 19          # the official 0.05 ... 0.95 grid
  with pytest.raises(ValueError, match="constant"):
    motif.fit_normalisation([2.0, 2.0])
  with pytest.raises(ValueError, match="finite"):
    motif.fit_normalisation([1.0, np.nan])


def test_threshold_any_quantile():
  x = np.arange(11.0)
  assert intrinsic.threshold(x, 0.37) == pytest.approx(3.7)   # not one of the saved quantiles: no crash
  assert intrinsic.threshold(x, None) == float("-inf")
  with pytest.raises(ValueError, match="quantile"):
    intrinsic.threshold(x, 1.5)


def test_intrinsic_reward_threshold_and_count_decay():
  r = jnp.array([3.0, 1.0, 2.5, 2.0, 3.0])
  counts = jnp.array([1, 1, 2, 1, 3])
  out = jax.jit(motif.intrinsic_reward)(r, 1.0, 2.0, 0.5, counts, 3.0)
  # r_hat = (r - 1) / 2 = [1, 0, 0.75, 0.5, 1]; r_hat > 0.5 strictly -> [1, 0, 0.75, 0, 1]
  # / counts^3 = [1, 1, 8, 1, 27] -> [1, 0, 0.09375, 0, 0.037037]
  np.testing.assert_allclose(out, [1.0, 0.0, 0.09375, 0.0, 1.0 / 27], rtol=1e-6)
  np.testing.assert_allclose(motif.intrinsic_reward(r, 1.0, 2.0, -np.inf, jnp.ones(5), 3.0)[1], 0.0)
  np.testing.assert_allclose(motif.combine_rewards(jnp.array([2.0]), jnp.array([3.0]), 0.1, 0.5), [1.7], rtol=1e-6)
  with pytest.raises(ValueError, match="same shape"):
    motif.intrinsic_reward(r, 0.0, 1.0, 0.0, jnp.ones(3))


def test_episode_counter_resets_on_done():
  c = motif.EpisodeMessageCounter(2)
  counts = c.update([["a", "a"], ["a", "b"], ["a", "a"]], np.array([[0, 1], [0, 0], [0, 0]], bool))
  np.testing.assert_array_equal(counts, [[1, 1], [2, 1], [3, 1]])
  np.testing.assert_array_equal(c.update([["a", "a"]], np.array([[1, 0]], bool)), [[4, 2]])   # persists
  np.testing.assert_array_equal(c.update([["a", "a"]], np.zeros((1, 2), bool)), [[1, 3]])
  with pytest.raises(ValueError, match="done"):
    c.update([["a", "a"]], np.zeros((2, 2), bool))


def test_motif_reward_hook_batches():
  calls = []

  def reward_fn(msgs):
    calls.append(len(msgs))
    return msgs[:, 0].astype(np.float64) - 65.0           # 'A' -> 0, 'B' -> 1, 'C' -> 2

  def buf(ch):
    b = np.zeros(256, np.uint8)
    b[0] = ord(ch)
    return b

  msgs = np.stack([[buf("C"), buf("B")], [buf("C"), buf("A")]])            # [T=2, N=2, 256]
  batch = {"next_obs": {"message": msgs}, "obs": {"message": msgs}, "reward": np.array([[1.0, 0], [0, 0]]),
           "terminated": np.array([[False, True], [False, False]]), "truncated": np.zeros((2, 2), bool)}
  hook = motif.MotifRewardHook(reward_fn, mu=0.0, sigma=1.0, eps=0.5, num_envs=2, beta=3.0, alpha_ext=0.5,
                               alpha_int=1.0)
  out = hook(batch)
  # env 0: C (r_hat 2, count 1) then C again (count 2 -> 2 / 8); env 1: B (1, count 1), episode ends, A (0 <= eps)
  np.testing.assert_allclose(out, [[0.5 * 1 + 2.0, 1.0], [2.0 / 8, 0.0]], rtol=1e-6)
  assert sum(calls) == 3                                      # three distinct messages, each scored once
  out2 = hook(batch)                                          # counts persist across batches: C is now 3rd, 4th
  np.testing.assert_allclose(out2[:, 0], [0.5 + 2.0 / 27, 2.0 / 64], rtol=1e-6)
  assert sum(calls) == 3                                      # cached
  with pytest.raises(ValueError, match="source"):
    motif.MotifRewardHook(reward_fn, 0.0, 1.0, 0.0, 2, source="state")


def _official_total_reward(r_env, r_phi, counts, mu, var, eps, reward_scale, reward_clip, extrinsic_reward,
                           llm_reward, beta):
  """numpy reference of the official Motif reward: sample-factory actor_worker.py:458-459 scales and clips the
  game reward; learner.py:782-793 normalises r_phi, thresholds it, divides by count^beta and adds it unscaled."""
  r_ext = np.clip(np.asarray(r_env) * reward_scale, -reward_clip, reward_clip)
  llm = (np.asarray(r_phi) - mu) / var ** 0.5
  llm = (llm > eps) * llm
  return extrinsic_reward * r_ext + llm_reward * llm * (1.0 / np.asarray(counts, np.float64) ** beta)


class _FakeVecEnv:
  num_envs = 2


@pytest.mark.parametrize("variant, extrinsic_reward, llm_reward", [("nethack", 0.1, 0.1),
                                                                    ("nethack,staircase_weights", 10.0, 0.1)])
def test_host_ppo_reward_is_the_official_formula(variant, extrinsic_reward, llm_reward):
  from iclr24_jax.configs import motif as cfg_mod
  from iclr24_jax.papers.motif import nethack_motif
  from iclr24_jax.rl import ppo_host
  c = cfg_mod.get_config(variant)
  agent_cfg = nethack_motif.agent_config(c)
  assert (agent_cfg.ppo.reward_scale, agent_cfg.ppo.reward_clip) == (0.1, 10.0)   # official run's values
  alpha_ext, alpha_int = ((c.intrinsic.alpha_ext, c.intrinsic.alpha_int) if "staircase" in variant
                          else (c.nethack.alpha_ext, c.nethack.alpha_int))
  assert (alpha_ext, alpha_int) == (extrinsic_reward, llm_reward)

  def buf(ch):
    b = np.zeros(256, np.uint8)
    b[0] = ord(ch)
    return b

  msgs = np.stack([[buf("C"), buf("B")], [buf("C"), buf("A")]])            # r_phi: C 2, B 1, A 0
  r_env = np.array([[150.0, -3.0], [20.0, 0.0]], np.float32)               # 150 * 0.1 = 15 is clipped to 10
  batch = {"next_obs": {"message": msgs}, "obs": {"message": msgs}, "reward": r_env,
           "terminated": np.array([[False, True], [False, False]]), "truncated": np.zeros((2, 2), bool)}
  hook = motif.MotifRewardHook(lambda m: m[:, 0].astype(np.float64) - 65.0, mu=0.5, sigma=1.5, eps=0.1,
                               num_envs=2, beta=3.0, alpha_ext=alpha_ext, alpha_int=alpha_int)
  agent = ppo_host.HostPPO(agent_cfg, _FakeVecEnv(), model=None, reward_hook=hook)
  got = agent.rewards(batch)
  # counts: env 0 sees C twice (1, 2); env 1 sees B, its episode ends, then A (1, 1)
  ref = _official_total_reward(r_env, [[2.0, 1.0], [2.0, 0.0]], [[1, 1], [2, 1]], mu=0.5, var=1.5 ** 2, eps=0.1,
                               reward_scale=0.1, reward_clip=10.0, extrinsic_reward=extrinsic_reward,
                               llm_reward=llm_reward, beta=3.0)
  np.testing.assert_allclose(got, ref, rtol=1e-6)
  # by hand (NetHackScore weights): 0.1 * clip(15) + 0.1 * 1 = 1.1; 0.1 * -0.3 + 0.1 * (1 / 3) = 0.003333;
  # 0.1 * 2 + 0.1 * 1 / 8 = 0.2125; A: r_hat -1/3 <= eps -> 0
  if variant == "nethack":
    np.testing.assert_allclose(got, [[1.1, 0.0033333], [0.2125, 0.0]], rtol=1e-4, atol=1e-7)
  no_hook = ppo_host.HostPPO(agent_cfg, _FakeVecEnv(), model=None)
  np.testing.assert_allclose(no_hook.rewards(batch), [[10.0, -0.3], [2.0, 0.0]], rtol=1e-6)


# ------------------------------------------------------------------------------------------ annotation
def test_annotation_cache_survives_interrupted_run(tmp_path):
  path = str(tmp_path / "ann.jsonl")
  values = {"a": 0.0, "b": 1.0, "c": 2.0, "d": 3.0, "e": 4.0}
  pairs = [("a", "b"), ("c", "a"), ("d", "e"), ("a", "a"), ("b", "e"), ("c", "d"), ("a", "b")]

  class Crashing(motif.OracleJudge):
    def __call__(self, ps, task):
      if self.calls >= 1:
        raise RuntimeError("killed")
      return super().__call__(ps, task)

  with pytest.raises(RuntimeError, match="killed"):
    motif.annotate_pairs(pairs, "task", Crashing(values.get), "fake", motif.AnnotationCache(path), chunk_size=2)
  with open(path, "a") as f:
    f.write('{"key": "cut mid-wri')                          # a line cut by the interruption
  first = motif.AnnotationCache(path)
  assert len(first) == 3                                      # the identical pair and the first chunk of two
  judge = motif.OracleJudge(values.get)
  seen = []
  orig = judge.__call__

  def counting(ps, task):
    seen.extend(ps)
    return orig(ps, task)

  resumed = motif.annotate_pairs(pairs, "task", counting, "fake", motif.AnnotationCache(path), chunk_size=2)
  assert sorted(seen) == sorted([("d", "e"), ("b", "e"), ("c", "d")])   # only the pairs not stored yet
  fresh = motif.annotate_pairs(pairs, "task", motif.OracleJudge(values.get), "fake", None)
  assert [r["label"] for r in resumed] == [r["label"] for r in fresh] == [1, 0, 1, 2, 1, 1, 1]
  assert [r["cached"] for r in resumed] == [True, True, False, True, False, False, True]


class _StubTok:
  def apply_chat_template(self, message, add_generation_prompt=True, system=None):
    return "<user>" + (message if isinstance(message, str) else json.dumps(message)) + "<assistant>"


def test_logprob_judge_debiases_presentation_order(monkeypatch):
  # A purely positional LM (always more likely to answer "1") gets margin 0 -> no preference with tau > 0;
  # an LM that follows the content gets the same sign in both orders.
  def positional(params, config, tok, prompts, options, batch_size, widths):
    return np.tile(np.log([[0.9, 0.1]]), (len(prompts), 1))

  monkeypatch.setattr(annotation, "_choice_logprobs", positional)
  judge = motif.LogprobJudge(None, None, _StubTok(), tau=0.05)
  res = judge([("You kill the newt!", "It's a wall."), ("x", "y")], "defaultgoal")
  np.testing.assert_allclose([r["margin"] for r in res], [0.0, 0.0], atol=1e-6)
  assert [r["label"] for r in res] == [2, 2]

  def content(params, config, tok, prompts, options, batch_size, widths):
    # log p("1") - log p("2") = +1 when description 1 is the kill message, else -1
    first_is_kill = ['"description_1":\n"You kill' in p for p in prompts]
    return np.array([[0.0, -1.0] if k else [-1.0, 0.0] for k in first_is_kill])

  monkeypatch.setattr(annotation, "_choice_logprobs", content)
  res = judge([("You kill the newt!", "It's a wall."), ("It's a wall.", "You kill the newt!")], "defaultgoal")
  np.testing.assert_allclose([r["margin"] for r in res], [1.0, -1.0], atol=1e-6)
  assert [r["label"] for r in res] == [0, 1]
  prompt = annotation.chat_prompts(_StubTok(), ["hello"])[0]
  assert prompt.endswith(motif.ANSWER_PREFIX)


def test_generate_judge_retries_once():
  answers = iter(["I am not sure.", "(\"best_description\": 2)", "no", "still nothing"])
  judge = motif.GenerateJudge(lambda prompts: [next(answers) for _ in prompts], _StubTok())
  res = judge([("a", "b"), ("c", "d")], "defaultgoal")
  assert [r["label"] for r in res] == [None, 1] or [r["label"] for r in res] == [1, None]
  assert any("[retry]" in r["text"] for r in res)


# -------------------------------------------------------------------------------------------- toy world
def test_toy_events_counts_and_oracle():
  env = toy.CaptionedGridWorld(height=5, width=9, max_episode_steps=20)       # door at (2, 4)
  step = jax.jit(env.step_core)
  base = toy.GridState(pos=jnp.array([2, 3]), key=jnp.array([0, 0]), goal=jnp.array([2, 6]),
                       has_key=jnp.array(False), door_open=jnp.array(False), caption=jnp.array(0),
                       counts=jnp.zeros(toy.NUM_CAPTIONS, jnp.int32))
  event = lambda s: toy.EVENTS[toy.CAPTION_EVENT[int(s.caption)]]
  k = jax.random.key(0)
  s, _, r, term = step(k, base, 3)                                             # right, into the closed door
  assert event(s) == "locked" and s.pos.tolist() == [2, 3] and not term
  s, _, _, _ = step(k, base.replace(has_key=jnp.array(True)), 3)              # with the key: unlock, step in
  assert event(s) == "unlock" and s.pos.tolist() == [2, 4] and bool(s.door_open)
  s2, obs, r, term = step(k, s, 3)                                             # on into the right room
  s3, obs, r, term = step(k, s2, 3)                                            # reaches the goal at (2, 6)
  assert event(s3) == "goal" and float(r) == 1.0 and bool(term)
  s, _, _, _ = step(k, base.replace(pos=jnp.array([1, 3])), 3)                 # the wall column
  assert event(s) == "bump" and s.pos.tolist() == [1, 3]
  s, _, _, _ = step(k, base.replace(pos=jnp.array([0, 1])), 2)                 # onto the key at (0, 0)
  assert event(s) == "key" and bool(s.has_key)
  s_b, obs_b, _, _ = step(k, base.replace(pos=jnp.array([0, 2])), 0)           # border, twice
  s_b, obs_b, _, _ = step(k, s_b, 0)
  cap, cnt = toy.caption_and_count(obs_b, 20)
  assert int(cnt) == 2 and toy.EVENTS[toy.CAPTION_EVENT[int(cap)]] == "bump"
  assert toy.oracle_preference("You found the treasure!", "You pick up a brass key.") == 0
  assert toy.oracle_preference("You bump into a wall.", "") == 1
  assert toy.oracle_preference("You hear a distant noise.", "") == 2
  with pytest.raises(ValueError, match="not a caption"):
    toy.oracle_preference("You kill the newt!", "")
  with pytest.raises(ValueError, match="odd width"):
    toy.CaptionedGridWorld(height=5, width=8)


def test_toy_reward_fn_closed_form():
  env = toy.CaptionedGridWorld(height=5, width=9, max_episode_steps=20)
  table = jnp.arange(toy.NUM_CAPTIONS, dtype=jnp.float32)                     # r_phi(caption i) = i
  fn = motif.toy_reward_fn(table, mu=1.0, sigma=2.0, eps=0.0, alpha_ext=10.0, alpha_int=1.0, beta=3.0,
                           max_episode_steps=20)
  goal_cap = int(toy.EVENT_OFFSET[toy.EVENTS.index("goal")])
  s = toy.GridState(pos=jnp.array([2, 6]), key=jnp.array([0, 0]), goal=jnp.array([2, 6]), has_key=jnp.array(True),
                    door_open=jnp.array(True), caption=jnp.array(goal_cap),
                    counts=jnp.zeros(toy.NUM_CAPTIONS, jnp.int32).at[goal_cap].set(2))
  obs = jax.jit(env.observe)(s)[None, None]
  tr = rollout_lib.Transition(obs=obs, action=jnp.zeros((1, 1), jnp.int32), env_action=jnp.zeros((1, 1)),
                              reward=jnp.ones((1, 1)), terminated=jnp.ones((1, 1), bool),
                              truncated=jnp.zeros((1, 1), bool), next_obs=obs, episode_return=jnp.zeros((1, 1)),
                              episode_length=jnp.zeros((1, 1)), extras={})
  # r_hat = (goal_cap - 1) / 2, count 2 -> / 8; plus 10 * r_ext
  np.testing.assert_allclose(jax.jit(fn)(tr), [[10.0 + (goal_cap - 1) / 2 / 8]], rtol=1e-6)
  # Through the PPO's reward processing with reward_scale 0.1 (the staircase_weights variant): the official
  # formula scales only the goal reward, 10 * 0.1 * 1 + 1 * r_int.
  got = jax.jit(lambda t: ppo.process_reward(t, 0.1, 0.0, fn))(tr)
  ref = _official_total_reward([[1.0]], [[goal_cap]], [[2]], mu=1.0, var=4.0, eps=0.0, reward_scale=0.1,
                               reward_clip=np.inf, extrinsic_reward=10.0, llm_reward=1.0, beta=3.0)
  np.testing.assert_allclose(got, ref, rtol=1e-6)
  np.testing.assert_allclose(got, [[1.0 + (goal_cap - 1) / 2 / 8]], rtol=1e-6)


def test_scripted_agent_solves_toy():
  env = toy.CaptionedGridWorld(height=5, width=9, max_episode_steps=30)
  stats = jax.jit(lambda k: toy.episode_stats(env, toy.scripted_policy(env, 0.0), k, 16))(jax.random.key(0))
  assert float(stats["success"]) == 1.0 and float(stats["bumps"]) == 0.0
  assert float(stats["key"]) == 1.0 and float(stats["unlock"]) == 1.0


def test_pipeline_arrays_and_split():
  recs = [dict(caption_1="a", caption_2="b", label=0), dict(caption_1="a", caption_2="b", label=0),
          dict(caption_1="b", caption_2="c", label=None), dict(caption_1="c", caption_2="a", label=2),
          dict(caption_1="b", caption_2="a", label=1)]
  d = motif.to_arrays(recs)
  assert d["texts"] == ["a", "b", "c"]
  np.testing.assert_array_equal(d["pairs"], [[0, 1], [2, 0], [1, 0]])
  np.testing.assert_array_equal(d["labels"], [0, 2, 1])
  np.testing.assert_array_equal(d["weights"], [2, 1, 1])
  np.testing.assert_array_equal(d["occurrences"], [4, 3, 1])
  train, held = motif.split_by_pair(d, 0.5, seed=0)
  key = lambda p: tuple(sorted(p))
  assert not ({key(p) for p in train["pairs"].tolist()} & {key(p) for p in held["pairs"].tolist()})
  assert len(train["labels"]) + len(held["labels"]) == 3
  with pytest.raises(ValueError, match="no annotated pair"):
    motif.to_arrays([dict(caption_1="a", caption_2="b", label=None)])


def test_oracle_values_arm_without_a_reward_model():
  from iclr24_jax.configs import motif as cfg_mod
  c = cfg_mod.get_config("tiny")
  c.data.holdout = 0.0                                        # every pair trains: mu, sigma over all four messages
  recs = [dict(caption_1="You found the treasure!", caption_2="", label=0),
          dict(caption_1="You pick up a brass key.", caption_2="You bump into a wall.", label=None),
          dict(caption_1="You pick up a brass key.", caption_2="You bump into a wall.", label=0)]
  arm = motif.oracle_values_fit(c, recs)
  np.testing.assert_array_equal(arm["caption_rewards"], toy.caption_values())     # the oracle's own values
  # r = [goal 3, empty 0, key 1, bump -1], one occurrence each (the unlabelled record is dropped):
  # mu = 3 / 4 = 0.75; var = (2.25^2 + 0.75^2 + 0.25^2 + 1.75^2) / 4 = 8.75 / 4 = 2.1875, sigma = 1.479020;
  # eps = median of r_hat over the 4 unique messages = (0.5 - 0.75) / 1.479020 = -0.169031
  f = arm["fit"]
  np.testing.assert_allclose([f["mu"], f["sigma"], f["eps"]], [0.75, 1.479020, -0.169031], rtol=1e-5)
  fits = {"values": arm}
  st = train.toy_settings(c, fits, [("values", "intrinsic"), ("values", "both")])
  np.testing.assert_array_equal(st["caption_rewards"][0], toy.caption_values())
  np.testing.assert_allclose(st["alpha_ext"], [0.0, c.intrinsic.alpha_ext])
  with pytest.raises(ValueError, match="not a toy caption"):
    motif.oracle_values_fit(c, [dict(caption_1="You kill the newt!", caption_2="", label=0)])


# ------------------------------------------------------------------------------------------- smoke runs
def test_experiment_tiny_run(tmp_path):
  from iclr24_jax.configs import motif as cfg_mod
  c = cfg_mod.get_config("tiny")
  res = experiment.run(c, str(tmp_path))
  assert res["annotator"] == "oracle"
  assert res["agreement_with_oracle"]["agreement"] == 1.0
  assert set(res["agents"]) == {"intrinsic", "extrinsic", "both"}
  for stats in res["agents"].values():
    assert len(stats["success"]) == c.num_seeds and all(0.0 <= s <= 1.0 for s in stats["success"])
  assert os.path.exists(tmp_path / "results.json") and os.path.exists(tmp_path / "toy_success.png")
  assert os.path.exists(tmp_path / "motif_annotations_oracle.jsonl")
  with pytest.raises(ValueError, match="unknown variant"):
    cfg_mod.get_config("bogus")


@pytest.mark.slow
def test_experiment_tiny_nethack_run(tmp_path):
  from iclr24_jax.configs import motif as cfg_mod
  res = experiment.run(cfg_mod.get_config("tiny,nethack"), str(tmp_path))
  assert set(res["runs"]) == {"extrinsic", "intrinsic", "both"}
  assert all(r["env_steps"] > 0 and r["steps_per_s"] > 0 for r in res["runs"].values())
