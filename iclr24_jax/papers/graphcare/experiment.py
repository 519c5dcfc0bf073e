"""GraphCare experiment: `run` (one config: build the world, train, evaluate, write results and curves).

The reproduction (synthetic EHR with seeds, MIMIC-III demo) and the benchmark are in `study.py`."""
from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any

import jax
import numpy as np

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


@functools.lru_cache(maxsize=1)   # read from disk once per process
def _mimic_visits(data_dir: str):
  return data_lib.read_mimic3_demo(data_dir or None)


@functools.lru_cache(maxsize=4)   # the knowledge graph is built once per setting
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
  elif dc.name in data_lib.DATASETS:   # 'mimic3_demo' or the full 'mimic3' (same tables; .csv or .csv.gz)
    if str(dc.task) not in data_lib.TASKS:
      raise ValueError(f"unknown config.data.task '{dc.task}'; choose one of {sorted(data_lib.TASKS)}.")
    folder = str(data_lib.mimic_folder(dc))   # DataNotFoundError (tables, PhysioNet) before anything is read
    mv, raw, index, ckg = _mimic_kg(folder, int(dc.name_embedding_dim), float(dc.cluster_threshold),
                                    str(dc.get("name_embedder", "tfidf")), str(dc.task) in ("mortality", "readmission"))
    ds, _ = data_lib.mimic3_demo_task(str(dc.task), folder, int(dc.min_drug_visits), mv=mv, kg=(raw, index))
    split = data_lib.split_by_patient(ds.patient_ids, (0.8, 0.1, 0.1), seed=int(dc.split_seed))
    info = {"raw_entities": len(raw.entity_names), "raw_relations": len(raw.relation_names)}
  else:
    raise ValueError(f"unknown config.data.name '{dc.name}'; choose 'synthetic' or one of {sorted(data_lib.DATASETS)}.")
  cap = int(dc.max_visits) if dc.name in data_lib.DATASETS and int(dc.get("max_visits", 0)) > 0 else None
  construction = str(dc.get("graph_construction", "paper"))
  gkg = graphs_lib.global_triples(ckg) if construction == "official" else None
  pgs = [graphs_lib.patient_graph(v, ckg, max_visits=cap, construction=construction, global_kg=gkg)
         for v in ds.visits]
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
    return train_lib.init(key, model, sample, tx, ckg.node_embedding, ckg.relation_embedding)

  val_batches = list(batcher.eval_batches(val_idx))

  def eval_fn(state):
    m = train_lib.evaluate(model, state.params, val_batches, task, mesh)
    return loop_lib.prefix_keys(m, "val")

  res = loop_lib.train_loop(init_fn=init_fn, train_step=train_lib.make_train_step(model, task),
                            batches=batcher.train_batches(train_idx, int(config.seed)), num_steps=int(config.num_steps),
                            key=jax.random.key(int(config.seed)), workdir=workdir, mesh=mesh,
                            log_every=int(config.log_every), eval_every=int(config.eval_every), eval_fn=eval_fn,
                            config=config, name=PAPER, steps_per_call=int(config.get("steps_per_call", 1)),
                            **loop_lib.checkpoint_options(config))
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


# ----------------------------------------------------------------------------------------------------------
# Benchmark
# ----------------------------------------------------------------------------------------------------------
