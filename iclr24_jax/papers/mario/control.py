"""Quark-style control codes: per-reward quantile bins, the code tokens, and the data pool.

Official: mario/data_pool_n.py. After every sampling round the whole pool (all rounds so far, plus the silver
rationales) is sorted by each reward (Python's stable `sorted(..., reverse=True)`: equal rewards keep their pool
order), cut into `num_bins` equal bins by position (best = bin 0, the remainder goes to the last bin), and each
sample gets one code token per reward; task correctness gets its own two-valued code. The pool is then stored in
the order of the last reward's sort, which orders the ties of the next round. Training places the codes at the
start of the response; inference conditions on the best bin of every reward.

  codes = mario.ControlCodes.from_tokenizer(tok)                 # 3 rewards x 5 bins + 2 accuracy codes
  bins = mario.quantile_bins(np.array([0.9, 0.1, 0.5, 0.5, 0.7]), num_bins=5)   # [0, 4, 2, 3, 1]
  mario.control_prefix({'plausibility': 0, 'diversity': 4, 'consistency': 1, 'accuracy': 0}, codes)  # 4 ids
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from iclr24_jax.common import checks

QUANTILE_REWARDS = ("plausibility", "diversity", "consistency")
# Control characters that never occur in the data; whitespace controls (\t \n \v \f \r) are excluded.
CONTROL_CHARS = tuple(range(1, 9)) + tuple(range(14, 32))


TIE_RULES = ("official", "shared")


def quantile_bins(rewards: Sequence[float] | np.ndarray, num_bins: int = 5, ties: str = "official") -> np.ndarray:
  """Quantile bin of every reward: 0 = the best (highest) fifth, num_bins - 1 = the worst.

  Official (data_pool_n.py): the rewards are sorted best-first with a stable sort (equal rewards keep their input
  order), and sorted position i goes to bin i // (N // num_bins), the remainder (N mod num_bins) to the last bin;
  with N < num_bins every sample lands in the last bin (N // num_bins = 0). Equal rewards are therefore split
  over neighbouring bins by their order in the pool. ties='shared' is the alternative rule: a tie group takes the
  bin of its best position, and N < num_bins spreads the samples as floor(i num_bins / N).

  Args:
    rewards: [N] finite floats (higher is better), in pool order (the order breaks ties).
    num_bins: number of bins (>= 1).
    ties: 'official' (the default) or 'shared'.

  Returns:
    [N] int64 in [0, num_bins).

  Raises:
    ValueError: rewards not 1-D or not finite, num_bins < 1, an unknown tie rule.
  """
  r = np.asarray(rewards, np.float64)
  if r.ndim != 1:
    raise ValueError(f"rewards must be a 1-D array [N], got shape {r.shape}.")
  if num_bins < 1:
    raise ValueError(f"num_bins must be >= 1, got {num_bins}.")
  if ties not in TIE_RULES:
    raise ValueError(f"ties must be one of {TIE_RULES}, got {ties!r}.")
  if not np.all(np.isfinite(r)):
    raise ValueError("rewards contain NaN or inf: score every sample (or drop it) before binning.")
  n = r.size
  if n == 0:
    return np.zeros((0,), np.int64)
  size = n // num_bins
  if ties == "official":
    # official: INK-USC/RationaleMultiRewardDistillation@8f9ff58 mario/data_pool_n.py:158-168
    order = np.argsort(-r, kind="stable")               # best first; ties keep their pool order
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    if size == 0:
      return np.full(n, num_bins - 1, np.int64)
    return np.minimum(pos // size, num_bins - 1).astype(np.int64)
  desc = np.sort(-r)                                    # best first
  first = np.searchsorted(desc, -r, side="left")        # best position of each value's tie group
  if size > 0:
    return np.minimum(first // size, num_bins - 1).astype(np.int64)
  return (first * num_bins // n).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class ControlCodes:
  """The code tokens: one per (reward, bin) and, with `accuracy`, one for correct and one for incorrect.

  Attributes:
    ids: the token ids, reward-major: ids[r * num_bins + b] codes bin b of rewards[r]; then (correct, incorrect).
    rewards: the quantile-binned rewards, in prefix order.
    num_bins: bins per reward.
    accuracy: append a task-correctness code (the official `task_correctness='yes'`).
  """

  ids: tuple[int, ...]
  rewards: tuple[str, ...] = QUANTILE_REWARDS
  num_bins: int = 5
  accuracy: bool = True

  def __post_init__(self):
    need = len(self.rewards) * self.num_bins + 2 * int(self.accuracy)
    if len(self.ids) != need:
      raise ValueError(f"{len(self.rewards)} rewards x {self.num_bins} bins{' + 2 accuracy codes' if self.accuracy else ''}"
                       f" need {need} code ids, got {len(self.ids)}.")
    if len(set(self.ids)) != len(self.ids):
      raise ValueError(f"control code ids must be distinct, got {self.ids}.")

  @classmethod
  def from_tokenizer(cls, tokenizer, rewards: Sequence[str] = QUANTILE_REWARDS, num_bins: int = 5,
                     accuracy: bool = True) -> "ControlCodes":
    """Codes on single-token control characters of the tokenizer (bytes 0x01-0x08, 0x0e-0x1f).

    # Deviation: Quark adds new vocabulary entries with trained embeddings; with LoRA the embedding table stays
    # frozen, so the codes are existing byte tokens that never occur in text (the adapters learn to read them).
    """
    need = len(rewards) * num_bins + 2 * int(accuracy)
    ids: list[int] = []
    for c in CONTROL_CHARS:
      enc = tokenizer.encode(chr(c), add_bos=False)
      if len(enc) == 1 and enc[0] not in ids:
        ids.append(int(enc[0]))
      if len(ids) == need:
        return cls(ids=tuple(ids), rewards=tuple(rewards), num_bins=num_bins, accuracy=accuracy)
    raise ValueError(f"the tokenizer has only {len(ids)} single-token control characters; {need} codes are needed. "
                     "Pass explicit ids: ControlCodes(ids=...).")

  @property
  def num_codes(self) -> int:
    """Codes per response (K): one per reward, plus one for accuracy."""
    return len(self.rewards) + int(self.accuracy)

  @property
  def names(self) -> tuple[str, ...]:
    """The prefix's reward names in order."""
    return self.rewards + (("accuracy",) if self.accuracy else ())

  def token(self, reward: str, bin_index: int) -> int:
    """The id coding `bin_index` of `reward` (accuracy: 0 = correct, 1 = incorrect)."""
    if reward == "accuracy" and self.accuracy:
      if bin_index not in (0, 1):
        raise ValueError(f"accuracy codes are 0 (correct) or 1 (incorrect), got {bin_index}.")
      return self.ids[len(self.rewards) * self.num_bins + int(bin_index)]
    if reward not in self.rewards:
      raise ValueError(f"unknown reward {reward!r}; the codes cover {self.names}.")
    if not 0 <= int(bin_index) < self.num_bins:
      raise ValueError(f"bin {bin_index} of {reward!r} is outside [0, {self.num_bins}).")
    return self.ids[self.rewards.index(reward) * self.num_bins + int(bin_index)]

  def best(self) -> dict[str, int]:
    """The inference condition: bin 0 of every reward (and 'correct')."""
    return {name: 0 for name in self.names}

  def worst(self) -> dict[str, int]:
    """The worst bin of every reward (and 'incorrect')."""
    return {name: (1 if name == "accuracy" else self.num_bins - 1) for name in self.names}


def control_prefix(bins: Mapping[str, int], codes: ControlCodes) -> list[int]:
  """The control-code token ids of one response, in the codes' reward order (then accuracy).

  Args:
    bins: {reward name: bin} for every name in `codes.names` (0 = best; accuracy 0 = correct, 1 = incorrect).
    codes: the code book.

  Returns:
    K = codes.num_codes token ids (placed first in the response: after the decoder start / assistant header).
  """
  missing = [n for n in codes.names if n not in bins]
  extra = [n for n in bins if n not in codes.names]
  if missing or extra:
    raise ValueError(f"control_prefix needs a bin for exactly {codes.names}; missing {missing}, unknown {extra}.")
  return [codes.token(n, int(bins[n])) for n in codes.names]


def assign_bins(scores: Mapping[str, Sequence[float]], codes: ControlCodes, ties: str = "official"
                ) -> dict[str, np.ndarray]:
  """Bins of every pooled sample: quantile bins per reward, accuracy 0 (correct) / 1 (incorrect).

  Args:
    scores: {name: [N]} for every name in codes.names (accuracy as 0/1), in pool order.
    codes: the code book.
    ties: the tie rule of `quantile_bins`.

  Returns:
    {name: [N] int}.
  """
  out = {}
  for name in codes.names:
    if name not in scores:
      raise ValueError(f"no scores for {name!r}; pooled samples need every reward of {codes.names}.")
    vals = np.asarray(scores[name], np.float64)
    if name == "accuracy" and not np.all((vals == 0) | (vals == 1)):
      raise checks.LabelError(f"mario.assign_bins: accuracy scores must be 0 / 1 (1 = correct); got values "
                              f"{sorted(set(vals[(vals != 0) & (vals != 1)].tolist()))[:5]} (NaN is an unscored "
                              "sample: score or drop it first).")
    out[name] = (np.where(vals > 0.5, 0, 1).astype(np.int64) if name == "accuracy"
                 else quantile_bins(vals, codes.num_bins, ties))
  return out


@dataclasses.dataclass
class DataPool:
  """The growing pool of (question, response, scores) that Quark trains on (host-side, like the official one).

  Only valid responses (with "So the answer is") enter it (official `inds`). Every `add` re-bins the whole pool as
  the official `DataPool_N.add` does: per reward (in `codes.names` order) a stable best-first sort of the current
  pool cuts equal bins by position; copies of one (question, response) all take the bin of the copy sorted last
  (the official pool keys its codes by (prompt, response)); then the pool is stored in the order of the last
  reward's sort, which breaks the ties of the next round.

  Attributes:
    codes: the code book.
    ties: the tie rule of `quantile_bins` ('official'; 'shared' also keeps the pool in insertion order).
  """

  codes: ControlCodes
  ties: str = "official"
  questions: list = dataclasses.field(default_factory=list)
  responses: list = dataclasses.field(default_factory=list)
  scores: dict = dataclasses.field(default_factory=dict)
  _bins: dict = dataclasses.field(default_factory=dict, init=False, repr=False)

  def add(self, questions: Sequence[str], responses: Sequence[str], scores: Mapping[str, Sequence[float]]) -> None:
    """Appends N samples with their rewards {name: [N]} and re-bins the whole pool (see the class docstring)."""
    n = len(questions)
    if len(responses) != n or any(len(np.ravel(scores[k])) != n for k in self.codes.names):
      raise ValueError("DataPool.add needs N questions, N responses and N scores for every reward.")
    self.questions += list(questions)
    self.responses += list(responses)
    for k in self.codes.names:
      self.scores[k] = np.concatenate([self.scores.get(k, np.zeros((0,))), np.asarray(scores[k], np.float64)])
    self._rebin()

  def _rebin(self) -> None:
    bins = assign_bins(self.scores, self.codes, self.ties)
    if self.ties != "official" or not len(self):
      self._bins = bins
      return
    keys = list(zip(self.questions, self.responses))
    order = np.arange(len(self))
    for name in self.codes.names:
      order = np.argsort(-self.scores[name], kind="stable")          # this reward's best-first sort
      last = {keys[i]: bins[name][i] for i in order}                 # copies: the last one sorted wins
      bins[name] = np.asarray([last[k] for k in keys], np.int64)
    # The pool is kept in the last reward's sorted order (the official pool lists rebuilt from it).
    self.questions = [self.questions[i] for i in order]
    self.responses = [self.responses[i] for i in order]
    self.scores = {k: v[order] for k, v in self.scores.items()}
    self._bins = {k: v[order] for k, v in bins.items()}

  def __len__(self) -> int:
    return len(self.questions)

  def bins(self) -> dict[str, np.ndarray]:
    """{name: [N] bins} over the whole pool, in pool order."""
    return {k: v.copy() for k, v in self._bins.items()}

  def prefixes(self) -> list[list[int]]:
    """The control prefix of every pooled sample, in pool order (re-binned over the whole pool at each `add`)."""
    b = self._bins
    return [control_prefix({k: int(b[k][i]) for k in self.codes.names}, self.codes) for i in range(len(self))]
