"""A loss of exactly one element is a loss, as in torch: ``loss.backward()`` on a
``(1,)`` or ``(1, 1)`` tensor differentiates its one element, and ``step(closure)``
returns the closure's loss as it was given. lucid's `backward`, fused steps,
`Optimizer.step(closure)` (eager and compiled) and `LBFGS.step(closure)` against
torch on the same inputs; a loss of any other size fails as torch fails (its
error type: RuntimeError from backward, ValueError from ``float(loss)`` in LBFGS),
naming the shape, and changes nothing."""

from __future__ import annotations

import chex
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import lucid

SHAPES = [(1,), (1, 1), (1, 1, 1)]
BAD_SHAPES = [(2,), (0,), (2, 1)]
RNG = np.random.default_rng(3)
W0 = RNG.normal(size=(3,))
B0 = RNG.normal(size=(2,))
X = RNG.normal(size=(3,))


def loss_jax(params, x, shape):
    w, b = params
    return (((w * x).sum() - b.sum()) ** 2 + (w**2).sum()).reshape(shape)


def loss_torch(params, x, shape):
    w, b = params
    return (((w * x).sum() - b.sum()) ** 2 + (w**2).sum()).reshape(shape)


def lucid_params():
    return [lucid.Parameter(jnp.asarray(W0)), lucid.Parameter(jnp.asarray(B0))]


def torch_params():
    return [torch.tensor(W0, requires_grad=True), torch.tensor(B0, requires_grad=True)]


def close(lucid_value, torch_value):
    torch_value = torch_value.detach().numpy()
    assert np.shape(lucid_value) == torch_value.shape
    chex.assert_trees_all_close(np.asarray(lucid_value), torch_value, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("compiled", [False, True], ids=["own_arrays", "compiled_store"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_backward_differentiates_a_one_element_loss_as_torch(shape, compiled):
    params = lucid_params()
    if compiled:  # the parameters live in a compiled optimizer's flat buffer
        lucid.compile_optimizer(lucid.optim.SGD(params, lr=0.1))
    tparams = torch_params()
    for _ in range(2):  # accumulated, as torch accumulates
        loss = lucid.backward(loss_jax, params, jnp.asarray(X), shape)
        tloss = loss_torch(tparams, torch.tensor(X), shape)
        tloss.backward()
        close(loss, tloss)
    for p, t in zip(params, tparams):
        close(p.grad, t.grad)


def _torch_step(opt, tparams, shape):
    def closure():
        opt.zero_grad()
        loss = loss_torch(tparams, torch.tensor(X), shape)
        loss.backward()
        return loss

    return opt.step(closure)


@pytest.mark.parametrize("grad_transform", [None, "halve"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_step_takes_a_one_element_loss_and_returns_it_in_its_shape(shape, grad_transform):
    halve = (lambda grads: [g / 2 for g in grads]) if grad_transform else None
    tparams = torch_params()
    topt = torch.optim.Adam(tparams, lr=0.1)
    params = lucid_params()
    fused = lucid.fused_step(loss_jax, lucid.optim.Adam(params, lr=0.1), grad_transform=halve)
    for _ in range(2):
        topt.zero_grad()
        tloss = loss_torch(tparams, torch.tensor(X), shape)
        tloss.backward()
        if halve:
            for t in tparams:
                t.grad /= 2
        topt.step()
        close(fused(params, jnp.asarray(X), shape), tloss)
    for p, t in zip(params, tparams):
        close(p.data, t)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_step_in_steps_takes_a_one_element_loss(shape):
    """An optimizer parameter the loss does not take: the fused step runs as backward +
    step (torch skips the parameter without a gradient)."""
    extra, textra = lucid.Parameter(jnp.ones(2)), torch.ones(2, requires_grad=True)
    tparams = torch_params()
    topt = torch.optim.SGD([*tparams, textra], lr=0.1, momentum=0.9)
    params = lucid_params()
    fused = lucid.fused_step(loss_jax, lucid.optim.SGD([*params, extra], lr=0.1, momentum=0.9))
    for _ in range(2):
        close(fused(params, jnp.asarray(X), shape), _torch_step(topt, tparams, shape))
    for p, t in zip([*params, extra], [*tparams, textra]):
        close(p.data, t)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_step_with_closure_returns_the_one_element_loss_as_given(shape, compiled):
    tparams = torch_params()
    topt = torch.optim.SGD(tparams, lr=0.1, momentum=0.9)
    params = lucid_params()
    opt = lucid.optim.SGD(params, lr=0.1, momentum=0.9)
    stepper = lucid.compile_optimizer(opt) if compiled else opt

    def closure():
        opt.zero_grad()
        return lucid.backward(loss_jax, params, jnp.asarray(X), shape)

    for _ in range(2):
        close(stepper.step(closure), _torch_step(topt, tparams, shape))
    for p, t in zip(params, tparams):
        close(p.data, t)


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_lbfgs_step_returns_a_one_element_closure_loss_as_given(shape, line_search_fn):
    options = {"lr": 0.5, "max_iter": 4, "line_search_fn": line_search_fn}
    tparams = torch_params()
    topt = torch.optim.LBFGS(tparams, **options)
    params = lucid_params()
    opt = lucid.optim.LBFGS(params, **options)

    def closure():
        opt.zero_grad()
        return lucid.backward(loss_jax, params, jnp.asarray(X), shape)

    for _ in range(2):
        close(opt.step(closure), _torch_step(topt, tparams, shape))
    for p, t in zip(params, tparams):
        close(p.data, t)


def _torch_error(fn):
    with pytest.raises(Exception) as caught:
        fn()
    return caught.type


@pytest.mark.parametrize("shape", BAD_SHAPES, ids=str)
def test_a_loss_of_another_size_fails_as_torch_naming_its_shape(shape):
    tparams = torch_params()

    def torch_backward():
        loss_torch(tparams, torch.tensor(X), (1,)).expand(shape).backward()

    expected = _torch_error(torch_backward)  # RuntimeError
    message = rf"exactly one element.*shape {tuple(shape)}".replace("(", r"\(").replace(")", r"\)")

    def bad_loss(params, x):
        return loss_jax(params, x, (1,)) * jnp.ones(shape)

    params = lucid_params()
    with pytest.raises(expected, match=message):
        lucid.backward(bad_loss, params, jnp.asarray(X))
    assert [p.grad for p in params] == [None, None]

    for grad_transform in (None, lambda grads: grads):
        opt = lucid.optim.Adam(params, lr=0.1)
        fused = lucid.fused_step(bad_loss, opt, grad_transform=grad_transform)
        with pytest.raises(expected, match=message):
            fused(params, jnp.asarray(X))
        for p, start in zip(params, (W0, B0)):
            chex.assert_trees_all_equal(np.asarray(p.data), start)
        assert [p.grad for p in params] == [None, None]
        assert opt.state_dict()["state"] == {}


@pytest.mark.parametrize("shape", [(2,), (0,)], ids=str)
def test_lbfgs_closure_returning_another_size_fails_as_torch(shape):
    """A closure that computes the gradients but returns a loss of another size."""
    tparams = torch_params()
    topt = torch.optim.LBFGS(tparams)

    def torch_closure():
        topt.zero_grad()
        loss = loss_torch(tparams, torch.tensor(X), ())
        loss.backward()
        return loss.detach() * torch.ones(shape)

    expected = _torch_error(lambda: topt.step(torch_closure))  # float() of it: ValueError
    params = lucid_params()
    opt = lucid.optim.LBFGS(params)

    def closure():
        opt.zero_grad()
        return lucid.backward(loss_jax, params, jnp.asarray(X), ()) * jnp.ones(shape)

    with pytest.raises(expected, match=rf"returned shape \({shape[0]},\)"):
        opt.step(closure)
    for p, start in zip(params, (W0, B0)):
        chex.assert_trees_all_equal(np.asarray(p.data), start)
