"""lucid.optim.LBFGS (the full algorithm, with closure) against torch.optim.LBFGS."""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import lucid


def rosenbrock_jax(p):
    x = p["x"]
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


def rosenbrock_torch(p):
    x = p["x"]
    return torch.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2)


_X = np.random.default_rng(7).normal(size=(64, 4))
_Y = (
    np.random.default_rng(8).uniform(size=64) < 1 / (1 + np.exp(-_X @ [1.0, -2.0, 0.5, 0.0]))
).astype(float)


def logistic_jax(p):
    z = jnp.asarray(_X) @ p["w"] + p["b"]
    return jnp.mean(jnp.logaddexp(0.0, z) - jnp.asarray(_Y) * z) + 1e-3 * jnp.sum(p["w"] ** 2)


def logistic_torch(p):
    z = torch.as_tensor(_X) @ p["w"] + p["b"]
    y = torch.as_tensor(_Y)
    return torch.mean(torch.logaddexp(torch.zeros(()), z) - y * z) + 1e-3 * torch.sum(p["w"] ** 2)


PROBLEMS = {
    "rosenbrock": (rosenbrock_jax, rosenbrock_torch, {"x": np.array([-1.2, 1.0, -0.5, 0.8])}),
    "logistic": (logistic_jax, logistic_torch, {"b": np.zeros(()), "w": np.zeros(4)}),
}


def _run_torch(problem, options, steps, scale=1.0):
    _, loss_fn, init = PROBLEMS[problem]
    params = {
        k: torch.tensor(v * scale, dtype=torch.float64, requires_grad=True) for k, v in init.items()
    }
    opt = torch.optim.LBFGS(list(params.values()), **options)

    def closure():
        opt.zero_grad()
        loss = loss_fn(params)
        loss.backward()
        return loss

    losses = [float(opt.step(closure).detach()) for _ in range(steps)]
    return params, opt, losses


def _run_lucid(problem, options, steps, params=None, opt=None):
    loss_fn, _, init = PROBLEMS[problem]
    if params is None:
        params = {k: lucid.Parameter(jnp.asarray(v, jnp.float64)) for k, v in init.items()}
        opt = lucid.optim.LBFGS(list(params.values()), **options)

    def closure():
        opt.zero_grad()
        return lucid.backward(loss_fn, params)

    losses = [float(opt.step(closure)) for _ in range(steps)]
    return params, opt, losses


CONFIGS = [
    {},
    {"line_search_fn": "strong_wolfe"},
    {"lr": 0.5, "max_iter": 7, "history_size": 3},
    {"line_search_fn": "strong_wolfe", "max_iter": 5, "max_eval": 9, "history_size": 4},
    {"tolerance_grad": 1e-3, "tolerance_change": 1e-5},
]


def _tolerance(problem, options, tparams, tlosses):
    """10x torch's own sensitivity over three steps (its start moved by 1e-15), at least
    1e-9: how far two correct runs of the same iterates may part."""
    moved, _, moved_losses = _run_torch(problem, options, steps=3, scale=1 + 1e-15)
    sensitivity = max(
        np.max(np.abs(moved[k].detach().numpy() - tparams[k].detach().numpy()))
        / np.max(np.abs(tparams[k].detach().numpy()))
        for k in tparams
    )
    sensitivity = max(
        sensitivity, np.max(np.abs(np.subtract(moved_losses, tlosses)) / np.abs(tlosses))
    )
    return max(1e-9, 10 * sensitivity)


@pytest.mark.fast
@pytest.mark.parametrize("problem", sorted(PROBLEMS))
@pytest.mark.parametrize(
    "options", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults"
)
def test_lbfgs_matches_torchs_iterates_and_returned_losses(problem, options):
    # Up to 60 L-BFGS iterations. Without a line search Rosenbrock amplifies
    # rounding (torch against itself, start moved by 1e-15: 3e-8 apart after
    # three steps), so the tolerance is 10x torch's own sensitivity, measured
    # here, and never more permissive than that or tighter than 1e-9.
    tparams, topt, tlosses = _run_torch(problem, options, steps=3)
    params, opt, losses = _run_lucid(problem, options, steps=3)
    rtol = _tolerance(problem, options, tparams, tlosses)
    np.testing.assert_allclose(losses, tlosses, rtol=rtol)
    for k in tparams:
        chex.assert_trees_all_close(
            params[k].data, tparams[k].detach().numpy(), rtol=rtol, atol=1e-12
        )
    tstate = topt.state_dict()["state"][0]
    state = opt.state_dict()["state"][0]
    assert set(state) == set(tstate)
    assert state["func_evals"] == tstate["func_evals"] and state["n_iter"] == tstate["n_iter"]
    assert len(state["old_dirs"]) == len(tstate["old_dirs"])


@pytest.mark.fast
@pytest.mark.parametrize("options", [{}, {"line_search_fn": "strong_wolfe", "history_size": 3}])
def test_lbfgs_checkpoints_move_both_ways(options):
    problem = "rosenbrock"
    # torch -> lucid
    tparams, topt, _ = _run_torch(problem, options, steps=2)
    params = {
        k: lucid.Parameter(jnp.asarray(v.detach().numpy().copy())) for k, v in tparams.items()
    }
    opt = lucid.optim.LBFGS(list(params.values()), **options)
    opt.load_state_dict(topt.state_dict())
    _, _, tlosses = _run_torch_continue(topt, tparams, problem, 2)
    _, _, losses = _run_lucid(problem, options, 2, params, opt)
    np.testing.assert_allclose(losses, tlosses, rtol=1e-9)
    # lucid -> torch: each leaf through torch.as_tensor
    sd = opt.state_dict()
    converted = {"param_groups": sd["param_groups"], "state": {0: {}}}
    for name, value in sd["state"][0].items():
        if isinstance(value, list):
            value = [None if v is None else torch.as_tensor(v) for v in value]
        elif not isinstance(value, int | float):
            value = torch.as_tensor(value)
        converted["state"][0][name] = value
    tparams2 = {k: torch.tensor(np.asarray(p.data), requires_grad=True) for k, p in params.items()}
    topt2 = torch.optim.LBFGS(list(tparams2.values()), **options)
    topt2.load_state_dict(converted)
    _, _, tlosses = _run_torch_continue(topt2, tparams2, problem, 2)
    _, _, losses = _run_lucid(problem, options, 2, params, opt)
    np.testing.assert_allclose(losses, tlosses, rtol=1e-9)


def _run_torch_continue(opt, params, problem, steps):
    _, loss_fn, _ = PROBLEMS[problem]

    def closure():
        opt.zero_grad()
        loss = loss_fn(params)
        loss.backward()
        return loss

    return params, opt, [float(opt.step(closure).detach()) for _ in range(steps)]


def test_lbfgs_refuses_groups_bad_line_search_and_a_missing_closure():
    p, q = lucid.Parameter(jnp.ones(2)), lucid.Parameter(jnp.ones(2))
    with pytest.raises(ValueError, match="parameter groups"):
        lucid.optim.LBFGS([{"params": [p]}, {"params": [q]}])
    with pytest.raises(ValueError, match="strong_wolfe"):
        lucid.optim.LBFGS([p], line_search_fn="armijo")
    opt = lucid.optim.LBFGS([p])
    with pytest.raises(ValueError, match="closure"):
        opt.step()
    with pytest.raises(ValueError, match="parameter groups"):
        opt.add_param_group({"params": [q]})


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_a_nan_gradient_of_4096_entries_is_not_convergence_as_in_torch(line_search_fn):
    """torch's convergence test ``max|g| <= tolerance_grad`` is false for a gradient holding
    a NaN, so it steps (into NaN). XLA:CPU's max over 4096 entries or more dropped the NaN
    (``-inf`` for ones and a last NaN), which read as convergence: no step at all."""
    weights = np.ones(4096)
    weights[-1] = np.nan

    t = torch.zeros(4096, dtype=torch.float64, requires_grad=True)
    t_opt = torch.optim.LBFGS([t], line_search_fn=line_search_fn, max_iter=3)

    def t_closure():
        t_opt.zero_grad()
        loss = torch.sum((t - 1.0) ** 2 * torch.tensor(weights))
        loss.backward()
        return loss

    p = lucid.Parameter(jnp.zeros(4096, jnp.float64))
    opt = lucid.optim.LBFGS([p], line_search_fn=line_search_fn, max_iter=3)

    def closure():
        opt.zero_grad()
        return lucid.backward(lambda x: jnp.sum((x - 1.0) ** 2 * jnp.asarray(weights)), p)

    t_opt.step(t_closure)
    opt.step(closure)
    expected = t.detach().numpy()
    assert np.isnan(expected).any()  # torch stepped
    np.testing.assert_array_equal(np.asarray(p.data), expected)


# ------------------------------------------- torch 2.15: where lucid follows it


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
@pytest.mark.parametrize("options", CONFIGS[:4], ids=["defaults", "wolfe", "short", "wolfe-short"])
def test_maximize_is_torch_213_minimizing_the_negated_closure(problem, options):
    """torch 2.15's ``maximize=True`` negates the gradient and every loss the algorithm
    reads; torch 2.13 computes the same by minimizing the negated closure. Maximizing
    ``-f`` (lucid) is then minimizing ``f`` (torch 2.13): the same iterates and state
    (``prev_loss`` holds the negated loss, ``f``), while ``step`` returns the closure's
    own value, ``-f``. Negation is exact, so lucid must equal its own minimization of
    ``f`` bit for bit, and torch to the tolerance of the test above."""
    loss_jax, _, init = PROBLEMS[problem]
    tparams, topt, tlosses = _run_torch(problem, options, steps=3)
    rtol = _tolerance(problem, options, tparams, tlosses)

    def run(maximize):
        params = {k: lucid.Parameter(jnp.asarray(v, jnp.float64)) for k, v in init.items()}
        opt = lucid.optim.LBFGS(list(params.values()), **options, maximize=maximize)

        def closure():  # -f and its gradient, negated exactly (XLA's program for the
            opt.zero_grad()  # gradient of -f may round differently from f's)
            loss = lucid.backward(loss_jax, params)
            if maximize:
                for p in params.values():
                    p.grad = -p.grad
            return -loss if maximize else loss

        return params, opt, [float(opt.step(closure)) for _ in range(3)]

    params, opt, losses = run(maximize=True)
    mparams, mopt, mlosses = run(maximize=False)
    assert losses == [-loss for loss in mlosses]  # the closure's own values
    for k in params:
        np.testing.assert_array_equal(np.asarray(params[k].data), np.asarray(mparams[k].data))
    np.testing.assert_allclose(losses, [-loss for loss in tlosses], rtol=rtol)
    for k in tparams:
        chex.assert_trees_all_close(
            params[k].data, tparams[k].detach().numpy(), rtol=rtol, atol=1e-12
        )
    state, tstate = opt.state_dict()["state"][0], topt.state_dict()["state"][0]
    assert set(state) == set(tstate)
    assert state["n_iter"] == tstate["n_iter"] and state["func_evals"] == tstate["func_evals"]
    # near a minimum the loss is ~0: its error on the scale of the first loss
    np.testing.assert_allclose(
        float(state["prev_loss"]), float(tstate["prev_loss"]), rtol=rtol, atol=rtol * tlosses[0]
    )
    assert float(state["prev_loss"]) == float(mopt.state_dict()["state"][0]["prev_loss"])
    group, tgroup = opt.state_dict()["param_groups"][0], topt.state_dict()["param_groups"][0]
    assert group == {**tgroup, "maximize": True}  # the key torch 2.13's groups lack


def test_maximize_is_keyword_only_and_in_the_groups():
    p = lucid.Parameter(jnp.ones(2))
    assert lucid.optim.LBFGS([p]).param_groups[0]["maximize"] is False
    with pytest.raises(TypeError):
        lucid.optim.LBFGS([p], 1, 20, None, 1e-7, 1e-9, 100, None, True)
    with pytest.raises(TypeError, match="maximize"):  # torch 2.13 has no maximize
        torch.optim.LBFGS([torch.ones(2, requires_grad=True)], maximize=True)


def test_an_empty_group_returns_the_closures_loss_as_torch_215():
    """torch 2.15 calls the closure once and returns its loss; torch 2.13 fails
    (``IndexError``: its state lives on the first parameter)."""
    topt = torch.optim.LBFGS([{"params": []}])
    with pytest.raises(IndexError):
        topt.step(lambda: torch.tensor(3.5))
    opt = lucid.optim.LBFGS([{"params": []}])
    calls = []

    def closure():
        calls.append(1)
        return jnp.asarray(3.5)

    assert float(opt.step(closure)) == 3.5 and calls == [1]
    assert not opt.state_dict()["state"]
