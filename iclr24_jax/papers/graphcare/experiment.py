"""GraphCare experiments: `run` (one config), `reproduce` (synthetic EHR + MIMIC-III demo), `benchmark`."""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

import jax
import numpy as np

from iclr24_jax.common import bench
from iclr24_jax.common import loop as loop_lib
from iclr24_jax.common import metrics as metrics_io
from iclr24_jax.common import sharding
from iclr24_jax.common.optim import make_optimizer
from iclr24_jax.papers.graphcare import data as data_lib
from iclr24_jax.papers.graphcare import graphs as graphs_lib
from iclr24_jax.papers.graphcare import kg as kg_lib
from iclr24_jax.papers.graphcare import metrics as metrics_lib
from iclr24_jax.papers.graphcare import model as model_lib
from iclr24_jax.papers.graphcare import train as train_lib

PAPER = "graphcare"


@dataclasses.dataclass
class World:
  """Everything a run needs: the task data, the clustered KG, patient graphs and the split."""

  dataset: data_lib.EHRDataset
  kg: kg_lib.ConceptKG
  graphs: list
  split: tuple[np.ndarray, np.ndarray, np.ndarray]
  info: dict


def _synthetic_kwargs(dc: Any) -> dict:
  return dict(seed=int(dc.get("seed", 0)), num_patients=int(dc.num_patients), num_concepts=int(dc.num_concepts),
              num_entities=int(dc.num_entities), num_relations=int(dc.num_relations),
              concept_degree=int(dc.concept_degree), entity_degree=int(dc.entity_degree), num_risk=int(dc.num_risk),
              risk_edge_bias=float(dc.risk_edge_bias), protective_edge_bias=float(dc.protective_edge_bias),
              codes_per_visit=tuple(dc.codes_per_visit), max_visits=int(dc.max_visits),
              true_decay=float(dc.true_decay), embedding_dim=int(dc.embedding_dim))


@functools.lru_cache(maxsize=1)
def _mimic_visits(data_dir: str):
  return data_lib.read_mimic3_demo(data_dir or None)


@functools.lru_cache(maxsize=4)
def _mimic_kg(data_dir: str, dim: int, threshold: float, embedder: str = "tfidf", include_drugs: bool = True):
  mv = _mimic_visits(data_dir)
  raw, index = data_lib.mimic_concept_kg(mv, include_drugs=include_drugs)
  emb = kg_lib.embed_kg_names(raw, dim=dim, embedder=embedder)
  ckg = kg_lib.cluster_kg(raw, emb["entity_full"], emb["relation_full"], threshold,
                          entity_features=emb["entity_features"], relation_features=emb["relation_features"])
  return mv, raw, index, ckg


def build_world(config: Any) -> World:
  """Builds the data set, the clustered concept KG and every patient graph for `config.data`."""
  dc = config.data
  t0 = time.perf_counter()
  if dc.name == "synthetic":
    kw = _synthetic_kwargs(dc)
    kw["seed"] = int(config.seed)
    syn = data_lib.make_synthetic_ehr(**kw)
    ckg = kg_lib.cluster_kg(syn.raw_kg, syn.entity_embedding, syn.relation_embedding, float(dc.cluster_threshold))
    ds = syn.dataset
    split = data_lib.split_by_patient(ds.patient_ids, tuple(dc.split), seed=int(dc.split_seed))
    info = {"raw_entities": len(syn.raw_kg.entity_names), "raw_relations": len(syn.raw_kg.relation_names)}
  elif dc.name == "mimic3_demo":
    if str(dc.task) not in data_lib.TASKS:
      raise ValueError(f"unknown config.data.task '{dc.task}'; choose one of {sorted(data_lib.TASKS)}.")
    mv, raw, index, ckg = _mimic_kg(str(dc.data_dir or ""), int(dc.name_embedding_dim), float(dc.cluster_threshold),
                                    str(dc.get("name_embedder", "tfidf")), str(dc.task) in ("mortality", "readmission"))
    ds, _ = data_lib.mimic3_demo_task(str(dc.task), dc.data_dir or None, int(dc.min_drug_visits), mv=mv,
                                      kg=(raw, index))
    split = data_lib.split_by_patient(ds.patient_ids, (0.8, 0.1, 0.1), seed=int(dc.split_seed))
    info = {"raw_entities": len(raw.entity_names), "raw_relations": len(raw.relation_names)}
  else:
    raise ValueError(f"unknown config.data.name '{dc.name}'; choose 'synthetic' or 'mimic3_demo'.")
  cap = int(dc.max_visits) if dc.name == "mimic3_demo" and int(dc.get("max_visits", 0)) > 0 else None
  pgs = [graphs_lib.patient_graph(v, ckg, max_visits=cap) for v in ds.visits]
  info.update(num_samples=len(ds), num_patients=int(len(np.unique(ds.patient_ids))), num_nodes=ckg.num_nodes,
              num_relations=ckg.num_relations, mean_graph_nodes=float(np.mean([p.num_nodes for p in pgs])),
              mean_graph_edges=float(np.mean([p.num_edges for p in pgs])), build_s=time.perf_counter() - t0)
  return World(dataset=ds, kg=ckg, graphs=pgs, split=split, info=info)


def make_model(config: Any, world: World):
  """The model of config.model for this world's KG and task."""
  return model_lib.create_model(config.model, world.kg.num_nodes, world.kg.num_relations,
                                world.dataset.num_outputs, world.kg.embedding_dim)


def _check_shards(config: Any, mesh) -> None:
  n_data = mesh.shape[sharding.DATA_AXIS]
  if int(config.num_shards) % n_data:
    raise ValueError(f"config.num_shards={config.num_shards} must be a multiple of the mesh's data axis ({n_data}); "
                     f"set num_shards to a multiple of {n_data}.")


def run(config: Any, workdir: str) -> dict:
  """Trains config.model on config.data; writes metrics.jsonl, checkpoints, results.json and curves.png."""
  world = build_world(config)
  ds, ckg = world.dataset, world.kg
  mesh = sharding.make_mesh(config.mesh)
  _check_shards(config, mesh)
  batcher = graphs_lib.Batcher(world.graphs, ds.labels, int(config.batch_size), int(config.num_shards))
  train_idx, val_idx, test_idx = world.split
  model = make_model(config, world)
  tx = make_optimizer(config.optimizer, int(config.num_steps))
  sample = batcher.batch(train_idx[: config.batch_size])
  task = ds.task

  def init_fn(key):
    return train_lib.init_state(key, model, sample, tx, ckg.node_embedding, ckg.relation_embedding)

  val_batches = list(batcher.eval_batches(val_idx))

  def eval_fn(state):
    m = train_lib.evaluate(model, state.params, val_batches, task, mesh)
    return {f"val/{k}": v for k, v in m.items()}

  res = loop_lib.train_loop(init_fn=init_fn, train_step=train_lib.make_train_step(model, task),
                            batches=batcher.train_batches(train_idx, int(config.seed)), num_steps=int(config.num_steps),
                            key=jax.random.key(int(config.seed)), workdir=workdir, mesh=mesh,
                            log_every=int(config.log_every), eval_every=int(config.eval_every), eval_fn=eval_fn,
                            checkpoint_every=int(config.checkpoint_every), config=config, name=PAPER)
  y, p, loss = train_lib.collect_predictions(model, res.state.params, batcher.eval_batches(test_idx), task, mesh)
  test = metrics_lib.task_metrics(task, y, p)
  ci = metrics_lib.bootstrap_ci(task, y, p, num_resamples=200, seed=int(config.seed)) if len(y) > 1 else {}
  task_name = config.data.task if config.data.name != "synthetic" else "synthetic"
  results = {"data": dict(name=config.data.name, task=task_name, **world.info),
             "model": config.model.name, "test": test, "test_ci95": ci, "test_loss": loss, "final_eval": res.final_eval,
             "num_steps": int(config.num_steps), "steps_per_s": res.steps_per_s, "resumed_from_step": res.start_step,
             "split_sizes": [int(len(s)) for s in world.split]}
  primary = metrics_lib.PRIMARY[task]
  results[f"test_{primary}"] = test[primary]
  metrics_io.write_results(workdir, results)
  if jax.process_index() == 0:
    rows = metrics_io.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    metrics_io.plot_curves(rows, ["train/loss", f"val/{primary}"], os.path.join(workdir, "curves.png"),
                           title=f"GraphCare {config.model.name} on {results['data']['name']}")
  return results


# ----------------------------------------------------------------------------------------------------------
# Reproduction
# ----------------------------------------------------------------------------------------------------------

SYNTHETIC_MODELS = (  # (label, config variants)
    ("BAT (GraphCare)", ""), ("GIN", "gin"), ("GAT", "gat"), ("GRU, no KG", "gru"),
    ("BAT w/o alpha", "no_alpha"), ("BAT w/o beta", "no_beta"), ("BAT w/o edge attention", "no_edge_attn"),
    ("BAT, official-code attention", "official_code"), ("BAT, no KG clustering", "no_cluster"),
)


def _fit_eval(config: Any, world: World, batcher: graphs_lib.Batcher, mesh, train_idx, val_idx, test_idx,
              step_cache: dict | None = None) -> dict:
  """Trains one model (best-by-val when val_idx is given) and returns test labels / probabilities."""
  model = make_model(config, world)
  task = world.dataset.task
  tx = make_optimizer(config.optimizer, int(config.num_steps))
  sample = batcher.batch(train_idx[: config.batch_size])
  key = (model, task)
  if step_cache is not None and key in step_cache:
    step_fn = step_cache[key]
  else:
    step_fn = loop_lib.compile_step(train_lib.make_train_step(model, task), mesh)
    if step_cache is not None:
      step_cache[key] = step_fn
  eval_fn = None
  if val_idx is not None and len(val_idx):
    val_batches = list(batcher.eval_batches(val_idx))
    primary = metrics_lib.PRIMARY[task]
    eval_fn = lambda params: train_lib.evaluate(model, params, val_batches, task, mesh)[primary]
  t0 = time.perf_counter()
  state, hist = train_lib.fit(model, task, tx, sample, batcher.train_batches(train_idx, int(config.seed)),
                              int(config.num_steps), jax.random.key(int(config.seed)), mesh=mesh,
                              node_embedding=world.kg.node_embedding, relation_embedding=world.kg.relation_embedding,
                              eval_fn=eval_fn, eval_every=int(config.eval_every), step_fn=step_fn)
  y, p, _ = train_lib.collect_predictions(model, state.params, batcher.eval_batches(test_idx), task, mesh)
  return {"y": y, "p": p, "history": hist, "train_s": time.perf_counter() - t0}


def _fmt_ci(v: float, ci: tuple[float, float]) -> str:
  return f"{v:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"


def reproduce_synthetic(workdir: str, fast: bool = False, mesh=None) -> tuple[list[dict], dict]:
  """BAT vs GIN / GAT / GRU (no KG) and the ablations on the synthetic EHR (AUROC on 1,600 test patients)."""
  from iclr24_jax.configs import graphcare as cfg_mod
  base = "tiny" if fast else "repro"
  mesh = sharding.make_mesh(devices=jax.devices()[:1]) if mesh is None else mesh
  cfg0 = cfg_mod.get_config(base)
  if fast:
    cfg0.num_shards = 1
  world = build_world(cfg0)
  batcher = graphs_lib.Batcher(world.graphs, world.dataset.labels, int(cfg0.batch_size), int(cfg0.num_shards))
  tr, va, te = world.split
  models = SYNTHETIC_MODELS if not fast else (SYNTHETIC_MODELS[0], SYNTHETIC_MODELS[3])
  out, rows = {}, []
  for label, variant in models:
    cfg = cfg_mod.get_config(",".join(v for v in (base, variant) if v))
    if fast:
      cfg.num_shards = 1
    w, b = world, batcher
    if float(cfg.data.cluster_threshold) != float(cfg0.data.cluster_threshold):  # same patients, other KG
      w = build_world(cfg)
      b = graphs_lib.Batcher(w.graphs, w.dataset.labels, int(cfg.batch_size), int(cfg.num_shards))
    r = _fit_eval(cfg, w, b, mesh, tr, va, te)
    r["kg_nodes"] = w.info["num_nodes"]
    r["auroc"] = metrics_lib.roc_auc(r["y"], r["p"])
    r["ci"] = metrics_lib.bootstrap_ci("binary", r["y"], r["p"], num_resamples=200 if fast else 500,
                                       metrics=("auroc",))["auroc"]
    out[label] = r
  bat = out["BAT (GraphCare)"]
  plot = _plot_synthetic(out, os.path.join(workdir, "synthetic_auroc.png"))
  n_test = len(bat["y"])
  delta = {}
  for label, r in out.items():
    if label == "BAT (GraphCare)":
      continue
    d, lo, hi = metrics_lib.paired_bootstrap_delta(metrics_lib.roc_auc, bat["y"], bat["p"], r["p"],
                                                   num_resamples=200 if fast else 500)
    delta[label] = (d, lo, hi)
    ablation = label.startswith("BAT w/o")
    if ablation:
      claim = "removing the component lowers AUROC (paper Table 5 ablations)"
    elif label.startswith("BAT, official"):
      claim = "(no claim: paper vs code attention)"
    elif label.startswith("BAT, no KG clustering"):
      claim = "merging similar nodes / relations (delta = 0.15) helps (paper Sec. 3.1, delta tuned)"
    elif label.startswith("GRU"):
      claim = "GraphCare beats EHR-only baselines (MIMIC-III AUROC +17.6% mortality, +6.6% readmission)"
    else:
      claim = "BAT beats GAT and GIN on the same personalised KGs (paper Table 4)"
    # holds: BAT better with the paired 95% interval above zero (1,600 test patients make a null informative)
    holds = None if label.startswith("BAT, official") or fast else bool(lo > 0)
    rows.append({"paper": PAPER, "experiment": f"synthetic EHR ({n_test} test patients): BAT vs {label}",
                 "metric": "test AUROC, BAT minus other [paired bootstrap 95% CI]",
                 "ours": f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}] (BAT {_fmt_ci(bat['auroc'], bat['ci'])}, "
                         f"{label} {_fmt_ci(r['auroc'], r['ci'])})",
                 "paper_value": claim, "holds": holds,
                 "notes": f"{world.info['num_nodes']} KG nodes after clustering ({world.info['raw_entities']} raw; "
                          f"this model's KG: {r['kg_nodes']}), "
                          f"~{world.info['mean_graph_nodes']:.0f} nodes / patient; {cfg0.num_steps} steps, "
                          f"best-val checkpoint; {'fast smoke run' if fast else 'repro settings'}.",
                 "plots": [plot]})
  gru = out["GRU, no KG"]
  gain = 100.0 * (bat["auroc"] - gru["auroc"]) / gru["auroc"]
  rows.append({"paper": PAPER, "experiment": "synthetic EHR: relative AUROC gain of BAT over the no-KG GRU",
               "metric": "relative gain (%)", "ours": f"{gain:+.1f}%",
               "paper_value": "+17.6% (mortality), +6.6% (readmission) on MIMIC-III",
               "holds": None if fast else bool(delta["GRU, no KG"][1] > 0),
               "notes": "Direction only: the synthetic task is built so that KG structure carries the label.",
               "plots": [plot]})
  summary = {k: {"auroc": v["auroc"], "ci": v["ci"], "train_s": v["train_s"]} for k, v in out.items()}
  return rows, summary


def _plot_synthetic(out: dict, path: str) -> str:
  fig, axes = metrics_io.new_figure(size=(7.0, 3.2))
  ax = axes[0, 0]
  labels = list(out)
  vals = [out[k]["auroc"] for k in labels]
  err = np.array([[out[k]["auroc"] - out[k]["ci"][0], out[k]["ci"][1] - out[k]["auroc"]] for k in labels]).T
  ax.bar(range(len(labels)), vals, yerr=err, capsize=3, color=["C3"] + ["C0"] * (len(labels) - 1))
  ax.set_xticks(range(len(labels)))
  ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
  ax.set_ylim(max(0.0, min(vals) - 0.1), 1.0)
  ax.set_ylabel("test AUROC (95% CI)")
  ax.set_title("Synthetic EHR: label from relation-typed 2-hop KG paths")
  return metrics_io.save_figure(fig, path)


def reproduce_mimic(workdir: str, fast: bool = False, mesh=None) -> tuple[list[dict], dict]:
  """The four MIMIC-III demo tasks end to end: k-fold CV by patient, pooled out-of-fold predictions,
  bootstrap CIs; BAT and the no-KG GRU."""
  from iclr24_jax.configs import graphcare as cfg_mod
  from iclr24_jax.common.data import shared_data_dir
  root = shared_data_dir()
  if root is None or not (root / "mimic3_demo").is_dir():
    return [{"paper": PAPER, "experiment": "MIMIC-III demo, four tasks", "metric": "-", "ours": "skipped",
             "paper_value": "-", "holds": None, "notes": "shared data folder with mimic3_demo/ not found",
             "plots": []}], {}
  mesh = sharding.make_mesh(devices=jax.devices()[:1]) if mesh is None else mesh
  tasks = ("mortality", "readmission", "los", "drugrec") if not fast else ("los",)
  num_folds = 2 if fast else 3
  rows, summary = [], {}
  paper_claims = {"mortality": "GraphCare best on MIMIC-III mortality (AUROC +17.6% over the best baseline)",
                  "readmission": "GraphCare best on MIMIC-III readmission (AUROC +6.6%)",
                  "los": "GraphCare best on MIMIC-III length of stay (F1 +7.9%)",
                  "drugrec": "GraphCare best on MIMIC-III drug recommendation (F1 +10.8%)"}
  for task in tasks:
    out = {}
    world = None
    for label, variant in (("BAT (GraphCare)", ""), ("GRU, no KG", "gru")):
      cfg = cfg_mod.get_config(",".join(v for v in (f"mimic3_demo_{task}", "repro", variant) if v))
      cfg.num_shards = 1
      cfg.batch_size = 16
      world = build_world(cfg) if world is None else world
      ds = world.dataset
      batcher = graphs_lib.Batcher(world.graphs, ds.labels, int(cfg.batch_size), int(cfg.num_shards))
      epochs = 2 if fast else 12
      folds = data_lib.kfold_by_patient(ds.patient_ids, num_folds, seed=int(cfg.data.split_seed))
      cache: dict = {}
      ys, ps = [], []
      t0 = time.perf_counter()
      for tr, te in folds:
        cfg.num_steps = max(int(np.ceil(epochs * len(tr) / cfg.batch_size)), 1)
        r = _fit_eval(cfg, world, batcher, mesh, tr, None, te, step_cache=cache)
        ys.append(r["y"]), ps.append(r["p"])
      out[label] = {"y": np.concatenate(ys), "p": np.concatenate(ps), "s": time.perf_counter() - t0, "world": world}
    ds = out["BAT (GraphCare)"]["world"].dataset
    info = out["BAT (GraphCare)"]["world"].info
    primary = {"binary": "auroc", "multiclass": "kappa", "multilabel": "jaccard"}[ds.task]
    second = {"binary": "auprc", "multiclass": "accuracy", "multilabel": "f1"}[ds.task]
    res = {}
    for label, o in out.items():
      m = metrics_lib.task_metrics(ds.task, o["y"], o["p"])
      ci = metrics_lib.bootstrap_ci(ds.task, o["y"], o["p"], num_resamples=200 if fast else 500,
                                    metrics=(primary, second))
      res[label] = (m, ci)
    bm, bci = res["BAT (GraphCare)"]
    gm, gci = res["GRU, no KG"]
    metric_fn = lambda yy, pp, _t=ds.task, _m=primary: metrics_lib.task_metrics(_t, yy, pp)[_m]
    ob, og = out["BAT (GraphCare)"], out["GRU, no KG"]
    d, lo, hi = metrics_lib.paired_bootstrap_delta(metric_fn, ob["y"], ob["p"], og["p"],
                                                   num_resamples=100 if fast else 300)
    pos = ""
    if ds.task == "binary":
      pos = f", {int(ds.labels.sum())} positive"
    finite = np.isfinite(bm[primary]) and np.isfinite(gm[primary])
    rows.append({"paper": PAPER, "experiment": f"MIMIC-III demo {task} ({len(ds)} samples, "
                                               f"{info['num_patients']} patients{pos}; {num_folds}-fold CV)",
                 "metric": f"{primary} [bootstrap 95% CI]; {second}",
                 "ours": f"BAT {_fmt_ci(bm[primary], bci[primary])}, {second} {bm[second]:.3f}; "
                         f"GRU no-KG {_fmt_ci(gm[primary], gci[primary])}, {second} {gm[second]:.3f}; "
                         f"BAT - GRU {d:+.3f} [{lo:+.3f}, {hi:+.3f}]",
                 "paper_value": paper_claims[task],
                 # holds: None when the paired interval of BAT - GRU contains 0 (inconclusive on tiny data)
                 "holds": (None if fast or not finite or not (lo > 0 or hi < 0) else bool(lo > 0)),
                 "notes": f"dictionary-derived concept KG ({info['num_nodes']} nodes, "
                          f"{info['num_relations']} relations); "
                          "out-of-fold predictions pooled; tiny data: CIs are wide, treat as a smoke test of the "
                          "pipeline, not as evidence.", "plots": []})
    summary[task] = {k: {"metrics": v[0], "ci": v[1]} for k, v in res.items()}
  return rows, summary


def reproduce(workdir: str, fast: bool = False) -> list[dict]:
  """Synthetic EHR (BAT vs GIN/GAT/no-KG, ablations) and the MIMIC-III demo's four tasks."""
  os.makedirs(workdir, exist_ok=True)
  t0 = time.perf_counter()
  rows, syn = reproduce_synthetic(workdir, fast)
  t1 = time.perf_counter()
  if fast:  # the demo's name embeddings and eight trainings do not fit the fast budget
    rows_m, mim = [{"paper": PAPER, "experiment": "MIMIC-III demo, four tasks", "metric": "-", "ours": "skipped (fast)",
                    "paper_value": "-", "holds": None, "notes": "run reproduce(fast=False)", "plots": []}], {}
  else:
    rows_m, mim = reproduce_mimic(workdir, fast)
  t2 = time.perf_counter()
  metrics_io.write_results(workdir, {"synthetic": syn, "mimic3_demo": mim, "seconds": {"synthetic": t1 - t0,
                                                                                      "mimic3_demo": t2 - t1}},
                           filename="reproduce.json")
  return rows + rows_m


# ----------------------------------------------------------------------------------------------------------
# Benchmark
# ----------------------------------------------------------------------------------------------------------


def benchmark(quick: bool = True) -> list[dict]:
  """Patients/s of the BAT train step vs patient-graph size, on 1 and all devices (8 shards per batch)."""
  from iclr24_jax.configs import graphcare as cfg_mod
  rows = []
  sizes = (("small", 1, 2), ("large", 3, 3))   # (label, concept_degree, entity_degree)
  for label, cdeg, edeg in sizes:
    cfg = cfg_mod.get_config("repro")
    cfg.data.update(num_patients=600, concept_degree=cdeg, entity_degree=edeg, codes_per_visit=(2, 5))
    cfg.batch_size, cfg.num_shards = 64, 8
    world = build_world(cfg)
    batcher = graphs_lib.Batcher(world.graphs, world.dataset.labels, cfg.batch_size, cfg.num_shards)
    model = make_model(cfg, world)
    tx = make_optimizer(cfg.optimizer, 100)
    host = batcher.batch(np.arange(cfg.batch_size))
    for n_dev in sorted({1, jax.device_count()}):
      if cfg.num_shards % n_dev:
        continue
      mesh = sharding.make_mesh(devices=jax.devices()[:n_dev])
      with jax.set_mesh(mesh):
        state = jax.jit(lambda k: train_lib.init_state(k, model, host, tx, world.kg.node_embedding,
                                                       world.kg.relation_embedding),
                        out_shardings=sharding.replicated_sharding(mesh))(jax.random.key(0))
        step = loop_lib.compile_step(train_lib.make_train_step(model, "binary"), mesh)
        batch = sharding.shard_batch(host, mesh)
        rows.append(bench.time_fn(step, state, batch, jax.random.key(1), carry=True, repeats=3 if quick else 10,
                                  items=cfg.batch_size, name="graphcare/bat_train_step", size=label,
                                  mean_graph_nodes=round(world.info["mean_graph_nodes"], 1),
                                  mean_graph_edges=round(world.info["mean_graph_edges"], 1),
                                  kg_nodes=world.kg.num_nodes, batch=cfg.batch_size, mesh_devices=n_dev))
  return rows
