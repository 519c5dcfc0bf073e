"""PPO on JAX environments: the RL family's end-to-end check (PureJaxRL-style jitted training).

PPO: Schulman et al. 2017, "Proximal Policy Optimization Algorithms", https://arxiv.org/abs/1707.06347

Run:  python -m experiments.main --config=configs/ppo.py:tiny --workdir=runs/ppo
Variants (after the colon): 'cartpole' (the default: gymnax CartPole-v1, PureJaxRL's settings),
'inverted_pendulum' (brax, spring backend), 'hopper' (brax, spring backend, CPU-sized budget),
'maze' (point-mass umaze, dense reward), 'tiny' (CartPole, a few updates: seconds).
num_steps counts PPO updates; env steps = num_steps * ppo.num_envs * ppo.rollout_steps.
"""
import ml_collections

from iclr24_jax.configs import variants

VARIANTS = ("", "cartpole", "inverted_pendulum", "hopper", "maze", "tiny")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The PPO family check: gymnax CartPole-v1 with PureJaxRL's settings unless `arg` picks another preset.

  Args:
    arg: '' or 'cartpole', 'inverted_pendulum' (brax), 'hopper' (brax, CPU budget), 'maze' (point-mass umaze)
      or 'tiny' (CartPole, a few updates); None means ''.

  Returns:
    ml_collections.ConfigDict (num_steps counts PPO updates).

  Raises:
    ValueError: unknown variant.
  """
  from iclr24_jax.rl.ppo import preset_config
  arg = variants.one(arg, VARIANTS, name="ppo")
  preset = {"": "cartpole", "tiny": "cartpole"}.get(arg, arg)
  c = preset_config(preset)
  c.paper = "ppo"
  c.variant = arg or "cartpole"
  c.data = ml_collections.ConfigDict(dict(name=c.env.name, data_dir=""))  # the environment is the data
  c.log_every = max(1, c.num_steps // 50)
  c.eval_every = max(1, c.num_steps // 5)
  c.eval_episodes = 32
  # Checkpoints (the whole RunnerState: networks, optimizer, environments, key) at chunk ends every checkpoint_every
  # updates (a multiple of log_every; 0: not by updates) and/or every checkpoint_every_secs seconds, and at the end;
  # SIGTERM / SIGINT save at the next chunk end and stop. By wall time: a save blocked the loop ~0.27 s on the
  # shared 2-core CPU (CartPole default, every 40 updates: 7 saves 1.9 s against 7.2 s of updates), so a save per
  # minute keeps it under 1% at any run length.
  c.checkpoint_every = 0
  c.checkpoint_every_secs = 60.0
  # Environments are sharded over mesh.data (1 = one device; -1 = all, needs ppo.num_envs divisible by it).
  c.mesh = ml_collections.ConfigDict(dict(data=1, model=1))
  if arg == "tiny":
    c.num_steps = 6
    c.ppo.num_envs = 4
    c.ppo.rollout_steps = 16
    c.ppo.num_minibatches = 2
    c.ppo.update_epochs = 2
    c.log_every = 2
    c.eval_every = 3
    c.eval_episodes = 4
    c.checkpoint_every = 2   # a save mid-run, so a resume test cuts the run in two
  return c
