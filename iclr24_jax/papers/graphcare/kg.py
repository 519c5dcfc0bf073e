"""Concept-specific knowledge graphs: raw triples, node/edge clustering, text embeddings and the LLM hook.

GraphCare (Sec. 3.1) builds one small KG per medical concept (condition, procedure, drug) from an LLM
prompt and from a biomedical KG, embeds every entity and relation name, and merges near-duplicates by
agglomerative clustering on those embeddings (cosine distance, average linkage, threshold delta = 0.15
in the official `data_prepare.clustering`). Each cluster becomes one node (relation clusters one relation
type) whose initial embedding is the mean of its members' embeddings.

Here:
  RawKG          entity / relation surface names and, per concept, its triples (raw indices);
  cluster_kg     RawKG + name embeddings -> ConceptKG (node ids = clusters), the paper's merging step;
  ConceptKG      what `graphs.build_patient_graphs` consumes;
  propose_triples / parse_triples / kg_from_triples
                 the pluggable LLM step: any `generate_fn(prompt) -> text` proposes (head, relation, tail)
                 triples for each concept name;
  tfidf_embed    a deterministic offline stand-in for the paper's text-embedding-ada-002 name embeddings.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Mapping, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class RawKG:
  """Concept-specific KGs before clustering.

  Attributes:
    entity_names: [n_ent] entity surface names (concepts are entities too).
    relation_names: [n_rel] relation surface names.
    concept_names: [C] names of the EHR concepts (codes) the KGs belong to.
    concept_entity: [C] int, the entity index of each concept itself.
    concept_triples: C arrays [T_c, 3] int (head entity, relation, tail entity), the KG of each concept.
  """

  entity_names: list[str]
  relation_names: list[str]
  concept_names: list[str]
  concept_entity: np.ndarray
  concept_triples: list[np.ndarray]

  def __post_init__(self):
    c = len(self.concept_names)
    if np.shape(self.concept_entity) != (c,) or len(self.concept_triples) != c:
      raise ValueError(f"RawKG: concept_entity has shape {np.shape(self.concept_entity)} and there are "
                       f"{len(self.concept_triples)} triple arrays, but {c} concept names; give one of each per "
                       "concept.")
    n_ent, n_rel = len(self.entity_names), len(self.relation_names)
    for i, t in enumerate(self.concept_triples):
      t = np.asarray(t)
      if t.size and (t.ndim != 2 or t.shape[1] != 3):
        raise ValueError(f"RawKG: triples of concept {i} have shape {t.shape}; expected [T, 3] (head, relation, tail).")
      if t.size and (t[:, [0, 2]].max() >= n_ent or t[:, 1].max() >= n_rel or t.min() < 0):
        raise ValueError(f"RawKG: triples of concept {i} index outside the {n_ent} entities / {n_rel} relations.")


@dataclasses.dataclass(frozen=True)
class ConceptKG:
  """Clustered concept KGs: node ids are entity clusters, relation ids are relation clusters.

  Attributes:
    num_nodes: M, number of (clustered) nodes of the global KG.
    num_relations: R, number of (clustered) relation types.
    concept_node: [C] int, node id of each EHR concept (its "direct EHR node").
    concept_triples: C arrays [T_c, 3] int (head node, relation, tail node), deduplicated, self-loops removed.
    node_embedding: [M, D] float32 initial node embeddings (cluster means of the name embeddings).
    relation_embedding: [R, D] float32 initial relation embeddings.
    node_names: [M] a representative name per node (the first member).
    relation_names: [R] a representative name per relation.
    concept_names: [C].
    entity_cluster: [n_ent] node id of every raw entity (identity when unclustered).
    relation_cluster: [n_rel] relation id of every raw relation.
  """

  num_nodes: int
  num_relations: int
  concept_node: np.ndarray
  concept_triples: list[np.ndarray]
  node_embedding: np.ndarray
  relation_embedding: np.ndarray
  node_names: list[str]
  relation_names: list[str]
  concept_names: list[str]
  entity_cluster: np.ndarray
  relation_cluster: np.ndarray

  @property
  def num_concepts(self) -> int:
    return len(self.concept_names)

  @property
  def embedding_dim(self) -> int:
    return int(self.node_embedding.shape[1])

  def concept_nodes(self, concept: int) -> np.ndarray:
    """All node ids of one concept's KG (the concept node, heads and tails), sorted."""
    t = self.concept_triples[concept]
    return np.unique(np.concatenate([[self.concept_node[concept]], t[:, 0], t[:, 2]]).astype(np.int64))


def cosine_distance_matrix(embedding) -> np.ndarray:
  """[n, n] cosine distances of the rows of a dense array or scipy sparse matrix."""
  from scipy import sparse
  if sparse.issparse(embedding):
    x = sparse.csr_matrix(embedding, dtype=np.float64)
    norms = np.sqrt(np.asarray(x.multiply(x).sum(1))).ravel()
    if np.any(norms == 0):
      raise ValueError("cosine distance: some embeddings are all zeros; give every name a non-zero embedding.")
    x = sparse.diags(1.0 / norms) @ x
    sim = np.asarray((x @ x.T).todense())
  else:
    x = np.asarray(embedding, np.float64)
    if x.ndim != 2:
      raise ValueError(f"cosine distance: embedding must be [n, D], got shape {x.shape}.")
    if not np.all(np.isfinite(x)):
      raise ValueError("cosine distance: embedding has NaN/inf values; fix the embedding function.")
    norms = np.linalg.norm(x, axis=1)
    if np.any(norms == 0):
      raise ValueError("cosine distance: some embeddings are all zeros; give every name a non-zero embedding.")
    x = x / norms[:, None]
    sim = x @ x.T
  d = np.clip(1.0 - sim, 0.0, 2.0)
  np.fill_diagonal(d, 0.0)
  return (d + d.T) / 2.0


def agglomerative_labels(embedding, threshold: float) -> np.ndarray:
  """Average-linkage agglomerative clustering on cosine distance, cut at `threshold`.

  The official `data_prepare.clustering` runs sklearn AgglomerativeClustering(linkage='average',
  affinity='cosine', distance_threshold=0.15); this is the same hierarchy computed with scipy on a
  precomputed distance matrix (fast for sparse TF-IDF rows). Clusters are merged while their average
  distance is below the threshold. Labels are renumbered by first appearance (deterministic).

  Args:
    embedding: [n, D] dense array or scipy sparse matrix.
    threshold: cosine-distance threshold delta (<= 0: no merging).

  Returns:
    [n] int64 cluster labels in 0..k-1.
  """
  n = embedding.shape[0]
  if len(embedding.shape) != 2:
    raise ValueError(f"agglomerative_labels: embedding must be [n, D], got shape {embedding.shape}.")
  dist = cosine_distance_matrix(embedding)
  if threshold <= 0 or n < 2:
    return np.arange(n, dtype=np.int64)
  from scipy.cluster.hierarchy import fcluster, linkage
  from scipy.spatial.distance import squareform
  z = linkage(squareform(dist, checks=False), method="average")
  # fcluster keeps merges with height <= t; nudge t down so that exact ties behave as sklearn (< t merges).
  labels = fcluster(z, t=np.nextafter(float(threshold), 0.0), criterion="distance")
  _, first = np.unique(labels, return_index=True)
  order = np.argsort(first)
  remap = np.empty(labels.max() + 1, np.int64)
  remap[np.unique(labels)[order]] = np.arange(len(order))
  return remap[labels]


def _cluster_means(embedding: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
  sums = np.zeros((k, embedding.shape[1]), np.float64)
  np.add.at(sums, labels, embedding)
  counts = np.bincount(labels, minlength=k)[:, None]
  return (sums / np.maximum(counts, 1)).astype(np.float32)


def cluster_kg(raw: RawKG, entity_embedding: np.ndarray, relation_embedding: np.ndarray, threshold: float = 0.15,
               relation_threshold: float | None = None, match_official_code: bool = False,
               entity_features: np.ndarray | None = None, relation_features: np.ndarray | None = None) -> ConceptKG:
  """Merges similar entities / relations of the concept KGs into shared nodes (paper Sec. 3.1).

  Args:
    raw: the concept-specific KGs.
    entity_embedding: [n_ent, F] name embeddings of the entities (clustered on cosine distance).
    relation_embedding: [n_rel, F'] name embeddings of the relations.
    threshold: delta, the cosine-distance threshold for entities (official 0.15).
    relation_threshold: the threshold for relations (default: the same delta, as the official code).
    match_official_code: reproduce the official `clustering` quirk where a relation cluster's embedding is
      the mean of ENTITY embeddings indexed by the relation ids (`ent_emb[nodes]` in data_prepare.py).
      Default False: the mean of the relation embeddings.
    entity_features: [n_ent, D] the model's initial features of the entities, averaged per cluster
      (default: entity_embedding; the official code uses the same ada-002 vectors for both).
    relation_features: [n_rel, D] likewise for relations (same width D as entity_features).

  Returns:
    ConceptKG with deduplicated triples (self-loops created by merging are dropped: the BAT layer's
    (1 + eps) x_i term already carries a node's own state).
  """
  from scipy import sparse
  dense = lambda a: np.asarray(a.toarray() if sparse.issparse(a) else a, np.float32)
  ent_c, rel_c = entity_embedding, relation_embedding
  ent = dense(ent_c) if entity_features is None else np.asarray(entity_features, np.float32)
  rel = dense(rel_c) if relation_features is None else np.asarray(relation_features, np.float32)
  if ent_c.shape[0] != len(raw.entity_names) or rel_c.shape[0] != len(raw.relation_names) or \
      ent.shape[0] != len(raw.entity_names) or rel.shape[0] != len(raw.relation_names):
    raise ValueError(f"cluster_kg: {ent_c.shape[0]} entity / {rel_c.shape[0]} relation embeddings for "
                     f"{len(raw.entity_names)} entities / {len(raw.relation_names)} relations; embed every name once.")
  if ent.shape[1] != rel.shape[1]:
    raise ValueError(f"cluster_kg: entity and relation features must share a width (the BAT layer projects both "
                     f"with one linear map), got {ent.shape[1]} and {rel.shape[1]}.")
  ent_labels = agglomerative_labels(ent_c, threshold)
  rel_labels = agglomerative_labels(rel_c, threshold if relation_threshold is None else relation_threshold)
  m, r = int(ent_labels.max()) + 1, int(rel_labels.max()) + 1
  node_emb = _cluster_means(ent, ent_labels, m)
  if match_official_code:
    # Deviation (official quirk, behind the flag): the code averages ent_emb at the relation indices.
    if ent.shape[0] < len(raw.relation_names):
      raise ValueError("cluster_kg(match_official_code=True) needs at least as many entities as relations.")
    rel_emb = _cluster_means(ent[: len(raw.relation_names)], rel_labels, r)
  else:
    rel_emb = _cluster_means(rel, rel_labels, r)
  node_names = [""] * m
  for i in range(len(raw.entity_names) - 1, -1, -1):
    node_names[ent_labels[i]] = raw.entity_names[i]
  relation_names = [""] * r
  for i in range(len(raw.relation_names) - 1, -1, -1):
    relation_names[rel_labels[i]] = raw.relation_names[i]
  triples = []
  for t in raw.concept_triples:
    t = np.asarray(t, np.int64).reshape(-1, 3)
    mapped = np.stack([ent_labels[t[:, 0]], rel_labels[t[:, 1]], ent_labels[t[:, 2]]], axis=1) if len(t) else t
    mapped = mapped[mapped[:, 0] != mapped[:, 2]] if len(mapped) else mapped
    triples.append(np.unique(mapped, axis=0).astype(np.int32) if len(mapped) else np.zeros((0, 3), np.int32))
  concept_node = ent_labels[np.asarray(raw.concept_entity)].astype(np.int32)
  return ConceptKG(num_nodes=m, num_relations=r, concept_node=concept_node,
                   concept_triples=triples, node_embedding=node_emb, relation_embedding=rel_emb, node_names=node_names,
                   relation_names=relation_names, concept_names=list(raw.concept_names),
                   entity_cluster=ent_labels, relation_cluster=rel_labels)


# ----------------------------------------------------------------------------------------------------------
# Name embeddings (offline stand-in for text-embedding-ada-002)
# ----------------------------------------------------------------------------------------------------------


def embed_kg_names(raw: RawKG, dim: int = 64, seed: int = 0, embedder: str = "tfidf") -> dict:
  """Embeds entity and relation names in one space (so both share a width).

  Args:
    raw: the KG whose names to embed.
    dim: width of the model features (TF-IDF: SVD width; MiniLM: 384, `dim` ignored).
    seed: SVD seed.
    embedder: 'tfidf' (`tfidf_embed`) or 'minilm' (`minilm_embed`).

  Returns:
    dict(entity_full, relation_full (for clustering), entity_features, relation_features (model init)).
  """
  names = list(raw.entity_names) + list(raw.relation_names)
  if embedder == "tfidf":
    full, red = tfidf_embed(names, dim=dim, seed=seed)
  elif embedder == "minilm":
    full = red = minilm_embed(names)
  else:
    raise ValueError(f"embed_kg_names: unknown embedder '{embedder}'; choose 'tfidf' or 'minilm'.")
  n = len(raw.entity_names)
  return {"entity_full": full[:n], "relation_full": full[n:], "entity_features": red[:n], "relation_features": red[n:]}


def tfidf_embed(names: Sequence[str], dim: int = 64, seed: int = 0):
  """Embeds names with word + character n-gram TF-IDF (deterministic, offline).

  Deviation: the paper embeds names with OpenAI's text-embedding-ada-002 (1,536 dims); nothing may be
  downloaded here, so names are embedded by TF-IDF over words and character 3-5-grams. The full sparse
  vectors (L2-normalised) are returned for clustering, and a `dim`-wide SVD projection for the model's
  initial node / relation embeddings.

  Args:
    names: n strings.
    dim: width of the reduced embedding.
    seed: SVD seed.

  Returns:
    (full [n, F] scipy CSR TF-IDF rows with unit norm, reduced [n, dim] float32 rows with unit norm).
  """
  from sklearn.decomposition import TruncatedSVD
  from sklearn.feature_extraction.text import TfidfVectorizer
  from scipy import sparse
  names = [str(s).lower().strip() or "<empty>" for s in names]
  word = TfidfVectorizer(analyzer="word", token_pattern=r"[a-z0-9]+", sublinear_tf=True).fit_transform(names)
  char = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), sublinear_tf=True).fit_transform(names)
  full = sparse.hstack([word, char]).tocsr().astype(np.float64)
  norms = np.sqrt(np.asarray(full.multiply(full).sum(1))).ravel()
  full = sparse.diags(1.0 / np.maximum(norms, 1e-12)) @ full
  k = int(min(dim, full.shape[1] - 1, max(len(names) - 1, 1)))
  if k >= 1 and len(names) > 2:
    red = TruncatedSVD(n_components=k, random_state=seed).fit_transform(full)
  else:
    red = full.toarray()[:, :dim]
  if red.shape[1] < dim:
    red = np.pad(red, ((0, 0), (0, dim - red.shape[1])))
  red = red / np.maximum(np.linalg.norm(red, axis=1, keepdims=True), 1e-12)
  return full, red.astype(np.float32)


# ----------------------------------------------------------------------------------------------------------
# The LLM step: a prompt per concept, a parser, and a KG from the parsed triples
# ----------------------------------------------------------------------------------------------------------

PROMPT_TEMPLATE = (
    "Write medical facts useful for predicting mortality, readmission, length of stay and drugs as triples, "
    "one per line, like:\n"
    "[sepsis, can cause, septic shock]\n"
    "[sepsis, treated with, antibiotics]\n"
    "[asthma, affects, airways]\n"
    "Now write up to {max_triples} triples about: {concept}\n"
)
_EXAMPLES = {("sepsis", "can cause", "septic shock"), ("sepsis", "treated with", "antibiotics"),
             ("asthma", "affects", "airways")}

_TRIPLE_RE = re.compile(r"\[\s*([^\[\],]+?)\s*,\s*([^\[\],]+?)\s*,\s*([^\[\],]+?)\s*\]")
_PAREN_RE = re.compile(r"\(\s*([^(),]+?)\s*,\s*([^(),]+?)\s*,\s*([^(),]+?)\s*\)")


def _clean(s: str) -> str:
  s = s.strip().strip("\"'`*").strip().lower()
  return re.sub(r"\s+", " ", s)


def parse_triples(text: str, max_triples: int | None = None, max_len: int = 60) -> list[tuple[str, str, str]]:
  """Extracts (head, relation, tail) triples written as [h, r, t] or (h, r, t) from generated text.

  Names are lower-cased and whitespace-normalised; empty, over-long or repeated triples are dropped,
  and so is the prompt's own example when a model echoes it.

  Args:
    text: the generator's answer.
    max_triples: keep at most this many (in order of appearance).
    max_len: longest accepted name (characters).

  Returns:
    A list of unique string triples.
  """
  out, seen = [], set()
  for rx in (_TRIPLE_RE, _PAREN_RE):
    for m in rx.finditer(text or ""):
      h, r, t = (_clean(g) for g in m.groups())
      if not h or not r or not t or max(len(h), len(r), len(t)) > max_len:
        continue
      if (h, r, t) in _EXAMPLES or h in ("head entity", "head"):
        continue
      if (h, r, t) not in seen:
        seen.add((h, r, t))
        out.append((h, r, t))
    if out:
      break
  return out[:max_triples] if max_triples else out


def propose_triples(generate_fn: Callable, concept_names: Sequence[str], max_triples: int = 10,
                    prompt_template: str = PROMPT_TEMPLATE, batched: bool = False
                    ) -> dict[str, list[tuple[str, str, str]]]:
  """The pluggable LLM step of GraphCare: asks a text generator for triples about each concept.

  Any generator works (SmolLM2 through `iclr24_jax.lm`, an API client, a fixed lookup in tests):
  `generate_fn(prompt) -> answer text`. Every triple is kept with the concept that prompted it; a
  triple whose head is not the concept still belongs to that concept's KG (as in the official
  pipeline, which keeps every triple of a concept's answer file).

  Args:
    generate_fn: prompt string -> generated text.
    concept_names: C concept names (e.g. ICD-9 titles, drug names).
    max_triples: triples kept per concept.
    prompt_template: a format string with {concept} and {max_triples}.
    batched: generate_fn takes the list of all prompts and returns the list of answers (one call).

  Returns:
    {concept name: [(head, relation, tail), ...]} in the order of `concept_names`.
  """
  if not callable(generate_fn):
    raise TypeError("propose_triples: generate_fn must be a callable prompt -> text.")
  prompts = [prompt_template.format(concept=name, max_triples=max_triples) for name in concept_names]
  answers = list(generate_fn(prompts)) if batched else [generate_fn(p) for p in prompts]
  if len(answers) != len(prompts):
    raise ValueError(f"propose_triples: {len(answers)} answers for {len(prompts)} prompts.")
  out = {}
  for name, answer in zip(concept_names, answers):
    if not isinstance(answer, str):
      raise TypeError(f"propose_triples: generate_fn returned {type(answer).__name__}, expected str.")
    out[name] = parse_triples(answer, max_triples=max_triples)
  return out


def smollm2_generate_fn(max_new_tokens: int = 96, batch_size: int = 8, prefill: bool = True,
                        **generator_kwargs) -> Callable:
  """A batched `generate_fn` backed by SmolLM2-135M-Instruct through `iclr24_jax.lm` (offline weights).

  Use as `propose_triples(smollm2_generate_fn(), names, batched=True)`. Greedy decoding; each prompt is
  wrapped in the chat template and, with `prefill`, the answer is started with "[<concept>," (the
  concept read from the prompt's last line "...: <concept>"), which a 135M model needs to follow the
  format. It proposes few, often generic triples: the hook working end to end, not GPT-4's knowledge.

  Args:
    max_new_tokens: answer length.
    batch_size: prompts per compiled call.
    prefill: start every answer with "[<concept>,".
    **generator_kwargs: passed to `iclr24_jax.lm.Generator`.

  Returns:
    prompts (list[str]) -> answers (list[str]) (prefill included).
  """
  from iclr24_jax import lm
  params, config, tok = lm.load_smollm2()
  gen = lm.Generator(params, config, tok, chat=False, batch_size=batch_size, **generator_kwargs)

  def fn(prompts: Sequence[str]) -> list[str]:
    heads, texts = [], []
    for p in prompts:
      concept = p.strip().splitlines()[-1].rsplit(":", 1)[-1].strip() if prefill else ""
      head = f"[{concept}," if prefill else ""
      heads.append(head)
      texts.append(tok.apply_chat_template(p, add_generation_prompt=True) + head)
    return [h + a for h, a in zip(heads, gen(texts, max_new_tokens=max_new_tokens))]

  return fn


def minilm_embed(names: Sequence[str], batch_size: int = 128) -> np.ndarray:
  """Unit-norm all-MiniLM-L6-v2 sentence embeddings [n, 384] of names (through `iclr24_jax.lm`).

  Closer in kind to the paper's text-embedding-ada-002 than TF-IDF, but it maps names that differ only
  by a code number ('diagnosis category 342' / '348') to nearly the same vector, so they merge at
  delta = 0.15; the MIMIC-III dictionary KG therefore defaults to `tfidf_embed`.
  """
  from iclr24_jax import lm
  params, config, tok = lm.load_minilm()
  return np.asarray(lm.embed_sentences(params, config, tok, list(names), batch_size=batch_size), np.float32)


def kg_from_triples(triples_by_concept: Mapping[str, Sequence[tuple[str, str, str]]],
                    concept_names: Sequence[str] | None = None, link_heads: bool = True) -> RawKG:
  """Turns string triples per concept into a RawKG (entities and relations indexed by name).

  The concept itself is an entity (its name); each concept's KG also links the concept to the head of
  any triple that does not mention it (relation 'related to'), so every concept KG is connected to its
  direct EHR node as in the paper's composition (Sec. 3.2).

  Args:
    triples_by_concept: {concept name: [(head, relation, tail)]}.
    concept_names: the concepts in order (default: the mapping's order).
    link_heads: add (concept, 'related to', head) for triples that do not mention the concept.

  Returns:
    RawKG.
  """
  concept_names = list(triples_by_concept) if concept_names is None else list(concept_names)
  ent_index: dict[str, int] = {}
  rel_index: dict[str, int] = {}

  def e(name):
    return ent_index.setdefault(name, len(ent_index))

  def r(name):
    return rel_index.setdefault(name, len(rel_index))

  concept_entity, concept_triples = [], []
  for c in concept_names:
    cname = _clean(c)
    ce = e(cname)
    concept_entity.append(ce)
    rows = []
    for h, rel, t in triples_by_concept.get(c, []):
      h, rel, t = _clean(h), _clean(rel), _clean(t)
      rows.append((e(h), r(rel), e(t)))
      if link_heads and h != cname and t != cname:
        rows.append((ce, r("related to"), e(h)))
    concept_triples.append(np.asarray(rows, np.int64).reshape(-1, 3))
  if not rel_index:
    r("related to")
  return RawKG(entity_names=list(ent_index), relation_names=list(rel_index), concept_names=list(concept_names),
               concept_entity=np.asarray(concept_entity, np.int64), concept_triples=concept_triples)


def fixed_kg_example() -> RawKG:
  """A small fixed KG of four concepts (for tests and docs), with a near-duplicate pair to merge."""
  triples = {
      "sepsis": [("sepsis", "causes", "septic shock"), ("septic shock", "causes", "organ failure"),
                 ("sepsis", "treated with", "antibiotics")],
      "pneumonia": [("pneumonia", "causes", "sepsis"), ("pneumonia", "treated with", "antibiotic"),
                    ("pneumonia", "affects", "lung")],
      "heart failure": [("heart failure", "causes", "pulmonary edema"), ("heart failure", "treated with", "furosemide"),
                        ("pulmonary edema", "affects", "lung")],
      "furosemide": [("furosemide", "is a", "loop diuretic"), ("furosemide", "treats", "pulmonary edema")],
  }
  return kg_from_triples(triples)
