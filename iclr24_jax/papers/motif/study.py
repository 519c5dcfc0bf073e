"""Motif small-scale study: `reproduce` (toy captioned gridworld with SmolLM2 and oracle labels, 8 seeds per
reward setting in one vmapped program; NetHack measurements at a CPU budget) and `benchmark` (reward-model
training pairs/s, SmolLM2 annotations/s, environment steps/s with the reward in the loop)."""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import bench, stats
from iclr24_jax.papers.motif import annotators, experiment, nethack_motif, toy, train

PAPER = "motif"
CLAIM_INT = ("intrinsic-only agent beats the score-trained (extrinsic-only) agent on NetHackScore (paper Fig. 3, "
             "2e9 steps)")
CLAIM_BOTH = "intrinsic + extrinsic is the best agent on NetHackScore (paper Fig. 3)"
# The paper sentences the claim rows test.
BASIS_INT = ("'by only learning to maximize its intrinsic reward, Motif achieves a higher game score than an algorithm "
             "directly trained to maximize the score itself' (abstract; Fig. 3)")
BASIS_BOTH = ("'When combining Motif's intrinsic reward with the environment reward, our method significantly "
              "outperforms existing approaches' (abstract; Fig. 3)")

# Headline claims of the abstract that no row tests yet (experiments/reproduce.py tables them as 'not run').
NOT_RUN = [
    stats.not_run_row(
        paper=PAPER, experiment="NetHack: intrinsic-only and intrinsic + extrinsic agents vs the score-trained one",
        metric="NetHackScore of the final policy", paper_value="Fig. 3 (2e9 env steps per run)",
        basis=BASIS_INT, reason=("the NetHack agents here run a few thousand CPU steps (measurement rows); the claim "
                                 "is judged only on the toy gridworld"),
        variant="configs/motif.py:nethack at the paper's budget (APPO, 2e9 env steps, Llama 2 70B labels) on "
                "accelerators"),
    stats.not_run_row(
        paper=PAPER, experiment="NetHack: sparse-reward tasks (the oracle task)", metric="task success rate",
        basis=("'makes progress on tasks where no advancements have ever been made without demonstrations' "
               "(abstract)"),
        reason="needs NetHack agents trained for billions of steps",
        variant="configs/motif.py:nethack with the oracle task's reward at the paper's budget"),
    stats.not_run_row(
        paper=PAPER, experiment="steering the agent by the annotation prompt", metric="behaviour under a changed goal",
        basis=("'Motif mostly generates intuitive human-aligned behaviors which can be steered easily through prompt "
               "modifications' (abstract)"),
        reason="every run uses one annotation prompt ('defaultgoal')",
        variant="configs/motif.py with annotation_prompt(..., task=<another goal>) against the default prompt"),
    stats.not_run_row(
        paper=PAPER, experiment="annotator LLM size and prompt information", metric="agent score vs annotator size",
        basis=("'while scaling well with the LLM size and the amount of information given in the prompt' "
               "(abstract)"),
        reason="one annotator LLM (SmolLM2-135M) labels the pairs",
        variant="configs/motif.py with several annotator LLM sizes (c.annotation) and prompts with less information"),
]


def rank_note(fitted: dict) -> str:
  """Mean normalised reward per toy event, highest first (what the intrinsic reward pays for)."""
  f = fitted["fit"]
  r_hat = (np.asarray(fitted["caption_rewards"]) - f["mu"]) / f["sigma"]
  ev = {e: float(np.mean(r_hat[toy.CAPTION_EVENT == i])) for i, e in enumerate(toy.EVENTS)}
  return ", ".join(f"{e} {v:+.2f}" for e, v in sorted(ev.items(), key=lambda kv: -kv[1])) + f" (eps {f['eps']:+.2f})"


def _config(fast: bool, *, get_config: Callable[[str], Any]):
  c = get_config("tiny" if fast else "")
  if fast:
    c.num_seeds = 3
  return c


def reproduce(workdir: str, fast: bool = False, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Rows: (a) SmolLM2's agreement with the toy oracle, (b) held-out pair accuracy of the reward models, (c) toy
  success of intrinsic-only / extrinsic-only / both agents with SmolLM2 and oracle labels, and with the oracle's
  values used directly as r_phi without a learned model (claims judged on paired seeds), (d) NetHack measurements
  (steps/s, score and messages at a CPU budget; no claims).

  Args:
    workdir: output folder (created).
    fast: the 'tiny' config, no LM (the keyword source is labelled by the oracle): a smoke test.
    get_config: `get_config(variant)` of configs/motif.py (the runners pass it; tests pass the module's).

  Returns:
    list of reproduction row dicts.
  """
  os.makedirs(workdir, exist_ok=True)
  c = _config(fast, get_config=get_config)
  t_start = time.time()
  key = jax.random.key(int(c.seed))
  k_data, k_reward, k_agents = jax.random.split(key, 3)
  env = train.toy_env(c)
  captions = train.toy_dataset(c, env, k_data)
  pairs = train.sample_pairs(captions, int(c.data.num_pairs), int(c.seed))
  llm_kind = "keywords" if fast else "smollm2"  # fast: no LM (a smoke test of the pipeline)
  dense = f"oracle-{int(c.data.oracle_pairs)}pairs"
  dense_pairs = train.sample_pairs(captions, int(c.data.oracle_pairs), int(c.seed) + 1)
  sources = {}
  # The LLM and the oracle label the same pairs; 'dense' is the oracle with many more pairs (free to annotate;
  # the paper's data set has 500k pairs).
  for kind, judge_kind, ps in (("oracle", "oracle", pairs), (llm_kind, llm_kind, pairs),
                               (dense, "oracle", dense_pairs)):
    judge, name = annotators.make_judge(c, "oracle" if judge_kind == "keywords" else judge_kind)
    cache_name = name
    if kind == "keywords":
      name = "oracle-copy"
    elif kind == dense:
      name = dense
    t0 = time.time()
    recs = annotators.annotate(c, ps, c.annotation.task or toy.TASK, judge, cache_name,
                               annotators.cache_path(c, workdir, cache_name.replace("/", "_")))
    sources[kind] = dict(name=name, records=recs, seconds=time.time() - t0,
                         agreement=annotators.label_agreement(recs),
                         fitted=train.fit_from_records(c, recs, k_reward))
  llm = sources[llm_kind]
  rows: list[dict] = []
  ag = llm["agreement"]
  lo, hi = stats.bootstrap_ci(ag["correct"]) if ag["n"] else (float("nan"), float("nan"))
  rows.append(dict(
      paper=PAPER, experiment="toy: annotator vs oracle", metric="label agreement (distinct oracle-decided pairs)",
      ours=f"{llm['name']}: {ag['agreement']:.3f} [95% CI {lo:.3f}, {hi:.3f}] on {ag['n']} pairs; ties "
           f"{ag['tie_rate']:.2f}; chance 0.5",
      paper_value="Llama 2 70B annotations (not available offline); the paper reports no agreement figure",
      holds=None, kind="measurement", notes=f"debiased log-odds of '1' vs '2' over both presentation orders (tau "
                        f"{c.annotation.tau}); {llm['seconds']:.0f} s to annotate"
                        + (" (all read from the annotation cache of an earlier run)"
                           if all(r["cached"] for r in llm["records"]) else "")))
  for kind in ("oracle", llm_kind, dense):
    f = sources[kind]["fitted"]
    rows.append(dict(
        paper=PAPER, experiment=f"toy: reward model ({sources[kind]['name']} labels)",
        metric="held-out pair accuracy (unseen caption pairs)",
        ours=f"vs its labels {f['heldout_accuracy']:.3f} (n={f['heldout_n']}); vs oracle "
             f"{f['heldout_oracle_accuracy']:.3f} (n={f['heldout_oracle_n']}); train {f['train_accuracy']:.3f}",
        paper_value="validation accuracy on held-out annotated pairs (official train_reward.py)", holds=None,
        kind="measurement",
        notes=f"{len(sources[kind]['records'])} pairs ({sources[kind]['agreement']['distinct_pairs']} distinct "
              f"non-identical), 20% of distinct pairs held out; official lt_cnn encoder. Normalised r_phi: "
              + rank_note(sources[kind]["fitted"])))
  # (c) all agents in one program: extrinsic-only, then intrinsic-only / both per label source, and the
  # no-model arm: the oracle's values used directly as r_phi (normalised and thresholded on the dense arm's
  # training messages), which separates what the reward model learns from what the intrinsic reward does.
  values = "oracle-values"
  sources[values] = dict(name="oracle values, no reward model",
                         fitted=train.oracle_values_fit(c, sources[dense]["records"]))
  arms = ("oracle", llm_kind, dense, values)
  settings = [(sources["oracle"]["name"], "extrinsic")]
  for kind in arms:
    settings += [(sources[kind]["name"], "intrinsic"), (sources[kind]["name"], "both")]
  fits = {sources[k]["name"]: sources[k]["fitted"] for k in sources}
  agents = train.toy_agents(c, env, train.toy_settings(c, fits, settings), k_agents, int(c.num_seeds))
  succ = agents["final"]["success"]                            # [S, seeds]
  label = lambda i: ("extrinsic" if settings[i][1] == "extrinsic" else f"{settings[i][1]} ({settings[i][0]})")
  names = [label(i) for i in range(len(settings))]
  plot = experiment.plot_toy(agents, names, os.path.join(workdir, "toy_success.png"),
                             f"toy {env.height}x{env.width}, {c.agent.num_steps} PPO updates x "
                             f"{c.agent.ppo.num_envs * c.agent.ppo.rollout_steps} steps")
  budget = (f"{c.agent.num_steps} PPO updates x {c.agent.ppo.num_envs * c.agent.ppo.rollout_steps} env steps, "
            f"{env.height}x{env.width} world, {env.spec.max_episode_steps}-step episodes; random agent succeeds "
            f"~1%")
  key_of = lambda i: f"key {agents['final']['key'][i].mean():.2f}, unlock {agents['final']['unlock'][i].mean():.2f}"
  for kind in arms:
    src = sources[kind]["name"]
    i_int = settings.index((src, "intrinsic"))
    i_both = settings.index((src, "both"))
    extra_note = ""
    if kind == llm_kind:
      extra_note = (f" Annotator agreement with the oracle: {ag['agreement']:.2f} (row above); the oracle-label "
                    "rows run the same code.")
    elif kind == values:
      extra_note = (" r_phi = the oracle's values (goal 3, unlock 2, key 1, bump -1, else 0), no reward model; "
                    f"mu, sigma and eps from the {dense} arm's training messages.")
    for a, b, claim, nb in ((i_int, 0, CLAIM_INT, "extrinsic"), (i_both, 0, CLAIM_BOTH, "extrinsic"),
                            (i_both, i_int, CLAIM_BOTH, "intrinsic")):
      row = stats.compare_row(
          paper=PAPER, experiment=f"toy: {src}" + ("" if kind == values else " labels"),
          metric="success rate of the final policy",
          a=succ[a], b=succ[b], name_a=names[a], name_b=nb if nb == "extrinsic" else names[b], paper_value=claim,
          direction="greater", paired=True, kind="claim", basis=BASIS_INT if claim == CLAIM_INT else BASIS_BOTH,
          notes=f"{budget}. {names[a]}: {key_of(a)}; {names[b]}: {key_of(b)}. "
                f"Normalised r_phi by event: {rank_note(sources[kind]['fitted'])}.{extra_note}",
          plots=[plot])
      if row["holds"] == "no":
        row["notes"] += (" Bug checks behind this 'no': the intrinsic reward, the count decay and the toy's events "
                         "match hand-computed values (tests/papers/motif/), and the agents do maximise the "
                         "reward (the key / unlock rates above): the verdict is about "
                         + ("these reward values (no learned model) and budget." if kind == values
                            else "this reward model and budget."))
      rows.append(row)
  rows.append(dict(paper=PAPER, experiment="toy: agents", metric="env steps/s (PPO, reward in the loop, "
                   f"{len(settings)} settings x {c.num_seeds} seeds vmapped, incl. compile)",
                   ours=f"{agents['env_steps'] / agents['seconds']:,.0f} ({agents['env_steps']:,} steps in "
                        f"{agents['seconds']:.0f} s)", paper_value=None, holds=None, kind="measurement", notes=""))
  # (d) NetHack at a CPU budget.
  if fast:
    c.annotation.annotator = "keywords"
  nh_judge, nh_name = annotators.make_judge(c, "keywords" if fast else "smollm2")
  nh = nethack_motif.nethack_pipeline(c, workdir, nh_judge, nh_name)
  runs = nh["runs"]
  rows.append(dict(
      paper=PAPER, experiment="NetHack: environment", metric="env steps/s (NetHackScore-v0, host, 1 process)",
      ours=f"random {nh['collect_steps_per_s']['random']:,.0f}, scripted {nh['collect_steps_per_s']['scripted']:,.0f}"
           f"; HostPPO with the Motif hook (collect + hook + learn): "
           + ", ".join(f"{k} {r['steps_per_s']:,.0f}" for k, r in runs.items()),
      paper_value="APPO, 2e9 steps per run", holds=None, kind="measurement",
      notes=f"{c.nethack.num_envs} games in one process"))
  rows.append(dict(
      paper=PAPER, experiment="NetHack: reward model", metric="messages, annotated pairs, held-out accuracy",
      ours=f"{nh['num_messages']} messages ({nh['unique_messages']} distinct) from a random and a scripted agent; "
           f"{nh['decided_pairs']}/{nh['annotated_pairs']} pairs decided by {nh_name} in "
           f"{nh['annotate_seconds']:.0f} s; held-out accuracy {nh['reward']['heldout_accuracy']:.2f} "
           f"(n={nh['reward']['heldout_n']})",
      paper_value="500k pairs annotated by Llama 2 70B", holds=None, kind="measurement",
      notes="top r_phi: " + "; ".join(f"{t!r} {r:+.2f}" for r, t in nh["ranked_messages"][:3])
            + " | bottom: " + "; ".join(f"{t!r} {r:+.2f}" for r, t in nh["ranked_messages"][-2:])))
  for k, r in runs.items():
    ret = r["episode_returns"]
    rows.append(dict(
        paper=PAPER, experiment=f"NetHack: {k} agent", metric="score and messages at a CPU budget",
        ours=(f"{r['env_steps']:,} steps; finished episodes' mean score "
              + (f"{np.mean(ret):.1f} ({len(ret)} updates with episodes)" if ret else "n/a (none finished)")
              + f"; extrinsic/step {r['extrinsic_per_step']:.3f}, intrinsic/step {r['intrinsic_per_step']:.3f}; "
              f"{r['unique_messages']} distinct messages, {r['nonempty_fraction']:.2f} non-empty"),
        paper_value=CLAIM_INT if k == "intrinsic" else (CLAIM_BOTH if k == "both" else "baseline"), holds=None,
        kind="measurement",
        notes="no claim: a few thousand steps against the paper's 2e9"))
  for r in rows:
    r.setdefault("notes", "")
  print(f"motif reproduce: {time.time() - t_start:.0f} s")
  return rows


def benchmark(quick: bool = True, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Reward-model training pairs/s (official sizes), SmolLM2 annotations/s (both orders), env steps/s with
  the Motif reward in the loop (toy PPO, jitted; NetHack, host)."""
  from iclr24_jax.papers.motif import annotation, reward_model
  import optax
  rows = []
  c = get_config("")
  model = train.reward_net(c)
  # 1) reward-model training step (pairs of distinct 256-byte messages, official batch 1024 in the full run).
  rng = np.random.default_rng(0)
  tx = optax.adam(1e-3)
  fresh = lambda: (lambda p: (p, tx.init(p)))(reward_model.init_params(jax.random.key(0), model))
  state = fresh()  # the timed step donates its state: every use gets new buffers

  def step(state, batch):
    p, o = state
    (_, m), g = jax.value_and_grad(lambda q: reward_model.preference_loss(q, batch, model), has_aux=True)(p)
    u, o = tx.update(g, o, p)
    return (optax.apply_updates(p, u), o), m["loss"]        # time_fn(carry=True) feeds out[0] back

  for b in ((128,) if quick else (128, 1024)):
    msgs = rng.integers(32, 127, size=(2, b, 256)).astype(np.uint8)
    msgs[..., rng.integers(20, 80):] = 0
    batch = {"message_1": jnp.asarray(msgs[0]), "message_2": jnp.asarray(msgs[1]),
             "label": jnp.asarray(rng.integers(0, 3, b))}
    rows.append(bench.time_fn(jax.jit(step, donate_argnums=0), state, batch, carry=True, repeats=3 if quick else 10,
                              items=b, name="motif/reward-model train step (pairs/s; lt_cnn, 512 trunk)", batch=b))
    state = fresh()
  # 2) SmolLM2 annotations (one pair = two prompts, both presentation orders).
  judge, _ = annotators.make_judge(c, "smollm2")
  pairs = [(a, b) for a, b in zip(toy.CAPTIONS[:8], toy.CAPTIONS[8:16])]
  rows.append(bench.time_host(lambda: judge.margins(pairs, toy.TASK), repeats=1 if quick else 3, items=len(pairs),
                              name="motif/SmolLM2 annotation (pairs/s, log-odds, both orders)",
                              prompt_tokens=len(judge.tok.encode(annotation.chat_prompts(
                                  judge.tok, [annotation.annotation_prompt(*pairs[0], toy.TASK)])[0]))))
  # 3) toy: PPO updates with the Motif reward (one seed; 16 envs x 64 steps per update).
  env = train.toy_env(c)
  agent_cfg = c.agent.copy_and_resolve_references()
  from iclr24_jax.rl import ppo
  table = jnp.linspace(-1.0, 2.0, toy.NUM_CAPTIONS)
  fn = train.toy_reward_fn(table, 0.0, 1.0, 0.0, 1.0, 1.0, 3.0, env.spec.max_episode_steps)
  agent = ppo.PPO(agent_cfg, env=env, reward_fn=fn)
  runner = jax.jit(agent.init)(jax.random.key(0))
  chunk = jax.jit(lambda r: agent.train_chunk(r, 5)[0])
  n_steps = 5 * agent.num_envs * agent.rollout_steps
  rows.append(bench.time_fn(chunk, runner, carry=False, repeats=3, items=n_steps,
                            name="motif/toy PPO with the Motif reward (env steps/s, incl. learning)"))
  # 4) NetHack: host collection + the Motif hook (cached r_phi per message), no learning.
  from iclr24_jax.papers.motif import intrinsic, nethack_motif
  from iclr24_jax.rl import nethack, ppo_host
  venv = nethack.NetHackVecEnv(num_envs=4, seed=0)
  hook = intrinsic.MotifRewardHook(nethack_motif.message_reward_fn(fresh()[0], model), 0.0, 1.0, 0.0, 4)
  host_cfg = c.nethack.agent.copy_and_resolve_references()
  host_cfg.ppo.rollout_steps = 64
  host = ppo_host.HostPPO(host_cfg, venv, nethack.NetHackNet(venv.num_actions))
  st = host.init(jax.random.key(0))
  rows.append(bench.time_host(lambda: hook(host.collect(st, jax.random.key(1))), repeats=2 if quick else 5,
                              items=4 * 64, name="motif/NetHack collect + Motif hook (env steps/s, 4 games)"))
  venv.close()
  return rows


def scale_program(config, mesh):
  """The paper-size routine for `experiments.scale`: one annotation step of the Llama-2-70B annotator.

  The prefill of `scale.batch_size` caption-pair prompts of `scale.seq_len` tokens (4,096 tokens: one vLLM forward
  of the official annotator) and the log-probabilities of '1' / '2' (`configs/motif.py:paper`).

  Args:
    config: `get_config('paper')`.
    mesh: the ('data', 'model') mesh.

  Returns:
    common.scale.Program (params, ids, mask, option_ids) -> [B, 2] log-probabilities.
  """
  from iclr24_jax.common import scale as scale_lib
  from iclr24_jax.lm import scale as lm_scale
  s = scale_lib.paper_scale(config, PAPER)
  return lm_scale.llama_choice_program(
      "Llama-2-70B annotation step (prefill + preference log-probabilities)", lm_scale.named_model(s.model), mesh,
      s.batch_size, s.seq_len, s.num_options, param_dtype=jnp.dtype(s.param_dtype),
      notes="The official annotator samples up to 4,096 tokens and parses them; this is the prefill both share.",
      paper_hardware=s.paper_hardware, paper_time=s.paper_time)
