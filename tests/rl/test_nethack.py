"""NetHack adapter (nle 1.3.0 + gymnasium 1.2.0): reset/step, message decoding, a 1,000-step random agent,
seeded replay, the policy net, and host-loop PPO with a reward hook."""
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("nle")

from iclr24_jax.configs import ppo as ppo_config  # noqa: E402
from iclr24_jax.rl import distributions, nethack, ppo_host  # noqa: E402


def test_decode_message_hand_built():
  buf = np.zeros(256, np.uint8)
  text = b"You see here a scroll labeled FOOBIE BLETCH."
  buf[:len(text)] = np.frombuffer(text, np.uint8)
  assert nethack.decode_message(buf) == text.decode()
  assert nethack.decode_messages(np.stack([buf, np.zeros(256, np.uint8)])) == [text.decode(), ""]


def test_blstats_names():
  names = nethack.blstats_names()
  assert len(names) == nethack.BLSTATS_LEN
  assert names[:2] == ["x", "y"] and "hp" in names and "depth" in names


@pytest.fixture(scope="module")
def env():
  e = nethack.NetHackVecEnv(num_envs=2, seed=0)
  yield e
  e.close()


def test_reset_shapes_and_welcome_message(env):
  obs = env.reset(seed=0)
  assert set(obs) == {"glyphs", "blstats", "message"}
  chex.assert_shape(obs["glyphs"], (2,) + nethack.MAP_SHAPE)
  chex.assert_shape(obs["blstats"], (2, nethack.BLSTATS_LEN))
  chex.assert_shape(obs["message"], (2, nethack.MESSAGE_LEN))
  msgs = nethack.decode_messages(obs["message"])
  assert all("welcome to NetHack" in m for m in msgs), msgs
  names = nethack.blstats_names()
  hp, hpmax = obs["blstats"][:, names.index("hp")], obs["blstats"][:, names.index("hpmax")]
  assert np.all(hp > 0) and np.all(hp <= hpmax)


def test_random_agent_1000_steps(env):
  obs = env.reset(seed=1)
  rng = np.random.default_rng(0)
  total_reward, ended, msgs = 0.0, 0, set()
  for _ in range(500):  # 2 games x 500 steps = 1,000 environment steps
    obs, r, term, trunc, info = env.step(rng.integers(0, env.num_actions, size=2))
    assert r.shape == (2,) and term.dtype == bool and trunc.dtype == bool
    done = term | trunc
    ended += int(done.sum())
    total_reward += float(r.sum())
    # where not done, the pre-reset observation is the observation
    for k in obs:
      np.testing.assert_array_equal(info["final_obs"][k][~done], obs[k][~done])
    np.testing.assert_array_equal(info["episode_length"][~done], 0)
    msgs.update(m for m in nethack.decode_messages(obs["message"]) if m)
  assert np.isfinite(total_reward)
  assert len(msgs) > 1  # the game talked back
  with pytest.raises(ValueError, match="actions must be in"):
    env.step(np.array([0, env.num_actions]))


def test_same_seed_replays_the_same_games():
  def play(seed):
    with nethack.NetHackVecEnv(num_envs=1, seed=seed) as e:
      e.reset()
      rng = np.random.default_rng(0)
      return [int(e.step(rng.integers(0, e.num_actions, 1))[0]["glyphs"].sum()) for _ in range(50)]
  assert play(3) == play(3)
  assert play(3) != play(4)


def test_unknown_task():
  with pytest.raises(ValueError, match="unknown NetHack task"):
    nethack.NetHackVecEnv(num_envs=1, task="NetHackPacifist-v9")


class _BlstatsPolicy(nn.Module):
  num_actions: int

  @nn.compact
  def __call__(self, obs):
    x = jnp.log1p(jnp.abs(jnp.asarray(obs["blstats"], jnp.float32)))
    h = nn.tanh(nn.Dense(32)(x))
    return distributions.Categorical(nn.Dense(self.num_actions)(h)), nn.Dense(1)(h)[..., 0]


def test_nethack_net_shapes(env):
  obs = env.reset(seed=2)
  model = nethack.NetHackNet(env.num_actions, hidden=32, glyph_dim=4, msg_dim=4)
  params = jax.jit(model.init)(jax.random.key(0), obs)
  dist, value = jax.jit(model.apply)(params, obs)
  chex.assert_shape(dist.logits, (2, env.num_actions))
  chex.assert_shape(value, (2,))
  assert np.all(np.isfinite(dist.logits)) and np.all(np.isfinite(value))


def test_host_ppo_with_reward_hook(env):
  c = ppo_config.ppo_defaults()
  c.num_steps = 2
  c.ppo.update(dict(rollout_steps=8, num_minibatches=2, update_epochs=1))
  seen = []

  def hook(batch):
    # an intrinsic bonus of 1 whenever the next observation carries a message (as Motif's would read it)
    seen.append(batch["reward"].shape)
    msgs = batch["next_obs"]["message"]
    return batch["reward"] + (msgs[..., 0] > 0).astype(np.float32)

  model = _BlstatsPolicy(env.num_actions)  # small, to keep compile time low; NetHackNet is tested below
  agent = ppo_host.HostPPO(c, env, model, reward_hook=hook)
  state = agent.init(jax.random.key(0))
  state, hist = agent.train(state, 2, jax.random.key(1))
  assert seen == [(8, 2), (8, 2)]
  assert int(state.step) == 2 * 1 * 2
  assert all(np.isfinite(h["loss"]) for h in hist)
  assert hist[-1]["hook_reward"] >= hist[-1]["extrinsic_reward"]


def test_get_state_set_state_continues_the_same_games():
  """A checkpoint of the games mid-episode (after an auto-reset: 12-step episodes, 30 steps taken) restored into a
  new env by replay: the same observation, then the same steps, rewards and episode totals as the original env;
  a saved game whose observations the replay does not reproduce (its crc32 changed) is refused (ReplayMismatch)."""
  import json
  rng = np.random.default_rng(0)
  with nethack.NetHackVecEnv(num_envs=2, seed=5, max_episode_steps=12) as a, \
       nethack.NetHackVecEnv(num_envs=2, seed=5, max_episode_steps=12) as b:
    a.reset(seed=5)
    for _ in range(30):
      obs, *_ = a.step(rng.integers(0, a.num_actions, 2))
    saved = json.loads(json.dumps(a.get_state()))           # what a checkpoint's JSON holds
    assert [len(g["actions"]) for g in saved["games"]] == [30 - 2 * 12] * 2   # two 12-step episodes truncated
    b.reset(seed=5)
    got = b.set_state(saved)
    for k in obs:
      np.testing.assert_array_equal(got[k], obs[k])
    np.testing.assert_array_equal(b.episode_length, a.episode_length)
    for _ in range(15):                                     # across the next auto-reset
      act = rng.integers(0, a.num_actions, 2)
      ra, rb = a.step(act), b.step(act)
      for k in ra[0]:
        np.testing.assert_array_equal(rb[0][k], ra[0][k])
      for x, y in zip(ra[1:4], rb[1:4]):
        np.testing.assert_array_equal(y, x)
      np.testing.assert_array_equal(rb[4]["episode_return"], ra[4]["episode_return"])
    assert b.get_state() == a.get_state()                   # the same seeds, actions and observation chains
    saved["games"][1]["crc"] ^= 1
    with pytest.raises(nethack.ReplayMismatch, match="game 1"):
      b.set_state(saved)
