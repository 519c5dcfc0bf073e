"""Reinforcement learning core: environments, rollouts, GAE, PPO, replay buffers, offline data sets.

Modules (import what you need; heavy dependencies load lazily):
  envs           Env interface (reset/step with time limit, auto-reset, episode stats); GymnaxEnv, BraxEnv, make_env
  maze           PointMaze (pure-JAX 2-D point mass, sparse goal reward) and the waypoint controller
  nethack        NetHackVecEnv (nle + gymnasium, host side), message decoding, NetHackNet
  distributions  Categorical, Gaussian, TanhGaussian, ClippedGaussian
  networks       MLP, GaussianPolicy, CategoricalPolicy, ValueNet, ActorCritic, make_actor_critic
  normalization  RunningStats: init / update / normalize (observation normalisation)
  losses         gae, gae_from_dones, ppo_clip_objective, value_loss, ppo_loss, normalize_advantages
  rollout        rollout.rollout (lax.scan), Transition, actor_critic_policy, random_policy, evaluate
  ppo            PPO, make_train(config) -> train(key) (configs: iclr24_jax/configs/ppo.py)
  ppo_host       HostPPO (host loop, discrete actions, reward hook), GymnasiumVecEnv
  replay         uniform and prioritised (sum-tree) replay buffers
  offline        D4RL-style data sets generated here (get_dataset), load_dataset, normalized_score
"""
from iclr24_jax.rl import distributions, losses, networks, normalization, replay, rollout  # noqa: F401
from iclr24_jax.rl.distributions import Categorical, ClippedGaussian, Gaussian, TanhGaussian, make_gaussian
from iclr24_jax.rl.env_base import Env, EnvSpec, EnvState, TimeStep
from iclr24_jax.rl.envs import BraxEnv, GymnaxEnv, make_env
from iclr24_jax.rl.losses import gae, gae_from_dones, ppo_clip_objective, ppo_loss, value_loss
from iclr24_jax.rl.ppo import PPO, make_train
from iclr24_jax.rl.rollout import Transition, evaluate

__all__ = [
    "Categorical", "ClippedGaussian", "Gaussian", "TanhGaussian", "make_gaussian",
    "BraxEnv", "Env", "EnvSpec", "EnvState", "GymnaxEnv", "TimeStep", "make_env",
    "gae", "gae_from_dones", "ppo_clip_objective", "ppo_loss", "value_loss",
    "PPO", "make_train",
    "Transition", "evaluate",
    "distributions", "losses", "networks", "normalization", "replay", "rollout",
]
