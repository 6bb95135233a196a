"""Compiling changes speed, never numbers: a hypothesis state machine drives two copies of
one flax.nnx model in float32, one optimized eagerly and one compiled (from the start or
at a random point), through the same random training loop, and requires them to be equal
bit for bit after every operation.

The model's parameters cross the engine's size thresholds (an embedding above `Policy.small`
elements, biases one element above a piece, kernels in between) and sit in several groups
chosen by name, as a port of nanoGPT puts them; the loop mixes `lucid.backward`
(accumulating), `clip_grad_norm_` over the parameters in the model's order, in the groups'
order or reversed (every norm type), steps, `zero_grad`, edits of a group's learning rate,
state_dicts crossed between the twins, and fused steps (with torch's clipping as their
`grad_transform`, against backward, clipping and a step on the eager twin). Parameters,
gradients and every state_dict entry must be bitwise equal. torch is not the oracle here:
the eager step is (its numbers are torch's, `tests/test_thresholds.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from cases import CASES
from flax import nnx
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import lucid
import lucid.functional as LF

# every class with option sets in tests/cases.py (tests/test_registry.py: those without are
# tested on their own)
CLASSES = list(dict.fromkeys(name for name, _ in CASES))
OPTION_SETS = {name: [opts for n, opts in CASES if n == name] for name in CLASSES}
VOCAB, WIDTH, HIDDEN, OUT = 130, 128, 33, 129  # embedding 16640 > small; OUT = a piece + 1
BATCH = 8


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        self.fc1 = nnx.Linear(WIDTH, HIDDEN, rngs=rngs)
        self.norm = nnx.LayerNorm(HIDDEN, rngs=rngs)
        self.fc2 = nnx.Linear(HIDDEN, OUT, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens).mean(axis=1)
        return self.fc2(jnp.tanh(self.norm(self.fc1(x))))


GRAPHDEF, STATE = nnx.split(Net(nnx.Rngs(0)))


def loss_fn(state, tokens, targets):
    logits = nnx.merge(GRAPHDEF, state)(tokens)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[:, None], 1))


def _batch(seed: int) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(seed)
    return (
        jnp.asarray(rng.integers(0, VOCAB, (BATCH, 4))),
        jnp.asarray(rng.integers(0, OUT, (BATCH,))),
    )


def _groups(named: list, how: str) -> list[dict]:
    """The optimizer's groups, chosen by name as a port does."""
    if how == "one":
        return [{"params": named}]
    if how == "decay":  # nanoGPT's: matrices decay, the rest does not
        return [
            {"params": [(n, p) for n, p in named if p.ndim >= 2]},
            {"params": [(n, p) for n, p in named if p.ndim < 2], "lr_scale": 0.5},
        ]
    # by layer, in reverse order of the model
    layers = sorted({n.split(".")[0] for n, _ in named}, reverse=True)
    return [{"params": [(n, p) for n, p in named if n.split(".")[0] == layer]} for layer in layers]


class Twins:
    """One side: a boxed copy of the model's state and its optimizer."""

    def __init__(self, name: str, options: dict, how: str) -> None:
        self.params = lucid.parameters(jax.tree_util.tree_map(jnp.copy, STATE))
        self.named = lucid.named_parameters(self.params)
        groups = _groups(self.named, how)
        for group in groups:  # lr_scale is this test's, not the optimizer's
            scale = group.pop("lr_scale", None)
            if scale is not None and "lr" in options:
                group["lr"] = options["lr"] * scale
        self.opt = getattr(lucid.optim, name)(groups, **options)
        self.compiled = None
        self.fused: dict = {}

    def stepper(self):
        return self.compiled if self.compiled is not None else self.opt


class EagerCompiledTwins(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []

    def _fail(self, message: str) -> None:
        history = "\n".join(f"  {i + 1}. {entry}" for i, entry in enumerate(self.log))
        raise AssertionError(f"{message}\noperations so far:\n{history}")

    @initialize(
        name=st.sampled_from(CLASSES),
        option_index=st.integers(0, 10),
        how=st.sampled_from(["one", "decay", "layers"]),
        compile_now=st.booleans(),
    )
    def init(self, name, option_index, how, compile_now):
        options = dict(OPTION_SETS[name][option_index % len(OPTION_SETS[name])])
        self.log.append(f"init {name}({options}) groups by {how}, compiled now: {compile_now}")
        self.eager = Twins(name, options, how)
        self.other = Twins(name, options, how)
        if compile_now:
            self.other.compiled = lucid.compile_optimizer(self.other.opt)

    @precondition(lambda self: self.other.compiled is None)
    @rule()
    def compile_later(self):
        self.log.append("compile the other twin")
        self.other.compiled = lucid.compile_optimizer(self.other.opt)

    @rule(seed=st.integers(0, 2**16))
    def backward(self, seed):
        self.log.append(f"backward(batch {seed})")
        tokens, targets = _batch(seed)
        losses = [lucid.backward(loss_fn, t.params, tokens, targets) for t in self._both()]
        if np.asarray(losses[0]).tobytes() != np.asarray(losses[1]).tobytes():
            self._fail(f"losses differ: {losses}")

    @rule(
        max_norm=st.sampled_from([0.05, 1.0]),
        norm_type=st.sampled_from([2.0, 1.0, float("inf")]),
        order=st.sampled_from(["model", "groups", "reversed"]),
    )
    def clip(self, max_norm, norm_type, order):
        self.log.append(f"clip_grad_norm_({order} order, {max_norm}, {norm_type})")
        totals = []
        for t in self._both():
            if order == "model":
                listed = [p for _, p in t.named]
            elif order == "groups":
                listed = list(t.opt.parameters())
            else:
                listed = [p for _, p in reversed(t.named)]
            totals.append(lucid.nn.utils.clip_grad_norm_(listed, max_norm, norm_type))
        if np.asarray(totals[0]).tobytes() != np.asarray(totals[1]).tobytes():
            self._fail(f"total norms differ: {totals}")

    @rule()
    def step(self):
        self.log.append("step()")
        for t in self._both():
            t.stepper().step()

    @rule(set_to_none=st.booleans())
    def zero_grad(self, set_to_none):
        self.log.append(f"zero_grad(set_to_none={set_to_none})")
        for t in self._both():
            t.stepper().zero_grad(set_to_none=set_to_none)

    @rule(group=st.integers(0, 3), factor=st.sampled_from([0.5, 2.0]))
    def edit_lr(self, group, factor):
        for t in self._both():
            groups = t.stepper().param_groups
            g = groups[group % len(groups)]
            g["lr"] = g["lr"] * factor
        self.log.append(f"param_groups[{group}]['lr'] *= {factor}")

    @rule(into_eager=st.booleans())
    def cross_state_dicts(self, into_eager):
        """Each twin loads the other's state_dict (the same state, in the other form)."""
        self.log.append(f"state_dict crossed into the {'eager' if into_eager else 'other'}")
        source, target = (self.other, self.eager) if into_eager else (self.eager, self.other)
        target.stepper().load_state_dict(source.stepper().state_dict())

    @rule(seed=st.integers(0, 2**16), max_norm=st.sampled_from([None, 0.05, 1.0]))
    def fused_step(self, seed, max_norm):
        """The other twin's fused step (compiling it) against backward, clipping (over the
        optimizer's parameters, as the transform sees them) and a step on the eager twin;
        the gradients are left as they were on both."""
        self.log.append(f"fused step(batch {seed}, clip {max_norm})")
        tokens, targets = _batch(seed)
        other = self.other
        if max_norm not in other.fused:
            clip = None if max_norm is None else LF.clip_grad_norm(max_norm)
            other.fused[max_norm] = lucid.fused_step(loss_fn, other.opt, clip)
            other.compiled = lucid.compile_optimizer(other.opt)
        fused_loss = other.fused[max_norm](other.params, tokens, targets)
        eager = self.eager
        params = [p for _, p in eager.named]
        kept = [p.grad for p in params]
        for p in params:
            p.grad = None
        loss = lucid.backward(loss_fn, eager.params, tokens, targets)
        if max_norm is not None:
            lucid.nn.utils.clip_grad_norm_(list(eager.opt.parameters()), max_norm)
        eager.opt.step()
        for p, g in zip(params, kept):
            p.grad = g
        if np.asarray(loss).tobytes() != np.asarray(fused_loss).tobytes():
            self._fail(f"losses differ: {loss} against the fused step's {fused_loss}")

    def _both(self) -> tuple[Twins, Twins]:
        return self.eager, self.other

    @invariant()
    def bitwise_equal(self):
        if not hasattr(self, "eager"):
            return
        for (name, a), (_, b) in zip(self.eager.named, self.other.named):
            if np.asarray(a.data).tobytes() != np.asarray(b.data).tobytes():
                self._fail(f"parameter {name} differs: max |diff| {_diff(a.data, b.data):.3g}")
            if (a.grad is None) != (b.grad is None):
                self._fail(f"gradient of {name}: {a.grad is None} against {b.grad is None}")
            if a.grad is not None and np.asarray(a.grad).tobytes() != np.asarray(b.grad).tobytes():
                self._fail(f"gradient of {name} differs: max |diff| {_diff(a.grad, b.grad):.3g}")
        ours = self.eager.stepper().state_dict()["state"]
        theirs = self.other.stepper().state_dict()["state"]
        if set(ours) != set(theirs):
            self._fail(f"state of parameters {sorted(ours)} against {sorted(theirs)}")
        for index, entry in ours.items():
            for key, value in entry.items():
                other = theirs[index][key]
                if np.asarray(value).tobytes() != np.asarray(other).tobytes():
                    self._fail(f"state {key!r} of parameter {index} differs")


def _diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


TestEagerCompiledTwins = EagerCompiledTwins.TestCase
TestEagerCompiledTwins.settings = settings(
    max_examples=30,
    stateful_step_count=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
