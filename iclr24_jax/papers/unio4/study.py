"""unio4: the small-scale reproduction (`reproduce`) and the benchmark (`benchmark`).

The method lives in the package's method modules and `experiment.run`; this module holds the studies that the
paper's claims are checked with (experiments/reproduce.py and experiments/benchmark.py call them).

Every comparison is judged on `config.study.seeds` (3) whole pipelines with `common.stats.compare_row`, paired by
seed: seed s pretrains once (critics, dynamics, BC ensemble) and every arm (one-step, multi-step with the official
"replace if better" rule, multi-step with the paired rule) improves that same BC ensemble with the same
improvement key, and is evaluated with the same environment key.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common import bench, metrics, sharding, stats
from iclr24_jax.papers.unio4 import bc as bc_lib, train
from iclr24_jax.papers.unio4 import improvement, stages
from iclr24_jax.papers.unio4 import data as data_lib
from iclr24_jax.papers.unio4.critics import Critics, critic_modules
from iclr24_jax.papers.unio4.experiment import data_score, dataset, norm, plot_offline, plot_online
from iclr24_jax.papers.unio4.model import init_ensemble
from iclr24_jax.rl import normalization

PAPER = "unio4"
ARMS = ("one-step", "multi-step", "multi-step, paired rule")


# The paper sentences the claim rows test.
BASIS_OFFLINE = "'the fusion of these two paradigms can yield superior offline initialization' (abstract; Table 1)"
BASIS_OPE = ("'Through a simple offline policy evaluation (OPE) approach, Uni-O4 can achieve multi-step policy "
             "improvement safely' (abstract)")
BASIS_OPE_FIG4 = ("'Through a simple offline policy evaluation (OPE) approach, Uni-O4 can achieve multi-step policy "
                  "improvement safely' (abstract; Fig. 4: the OPE score tracks the real return)")
BASIS_ONLINE = "'as well as stable and rapid online fine-tuning capabilities' (abstract)"

# Headline claims of the abstract that no row tests yet (experiments/reproduce.py tables them as 'not run').
NOT_RUN = [
    stats.not_run_row(
        paper=PAPER, experiment="D4RL benchmarks (locomotion, AntMaze, Adroit, Kitchen) against offline RL baselines",
        metric="normalised return", paper_value="the D4RL tables",
        basis=("'our method achieves state-of-the-art performance in both offline and offline-to-online fine-tuning "
               "learning' (abstract)"),
        reason=("the rows run brax inverted_pendulum against BC and one-step only; no D4RL data or CQL / IQL / "
                "other baselines here"),
        variant="configs/unio4.py:hopper_medium (and the other <env>_<kind> sets) with offline RL baselines beside it"),
    stats.not_run_row(
        paper=PAPER, experiment="real-world robot deployment", metric="task success on the robot",
        basis=("'Through real-world robot tasks, we highlight the benefits of this paradigm for rapid deployment' "
               "(abstract)"),
        reason="needs a physical robot",
        variant="a real-robot deployment (outside this library's simulators)"),
]


def reproduction_config(fast: bool = False, *, get_config: Callable[[str], Any]):
  """The CPU-scale settings of `reproduce` (configs/unio4.py 'reproduce' / 'reproduce_fast')."""
  return get_config("reproduce_fast" if fast else "reproduce")


def ope_rank_correlation(runs: list[dict]) -> float:
  """Spearman rank correlation between the OPE score and the real return over every (member, checkpoint) with
  both numbers, pooled over `runs` (outputs of `train.improve` with an `evaluate_fn`); step 0 counted once.

  Returns:
    rho in [-1, 1] (NaN when fewer than 3 points or a constant column).
  """
  from scipy.stats import spearmanr
  ope_at = lambda run: {row["step"]: row["ope"] for row in run["history"]}
  xs, ys = [], []
  for i, run in enumerate(runs):
    scores = ope_at(run)
    for step, returns in run["env_returns"]:
      if step in scores and not (step == 0 and i > 0):
        xs.extend(scores[step])
        ys.extend(np.asarray(returns).tolist())
  if len(xs) < 3 or np.ptp(xs) == 0 or np.ptp(ys) == 0:
    return float("nan")
  return float(spearmanr(xs, ys).statistic)


def accepted_margins(run: dict) -> list[float]:
  """OPE score minus the best score so far at every accepted replacement of an official-rule run."""
  out, best = [], None
  for row in run["history"]:
    if best is not None:
      for j, acc in enumerate(row.get("accepted", [])):
        if acc:
          out.append(float(row["ope"][j] - best[j]))
    best = row["ope_best"]
  return out


def _plot_ope_scatter(path: str, points: list[tuple[np.ndarray, np.ndarray]], env_name: str, title: str) -> str:
  fig, axes = metrics.new_figure(size=(4.6, 3.4))
  ax = axes[0, 0]
  for i, (x, y) in enumerate(points):
    ax.scatter(x, norm(env_name, y), s=10, alpha=0.7, label=f"seed {i}")
  ax.set_xlabel("OPE score (mean Q over imagined rollouts)")
  ax.set_ylabel("real normalised return")
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=7)
  return metrics.save_figure(fig, path)


def _scatter_points(runs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
  xs, ys = [], []
  for run in runs:
    scores = {row["step"]: row["ope"] for row in run["history"]}
    for step, returns in run["env_returns"]:
      if step in scores:
        xs.extend(scores[step])
        ys.extend(np.asarray(returns).tolist())
  return np.asarray(xs), np.asarray(ys)


def run_seed(c, data, env, seed: int, online: bool) -> dict:
  """One seed of the study: pretrain, the three improvement arms (same keys), the OPE noise, and (online) PPO
  fine-tuning from the chosen multi-step member beside PPO from scratch."""
  env_name = c.data.name
  k_pre, k_imp, k_eval, k_noise, k_on, k_scr = jax.random.split(jax.random.key(seed), 6)
  t0 = time.time()
  pre = train.pretrain(c, data, k_pre)
  ev = lambda p: train.evaluate_members(env, pre["policy"], p, data.obs_stats, k_eval, int(c.eval_episodes))
  out = {"seconds": dict(pre["seconds"])}
  runs = {}
  for arm in ARMS:
    ca = c.copy_and_resolve_references()
    ca.improve.replace_rule = "paired" if arm.endswith("paired rule") else "best"
    t = time.time()
    runs[arm] = train.improve(ca, pre, data, k_imp, replace=arm != "one-step", evaluate_fn=ev)
    out["seconds"][arm] = time.time() - t
  out["runs"] = runs
  out["bc"] = norm(env_name, runs["multi-step"]["env_returns"][0][1])
  for arm in ARMS:
    out[arm] = norm(env_name, runs[arm]["env_returns"][-1][1])
  out["rho"] = ope_rank_correlation([runs[a] for a in ARMS])
  # The OPE's own noise: the final multi-step members scored on independent draws of start states / model noise.
  draws = np.stack([train.score_policies(c, pre, data, runs["multi-step"]["params"], jax.random.fold_in(k_noise, j))
                    for j in range(int(c.study.ope_noise_draws))])          # [J, K]
  out["ope_noise_sd"] = float(np.mean(np.std(draws, axis=0, ddof=1)))
  margins = accepted_margins(runs["multi-step"])
  out["accepted_margin"] = float(np.mean(margins)) if margins else 0.0
  out["replacements"] = {a: runs[a]["replacements"] for a in ARMS}
  if online:
    multi = runs["multi-step"]
    sel = improvement.select_policy(multi["last_ope"], multi["env_returns"][-1][1], int(c.improve.select_top_k))
    init = train.online_init(pre, bc_lib.members(multi["params"])[sel], c)
    on = train.run_online(c.online, env, init, k_on)
    scr = train.run_online(c.scratch, env, None, k_scr)
    out["online"] = {"fine-tune": on, "scratch": scr}
    out["seconds"]["online"] = on["seconds"] + scr["seconds"]
  out["seconds"]["total"] = time.time() - t0
  return out


def reproduce(workdir: str, fast: bool = False, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Offline on brax inverted_pendulum 'medium': BC vs one-step vs multi-step (official gate) vs multi-step (paired
  gate), the OPE's rank correlation with the real return and its noise; offline-to-online: PPO fine-tuning from
  the Uni-O4 policy and V vs PPO from scratch. 3 seeds, paired; normalised returns (rl.offline references)."""
  t_start = time.time()
  os.makedirs(workdir, exist_ok=True)
  c = reproduction_config(fast, get_config=get_config)
  env_name = c.data.name
  env = train.get_env(env_name)
  seeds = tuple(range(int(c.study.seeds)))
  online = not fast
  rows: list[dict] = []
  for kind in tuple(c.study.kinds):
    c.data.kind = kind
    ds = dataset(c)
    data = train.prepare_data(c, ds)
    res = [run_seed(c, data, env, s, online and kind == "medium") for s in seeds]
    print(f"[unio4 reproduce] {kind}: {time.time() - t_start:.0f}s wall, {time.process_time():.0f}s process cpu",
          flush=True)
    r0 = res[0]["runs"]
    path = plot_offline(os.path.join(workdir, f"offline_{kind}.png"), env_name,
                        {f"{a} (seed 0)": r0[a]["env_returns"] for a in ARMS}, r0["multi-step"]["env_returns"][0][1],
                        title=f"{env_name} {kind}: offline improvement")
    scatter = _plot_ope_scatter(os.path.join(workdir, f"ope_vs_return_{kind}.png"),
                                [_scatter_points([r["runs"][a] for a in ARMS]) for r in res], env_name,
                                f"{kind}: OPE score vs real return (members x checkpoints)")
    exp = f"offline {kind} (brax inverted_pendulum, {len(seeds)} seeds paired)"
    per = {a: [float(np.mean(r[a])) for r in res] for a in ("bc",) + ARMS}
    secs = "; ".join(", ".join(f"{k} {v:.0f}" for k, v in r["seconds"].items()) for r in res)
    stamp = (f"K=4 members, {c.eval_episodes} episodes each; critics {c.critic.num_steps} steps ({c.critic.mode}), BC "
             f"{c.bc.num_steps}, {c.num_steps} improvement steps, OPE every {c.improve.eval_every} on "
             f"{c.improve.ope_batch} states, horizon {c.improve.ope_horizon}; replacements per seed "
             + ", ".join(f"{a} {[r['replacements'][a] for r in res]}" for a in ARMS[1:])
             + f"; {int(data.num_rows)} transitions (data episodes score {data_score(env_name, ds):.1f}); "
             f"seconds per seed: {secs}")
    rows.append(stats.compare_row(
        paper=PAPER, experiment=exp, metric="normalised return (mean of 4 members): multi-step vs BC",
        a=per["multi-step"], b=per["bc"], name_a="multi-step", name_b="BC", direction="greater",
        paper_value="multi-step improvement beats the BC policy (D4RL hopper-medium BC 52.9 -> Uni-O4 104.4, "
                    "Table 1)", notes=stamp, plots=[path, scatter], kind="claim", basis=BASIS_OFFLINE))
    rows.append(stats.compare_row(
        paper=PAPER, experiment=exp, metric="normalised return: multi-step vs one-step",
        a=per["multi-step"], b=per["one-step"], name_a="multi-step", name_b="one-step", direction="greater",
        paper_value="multi-step (OPE-gated behaviour replacement) beats one-step improvement",
        notes="one-step = the same run with the behaviour policies never replaced (BPPO-like anchor); same keys",
        plots=[], kind="claim", basis=BASIS_OPE))
    rows.append(stats.compare_row(
        paper=PAPER, experiment=exp, metric="normalised return: one-step vs BC",
        a=per["one-step"], b=per["bc"], name_a="one-step", name_b="BC", direction="greater",
        paper_value="one-step improvement beats BC (the BPPO baseline the paper builds on)", plots=[], kind="check",
        basis="checks the one-step improvement (BPPO) the multi-step one builds on; not a Uni-O4 statement"))
    rows.append(stats.compare_row(
        paper=PAPER, experiment=exp, metric="normalised return: multi-step with the paired gate vs one-step",
        a=per["multi-step, paired rule"], b=per["one-step"], name_a="paired gate", name_b="one-step",
        direction="greater",
        paper_value="multi-step beats one-step (here with a gate that only replaces beyond the OPE noise)",
        notes=(f"paired gate (improve.replace_rule='paired'): candidate vs current behaviour policy on the same "
               f"states and model noise, replace only if the mean per-state difference > {c.improve.paired_z:g} SE; "
               f"vs the official gate: paired {stats.fmt_mean_se(*stats.mean_se(per['multi-step, paired rule']))}, "
               f"official {stats.fmt_mean_se(*stats.mean_se(per['multi-step']))}"), plots=[], kind="check",
        basis="beyond the paper: our paired gate, a variant of the official rule; not a paper statement"))
    rho = [r["rho"] for r in res if np.isfinite(r["rho"])] or [0.0]  # NaN: a constant column (no ranking)
    rows.append(stats.compare_row(
        paper=PAPER, experiment=exp, metric="Spearman rank correlation: OPE score vs real return",
        a=rho, b=0.0, name_a="rho", name_b="no correlation", direction="greater",
        paper_value="the OPE ranks policies well enough to gate replacements (the paper's Fig. 4 shows OPE tracking "
                    "the real return)",
        notes=(f"pooled over 4 members x checkpoints every {c.improve.env_eval_every} steps of the 3 arms of each "
               "seed; plot ope_vs_return"), plots=[], kind="claim",
        basis=BASIS_OPE_FIG4))
    rows.append(stats.compare_row(
        paper=PAPER, experiment=exp, metric="OPE: mean margin of accepted replacements vs the OPE's own noise (SD)",
        a=[r["accepted_margin"] for r in res], b=[r["ope_noise_sd"] for r in res], name_a="accepted margin",
        name_b="noise SD", direction="greater",
        paper_value="(implicit in the official rule) a replacement is accepted on a real improvement, not on noise",
        notes=(f"noise = SD of one final policy's OPE score over {c.study.ope_noise_draws} draws of "
               f"{c.improve.ope_batch} start states and model noise (mean over members); margin = candidate score "
               "minus the best score so far at each accepted replacement of the official-rule run"), plots=[],
        kind="check",
        basis="implicit in the official rule, not a paper statement: does the gate accept more than noise"))
    if online and kind == "medium":
      rows += _online_rows(c, res, env_name, workdir)
  rows[0]["notes"] += f"; reproduce wall time {time.time() - t_start:.0f}s"
  if fast:  # tiny networks and a few steps: the intervals are shown, no verdict is drawn from them
    for r in rows:
      r["holds"] = None
  metrics.write_results(workdir, {"rows": rows})
  return rows


def _online_rows(c, res: list[dict], env_name: str, workdir: str) -> list[dict]:
  on = [norm(env_name, r["online"]["fine-tune"]["eval_return"]) for r in res]
  scr = [norm(env_name, r["online"]["scratch"]["eval_return"]) for r in res]
  path = plot_online(os.path.join(workdir, "online.png"), env_name,
                     {"PPO from Uni-O4 (policy + V), seed 0": res[0]["online"]["fine-tune"],
                      "PPO from scratch, seed 0": res[0]["online"]["scratch"]},
                     title=f"{env_name}: offline-to-online")
  drop = [float(s[0] - np.min(s[1:max(2, len(s) // 4 + 1)])) for s in on]
  exp = f"offline-to-online (inverted_pendulum medium, {len(res)} seeds paired)"
  o = c.online
  rows = [stats.compare_row(
      paper=PAPER, experiment=exp, metric="initial drop: start minus the minimum over the first quarter (points)",
      a=drop, b=10.0, name_a="drop", name_b="tolerance 10", direction="less",
      paper_value="no initial performance drop when online PPO starts from the offline policy", kind="claim",
      basis=BASIS_ONLINE,
      notes=(f"start {stats.fmt_mean_se(*stats.mean_se([s[0] for s in on]))}; holds = the drop is below 10 "
             f"normalised points beyond 2 SE ({o.eval_episodes} eval episodes); {o.num_steps} PPO updates of "
             f"{o.ppo.num_envs * o.ppo.rollout_steps} env steps, lr actor {o.policy_lr} / critic {o.value_lr}, "
             f"clip {o.ppo.clip_eps}"), plots=[path])]
  rows.append(stats.compare_row(
      paper=PAPER, experiment=exp, metric="mean normalised return over the online run (area under the curve)",
      a=[float(np.mean(s)) for s in on], b=[float(np.mean(s)) for s in scr], name_a="from Uni-O4",
      name_b="scratch", direction="greater", paper_value="fine-tuning from Uni-O4 rises faster than PPO from scratch",
      kind="claim", basis=BASIS_ONLINE,
      notes=(f"final {stats.fmt_mean_se(*stats.mean_se([s[-1] for s in on]))} vs "
             f"{stats.fmt_mean_se(*stats.mean_se([s[-1] for s in scr]))}; scratch = the RL core's tuned "
             "inverted_pendulum PPO preset (same env steps)"), plots=[]))
  return rows


# --- benchmark ------------------------------------------------------------------------------------------------------
def _synthetic_critics(obs_dim: int, act_dim: int, spec: dict, key: jax.Array) -> Critics:
  v_module, q_module = critic_modules(spec)
  vp = v_module.init(key, jnp.zeros((1, obs_dim)))["params"]
  qp = q_module.init(jax.random.fold_in(key, 1), jnp.zeros((1, obs_dim)), jnp.zeros((1, act_dim)))["params"]
  return Critics(vp, qp, normalization.init((obs_dim,)), v_module, q_module)


def benchmark(quick: bool = True, *, get_config: Callable[[str], Any]) -> list[dict]:
  """Offline improvement step (K = 4 policies, hopper sizes, official widths) at two batch sizes and online PPO
  fine-tuning updates (brax inverted_pendulum) on 1 and all devices (batch / environments split over 'data')."""
  c = get_config("")
  obs_dim, act_dim, k = 11, 3, int(c.bc.num_policies)
  crit_spec = train.critic_config(c)
  key = jax.random.key(0)
  critics = _synthetic_critics(obs_dim, act_dim, crit_spec, key)
  policy = bc_lib.make_policy(act_dim, c.model)
  params_host = jax.device_get(init_ensemble(key, policy, k, jnp.zeros((1, obs_dim))))
  tx = train.improvement_optimizer(c)
  stats_ = normalization.init((obs_dim,))

  def offline_case(mesh, batch):
    rep, dat = sharding.replicated_sharding(mesh), sharding.data_sharding(mesh)
    fresh = lambda: jax.tree.map(jnp.asarray, params_host)  # new buffers: the step donates its state
    state = jax.device_put(stages.ensemble_state(fresh(), tx, extra={"behaviour": fresh()}), rep)
    obs = jax.device_put(jax.random.normal(key, (batch, obs_dim)), dat)
    step = jax.jit(lambda s, o, kk: improvement.offline_ppo_step(s, o, kk, policy=policy, critics=critics,
                                                                 obs_stats=stats_, clip_eps=0.25, omega=0.7),
                   in_shardings=(rep, dat, rep), out_shardings=(rep, rep), donate_argnums=0)
    return step, (state, obs, jax.random.key(1)), dict(
        items=batch * k, name="unio4/offline_ppo_step (K=4, 256x3 policies, IQL critics 512x3 / 2x1024x2)",
        size=f"obs {obs_dim}, act {act_dim}", batch=batch)

  rows = bench.across_devices(offline_case, sizes=(512, 2048) if quick else (512, 2048, 8192), carry=True,
                              repeats=5 if quick else 20)
  # online: PPO fine-tuning updates on brax inverted_pendulum
  env = train.get_env("brax/inverted_pendulum")
  on = get_config("").online
  on.num_steps = 10
  on.ppo.update(dict(update_epochs=2, num_minibatches=4))
  ip_policy = bc_lib.make_policy(1, c.model)
  v_module, _ = critic_modules(crit_spec)
  init = {"policy": ip_policy.init(key, jnp.zeros((1, 4)))["params"], "value": v_module.init(key, jnp.zeros((1, 4)))
          ["params"]}
  obs_stats = data_lib.frozen_stats(np.random.default_rng(0).normal(size=(64, 4)))

  def online_case(mesh, num_envs):
    cfg = on.copy_and_resolve_references()
    cfg.ppo.num_envs = num_envs
    agent = train.FineTunePPO(cfg, env, ip_policy, v_module, init, obs_stats, mesh=mesh)
    runner = jax.jit(agent.init)(jax.random.key(2))
    upd = jax.jit(agent.update, donate_argnums=0)
    return upd, (runner,), dict(
        items=num_envs * int(cfg.ppo.rollout_steps),
        name="unio4/online PPO update (rollout + 2 epochs x 4 minibatches), brax inverted_pendulum spring",
        size=f"{num_envs} envs x {cfg.ppo.rollout_steps} steps", batch=num_envs * int(cfg.ppo.rollout_steps))

  rows += bench.across_devices(online_case, sizes=(64,) if quick else (64, 256), carry=True,
                               repeats=3 if quick else 10)
  return rows


def scale_program(config, mesh):
  """The paper-size step for `experiments.scale` (`configs/unio4.py:paper`, D4RL hopper-medium-v2 sizes).

  `config.scale.program` picks the step: 'improve' (default: `improvement.offline_ppo_step`, one offline PPO
  update of the K = 4 policies against their behaviour policies, advantages from the frozen IQL critics),
  'critic' (`critics.critic_step`: the expectile V update, then the double-Q update and the soft target), or 'bc'
  (`bc.bc_step`: one step of the ensemble behaviour cloning). All networks are MLPs of at most 1.1M
  parameters: replicated; the batch of 512 is split over 'data'.

  Args:
    config: `get_config('paper')` (with `scale.program` set to the step wanted).
    mesh: the ('data', 'model') mesh.

  Returns:
    common.scale.Program of fn(state, batch, constants, key) -> (state, metrics).

  Raises:
    ValueError: unknown `scale.program`.
  """
  import optax
  from iclr24_jax.common import optim
  from iclr24_jax.common.train_state import TrainState
  from iclr24_jax.common import scale as scale_lib
  from iclr24_jax.papers.unio4 import critics as critics_lib
  from iclr24_jax.rl import scale as rl_scale
  s = scale_lib.paper_scale(config, "unio4")
  b, d, a = int(s.batch_size), int(s.obs_dim), int(s.action_dim)
  obs = jax.ShapeDtypeStruct((b, d), jnp.float32)
  act = jax.ShapeDtypeStruct((b, a), jnp.float32)
  vec = jax.ShapeDtypeStruct((b,), jnp.float32)
  spec = critics_lib.critic_spec(train.critic_config(config))
  v_module, q_module = critics_lib.critic_modules(spec)
  num_q = 2 if (spec["mode"] == "iql" and spec["double_q"]) else 1
  v_f = rl_scale.mlp_flops(d, tuple(spec["v_hidden"]) + (1,))            # per example, forward
  q_f = num_q * rl_scale.mlp_flops(d + a, tuple(spec["q_hidden"]) + (1,))
  p_f = rl_scale.mlp_flops(d, tuple(config.model.hidden) + (2 * a,))
  k = int(config.bc.num_policies)
  policy = bc_lib.make_policy(a, config.model)
  common_kw = dict(items_per_step=b, paper_hardware=s.paper_hardware, paper_time=s.paper_time)
  zeros_obs, zeros_act = jnp.zeros((1, d)), jnp.zeros((1, a))

  def critics_abstract():
    def make():
      vp = v_module.init(jax.random.key(0), zeros_obs)["params"]
      qp = q_module.init(jax.random.key(1), zeros_obs, zeros_act)["params"]
      return critics_lib.Critics(vp, qp, normalization.init((d,)), v_module, q_module, float(config.obs_clip))
    return jax.eval_shape(make)

  if s.program == "critic":
    tx_v, tx_q = optax.adam(float(spec["v_lr"])), optax.adam(float(spec["q_lr"]))

    def init():
      vp = v_module.init(jax.random.key(0), zeros_obs)["params"]
      qp = q_module.init(jax.random.key(1), zeros_obs, zeros_act)["params"]
      return critics_lib.CriticState(TrainState.create(vp, tx_v), TrainState.create(qp, tx_q), qp)

    def step(state, batch, _, key):
      del key
      return critics_lib.critic_step(state, batch, v_module=v_module, q_module=q_module, mode=spec["mode"],
                                     gamma=float(spec["gamma"]), tau=float(spec["tau"]),
                                     target_update_freq=int(spec["target_update_freq"]),
                                     expectile=float(spec["expectile"]))

    state = jax.eval_shape(init)
    batch = {"obs": obs, "next_obs": obs, "actions": act, "next_actions": act, "rewards": vec, "not_done": vec,
             "returns": vec}
    # V loss: V forward + backward (3x) and the target Q forward; Q loss: V(s') forward, Q forward + backward.
    hand = b * (3 * v_f + q_f + v_f + 3 * q_f)
    return rl_scale.replicated_program(
        f"IQL critic step (V {len(spec['v_hidden'])} x {spec['v_hidden'][0]}, double Q {len(spec['q_hidden'])} x "
        f"{spec['q_hidden'][0]})", step, state, batch, mesh, params={"v": state.v.params, "q": state.q.params},
        hand_flops=hand, notes="V and Q (and the target Q) replicated; the batch split over 'data'.", **common_kw)

  if s.program == "bc":
    tx = optax.adam(float(config.bc.lr))
    alpha = float(config.bc.alpha)

    def init():
      return stages.ensemble_state(init_ensemble(jax.random.key(0), policy, k, zeros_obs), tx)

    def step(state, batch, _, key):
      del key
      return bc_lib.bc_step(state, batch, policy=policy, alpha=alpha)

    state = jax.eval_shape(init)
    return rl_scale.replicated_program(
        f"ensemble BC step ({k} policies, {len(config.model.hidden)} x {config.model.hidden[0]})", step, state,
        {"obs": obs, "actions": act}, mesh, hand_flops=b * k * 3 * p_f,
        notes="The K policies' parameters (stacked) replicated; the batch split over 'data'.", **common_kw)

  if s.program == "improve":
    tx = optim.make_optimizer(config.optimizer, int(config.num_steps))
    kw = dict(policy=policy, clip_eps=float(config.improve.clip_eps), omega=float(config.improve.omega),
              obs_clip=float(config.obs_clip))

    def init():
      params = init_ensemble(jax.random.key(0), policy, k, zeros_obs)
      return stages.ensemble_state(params, tx, extra={"behaviour": params})

    def step(state, obs_batch, critics, key):
      return improvement.offline_ppo_step(state, obs_batch, key, critics=critics, obs_stats=critics.obs_stats, **kw)

    state = jax.eval_shape(init)
    # Per member: the behaviour policy's forward (sampling a ~ pi_old), Q(s, a) of the frozen critic, the current
    # policy's forward + backward; V(s) does not depend on the member (the states are shared): once.
    hand = b * k * (p_f + q_f + 3 * p_f) + b * v_f
    return rl_scale.replicated_program(
        f"offline multi-step PPO step ({k} policies, frozen IQL critics)", step, state, obs, mesh,
        constants=critics_abstract(), hand_flops=hand, update_flops_per_param=rl_scale.CLIPPED_ADAM_FLOPS_PER_PARAM,
        notes=("The K policies, their behaviour copies and the frozen critics (1.1M parameters) replicated; the "
               "512 states split over 'data'. The OPE replacement test (every 100 steps) is not part of the step."),
        **common_kw)
  raise ValueError(f"unio4 scale.program={s.program!r}; choose one of {tuple(s.programs)}.")
