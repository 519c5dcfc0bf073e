"""Input contracts of the public API: structure at trace time, values without finite wrong answers.

One policy, used by every public function of the library:

* **Structure** (shapes, ranks, dtypes, static arguments, label conventions, hyperparameter ranges given as Python
  numbers) is checked when the function is traced, from shapes and dtypes only. It never reads values, so it works
  the same eagerly, under `jax.jit`, `jax.vmap`, `jax.grad` and on multi-host global arrays, and it raises a named
  `ContractError` subclass that says what was expected and how to fix it.
* **Values** (NaN / Inf, probabilities outside [0, 1], indices out of range, labels outside their set, traced
  hyperparameters out of range) never give a finite wrong answer:
    - eagerly, on arrays this process can read (NumPy, or a `jax.Array` with `is_fully_addressable`), the same
      named error is raised at once;
    - under tracing (jit / vmap / grad), or on a global array that spans other hosts' devices, the output is
      poisoned with NaN (or a documented sentinel for integer outputs) instead of being clamped;
    - `checked(fn)` (built on `jax.experimental.checkify`) compiles `fn` with the value checks turned into
      runtime checks and raises the same named error from inside the compiled program.
  Nothing here calls `np.asarray` on an array that is not fully addressable.

Usage inside a library function (checks at the top, the poison at the return):

  def propagate(concept_probs, params):
    where = "safeguards.propagate"
    dims = checks.shapes(where, concept_probs=(concept_probs, "B K"), w=(params["w"], "K"))
    checks.dtype(where, "concept_probs", concept_probs, "float")
    ok = checks.probabilities(where, "concept_probs", concept_probs)
    ...
    return checks.poison(y_bar, ok)

and for a user who wants errors instead of NaN inside jit:

  safe = iclr24_jax.checked(safeguards.propagate)
  safe(p, params)            # compiled once per shape; raises ProbabilityError for p = 1.7
"""
from __future__ import annotations

import collections.abc
import contextvars
import functools
import math
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify


# ----------------------------------------------------------------------------------------------------------
# Named errors. All derive from ValueError (callers that caught ValueError keep working).


class ContractError(ValueError):
  """A public function was called outside its documented input contract."""


class ShapeError(ContractError):
  """Wrong rank, shape, or sizes that do not agree between arguments."""


class DtypeError(ContractError, TypeError):
  """Wrong dtype (e.g. float where integer ids are meant)."""


class StaticArgumentError(ContractError, TypeError):
  """A static argument (a Python int, str or bool that fixes shapes or code paths) was traced or mistyped."""


class HyperparameterError(ContractError):
  """A hyperparameter outside its valid range."""


class EmptyInputError(ContractError):
  """An empty batch (or set) where at least one element is needed."""


class LabelError(ContractError):
  """Labels outside their documented set (e.g. {-1, +1} where {0, 1} is meant)."""


class IndexRangeError(ContractError, IndexError):
  """Integer indices outside [0, size)."""


class NonFiniteError(ContractError):
  """NaN or Inf where finite values are needed."""


class ProbabilityError(ContractError):
  """Probabilities outside [0, 1] (or NaN), or rows that do not sum to one."""


class CheckedCallError(ContractError):
  """`checked(fn)` was called in a way it cannot serve (inside a trace)."""


_ERRORS = {cls.__name__: cls for cls in (ContractError, ShapeError, DtypeError, StaticArgumentError,
                                         HyperparameterError, EmptyInputError, LabelError, IndexRangeError,
                                         NonFiniteError, ProbabilityError)}

# ----------------------------------------------------------------------------------------------------------
# Readability: may this process look at the values?


def is_traced(x: Any) -> bool:
  """True when `x` is a tracer (inside jit / vmap / grad / scan)."""
  return isinstance(x, jax.core.Tracer)


def is_readable(*xs: Any) -> bool:
  """True when every array leaf of `xs` can be read on this host without a trace or a cross-host fetch.

  NumPy arrays and Python numbers are readable; a `jax.Array` is readable when it is not a tracer and is fully
  addressable (a global array spanning other processes' devices is not).
  """
  for leaf in jax.tree_util.tree_leaves(xs):
    if isinstance(leaf, jax.core.Tracer):
      return False
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      return False
  return True


def xp(*xs: Any):
  """NumPy when every leaf of `xs` is a host value (NumPy array or Python number), else jax.numpy.

  Value checks on host inputs then stay on the host and raise at once, even when the call sits inside a trace
  (a closed-over NumPy constant); device arrays and tracers use jax.numpy.
  """
  for leaf in jax.tree_util.tree_leaves(xs):
    if not isinstance(leaf, (np.ndarray, np.generic, int, float, bool)):
      return jnp
  return np


def host_value(x: Any) -> np.ndarray | None:
  """`np.asarray(x)` when `x` is readable (see `is_readable`), else None. Never fetches across hosts."""
  if not is_readable(x):
    return None
  return np.asarray(x)


def host_array(where: str, name: str, x: Any, dtype: Any = None) -> np.ndarray:
  """`np.asarray(x, dtype)` for a host-side function, or a named error for a traced / multi-host global array.

  Raises:
    ContractError: `x` is a tracer (the function runs on the host, it cannot be jitted) or spans other hosts'
      devices (gather it first, e.g. with jax.experimental.multihost_utils.process_allgather).
  """
  if is_traced(x):
    raise ContractError(f"{where} runs on the host (NumPy) and cannot be traced: call it outside jax.jit / vmap "
                        f"({name} is a tracer).")
  if not is_readable(x):
    raise ContractError(f"{where} runs on the host: {name} is a global array spanning other processes' devices; "
                        "gather it first (jax.experimental.multihost_utils.process_allgather).")
  return np.asarray(x, dtype)


# ----------------------------------------------------------------------------------------------------------
# The checking mode of `checked`.

_CHECKING: contextvars.ContextVar[bool] = contextvars.ContextVar("iclr24_jax_checking", default=False)


def checking() -> bool:
  """True while a function is being traced by `checked` (value checks become checkify checks)."""
  return _CHECKING.get()


# ----------------------------------------------------------------------------------------------------------
# Structure: shapes, dtypes, static arguments. These never look at values.

_TOKEN = re.compile(r"^(\.\.\.|\d+|[A-Za-z_][A-Za-z_0-9']*|\*)$")


def _layout(spec: str) -> str:
  return "[" + ", ".join(spec.split()) + "]" if spec.strip() else "[] (a scalar)"


def shapes(where: str, known: Mapping[str, int] | None = None, **specs: tuple[Any, str]) -> dict[str, int]:
  """Checks the shapes of several arguments against named layouts and returns the bound sizes.

  A layout is a space-separated string of dimensions: a name ("B", "K") binds a size that must agree
  everywhere it appears, a number is an exact size, "*" is any size, and a leading "..." takes any number of
  leading batch dimensions (the per-row math then maps over them, as optax does); a trailing "..." takes any
  trailing dimensions (e.g. "K B ..." for per-domain batches of images).

    dims = shapes("cpm.fit", features_a=(fa, "N F"), features_b=(fb, "N F"), labels=(y, "N"))

  Args:
    where: the public function's name, for the message.
    known: sizes bound beforehand (e.g. {"K": params_k}).
    **specs: argument name -> (array, layout). None arrays are skipped.

  Returns:
    {dimension name: size}.

  Raises:
    ShapeError: a rank or size that does not match, naming the argument, its layout and its shape.
  """
  dims: dict[str, int] = dict(known or {})
  origin: dict[str, str] = {k: "given" for k in dims}
  for name, (x, spec) in specs.items():
    if x is None:
      continue
    shape = tuple(np.shape(x))
    tokens = spec.split()
    for t in tokens:
      if not _TOKEN.match(t):
        raise ValueError(f"bad layout token {t!r} in {spec!r}")
    leading = bool(tokens) and tokens[0] == "..."
    trailing = not leading and bool(tokens) and tokens[-1] == "..."
    core = tokens[1:] if leading else tokens[:-1] if trailing else tokens
    if "..." in core:
      raise ValueError(f"layout {spec!r}: '...' may only start or end a layout")
    if ((leading or trailing) and len(shape) < len(core)) or (not (leading or trailing) and len(shape) != len(core)):
      want = f"rank >= {len(core)}" if (leading or trailing) else f"rank {len(core)}"
      raise ShapeError(f"{where}: {name} must be {_layout(spec)} ({want}); got shape {shape}.")
    tail = (shape[:len(core)] if trailing else shape[len(shape) - len(core):]) if core else ()
    for t, size in zip(core, tail):
      if t == "*":
        continue
      if t.isdigit():
        if size != int(t):
          raise ShapeError(f"{where}: {name} must be {_layout(spec)}; got shape {shape} (size {size} where {t} "
                           "is needed).")
        continue
      if t in dims and dims[t] != size:
        raise ShapeError(f"{where}: {name} must be {_layout(spec)} with {t} = {dims[t]} (from {origin[t]}); "
                         f"got shape {shape}.")
      dims.setdefault(t, size)
      origin.setdefault(t, name)
  return dims


_KINDS = {
    "float": lambda d: jnp.issubdtype(d, jnp.floating),
    "integer": lambda d: jnp.issubdtype(d, jnp.integer),
    "bool": lambda d: d == jnp.bool_,
    "int_or_bool": lambda d: jnp.issubdtype(d, jnp.integer) or d == jnp.bool_,
    "numeric": lambda d: jnp.issubdtype(d, jnp.number) or d == jnp.bool_,
    "real": lambda d: jnp.issubdtype(d, jnp.integer) or jnp.issubdtype(d, jnp.floating) or d == jnp.bool_,
}
_KIND_TEXT = {"float": "a floating dtype", "integer": "an integer dtype", "bool": "bool",
              "int_or_bool": "an integer or bool dtype", "numeric": "a numeric dtype",
              "real": "a real (bool, integer or float) dtype"}


def _dtype_of(x: Any):
  if hasattr(x, "dtype"):
    return x.dtype
  if isinstance(x, bool):
    return np.dtype(bool)
  if isinstance(x, int):
    return np.dtype(np.int32)
  if isinstance(x, float):
    return np.dtype(np.float32)
  return np.asarray(x).dtype


def dtype(where: str, name: str, x: Any, kind: str, hint: str = "") -> None:
  """Checks the dtype kind of `x`: 'float', 'integer', 'bool', 'int_or_bool', 'numeric' or 'real'.

  Raises:
    DtypeError: naming the argument, the dtype it has and the kind needed (plus `hint`).
  """
  if x is None:
    return
  d = _dtype_of(x)
  if d == object or getattr(d, "kind", "") in "USV" or not _KINDS[kind](d):
    extra = f" {hint}" if hint else ""
    raise DtypeError(f"{where}: {name} must have {_KIND_TEXT[kind]}; got {d}.{extra}")


def static_int(where: str, name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
  """A static integer argument (it fixes shapes or loop lengths): a Python / NumPy int, never a tracer.

  Args:
    where, name: for the message.
    value: the argument.
    low, high: inclusive bounds.

  Returns:
    int(value).

  Raises:
    StaticArgumentError: traced, or not an integer; HyperparameterError: outside [low, high].
  """
  if is_traced(value):
    raise StaticArgumentError(f"{where}: {name} is static (it fixes a shape or a loop length) and must be a Python "
                              "int, not a traced value; pass it as a Python int and mark it static "
                              f"(jax.jit(..., static_argnames=('{name}',))) or close over it.")
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    if isinstance(value, (jax.Array, np.ndarray)) and np.ndim(value) == 0 and \
        jnp.issubdtype(value.dtype, jnp.integer) and is_readable(value):
      value = int(value)
    else:
      raise StaticArgumentError(f"{where}: {name} must be a Python int; got {type(value).__name__} {value!r}.")
  value = int(value)
  if (low is not None and value < low) or (high is not None and value > high):
    rng = f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"
    raise HyperparameterError(f"{where}: {name} must be in {rng}; got {value}.")
  return value


def choice(where: str, name: str, value: Any, choices: Iterable[Any], what: str | None = None) -> Any:
  """A static choice among `choices` (strings, usually).

  Args:
    where, name: for the message; what: how to call the value in the message (default `name`).

  Raises:
    StaticArgumentError: `value` is not one of them.
  """
  choices = tuple(choices)
  if is_traced(value) or not isinstance(value, collections.abc.Hashable) or value not in choices:
    raise StaticArgumentError(f"{where}: unknown {what or name} {value!r} ({name}); choose one of {choices}.")
  return value


# ----------------------------------------------------------------------------------------------------------
# Values: eager raise where readable, checkify under `checked`, NaN poison under tracing.


def require(where: str, ok: Any, error: type[ContractError], message: str) -> Any:
  """Enforces a value condition.

  Eagerly (when `ok` is readable) raises `error` if `ok` is False. Otherwise (traced, or on a global array) the
  condition is returned for `poison`, and while `checked` traces the function it becomes a checkify check that
  raises `error` from the compiled program.

  Args:
    where: the public function's name.
    ok: a Python bool or a boolean array (reduced with all()).
    error: the ContractError subclass to raise.
    message: what was expected and how to fix it.

  Returns:
    True when the check passed eagerly, else the traced boolean scalar `ok`.
  """
  if isinstance(ok, (bool, np.bool_, np.ndarray)):
    if not np.all(ok):
      raise error(f"{where}: {message}")
    return True
  ok = jnp.all(ok)
  if is_readable(ok):
    if not bool(ok):
      raise error(f"{where}: {message}")
    return True
  if checking():   # checkify formats its message: literal braces ({0, 1}) are escaped
    text = f"[{error.__name__}] {where}: {message}".replace("{", "{{").replace("}", "}}")
    checkify.check(ok, text)
  return ok


def all_ok(*oks: Any) -> Any:
  """Combines the results of several `require` calls (True stays a Python True)."""
  out: Any = True
  for ok in oks:
    if ok is True:
      continue
    out = ok if out is True else jnp.logical_and(out, ok)
  return out


def poison(tree: Any, ok: Any, int_fill: int | None = None, bool_fill: bool | None = None) -> Any:
  """Returns `tree` where `ok`, else NaN in its floating leaves (and the documented sentinels `int_fill` /
  `bool_fill` in integer / bool leaves, if given; otherwise those leaves are returned as they are).

  `ok` is a scalar or broadcasts against every leaf (e.g. [B] per-row conditions for [B, ...] outputs). A Python
  True returns `tree` unchanged (the eager, checked path costs nothing).
  """
  if ok is True:
    return tree

  def one(x):
    if not isinstance(x, (jax.Array, np.ndarray)):
      return x
    d = x.dtype
    if jnp.issubdtype(d, jnp.inexact):
      return jnp.where(ok, x, jnp.asarray(jnp.nan, d))
    if int_fill is not None and jnp.issubdtype(d, jnp.integer):
      return jnp.where(ok, x, jnp.asarray(int_fill, d))
    if bool_fill is not None and d == jnp.bool_:
      return jnp.where(ok, x, jnp.asarray(bool_fill))
    return x

  return jax.tree_util.tree_map(one, tree)


def finite(where: str, name: str, x: Any, hint: str = "") -> Any:
  """Requires every entry of float array `x` to be finite (NonFiniteError)."""
  if x is None or not jnp.issubdtype(_dtype_of(x), jnp.inexact):
    return True
  return require(where, xp(x).isfinite(x), NonFiniteError,
                 f"{name} contains NaN or Inf; {hint or 'clean the input (drop or impute) first.'}")


def not_nan(where: str, name: str, x: Any, hint: str = "") -> Any:
  """Requires float array `x` to have no NaN (Inf allowed; NonFiniteError)."""
  if x is None or not jnp.issubdtype(_dtype_of(x), jnp.inexact):
    return True
  return require(where, ~xp(x).isnan(x), NonFiniteError, f"{name} contains NaN; {hint or 'clean the input first.'}")


def probabilities(where: str, name: str, x: Any, hint: str = "") -> Any:
  """Requires every entry of `x` to lie in [0, 1] (NaN fails; ProbabilityError)."""
  x = xp(x).asarray(x)
  return require(where, (x >= 0) & (x <= 1), ProbabilityError,
                 f"{name} must be probabilities in [0, 1] (no NaN); "
                 f"{hint or 'apply jax.nn.sigmoid / softmax to logits first.'}")


def indices(where: str, name: str, x: Any, size: int, hint: str = "", allow_negative: bool = False) -> Any:
  """Requires integer indices in [0, size) (or [-size, size) with `allow_negative`; IndexRangeError)."""
  low = -size if allow_negative else 0
  x = xp(x).asarray(x)
  return require(where, (x >= low) & (x < size), IndexRangeError,
                 f"{name} must be indices in [{low}, {size}); {hint or 'they index an axis of that size.'}")


def labels_in(where: str, name: str, x: Any, allowed: Sequence[int], hint: str = "") -> Any:
  """Requires every label to be one of `allowed` (LabelError)."""
  x = xp(x).asarray(x)
  ok = functools.reduce(xp(x).logical_or, [x == a for a in allowed])
  return require(where, ok, LabelError, f"{name} must take values in {set(allowed)}; {hint}".rstrip("; "))


def in_range(where: str, name: str, value: Any, low: float | None = None, high: float | None = None, *,
             low_open: bool = False, high_open: bool = False, hint: str = "") -> Any:
  """Checks a hyperparameter's range.

  A Python / NumPy number (or a readable array) is checked at once (HyperparameterError); a traced one goes the
  value path (`require`: NaN poison, or a checkify check under `checked`). NaN is always out of range.

  Returns:
    True, or the traced condition for `poison`.
  """
  if high is None and low is not None:
    rng = f"be {'>' if low_open else '>='} {low:g}"
  elif low is None and high is not None:
    rng = f"be {'<' if high_open else '<='} {high:g}"
  else:
    rng = (f"be in {'(' if low_open else '['}{'-inf' if low is None else f'{low:g}'}, "
           f"{'inf' if high is None else f'{high:g}'}{')' if high_open else ']'}")
  msg = f"{name} must {rng}" + (f"; {hint}" if hint else ".")
  if value is None:
    return True
  if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
    v = float(value)
    ok = not math.isnan(v)
    if low is not None:
      ok = ok and (v > low if low_open else v >= low)
    if high is not None:
      ok = ok and (v < high if high_open else v <= high)
    if not ok:
      raise HyperparameterError(f"{where}: {msg} Got {value}.")
    return True
  v = xp(value).asarray(value)
  ok = ~xp(value).isnan(v)
  if low is not None:
    ok = ok & ((v > low) if low_open else (v >= low))
  if high is not None:
    ok = ok & ((v < high) if high_open else (v <= high))
  return require(where, ok, HyperparameterError, msg)


def nonempty(where: str, name: str, size: int, what: str = "rows") -> None:
  """Structural: raises EmptyInputError when a static size is 0."""
  if size == 0:
    raise EmptyInputError(f"{where}: {name} is empty (0 {what}); pass at least one.")


# ----------------------------------------------------------------------------------------------------------
# checked(fn): value checks as named errors inside jit.


def _is_dynamic(leaf: Any) -> bool:
  return isinstance(leaf, (jax.Array, np.ndarray, np.generic)) and not isinstance(leaf, (np.str_, np.bytes_))


class _Static:
  """Static leaves with a hash (by value when hashable, else by identity)."""

  def __init__(self, items: tuple):
    self.items = items
    try:
      self._hash = hash(items)
      self._by_value = True
    except TypeError:
      self._hash = hash(tuple(id(v) for v in items))
      self._by_value = False

  def __hash__(self) -> int:
    return self._hash

  def __eq__(self, other: Any) -> bool:
    if not isinstance(other, _Static) or len(other.items) != len(self.items):
      return False
    if self._by_value and other._by_value:
      try:
        return bool(self.items == other.items)
      except Exception:  # noqa: BLE001 - e.g. array-valued __eq__
        pass
    return all(a is b for a, b in zip(self.items, other.items))


def _raise_from(message: str) -> None:
  msg = re.sub(r"\s*\(`check` failed\)\s*$", "", message)
  m = re.match(r"^\[(\w+)\] (.*)$", msg, flags=re.S)
  if m and m.group(1) in _ERRORS:
    raise _ERRORS[m.group(1)](m.group(2))
  raise ContractError(msg)


def checked(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`fn` compiled with its value checks as runtime checks: bad values raise named errors from inside jit.

  Array arguments (jax / NumPy arrays, typed keys) are traced; everything else (Python numbers, strings,
  modules, callables) is static, so the result is compiled once per shape and static value. Structural errors
  raise at trace time as usual; value errors (NaN, probabilities outside [0, 1], indices out of range, labels
  outside their set, traced hyperparameters out of range) raise the same `ContractError` subclass as an eager
  call would, instead of the NaN poison that plain `jax.jit` gives.

    safe_propagate = iclr24_jax.checked(safeguards.propagate)
    y = safe_propagate(p, params)       # ProbabilityError if any p is outside [0, 1] or NaN

  Call the result outside your own `jax.jit` (it compiles by itself); to check a larger program, wrap the
  larger program with `checked` instead.

  Args:
    fn: a library function (or any function built from them).

  Returns:
    The checked function, with fn's signature and outputs.
  """
  cache: dict[Any, Callable] = {}

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    if checking():                                    # nested in another checked trace: already checked
      return fn(*args, **kwargs)
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
      raise CheckedCallError(f"checked({getattr(fn, '__name__', 'fn')}) was called on traced values: it compiles "
                             "and raises by itself, so call it outside jax.jit / vmap / grad, or wrap the whole "
                             "jitted function with checked instead.")
    dyn_pos = tuple(i for i, leaf in enumerate(leaves) if _is_dynamic(leaf))
    static = _Static(tuple((i, leaf) for i, leaf in enumerate(leaves) if not _is_dynamic(leaf)))
    key = (treedef, dyn_pos, static)
    run = cache.get(key)
    if run is None:
      def traced(*dyn):
        full = list(leaves)
        for i, v in static.items:
          full[i] = v
        for i, v in zip(dyn_pos, dyn):
          full[i] = v
        a, k = jax.tree_util.tree_unflatten(treedef, full)
        token = _CHECKING.set(True)
        try:
          return fn(*a, **k)
        finally:
          _CHECKING.reset(token)
      run = jax.jit(checkify.checkify(traced, errors=checkify.user_checks))
      if static._by_value:
        cache[key] = run
    err, out = run(*[leaves[i] for i in dyn_pos])
    message = err.get()
    if message:
      _raise_from(message)
    return out

  return wrapper
