"""A pure-JAX 2-D point-mass maze with a sparse goal reward, and a scripted waypoint controller.

Modelled on D4RL's maze2d (a force-controlled point mass in a grid maze; reward 1 within 0.5 of the goal),
but self-contained: the dynamics are a damped double integrator with axis-separated wall collisions
instead of MuJoCo. Coordinates are in cell units: cell (row i, column j) is the square centred on (i, j)
with side 1; '#' cells are walls.

Observation: (x, y, vx, vy), plus the goal (gx, gy) with `goal_in_obs=True`. Action: a force in [-1, 1]^2.

  env = PointMaze('umaze')                    # an Env (see envs.py): reset/step, auto-reset, stats
  a = waypoint_action(env, pos, vel, goal)    # the scripted controller (D4RL-style data generation)
"""
from __future__ import annotations

import collections
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.rl.env_base import Env, EnvSpec

# Deviation: layouts in the spirit of D4RL's maze2d U / medium / large mazes ('G' marks the evaluation goal,
# 'O' free cells); drawn here, not loaded from D4RL.
LAYOUTS = {
    "open": ["#######",
             "#OOOOO#",
             "#OOOOO#",
             "#OOOGO#",
             "#######"],
    "umaze": ["#####",
              "#GOO#",
              "###O#",
              "#OOO#",
              "#####"],
    "medium": ["########",
               "#OO##OO#",
               "#OO#OOO#",
               "##OOO###",
               "#OO#OOO#",
               "#O#OO#O#",
               "#OOO#OG#",
               "########"],
    "large": ["############",
              "#OOOO#OOOOO#",
              "#O##O#O#O#O#",
              "#OOOOOO#OOO#",
              "#O####O###O#",
              "#OO#O#OOOOO#",
              "##O#O#O#O###",
              "#OO#OOO#OGO#",
              "############"],
}
# D4RL maze2d time limits (umaze 300, medium 600, large 800).
EPISODE_STEPS = {"open": 150, "umaze": 300, "medium": 600, "large": 800}


@flax.struct.dataclass
class MazeState:
  """pos [2], vel [2], goal [2] (float32, cell units)."""

  pos: jax.Array
  vel: jax.Array
  goal: jax.Array


def parse_layout(layout: list[str] | str) -> np.ndarray:
  """'#' -> True (wall), anything else -> False; returns [H, W] bool. Raises on ragged or open borders."""
  rows = layout.strip().split("\n") if isinstance(layout, str) else list(layout)
  if len({len(r) for r in rows}) != 1:
    raise ValueError("maze layout rows have different lengths; every row needs the same number of cells.")
  walls = np.array([[c == "#" for c in r] for r in rows], bool)
  if not (walls[0].all() and walls[-1].all() and walls[:, 0].all() and walls[:, -1].all()):
    raise ValueError("maze layout must be enclosed by '#' walls on all four borders.")
  return walls


def shortest_path_table(walls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """BFS over free cells: next cell on a shortest path to every goal cell.

  Args:
    walls: [H, W] bool.

  Returns:
    (next_cell [H*W, H*W] int32: next_cell[goal, cell] = flat index of the neighbour to move to (cell itself at the
    goal or where unreachable); dist [H*W, H*W] int32 grid distances, -1 when unreachable.)
  """
  h, w = walls.shape
  n = h * w
  nxt = np.tile(np.arange(n, dtype=np.int32), (n, 1))
  dist = -np.ones((n, n), np.int32)
  for g in range(n):
    gi, gj = divmod(g, w)
    if walls[gi, gj]:
      continue
    dist[g, g] = 0
    queue = collections.deque([(gi, gj)])
    while queue:
      i, j = queue.popleft()
      for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        a, b = i + di, j + dj
        if 0 <= a < h and 0 <= b < w and not walls[a, b] and dist[g, a * w + b] < 0:
          dist[g, a * w + b] = dist[g, i * w + j] + 1
          nxt[g, a * w + b] = i * w + j  # from (a, b) step towards (i, j), which is closer to the goal
          queue.append((a, b))
  return nxt, dist


class PointMaze(Env):
  """Point mass in a grid maze with sparse goal reward (an `Env`).

  Args:
    layout: a name in LAYOUTS or a list of strings ('#' wall, 'G' goal, other free).
    reward: 'sparse' (1 when |pos - goal| <= goal_radius, as D4RL maze2d) or 'dense' (exp(-|pos - goal|)).
    random_goal: sample the goal among free cells at each reset (else the layout's 'G').
    random_start: start in a random free cell (else the free cell farthest from the goal).
    terminate_on_goal: end the episode on reaching the goal (antmaze-like); D4RL maze2d does not.
    goal_in_obs: append the goal to the observation.
    max_episode_steps: time limit (default EPISODE_STEPS[layout] or 300).
    dt, accel, damping, max_speed, radius: dynamics (cell units, seconds).
  """

  def __init__(self, layout: str | list[str] = "umaze", reward: str = "sparse", random_goal: bool = False,
               random_start: bool = True, terminate_on_goal: bool = False, goal_in_obs: bool = False,
               max_episode_steps: int | None = None, dt: float = 0.1, accel: float = 10.0, damping: float = 2.0,
               max_speed: float = 2.5, radius: float = 0.1, goal_radius: float = 0.5):
    name = layout if isinstance(layout, str) else "custom"
    if isinstance(layout, str):
      if layout not in LAYOUTS:
        raise ValueError(f"unknown maze layout '{layout}'; choose one of {sorted(LAYOUTS)} or pass a list of rows.")
      rows = LAYOUTS[layout]
    else:
      rows = list(layout)
    if reward not in ("sparse", "dense"):
      raise ValueError(f"unknown maze reward '{reward}'; choose 'sparse' or 'dense'.")
    if max_speed * dt >= 1.0 - 2 * radius:
      raise ValueError(f"max_speed * dt = {max_speed * dt} lets the mass jump through walls; keep it "
                       f"below 1 - 2 * radius = {1 - 2 * radius}.")
    self.walls_np = parse_layout(rows)
    self.height, self.width = self.walls_np.shape
    self.walls = jnp.asarray(self.walls_np)
    free = np.argwhere(~self.walls_np)
    self.free_cells = jnp.asarray(free, jnp.float32)  # [F, 2] (row, col)
    goals = [(i, j) for i, r in enumerate(rows) for j, c in enumerate(r) if c == "G"]
    self.goal_cell = np.asarray(goals[0] if goals else free[-1], np.float32)
    nxt, dist = shortest_path_table(self.walls_np)
    self.next_cell = jnp.asarray(nxt)
    self.dist_table = dist
    g_flat = int(self.goal_cell[0]) * self.width + int(self.goal_cell[1])
    far = free[np.argmax([dist[g_flat, i * self.width + j] for i, j in free])]
    self.start_cell = np.asarray(far, np.float32)
    self.reward_kind, self.random_goal, self.random_start = reward, random_goal, random_start
    self.terminate_on_goal, self.goal_in_obs = terminate_on_goal, goal_in_obs
    self.dt, self.accel, self.damping, self.max_speed, self.radius = dt, accel, damping, max_speed, radius
    self.goal_radius = goal_radius
    limit = max_episode_steps or EPISODE_STEPS.get(name, 300)
    self.spec = EnvSpec(f"maze/{name}", (6 if goal_in_obs else 4,), False, 2, -1.0, 1.0, max_episode_steps=limit)

  # --- physics --------------------------------------------------------------------------------------------
  def is_wall(self, pos: jax.Array) -> jax.Array:
    """Whether a disc of `radius` at pos [..., 2] overlaps a wall cell (checked at its bounding-box corners)."""
    r = self.radius
    corners = jnp.stack([pos + jnp.array([dx, dy]) for dx in (-r, r) for dy in (-r, r)], axis=-2)
    cells = jnp.clip(jnp.round(corners).astype(jnp.int32), 0, jnp.array([self.height - 1, self.width - 1]))
    return jnp.any(self.walls[cells[..., 0], cells[..., 1]], axis=-1)

  def dynamics(self, pos: jax.Array, vel: jax.Array, action: jax.Array) -> tuple[jax.Array, jax.Array]:
    """One step: v' = clip(v (1 - damping dt) + accel a dt), axis-separated move that stops at walls.

    Args:
      pos, vel: [2]; action: [2] (clipped to [-1, 1]).

    Returns:
      (pos', vel') [2] each.
    """
    a = jnp.clip(action, -1.0, 1.0)
    vel = jnp.clip(vel * (1.0 - self.damping * self.dt) + self.accel * a * self.dt, -self.max_speed, self.max_speed)
    for axis in (0, 1):
      trial = pos.at[axis].add(vel[axis] * self.dt)
      hit = self.is_wall(trial)
      pos = jnp.where(hit, pos, trial)
      vel = vel.at[axis].set(jnp.where(hit, 0.0, vel[axis]))
    return pos, vel

  def reward(self, pos: jax.Array, goal: jax.Array) -> jax.Array:
    """Reward at positions pos [..., 2] for goals goal [..., 2]: 'sparse' 1[||pos - goal|| <= goal_radius], else
    exp(-||pos - goal||); float32 [...].
    """
    d = jnp.linalg.norm(pos - goal, axis=-1)
    if self.reward_kind == "sparse":
      return (d <= self.goal_radius).astype(jnp.float32)
    return jnp.exp(-d)

  def observe(self, st: MazeState) -> jax.Array:
    """The observation [4] (or [6] with goal_in_obs): position, velocity (and goal) of a MazeState."""
    parts = [st.pos, st.vel] + ([st.goal] if self.goal_in_obs else [])
    return jnp.concatenate(parts, axis=-1)

  def sample_cell(self, key: jax.Array) -> jax.Array:
    """A uniformly drawn free cell [2] (row, col) of the layout."""
    return self.free_cells[jax.random.randint(key, (), 0, self.free_cells.shape[0])]

  # --- Env interface ----------------------------------------------------------------------------------------
  def reset_core(self, key):
    """Env.reset_core: a start cell (fixed or random) plus uniform noise in [-0.1, 0.1], zero velocity, the goal."""
    k_start, k_goal, k_noise = jax.random.split(key, 3)
    goal = self.sample_cell(k_goal) if self.random_goal else jnp.asarray(self.goal_cell)
    start = self.sample_cell(k_start) if self.random_start else jnp.asarray(self.start_cell)
    pos = start + jax.random.uniform(k_noise, (2,), minval=-0.1, maxval=0.1)
    st = MazeState(pos.astype(jnp.float32), jnp.zeros(2, jnp.float32), goal.astype(jnp.float32))
    return st, self.observe(st)

  def step_core(self, key, core, action):
    """Env.step_core: point-mass dynamics under the action [2]; terminated on reaching the goal when
    terminate_on_goal."""
    del key
    pos, vel = self.dynamics(core.pos, core.vel, action)
    st = core.replace(pos=pos, vel=vel)
    r = self.reward(pos, core.goal)
    reached = jnp.linalg.norm(pos - core.goal) <= self.goal_radius
    term = reached if self.terminate_on_goal else jnp.zeros((), bool)
    return st, self.observe(st), r, term


def waypoint_action(env: PointMaze, pos: jax.Array, vel: jax.Array, goal: jax.Array, kp: float = 3.0,
                    kd: float = 0.6) -> jax.Array:
  """The scripted controller: PD towards the centre of the next cell on a shortest path to the goal.

  Args:
    env: the maze (its BFS table).
    pos, vel, goal: [2] each.
    kp, kd: PD gains.

  Returns:
    action [2] in [-1, 1].
  """
  hw = jnp.array([env.height - 1, env.width - 1])
  cell = jnp.clip(jnp.round(pos).astype(jnp.int32), 0, hw)
  gcell = jnp.clip(jnp.round(goal).astype(jnp.int32), 0, hw)
  c_flat = cell[0] * env.width + cell[1]
  g_flat = gcell[0] * env.width + gcell[1]
  nxt = env.next_cell[g_flat, c_flat]
  target = jnp.stack([nxt // env.width, nxt % env.width]).astype(jnp.float32)
  target = jnp.where(c_flat == g_flat, goal, target)
  return jnp.clip(kp * (target - pos) - kd * vel, -1.0, 1.0)


def waypoint_policy(env: PointMaze, noise_std: float = 0.0):
  """The controller as a rollout PolicyFn (key, obs [B, D]) -> (action, action, {}).

  The goal is read from the observation when `env.goal_in_obs`, else it is the layout's goal 'G'.

  Args:
    env: the PointMaze (obs[:, 0:2] position, 2:4 velocity, 4:6 goal when goal_in_obs).
    noise_std: std of Gaussian noise added to each action before clipping to [-1, 1] (0: deterministic).

  Returns:
    policy_fn(key, obs [B, D]) -> (raw action [B, 2], env action [B, 2] (the same), {}), actions in [-1, 1].
  """

  def policy_fn(key: jax.Array, obs: jax.Array):
    goal = obs[:, 4:6] if env.goal_in_obs else jnp.broadcast_to(jnp.asarray(env.goal_cell), obs.shape[:-1] + (2,))
    a = jax.vmap(lambda o, g: waypoint_action(env, o[:2], o[2:4], g))(obs, goal)
    if noise_std:
      a = jnp.clip(a + noise_std * jax.random.normal(key, a.shape), -1.0, 1.0)
    return a, a, {}

  return policy_fn


def describe(env: PointMaze) -> dict[str, Any]:
  """A JSON-ready summary of a maze: name, height, width, free_cells (count), goal_cell, start_cell, max_episode_steps.

  Args:
    env: the PointMaze.

  Returns:
    dict of Python values (cells as [row, col] lists).
  """
  return {"name": env.spec.name, "height": env.height, "width": env.width, "free_cells": int(env.free_cells.shape[0]),
          "goal_cell": env.goal_cell.tolist(), "start_cell": env.start_cell.tolist(),
          "max_episode_steps": env.spec.max_episode_steps}
