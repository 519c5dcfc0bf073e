"""Environment interface (gymnax adapter: auto-reset, time limit, stats) and the point-mass maze."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.rl import envs, maze, rollout


@pytest.fixture(scope="module")
def cartpole():
  return envs.make_env("gymnax/CartPole-v1", max_episode_steps=5)


def test_gymnax_spec_and_reset(cartpole):
  assert cartpole.spec.discrete and cartpole.spec.action_dim == 2 and cartpole.spec.obs_shape == (4,)
  st = cartpole.reset_batch(jax.random.key(0), 3)
  chex.assert_shape(st.obs, (3, 4))
  chex.assert_type(st.obs, jnp.float32)


def test_time_limit_truncates_and_resets(cartpole):
  # Pushing alternately keeps the pole up for 5 steps: the 5th step is truncated (not terminated), the
  # returned obs is a fresh reset while final_obs is the state reached, and the stats record 5 steps.
  st = cartpole.reset(jax.random.key(1))
  step = jax.jit(cartpole.step)
  for t in range(5):
    st, ts = step(jax.random.key(10 + t), st, jnp.asarray(t % 2))
  assert bool(ts.truncated) and not bool(ts.terminated)
  assert float(ts.episode_return) == 5.0 and int(ts.episode_length) == 5
  assert int(st.step_count) == 0 and int(st.episodes) == 1 and float(st.last_return) == 5.0
  assert not np.allclose(ts.obs, ts.final_obs)


def test_rollout_shapes_and_stats(cartpole):
  st = cartpole.reset_batch(jax.random.key(0), 4)
  st, tr = jax.jit(lambda s, k: rollout.rollout(cartpole, rollout.random_policy(cartpole), s, k, 12))(
      st, jax.random.key(1))
  chex.assert_shape(tr.obs, (12, 4, 4))
  chex.assert_shape(tr.reward, (12, 4))
  # every env finishes at least 2 episodes of <= 5 steps in 12 steps; the episode returns are their lengths
  assert np.all(np.asarray(st.episodes) >= 2)
  done = np.asarray(tr.done)
  np.testing.assert_array_equal(np.asarray(tr.episode_return)[done], np.asarray(tr.episode_length)[done])


def test_make_env_errors():
  with pytest.raises(ValueError, match="family/id"):
    envs.make_env("CartPole-v1")
  with pytest.raises(ValueError, match="unknown environment family"):
    envs.make_env("atari/Pong")
  with pytest.raises(ValueError, match="unknown brax environment"):
    envs.make_env("brax/cheetah")


# --- maze ----------------------------------------------------------------------------------------------------
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
