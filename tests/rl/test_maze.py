"""The point-mass maze (`rl/maze.py`): layout and shortest paths, dynamics, walls, the sparse reward, the
waypoint controller."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.rl import maze, rollout


@pytest.fixture(scope="module")
def umaze():
  return maze.PointMaze("umaze")


def test_maze_layout_and_shortest_paths(umaze):
  assert umaze.walls_np.shape == (5, 5)
  assert umaze.goal_cell.tolist() == [1.0, 1.0]
  # U-maze: from the bottom-left free cell (3, 1) to the goal (1, 1) the path goes around: 6 moves.
  g, c = 1 * 5 + 1, 3 * 5 + 1
  assert umaze.dist_table[g, c] == 6
  assert umaze.start_cell.tolist() == [3.0, 1.0]  # the farthest free cell from the goal
  # every next-cell step reduces the distance by one
  for cell in range(25):
    if umaze.dist_table[g, cell] > 0:
      assert umaze.dist_table[g, int(umaze.next_cell[g, cell])] == umaze.dist_table[g, cell] - 1


def test_maze_free_dynamics(umaze):
  # In the open corridor (1, 2): v' = v (1 - 2 * 0.1) + 10 * a * 0.1, p' = p + v' * 0.1.
  pos, vel = jnp.array([1.0, 2.0]), jnp.array([0.0, 0.5])
  p2, v2 = umaze.dynamics(pos, vel, jnp.array([0.0, 0.3]))
  np.testing.assert_allclose(v2, [0.0, 0.5 * 0.8 + 0.3], rtol=1e-6)
  np.testing.assert_allclose(p2, [1.0, 2.0 + 0.07], rtol=1e-6)


def test_maze_walls_stop_motion(umaze):
  # (1, 2) has a wall below (row 2, column 2): pushing down for many steps never enters it.
  pos, vel = jnp.array([1.0, 2.0]), jnp.zeros(2)
  dyn = jax.jit(umaze.dynamics)
  for _ in range(30):
    pos, vel = dyn(pos, vel, jnp.array([1.0, 0.0]))
  assert float(pos[0]) <= 1.5 - umaze.radius + 1e-6
  assert float(vel[0]) == 0.0
  assert not bool(umaze.is_wall(pos))


def test_maze_sparse_reward(umaze):
  goal = jnp.array([1.0, 1.0])
  np.testing.assert_allclose(umaze.reward(jnp.array([1.3, 1.3]), goal), 1.0)  # distance 0.42 <= 0.5
  np.testing.assert_allclose(umaze.reward(jnp.array([1.4, 1.4]), goal), 0.0)  # distance 0.57 > 0.5


def test_waypoint_controller_reaches_goal_from_start():
  env = maze.PointMaze("umaze", random_start=False)
  pol = maze.waypoint_policy(env)
  ev = jax.jit(lambda k: rollout.evaluate(env, pol, k, num_envs=2))(jax.random.key(0))
  # 300 steps; the goal is 6 cells away: the controller arrives early and stays (sparse reward 1 per step there)
  assert float(ev["return"]) > 200.0


def test_maze_errors():
  with pytest.raises(ValueError, match="unknown maze layout"):
    maze.PointMaze("spiral")
  with pytest.raises(ValueError, match="enclosed"):
    maze.PointMaze(["#O#", "#O#", "###"])
  with pytest.raises(ValueError, match="jump through walls"):
    maze.PointMaze("umaze", max_speed=20.0)
