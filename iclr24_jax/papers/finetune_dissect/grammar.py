"""A probabilistic text grammar with explicit topic, style and fact variables: the known answer for the estimator.

A document is a BOS token and `num_sentences` sentences of five tokens:

  [style word, topic word, subject, value, '.']

Its topic t ~ pi_T and style s ~ pi_S are drawn once per document; each sentence's style word is uniform over
style s's `style_vocab` words and its topic word uniform over topic t's `topic_vocab` words (vocabularies are
disjoint, so the first style/topic word reveals the latent); subjects are drawn from a subject prior and each value
from the fact table P(v | subject). Its exact token log-probabilities are therefore

  log p(x_t | x_<t) = log pi_S(s) - log V_s     (first style word)     - log V_s  (later style words)
                      log pi_T(t) - log V_t     (first topic word)     - log V_t  (later topic words)
                      log p(subject),  log P(value | subject),  0 ('.')

which `analytic_token_logprobs` computes; a change of pi_T, pi_S or P moves exactly the tokens it should, so the
decomposition's answer is known in closed form (the first test of `dissect.decompose`).

Mixes for the trained study: the general mix (uniform topics and styles, subjects uniform over all subjects,
general subjects with a fixed value, domain subjects with uniform random values: the base model has no knowledge
of them) and the domain mix (mostly the domain topic and style, domain subjects only, their true values).
Probe versions of a domain document change one factor and keep every other token: the topic words moved to
another topic (same word index), the style words to another style, or the values to counterfactual ones.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

PAD, BOS, SEP = 0, 1, 2
SENTENCE = 5  # style, topic, subject, value, '.'


@dataclasses.dataclass(frozen=True)
class GrammarSpec:
  """Sizes of the grammar (hashable: a static argument).

  Attributes:
    num_topics, topic_vocab: topics and words per topic.
    num_styles, style_vocab: styles and words per style.
    num_general_subjects, num_domain_subjects: subjects known from pretraining / only in the domain.
    num_values: values a subject can take.
    num_sentences: sentences per document.
    domain_topic, domain_style: the finetuning domain's topic and style.
    domain_topic_prob, domain_style_prob: their probability in the domain mix (the rest spread evenly over the
      other topics / styles): a domain corpus is mostly, not only, on its topic and in its style.
  """

  num_topics: int = 4
  topic_vocab: int = 8
  num_styles: int = 3
  style_vocab: int = 4
  num_general_subjects: int = 64
  num_domain_subjects: int = 512
  num_values: int = 16
  num_sentences: int = 6
  domain_topic: int = 0
  domain_style: int = 0
  domain_topic_prob: float = 0.8
  domain_style_prob: float = 0.8

  def __post_init__(self):
    if self.num_topics < 2 or self.num_styles < 2:
      raise ValueError("the grammar needs >= 2 topics and >= 2 styles (a probe version moves to another one).")
    if self.num_values < 2:
      raise ValueError("num_values must be >= 2 (a counterfactual value differs from the true one).")
    if not (0 <= self.domain_topic < self.num_topics and 0 <= self.domain_style < self.num_styles):
      raise ValueError("domain_topic / domain_style out of range.")
    if not (0.0 < self.domain_topic_prob <= 1.0 and 0.0 < self.domain_style_prob <= 1.0):
      raise ValueError("domain_topic_prob / domain_style_prob must be in (0, 1].")

  @property
  def style_start(self) -> int:
    return 3

  @property
  def topic_start(self) -> int:
    return self.style_start + self.num_styles * self.style_vocab

  @property
  def subject_start(self) -> int:
    return self.topic_start + self.num_topics * self.topic_vocab

  @property
  def num_subjects(self) -> int:
    return self.num_general_subjects + self.num_domain_subjects

  @property
  def value_start(self) -> int:
    return self.subject_start + self.num_subjects

  @property
  def vocab_size(self) -> int:
    return self.value_start + self.num_values

  @property
  def seq_len(self) -> int:
    return 1 + SENTENCE * self.num_sentences

  def positions(self, slot: int) -> np.ndarray:
    """Token indices of one slot (0 style, 1 topic, 2 subject, 3 value, 4 '.') in every sentence: [num_sentences]."""
    return 1 + SENTENCE * np.arange(self.num_sentences) + slot


@dataclasses.dataclass(frozen=True)
class GrammarParams:
  """The analytic model (log-probabilities; arrays).

  Attributes:
    log_topic: [num_topics] log pi_T.
    log_style: [num_styles] log pi_S.
    log_subject: [num_subjects] log p(subject).
    log_facts: [num_subjects, num_values] log P(value | subject).
  """

  log_topic: np.ndarray
  log_style: np.ndarray
  log_subject: np.ndarray
  log_facts: np.ndarray


def fact_tables(key: jax.Array, spec: GrammarSpec) -> dict[str, jax.Array]:
  """The world's facts: general values [G], domain true values [D], domain counterfactual values [D] (never the
  true one).

  Args:
    key: PRNG key.
    spec: the grammar (G = num_general_subjects, D = num_domain_subjects, values in [0, num_values)).

  Returns:
    {'general': [G], 'domain': [D], 'counterfactual': [D]} int32 value indices.
  """
  kg, kd, kc = jax.random.split(key, 3)
  general = jax.random.randint(kg, (spec.num_general_subjects,), 0, spec.num_values)
  domain = jax.random.randint(kd, (spec.num_domain_subjects,), 0, spec.num_values)
  shift = jax.random.randint(kc, (spec.num_domain_subjects,), 1, spec.num_values)
  return {"general": general, "domain": domain, "counterfactual": (domain + shift) % spec.num_values}


def general_params(spec: GrammarSpec, tables: dict, confidence: float = 1.0) -> GrammarParams:
  """The general mix as an analytic model: uniform topics, styles and subjects; general subjects take their value
  with probability `confidence` (the rest uniform), domain subjects uniform values.

  Args:
    spec: the grammar.
    tables: `fact_tables` output (`tables['general']`: `[num_general_subjects]` values).
    confidence: probability mass on a general subject's value (1.0: certain; log 0 = -inf elsewhere).

  Returns:
    GrammarParams: log_topic [num_topics], log_style [num_styles], log_subject [num_subjects],
    log_facts [num_subjects, num_values].
  """
  g = np.asarray(tables["general"])
  facts = np.full((spec.num_subjects, spec.num_values), 1.0 / spec.num_values)
  rows = np.arange(spec.num_general_subjects)
  facts[rows] = (1.0 - confidence) / spec.num_values
  facts[rows, g] += confidence
  with np.errstate(divide="ignore"):
    log_facts = np.log(facts)
  return GrammarParams(log_topic=np.full(spec.num_topics, -math.log(spec.num_topics)),
                       log_style=np.full(spec.num_styles, -math.log(spec.num_styles)),
                       log_subject=np.full(spec.num_subjects, -math.log(spec.num_subjects)),
                       log_facts=log_facts)


def shift_params(gp: GrammarParams, spec: GrammarSpec, tables: dict, u_topic, u_style, a_facts) -> GrammarParams:
  """The analytic model after known changes (the ground truth `decompose` is checked against).

  pi_T <- softmax(log pi_T + u_topic), pi_S <- softmax(log pi_S + u_style), and the true value of each domain
  subject j gets its logit raised by a_facts[j] (its row renormalised).

  Args:
    gp: the model before the change.
    spec: the grammar.
    tables: `fact_tables` output (tables['domain'] [num_domain_subjects] true values).
    u_topic: [num_topics] logit shifts; u_style: [num_styles]; a_facts: [num_domain_subjects].

  Returns:
    GrammarParams after the change (log_subject unchanged).
  """
  def renorm(x):
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)
  lf = np.array(gp.log_facts)
  rows = spec.num_general_subjects + np.arange(spec.num_domain_subjects)
  lf[rows, np.asarray(tables["domain"])] += np.asarray(a_facts)
  return GrammarParams(log_topic=renorm(np.asarray(gp.log_topic) + u_topic),
                       log_style=renorm(np.asarray(gp.log_style) + u_style),
                       log_subject=gp.log_subject, log_facts=renorm(lf))


def analytic_token_logprobs(gp: GrammarParams, spec: GrammarSpec, ids: np.ndarray) -> np.ndarray:
  """Exact log p(x_t | x_<t) of grammar documents under the analytic model `gp` (module docstring).

  Args:
    gp: the model.
    spec: the grammar sizes.
    ids: [B, seq_len] documents of this grammar.

  Returns:
    [B, seq_len] float64 (0 at BOS and at the '.' tokens).
  """
  ids = np.asarray(ids)
  if ids.ndim != 2 or ids.shape[1] != spec.seq_len:
    raise ValueError(f"ids must be [batch, {spec.seq_len}] grammar documents, got shape {ids.shape}.")
  out = np.zeros(ids.shape, np.float64)
  ps, pt, pj, pv = (spec.positions(k) for k in range(4))
  style = (ids[:, ps] - spec.style_start) // spec.style_vocab
  topic = (ids[:, pt] - spec.topic_start) // spec.topic_vocab
  subj = ids[:, pj] - spec.subject_start
  val = ids[:, pv] - spec.value_start
  for name, arr, hi in (("style", style, spec.num_styles), ("topic", topic, spec.num_topics),
                        ("subject", subj, spec.num_subjects), ("value", val, spec.num_values)):
    if arr.min() < 0 or arr.max() >= hi:
      raise ValueError(f"ids hold a token that is not a {name} where the grammar puts one.")
  if np.any(style != style[:, :1]) or np.any(topic != topic[:, :1]):
    raise ValueError("a grammar document keeps one style and one topic; these ids change them mid-document.")
  out[:, ps] = -math.log(spec.style_vocab)
  out[:, pt] = -math.log(spec.topic_vocab)
  out[:, ps[0]] += np.asarray(gp.log_style)[style[:, 0]]
  out[:, pt[0]] += np.asarray(gp.log_topic)[topic[:, 0]]
  out[:, pj] = np.asarray(gp.log_subject)[subj]
  out[:, pv] = np.asarray(gp.log_facts)[subj, val]
  return out


def general_entropy(spec: GrammarSpec) -> dict[str, float]:
  """The general mix's exact expected loss (nats) at each slot: what a base model that has learned the grammar
  scores on fresh documents.

  A model that reads the context pays the prior only on the first topic / style word: later ones cost
  log V_t / log V_s (the topic and style are known); a model that ignores the context pays log(T V_t) / log(S V_s)
  on every one. Values: general subjects have one value (0 nats), domain subjects a uniform one (log num_values),
  so a value costs (D / N) log num_values on average; '.' costs 0.

  Args:
    spec: the grammar (num_sentences >= 2, so that there are later topic / style words).

  Returns:
    {'first_style', 'later_style', 'first_topic', 'later_topic', 'subject', 'value': nats per token of that slot;
     'per_token': the mean over the seq_len - 1 scored tokens of a document (BOS is not scored)}.

  Raises:
    ValueError: num_sentences < 2.
  """
  if spec.num_sentences < 2:
    raise ValueError(f"general_entropy needs num_sentences >= 2 (later topic / style words); got "
                     f"{spec.num_sentences}.")
  k = spec.num_sentences
  out = {"first_style": math.log(spec.num_styles * spec.style_vocab), "later_style": math.log(spec.style_vocab),
         "first_topic": math.log(spec.num_topics * spec.topic_vocab), "later_topic": math.log(spec.topic_vocab),
         "subject": math.log(spec.num_subjects),
         "value": spec.num_domain_subjects / spec.num_subjects * math.log(spec.num_values)}
  per_doc = (out["first_style"] + (k - 1) * out["later_style"] + out["first_topic"] + (k - 1) * out["later_topic"]
             + k * (out["subject"] + out["value"]))
  out["per_token"] = per_doc / (spec.seq_len - 1)
  return out


def assemble(spec: GrammarSpec, style_words, topic_words, subjects, values) -> jax.Array:
  """[B, K] token ids of each slot -> [B, seq_len] documents.

  Args:
    spec: the grammar (not read: the layout is fixed; kept for a uniform signature).
    style_words, topic_words, subjects, values: [B, K] token ids (K = num_sentences), already offset into the
      vocabulary (e.g. spec.style_start + ...).

  Returns:
    [B, 1 + 5 K] int32: BOS then K sentences [style, topic, subject, value, SEP].
  """
  b = style_words.shape[0]
  sep = jnp.full_like(style_words, SEP)
  body = jnp.stack([style_words, topic_words, subjects, values, sep], axis=-1).reshape(b, -1)
  return jnp.concatenate([jnp.full((b, 1), BOS, body.dtype), body], axis=1).astype(jnp.int32)


def sample_documents(key: jax.Array, spec: GrammarSpec, batch: int, tables: dict, mix: str) -> jax.Array:
  """Samples documents of the general or the domain mix (jittable, vmappable).

  Args:
    key: PRNG key.
    spec: grammar sizes.
    batch: number of documents B.
    tables: `fact_tables(...)`.
    mix: 'general' or 'domain'.

  Returns:
    [B, seq_len] int32 ids.
  """
  k = spec.num_sentences
  kt, ks, kw1, kw2, kj, kv = jax.random.split(key, 6)
  if mix == "general":
    topic = jax.random.randint(kt, (batch, 1), 0, spec.num_topics)
    style = jax.random.randint(ks, (batch, 1), 0, spec.num_styles)
    subj = jax.random.randint(kj, (batch, k), 0, spec.num_subjects)
    is_general = subj < spec.num_general_subjects
    known = tables["general"][jnp.minimum(subj, spec.num_general_subjects - 1)]
    val = jnp.where(is_general, known, jax.random.randint(kv, (batch, k), 0, spec.num_values))
  elif mix == "domain":
    def pick(k, n, home, p_home):
      other = (home + jax.random.randint(jax.random.fold_in(k, 1), (batch, 1), 1, n)) % n
      return jnp.where(jax.random.uniform(k, (batch, 1)) < p_home, home, other)
    topic = pick(kt, spec.num_topics, spec.domain_topic, spec.domain_topic_prob)
    style = pick(ks, spec.num_styles, spec.domain_style, spec.domain_style_prob)
    dsub = jax.random.randint(kj, (batch, k), 0, spec.num_domain_subjects)
    subj = spec.num_general_subjects + dsub
    val = tables["domain"][dsub]
  else:
    raise ValueError(f"mix must be 'general' or 'domain', got {mix!r}.")
  sw = spec.style_start + style * spec.style_vocab + jax.random.randint(kw1, (batch, k), 0, spec.style_vocab)
  tw = spec.topic_start + topic * spec.topic_vocab + jax.random.randint(kw2, (batch, k), 0, spec.topic_vocab)
  return assemble(spec, sw, tw, spec.subject_start + subj, spec.value_start + val)


def probe_versions(key: jax.Array, spec: GrammarSpec, ids: jax.Array, tables: dict) -> dict[str, jax.Array]:
  """The controlled-variable versions of domain documents (every other token kept).

  Args:
    key: PRNG key (the other topic / style of each document).
    spec: grammar sizes.
    ids: [B, seq_len] domain documents in the domain topic and style (`sample_documents(..., mix='domain')` of a
      spec with domain_topic_prob = domain_style_prob = 1, as `finetune.make_probes` draws them).
    tables: `fact_tables(...)` (counterfactual values of domain subjects).

  Returns:
    {'original', 'topic', 'style', 'counterfactual'}: [B, seq_len] int32 each.
  """
  b = ids.shape[0]
  kt, ks = jax.random.split(key)
  ps, pt, pj, pv = (jnp.asarray(spec.positions(i)) for i in range(4))
  sw, tw = ids[:, ps] - spec.style_start, ids[:, pt] - spec.topic_start
  s, t = sw // spec.style_vocab, tw // spec.topic_vocab
  new_t = (t + jax.random.randint(kt, (b, 1), 1, spec.num_topics)) % spec.num_topics
  new_s = (s + jax.random.randint(ks, (b, 1), 1, spec.num_styles)) % spec.num_styles
  topic_ids = ids.at[:, pt].set(spec.topic_start + new_t * spec.topic_vocab + tw % spec.topic_vocab)
  style_ids = ids.at[:, ps].set(spec.style_start + new_s * spec.style_vocab + sw % spec.style_vocab)
  dsub = ids[:, pj] - spec.subject_start - spec.num_general_subjects
  cf = tables["counterfactual"][jnp.clip(dsub, 0, spec.num_domain_subjects - 1)]
  cf_ids = ids.at[:, pv].set(jnp.where(dsub >= 0, spec.value_start + cf, ids[:, pv]))
  return {"original": ids, "topic": topic_ids, "style": style_ids, "counterfactual": cf_ids}
