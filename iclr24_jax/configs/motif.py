"""Motif: Intrinsic Motivation from Artificial Intelligence Feedback (Klissarov, D'Oro et al., ICLR 2024).

Paper: https://arxiv.org/abs/2310.00166   Official code: https://github.com/facebookresearch/motif

Run:  python -m experiments.main --config=configs/motif.py:tiny --workdir=runs/motif_tiny
      python -m experiments.main --config=configs/motif.py --workdir=runs/motif            # toy, SmolLM2 labels
      python -m experiments.main --config=configs/motif.py:oracle --workdir=runs/motif_oracle
      python -m experiments.main --config=configs/motif.py:nethack --workdir=runs/motif_nethack
Variants (comma-separated): '' (the captioned gridworld, SmolLM2 annotator), 'oracle' (the toy's oracle
labels), 'generate' (official generate-and-parse annotation), 'nethack' (NetHackScore, host-loop PPO),
'staircase_weights' (alpha_ext 10, alpha_int 0.1, reward_scale 0.1: the official goal-task weighting, 1:0.1 per
unit), 'tiny' (seconds), 'paper' (the official Llama-2-70B annotator's sizes, compiled ahead of time by
`python -m experiments.scale --only motif`).
`num_steps` counts PPO updates of each toy agent.
"""
import ml_collections

from iclr24_jax.configs import ppo as ppo_config
from iclr24_jax.configs import variants

VARIANTS = ("", "tiny", "oracle", "generate", "nethack", "staircase_weights", "paper")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The Motif config: the captioned gridworld annotated by SmolLM2, unless `arg` changes the annotator or env.

  Args:
    arg: comma-separated variants: 'tiny', 'oracle' (the toy's oracle labels), 'generate' (generate-and-parse
      annotation), 'nethack' (NetHackScore with host-loop PPO), 'staircase_weights' (alpha_ext 10,
      alpha_int 0.1), 'paper' (the official annotator's sizes); None or '' gives the default.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant.
  """
  parts = variants.parse(arg, VARIANTS, name="motif")
  c = ml_collections.ConfigDict()
  c.paper = "motif"
  c.seed = 0
  # The environment: the toy captioned gridworld (pure JAX) or NetHack (host side).
  c.env = ml_collections.ConfigDict(dict(name="toy", height=7, width=13, max_episode_steps=80, noise_prob=0.15))
  # The observation data set the caption pairs are drawn from (random + scripted agents).
  c.data = ml_collections.ConfigDict(dict(name="toy_captions", data_dir="", num_envs=32, num_steps=100,
                                          scripted_epsilon=0.2, num_pairs=300, holdout=0.2,
                                          oracle_pairs=3000))  # the study's dense-oracle arm
  # Annotation: 'smollm2' (log-odds of "1" vs "2", both orders), 'oracle' (toy only), 'generate' (parse text).
  c.annotation = ml_collections.ConfigDict(dict(
      annotator="smollm2", tau=0.0, batch_size=8, widths=(256, 288, 320, 352, 384, 448, 512),
      task="", cache_dir="", max_new_tokens=48, temperature=0.1, top_p=0.95))
  # Reward model (official lt_cnn message encoder + 512-wide trunk) and its training.
  c.model = ml_collections.ConfigDict(dict(embed_dim=32, hidden=64, trunk=512))
  c.optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=1e-3))
  c.reward_steps = 300
  # Intrinsic reward (official NetHackScore run: beta 3, eps = 0.5 quantile, alpha_ext = alpha_int = 0.1 with
  # reward_scale 0.1 on the game reward only: 0.01 per score point vs 0.1 per unit of r_int, i.e. 1:10).
  # Deviation: the toy weights one unit of goal reward and one unit of r_int 1:1 (alpha 1, reward_scale 1); its
  # only extrinsic reward is 1 at the goal, where NetHack's score grows by ~1-20 points per event.
  c.intrinsic = ml_collections.ConfigDict(dict(beta=3.0, eps_quantile=0.5, alpha_ext=1.0, alpha_int=1.0,
                                               settings=("intrinsic", "extrinsic", "both")))
  c.num_seeds = 8
  c.eval_envs = 64
  # The agent: PPO (PureJaxRL-style, one jitted program vmapped over seeds and reward settings).
  agent = ppo_config.ppo_defaults()
  agent.num_steps = 100
  agent.model = ml_collections.ConfigDict(dict(policy_hidden=(64, 64), value_hidden=(64, 64), activation="tanh"))
  agent.optimizer.learning_rate = 1e-3
  agent.ppo.update(dict(num_envs=16, rollout_steps=64, num_minibatches=4, update_epochs=4, gamma=0.99,
                        ent_coef=0.01, reward_scale=1.0))
  c.agent = agent
  c.num_steps = agent.num_steps
  # NetHack (variant 'nethack'; also the reproduction's NetHack rows).
  c.nethack = ml_collections.ConfigDict(dict(
      task="NetHackScore-v0", num_envs=4, collect_steps=250, num_pairs=300, max_unique_pairs=24,
      updates=4, rollout_steps=64, max_episode_steps=0, goal="defaultgoal",
      alpha_ext=0.1, alpha_int=0.1,  # official NetHackScore weights
      checkpoint_every=2))   # PPO updates between saves of each NetHack agent (games saved as replays)
  # The NetHack agents (host-loop PPO) start from the PPO defaults; `nethack_motif.agent_config` sets the budget
  # above and the official reward scale and clip.
  c.nethack.agent = ppo_config.ppo_defaults()
  c.log_every = 10
  c.eval_every = 0
  # The reward model saves every checkpoint_every Adam steps, the toy agents every agent.checkpoint_every PPO
  # updates (their whole RunnerStates), the NetHack agents every nethack.checkpoint_every updates; all also every
  # checkpoint_every_secs and on SIGTERM / SIGINT.
  c.checkpoint_every = 100
  c.agent.checkpoint_every = 25
  c.checkpoint_every_secs = 600.0
  c.mesh = ml_collections.ConfigDict(dict(data=1, model=1))
  if "oracle" in parts:
    c.annotation.annotator = "oracle"
  if "generate" in parts:
    c.annotation.annotator = "generate"
  if "staircase_weights" in parts:
    c.intrinsic.alpha_ext, c.intrinsic.alpha_int = 10.0, 0.1
    c.agent.ppo.reward_scale = 0.1
  if "nethack" in parts:
    c.env.name = "nethack"
    c.data.name = "nethack_messages"
  if "paper" in parts:
    # The official annotation (facebookresearch/motif@51b5f47): scripts/annotate_pairs_dataset.py:30 (Llama-2
    # 70B chat, the default size), :32 (8 GPUs), :37 (2,000 prompts per batch), :14 (the pairs in ./motif_dataset);
    # rlaif/llms.py:29-30 (vLLM, tensor parallel over the 8 GPUs, float16, at most 4,096 tokens per forward),
    # :49-50 (top-k 50, temperature 0.1, top-p 0.95, up to 4,096 new tokens).
    c.env.name = "nethack"
    c.data.name = "motif_dataset"
    c.data.data_dir = ""
    c.annotation.update(dict(annotator="generate", batch_size=2000, max_new_tokens=4096, temperature=0.1,
                             top_p=0.95))
    c.mesh = ml_collections.ConfigDict(dict(data=-1, model=8))
    # What experiments.scale compiles: one annotation step, a prefill of 8 prompts x 512 tokens (4,096 tokens, the
    # size of one vLLM forward) read as the log-probabilities of '1' / '2' (the library's log-odds annotator; the
    # official parses sampled text). Weights in bfloat16 (the official float16: same bytes and FLOPs).
    c.scale = ml_collections.ConfigDict(dict(
        model="llama2_70b", batch_size=8, seq_len=512, num_options=2, param_dtype="bfloat16",
        paper_hardware="8 GPUs, tensor parallel (annotate_pairs_dataset.py:32, rlaif/llms.py:29)",
        paper_time="not stated in the official code",
        source="facebookresearch/motif@51b5f47 scripts/annotate_pairs_dataset.py:14,30,32,37; "
               "rlaif/llms.py:29-30,49-50"))
  if "tiny" in parts:
    c.env.update(dict(height=5, width=9, max_episode_steps=30))
    c.data.update(dict(num_envs=8, num_steps=40, num_pairs=60, oracle_pairs=120))
    c.model.update(dict(trunk=64))
    c.reward_steps = 20
    c.num_seeds = 2
    c.eval_envs = 8
    c.agent.num_steps = 3
    c.checkpoint_every = 10
    c.agent.checkpoint_every = 1
    c.agent.ppo.update(dict(num_envs=8, rollout_steps=16, num_minibatches=2, update_epochs=1))
    c.num_steps = 3
    c.nethack.update(dict(num_envs=2, collect_steps=20, num_pairs=20, max_unique_pairs=4, updates=1,
                          rollout_steps=8, checkpoint_every=1))
    if c.annotation.annotator == "smollm2":  # tiny runs load no LM (the tests cover the LM judge)
      c.annotation.annotator = "keywords" if "nethack" in parts else "oracle"
  return c
