"""LDCQ: Reasoning with Latent Diffusion in Offline Reinforcement Learning (Venkatraman et al., ICLR 2024).

Paper: https://arxiv.org/abs/2309.06599 (ICLR 2024)
Official code: https://github.com/ldcq/ldcq

Run:  python -m experiments.main --config=configs/ldcq.py:tiny --workdir=runs/ldcq
Variants (after the colon):
  ''          maze/medium 'noisy' data, the official networks and optimiser settings (hours on a CPU)
  'umaze'     the same on maze/umaze (the short-horizon control)
  'cpu'       maze/medium at the CPU scale of the reproduction (small networks, short training; minutes)
  'cpu_umaze' maze/umaze at the CPU scale
  'tiny'      seconds: tiny networks, a few steps, 2 episodes
  'paper'     the official run's sizes on D4RL antmaze-large-diverse-v2 (the user's HDF5 file), compiled ahead of
              time by `python -m experiments.scale --only ldcq`
Pipeline: skill beta-VAE -> latent diffusion prior on the encoder's posterior means -> latents pre-sampled from
the prior at every s_H -> batch-constrained double Q-learning with prioritised replay -> acting by argmax Q over
latents sampled from the prior (the official maze2d two-stage planner by default), each run with the VAE prior + Q,
latent BC, the diffusion prior without Q, BC and the uniform random policy (the floor) beside it.
Data: rl.offline ('maze/<layout>', 'noisy': the noisy waypoint controller with random goals, which needs
stitching; cached under $ICLR24_RL_CACHE), or a user's D4RL file via data.path (.hdf5 needs h5py).
"""
import ml_collections

from iclr24_jax.configs import variants

VARIANTS = ("", "umaze", "cpu", "cpu_umaze", "tiny", "paper")


def cpu_scale(c: ml_collections.ConfigDict) -> None:
  """The CPU-scale settings of the reproduction (see the README's deviations)."""
  c.model.update(dict(z_dim=8, hidden=64, gru_layers=1, denoiser_hidden=64, denoiser_blocks=2, time_embed_dim=64,
                      q_hidden=64, q_head=(64, 32), bc_hidden=64))
  c.vae.update(dict(num_steps=1000, batch_size=64, learning_rate=1e-3))
  c.diffusion.update(dict(num_steps=2000, batch_size=256, learning_rate=1e-3, num_segments=8192))
  # Deviation: Polyak step 0.02 (official 0.005) so that 2000 updates propagate values over the maze's ~6 skills.
  c.q.update(dict(num_steps=2000, num_segments=2048, num_prior_samples=16, num_target_samples=8, tau=0.02))
  c.bc.update(dict(num_steps=1000))
  c.eval.update(dict(num_episodes=20, num_samples=16))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The LDCQ config: maze/medium 'noisy' data with the official networks unless `arg` picks a smaller scale.

  Args:
    arg: '' (maze/medium, official sizes), 'umaze', 'cpu' (the reproduction's CPU scale), 'cpu_umaze',
      'tiny' (seconds) or 'paper' (the official antmaze-large-diverse-v2 run); None means ''.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant.
  """
  arg = variants.one(arg, VARIANTS, name="ldcq")
  layout = "umaze" if "umaze" in arg else "medium"
  c = ml_collections.ConfigDict()
  c.paper = "ldcq"
  c.variant = arg or "default"
  c.seed = 0
  c.num_seeds = 1  # independent pipelines, vmapped (paired: same data)
  c.data = ml_collections.ConfigDict(dict(name=f"maze/{layout}", kind="noisy", num_transitions=100_000, path="",
                                          data_dir="", holdout=0.1, relabel_goal=True))
  # Deviation: H = 10 (official 30 for D4RL maze2d): this maze's point mass crosses a cell in ~5 steps and the
  # expert reaches the medium goal in ~20 steps (D4RL maze2d-medium: ~150), so 10 steps is a comparable skill.
  c.horizon = 10
  c.gamma = 0.995  # official DDQN / train_q_net.py default; r_{0:H} is discounted with the same gamma
  c.model = ml_collections.ConfigDict(dict(
      z_dim=16, hidden=256, gru_layers=4, policy_type="autoregressive",   # official SkillModel defaults
      denoiser_hidden=256, denoiser_blocks=3, time_embed_dim=128,          # Deviation: residual MLP, not the UNet
      q_hidden=256, q_head=(128, 32), bc_hidden=256))
  c.vae = ml_collections.ConfigDict(dict(num_steps=100_000, batch_size=128, learning_rate=5e-5, beta=0.05,
                                         terminal_loss=True))
  c.diffusion = ml_collections.ConfigDict(dict(
      schedule="linear", num_timesteps=100, beta_start=1e-4, beta_end=0.02, sample_steps=0, variance="beta",
      num_steps=100_000, batch_size=128, learning_rate=1e-4, num_segments=0))   # 0: every training segment
  c.q = ml_collections.ConfigDict(dict(
      num_steps=100_000, batch_size=128, learning_rate=1e-3, tau=0.005, max_grad_norm=1.0, alpha=0.6,
      per_beta0=0.3, per_beta_step=0.01, num_prior_samples=1000, num_target_samples=100, num_segments=0))
  c.bc = ml_collections.ConfigDict(dict(num_steps=100_000, batch_size=256, learning_rate=1e-3))
  # protocol 'maze': the official maze2d evaluation (eval/plan_skills_diffusion_maze2d.py: the two-stage planner,
  # an episode stops at the goal and scores 800 - t, normalised with the environment's references); 'return': the
  # generic argmax planner and the summed reward of a whole episode. num_samples: latents per replan (official
  # script default --num_diffusion_samples 50); episode_steps 800 (official: `while env_step < 800`).
  c.eval = ml_collections.ConfigDict(dict(protocol="maze", num_episodes=20, num_samples=50, exec_horizon=10,
                                          episode_steps=800))
  c.methods = ("ldcq", "vae_q", "latent_bc", "diffusion_prior", "bc", "random")
  c.fast_compile = False  # True: compile every stage at XLA level 0 on CPU (compile-bound small runs)
  c.log_every = 100
  c.eval_every = 0
  # Checkpoints: every training stage (vae, diffusion, q_ldcq, q_vae, bc) saves in workdir/<stage> at its chunk ends
  # (every log_every steps) every checkpoint_every of its own steps (0: not by steps) and/or every
  # checkpoint_every_secs seconds, and at its end; SIGTERM / SIGINT save at the next chunk end and stop.
  c.checkpoint_every = 0
  c.checkpoint_every_secs = 600.0
  c.mesh = ml_collections.ConfigDict(dict(data=1, model=1))
  if arg.startswith("cpu"):
    cpu_scale(c)
  if arg == "tiny":
    c.data.num_transitions = 100_000
    c.model.update(dict(z_dim=4, hidden=16, gru_layers=1, denoiser_hidden=16, denoiser_blocks=1, time_embed_dim=16,
                        q_hidden=16, q_head=(16, 8), bc_hidden=16))
    c.vae.update(dict(num_steps=5, batch_size=16))
    c.diffusion.update(dict(num_timesteps=10, num_steps=5, batch_size=16, num_segments=64))
    c.q.update(dict(num_steps=5, batch_size=16, num_prior_samples=4, num_target_samples=4, num_segments=64))
    c.bc.update(dict(num_steps=5, batch_size=16))
    c.eval.update(dict(num_episodes=2, num_samples=2, episode_steps=20))
    c.log_every = 1
    c.checkpoint_every = 2   # mid-stage saves (every stage has 5 steps), so a resume test cuts a stage in two
    c.fast_compile = True
  if arg == "paper":
    _paper(c)
  return c


def _paper(c: ml_collections.ConfigDict) -> None:
  """The official run's sizes on antmaze-large-diverse-v2 (ldcq/ldcq@7ec96f3), for `experiments.scale`."""
  # The official scripts' default data set (training/train_skills.py:64, train_diffusion.py:171,
  # train_q_net.py:149), read from the user's D4RL file.
  c.data = ml_collections.ConfigDict(dict(name="antmaze-large-diverse-v2", kind="", num_transitions=0, path="",
                                          data_dir="", holdout=0.1, relabel_goal=False))
  c.horizon = 30                  # train_skills.py:72 (and collect_*_dataset.py --horizon 30)
  # train_skills.py:65-71,82-84: beta 0.05, z 16, lr 5e-5, autoregressive policy, batch 128, h_dim 256; the GRU
  # encoder (train_skills.py:93) with 4 bidirectional layers (models/skill_model.py:364) - the default variant's.
  c.vae.update(dict(batch_size=128, learning_rate=5e-5, beta=0.05))
  # train_diffusion.py:173-175,187: 100 epochs, lr 1e-4, batch 32, 100 diffusion steps.
  c.diffusion.update(dict(batch_size=32, learning_rate=1e-4, num_timesteps=100))
  # train_q_net.py:140 builds DDQN with its defaults (models/dqn.py:14: lr 1e-3, tau 0.995, 100 of 1000 prior
  # samples per target) and gamma 0.995 (train_q_net.py:161), batch 128 (:153), PER alpha 0.6 (:162).
  c.q.update(dict(batch_size=128, learning_rate=1e-3, tau=0.005, alpha=0.6, num_prior_samples=1000,
                  num_target_samples=100))
  c.gamma = 0.995
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
  # program: the step scale_program compiles ('q': the batch-constrained double-Q step with prioritised replay over
  # the whole Q data set, 'vae': the skill VAE step, 'diffusion': the latent diffusion prior's step).
  # num_segments: H = 30 windows of the 1,000,000 transitions (1,000 episodes of 1,000 steps: 971 each).
  # batch_size: the smallest of the three steps' batches (the diffusion prior's 32), so one mesh serves all.
  c.scale = ml_collections.ConfigDict(dict(
      program="q", programs=("q", "vae", "diffusion"), batch_size=32, state_dim=29, action_dim=8,
      num_segments=971_000,
      paper_hardware="one GPU (.cuda(): train_skills.py:136; --device cuda: train_diffusion.py:172, train_q_net.py:150)",
      paper_time="not stated in the official code",
      source="ldcq/ldcq@7ec96f3 training/train_skills.py:64-84,93; training/train_diffusion.py:171-187; "
             "training/train_q_net.py:140-162; models/dqn.py:14; models/skill_model.py:364"))
