"""Helpers shared by the CLIP OOD test modules."""
import numpy as np


def _unit(rng, n, d=16):
  x = rng.normal(size=(n, d))
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
