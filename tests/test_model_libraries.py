"""Model libraries' pytrees (flax.nnx, equinox, dicts) as lucid Parameters, against torch.

An nnx MLP and an equinox conv net are boxed with `lucid.parameters`, trained in
eager, compiled and fused forms, and compared with the same torch model on the same
weights (float64, to ~1e-10); torch's named parameters, gradient accumulation loop and
`has_aux` (as `jax.value_and_grad`) are the references; each misleading error of the
unboxed forms is now a clear one.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import lucid

F64 = jnp.float64
TOL = dict(rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------- models
class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.fc1 = nnx.Linear(4, 6, rngs=rngs, dtype=F64, param_dtype=F64)
        self.fc2 = nnx.Linear(6, 3, rngs=rngs, dtype=F64, param_dtype=F64)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(jax.nn.tanh(self.fc1(x)))


def nnx_model():
    model = MLP(nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    return model, graphdef, state


def torch_mlp(state) -> torch.nn.Module:
    """torch's twin of the nnx MLP: its weights are nnx's kernels transposed."""
    net = torch.nn.Sequential()
    net.fc1 = torch.nn.Linear(4, 6).double()
    net.fc2 = torch.nn.Linear(6, 3).double()
    with torch.no_grad():
        for name in ("fc1", "fc2"):
            layer = getattr(net, name)
            layer.weight.copy_(torch.tensor(np.asarray(leaf(state[name]["kernel"])).T))
            layer.bias.copy_(torch.tensor(np.asarray(leaf(state[name]["bias"]))))
    return net


def torch_mlp_forward(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return net.fc2(torch.tanh(net.fc1(x)))


def mlp_weights_as_torch(values) -> dict[str, np.ndarray]:
    out = {}
    for name in ("fc1", "fc2"):
        out[f"{name}.weight"] = np.asarray(leaf(values[name]["kernel"])).T
        out[f"{name}.bias"] = np.asarray(leaf(values[name]["bias"]))
    return out


class ConvNet(eqx.Module):
    conv: eqx.nn.Conv2d
    fc: eqx.nn.Linear

    def __init__(self, key: jax.Array) -> None:
        k1, k2 = jax.random.split(key)
        self.conv = eqx.nn.Conv2d(1, 2, 3, key=k1, dtype=F64)
        self.fc = eqx.nn.Linear(18, 3, key=k2, dtype=F64)

    def __call__(self, x: jax.Array) -> jax.Array:  # one image (1, 5, 5)
        return self.fc(jax.nn.relu(self.conv(x)).reshape(-1))


def torch_convnet(model: ConvNet) -> torch.nn.Module:
    """torch's twin: equinox's conv bias is (out, 1, 1), torch's (out,)."""
    net = torch.nn.Sequential()
    net.conv = torch.nn.Conv2d(1, 2, 3).double()
    net.fc = torch.nn.Linear(18, 3).double()
    with torch.no_grad():
        net.conv.weight.copy_(torch.tensor(np.asarray(model.conv.weight)))
        net.conv.bias.copy_(torch.tensor(np.asarray(model.conv.bias).reshape(-1)))
        net.fc.weight.copy_(torch.tensor(np.asarray(model.fc.weight)))
        net.fc.bias.copy_(torch.tensor(np.asarray(model.fc.bias)))
    return net


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)
    return -picked.mean()


def leaf(variable):
    """An nnx variable's one value (its array, or its Parameter once boxed), in every
    flax version (no deprecated ``.value``)."""
    return jax.tree_util.tree_leaves(variable, is_leaf=lambda x: isinstance(x, lucid.Parameter))[0]


def data(seed: int, *shape: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape)


# ------------------------------------------------------------------ the nnx loop
_, GRAPHDEF, _ = nnx_model()


def nnx_loss(state, x, y):
    return ((nnx.merge(GRAPHDEF, state)(x) - y) ** 2).mean()


@pytest.mark.parametrize("form", ["eager", "compiled", "fused"])
def test_nnx_mlp_trains_as_torch_in_two_weight_decay_groups_by_name(form):
    model, _, state = nnx_model()
    boxed = lucid.parameters(state)
    named = lucid.named_parameters(boxed)
    assert [name for name, _ in named] == ["fc1.bias", "fc1.kernel", "fc2.bias", "fc2.kernel"]
    net = torch_mlp(state)
    torch_named = dict(net.named_parameters())
    # nanoGPT's split: matrices decay, vectors do not (chosen by name and rank)
    decay = [(n, p) for n, p in named if p.ndim >= 2]
    no_decay = [(n, p) for n, p in named if p.ndim < 2]
    opt = lucid.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=0.05,
    )
    assert opt.param_groups[0]["param_names"] == ["fc1.kernel", "fc2.kernel"]

    def torch_name(name: str) -> str:
        return name.replace("kernel", "weight")

    ref = torch.optim.AdamW(
        [
            {"params": [torch_named[torch_name(n)] for n, _ in decay], "weight_decay": 0.1},
            {"params": [torch_named[torch_name(n)] for n, _ in no_decay], "weight_decay": 0.0},
        ],
        lr=0.05,
    )
    fused = None
    if form == "compiled":
        lucid.compile_optimizer(opt)
    if form == "fused":
        clip = lucid.functional.clip_grad_norm(max_norm=0.5)
        fused = lucid.fused_step(nnx_loss, opt, grad_transform=clip)
    for step in range(3):
        x, y = data(step, 5, 4), data(10 + step, 5, 3)
        ref.zero_grad()
        torch_loss = ((torch_mlp_forward(net, torch.tensor(x)) - torch.tensor(y)) ** 2).mean()
        torch_loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        ref.step()
        if fused is not None:
            loss = fused(boxed, jnp.asarray(x), jnp.asarray(y))
        else:
            opt.zero_grad()
            loss = lucid.backward(nnx_loss, boxed, jnp.asarray(x), jnp.asarray(y))
            lucid.nn.utils.clip_grad_norm_(boxed, 0.5)  # the boxed tree, directly
            opt.step()
        np.testing.assert_allclose(float(loss), torch_loss.item(), **TOL)
    got = mlp_weights_as_torch(lucid.values(boxed))
    for name, p in net.named_parameters():
        np.testing.assert_allclose(got[name], p.detach().numpy(), **TOL)
    # back into the model, for inference (lucid.values, not the boxed tree)
    nnx.update(model, lucid.values(boxed))
    x = data(99, 2, 4)
    np.testing.assert_allclose(
        np.asarray(model(jnp.asarray(x))),
        torch_mlp_forward(net, torch.tensor(x)).detach().numpy(),
        **TOL,
    )


# -------------------------------------------------------------- the equinox loop
def eqx_loss(model, x, labels):
    return cross_entropy(jax.vmap(model)(x), labels)


@pytest.mark.parametrize("form", ["eager", "compiled", "fused"])
def test_equinox_convnet_trains_as_torch_with_adadelta(form):
    model = ConvNet(jax.random.PRNGKey(1))
    boxed = lucid.parameters(model)
    names = [name for name, _ in lucid.named_parameters(boxed)]
    assert names == ["conv.weight", "conv.bias", "fc.weight", "fc.bias"]
    net = torch_convnet(model)
    opt = lucid.optim.Adadelta(boxed, lr=1.0)  # the boxed model, directly
    assert opt.param_groups[0]["param_names"] == names
    ref = torch.optim.Adadelta(net.parameters(), lr=1.0)
    fused = lucid.fused_step(eqx_loss, opt) if form == "fused" else None
    if form == "compiled":
        lucid.compile_optimizer(opt)
    for step in range(3):
        x = data(step, 4, 1, 5, 5)
        labels = np.random.default_rng(step).integers(0, 3, 4)
        ref.zero_grad()
        torch_loss = torch.nn.functional.cross_entropy(
            net.fc(torch.relu(net.conv(torch.tensor(x))).flatten(1)), torch.tensor(labels)
        )
        torch_loss.backward()
        ref.step()
        if fused is not None:
            loss = fused(boxed, jnp.asarray(x), jnp.asarray(labels))
        else:
            opt.zero_grad()
            loss = lucid.backward(eqx_loss, boxed, jnp.asarray(x), jnp.asarray(labels))
            opt.step()
        np.testing.assert_allclose(float(loss), torch_loss.item(), **TOL)
    trained = lucid.values(boxed)  # an equinox model again (activations left as they were)
    assert isinstance(trained, ConvNet)
    np.testing.assert_allclose(
        np.asarray(trained.conv.bias).reshape(-1), net.conv.bias.detach().numpy(), **TOL
    )
    np.testing.assert_allclose(np.asarray(trained.fc.weight), net.fc.weight.detach().numpy(), **TOL)


# ----------------------------------------------------- boxing, names and values
def test_parameters_boxes_inexact_arrays_only_and_values_unboxes():
    tree = {
        "w": jnp.ones((2, 2), F64),
        "count": jnp.array(3),  # an integer array stays an array
        "scale": 0.5,  # a Python number stays as it is
        "h": [{"b": np.zeros(2)}],
    }
    boxed = lucid.parameters(tree)
    assert isinstance(boxed["w"], lucid.Parameter)
    assert isinstance(boxed["h"][0]["b"], lucid.Parameter)
    assert not isinstance(boxed["count"], lucid.Parameter) and boxed["scale"] == 0.5
    assert [n for n, _ in lucid.named_parameters(boxed)] == ["h.0.b", "w"]
    assert lucid.parameters(boxed)["w"] is boxed["w"]  # boxing twice changes nothing
    back = lucid.values(boxed)
    assert isinstance(back["w"], jax.Array) and back["count"] is tree["count"]
    np.testing.assert_array_equal(np.asarray(back["w"]), np.ones((2, 2)))


def test_named_parameters_lists_a_tied_parameter_once_as_torch():
    w = lucid.Parameter(jnp.ones(2))
    assert lucid.named_parameters({"a": w, "b": w}) == [("a", w)]
    tied = torch.nn.Module()
    tied.a = torch.nn.Parameter(torch.ones(2))
    tied.b = tied.a
    assert [n for n, _ in tied.named_parameters()] == ["a"]


def test_flax_linen_param_dict_names():
    import flax.linen as nn

    variables = nn.Dense(3).init(jax.random.PRNGKey(0), jnp.ones((1, 2)))
    boxed = lucid.parameters(variables)
    assert [n for n, _ in lucid.named_parameters(boxed)] == ["params.bias", "params.kernel"]
    opt = lucid.optim.SGD(boxed, lr=0.1)
    loss = lucid.backward(lambda v, x: nn.Dense(3).apply(v, x).sum(), boxed, jnp.ones((1, 2)))
    opt.step()
    assert np.isfinite(float(loss))
    np.testing.assert_allclose(
        np.asarray(lucid.values(boxed)["params"]["bias"]), -0.1 * np.ones(3), rtol=1e-6
    )


def test_add_param_group_takes_a_boxed_tree_with_names():
    first = lucid.parameters({"a": jnp.ones(2)})
    opt = lucid.optim.SGD(first, lr=0.1)
    opt.add_param_group({"params": lucid.parameters({"b": jnp.ones(3)}), "lr": 0.01})
    assert [g["param_names"] for g in opt.param_groups] == [["a"], ["b"]]


def test_averaged_model_of_a_boxed_nnx_state_names_entries_as_torch():
    _, _, state = nnx_model()
    boxed = lucid.parameters(state)
    averaged = lucid.optim.swa_utils.AveragedModel(boxed)
    keys = [k for k in averaged.state_dict() if k != "n_averaged"]
    assert keys == ["module.fc1.bias", "module.fc1.kernel", "module.fc2.bias", "module.fc2.kernel"]


# -------------------------------------------------------- clear errors, tested
def test_unboxed_pytrees_are_refused_with_the_way_to_box_them():
    _, _, state = nnx_model()
    w0 = np.asarray(leaf(state["fc1"]["kernel"])).copy()
    with pytest.raises(TypeError, match=r"lucid\.parameters\(tree\)"):
        lucid.optim.AdamW(state, lr=0.1)
    with pytest.raises(TypeError, match=r"lucid\.parameters\(tree\)"):
        lucid.nn.utils.clip_grad_norm_(state, 1.0)
    with pytest.raises(TypeError, match=r"lucid\.parameters\(tree\)"):
        lucid.nn.utils.clip_grad_value_(state, 1.0)
    with pytest.raises(TypeError, match=r"lucid\.parameters\(tree\)"):
        lucid.named_parameters(state)
    with pytest.raises(TypeError, match=r"lucid\.parameters\(tree\)"):
        lucid.optim.swa_utils.AveragedModel(state)
    with pytest.raises(ValueError, match=r"lucid\.parameters\(tree\)"):
        lucid.backward(nnx_loss, state, jnp.ones((1, 4), F64), jnp.ones((1, 3), F64))
    with pytest.raises(TypeError, match=r"lucid\.parameters\(tree\)"):
        lucid.optim.SGD([jnp.ones(2)], lr=0.1)  # arrays in a list
    with pytest.raises(TypeError, match=r"pass a list of groups"):
        lucid.optim.SGD({"params": [lucid.Parameter(jnp.ones(2))], "lr": 0.1}, lr=0.1)
    with pytest.raises(TypeError, match=r"pass a list of groups"):  # a boxed tree in a group
        lucid.optim.SGD({"params": lucid.parameters(state), "lr": 0.1}, lr=0.1)
    np.testing.assert_array_equal(np.asarray(leaf(state["fc1"]["kernel"])), w0)


def test_backward_and_step_under_jit_raise_a_clear_type_error():
    w = lucid.Parameter(jnp.array([1.0, 2.0]))
    opt = lucid.optim.SGD([w], lr=0.1)

    @jax.jit
    def step(x):
        lucid.backward(lambda w, x: (w * x).sum(), w, x)
        opt.step()

    with pytest.raises(TypeError, match=r"runs outside jit.*fused_step.*lucid\.functional"):
        step(jnp.ones(2))
    assert w.grad is None and w.data.tolist() == [1.0, 2.0]
    fused = lucid.fused_step(lambda w, x: (w * x).sum(), opt)
    with pytest.raises(TypeError, match=r"runs outside jit"):
        jax.jit(lambda x: fused(w, x))(jnp.ones(2))
    assert w.data.tolist() == [1.0, 2.0]


# ------------------------------------------------------------------ has_aux
def test_backward_has_aux_returns_the_pair_as_value_and_grad():
    _, _, state = nnx_model()
    boxed = lucid.parameters(state)
    x, y = jnp.asarray(data(0, 5, 4)), jnp.asarray(data(1, 5, 3))

    def with_logits(state, x, y):
        logits = nnx.merge(GRAPHDEF, state)(x)
        return ((logits - y) ** 2).mean(), logits

    loss, logits = lucid.backward(with_logits, boxed, x, y, has_aux=True)
    (ref_loss, ref_logits), ref_grads = jax.value_and_grad(with_logits, has_aux=True)(state, x, y)
    np.testing.assert_allclose(float(loss), float(ref_loss), **TOL)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), **TOL)
    np.testing.assert_allclose(
        np.asarray(leaf(boxed["fc1"]["kernel"]).grad),
        np.asarray(leaf(ref_grads["fc1"]["kernel"])),
        **TOL,
    )
    with pytest.raises(TypeError, match=r"pair \(loss, aux\)"):
        lucid.backward(nnx_loss, boxed, x, y, has_aux=True)


def test_fused_step_has_aux_returns_the_aux_before_the_update():
    _, _, state = nnx_model()
    boxed = lucid.parameters(state)
    x, y = jnp.asarray(data(0, 5, 4)), jnp.asarray(data(1, 5, 3))
    expected = nnx.merge(GRAPHDEF, lucid.values(boxed))(x)

    def with_logits(state, x, y):
        logits = nnx.merge(GRAPHDEF, state)(x)
        return ((logits - y) ** 2).mean(), {"logits": logits}

    opt = lucid.optim.SGD(boxed, lr=0.1)
    loss, aux = lucid.fused_step(with_logits, opt, has_aux=True)(boxed, x, y)
    np.testing.assert_allclose(np.asarray(aux["logits"]), np.asarray(expected), **TOL)
    np.testing.assert_allclose(float(loss), float(nnx_loss(state, x, y)), **TOL)


# --------------------------------------------------------- gradient accumulation
@pytest.mark.parametrize("in_steps", [False, True])
def test_fused_accumulation_matches_torchs_accumulation_loop(in_steps):
    """torch: zero_grad; N x (loss / N).backward(); step. lucid: one fused call over a
    leading micro-batch axis. `in_steps`: an optimizer parameter the loss does not take
    sends the fused step down its backward + step path, which must agree too."""
    n = 3
    _, _, state = nnx_model()
    boxed = lucid.parameters(state)
    net = torch_mlp(state)
    extra = lucid.Parameter(jnp.ones(2, F64))
    torch_extra = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    params = lucid.named_parameters(boxed) + ([("extra", extra)] if in_steps else [])
    torch_params = list(net.parameters()) + ([torch_extra] if in_steps else [])
    opt = lucid.optim.SGD(params, lr=0.1, momentum=0.9)
    ref = torch.optim.SGD(
        [dict(net.named_parameters())[n.replace("kernel", "weight")] for n, _ in params[:4]]
        + torch_params[4:],
        lr=0.1,
        momentum=0.9,
    )

    def with_aux(state, x, y):
        return nnx_loss(state, x, y), x.sum()

    fused = lucid.fused_step(with_aux, opt, accumulate=n, has_aux=True)
    for step in range(2):
        xs, ys = data(step, n, 2, 4), data(20 + step, n, 2, 3)
        ref.zero_grad()
        total = 0.0
        for i in range(n):
            loss_i = (torch_mlp_forward(net, torch.tensor(xs[i])) - torch.tensor(ys[i])) ** 2
            loss_i = loss_i.mean() / n
            loss_i.backward()
            total += loss_i.item()
        ref.step()
        loss, sums = fused(boxed, jnp.asarray(xs), jnp.asarray(ys))
        np.testing.assert_allclose(float(loss), total, **TOL)
        np.testing.assert_allclose(np.asarray(sums), xs.sum(axis=(1, 2)), **TOL)
    got = mlp_weights_as_torch(lucid.values(boxed))
    for name, p in net.named_parameters():
        np.testing.assert_allclose(got[name], p.detach().numpy(), **TOL)
    np.testing.assert_array_equal(np.asarray(extra.data), torch_extra.detach().numpy())


def test_fused_accumulation_refuses_data_without_the_micro_batch_axis():
    w = lucid.Parameter(jnp.array([1.0, 2.0]))
    opt = lucid.optim.SGD([w], lr=0.1)
    fused = lucid.fused_step(lambda w, x: (w * x).sum(), opt, accumulate=3)
    with pytest.raises(ValueError, match=r"leading micro-batch axis of size 3"):
        fused(w, jnp.ones((2, 2)))
    assert w.data.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"accumulate must be a positive int"):
        lucid.fused_step(lambda w: w.sum(), opt, accumulate=0)


def test_fused_has_aux_in_steps_agrees_with_the_one_executable():
    """An optimizer parameter the loss does not take sends the fused step down its
    backward + step path; its (loss, aux) and update are those of the one executable."""
    x, y = jnp.asarray(data(0, 5, 4)), jnp.asarray(data(1, 5, 3))

    def with_logits(state, x, y):
        logits = nnx.merge(GRAPHDEF, state)(x)
        return ((logits - y) ** 2).mean(), logits

    results = []
    for extra in (False, True):
        _, _, state = nnx_model()
        boxed = lucid.parameters(state)
        params = lucid.named_parameters(boxed)
        if extra:
            params.append(("unused", lucid.Parameter(jnp.ones(2, F64))))
        opt = lucid.optim.Adam(params, lr=0.1)
        loss, logits = lucid.fused_step(with_logits, opt, has_aux=True)(boxed, x, y)
        results.append((float(loss), np.asarray(logits), lucid.values(boxed)))
    (loss0, logits0, values0), (loss1, logits1, values1) = results
    np.testing.assert_allclose(loss1, loss0, **TOL)
    np.testing.assert_allclose(logits1, logits0, **TOL)
    for a, b in zip(mlp_weights_as_torch(values0).values(), mlp_weights_as_torch(values1).values()):
        np.testing.assert_allclose(b, a, **TOL)
