"""EHR data for GraphCare: the embedded synthetic generator and the MIMIC-III demo (four tasks).

Synthetic (the embedded default). A random concept KG: C concepts (EHR codes), base entities with
near-duplicate surface forms (so that clustering at delta = 0.15 has something to merge), relations with
synonyms, and a global entity graph. Each concept's KG holds its 1-hop entities and their out-edges
(2-hop). A concept's risk is the number of 2-hop paths concept -> entity -['causes']-> risk entity minus
the number of paths concept -> entity -['prevents']-> risk entity: it depends on the relation TYPE of
the second hop, so a risk entity's presence in a patient's graph is ambiguous (counting a patient's edges
into risk entities regardless of relation gives about 0.7 AUROC, the true score about 0.97). A patient's
label is 1 when the recency-weighted risk of its codes, sum_j exp(-g (J - 1 - j)) sum_{c in visit j}
risk(c), plus noise, exceeds a threshold. Codes follow a Zipf law, so most codes are
rare: an EHR-only model must learn each code's risk from its few patients, a KG-aware model can read it
off shared structure (the paper's limited-data argument).

MIMIC-III demo (100 patients, `shared_data_dir()/mimic3_demo`). Visits = admissions ordered by time;
the admission dates were re-saved by a spreadsheet with two-digit years, so the century is restored
from the ICU stays' intact four-digit INTIME of the same admission (HADM_ID is not chronological in
MIMIC-III). Codes: ICD-9 diagnoses, ICD-9 procedures, and drugs (first word of the PRESCRIPTIONS drug
name, a stand-in for PyHealth's NDC -> ATC-3 mapping, which is not available offline). Tasks follow
PyHealth / the official task_fn.py: mortality (next visit's HOSPITAL_EXPIRE_FLAG, history input),
readmission (next admission within 15 days, current visit), length of stay (10 classes of
`categorize_los`, current visit, conditions + procedures), drug recommendation (current visit's drugs,
condition + procedure history). Visits without a condition, a procedure or a drug are skipped, as there.
The concept KGs come from the code dictionaries (ICD-9 hierarchy and chapters, shared title words,
drug-name stems and routes): see `mimic_concept_kg`.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import os
import pathlib
import re
from typing import Sequence

import numpy as np

from iclr24_jax.papers.graphcare.kg import RawKG, kg_from_triples

TASKS = {"mortality": "binary", "readmission": "binary", "los": "multiclass", "drugrec": "multilabel"}


@dataclasses.dataclass
class EHRDataset:
  """Samples for one prediction task.

  Attributes:
    name: data set name.
    task: 'binary' | 'multiclass' | 'multilabel'.
    visits: per sample, its visits (chronological), each an int array of concept indices.
    labels: [n] (binary {0, 1} / multiclass int) or [n, L] (multilabel).
    patient_ids: [n] patient of each sample (splits are by patient).
    num_outputs: model outputs (1, classes, labels).
    label_names: names of classes / labels.
    concept_names: names of the concepts (index = concept id).
  """

  name: str
  task: str
  visits: list
  labels: np.ndarray
  patient_ids: np.ndarray
  num_outputs: int
  label_names: list[str]
  concept_names: list[str]

  def __len__(self) -> int:
    return len(self.visits)


def split_by_patient(patient_ids: np.ndarray, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 528
                     ) -> tuple[np.ndarray, ...]:
  """Sample indices of train / val / test with disjoint patients (official: split_by_patient, seed 528)."""
  pats = np.unique(patient_ids)
  perm = np.random.default_rng(seed).permutation(pats)
  bounds = np.cumsum([int(round(f * len(pats))) for f in fractions[:-1]])
  groups = np.split(perm, bounds)
  return tuple(np.flatnonzero(np.isin(patient_ids, g)) for g in groups)


def kfold_by_patient(patient_ids: np.ndarray, k: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
  """k (train, test) sample-index folds with disjoint patients."""
  pats = np.random.default_rng(seed).permutation(np.unique(patient_ids))
  folds = np.array_split(pats, k)
  return [(np.flatnonzero(~np.isin(patient_ids, f)), np.flatnonzero(np.isin(patient_ids, f))) for f in folds]


# ----------------------------------------------------------------------------------------------------------
# Synthetic EHR over a random concept KG
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SyntheticEHR:
  """The synthetic world: raw KG, name embeddings, the data set and the ground truth."""

  raw_kg: RawKG
  entity_embedding: np.ndarray     # [n_ent, D] name embeddings (for clustering and initial features)
  relation_embedding: np.ndarray   # [n_rel, D]
  dataset: EHRDataset
  concept_risk: np.ndarray         # [C] number of risk paths per concept
  risk_entities: np.ndarray        # base ids of the risk entities
  scores: np.ndarray               # [n] the latent patient score


def make_synthetic_ehr(seed: int = 0, num_patients: int = 3000, num_concepts: int = 600, num_entities: int = 150,
                       num_relations: int = 6, max_synonyms: int = 2, concept_degree: int = 3, entity_degree: int = 3,
                       num_risk: int = 12, risk_edge_bias: float = 0.5, embedding_dim: int = 32,
                       synonym_noise: float = 0.25, max_visits: int = 6, codes_per_visit: tuple[int, int] = (2, 5),
                       zipf: float = 1.1, true_decay: float = 0.3, noise: float = 0.3, positive_rate: float = 0.35,
                       risk_semantic: float = 0.0, protective_edge_bias: float = 0.3) -> SyntheticEHR:
  """Generates a concept KG and patients whose labels depend on relation-typed 2-hop KG paths.

  Args:
    seed: RNG seed.
    num_patients: patients (one sample each).
    num_concepts: C EHR codes (each a KG entity of its own).
    num_entities: base entities of the entity graph.
    num_relations: base relation types (0 = risk, 1 = protective, the rest neutral; at least 3).
    max_synonyms: surface forms per base entity / relation (near-duplicate names to be clustered).
    concept_degree: 1-hop entities per concept.
    entity_degree: out-edges per entity (the 2-hop part of a concept KG).
    num_risk: risk entities (never 1-hop neighbours of a concept).
    risk_edge_bias: probability that an edge into a risk entity has the risk relation 0 ('causes', +1).
    protective_edge_bias: probability that it has the protective relation 1 ('prevents', -1); otherwise
      it has a neutral relation (2..R-1). A risk entity's presence alone is therefore ambiguous.
    embedding_dim: width of the name embeddings.
    synonym_noise: relative noise of a synonym's embedding (0.25 -> cosine distance about 0.06).
    max_visits: visits per patient are 1 + Poisson(1.5), capped here.
    codes_per_visit: (low, high) inclusive codes per visit.
    zipf: exponent of the code frequency law.
    true_decay: recency decay of the label's risk sum.
    noise: label noise (std, relative to the score's std).
    positive_rate: fraction of positive labels (threshold = quantile).
    risk_semantic: weight of a direction shared by the risk entities' name embeddings (0: names carry no
      hint; > 0 mimics text embeddings in which related findings lie close, as GraphCare's ada-002 vectors).

  Returns:
    SyntheticEHR.
  """
  rng = np.random.default_rng(seed)
  if num_relations < 3:
    raise ValueError(f"make_synthetic_ehr: num_relations must be >= 3 (risk, protective, neutral), "
                     f"got {num_relations}.")
  if num_risk >= num_entities:
    raise ValueError(f"make_synthetic_ehr: num_risk ({num_risk}) must be below num_entities ({num_entities}).")
  # Names and embeddings: concepts, then entity surface forms; relations with synonyms.
  base_vec = rng.normal(size=(num_entities, embedding_dim))
  risk = rng.choice(num_entities, num_risk, replace=False)
  shared = rng.normal(size=embedding_dim)
  base_vec[risk] += risk_semantic * shared
  concept_vec = rng.normal(size=(num_concepts, embedding_dim))
  ent_names = [f"code {c}" for c in range(num_concepts)]
  ent_vecs = [concept_vec[c] for c in range(num_concepts)]

  def add_synonyms(base: np.ndarray, label: str, names: list, vecs: list) -> list[int]:
    """1..max_synonyms surface forms of one entity/relation, each a noisy copy of its base vector."""
    forms = []
    for v in range(rng.integers(1, max_synonyms + 1)):
      forms.append(len(names))
      names.append(label + ("" if v == 0 else f" variant {v}"))
      nz = rng.normal(size=embedding_dim)
      vecs.append(base + synonym_noise * np.linalg.norm(base) * nz / np.linalg.norm(nz))
    return forms

  variants = [add_synonyms(base_vec[b], f"entity {b}", ent_names, ent_vecs) for b in range(num_entities)]
  rel_base = rng.normal(size=(num_relations, embedding_dim))
  rel_names, rel_vecs = [], []
  rel_variants = [add_synonyms(rel_base[r], f"relation {r}", rel_names, rel_vecs) for r in range(num_relations)]
  pick = lambda forms: forms[rng.integers(len(forms))]
  # The entity graph; risk entities receive risk-relation edges with probability risk_edge_bias.
  is_risk = np.zeros(num_entities, bool)
  is_risk[risk] = True
  out_edges = []
  for b in range(num_entities):
    targets = rng.choice(np.delete(np.arange(num_entities), b), entity_degree, replace=False)
    rels = []
    for t in targets:
      u = rng.random()
      if is_risk[t] and u < risk_edge_bias:
        rels.append(0)                                   # 'causes' a risk finding: +1
      elif is_risk[t] and u < risk_edge_bias + protective_edge_bias:
        rels.append(1)                                   # 'prevents' a risk finding: -1
      else:
        rels.append(int(rng.integers(2, num_relations)))  # neutral relation types
    out_edges.append(list(zip(rels, targets.tolist())))
  # Concept KGs: 1-hop entities (non-risk) and their out-edges.
  non_risk = np.flatnonzero(~is_risk)
  concept_triples, concept_risk = [], np.zeros(num_concepts, np.int64)
  for c in range(num_concepts):
    rows = []
    for b in rng.choice(non_risk, concept_degree, replace=False):
      rows.append((c, pick(rel_variants[int(rng.integers(2, num_relations))]), pick(variants[b])))
      for r, t in out_edges[b]:
        rows.append((pick(variants[b]), pick(rel_variants[r]), pick(variants[t])))
        concept_risk[c] += int(is_risk[t]) * (int(r == 0) - int(r == 1))
    concept_triples.append(np.asarray(rows, np.int64))
  raw = RawKG(entity_names=ent_names, relation_names=rel_names,
              concept_names=[f"code {c}" for c in range(num_concepts)],
              concept_entity=np.arange(num_concepts, dtype=np.int64), concept_triples=concept_triples)
  # Patients.
  freq = 1.0 / (np.arange(num_concepts) + 5.0) ** zipf
  freq = freq[rng.permutation(num_concepts)]
  freq /= freq.sum()
  visits, scores = [], []
  for _ in range(num_patients):
    j_count = int(min(1 + rng.poisson(1.5), max_visits))
    pv, score = [], 0.0
    for j in range(j_count):
      k = int(rng.integers(codes_per_visit[0], codes_per_visit[1] + 1))
      codes = np.sort(rng.choice(num_concepts, k, replace=False, p=freq))
      pv.append(codes)
      score += np.exp(-true_decay * (j_count - 1 - j)) * concept_risk[codes].sum()
    visits.append(pv)
    scores.append(score)
  scores = np.asarray(scores, np.float64)
  noisy = scores + noise * scores.std() * rng.normal(size=num_patients)
  labels = (noisy > np.quantile(noisy, 1.0 - positive_rate)).astype(np.int32)
  ds = EHRDataset(name="synthetic", task="binary", visits=visits, labels=labels,
                  patient_ids=np.arange(num_patients), num_outputs=1, label_names=["positive"],
                  concept_names=list(raw.concept_names))
  return SyntheticEHR(raw_kg=raw, entity_embedding=np.asarray(ent_vecs, np.float32),
                      relation_embedding=np.asarray(rel_vecs, np.float32), dataset=ds, concept_risk=concept_risk,
                      risk_entities=risk, scores=scores)


# ----------------------------------------------------------------------------------------------------------
# MIMIC-III demo
# ----------------------------------------------------------------------------------------------------------

MIMIC_FILES = ("ADMISSIONS.csv", "ICUSTAYS.csv", "DIAGNOSES_ICD.csv", "PROCEDURES_ICD.csv", "PRESCRIPTIONS.csv",
               "D_ICD_DIAGNOSES.csv", "D_ICD_PROCEDURES.csv")

DX_CHAPTERS = [(1, 139, "infectious and parasitic diseases"), (140, 239, "neoplasms"),
               (240, 279, "endocrine nutritional metabolic and immunity disorders"),
               (280, 289, "diseases of the blood"), (290, 319, "mental disorders"),
               (320, 389, "diseases of the nervous system and sense organs"),
               (390, 459, "diseases of the circulatory system"), (460, 519, "diseases of the respiratory system"),
               (520, 579, "diseases of the digestive system"), (580, 629, "diseases of the genitourinary system"),
               (630, 679, "complications of pregnancy"), (680, 709, "diseases of the skin"),
               (710, 739, "diseases of the musculoskeletal system"), (740, 759, "congenital anomalies"),
               (760, 779, "perinatal conditions"), (780, 799, "symptoms signs and ill-defined conditions"),
               (800, 999, "injury and poisoning")]
PX_CHAPTERS = [(0, 0, "procedures and interventions nec"), (1, 5, "operations on the nervous system"),
               (6, 7, "operations on the endocrine system"), (8, 16, "operations on the eye"),
               (17, 17, "miscellaneous diagnostic and therapeutic procedures"), (18, 20, "operations on the ear"),
               (21, 29, "operations on the nose mouth and pharynx"), (30, 34, "operations on the respiratory system"),
               (35, 39, "operations on the cardiovascular system"),
               (40, 41, "operations on the hemic and lymphatic system"),
               (42, 54, "operations on the digestive system"), (55, 59, "operations on the urinary tract"),
               (60, 64, "operations on the male genital organs"), (65, 71, "operations on the female genital organs"),
               (72, 75, "obstetrical procedures"), (76, 84, "operations on the musculoskeletal system"),
               (85, 86, "operations on the integumentary system"),
               (87, 99, "miscellaneous diagnostic and therapeutic procedures")]
DRUG_STEMS = [("olol", "beta blocker"), ("pril", "ace inhibitor"), ("sartan", "angiotensin receptor blocker"),
              ("dipine", "calcium channel blocker"), ("statin", "statin"), ("prazole", "proton pump inhibitor"),
              ("tidine", "h2 receptor antagonist"), ("cillin", "penicillin antibiotic"),
              ("cef", "cephalosporin antibiotic"), ("floxacin", "fluoroquinolone antibiotic"),
              ("mycin", "antibiotic"), ("micin", "antibiotic"), ("azole", "antifungal"), ("parin", "anticoagulant"),
              ("arin", "anticoagulant"), ("sone", "corticosteroid"), ("olone", "corticosteroid"),
              ("azepam", "benzodiazepine"), ("zolam", "benzodiazepine"), ("semide", "loop diuretic"),
              ("thiazide", "thiazide diuretic"), ("profen", "nsaid"), ("caine", "local anesthetic"),
              ("vir", "antiviral"), ("terol", "bronchodilator"), ("tropium", "bronchodilator"),
              ("insulin", "antidiabetic"), ("formin", "antidiabetic"), ("glipizide", "antidiabetic"),
              ("setron", "antiemetic"), ("codone", "opioid"), ("morphine", "opioid"), ("fentanyl", "opioid"),
              ("potassium", "electrolyte"), ("sodium", "electrolyte"), ("magnesium", "electrolyte"),
              ("calcium", "electrolyte"), ("phosphate", "electrolyte"), ("dextrose", "glucose solution"),
              ("vancomycin", "glycopeptide antibiotic"), ("pressin", "vasopressor"), ("ephrine", "vasopressor"),
              ("dopamine", "vasopressor")]
_STOP = set("""a an and or of the with without in on to for by at from as is nos nec other unspecified specified
mention than not any site part type due use current status history personal long term initial episode care
encounter""".split())


def _read_csv(path: pathlib.Path):
  import pandas as pd
  return pd.read_csv(path, dtype=str, keep_default_na=False)


def _parse_two_digit(s: str) -> tuple[int, int, int, int, int]:
  """'10/23/64 21:09' -> (month, day, yy, hour, minute)."""
  m = re.match(r"\s*(\d+)/(\d+)/(\d+)\s+(\d+):(\d+)", s)
  if not m:
    raise ValueError(f"unexpected ADMISSIONS date '{s}'")
  mo, d, yy, h, mi = (int(x) for x in m.groups())
  return mo, d, yy % 100, h, mi


def _restore_year(yy: int, reference_year: int) -> int:
  """The year with last two digits yy closest to reference_year."""
  base = reference_year - reference_year % 100
  cands = [base - 100 + yy, base + yy, base + 100 + yy]
  return min(cands, key=lambda y: abs(y - reference_year))


def _drug_name(drug: str) -> str:
  toks = re.findall(r"[a-z]{3,}", drug.lower())
  return toks[0] if toks else ""


def _dx_chapter(code: str) -> str:
  if code.startswith("V"):
    return "supplementary factors influencing health status"
  if code.startswith("E"):
    return "external causes of injury"
  try:
    n = int(code[:3])
  except ValueError:
    return "unknown chapter"
  return next((name for lo, hi, name in DX_CHAPTERS if lo <= n <= hi), "unknown chapter")


def _px_chapter(code: str) -> str:
  try:
    n = int(code[:2])
  except ValueError:
    return "unknown procedure chapter"
  return next((name for lo, hi, name in PX_CHAPTERS if lo <= n <= hi), "unknown procedure chapter")


def _dx_category(code: str) -> str:
  return code[:4] if code.startswith("E") else code[:3]


@dataclasses.dataclass
class MimicVisits:
  """Admissions of the demo in chronological order per patient."""

  subject: list[str]
  hadm: list[str]
  admit: list[dt.datetime]
  discharge: list[dt.datetime]
  expire: list[int]
  conditions: list[list[str]]
  procedures: list[list[str]]
  drugs: list[list[str]]
  dx_titles: dict[str, str]
  px_titles: dict[str, str]
  drug_routes: dict[str, str]


MIMIC_SOURCE = ("MIMIC-III v1.4 from PhysioNet (physionet.org/content/mimiciii/1.4/, credentialed access; the 100-patient "
                "demo: physionet.org/content/mimiciii-demo/1.4/): the CSV tables, .csv or .csv.gz")


def mimic_table(folder: pathlib.Path, filename: str) -> pathlib.Path:
  """`folder/filename`, or its gzipped copy `filename.gz` (PhysioNet ships the full MIMIC-III as .csv.gz)."""
  p = folder / filename
  return p if p.exists() or not (folder / (filename + ".gz")).exists() else folder / (filename + ".gz")


def mimic3_demo_dir(data_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """The MIMIC-III (demo) folder (data_dir, or shared_data_dir()/mimic3_demo); clear error when missing.

  Raises:
    common.data.DataNotFoundError (a FileNotFoundError) naming the missing tables and where to get them.
  """
  from iclr24_jax.common.data import DataNotFoundError, shared_data_dir
  if data_dir:
    p = pathlib.Path(data_dir)
  else:
    root = shared_data_dir()
    if root is None:
      raise DataNotFoundError("MIMIC-III demo not found: set config.data.data_dir to the folder with ADMISSIONS.csv "
                              f"etc., or ICLR24_DATA to the shared data folder (holding mimic3_demo/). Get it: "
                              f"{MIMIC_SOURCE}.")
    p = root / "mimic3_demo"
  missing = [f for f in MIMIC_FILES if not mimic_table(p, f).exists()]
  if missing:
    raise DataNotFoundError(f"MIMIC-III folder '{p}' lacks {missing} (.csv or .csv.gz); point config.data.data_dir "
                            f"at the MIMIC-III (demo) CSV folder. Get it: {MIMIC_SOURCE}.")
  return p


def _parse_time(s: str) -> dt.datetime | None:
  """An ISO 'YYYY-MM-DD HH:MM:SS' time (the PhysioNet files), or None for the demo's re-saved 'M/D/YY H:M'."""
  m = re.match(r"\s*(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2})", s)
  return dt.datetime(*(int(x) for x in m.groups())) if m else None


def read_mimic3_demo(data_dir: str | os.PathLike | None = None) -> MimicVisits:
  """Reads admissions with their codes, restoring four-digit years from ICUSTAYS.INTIME."""
  p = mimic3_demo_dir(data_dir)
  adm = _read_csv(mimic_table(p, "ADMISSIONS.csv"))
  icu = _read_csv(mimic_table(p, "ICUSTAYS.csv"))
  dx = _read_csv(mimic_table(p, "DIAGNOSES_ICD.csv"))
  px = _read_csv(mimic_table(p, "PROCEDURES_ICD.csv"))
  rx = _read_csv(mimic_table(p, "PRESCRIPTIONS.csv"))
  ddx = _read_csv(mimic_table(p, "D_ICD_DIAGNOSES.csv"))
  dpx = _read_csv(mimic_table(p, "D_ICD_PROCEDURES.csv"))
  icu_year = {}
  for h, t in zip(icu["HADM_ID"], icu["INTIME"]):
    y = int(t[:4])
    icu_year[h] = min(icu_year.get(h, y), y)
  by_hadm = lambda df, col: {h: sorted(set(g[col]) - {""}) for h, g in df.groupby("HADM_ID")}
  dx_codes, px_codes = by_hadm(dx, "ICD9_CODE"), by_hadm(px, "ICD9_CODE")
  rx = rx.assign(NAME=[_drug_name(d) for d in rx["DRUG"]])
  rx = rx[rx["NAME"] != ""]
  rx_codes = by_hadm(rx, "NAME")
  routes = {n: g["ROUTE"].value_counts().index[0] for n, g in rx.groupby("NAME") if len(g["ROUTE"])}
  rows = []
  for _, a in adm.iterrows():
    admit, disch = _parse_time(a["ADMITTIME"]), _parse_time(a["DISCHTIME"])
    if admit is not None and disch is not None:   # the PhysioNet files: four-digit (shifted) years as they are
      rows.append((a["SUBJECT_ID"], admit, a["HADM_ID"], disch, int(a["HOSPITAL_EXPIRE_FLAG"] or 0)))
      continue
    mo, d, yy, h, mi = _parse_two_digit(a["ADMITTIME"])
    ref = icu_year.get(a["HADM_ID"])
    year = _restore_year(yy, ref) if ref is not None else 2100 + yy
    admit = dt.datetime(year, mo, d, h, mi)
    mo2, d2, yy2, h2, mi2 = _parse_two_digit(a["DISCHTIME"])
    y2 = _restore_year(yy2, year)
    disch = dt.datetime(y2, mo2, d2, h2, mi2)
    if disch < admit:
      disch = dt.datetime(y2 + 100, mo2, d2, h2, mi2)
    rows.append((a["SUBJECT_ID"], admit, a["HADM_ID"], disch, int(a["HOSPITAL_EXPIRE_FLAG"] or 0)))
  rows.sort(key=lambda r: (int(r[0]), r[1], int(r[2])))
  return MimicVisits(subject=[r[0] for r in rows], hadm=[r[2] for r in rows], admit=[r[1] for r in rows],
                     discharge=[r[3] for r in rows], expire=[r[4] for r in rows],
                     conditions=[dx_codes.get(r[2], []) for r in rows],
                     procedures=[px_codes.get(r[2], []) for r in rows],
                     drugs=[rx_codes.get(r[2], []) for r in rows],
                     dx_titles=dict(zip(ddx["ICD9_CODE"], ddx["LONG_TITLE"])),
                     px_titles=dict(zip(dpx["ICD9_CODE"], dpx["LONG_TITLE"])), drug_routes=routes)


def categorize_los(days: int) -> int:
  """PyHealth's 10 length-of-stay classes: <1 day, each of days 1..7, 8-14 days, > 14 days."""
  if days < 1:
    return 0
  if days <= 7:
    return int(days)
  if days <= 14:
    return 8
  return 9


def _words(title: str) -> list[str]:
  return sorted({w for w in re.findall(r"[a-z]+", title.lower()) if len(w) >= 4 and w not in _STOP})


def mimic_concept_kg(mv: MimicVisits, min_word_concepts: int = 2, include_drugs: bool = True
                     ) -> tuple[RawKG, dict[str, int]]:
  """Dictionary-derived concept KGs for every code of the demo.

  Deviation: the paper's concept KGs come from GPT-4 prompts and UMLS sub-graphs, neither available
  offline. Here each code's KG links it to its ICD-9 category and chapter (diagnoses, procedures), to the
  content words of its long title shared with other codes ('mentions'), and each drug to its
  pharmacological class by name stem and to its most common route. A drug whose name is also a title
  word (insulin, heparin ...) is the same entity. `kg.propose_triples` adds LLM triples on top.

  Args:
    mv: the demo's admissions.
    min_word_concepts: keep title words used by at least this many codes.
    include_drugs: add the drug concepts (the official KG of length of stay and drug recommendation has
      conditions and procedures only: CCSCM_CCSPROC).

  Returns:
    (RawKG over the concepts 'dx:<icd9>', 'px:<icd9>', 'rx:<name>', {concept key: concept index}).
  """
  dx = sorted({c for v in mv.conditions for c in v})
  px = sorted({c for v in mv.procedures for c in v})
  rx = sorted({c for v in mv.drugs for c in v}) if include_drugs else []
  names, keys = [], []
  for c in dx:
    keys.append(f"dx:{c}"), names.append(mv.dx_titles.get(c, f"diagnosis icd9 {c}").lower())
  for c in px:
    keys.append(f"px:{c}"), names.append(mv.px_titles.get(c, f"procedure icd9 {c}").lower())
  for c in rx:
    keys.append(f"rx:{c}"), names.append(c)
  word_use: dict[str, int] = {}
  for name in names[: len(dx) + len(px)]:
    for w in _words(name):
      word_use[w] = word_use.get(w, 0) + 1
  shared = {w for w, n in word_use.items() if n >= min_word_concepts}
  triples = {}
  for key, name in zip(keys, names):
    kind, code = key.split(":", 1)
    rows = []
    if kind == "dx":
      cat = f"diagnosis category {_dx_category(code)}"
      rows += [(name, "is a", cat), (cat, "part of", _dx_chapter(code))]
    elif kind == "px":
      cat = f"procedure category {code[:2]}"
      rows += [(name, "is a", cat), (cat, "part of", _px_chapter(code))]
    else:
      for stem, cls in DRUG_STEMS:
        if stem in code:
          rows.append((name, "belongs to class", cls))
          break
      route = mv.drug_routes.get(code, "").lower()
      if route:
        rows.append((name, "given by route", f"route {route}"))
    if kind in ("dx", "px"):
      rows += [(name, "mentions", w) for w in _words(name) if w in shared]
    triples[name] = rows
  # Distinct codes may share a title; keep names unique by suffixing the code.
  seen: dict[str, int] = {}
  uniq_names = []
  for key, name in zip(keys, names):
    seen[name] = seen.get(name, 0) + 1
    uniq_names.append(name if seen[name] == 1 else f"{name} ({key})")
  triples_u = {}
  for key, name, uname in zip(keys, names, uniq_names):
    triples_u[uname] = [((uname if h == name else h), r, (uname if t == name else t)) for h, r, t in triples[name]]
  raw = kg_from_triples(triples_u, uniq_names, link_heads=False)
  return raw, {k: i for i, k in enumerate(keys)}


def mimic3_demo_task(task: str, data_dir: str | os.PathLike | None = None, min_drug_visits: int = 5,
                     mv: MimicVisits | None = None, kg: tuple[RawKG, dict[str, int]] | None = None
                     ) -> tuple[EHRDataset, RawKG]:
  """Builds one GraphCare task from the demo (PyHealth task functions, see module docstring).

  Args:
    task: 'mortality' | 'readmission' | 'los' | 'drugrec'.
    data_dir: the demo folder (default: the shared data).
    min_drug_visits: drug-recommendation labels are drugs prescribed in at least this many samples.
    mv: already-read admissions (else read from data_dir).
    kg: a prebuilt (RawKG, concept index) from `mimic_concept_kg(mv, include_drugs=task uses drugs)`.

  Returns:
    (EHRDataset, RawKG): conditions + procedures (+ drugs for mortality / readmission) of the whole demo.
  """
  if task not in TASKS:
    raise ValueError(f"unknown MIMIC-III task '{task}'; choose one of {sorted(TASKS)}.")
  mv = read_mimic3_demo(data_dir) if mv is None else mv
  use_drugs = task in ("mortality", "readmission")
  raw, index = mimic_concept_kg(mv, include_drugs=use_drugs) if kg is None else kg
  by_patient: dict[str, list[int]] = {}
  for i, s in enumerate(mv.subject):
    by_patient.setdefault(s, []).append(i)

  def visit_codes(i: int) -> np.ndarray:
    codes = [index[f"dx:{c}"] for c in mv.conditions[i]] + [index[f"px:{c}"] for c in mv.procedures[i]]
    if use_drugs:
      codes += [index[f"rx:{c}"] for c in mv.drugs[i]]
    return np.asarray(sorted(set(codes)), np.int64)

  complete = lambda i: bool(mv.conditions[i] and mv.procedures[i] and mv.drugs[i])
  visits, labels, pids = [], [], []
  for pid, adms in by_patient.items():
    history = []
    for n, i in enumerate(adms):
      if task in ("mortality", "readmission"):
        if n + 1 == len(adms):
          break
        nxt = adms[n + 1]
        if not complete(i):
          continue
        history.append(visit_codes(i))
        if task == "mortality":
          visits.append(list(history)), labels.append(int(mv.expire[nxt] == 1))
        else:
          visits.append([visit_codes(i)])
          labels.append(int((mv.admit[nxt] - mv.admit[i]).days < 15))
        pids.append(pid)
      else:
        if not complete(i):
          continue
        history.append(visit_codes(i))
        if task == "los":
          visits.append([visit_codes(i)]), labels.append(categorize_los((mv.discharge[i] - mv.admit[i]).days))
        else:
          visits.append(list(history)), labels.append(list(mv.drugs[i]))
        pids.append(pid)
  if not visits:
    raise ValueError(f"MIMIC-III demo task '{task}' produced no samples.")
  if task == "drugrec":
    counts: dict[str, int] = {}
    for ds in labels:
      for d in ds:
        counts[d] = counts.get(d, 0) + 1
    vocab = sorted(d for d, n in counts.items() if n >= min_drug_visits)
    col = {d: k for k, d in enumerate(vocab)}
    y = np.zeros((len(labels), len(vocab)), np.int32)
    for r, ds in enumerate(labels):
      for d in ds:
        if d in col:
          y[r, col[d]] = 1
    label_arr, num_out, label_names = y, len(vocab), vocab
  elif task == "los":
    label_arr, num_out, label_names = np.asarray(labels, np.int32), 10, [str(k) for k in range(10)]
  else:
    label_arr, num_out, label_names = np.asarray(labels, np.int32), 1, ["positive"]
  ds = EHRDataset(name=f"mimic3_demo_{task}", task=TASKS[task], visits=visits, labels=label_arr,
                  patient_ids=np.asarray([int(p) for p in pids]), num_outputs=num_out, label_names=label_names,
                  concept_names=list(raw.concept_names))
  return ds, raw


# ----------------------------------------------------------------------------------------------------------
# One entry point for the paper's EHR data.

DATASETS = {
    "mimic3": "MIMIC-III v1.4 CSV tables (PhysioNet): ADMISSIONS, ICUSTAYS, DIAGNOSES_ICD, PROCEDURES_ICD, "
              "PRESCRIPTIONS, D_ICD_DIAGNOSES, D_ICD_PROCEDURES (.csv or .csv.gz, the PhysioNet header)",
    "mimic3_demo": "the MIMIC-III Clinical Database Demo v1.4 (100 patients): the same tables as .csv",
}


def load(data_config) -> tuple[EHRDataset, RawKG]:
  """One GraphCare task (`config.data.task`) on the MIMIC-III tables of `config.data.data_dir`.

  Args:
    data_config: config.data with `name` ('mimic3' or 'mimic3_demo'), `data_dir` ('' = `<shared
      data>/mimic3_demo`), `task` ('mortality', 'readmission', 'los', 'drugrec'; default 'mortality') and
      optionally `min_drug_visits` (default 5).

  Returns:
    (EHRDataset, RawKG) as `mimic3_demo_task` builds them (PyHealth's task functions on the admissions).

  Raises:
    ValueError: unknown name or task. common.data.DataNotFoundError: a table is missing (the message names it
      and PhysioNet's page).
  """
  from iclr24_jax.common import data as data_lib
  name = data_lib.config_value(data_config, "name")
  if name not in DATASETS:
    raise ValueError(f"unknown GraphCare data set '{name}'; choose one of {sorted(DATASETS)}.")
  task = str(data_lib.config_value(data_config, "task", "mortality") or "mortality")
  if task not in TASKS:
    raise ValueError(f"unknown GraphCare task '{task}'; choose one of {sorted(TASKS)}.")
  root = mimic_folder(data_config)
  return mimic3_demo_task(task, root, int(data_lib.config_value(data_config, "min_drug_visits", 5)))


def mimic_folder(data_config) -> pathlib.Path:
  """The MIMIC-III folder `config.data` names, checked for every table (a cheap fail-fast before reading).

  'mimic3' needs `data_dir` (or `$ICLR24_DATA/mimic3`); 'mimic3_demo' falls back to `<shared data>/mimic3_demo`.

  Raises:
    common.data.DataNotFoundError: the folder or a table is missing.
  """
  from iclr24_jax.common import data as data_lib
  name = data_lib.config_value(data_config, "name")
  root = data_lib.locate_data(data_config, name, what=f"MIMIC-III ({name})",
                              layout=", ".join(MIMIC_FILES) + " (or .csv.gz) in one folder", source=MIMIC_SOURCE)
  return mimic3_demo_dir(root)
