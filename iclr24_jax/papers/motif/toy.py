"""A captioned key -> door -> goal gridworld in pure JAX, with oracle preferences over its captions.

Motif's setting in miniature: the extrinsic reward is sparse (1 when the goal is reached, else 0) while every
step emits a caption (NetHack's message line), most of them empty or uninformative. An annotator that knows
the task prefers captions that show progress (a key picked up, a door unlocked, the goal reached); the reward
model distilled from its preferences turns them into a dense intrinsic reward.

Layout (height x width cells, row 0 on top; default 7 x 13): a wall down the middle column (width // 2)
with one door in the middle row (height // 2). The agent and the key start in the left room, the goal lies in
the right room, all three drawn uniformly at every reset. Actions: 0 up, 1 down, 2 left, 3 right.

  env = CaptionedGridWorld()                  # an rl.envs.Env: reset / step / auto-reset / episode stats
  obs[..., :-2]                               # what the policy needs: one-hots of agent, key, goal + flags
  caption_and_count(next_obs)                 # the caption id of the step and its count in the episode

Events of a step (one caption each, a paraphrase drawn uniformly from the event's list):
  goal (terminal, r_ext = 1) > unlock (walk into the door holding the key; it opens, you step in) > key
  (step onto it) > locked (walk into the closed door without the key; you stay) > bump (walk into a wall or
  the border; you stay) > otherwise a neutral flavour caption with probability `noise_prob`, else ''.

The per-episode count N_episode(caption) lives in the environment state (like the official MessageWrapper,
which puts `msg_count` in the observation), so a PPO reward function sees it through `next_obs`.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.rl.envs import Env, EnvSpec

MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]], np.int32)  # up, down, left, right

# Event types, their captions and their oracle progress value (higher = more progress towards the goal).
EVENTS = ("empty", "neutral", "bump", "locked", "key", "unlock", "goal")
EVENT_CAPTIONS: dict[str, tuple[str, ...]] = {
    "empty": ("",),
    "neutral": ("You hear a distant noise.", "You see a spider web here.", "You hear water dripping.",
                "A draft blows past you."),
    "bump": ("You bump into a wall.", "Ouch! You walk into the wall.", "There is a wall in the way."),
    "locked": ("This door is locked.", "The door is locked shut."),
    "key": ("You pick up a brass key.", "You find a small key and take it."),
    "unlock": ("You unlock the door with your key.", "The key turns and the door swings open."),
    "goal": ("You reach the treasure room!", "You found the treasure!"),
}
ORACLE_VALUE = {"empty": 0.0, "neutral": 0.0, "bump": -1.0, "locked": 0.0, "key": 1.0, "unlock": 2.0, "goal": 3.0}
TASK = ("Find the key, unlock the door with it and reach the treasure room behind the door. Prefer messages "
        "that show progress towards the treasure.")

CAPTIONS: tuple[str, ...] = tuple(c for e in EVENTS for c in EVENT_CAPTIONS[e])
CAPTION_EVENT = np.array([EVENTS.index(e) for e in EVENTS for _ in EVENT_CAPTIONS[e]], np.int32)
EVENT_OFFSET = np.cumsum([0] + [len(EVENT_CAPTIONS[e]) for e in EVENTS])[:-1].astype(np.int32)
EVENT_SIZE = np.array([len(EVENT_CAPTIONS[e]) for e in EVENTS], np.int32)
NUM_CAPTIONS = len(CAPTIONS)


def caption_values() -> np.ndarray:
  """Oracle progress value of every caption, [NUM_CAPTIONS] float32."""
  return np.array([ORACLE_VALUE[EVENTS[e]] for e in CAPTION_EVENT], np.float32)


def oracle_preference(caption_1: str, caption_2: str) -> int:
  """The oracle's label for a pair (official AnnotationIdx convention): 0 = first better, 1 = second, 2 = tie.

  Args:
    caption_1: a caption of `CAPTIONS`.
    caption_2: another (or the same) caption.

  Returns:
    0, 1 or 2 by the captions' oracle progress values.

  Raises:
    ValueError: a caption that is not one of `CAPTIONS`.
  """
  for c in (caption_1, caption_2):
    if c not in CAPTIONS:
      raise ValueError(f"caption {c!r} is not a caption of the toy world (see toy.CAPTIONS).")
  v = caption_values()
  v1, v2 = v[CAPTIONS.index(caption_1)], v[CAPTIONS.index(caption_2)]
  return 0 if v1 > v2 else (1 if v2 > v1 else 2)


def caption_bytes(captions=CAPTIONS, length: int = 256) -> np.ndarray:
  """Captions as NetHack-style message buffers: [N, length] uint8, NUL-padded (latin-1).

  Args:
    captions: N strings (latin-1 encodable; default the toy world's CAPTIONS).
    length: buffer length (longer captions are cut).

  Returns:
    uint8 [N, length].
  """
  out = np.zeros((len(captions), length), np.uint8)
  for i, c in enumerate(captions):
    b = c.encode("latin-1")[:length]
    out[i, :len(b)] = np.frombuffer(b, np.uint8)
  return out


@flax.struct.dataclass
class GridState:
  """pos, key, goal [2] int32 (row, col); has_key, door_open bool; caption int32; counts [NUM_CAPTIONS] int32."""

  pos: jax.Array
  key: jax.Array
  goal: jax.Array
  has_key: jax.Array
  door_open: jax.Array
  caption: jax.Array
  counts: jax.Array


class CaptionedGridWorld(Env):
  """The toy world as an `rl.envs.Env` (discrete, 4 actions; observation [3 h w + 4] float32).

  Observation: one-hot agent cell [h w], one-hot key cell [h w] (zeros once picked up), one-hot goal cell
  [h w], has_key, door_open, then two bookkeeping entries the reward hook reads: caption_id / NUM_CAPTIONS and
  N_episode(caption) / max_episode_steps (use `caption_and_count`).

  Args:
    height, width: grid size (odd width >= 5, height >= 3); the wall is column width // 2.
    max_episode_steps: time limit (truncation).
    noise_prob: probability of a neutral flavour caption on an otherwise silent step.
  """

  def __init__(self, height: int = 7, width: int = 13, max_episode_steps: int = 80, noise_prob: float = 0.15):
    if height < 3 or width < 5 or width % 2 == 0:
      raise ValueError(f"grid must have height >= 3 and an odd width >= 5, got {height} x {width}.")
    if max_episode_steps < 1:
      raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}.")
    if not 0.0 <= noise_prob <= 1.0:
      raise ValueError(f"noise_prob must be in [0, 1], got {noise_prob}.")
    self.height, self.width = int(height), int(width)
    self.wall_col, self.door = self.width // 2, (self.height // 2, self.width // 2)
    self.room_w = self.wall_col
    self.noise_prob = float(noise_prob)
    self.obs_dim = 3 * self.height * self.width + 4
    self.spec = EnvSpec(f"motif/captioned_grid_{self.height}x{self.width}", (self.obs_dim,), True, 4,
                        max_episode_steps=int(max_episode_steps))

  def _onehot_cell(self, rc: jax.Array) -> jax.Array:
    return jax.nn.one_hot(rc[0] * self.width + rc[1], self.height * self.width, dtype=jnp.float32)

  def observe(self, s: GridState) -> jax.Array:
    """Observation [3 h w + 4] float32: one-hot agent, key (zero once held) and goal cells, then has_key, door_open,
    caption / NUM_CAPTIONS and the caption's episode count / max_episode_steps.
    """
    key_oh = self._onehot_cell(s.key) * (1.0 - s.has_key.astype(jnp.float32))
    count = s.counts[s.caption]
    return jnp.concatenate([self._onehot_cell(s.pos), key_oh, self._onehot_cell(s.goal),
                            jnp.stack([s.has_key.astype(jnp.float32), s.door_open.astype(jnp.float32),
                                       s.caption.astype(jnp.float32) / NUM_CAPTIONS,
                                       count.astype(jnp.float32) / self.spec.max_episode_steps])])

  def reset_core(self, key):
    """Env.reset_core: agent and key on distinct random left-room cells, goal on a random right-room cell."""
    k_agent, k_key, k_goal = jax.random.split(key, 3)
    n, rw = self.room_w * self.height, self.room_w
    a = jax.random.randint(k_agent, (), 0, n)                   # left room cell
    k = (a + 1 + jax.random.randint(k_key, (), 0, n - 1)) % n   # a different left-room cell
    g = jax.random.randint(k_goal, (), 0, n)                    # right room cell
    cell = lambda i, col0: jnp.stack([i // rw, col0 + i % rw]).astype(jnp.int32)
    s = GridState(pos=cell(a, 0), key=cell(k, 0), goal=cell(g, self.wall_col + 1), has_key=jnp.array(False),
                  door_open=jnp.array(False), caption=jnp.zeros((), jnp.int32),
                  counts=jnp.zeros((NUM_CAPTIONS,), jnp.int32))
    return s, self.observe(s)

  def step_core(self, key, s: GridState, action):
    """Env.step_core: moves the agent by action [] int (0-3); edges, the wall and the locked door block it,
    the key is picked up on its cell and opens the door; the step's caption (event + random variant) and its
    count are recorded. Returns (state, obs [3 h w + 4], reward [] = 1.0 on the goal else 0, terminated [] =
    goal reached).
    """
    k_noise, k_pick, k_var = jax.random.split(key, 3)
    target = s.pos + jnp.asarray(MOVES)[action]
    outside = (target[0] < 0) | (target[0] >= self.height) | (target[1] < 0) | (target[1] >= self.width)
    is_door = (target[0] == self.door[0]) & (target[1] == self.door[1])
    is_wall = (~outside) & (target[1] == self.wall_col) & (~is_door)
    closed = is_door & (~s.door_open)
    bump = outside | is_wall
    locked = closed & (~s.has_key)
    unlock = closed & s.has_key
    pos = jnp.where(bump | locked, s.pos, target).astype(jnp.int32)
    got_key = (~s.has_key) & jnp.all(pos == s.key)
    goal = jnp.all(pos == s.goal)
    noise = jax.random.uniform(k_noise) < self.noise_prob
    ev = jnp.select([goal, unlock, got_key, locked, bump, noise],
                    [EVENTS.index(e) for e in ("goal", "unlock", "key", "locked", "bump", "neutral")],
                    EVENTS.index("empty"))
    variant = jax.random.randint(k_var, (), 0, jnp.asarray(EVENT_SIZE)[ev])
    caption = (jnp.asarray(EVENT_OFFSET)[ev] + variant).astype(jnp.int32)
    counts = s.counts.at[caption].add(1)
    s = GridState(pos=pos, key=s.key, goal=s.goal, has_key=s.has_key | got_key, door_open=s.door_open | unlock,
                  caption=caption, counts=counts)
    return s, self.observe(s), goal.astype(jnp.float32), goal


def caption_and_count(obs: jax.Array, max_episode_steps: int) -> tuple[jax.Array, jax.Array]:
  """Reads the caption id and its episode count N_episode(caption) from toy observations [..., 3 h w + 4].

  Args:
    obs: [..., 3 h w + 4] float32 observations (the last two entries: caption id / NUM_CAPTIONS and
      count / max_episode_steps).
    max_episode_steps: the env's episode length (the count's scale).

  Returns:
    (caption [...] int32, count [...] int32); count >= 1 after any step (0 only on a reset observation).
  """
  cap = jnp.round(obs[..., -2] * NUM_CAPTIONS).astype(jnp.int32)
  cnt = jnp.round(obs[..., -1] * max_episode_steps).astype(jnp.int32)
  return cap, cnt


def scripted_policy(env: CaptionedGridWorld, epsilon: float = 0.2):
  """A simple scripted agent (a PolicyFn for rl.rollout): heads for the key, then the door, then the goal,
  aligning the row first and then the column; a uniform random action with probability `epsilon`.

  Args:
    env: the CaptionedGridWorld (its layout).
    epsilon: probability of a uniform random action at each step.

  Returns:
    policy_fn(key, obs [B, 3 h w + 4]) -> (action [B] int32, action [B] int32, {}).
  """

  hw, w, wall, door = env.height * env.width, env.width, env.wall_col, env.door

  def act_one(key, obs):
    agent = jnp.argmax(obs[:hw])
    r, c = agent // w, agent % w
    kc = jnp.argmax(obs[hw:2 * hw])
    goal_cell = jnp.argmax(obs[2 * hw:3 * hw])
    has_key = obs[3 * hw] > 0.5
    tr = jnp.where(~has_key, kc // w, jnp.where(c < wall, door[0], goal_cell // w))
    tc = jnp.where(~has_key, kc % w, jnp.where(c < wall, door[1], goal_cell % w))
    on_door = c == wall
    horiz = jnp.where(tc > c, 3, 2)
    vert = jnp.where(tr > r, 1, 0)
    a = jnp.where(on_door, horiz, jnp.where(r != tr, vert, horiz))
    k1, k2 = jax.random.split(key)
    rand = jax.random.randint(k1, (), 0, 4)
    return jnp.where(jax.random.uniform(k2) < epsilon, rand, a).astype(jnp.int32)

  def policy_fn(key, obs):
    a = jax.vmap(act_one)(jax.random.split(key, obs.shape[0]), obs)
    return a, a, {}

  return policy_fn


def collect_captions(env: CaptionedGridWorld, policy_fn, key: jax.Array, num_envs: int = 32,
                     num_steps: int = 100) -> np.ndarray:
  """Caption ids of every step of a rollout: [num_steps * num_envs] int32 (the observation data set).

  Args:
    env: the CaptionedGridWorld.
    policy_fn: rollout PolicyFn, e.g. `scripted_policy(env)`.
    key: PRNG key.
    num_envs: parallel environments.
    num_steps: steps per environment (episodes restart automatically).

  Returns:
    numpy int32 [num_steps * num_envs] caption ids in [0, NUM_CAPTIONS), step-major.
  """
  from iclr24_jax.rl import rollout as rollout_lib
  k_reset, k_roll = jax.random.split(key)
  state = env.reset_batch(k_reset, num_envs)
  _, tr = jax.jit(lambda s, k: rollout_lib.rollout(env, policy_fn, s, k, num_steps))(state, k_roll)
  cap, _ = caption_and_count(tr.next_obs, env.spec.max_episode_steps)
  return np.asarray(cap).reshape(-1)


def episode_stats(env: CaptionedGridWorld, policy_fn, key: jax.Array, num_envs: int = 64) -> dict[str, jax.Array]:
  """Success and caption statistics of the first episode of each of `num_envs` environments (pure; jit it).

  Args:
    env: the CaptionedGridWorld.
    policy_fn: rollout PolicyFn.
    key: PRNG key.
    num_envs: environments (one first episode each; max_episode_steps steps are rolled out).

  Returns:
    dict of scalars: success (goal reached), key (picked up), unlock (door opened), bumps and locked (mean
    number of such captions per episode), length (mean steps).
  """
  from iclr24_jax.rl import rollout as rollout_lib
  k_reset, k_roll = jax.random.split(key)
  state = env.reset_batch(k_reset, num_envs)
  t = env.spec.max_episode_steps
  _, tr = rollout_lib.rollout(env, policy_fn, state, k_roll, t)
  done = tr.done
  first = (jnp.cumsum(done, axis=0) - done) == 0           # steps of each env's first episode
  cap, _ = caption_and_count(tr.next_obs, t)
  ev = jnp.asarray(CAPTION_EVENT)[cap]
  has = lambda name: jnp.any(first & (ev == EVENTS.index(name)), axis=0).astype(jnp.float32)
  num = lambda name: jnp.sum(first & (ev == EVENTS.index(name)), axis=0).astype(jnp.float32)
  return {"success": jnp.mean(has("goal")), "key": jnp.mean(has("key")), "unlock": jnp.mean(has("unlock")),
          "bumps": jnp.mean(num("bump")), "locked": jnp.mean(num("locked")),
          "length": jnp.mean(jnp.sum(first, axis=0).astype(jnp.float32))}
