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


def ppo_defaults() -> ml_collections.ConfigDict:
  """The PPO block every RL config builds on (`rl.ppo.PPO` reads it): PureJaxRL's CartPole hyper-parameters and a
  quarter of its 5e5-step budget; configs/unio4.py and configs/motif.py start from it too."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.env = ml_collections.ConfigDict(dict(name="gymnax/CartPole-v1", kwargs=ml_collections.ConfigDict()))
  c.model = ml_collections.ConfigDict(dict(policy_hidden=(64, 64), value_hidden=(64, 64), activation="tanh",
                                           squash="tanh", state_dependent_std=False, init_log_std=0.0))
  c.optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=2.5e-4, schedule="linear", end_factor=0.0,
                                               warmup_steps=0, eps=1e-5, grad_clip=0.5))
  c.num_steps = 244  # PPO updates (iterations); env steps = num_steps * num_envs * rollout_steps
  c.ppo = ml_collections.ConfigDict(dict(
      num_envs=4, rollout_steps=128, update_epochs=4, num_minibatches=4, gamma=0.99, gae_lambda=0.95,
      clip_eps=0.2, value_clip_eps=0.0, ent_coef=0.01, vf_coef=0.5, normalize_advantages=True,
      normalize_obs=False, obs_clip=10.0, reward_scale=1.0, reward_clip=0.0))
  return c


# Tested PPO settings per environment, as overrides of `ppo_defaults()`: 'cartpole' is PureJaxRL's CartPole-v1
# (244 updates = 1.25e5 env steps; PureJaxRL runs 5e5), 'inverted_pendulum' brax with the spring backend (~3e5
# env steps), 'hopper' brax spring with a CPU-sized budget, 'maze' the point-mass umaze with a dense reward.
# The offline data agents (`rl.offline.get_dataset(..., agent_config=preset(...))`) are these presets.
PRESETS = {
    "cartpole": {},
    "inverted_pendulum": dict(
        env=dict(name="brax/inverted_pendulum"), num_steps=150, optimizer=dict(learning_rate=1e-3),
        ppo=dict(num_envs=64, rollout_steps=32, num_minibatches=8, update_epochs=4, gamma=0.97, ent_coef=0.0,
                 normalize_obs=True, reward_scale=0.1)),
    "hopper": dict(
        env=dict(name="brax/hopper"), num_steps=600, optimizer=dict(learning_rate=3e-4),
        model=dict(policy_hidden=(128, 128), value_hidden=(128, 128), activation="swish"),
        ppo=dict(num_envs=128, rollout_steps=32, num_minibatches=8, update_epochs=4, gamma=0.97, ent_coef=1e-3,
                 normalize_obs=True, reward_scale=0.1)),
    "maze": dict(
        env=dict(name="maze/umaze", kwargs=dict(reward="dense")), num_steps=100, optimizer=dict(learning_rate=1e-3),
        ppo=dict(num_envs=32, rollout_steps=64, num_minibatches=8, update_epochs=4, gamma=0.99, ent_coef=0.0,
                 normalize_obs=True, reward_scale=1.0)),
}


def preset(name: str) -> ml_collections.ConfigDict:
  """A full PPO config: `ppo_defaults()` with the overrides of PRESETS[name].

  Args:
    name: 'cartpole', 'inverted_pendulum', 'hopper' or 'maze'.

  Returns:
    ml_collections.ConfigDict in the `ppo_defaults()` layout.

  Raises:
    ValueError: an unknown preset.
  """
  if name not in PRESETS:
    raise ValueError(f"unknown PPO preset '{name}'; choose one of {sorted(PRESETS)}.")
  c = ppo_defaults()
  for block, values in PRESETS[name].items():
    if isinstance(values, dict):
      for k, v in values.items():
        c[block][k] = ml_collections.ConfigDict(v) if isinstance(v, dict) else v
    else:
      c[block] = values
  return c


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
  arg = variants.one(arg, VARIANTS, name="ppo")
  preset_name = {"": "cartpole", "tiny": "cartpole"}.get(arg, arg)
  c = preset(preset_name)
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
