"""pyxtts.Block: one pre-LN GPT-2 block (optionally with cross-attention) against a
float64 PyTorch re-implementation, checkpoint policies, the arena, OOM, bad inputs, leaks."""
from __future__ import annotations

import gc
import math
import sys

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="torch, these tests' reference (the README's test command installs it)")

import pyxtts  # noqa: E402
from conftest import requires_cuda  # noqa: E402
from helpers.torch_ref import BLOCK_PARAMS, CROSS_PARAMS, block_shapes, ref_block  # noqa: E402
from pyxtts.testing import inject_oom  # noqa: E402

POLICIES = ["none", "selective", "full"]
# fp32 against float64: every output element is a chain of a few fp32 dot products
# (length <= 4C = 256, or B*T rows for weight gradients) through layernorm, softmax and
# GELU; each step adds a few units of roundoff (6e-8) times sqrt(length), so the error
# stays ~1e-6 of the tensor's largest element. 1e-5 leaves 10x margin and still
# catches any wrong mask, index or transpose (those are O(1) of the scale).
RTOL = 1e-5


@pytest.fixture(autouse=True)
def clean_allocator():
    inject_oom(None, "cpu")
    pyxtts.set_memory_limit(None, "cpu")
    yield
    inject_oom(None, "cpu")
    pyxtts.set_memory_limit(None, "cpu")


def randomize(block, rng):
    """Random parameters everywhere (biases and gains too), so every path matters."""
    for name, t in block.parameters().items():
        if name.endswith(".weight") and t.ndim == 1:
            v = 1 + 0.2 * rng.standard_normal(t.shape)
        elif t.ndim == 1:
            v = 0.1 * rng.standard_normal(t.shape)
        else:
            v = rng.standard_normal(t.shape) / math.sqrt(t.shape[0])
        t.copy_(v.astype(np.float32))


def state(block):
    return {k: v.numpy() for k, v in block.parameters().items()}


def grads(block):
    return {k: v.numpy() for k, v in block.gradients().items()}


# ---- the float64 reference ------------------------------------------------------

def reference(block, x, dy, **kw):
    """float64 y, dx, dcontext (or None) and parameter gradients."""
    params = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in state(block).items()}
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    ctx = kw.pop("context", None)
    ct = None if ctx is None else torch.tensor(ctx, dtype=torch.float64, requires_grad=True)
    y = ref_block(params, xt, block.n_heads, context=ct, **kw)
    y.backward(torch.tensor(dy, dtype=torch.float64))
    return (y.detach().numpy(), xt.grad.numpy(), None if ct is None else ct.grad.numpy(),
            {k: p.grad.numpy() for k, p in params.items()})


def assert_close(got, want, name, rtol=RTOL):
    """Max error within rtol of the tensor's largest element (elements near zero are
    judged against the scale, not against themselves)."""
    got = np.asarray(got, dtype=np.float64)
    scale = np.abs(want).max()
    err = np.abs(got - want).max()
    assert err <= rtol * max(scale, 1e-30), f"{name}: max error {err:.3g} vs scale {scale:.3g}"


def inputs(rng, B=3, T=13, C=32, Tc=9, cross=False, holes=True):
    """x, dy, a key mask with holes (sample 1 loses key 0, so under causal its first query
    sees nothing), a context with padded ends and one sample with no context at all."""
    x = rng.standard_normal((B, T, C)).astype(np.float32)
    dy = rng.standard_normal((B, T, C)).astype(np.float32)
    km = np.ones((B, T), dtype=bool)
    if holes:
        km[1, [0, T // 3, T // 3 + 1]] = False
        km[-1, T - 3:] = False
    kw = {"key_mask": km}
    if cross:
        kw["context"] = rng.standard_normal((B, Tc, C)).astype(np.float32)
        cm = np.ones((B, Tc), dtype=np.int32)
        cm[0, Tc - Tc // 2:] = 0
        if B > 2:
            cm[2, :] = 0  # no context at all: cross-attention rows are zeros
        kw["context_mask"] = cm
    return x, dy, kw


def run(block, x, dy, **kw):
    y = block.forward(x, **kw).numpy()
    out = block.backward(dy)
    if block.cross_attention:
        dx, dc = out
        return y, dx.numpy(), dc.numpy()
    return y, out.numpy(), None


# ---- parameters ---------------------------------------------------------------------

@pytest.mark.parametrize("cross", [False, True], ids=["plain", "cross"])
def test_parameter_names_shapes_and_initialisation(cross):
    C = 128
    b = pyxtts.Block(C, 4, cross_attention=cross, seed=5)
    want = block_shapes(C, cross)
    p = b.parameters()
    assert list(p) == BLOCK_PARAMS + (CROSS_PARAMS if cross else [])
    assert {k: v.shape for k, v in p.items()} == want
    assert {k: v.shape for k, v in b.gradients().items()} == want
    assert b.num_parameters == sum(math.prod(s) for s in want.values())
    sd = state(b)
    for k, v in sd.items():
        if v.ndim == 2:
            assert abs(v.std() - 0.02) < 0.001 and abs(v.mean()) < 0.001, k
        elif k.endswith(".weight"):
            assert np.all(v == 1), k
        else:
            assert np.all(v == 0), k
    assert all(np.all(g == 0) for g in grads(b).values())
    again, other = state(pyxtts.Block(C, 4, cross_attention=cross, seed=5)), state(pyxtts.Block(C, 4, seed=6))
    assert all(np.array_equal(sd[k], again[k]) for k in sd)
    assert not np.array_equal(sd["attn.c_attn.weight"], other["attn.c_attn.weight"])
    if cross:  # the plain part is the plain block of the same seed
        plain = state(pyxtts.Block(C, 4, seed=5))
        assert all(np.array_equal(sd[k], plain[k]) for k in BLOCK_PARAMS)
    assert (b.d_model, b.n_heads, b.cross_attention, b.device, b.checkpointing) == (C, 4, cross, "cpu", "none")
    assert b.dtype == pyxtts.float32 and b.layer_norm_eps == pytest.approx(1e-5)
    assert repr(b).startswith(f"Block(d_model={C}, n_heads=4, cross_attention={cross}")


def test_views_write_through_and_zero_grad(rng):
    b = pyxtts.Block(16, 2)
    w = rng.standard_normal((16, 48)).astype(np.float32)
    b.parameters()["attn.c_attn.weight"].copy_(w)
    assert np.array_equal(b.parameters()["attn.c_attn.weight"].numpy(), w)
    x, dy, _ = inputs(rng, B=2, T=5, C=16, holes=False)
    b.forward(x)
    b.backward(dy)
    assert any(np.any(g != 0) for g in grads(b).values())
    b.zero_grad()
    assert all(np.all(g == 0) for g in grads(b).values())


# ---- against PyTorch ------------------------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("cross", [False, True], ids=["plain", "cross"])
def test_matches_pytorch(cross, policy, rng, seed):
    b = pyxtts.Block(32, 4, cross_attention=cross, checkpointing=policy, seed=seed)
    randomize(b, rng)
    x, dy, kw = inputs(rng, cross=cross)
    y, dx, dc = run(b, x, dy, **kw)
    ry, rdx, rdc, rg = reference(b, x, dy, **kw)
    assert_close(y, ry, f"y (seed {seed})")
    assert_close(dx, rdx, f"dx (seed {seed})")
    if cross:
        assert_close(dc, rdc, f"dcontext (seed {seed})")
        assert np.all(dc[0, -(9 // 2):] == 0), "padded context rows get no gradient"
        assert np.all(dc[2] == 0), "a sample with no context gets no context gradient"
    for k, g in grads(b).items():
        assert_close(g, rg[k], f"grad {k} (seed {seed})")
    # the query that sees no key (sample 1, row 0) and masked keys: finite, no NaN anywhere
    assert np.isfinite(y).all() and np.isfinite(dx).all()


@pytest.mark.parametrize("cross", [False, True], ids=["plain", "cross"])
def test_non_causal_without_masks_and_tensor_inputs(cross, rng, seed):
    b = pyxtts.Block(48, 3, cross_attention=cross, checkpointing="selective", seed=seed)
    randomize(b, rng)
    x, dy, kw = inputs(rng, B=2, T=7, C=48, Tc=11, cross=cross, holes=False)
    kw.pop("key_mask")
    kw.pop("context_mask", None)
    targs = {k: pyxtts.tensor(v) for k, v in kw.items()}
    y = b.forward(pyxtts.tensor(x), causal=False, **targs).numpy()
    out = b.backward(pyxtts.tensor(dy))
    dx = (out[0] if cross else out).numpy()
    ry, rdx, rdc, rg = reference(b, x, dy, causal=False, **kw)
    assert_close(y, ry, f"y (seed {seed})")
    assert_close(dx, rdx, f"dx (seed {seed})")
    if cross:
        assert_close(out[1].numpy(), rdc, f"dcontext (seed {seed})")
    for k, g in grads(b).items():
        assert_close(g, rg[k], f"grad {k} (seed {seed})")


def test_gradients_accumulate_and_outputs_are_arena_views(rng):
    b = pyxtts.Block(32, 4, cross_attention=True)
    x, dy, kw = inputs(rng, cross=True)
    y1, dx1, dc1 = run(b, x, dy, **kw)
    g1 = grads(b)
    y_view = b.forward(x, **kw)
    dx_view, dc_view = b.backward(dy)
    assert np.array_equal(y_view.numpy(), y1), "same input, same output"
    assert np.array_equal(dx_view.numpy(), dx1) and np.array_equal(dc_view.numpy(), dc1)
    for k, g in grads(b).items():
        np.testing.assert_allclose(g, 2 * g1[k], rtol=1e-6, atol=1e-7 * np.abs(g1[k]).max(), err_msg=k)
    # y survives the backward; the next forward reuses its slot
    b.forward(np.zeros_like(x), **kw)
    assert not np.array_equal(y_view.numpy(), y1)


def test_odd_layouts_of_numpy_inputs(rng):
    b = pyxtts.Block(16, 2, seed=1)
    x, dy, _ = inputs(rng, B=2, T=6, C=16, holes=False)
    y = b.forward(x).numpy()
    b.backward(dy)
    wide = np.zeros((2, 12, 16), np.float32)
    wide[:, ::2] = x
    assert np.array_equal(b.forward(wide[:, ::2]).numpy(), y)  # strided view
    b.backward(dy)
    assert np.array_equal(b.forward(x.astype(">f4")).numpy(), y)  # big-endian
    b.backward(dy)
    assert np.array_equal(b.forward(torch.from_numpy(x)).numpy(), y)  # anything NumPy can view
    b.backward(dy)
    km = np.ones((2, 6), dtype=np.int64)
    assert np.array_equal(b.forward(x, key_mask=km).numpy(), y)  # integer masks, all ones
    b.backward(dy)


# ---- checkpointing -------------------------------------------------------------------------

@pytest.mark.parametrize("cross", [False, True], ids=["plain", "cross"])
def test_policies_give_bit_identical_results(cross, rng):
    x, dy, kw = inputs(rng, B=2, T=37, C=64, Tc=21, cross=cross)
    results = []
    for policy in POLICIES:
        b = pyxtts.Block(64, 4, cross_attention=cross, checkpointing=policy, seed=11)
        results.append((run(b, x, dy, **kw), grads(b)))
    (y0, dx0, dc0), g0 = results[0]
    for (y, dx, dc), g in results[1:]:
        assert np.array_equal(y, y0) and np.array_equal(dx, dx0)
        assert dc is None or np.array_equal(dc, dc0)
        assert all(np.array_equal(g[k], g0[k]) for k in g0)


def test_policy_change_applies_to_the_next_forward(rng):
    x, dy, kw = inputs(rng, cross=True)
    ref = pyxtts.Block(32, 4, cross_attention=True, seed=2)
    want = run(ref, x, dy, **kw)
    b = pyxtts.Block(32, 4, cross_attention=True, seed=2)
    b.forward(x, **kw)
    b.checkpointing = "full"  # the pending backward keeps the policy its forward saved for
    dx, dc = b.backward(dy)
    assert np.array_equal(dx.numpy(), want[1]) and np.array_equal(dc.numpy(), want[2])
    assert b.checkpointing == "full"
    assert b.estimate_memory(3, 13, 9)["checkpointing"] == "full"
    assert np.array_equal(run(b, x, dy, **kw)[0], want[0])
    with pytest.raises(ValueError, match="checkpointing.*'auto'"):
        b.checkpointing = "auto"
    with pytest.raises(TypeError, match="checkpointing"):
        b.checkpointing = 3
    assert b.checkpointing == "full"


@pytest.mark.parametrize("cross", [False, True], ids=["plain", "cross"])
def test_saved_bytes_shrink_with_the_policy(cross):
    Tc = 40 if cross else 0
    est = {p: pyxtts.Block(64, 4, cross_attention=cross, checkpointing=p).estimate_memory(4, 50, Tc)
           for p in POLICIES}
    assert est["none"]["saved"] > est["selective"]["saved"] > est["full"]["saved"] == 0
    assert est["none"]["work"] == 0 < est["selective"]["work"] < est["full"]["work"]
    N, C, es = 4 * 50, 64, 4
    ln_outputs = (3 if cross else 2) * N * C * es  # recomputed by selective, with GELU (N, 4C)
    assert est["none"]["saved"] - est["selective"]["saved"] == ln_outputs + N * 4 * C * es


# ---- the arena ---------------------------------------------------------------------------

@pytest.mark.parametrize("cross", [False, True], ids=["plain", "cross"])
def test_arena_is_planned_exactly_and_reused(cross, rng):
    gc.collect()
    before = pyxtts.memory_allocated("cpu")
    b = pyxtts.Block(32, 4, cross_attention=cross, checkpointing="selective")
    assert b.arena_bytes == 0
    x, dy, kw = inputs(rng, cross=cross)
    Tc = 9 if cross else 0
    est = b.estimate_memory(3, 13, Tc)
    parts = ["inputs", "output", "saved", "activation_gradients", "work", "attention_workspace",
             "gemm_workspace", "reduce_workspace"]
    assert sum(est[k] for k in parts) == est["arena"]
    run(b, x, dy, **kw)
    assert b.arena_bytes == est["arena"]
    assert pyxtts.memory_allocated("cpu") - before == est["total"]
    s0 = pyxtts.memory_stats("cpu")
    for _ in range(3):
        run(b, x, dy, **kw)
    s1 = pyxtts.memory_stats("cpu")
    assert s1["num_allocs"] == s0["num_allocs"], "forward/backward of a known shape allocates nothing"
    assert s1["allocated_bytes"] == s0["allocated_bytes"]
    # a new shape: one new arena, planned exactly again
    x2, dy2, kw2 = inputs(rng, B=2, T=20, cross=cross, Tc=5)
    run(b, x2, dy2, **kw2)
    assert b.arena_bytes == b.estimate_memory(2, 20, 5 if cross else 0)["arena"]
    assert pyxtts.memory_stats("cpu")["num_allocs"] == s1["num_allocs"] + 1
    assert b.release_arena() == b.estimate_memory(2, 20, 5 if cross else 0)["arena"]
    assert b.arena_bytes == 0
    with pytest.raises(RuntimeError, match="forward"):
        b.backward(dy2)
    del b
    gc.collect()
    assert pyxtts.memory_allocated("cpu") == before


def test_oom_on_the_first_forward_changes_nothing(rng):
    b = pyxtts.Block(32, 4, cross_attention=True)
    randomize(b, rng)
    x, dy, kw = inputs(rng, cross=True)
    p0, g0 = state(b), grads(b)
    gc.collect()
    a0 = pyxtts.memory_allocated("cpu")
    ooms = pyxtts.memory_stats("cpu")["num_ooms"]
    inject_oom(0, "cpu")
    with pytest.raises(pyxtts.OutOfMemoryError, match="out of memory"):
        b.forward(x, **kw)
    assert pyxtts.memory_stats("cpu")["num_ooms"] == ooms + 1
    assert pyxtts.memory_allocated("cpu") == a0
    assert b.arena_bytes == 0
    assert all(np.array_equal(state(b)[k], p0[k]) for k in p0)
    assert all(np.array_equal(grads(b)[k], g0[k]) for k in g0)
    with pytest.raises(RuntimeError, match="forward"):
        b.backward(dy)
    # and the block works afterwards, as if nothing had happened
    y, dx, dc = run(b, x, dy, **kw)
    ry, rdx, rdc, _ = reference(b, x, dy, **kw)
    assert_close(y, ry, "y")
    assert_close(dx, rdx, "dx")
    assert_close(dc, rdc, "dcontext")


def test_oom_on_a_bigger_shape_keeps_parameters_and_gradients(rng):
    b = pyxtts.Block(32, 4)
    x, dy, kw = inputs(rng)
    run(b, x, dy, **kw)
    p0, g0 = state(b), grads(b)
    gc.collect()
    pyxtts.empty_cache("cpu")
    a0 = pyxtts.memory_allocated("cpu")
    big = np.zeros((8, 1000, 32), np.float32)  # a large-pool arena: a segment of its own
    need = b.estimate_memory(8, 1000)["arena"]
    pyxtts.set_memory_limit(pyxtts.memory_reserved("cpu") + need // 2, "cpu")
    with pytest.raises(pyxtts.OutOfMemoryError):
        b.forward(big)
    assert pyxtts.memory_allocated("cpu") <= a0  # at most the old arena (a cache) was handed back
    assert all(np.array_equal(state(b)[k], p0[k]) for k in p0)
    assert all(np.array_equal(grads(b)[k], g0[k]) for k in g0)
    pyxtts.set_memory_limit(None, "cpu")
    # a one-shot failure with the old arena held: it is handed back and the request retried
    run(b, x, dy, **kw)
    inject_oom(0, "cpu")
    y = b.forward(big)
    assert y.shape == (8, 1000, 32) and b.arena_bytes == need


# ---- bad inputs ----------------------------------------------------------------------------

def test_constructor_rejects_bad_arguments():
    cases = [
        (dict(d_model=0, n_heads=1), ValueError, "d_model"),
        (dict(d_model=32, n_heads=5), ValueError, "n_heads.*32.*5"),
        (dict(d_model=32, n_heads=0), ValueError, "n_heads"),
        (dict(d_model=32, n_heads=4, checkpointing="auto"), ValueError, "checkpointing.*'auto'"),
        (dict(d_model=32, n_heads=4, checkpointing=None), TypeError, "checkpointing"),
        (dict(d_model=32, n_heads=4, layer_norm_eps=0.0), ValueError, "layer_norm_eps"),
        (dict(d_model=32, n_heads=4, layer_norm_eps=float("nan")), ValueError, "layer_norm_eps"),
        (dict(d_model=32, n_heads=4, layer_norm_eps=1e-46), ValueError, r"float32\), got 1e-46$"),  # 0 in float32
        (dict(d_model=32, n_heads=4, seed=-1), ValueError, "seed"),
        (dict(d_model=32, n_heads=4, seed=1.5), TypeError, "seed"),
        (dict(d_model=32, n_heads=4, device="tpu"), ValueError, "device"),
        (dict(d_model="32", n_heads=4), TypeError, "integer"),
    ]
    for kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            pyxtts.Block(**kw)
    with pytest.raises(RuntimeError, match="twice"):
        pyxtts.Block(8, 2).__init__(8, 2)


def bad_forward_cases(B=3, T=13, C=32, Tc=9):
    x = np.zeros((B, T, C), np.float32)
    ctx = np.zeros((B, Tc, C), np.float32)
    nan = x.copy()
    nan[1, 2, 3] = np.nan
    inf = ctx.copy()
    inf[0, 0, 0] = np.inf
    plain = [
        (dict(x=None), TypeError, "x: expected a float32"),
        (dict(x="abc"), TypeError, "x: expected dtype float32"),
        (dict(x=x.astype(np.float64)), TypeError, "x: expected dtype float32, got dtype\\('float64'\\)"),
        (dict(x=pyxtts.tensor(x).to(dtype=pyxtts.bfloat16)), TypeError, "x: expected dtype float32, got bfloat16"),
        (dict(x=x[0]), ValueError, r"x: expected shape \(\*, \*, 32\), got \(13, 32\)"),
        (dict(x=np.zeros((B, T, C + 1), np.float32)), ValueError, r"x: expected shape \(\*, \*, 32\), got \(3, 13, 33\)"),
        (dict(x=np.zeros((B, 0, C), np.float32)), ValueError, "x: .*T >= 1"),
        (dict(x=nan), ValueError, "x: expected finite values, got NaN"),
        (dict(x=x, key_mask=np.ones((B, T + 1), bool)), ValueError, r"key_mask: expected shape \(3, 13\), got \(3, 14\)"),
        (dict(x=x, key_mask=np.ones((B, T), np.float32)), TypeError, "key_mask: expected a bool or integer dtype"),
        (dict(x=x, key_mask=object()), TypeError, "key_mask"),
        (dict(x=x, context=ctx), ValueError, "context: this Block has no cross-attention"),
        (dict(x=x, context_mask=np.ones((B, Tc), bool)), ValueError, "context_mask: this Block has no cross"),
        (dict(x=np.broadcast_to(x[:1, :1], (1 << 14, 1 << 10, C))), ValueError, "too large"),
    ]
    cross = [
        (dict(x=x), ValueError, r"context: this Block has cross-attention .* needs a context of shape \(B, Tc, 32\), got None"),
        (dict(x=x, context=ctx[:2]), ValueError, r"context: expected shape \(3, \*, 32\), got \(2, 9, 32\)"),
        (dict(x=x, context=np.zeros((B, 0, C), np.float32)), ValueError, "context: .*Tc >= 1"),
        (dict(x=x, context=ctx.astype(np.float16)), TypeError, "context: expected dtype float32"),
        (dict(x=x, context=inf), ValueError, "context: expected finite values, got NaN or infinity"),
        (dict(x=x, context=ctx, context_mask=np.ones((B, T), bool)), ValueError, r"context_mask: expected shape \(3, 9\), got \(3, 13\)"),
        (dict(x=x, context=ctx, context_mask=np.ones((B, Tc), complex)), TypeError, "context_mask: expected a bool or integer"),
    ]
    return plain, cross


@pytest.mark.parametrize("cross", [False, True], ids=["plain", "cross"])
def test_bad_inputs_raise_before_any_work(cross, rng):
    b = pyxtts.Block(32, 4, cross_attention=cross)
    randomize(b, rng)
    x, dy, kw = inputs(rng, cross=cross)
    plain, cross_cases = bad_forward_cases()
    cases = plain
    if cross:  # the x and key_mask cases again, with a valid context
        cases = cross_cases + [(dict(a, context=kw["context"]), e, m) for a, e, m in plain
                               if not any(k.startswith("context") for k in a) and "large" not in m]
    # a pending forward, so we can check that a refused call touched nothing
    y = b.forward(x, **kw).numpy()
    a0, n0 = pyxtts.memory_allocated("cpu"), pyxtts.memory_stats("cpu")["num_allocs"]
    refs = [sys.getrefcount(v) for v in kw.values()]
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            b.forward(**args)
    assert pyxtts.memory_allocated("cpu") == a0
    assert pyxtts.memory_stats("cpu")["num_allocs"] == n0
    assert [sys.getrefcount(v) for v in kw.values()] == refs
    # dy must match the forward's x
    with pytest.raises(ValueError, match=r"dy: expected shape \(3, 13, 32\), got \(3, 12, 32\)"):
        b.backward(dy[:, :12])
    with pytest.raises(TypeError, match="dy: expected dtype float32"):
        b.backward(dy.astype(np.float64))
    with pytest.raises(TypeError, match="dy: expected a float32"):
        b.backward(None)
    # the pending forward is intact: its backward matches a fresh run
    out = b.backward(dy)
    dx = (out[0] if cross else out).numpy()
    ry, rdx, _, _ = reference(b, x, dy, **kw)
    assert_close(y, ry, "y")
    assert_close(dx, rdx, "dx")
    with pytest.raises(RuntimeError, match="backward: no forward"):
        b.backward(dy)


def test_backward_needs_a_forward():
    b = pyxtts.Block(16, 2)
    with pytest.raises(RuntimeError, match="backward: no forward to differentiate"):
        b.backward(np.zeros((1, 2, 16), np.float32))


def test_estimate_memory_rejects_bad_arguments():
    plain, cross = pyxtts.Block(16, 2), pyxtts.Block(16, 2, cross_attention=True)
    with pytest.raises(ValueError, match="batch: expected >= 1, got 0"):
        plain.estimate_memory(0, 4)
    with pytest.raises(ValueError, match="T: expected >= 1"):
        plain.estimate_memory(1, 0)
    with pytest.raises(ValueError, match="Tc: this Block has no cross-attention"):
        plain.estimate_memory(1, 4, 3)
    with pytest.raises(ValueError, match="Tc: this Block has cross-attention"):
        cross.estimate_memory(1, 4)
    with pytest.raises(ValueError, match="checkpointing"):
        plain.estimate_memory(1, 4, checkpointing="most")
    assert cross.estimate_memory(1, 4, 3)["context_length"] == 3


@pytest.mark.parametrize("cross,args,pattern", [
    (False, (2**40, 2**40, 0), r"batch: batch 1099511627776 x T 1099511627776 at d_model 16 is too large"),
    (False, (2**62, 2, 0), r"batch: batch 4611686018427387904 x T 2 .*B\*T\*4\*d_model must stay below 2\*\*31"),
    (False, (2**63 - 1, 2**63 - 1, 0), r"batch: .*too large"),
    (False, (1, 2**25), r"batch: batch 1 x T 33554432 at d_model 16 is too large"),
    (True, (1, 1, 2**62), r"Tc: batch 1 x Tc 4611686018427387904 at d_model 16 is too large"),
    (True, (2**20, 1, 2**40), r"Tc: .*B\*Tc\*2\*d_model must stay below 2\*\*31"),
], ids=["2**40 x 2**40", "2**62 x 2", "int64 max", "just past", "Tc 2**62", "Tc 2**40"])
def test_estimate_memory_refuses_sizes_past_the_kernels_limit(cross, args, pattern):
    """B*T*4*d_model (and B*Tc*2*d_model) must fit an int: a product past 64 bits once
    wrapped to a small number, and the block planned a batch of 0."""
    b = pyxtts.Block(16, 2, cross_attention=cross)
    with pytest.raises(ValueError, match=pattern):
        b.estimate_memory(*args)


def test_estimate_memory_plans_up_to_the_kernels_limit():
    b = pyxtts.Block(16, 2)
    est = b.estimate_memory(1, 2**25 - 1)  # B*T*4*16 = 2**31 - 64: the largest that fits
    assert est["batch_size"] == 1 and est["sequence_length"] == 2**25 - 1
    assert est["inputs"] >= (2**25 - 1) * 16 * 4


@requires_cuda
def test_tensor_on_another_device_is_refused():
    b = pyxtts.Block(16, 2)
    with pytest.raises(ValueError, match="x: expected a tensor on cpu"):
        b.forward(pyxtts.zeros((1, 2, 16), device="cuda:0"))


# ---- reference counts and leaks -------------------------------------------------------------

def test_reference_counts_are_exact(rng):
    b = pyxtts.Block(16, 2, cross_attention=True)
    x, dy, kw = inputs(rng, B=2, T=5, C=16, Tc=4, cross=True)
    tx = pyxtts.tensor(x)
    objs = [x, dy, tx, *kw.values()]
    before = [sys.getrefcount(o) for o in objs]
    brc = sys.getrefcount(b)
    for xin in (x, tx):
        y = b.forward(xin, **kw)
        dx, dc = b.backward(dy)
        del y, dx, dc
    for bad in (dict(x=x, context=None), dict(x=x.astype(np.float64), **kw)):
        with pytest.raises((ValueError, TypeError)):
            b.forward(**bad)
    del xin, bad
    assert [sys.getrefcount(o) for o in objs] == before
    assert sys.getrefcount(b) == brc


def test_creating_and_destroying_blocks_leaks_nothing(rng):
    x, dy, kw = inputs(rng, B=2, T=3, C=8, Tc=2, cross=True)

    def cycle(i):
        b = pyxtts.Block(8, 2, cross_attention=bool(i % 2), checkpointing=POLICIES[i % 3], seed=i)
        kws = kw if i % 2 else {"key_mask": kw["key_mask"]}
        b.forward(x, **kws)
        b.backward(dy)
        b.parameters(), b.gradients()

    for i in range(50):
        cycle(i)
    gc.collect()
    s0 = pyxtts.memory_stats("cpu")
    n_objects, n_blocks = len(gc.get_objects()), sys.getallocatedblocks()
    for i in range(1000):
        cycle(i)
    gc.collect()
    s1 = pyxtts.memory_stats("cpu")
    # one leaked object (a view, an array, a tuple) per cycle would add >= 1000 blocks
    assert sys.getallocatedblocks() - n_blocks < 200
    assert s1["allocated_bytes"] == s0["allocated_bytes"]
    assert s1["num_active_blocks"] == s0["num_active_blocks"]
    assert s1["reserved_bytes"] == s0["reserved_bytes"]
    assert len(gc.get_objects()) <= n_objects + 10
