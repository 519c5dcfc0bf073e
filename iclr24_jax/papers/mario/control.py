"""Quark-style control codes: per-reward quantile bins, the code tokens, and the data pool.

Official: mario/data_pool_n.py. After every sampling round the whole pool (all rounds so far, plus the silver
rationales) is sorted by each reward, cut into `num_bins` equal bins (best = bin 0, the remainder goes to the last
bin), and each sample gets one code token per reward; task correctness gets its own two-valued code. Training
places the codes at the start of the response; inference conditions on the best bin of every reward.

  codes = mario.ControlCodes.from_tokenizer(tok)                 # 3 rewards x 5 bins + 2 accuracy codes
  bins = mario.quantile_bins(np.array([0.9, 0.1, 0.5, 0.5, 0.7]), num_bins=5)   # [0, 4, 2, 2, 1]
  mario.control_prefix({'plausibility': 0, 'diversity': 4, 'consistency': 1, 'accuracy': 0}, codes)  # 4 ids
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

QUANTILE_REWARDS = ("plausibility", "diversity", "consistency")
# Control characters that never occur in the data; whitespace controls (\t \n \v \f \r) are excluded.
CONTROL_CHARS = tuple(range(1, 9)) + tuple(range(14, 32))


def quantile_bins(rewards: Sequence[float] | np.ndarray, num_bins: int = 5) -> np.ndarray:
  """Quantile bin of every reward: 0 = the best (highest) fifth, num_bins - 1 = the worst.

  As the official pool: sorted best-first, position i goes to bin min(i // (N // num_bins), num_bins - 1) (equal
  bins, the remainder in the last one); with N < num_bins, bin floor(i num_bins / N).
  # Deviation: ties share a bin (the bin of their best position); the official sort splits equal rewards over
  # bins arbitrarily, which gives the same text different codes.

  Args:
    rewards: [N] finite floats (higher is better).
    num_bins: number of bins (>= 1).

  Returns:
    [N] int64 in [0, num_bins).
  """
  r = np.asarray(rewards, np.float64)
  if r.ndim != 1:
    raise ValueError(f"rewards must be a 1-D array [N], got shape {r.shape}.")
  if num_bins < 1:
    raise ValueError(f"num_bins must be >= 1, got {num_bins}.")
  if not np.all(np.isfinite(r)):
    raise ValueError("rewards contain NaN or inf: score every sample (or drop it) before binning.")
  n = r.size
  if n == 0:
    return np.zeros((0,), np.int64)
  desc = np.sort(-r)                                    # best first
  first = np.searchsorted(desc, -r, side="left")        # best position of each value's tie group
  size = n // num_bins
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


def assign_bins(scores: Mapping[str, Sequence[float]], codes: ControlCodes) -> dict[str, np.ndarray]:
  """Bins of every pooled sample: quantile bins per reward, accuracy 0 (correct) / 1 (incorrect).

  Args:
    scores: {name: [N]} for every name in codes.names (accuracy as 0/1).
    codes: the code book.

  Returns:
    {name: [N] int}.
  """
  out = {}
  for name in codes.names:
    if name not in scores:
      raise ValueError(f"no scores for {name!r}; pooled samples need every reward of {codes.names}.")
    vals = np.asarray(scores[name], np.float64)
    out[name] = (np.where(vals > 0.5, 0, 1).astype(np.int64) if name == "accuracy"
                 else quantile_bins(vals, codes.num_bins))
  return out


@dataclasses.dataclass
class DataPool:
  """The growing pool of (question, response, scores) that Quark trains on (host-side, like the official one).

  Only valid responses (with "So the answer is") enter it (official `inds`). `prefixes()` re-bins the whole pool.
  """

  codes: ControlCodes
  questions: list = dataclasses.field(default_factory=list)
  responses: list = dataclasses.field(default_factory=list)
  scores: dict = dataclasses.field(default_factory=dict)

  def add(self, questions: Sequence[str], responses: Sequence[str], scores: Mapping[str, Sequence[float]]) -> None:
    """Appends N samples with their rewards {name: [N]}."""
    n = len(questions)
    if len(responses) != n or any(len(np.ravel(scores[k])) != n for k in self.codes.names):
      raise ValueError("DataPool.add needs N questions, N responses and N scores for every reward.")
    self.questions += list(questions)
    self.responses += list(responses)
    for k in self.codes.names:
      self.scores[k] = np.concatenate([self.scores.get(k, np.zeros((0,))), np.asarray(scores[k], np.float64)])

  def __len__(self) -> int:
    return len(self.questions)

  def bins(self) -> dict[str, np.ndarray]:
    """{name: [N] bins} over the whole pool."""
    return assign_bins(self.scores, self.codes)

  def prefixes(self) -> list[list[int]]:
    """The control prefix of every pooled sample (re-binned over the whole pool)."""
    b = self.bins()
    return [control_prefix({k: int(b[k][i]) for k in self.codes.names}, self.codes) for i in range(len(self))]
