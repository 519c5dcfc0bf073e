"""GraphCare knowledge graphs (`papers/graphcare/kg.py`): clustering against scikit-learn, the LLM triple hook."""
import numpy as np
import pytest

from iclr24_jax.papers import graphcare


def test_cluster_kg_merges_near_duplicates_and_drops_self_loops():
  raw = graphcare.kg_from_triples({"a": [("a", "causes", "x"), ("x", "causes", "x2")], "b": [("b", "leads to", "x2")]},
                                  link_heads=False)
  # entities: a, x, x2, b; x and x2 are near-duplicates (cosine distance ~0.005 < 0.15).
  ent = np.array([[1, 0, 0], [0, 1, 0.1], [0, 1, 0.0], [0, 0, 1]], np.float32)
  rel = np.array([[1, 0, 0], [1, 0.05, 0]], np.float32)  # causes ~ leads to
  ckg = graphcare.cluster_kg(raw, ent, rel, threshold=0.15)
  assert ckg.num_nodes == 3 and ckg.num_relations == 1
  assert ckg.entity_cluster[1] == ckg.entity_cluster[2]
  np.testing.assert_allclose(ckg.node_embedding[ckg.entity_cluster[1]], [0, 1, 0.05], rtol=1e-6)
  # concept a: (a, causes, x) survives, (x, causes, x2) became a self-loop and is dropped.
  assert ckg.concept_triples[0].tolist() == [[ckg.concept_node[0], 0, ckg.entity_cluster[1]]]
  # official-code quirk: relation cluster embedding = mean of ENTITY rows at the relation indices.
  q = graphcare.cluster_kg(raw, ent, rel, threshold=0.15, match_official_code=True)
  np.testing.assert_allclose(q.relation_embedding[0], ent[:2].mean(0), rtol=1e-6)


def test_agglomerative_labels_match_sklearn():
  from sklearn.cluster import AgglomerativeClustering
  rng = np.random.default_rng(0)
  centers = rng.normal(size=(12, 16))
  x = np.repeat(centers, 4, 0) + 0.1 * rng.normal(size=(48, 16))
  for t in (0.05, 0.15, 0.4):
    ours = graphcare.agglomerative_labels(x, t)
    ref = AgglomerativeClustering(n_clusters=None, distance_threshold=t, linkage="average",
                                  metric="cosine").fit_predict(x)
    # same partition: pairs in the same cluster agree
    np.testing.assert_array_equal(ours[:, None] == ours[None, :], ref[:, None] == ref[None, :])


def test_propose_triples_hook_with_a_fixed_generator():
  answers = {"sepsis": "[sepsis, causes, Septic Shock]\n(sepsis, treated with, antibiotics)\n[bad]",
             "asthma": "Sure! [asthma, affects, lung] [asthma, affects, lung] [asthma, treated with, inhaler]"}

  def gen(prompt):
    assert "triples about:" in prompt
    return next(v for k, v in answers.items() if prompt.rstrip().endswith(k))

  out = graphcare.propose_triples(gen, ["sepsis", "asthma"], max_triples=5)
  assert out["sepsis"] == [("sepsis", "causes", "septic shock")]  # [..] form wins over (..) when both occur
  assert out["asthma"] == [("asthma", "affects", "lung"), ("asthma", "treated with", "inhaler")]
  raw = graphcare.kg_from_triples(out)
  assert raw.concept_names == ["sepsis", "asthma"]
  assert raw.entity_names[raw.concept_entity[1]] == "asthma"
  with pytest.raises(TypeError, match="generate_fn"):
    graphcare.propose_triples("not callable", ["x"])


@pytest.mark.slow
def test_smollm2_hook_end_to_end():
  pytest.importorskip("gguf")
  try:
    fn = graphcare.smollm2_generate_fn(max_new_tokens=48, batch_size=2)
  except FileNotFoundError as e:
    pytest.skip(str(e))
  out = graphcare.propose_triples(fn, ["heart failure", "sepsis"], max_triples=5, batched=True)
  assert set(out) == {"heart failure", "sepsis"}
  assert all(len(t) == 3 and all(isinstance(x, str) and x for x in t) for ts in out.values() for t in ts)
  raw = graphcare.kg_from_triples(out)
  assert raw.concept_names == ["heart failure", "sepsis"]
