"""GraphCare: personalised knowledge graphs + the BAT graph network (Jiang et al., ICLR 2024).

Paper: https://openreview.net/forum?id=tVTN7Zs0ml   Code: https://github.com/pat-jj/GraphCare

Run:  python -m experiments.main --config=configs/graphcare.py:tiny --workdir=runs/graphcare
Variants (after the colon; combine with commas, e.g. 'mimic3_demo_los,gin'):
  ''                      synthetic EHR over a random concept KG, the paper's model defaults (hidden 512, 3 layers)
  'tiny'                  seconds-long smoke run
  'repro'                 the settings of the small-scale reproduction (hidden 64, lr 3e-3, dropout 0.2)
  'mimic3_demo'           MIMIC-III demo, mortality; 'mimic3_demo_<task>' with task in mortality, readmission,
                          los, drugrec
  'gin', 'gat', 'gru'     baselines: GIN / GAT on the same patient graphs, GRU over EHR codes only (no KG)
  'no_alpha', 'no_beta', 'no_edge_attn'   the paper's ablations
  'official_code'         the official code's attention (softmax over visits, its decay and padding)
  'official_run'          what the official training script runs: the code's attention with alpha AND beta off
                          (graphcare.py: `use_alpha=False if alpha == "True" else False`, the same for beta)
  'official_graph'        the official patient-graph construction (the patient's nodes cut out of one global
                          graph, one relation per node pair) instead of the paper's union of concept KGs
  'gin_rel', 'gat_rel'    GIN / GAT that see the relation types (GINE-style messages / edge-aware attention)
  'no_cluster'            no node/edge merging (delta = 0)
  'paper'                 the official MIMIC-III mortality run's sizes (run.sh), the paper's BAT; compiled ahead of
                          time by `python -m experiments.scale --only graphcare`
"""
import ml_collections

from iclr24_jax.configs import variants

MIMIC_TASKS = ("mortality", "readmission", "los", "drugrec")
VARIANTS = ("", "tiny", "repro", "mimic3_demo", *(f"mimic3_demo_{t}" for t in MIMIC_TASKS), "gin", "gat", "gru",
            "gin_rel", "gat_rel", "no_alpha", "no_beta", "no_edge_attn", "official_code", "official_run",
            "official_graph", "no_cluster", "paper")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.paper = "graphcare"
  c.seed = 0
  c.data = ml_collections.ConfigDict(dict(
      name="synthetic", data_dir="", task="mortality",
      # synthetic generator (data.make_synthetic_ehr)
      num_patients=2800, num_concepts=600, num_entities=100, num_relations=6, concept_degree=2, entity_degree=2,
      num_risk=8, risk_edge_bias=0.5, protective_edge_bias=0.3, codes_per_visit=(1, 3),
      max_visits=6,                           # synthetic: visits per patient; MIMIC: most recent visits kept
      true_decay=0.3, embedding_dim=32,
      split=(0.2857, 0.1429, 0.5714),        # synthetic: 800 train / 400 val / 1600 test patients
      # KG construction
      cluster_threshold=0.15,                 # delta of the official clustering
      graph_construction="paper",             # 'paper' (union of concept KGs) | 'official' (global-graph cut)
      name_embedder="tfidf",                  # MIMIC: 'tfidf' or 'minilm' (iclr24_jax.lm) name embeddings
      name_embedding_dim=64,                  # MIMIC: TF-IDF + SVD width of the name embeddings
      min_drug_visits=5,                      # MIMIC drug recommendation: label drugs seen in >= this many samples
      num_folds=0,                            # MIMIC: > 0 -> k-fold CV by patient (reproduction), 0 -> 0.8/0.1/0.1
      split_seed=528,                         # the official split_by_patient seed
  ))
  c.model = ml_collections.ConfigDict(dict(
      name="bat", hidden_dim=512, num_layers=3, dropout=0.5, gnn_dropout=0.5, decay_rate=0.01,
      use_alpha=True, use_beta=True, use_edge_attn=True, eps=0.0, train_eps=False, patient_mode="joint",
      ehr_readout="input", match_official_code=False, edge_types=False))
  c.optimizer = ml_collections.ConfigDict(dict(name="adam", learning_rate=1e-3, schedule="constant",
                                               weight_decay=1e-5, grad_clip=0.0))
  c.batch_size = 64
  c.num_shards = 8            # shards per batch (the mesh's data axis must divide it)
  c.num_steps = 1000
  c.steps_per_call = 1        # > 1: that many steps per compiled call (one lax.scan chunk; intervals multiples)
  c.num_seeds = 3             # reproduction: seeds per arm (trained together, vmapped), paired across arms
  c.log_every = 50
  c.eval_every = 100
  c.checkpoint_every = 500
  c.checkpoint_every_secs = 600.0   # also every 10 minutes of wall time (the big_vision habit)
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))

  for v in variants.parse(arg, VARIANTS, name="graphcare"):
    if v == "tiny":
      c.data.update(num_patients=240, num_concepts=60, num_entities=30, num_risk=4, split=(0.5, 0.25, 0.25))
      c.model.update(hidden_dim=16, num_layers=2, dropout=0.1, gnn_dropout=0.1)
      c.optimizer.learning_rate = 3e-3
      c.batch_size, c.num_shards = 16, 8
      c.num_steps, c.log_every, c.eval_every, c.checkpoint_every = 20, 5, 10, 10
    elif v == "repro":
      c.model.update(hidden_dim=64, dropout=0.2, gnn_dropout=0.2)
      c.optimizer.learning_rate = 3e-3
      c.batch_size, c.num_shards = 32, 1
      c.num_steps, c.eval_every, c.steps_per_call = 150, 50, 10   # best val at step 100 for all 3 seeds of 200
    elif v.startswith("mimic3_demo"):
      c.data.name = "mimic3_demo"
      c.data.task = v[len("mimic3_demo_"):] if v != "mimic3_demo" else "mortality"
      c.data.max_visits = 5     # keep a patient's 5 most recent visits (one demo patient has 15 admissions)
      c.batch_size, c.num_shards = 16, 8
      c.num_steps, c.eval_every, c.log_every = 200, 50, 20
    elif v in ("gin", "gat", "gru"):
      c.model.name = v
    elif v in ("gin_rel", "gat_rel"):
      c.model.name = v[:3]
      c.model.edge_types = True
    elif v == "no_alpha":
      c.model.use_alpha = False
    elif v == "no_beta":
      c.model.use_beta = False
    elif v == "no_edge_attn":
      c.model.use_edge_attn = False
    elif v == "official_code":
      c.model.match_official_code = True
    elif v == "official_run":
      c.model.update(match_official_code=True, use_alpha=False, use_beta=False)
    elif v == "official_graph":
      c.data.graph_construction = "official"
    elif v == "no_cluster":
      c.data.cluster_threshold = 0.0
    elif v == "paper":
      _paper(c)
  return c


def _paper(c: ml_collections.ConfigDict) -> None:
  """The official MIMIC-III mortality run (pat-jj/GraphCare@fe92aa6 run.sh:3), for `experiments.scale`."""
  # run.sh:3: --batch_size 4 --hidden_dim 512 --epochs 100 --lr 1e-5 --weight_decay 1e-5 --dropout 0.5
  # --num_layers 1 --decay_rate 0.01 --patient_mode joint --edge_attn True (graphcare.py:513: Adam with L2 decay).
  # Deviation (the paper's model, as the default variant): alpha and beta on; the official graphcare.py:493-494
  # turns both off whatever the flags say (the 'official_run' variant).
  c.data.update(name="mimic3", data_dir="", task="mortality", max_visits=0)
  c.model.update(hidden_dim=512, num_layers=1, dropout=0.5, decay_rate=0.01, patient_mode="joint",
                 use_edge_attn=True)
  c.optimizer.update(learning_rate=1e-5, weight_decay=1e-5)
  c.batch_size, c.num_shards = 4, 4
  # Deviation: num_steps stays the default variant's; the official trains 100 epochs (run.sh:3) of |train| / 4
  # steps, with early stopping (graphcare.py:296), on the user's MIMIC-III samples.
  c.num_epochs = 100
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
  # The official knowledge graph: 4,599 node clusters and 1,077 relation clusters at delta 0.15 (the distinct
  # cluster ids of clustering/ccscm_ccsproc_atc3/clusters_inv_th015.json and clusters_inv_rel_th015.json, the
  # mortality graph), 1,536-wide text-embedding-ada-002 embeddings (graph_generation/get_emb.py:18) as the node
  # and relation tables. Visits: the official pads every patient to the data set's most visits
  # (data_prepare.py:370-374); MIMIC-III's most admissions of one patient is 42. Patient graphs: not in the
  # repository (built from the GPT-4 KG at run time); assumed budgets per patient of 1,024 nodes (a quarter
  # of the KG's nodes) and 16,384 edges, with every within-patient node pair (1,024^2) for the attention.
  c.scale = ml_collections.ConfigDict(dict(
      batch_size=4, num_nodes=4_599, num_relations=1_077, embedding_dim=1_536, max_visits=42,
      nodes_per_patient=1_024, edges_per_patient=16_384, codes_per_visit=64,
      paper_hardware="one GPU (run.sh:3 --device 1)", paper_time="not stated in the official code",
      source="pat-jj/GraphCare@fe92aa6 run.sh:3; graphcare.py:478-513; data_prepare.py:370-374; "
             "clustering/ccscm_ccsproc_atc3/clusters_inv_th015.json, clusters_inv_rel_th015.json; "
             "graphcare_/graph_generation/get_emb.py:18"))
