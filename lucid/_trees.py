"""Model libraries' pytrees as Parameters with torch's dotted names, and back.

A model written with flax.nnx (its `nnx.State`), equinox (the model itself), flax
linen (the param dict) or as a plain dict is a pytree of arrays. lucid optimizes
[Parameter][lucid.Parameter]s; these three functions are the way between the two:

* [parameters][lucid.parameters] boxes every inexact (floating or complex) array
  leaf of a pytree as a Parameter and returns the same pytree, the *boxed* tree;
* [named_parameters][lucid.named_parameters] lists a boxed tree's Parameters with
  torch-like dotted names made from their pytree paths (`"h.0.attn.c_attn.kernel"`);
* [values][lucid.values] gives the boxed tree back with each Parameter replaced by its
  current array (for `nnx.update`, `eqx.combine`, inference or saving).

A boxed tree is accepted wherever lucid takes parameters: the optimizers' constructors
and `add_param_group` (as torch's `model.named_parameters()`: its Parameters in order,
their names in `param_names`), [backward][lucid.backward], [fused_step][lucid.fused_step],
`lucid.nn.utils.clip_grad_norm_` / `clip_grad_value_` and `swa_utils.AveragedModel`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._parameter import Parameter


def _is_parameter(x: Any) -> bool:
    return isinstance(x, Parameter)


def _is_inexact_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray) and jnp.issubdtype(x.dtype, jnp.inexact)


def _is_variable(x: Any) -> bool:
    """An nnx variable (``Variable``/``VariableState``): a node whose one child is ``value``."""
    return any(
        cls.__name__ in ("Variable", "VariableState") and cls.__module__.startswith("flax.nnx")
        for cls in type(x).__mro__
    )


def _key_name(key: Any) -> str:
    for attribute in ("key", "idx", "name"):  # DictKey/FlattenedIndexKey, SequenceKey, GetAttrKey
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def dotted(path: tuple) -> str:
    """A pytree path as torch names a module's entries: `{"layer": [w]}` -> `layer.0`."""
    return ".".join(_key_name(key) for key in path)


def named_leaves(tree: Any) -> list[tuple[str, Any]]:
    """Every leaf (Parameters as leaves) with its dotted name; an nnx variable's own
    ``value`` key is left out of the name, as torch names a module's tensors."""
    named = []
    outer = jax.tree_util.tree_flatten_with_path(
        tree, is_leaf=lambda x: _is_parameter(x) or _is_variable(x)
    )[0]
    for path, leaf in outer:
        if _is_variable(leaf):
            inner = jax.tree_util.tree_flatten_with_path(leaf, is_leaf=_is_parameter)[0]
            for inner_path, inner_leaf in inner:
                kept = tuple(k for k in inner_path if _key_name(k) != "value")
                named.append((dotted(path + kept), inner_leaf))
        else:
            named.append((dotted(path), leaf))
    return named


UNBOXED = (
    "a pytree of arrays holds no lucid.Parameter: box it first with "
    "`boxed = lucid.parameters(tree)` and hand `boxed` to lucid (the optimizer, backward, "
    "fused_step, clipping); `lucid.values(boxed)` gives the arrays back"
)


def parameters(tree: Any) -> Any:
    """The pytree with every inexact array leaf boxed as a [Parameter][lucid.Parameter].

    torch keeps a model's weights as `nn.Parameter`s; a JAX model library keeps
    them as arrays in a pytree. This boxes each floating-point (or complex)
    array leaf $x$ of `tree` as `Parameter(x)` and returns the same structure
    (an `nnx.State`, an equinox model, a dict...). Other leaves are left as
    they are: integer arrays (step counters, RNG keys), Python numbers,
    functions (equinox's activations), as `equinox.is_inexact_array` filters;
    Parameters already there are kept (boxing twice changes nothing).

    Args:
      tree: a pytree of arrays: an `nnx.State` (from `nnx.split`), an equinox
        model, a flax linen variable dict, a dict or list of arrays.

    Returns:
      The boxed tree: `tree`'s structure, its inexact arrays now Parameters
      (each with its own copy of the value's buffer reference; the original
      tree is unchanged).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> boxed = lucid.parameters({"fc": {"weight": jnp.ones((2, 3)), "bias": jnp.zeros(2)}})
      >>> type(boxed["fc"]["weight"]).__name__
      'Parameter'
      >>> [name for name, _ in lucid.named_parameters(boxed)]
      ['fc.bias', 'fc.weight']
    """
    return jax.tree_util.tree_map(
        lambda x: Parameter(x) if _is_inexact_array(x) else x, tree, is_leaf=_is_parameter
    )


def named_parameters(tree: Any) -> list[tuple[str, Parameter]]:
    """A boxed tree's Parameters with torch-like dotted names (torch: `named_parameters()`).

    Each name joins the keys of the Parameter's pytree path with `"."`: dict
    keys, sequence indices and attribute names, as torch names a module's
    parameters (`{"h": [{"attn": {"c_attn": {"weight": w}}}]}` gives
    `"h.0.attn.c_attn.weight"`); the `value` key of an nnx variable is left
    out. Order is the pytree's (jax's flattening order: dict keys sorted, an
    equinox model's fields in declaration order). A Parameter that appears
    twice (tied weights) is listed once, under its first name, as torch's
    `named_parameters()` does.

    Args:
      tree: a boxed tree (from [parameters][lucid.parameters]), or any pytree
        holding Parameters.

    Returns:
      A list of `(name, Parameter)` pairs.

    Raises:
      TypeError: `tree` holds arrays but no Parameter (the message says to
        box it with `lucid.parameters`).

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> boxed = lucid.parameters({"h": [{"w": jnp.ones(2)}, {"w": jnp.ones(3)}]})
      >>> [(name, p.shape) for name, p in lucid.named_parameters(boxed)]
      [('h.0.w', (2,)), ('h.1.w', (3,))]
    """
    named, seen = [], set()
    arrays = False
    for name, leaf in named_leaves(tree):
        if isinstance(leaf, Parameter):
            if id(leaf) not in seen:
                seen.add(id(leaf))
                named.append((name, leaf))
        elif _is_inexact_array(leaf):
            arrays = True
    if not named and arrays:
        raise TypeError(UNBOXED)
    return named


def values(tree: Any) -> Any:
    """The boxed tree with each Parameter replaced by its current array.

    The way back to the model library: `nnx.update(model, lucid.values(boxed))`,
    `eqx.combine(lucid.values(boxed), static)`, `model.apply(lucid.values(boxed), x)`,
    or a checkpoint of the weights. (Handing the boxed tree itself to `nnx.update`
    would put Parameter objects into the model, which flax then cannot compute with.)

    Args:
      tree: a pytree holding Parameters (other leaves are kept as they are).

    Returns:
      The same structure, each Parameter `p` replaced by `p.data`.

    Examples:
      >>> import jax.numpy as jnp, lucid
      >>> boxed = lucid.parameters({"w": jnp.array([1.0, 2.0])})
      >>> opt = lucid.optim.SGD(boxed, lr=0.5)
      >>> loss = lucid.backward(lambda t: (t["w"] ** 2).sum(), boxed)
      >>> opt.step()
      >>> lucid.values(boxed)["w"].tolist()
      [0.0, 0.0]
    """
    return jax.tree_util.tree_map(
        lambda x: x.data if isinstance(x, Parameter) else x, tree, is_leaf=_is_parameter
    )


def boxed_tree_params(params: Any) -> list[tuple[str, Parameter]] | None:
    """`params` as named Parameters when it is a pytree container other than a list or
    tuple (a dict, an `nnx.State`, an equinox model...), else ``None`` (an iterable to
    read as torch reads one).

    Raises:
      TypeError: a pytree of arrays without Parameters (the message says how to box it).
    """
    if params is None or isinstance(params, list | tuple | Parameter | Iterator):
        return None  # (jax warns that it will refuse an iterator as a pytree leaf)
    treedef = jax.tree_util.tree_structure(params, is_leaf=_is_parameter)
    if jax.tree_util.treedef_is_leaf(treedef):
        return None  # a generator, an iterator, an array...
    return named_parameters(params)
