"""Single kernels (_op_* bindings of the CPU backend) against float64 NumPy and torch.

How the tolerances are set. Inputs are float32 (or 16-bit) values, so NumPy gets
them exactly in float64 and the only error left is the kernel's own rounding.
Each check bounds that error by a few units of float32 rounding (u = 2^-24)
times the magnitude of the terms the kernel adds (not of the result, which may
cancel to ~0): e.g. for gemm |C - ref| <= 1e-5 * (|alpha| |A| @ |B| + |beta| |C|).
Backwards are checked against float64 NumPy analytic gradients at that level;
the NumPy gradients are themselves checked by central differences in float64,
and the kernels' own fp32 forwards by central differences (eps 1e-2) at 1e-2.
16-bit kernels load to float32 and round once at the store, so elementwise
16-bit results must equal, bit for bit, the float32 kernel's result on the
widened inputs rounded to 16 bits (NumPy/ml_dtypes round to nearest even too).

Every test draws fresh data from the run's seed (conftest: PYXTTS_TEST_SEED=N
repeats a run); failure messages carry the seed and the shapes.
"""
from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="torch, these tests' reference (the README's test command installs it)")
from conftest import NP_DTYPE, assert_bits_equal, requires_cuda, run_python  # noqa: E402
from helpers.arrays import f64, rand  # noqa: E402
from helpers.reductions import embedding_backward_exact  # noqa: E402

import pyxtts  # noqa: E402
from pyxtts import _C  # noqa: E402

pytestmark = pytest.mark.usefixtures("check_memory")

ROOT = Path(__file__).resolve().parent.parent
U = 2.0**-24  # float32 unit roundoff
# half-ulp (relative) of a round-to-nearest 16-bit store
U16 = {"float16": 2.0**-11, "bfloat16": 2.0**-8}
N_REAL = 8 * 430  # batch 8 x 430 positions
FLOATS = ["float32", "float16", "bfloat16"]
HALF = ["float16", "bfloat16"]


# ---- helpers ------------------------------------------------------------------------


def T(a, dtype="float32"):
    """A CPU tensor of `a` in a pyxtts dtype (rounding to nearest even)."""
    return pyxtts.tensor(np.asarray(a), dtype=getattr(pyxtts, dtype))


def r16(a, dtype) -> np.ndarray:
    """float32/64 values rounded to a pyxtts float dtype (NumPy / ml_dtypes, RNE)."""
    return np.asarray(a, dtype=np.float32).astype(NP_DTYPE[dtype])


def poison_cache(*specs):
    """Allocates NaN-filled tensors of the given (shape, dtype)s and frees them, so the
    caching allocator hands those blocks, NaN and all, to the op's fresh outputs next:
    an output element the kernel forgets to write shows up as NaN. Call it after the
    inputs are built (they would take the blocks otherwise)."""
    held = [T(np.full(shape, np.nan, np.float32), dtype) for shape, dtype in specs]
    del held


def assert_within(actual, expected, tol, msg):
    """|actual - expected| <= tol elementwise (tol broadcasts); NaN fails."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}; {msg}"
    tol = np.broadcast_to(np.asarray(tol, dtype=np.float64), expected.shape)
    err = np.abs(actual - expected)
    bad = ~(err <= tol)
    if bad.any():
        ratio = np.nan_to_num(err / np.maximum(tol, 1e-300), nan=np.inf)
        i = np.unravel_index(np.argmax(np.where(bad, ratio, 0)), bad.shape)
        raise AssertionError(
            f"{int(bad.sum())} of {bad.size} elements off; worst at {tuple(int(j) for j in i)}: "
            f"got {actual[i]!r}, expected {expected[i]!r}, |err| {err[i]:.3g} > tol {tol[i]:.3g}; {msg}")


def fd(f, x: np.ndarray, v: np.ndarray, h: float) -> float:
    """Central difference of the scalar f at x along v."""
    return (f(x + h * v) - f(x - h * v)) / (2 * h)


def check_fd(numeric: float, analytic: float, terms: float, rtol: float, msg: str):
    """A directional derivative: |numeric - analytic| <= rtol * max(|analytic|, terms / 10),
    where `terms` = sum |grad * v| keeps a derivative that cancels to ~0 checkable."""
    scale = max(abs(analytic), terms / 10)
    assert abs(numeric - analytic) <= rtol * scale, \
        f"finite difference {numeric!r} vs analytic {analytic!r} (scale {scale:.3g}); {msg}"


# ---- NumPy float64 references -------------------------------------------------------

GELU_K = math.sqrt(2 / math.pi)


def gelu_ref(x):
    # 0.5 x (1 + tanh(u)) = x sigmoid(2u) exactly; written with sigmoid because in
    # float64 too 1 + tanh(u) cancels for negative x (to exactly 0 below x ~ -6.5;
    # torch evaluates the tanh form, hence the atol of the torch comparison)
    u = GELU_K * (x + 0.044715 * x**3)
    return x / (1 + np.exp(np.minimum(-2 * u, 700)))


def gelu_grad_ref(x):
    # d/dx of 0.5 x (1 + tanh(u)), with 0.5 (1 + tanh u) = s and 0.5 (1 - tanh^2 u) = 2 s (1 - s)
    u = GELU_K * (x + 0.044715 * x**3)
    e = np.exp(np.minimum(-2 * u, 700))
    s = 1 / (1 + e)
    return s + 2 * x * s * (e * s) * GELU_K * (1 + 3 * 0.044715 * x * x)


def ln_ref(x, w, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    r = 1 / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps)
    return (x - m) * r * w + b, m[..., 0], r[..., 0]


def ln_grad_ref(dout, x, w, eps=1e-5):
    """(dinp, dweight, dbias) of sum(out * dout); also the magnitudes of dinp's terms."""
    _, m, r = ln_ref(x, w, 0 * w, eps)
    m, r = m[..., None], r[..., None]
    n = (x - m) * r
    g = dout * w
    mg, mgn = g.mean(-1, keepdims=True), (g * n).mean(-1, keepdims=True)
    dinp = r * (g - mg - n * mgn)
    # sizes of dinp's terms; of the row means' own errors (u mean|g| for mean(g), not
    # u |mean(g)|, which may cancel to ~0); and of dinp's sensitivity to n's rounding
    # (x - mean in float32 with the fp32-rounded mean: (|x| + |mean|) rstd u)
    terms = r * (np.abs(g) + np.abs(mg) + np.abs(n * mgn)
                 + np.abs(g).mean(-1, keepdims=True) + np.abs(n) * np.abs(g * n).mean(-1, keepdims=True)
                 + (np.abs(x) + np.abs(m)) * r * (np.abs(mgn) + np.abs(n * mg)))
    rows = tuple(range(x.ndim - 1))
    # dweight's terms n * dout, with n's own rounding (of x - mean: (|x| + |mean|) rstd u)
    dw_terms = ((np.abs(n) + (np.abs(x) + np.abs(m)) * r) * np.abs(dout)).sum(rows)
    return dinp, (dout * n).sum(rows), dout.sum(rows), terms, dw_terms


def xent_ref(logits, targets):
    """(losses, softmax, max - logits) in float64; ignored rows (-1) have loss 0."""
    mx = logits.max(-1, keepdims=True)
    p = np.exp(logits - mx)
    s = p.sum(-1, keepdims=True)
    lse = (mx + np.log(s))[..., 0]
    t = np.where(targets < 0, 0, targets)
    picked = np.take_along_axis(logits, t[..., None], -1)[..., 0]
    return np.where(targets < 0, 0.0, lse - picked), p / s, mx - logits


def onehot(targets, V):
    oh = np.zeros(targets.shape + (V,))
    valid = targets >= 0
    oh[valid, targets[valid]] = 1
    return oh


# ---- gemm ---------------------------------------------------------------------------

GEMM_SHAPES = [(1, 1, 1), (3, 5, 7), (150, 300, 33), (N_REAL, 256, 1024), (N_REAL // 8, 1026, 256)]
TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]
# the realistic sizes run two transposes, not all four (test time)
GEMM_FP32_CASES = [(M, N, K, ta, tb) for M, N, K in GEMM_SHAPES for ta, tb in TRANSPOSES
                   if M * N * K <= 1e8 or ta == tb]


def gemm_operands(rng, M, N, K, ta, tb, dtype="float32"):
    A = rand(rng, (K, M) if ta else (M, K), dtype=dtype)
    B = rand(rng, (N, K) if tb else (K, N), dtype=dtype)
    opA = A.T.astype(np.float64) if ta else A.astype(np.float64)
    opB = B.T.astype(np.float64) if tb else B.astype(np.float64)
    return A, B, opA, opB


@pytest.mark.parametrize("M,N,K,ta,tb", GEMM_FP32_CASES)
def test_gemm_fp32(rng, seed, M, N, K, ta, tb):
    A, B, opA, opB = gemm_operands(rng, M, N, K, ta, tb)
    alpha = float(rng.uniform(0.5, 2.0) * rng.choice([-1, 1]))
    msg = f"seed={seed} M,N,K={M},{N},{K} trans={ta},{tb} alpha={alpha}"
    # beta = 0 into C full of NaN: C must not be read
    C = T(np.full((M, N), np.nan, np.float32))
    out = _C._op_gemm(T(A), T(B), trans_a=ta, trans_b=tb, alpha=alpha, C=C)
    assert out is C, msg
    ref = alpha * (opA @ opB)
    mag = abs(alpha) * (np.abs(opA) @ np.abs(opB))
    # 1e-5 of the summed magnitudes: the worst case K u (6e-5 at K = 1024) is never
    # approached by random signs, whose error grows like sqrt(K) u (~2e-6)
    assert_within(f64(out), ref, 1e-5 * mag + 1e-30, msg + " beta=0")
    # beta != 0 accumulates: C = alpha AB + beta C
    C0 = rand(rng, (M, N))
    beta = float(rng.uniform(0.25, 1.5))
    out = _C._op_gemm(T(A), T(B), trans_a=ta, trans_b=tb, alpha=alpha, beta=beta, C=T(C0))
    assert_within(f64(out), ref + beta * C0, 1e-5 * (mag + beta * np.abs(C0)) + 1e-30, msg + f" beta={beta}")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("ta,tb", TRANSPOSES)
@pytest.mark.parametrize("dt_c", ["float32", "bfloat16"])
def test_gemm_sizes_takes_the_leading_columns_of_wider_operands(rng, seed, dtype, ta, tb, dt_c):
    # the heads' products: operands whose rows are further apart than the product's widths.
    # The bits of the dense product on the same values; A's and B's extra columns are NaN
    # (a read would show), C's are a sentinel that must stay
    M, N, K = 37, 45, 29
    A, B, _, _ = gemm_operands(rng, M, N, K, ta, tb, dtype)
    C0 = rand(rng, (M, N), dtype=dt_c)

    def wider(x, pad, fill, dt):
        return np.concatenate([x, np.full((x.shape[0], pad), fill, NP_DTYPE[dt])], 1)

    msg = f"seed={seed} {dtype} trans={ta},{tb} C {dt_c}"
    out_dtype = getattr(pyxtts, dt_c)
    for beta in (0.0, 0.5):
        C = T(wider(C0, 8, 7.0, dt_c), dt_c)
        got = _C._op_gemm(T(wider(A, 3, np.nan, dtype), dtype), T(wider(B, 5, np.nan, dtype), dtype),
                          trans_a=ta, trans_b=tb, alpha=1.5, beta=beta, C=C, out_dtype=out_dtype,
                          sizes=(M, N, K))
        assert got is C, msg
        want = _C._op_gemm(T(A, dtype), T(B, dtype), trans_a=ta, trans_b=tb, alpha=1.5, beta=beta,
                           C=T(C0, dt_c), out_dtype=out_dtype)
        assert_bits_equal(got.numpy()[:, :N], want.numpy(), msg + f" beta={beta}")
        assert np.all(f64(got)[:, N:] == 7.0), msg + " C's columns past N"
    # without C: a new dense (M, N)
    got = _C._op_gemm(T(wider(A, 3, np.nan, dtype), dtype), T(B, dtype), trans_a=ta, trans_b=tb,
                      out_dtype=out_dtype, sizes=(M, N, K))
    want = _C._op_gemm(T(A, dtype), T(B, dtype), trans_a=ta, trans_b=tb, out_dtype=out_dtype)
    assert_bits_equal(got.numpy(), want.numpy(), msg + " new C")


def test_gemm_sizes_errors():
    A, B = T(np.ones((4, 6))), T(np.ones((6, 5)))
    with pytest.raises(ValueError, match=r"^A: expected 4 rows of at least 7 elements for sizes, got \(4, 6\)"):
        _C._op_gemm(A, B, sizes=(4, 5, 7))
    with pytest.raises(ValueError, match=r"^B: expected 6 rows of at least 6 elements for sizes, got \(6, 5\)"):
        _C._op_gemm(A, B, sizes=(4, 6, 6))
    with pytest.raises(ValueError, match=r"^C: expected 4 rows of at least 5 elements for sizes, got \(4, 4\)"):
        _C._op_gemm(A, B, sizes=(4, 5, 6), C=T(np.ones((4, 4))))
    with pytest.raises(TypeError, match="^sizes: expected a tuple \\(M, N, K\\), got list"):
        _C._op_gemm(A, B, sizes=[4, 5, 6])
    with pytest.raises(ValueError, match=r"^sizes \(K\): expected an integer in \[0, 2147483647\], got -1"):
        _C._op_gemm(A, B, sizes=(4, 5, -1))


@pytest.mark.parametrize("out16", [False, True], ids=["C=fp32", "C=16bit"])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("ta,tb", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("M,N,K", [(3, 5, 7), (150, 300, 33), (N_REAL // 4, 300, 256)], ids=str)
def test_gemm_16bit(rng, seed, M, N, K, ta, tb, dtype, out16):
    # (150, 300): the 16-bit C is staged in fp32 tiles of 128 x 256: rows and columns
    # both cross a tile edge
    A, B, opA, opB = gemm_operands(rng, M, N, K, ta, tb, dtype)
    dt_c = dtype if out16 else "float32"
    msg = f"seed={seed} M,N,K={M},{N},{K} trans={ta},{tb} {dtype} -> {dt_c}"
    C0 = rand(rng, (M, N), dtype=dt_c)
    for beta in (0.0, 0.75):
        Cin = np.full((M, N), np.nan, np.float32) if beta == 0 else C0
        out = _C._op_gemm(T(A, dtype), T(B, dtype), trans_a=ta, trans_b=tb, alpha=1.5, beta=beta,
                          C=T(Cin, dt_c))
        assert out.dtype is getattr(pyxtts, dt_c), msg
        ref = 1.5 * (opA @ opB) + beta * C0
        mag = 1.5 * (np.abs(opA) @ np.abs(opB)) + beta * np.abs(C0)
        # fp32 accumulation as above, then one rounding to dt_c (half an ulp, relative)
        tol = 1e-5 * mag + (U16[dt_c] * np.abs(ref) if out16 else 0) + 2.0**-24
        assert_within(f64(out), ref, tol, msg + f" beta={beta}")
        # and against the fp32 kernel on the same (widened) inputs
        out32 = _C._op_gemm(T(A), T(B), trans_a=ta, trans_b=tb, alpha=1.5, beta=beta,
                            C=T(Cin.astype(NP_DTYPE[dt_c]).astype(np.float32)))
        tol32 = 1e-5 * mag + (U16[dt_c] * np.abs(f64(out32)) if out16 else 0) + 2.0**-24
        assert_within(f64(out), f64(out32), tol32, msg + f" beta={beta} vs fp32 kernel")


def test_gemm_fresh_output_and_k0(rng, seed):
    A, B = rand(rng, (4, 6)), rand(rng, (6, 5))
    poison_cache(((4, 5), "float32"))
    out = _C._op_gemm(A, B)  # NumPy inputs are taken too; a fresh float32 C
    assert out.dtype is pyxtts.float32 and out.shape == (4, 5)
    assert_within(f64(out), A.astype(np.float64) @ B, 1e-5 * (np.abs(A) @ np.abs(B)), f"seed={seed}")
    out = _C._op_gemm(T(A, "bfloat16"), T(B, "bfloat16"), out_dtype=pyxtts.float32)
    assert out.dtype is pyxtts.float32
    # K = 0: no products, C = beta * C; beta = 0 writes zeros over NaN
    for dtype in FLOATS:
        C = T(np.full((4, 5), np.nan), dtype)
        out = _C._op_gemm(T(np.zeros((4, 0)), dtype), T(np.zeros((0, 5)), dtype), C=C)
        assert_bits_equal(out.numpy(), np.zeros((4, 5), NP_DTYPE[dtype]), dtype)
        C0 = rand(rng, (4, 5), dtype=dtype)
        out = _C._op_gemm(T(np.zeros((4, 0)), dtype), T(np.zeros((0, 5)), dtype), beta=0.5, C=T(C0, dtype))
        assert_bits_equal(out.numpy(), r16(C0 * np.float32(0.5), dtype), dtype)


def test_gemm_errors():
    A, B = T(np.ones((4, 6))), T(np.ones((6, 5)))
    with pytest.raises(TypeError, match="^B: expected dtype float32, got bfloat16"):
        _C._op_gemm(A, T(np.ones((6, 5)), "bfloat16"))
    with pytest.raises(TypeError, match="^A: expected dtype float32, float16 or bfloat16, got int32"):
        _C._op_gemm(T(np.ones((4, 6)), "int32"), B)
    with pytest.raises(ValueError, match=r"^B: expected shape \(6, \*\), got \(5, 6\)"):
        _C._op_gemm(A, T(np.ones((5, 6))))
    with pytest.raises(ValueError, match=r"^B: expected shape \(\*, 6\), got \(6, 5\)"):
        _C._op_gemm(A, B, trans_b=True)
    with pytest.raises(ValueError, match=r"^A: expected shape \(\*, \*\), got \(4, 6, 1\)"):
        _C._op_gemm(T(np.ones((4, 6, 1))), B)
    with pytest.raises(ValueError, match=r"^C: expected shape \(4, 5\), got \(5, 4\)"):
        _C._op_gemm(A, B, C=T(np.ones((5, 4))))
    with pytest.raises(TypeError, match="^C: expected dtype float16, got float32"):
        _C._op_gemm(A, B, C=T(np.ones((4, 5))), out_dtype=pyxtts.float16)
    with pytest.raises(TypeError, match="^out_dtype: expected float32, float16 or bfloat16"):
        _C._op_gemm(A, B, out_dtype=pyxtts.int32)
    with pytest.raises(ValueError, match="^beta: must be 0 when C is not given"):
        _C._op_gemm(A, B, beta=1.0)
    with pytest.raises(ValueError, match="^alpha, beta: expected finite"):
        _C._op_gemm(A, B, alpha=float("nan"))
    with pytest.raises(TypeError, match="^B: expected a pyxtts.Tensor or an array"):
        _C._op_gemm(A, object())


# The products of the thread-count test: (M, N, K, trans_a, trans_b, operand dtype, C dtype).
# (132, 96, 96) is the product OpenBLAS rounds differently when it is split into panels;
# the others have grids of several tiles in rows, columns or both, with ragged edges, in
# the transposes the model uses (forward, dX = dY W^T, dW = X^T dY), and 16-bit operands.
GEMM_THREAD_CASES = [(132, 96, 96, 0, 0, "float32", "float32"), (132, 288, 96, 0, 0, "float32", "float32"),
                     (1000, 333, 77, 0, 0, "float32", "float32"), (1168, 1024, 256, 0, 0, "float32", "float32"),
                     (1168, 256, 1024, 0, 1, "float32", "float32"), (256, 768, 1168, 1, 0, "float32", "float32"),
                     (240, 6681, 256, 0, 1, "float32", "float32"), (1168, 1024, 256, 0, 0, "bfloat16", "bfloat16"),
                     (256, 1024, 1168, 1, 0, "bfloat16", "float32")]
GEMM_THREADS_SCRIPT = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    import pyxtts
    from pyxtts import _C

    def products(seed, cases):
        \"\"\"[(case, A, B, C)] for each case, C = A @ B with beta = 0.\"\"\"
        rng = np.random.default_rng(seed)
        out = []
        for M, N, K, ta, tb, dt, dt_c in cases:
            A = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
            B = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
            A, B = (pyxtts.tensor(x, dtype=getattr(pyxtts, dt)) for x in (A, B))
            C = _C._op_gemm(A, B, trans_a=bool(ta), trans_b=bool(tb), out_dtype=getattr(pyxtts, dt_c))
            out.append(((M, N, K, ta, tb, dt, dt_c), A, B, C))
        return out

    if __name__ == "__main__":
        import ast
        for case, _, _, C in products(int(sys.argv[1]), ast.literal_eval(sys.argv[2])):
            print(case, hashlib.sha256(C.numpy().tobytes()).hexdigest())
""")


@pytest.mark.slow
def test_gemm_is_bit_identical_for_any_thread_count(seed):
    """Each product has the same bits under OMP_NUM_THREADS = 1..5 (fresh processes), the
    bits this process gets, and agrees with float64 NumPy to fp32 rounding."""
    outs = {}
    for threads in range(1, 6):
        p = run_python(GEMM_THREADS_SCRIPT, str(seed), repr(GEMM_THREAD_CASES),
                       env={"OMP_NUM_THREADS": str(threads)})
        assert p.returncode == 0, p.stderr
        outs[threads] = p.stdout.strip().splitlines()
    for i, case in enumerate(GEMM_THREAD_CASES):
        lines = {t: o[i] for t, o in outs.items()}
        assert len(set(lines.values())) == 1, f"seed={seed} {case}: bits depend on the thread count: {lines}"
    scope: dict = {}
    exec(GEMM_THREADS_SCRIPT, scope)
    import hashlib
    for (case, A, B, C), line in zip(scope["products"](seed, GEMM_THREAD_CASES), outs[1]):
        M, N, K, ta, tb, dt, dt_c = case
        msg = f"seed={seed} {case}"
        assert line == f"{case} {hashlib.sha256(C.numpy().tobytes()).hexdigest()}", msg
        a, b = f64(A), f64(B)
        opA, opB = (a.T if ta else a), (b.T if tb else b)
        ref, mag = opA @ opB, np.abs(opA) @ np.abs(opB)
        # fp32 sums as in test_gemm_fp32, then one rounding to C's dtype
        tol = 1e-5 * mag + (U16[dt_c] * np.abs(ref) if dt_c in U16 else 0)
        assert_within(f64(C), ref, tol, msg)


# ---- bias ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("M,N", [(1, 1), (5, 3), (N_REAL, 1024)], ids=str)
def test_add_bias(rng, seed, M, N, dtype):
    out0, bias = rand(rng, (M, N), dtype=dtype), rand(rng, N, dtype=dtype)
    out = T(out0, dtype)
    assert _C._op_add_bias(out, T(bias, dtype)) is None
    # one float32 add, rounded once: exactly NumPy's float32 add, rounded
    assert_bits_equal(out.numpy(), r16(out0 + bias, dtype), f"seed={seed} M,N={M},{N} {dtype}")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("M,N", [(1, 1), (7, 3), (130, 70), (N_REAL, 1024)], ids=str)
def test_bias_backward(rng, seed, M, N, dtype):
    dout = rand(rng, (M, N), dtype=dtype)
    msg = f"seed={seed} M,N={M},{N} {dtype}"
    exact = dout.astype(np.float64).sum(0)
    # double accumulation: the float32 rounding of the sum, plus M u_double of the terms
    tol = U * np.abs(exact) + M * 2.0**-52 * np.abs(dout).sum(0) + 1e-40
    db = _C._op_bias_backward(T(dout, dtype))
    assert db.dtype is pyxtts.float32 and db.shape == (N,), msg
    assert_within(f64(db), exact, tol, msg)
    # += into a given dbias
    db0 = rand(rng, N)
    given = T(db0)
    assert _C._op_bias_backward(T(dout, dtype), dbias=given) is given
    assert_within(f64(given), exact + db0, tol + U * np.abs(db0), msg + " (+=)")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("M,N,ld", [(1, 1, 8), (130, 70, 77), (N_REAL // 8, 6681, 6688)], ids=str)
def test_bias_backward_of_leading_columns(rng, seed, M, N, ld, dtype):
    # the heads' bias gradient: the sums of the first N columns of rows ld apart, the bits of
    # the dense kernel on those columns; the columns past N are NaN, so a read would show
    dout = rand(rng, (M, ld), dtype=dtype)
    dout[:, N:] = np.nan
    msg = f"seed={seed} M,N,ld={M},{N},{ld} {dtype}"
    db0 = rand(rng, N)
    got = _C._op_bias_backward(T(dout, dtype), dbias=T(db0), cols=N)
    want = _C._op_bias_backward(T(np.ascontiguousarray(dout[:, :N]), dtype), dbias=T(db0))
    assert_bits_equal(got.numpy(), want.numpy(), msg)
    with pytest.raises(ValueError, match=f"^cols: expected at most dout's {ld} columns, got {ld + 1}"):
        _C._op_bias_backward(T(dout, dtype), cols=ld + 1)


def test_bias_fd(rng, seed):
    # the kernel's own forward (add_bias) by central differences, against bias_backward
    out0, bias, dout, v = (rand(rng, s) for s in [(6, 9), 9, (6, 9), 9])
    db = f64(_C._op_bias_backward(T(dout)))

    def loss(b):
        o = T(out0)
        _C._op_add_bias(o, T(b))
        return float((f64(o) * dout).sum())

    check_fd(fd(loss, bias.astype(np.float64), v, 1e-2), db @ v, np.abs(db * v).sum(), 1e-2, f"seed={seed}")


def test_bias_errors():
    out = T(np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"^bias: expected shape \(5\), got \(4\)"):
        _C._op_add_bias(out, T(np.ones(4)))
    with pytest.raises(TypeError, match="^bias: expected dtype float32, got float16"):
        _C._op_add_bias(out, T(np.ones(5), "float16"))
    with pytest.raises(TypeError, match="^out: expected dtype float32, float16 or bfloat16"):
        _C._op_add_bias(T(np.ones((4, 5)), "int64"), T(np.ones(5)))
    with pytest.raises(TypeError, match="^dbias: expected dtype float32, got bfloat16"):
        _C._op_bias_backward(out, dbias=T(np.ones(5), "bfloat16"))
    with pytest.raises(ValueError, match=r"^dbias: expected shape \(5\), got \(4\)"):
        _C._op_bias_backward(out, dbias=T(np.ones(4)))
    with pytest.raises(ValueError, match=r"^dout: expected shape \(\*, \*\)"):
        _C._op_bias_backward(T(np.ones(5)))


# ---- layernorm ----------------------------------------------------------------------

LN_SHAPES = [(1, 1), (3, 8), (2, 5, 33), (N_REAL, 256), (N_REAL, 1024)]


@pytest.mark.parametrize("shape", LN_SHAPES, ids=str)
def test_layernorm_forward(rng, seed, shape):
    C = shape[-1]
    x = rand(rng, shape, scale=2.0, offset=3.0)
    w, b = rand(rng, C), rand(rng, C, scale=0.5)
    msg = f"seed={seed} shape={shape}"
    xt, wt, bt = T(x), T(w), T(b)
    poison_cache((shape, "float32"), (shape[:-1], "float32"), (shape[:-1], "float32"))
    out, mean, rstd = _C._op_layernorm_forward(xt, wt, bt)
    assert out.shape == shape and mean.shape == shape[:-1] and rstd.shape == shape[:-1], msg
    x64 = x.astype(np.float64)
    ref, m, r = ln_ref(x64, w, b)
    # statistics: double sums rounded once to float32
    assert_within(f64(mean), m, 2 * U * np.abs(m) + 1e-12 * np.abs(x64).max(), msg + " mean")
    assert_within(f64(rstd), r, 4 * U * r, msg + " rstd")
    # out: a handful of float32 roundings of each term, (x - mean) * rstd * w and b,
    # plus the rounding of x - mean itself (|x| rstd u)
    n = (x64 - m[..., None]) * r[..., None]
    terms = np.abs(n * w) + np.abs(b) + np.abs(x64) * r[..., None] * np.abs(w)
    assert_within(f64(out), ref, 1e-6 * terms + 1e-30, msg + " out")
    if x.size < 1e5:  # torch in float64 agrees with the NumPy reference
        tref = torch.nn.functional.layer_norm(torch.from_numpy(x64), (C,), torch.from_numpy(w.astype(np.float64)),
                                              torch.from_numpy(b.astype(np.float64)), 1e-5).numpy()
        np.testing.assert_allclose(ref, tref, rtol=1e-12, atol=1e-12, err_msg=msg)


@pytest.mark.parametrize("shape", LN_SHAPES, ids=str)
def test_layernorm_backward(rng, seed, shape):
    C = shape[-1]
    x = rand(rng, shape, scale=2.0, offset=3.0)
    w, dout = rand(rng, C), rand(rng, shape)
    msg = f"seed={seed} shape={shape}"
    _, mean, rstd = _C._op_layernorm_forward(T(x), T(w), T(np.zeros(C)))
    x64, w64, d64 = (a.astype(np.float64) for a in (x, w, dout))
    dinp, dw, db, terms, dw_terms = ln_grad_ref(d64, x64, w64)
    # accumulate into given buffers (+=)
    di0, dw0, db0 = rand(rng, shape), rand(rng, C), rand(rng, C)
    gi, gw, gb = T(di0), T(dw0), T(db0)
    res = _C._op_layernorm_backward(T(dout), T(x), T(w), mean, rstd, dinp=gi, dweight=gw, dbias=gb)
    assert res[0] is gi and res[1] is gw and res[2] is gb, msg
    # dinp: float32 arithmetic on terms of size `terms` (16 roundings), the saved fp32
    # mean/rstd (a few u), and the final += (u |result|)
    assert_within(f64(gi), di0 + dinp, 2.0**-20 * terms + U * np.abs(di0 + dinp), msg + " dinp")
    # dweight: double sums of float32 products n * dout, each good to ~4 u
    assert_within(f64(gw), dw0 + dw, 8 * U * dw_terms + U * np.abs(dw0 + dw), msg + " dweight")
    assert_within(f64(gb), db0 + db, 2 * U * (np.abs(db0 + db) + np.abs(d64).sum(tuple(range(x.ndim - 1)))),
                  msg + " dbias")
    # fresh zeros when not given
    fi, fw, fb = _C._op_layernorm_backward(T(dout), T(x), T(w), mean, rstd)
    assert_within(f64(fi), dinp, 2.0**-20 * terms + U * np.abs(dinp), msg + " dinp (fresh)")
    assert_within(f64(fw), dw, 8 * U * dw_terms + 1e-30, msg + " dweight (fresh)")
    if x.size < 1e5:  # torch autograd in float64 agrees with the NumPy gradients
        tx = torch.from_numpy(x64).requires_grad_()
        tw, tb = torch.from_numpy(w64).requires_grad_(), torch.zeros(C, dtype=torch.float64, requires_grad=True)
        torch.nn.functional.layer_norm(tx, (C,), tw, tb, 1e-5).backward(torch.from_numpy(d64))
        for ours, theirs in [(dinp, tx.grad), (dw, tw.grad), (db, tb.grad)]:
            np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-10, atol=1e-10, err_msg=msg)


def test_layernorm_finite_differences(rng, seed):
    N, C = 3, 8
    x, w, b, dout = rand(rng, (N, C), scale=1.5, offset=0.5), rand(rng, C), rand(rng, C), rand(rng, (N, C))
    x64, w64, b64, d64 = (a.astype(np.float64) for a in (x, w, b, dout))
    msg = f"seed={seed} N,C={N},{C}"
    # 1) the float64 NumPy gradients against central differences of the float64 reference
    dinp, dw, db, _, _ = ln_grad_ref(d64, x64, w64)
    ref_loss = {"x": lambda a: (ln_ref(a, w64, b64)[0] * d64).sum(),
                "weight": lambda a: (ln_ref(x64, a, b64)[0] * d64).sum(),
                "bias": lambda a: (ln_ref(x64, w64, a)[0] * d64).sum()}
    # 2) the kernel's backward against central differences of the kernel's fp32 forward
    out, mean, rstd = _C._op_layernorm_forward(T(x), T(w), T(b))
    gi, gw, gb = (f64(g) for g in _C._op_layernorm_backward(T(dout), T(x), T(w), mean, rstd))
    our_loss = {"x": lambda a: (f64(_C._op_layernorm_forward(T(a), T(w), T(b))[0]) * d64).sum(),
                "weight": lambda a: (f64(_C._op_layernorm_forward(T(x), T(a), T(b))[0]) * d64).sum(),
                "bias": lambda a: (f64(_C._op_layernorm_forward(T(x), T(w), T(a))[0]) * d64).sum()}
    for name, at, g_ref, g_ours in [("x", x64, dinp, gi), ("weight", w64, dw, gw), ("bias", b64, db, gb)]:
        for _ in range(3):
            v = rng.standard_normal(at.shape)
            # float64, h = 1e-6: truncation ~h^2, roundoff ~1e-16/h: 1e-6 relative
            check_fd(fd(ref_loss[name], at, v, 1e-6), float((g_ref * v).sum()), float(np.abs(g_ref * v).sum()),
                     1e-6, msg + f" NumPy reference d/d{name}")
            # fp32 forward, h = 1e-2: roundoff ~1e-7 |loss| / h and truncation ~h^2: 1e-2
            check_fd(fd(our_loss[name], at, v, 1e-2), float((g_ours * v).sum()), float(np.abs(g_ours * v).sum()),
                     1e-2, msg + f" kernel d/d{name}")


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", [(3, 8), (N_REAL, 1024)], ids=str)
def test_layernorm_16bit(rng, seed, shape, dtype):
    C = shape[-1]
    x, w, b = rand(rng, shape, dtype, scale=2.0, offset=1.0), rand(rng, C, dtype=dtype), rand(rng, C, dtype=dtype)
    dout, di0 = rand(rng, shape, dtype=dtype), rand(rng, shape, dtype=dtype)
    msg = f"seed={seed} shape={shape} {dtype}"
    # loads are exact and the arithmetic is float32: the 16-bit kernel equals the fp32
    # kernel on the same values with its outputs rounded once
    o16, m16, r16_ = _C._op_layernorm_forward(T(x, dtype), T(w, dtype), T(b, dtype))
    o32, m32, r32 = _C._op_layernorm_forward(T(x), T(w), T(b))
    assert_bits_equal(o16.numpy(), r16(o32.numpy(), dtype), msg + " out")
    assert_bits_equal(m16.numpy(), m32.numpy(), msg + " mean")
    assert_bits_equal(r16_.numpy(), r32.numpy(), msg + " rstd")
    g16 = _C._op_layernorm_backward(T(dout, dtype), T(x, dtype), T(w, dtype), m16, r16_, dinp=T(di0, dtype))
    g32 = _C._op_layernorm_backward(T(dout), T(x), T(w), m32, r32, dinp=T(di0))
    assert g16[0].dtype is getattr(pyxtts, dtype) and g16[1].dtype is pyxtts.float32, msg
    assert_bits_equal(g16[0].numpy(), r16(g32[0].numpy(), dtype), msg + " dinp")
    assert_bits_equal(g16[1].numpy(), g32[1].numpy(), msg + " dweight")
    assert_bits_equal(g16[2].numpy(), g32[2].numpy(), msg + " dbias")


def test_layernorm_errors():
    x, w = T(np.ones((4, 5))), T(np.ones(5))
    with pytest.raises(ValueError, match=r"^weight: expected shape \(5\), got \(4\)"):
        _C._op_layernorm_forward(x, T(np.ones(4)), w)
    with pytest.raises(TypeError, match="^bias: expected dtype float32, got bfloat16"):
        _C._op_layernorm_forward(x, w, T(np.ones(5), "bfloat16"))
    with pytest.raises(TypeError, match="^x: expected dtype float32, float16 or bfloat16, got int32"):
        _C._op_layernorm_forward(T(np.ones((4, 5)), "int32"), w, w)
    with pytest.raises(ValueError, match="^x: the last dimension must be > 0"):
        _C._op_layernorm_forward(T(np.ones((4, 0))), T(np.ones(0)), T(np.ones(0)))
    with pytest.raises(ValueError, match="^eps: expected a finite value >= 0"):
        _C._op_layernorm_forward(x, w, w, eps=-1.0)
    _, m, r = _C._op_layernorm_forward(x, w, w)
    with pytest.raises(ValueError, match=r"^x: expected shape \(4, 5\), got \(5, 4\)"):
        _C._op_layernorm_backward(x, T(np.ones((5, 4))), w, m, r)
    with pytest.raises(TypeError, match="^mean: expected dtype float32, got float16"):
        _C._op_layernorm_backward(x, x, w, T(np.ones(4), "float16"), r)
    with pytest.raises(ValueError, match=r"^rstd: expected shape \(4\), got \(5\)"):
        _C._op_layernorm_backward(x, x, w, m, T(np.ones(5)))
    with pytest.raises(TypeError, match="^dinp: expected dtype float32, got bfloat16"):
        _C._op_layernorm_backward(x, x, w, m, r, dinp=T(np.ones((4, 5)), "bfloat16"))
    with pytest.raises(ValueError, match=r"^dweight: expected shape \(5\), got \(4\)"):
        _C._op_layernorm_backward(x, x, w, m, r, dweight=T(np.ones(4)))
    with pytest.raises(TypeError, match="^dbias: expected dtype float32, got float16"):
        _C._op_layernorm_backward(x, x, w, m, r, dbias=T(np.ones(5), "float16"))


# ---- gelu, add ----------------------------------------------------------------------


def gelu_inputs(rng, shape, dtype="float32"):
    # mostly |x| < 6 with a tail out to the saturated regions, and exact 0
    x = rand(rng, shape, scale=3.0, dtype=dtype)
    x.reshape(-1)[:1] = 0.0
    return x


@pytest.mark.parametrize("shape", [(1,), (7,), (5, 33), (N_REAL, 1024)], ids=str)  # (N, 4C), C = 256
def test_gelu_forward(rng, seed, shape):
    x = gelu_inputs(rng, shape)
    x64 = x.astype(np.float64)
    msg = f"seed={seed} shape={shape}"
    xt = T(x)
    poison_cache((shape, "float32"))
    out = f64(_C._op_gelu_forward(xt))
    ref = gelu_ref(x64)
    # evaluated as x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715 x^3): u carries ~5 u
    # of relative error, which exp amplifies by |2u|; the rest is a few roundings
    z = 2 * GELU_K * np.abs(x64 + 0.044715 * x64**3)
    assert_within(out, ref, (8 + 6 * z) * U * np.abs(ref) + 1e-37, msg)
    if x.size < 1e5:
        tref = torch.nn.functional.gelu(torch.from_numpy(x64), approximate="tanh").numpy()
        np.testing.assert_allclose(ref, tref, rtol=1e-13, atol=1e-15 * np.abs(x64).max(), err_msg=msg)


@pytest.mark.parametrize("shape", [(1,), (7,), (5, 33), (N_REAL, 1024)], ids=str)  # (N, 4C), C = 256
def test_gelu_backward(rng, seed, shape):
    x, dout = gelu_inputs(rng, shape), rand(rng, shape)
    x64, d64 = x.astype(np.float64), dout.astype(np.float64)
    msg = f"seed={seed} shape={shape}"
    xt, dt = T(x), T(dout)
    poison_cache((shape, "float32"))
    out = f64(_C._op_gelu_backward(xt, dt))
    ref = gelu_grad_ref(x64) * d64
    # gelu' = s + 2 x s (1 - s) u', s = sigmoid(2u): tolerance on each term's size,
    # times the exp amplification |2u| as in the forward
    u = GELU_K * (x64 + 0.044715 * x64**3)
    s = 1 / (1 + np.exp(np.minimum(-2 * u, 700)))
    terms = (s + np.abs(2 * x64 * s * (1 - s) * GELU_K * (1 + 3 * 0.044715 * x64**2))) * np.abs(d64)
    # in the far negative tail s < 2^-126 leaves float32's normal range (and is 0 once
    # exp(-2u) overflows): an absolute error up to 2^-126 (1 + |2 x du|) |dout|
    tail = 2.0**-126 * (1 + np.abs(2 * x64 * GELU_K * (1 + 3 * 0.044715 * x64**2))) * np.abs(d64)
    assert_within(out, ref, (12 + 6 * np.abs(2 * u)) * U * terms + tail, msg)
    if x.size < 1e5:
        tx = torch.from_numpy(x64).requires_grad_()
        torch.nn.functional.gelu(tx, approximate="tanh").backward(torch.from_numpy(d64))
        np.testing.assert_allclose(ref, tx.grad.numpy(), rtol=1e-12, atol=1e-14 * np.abs(x64 * d64).max(),
                                   err_msg=msg)


def test_gelu_finite_differences(rng, seed):
    x = gelu_inputs(rng, 64)
    x64 = x.astype(np.float64)
    # gelu is elementwise: one central difference per element. NumPy reference in
    # float64 (h = 1e-6) to 1e-7 of the derivative's terms; the kernel's fp32 forward
    # (h = 1e-2: truncation ~h^2 gelu''', roundoff u |gelu| / h) to 1e-2
    g = gelu_grad_ref(x64)
    num = (gelu_ref(x64 + 1e-6) - gelu_ref(x64 - 1e-6)) / 2e-6
    assert_within(num, g, 1e-7 * (1 + np.abs(g)), f"seed={seed} NumPy gelu'")
    ours = f64(_C._op_gelu_backward(T(x), T(np.ones_like(x))))
    fwd = lambda a: f64(_C._op_gelu_forward(T(a)))  # noqa: E731
    num32 = (fwd(x64 + 1e-2) - fwd(x64 - 1e-2)) / 2e-2
    assert_within(num32, ours, 1e-2 * np.maximum(np.abs(ours), 0.1), f"seed={seed} kernel gelu'")


@pytest.mark.parametrize("dtype", HALF)
def test_gelu_add_16bit(rng, seed, dtype):
    shape = (N_REAL // 4, 1024)
    x, dout, b = gelu_inputs(rng, shape, dtype), rand(rng, shape, dtype=dtype), rand(rng, shape, dtype=dtype)
    msg = f"seed={seed} shape={shape} {dtype}"
    # float32 arithmetic on exact loads, one rounding at the store
    assert_bits_equal(_C._op_gelu_forward(T(x, dtype)).numpy(), r16(_C._op_gelu_forward(T(x)).numpy(), dtype), msg)
    assert_bits_equal(_C._op_gelu_backward(T(x, dtype), T(dout, dtype)).numpy(),
                      r16(_C._op_gelu_backward(T(x), T(dout)).numpy(), dtype), msg)
    assert_bits_equal(_C._op_add(T(x, dtype), T(b, dtype)).numpy(), r16(x + b, dtype), msg)


@pytest.mark.parametrize("shape", [(1,), (3, 7), (N_REAL, 1024)], ids=str)
def test_add(rng, seed, shape):
    a, b = rand(rng, shape), rand(rng, shape)
    at, bt = T(a), T(b)
    poison_cache((shape, "float32"))
    # one float32 add: exactly NumPy's float32 add
    assert_bits_equal(_C._op_add(at, bt).numpy(), a + b, f"seed={seed} shape={shape}")


def test_gelu_add_errors():
    x = T(np.ones((4, 5)))
    with pytest.raises(TypeError, match="^x: expected dtype float32, float16 or bfloat16, got int64"):
        _C._op_gelu_forward(T(np.ones(3), "int64"))
    with pytest.raises(ValueError, match=r"^dout: expected shape \(4, 5\), got \(5, 4\)"):
        _C._op_gelu_backward(x, T(np.ones((5, 4))))
    with pytest.raises(TypeError, match="^dout: expected dtype float32, got float16"):
        _C._op_gelu_backward(x, T(np.ones((4, 5)), "float16"))
    with pytest.raises(ValueError, match=r"^b: expected shape \(4, 5\), got \(20\)"):
        _C._op_add(x, T(np.ones(20)))
    with pytest.raises(TypeError, match="^b: expected dtype float32, got bfloat16"):
        _C._op_add(x, T(np.ones((4, 5)), "bfloat16"))


# ---- embedding ----------------------------------------------------------------------

EMB_SHAPES = [(1, 1, 1), (5, 3, 4), (N_REAL, 1026, 1024), (N_REAL, 6681, 256)]
# one realistic size per 16-bit dtype (test time)
EMB_CASES = [(N, V, C, dt) for N, V, C in EMB_SHAPES for dt in FLOATS
             if dt == "float32" or N * C <= 1e6 or V == 1026]


@pytest.mark.parametrize("N,V,C,dtype", EMB_CASES)
def test_embedding_forward(rng, seed, N, V, C, dtype):
    ids = rng.integers(0, V, (N // 4 or 1, 4) if N >= 4 else (N,)).astype(np.int32)
    table = rand(rng, (V, C), dtype=dtype)
    msg = f"seed={seed} ids={ids.shape} V,C={V},{C} {dtype}"
    it, tt = T(ids, "int32"), T(table, dtype)
    poison_cache((ids.shape + (C,), dtype))
    out = _C._op_embedding_forward(it, tt)
    assert out.shape == ids.shape + (C,), msg
    assert_bits_equal(out.numpy(), r16(table[ids], dtype), msg)  # a copy: exact
    # accumulate into a given out: one float32 add rounded once
    out0 = rand(rng, ids.shape + (C,), dtype=dtype)
    given = T(out0, dtype)
    assert _C._op_embedding_forward(T(ids, "int32"), T(table, dtype), out=given) is given
    assert_bits_equal(given.numpy(), r16(out0 + table[ids], dtype), msg + " (+=)")


@pytest.mark.parametrize("N,V,C,dtype", EMB_CASES + [(1000, 3, 130, dt) for dt in FLOATS])
def test_embedding_backward(rng, seed, N, V, C, dtype):
    # few distinct ids, so most table rows receive many additions
    ids = rng.integers(0, max(1, V // 3), N).astype(np.int32)
    dout = rand(rng, (N, C), dtype=dtype)
    d0 = rand(rng, (V, C))
    msg = f"seed={seed} N,V,C={N},{V},{C} {dtype}"
    given = T(d0)
    out = _C._op_embedding_backward(T(ids, "int32"), T(dout, dtype), V, dtable=given)
    assert out is given, msg
    # the kernel follows backend.h's two stages exactly (double sums per chunk of ids, then
    # per id in chunk order, added once): the mirror's bits
    assert_bits_equal(given.numpy(), embedding_backward_exact(d0, ids, dout), msg)
    # and close to the float64 sum: one float32 rounding of the total, plus the double
    # sums' own (negligible) error
    exact, mag = d0.astype(np.float64), np.abs(d0).astype(np.float64)
    np.add.at(exact, ids, dout.astype(np.float64))
    np.add.at(mag, ids, np.abs(dout).astype(np.float64))
    assert_within(f64(given), exact, U * np.abs(exact) + 1e-12 * mag, msg + " vs float64")
    fresh = _C._op_embedding_backward(T(ids, "int32"), T(dout, dtype), V)
    zeros = np.zeros((V, C), np.float32)
    assert_bits_equal(fresh.numpy(), embedding_backward_exact(zeros, ids, dout), msg + " (fresh)")


def test_embedding_finite_differences(rng, seed):
    # the forward is linear in the table: the directional derivative of sum(out * dout)
    # by central differences of the kernel's forward equals <dtable, v>
    ids = np.array([0, 2, 2, 1, 2], np.int32)
    table, dout, v = rand(rng, (4, 6)), rand(rng, (5, 6)), rand(rng, (4, 6))
    g = f64(_C._op_embedding_backward(T(ids, "int32"), T(dout), 4))
    loss = lambda a: float((f64(_C._op_embedding_forward(T(ids, "int32"), T(a))) * dout).sum())  # noqa: E731
    check_fd(fd(loss, table.astype(np.float64), v, 1e-2), float((g * v).sum()), float(np.abs(g * v).sum()), 1e-2,
             f"seed={seed}")


def test_embedding_errors():
    table = T(np.ones((6, 4)))
    with pytest.raises(ValueError, match=r"^ids: expected values in \[0, 6\), got 6 at flat index 2"):
        _C._op_embedding_forward(T([0, 1, 6], "int32"), table)
    with pytest.raises(ValueError, match=r"^ids: expected values in \[0, 6\), got -1 at flat index 0"):
        _C._op_embedding_forward(T([-1, 1], "int32"), table)
    with pytest.raises(ValueError, match=r"^ids: expected values in \[0, 3\), got 5"):
        _C._op_embedding_backward(T([0, 5], "int32"), T(np.ones((2, 4))), 3)
    with pytest.raises(TypeError, match="^ids: expected dtype int32, got int64"):
        _C._op_embedding_forward(T([0, 1], "int64"), table)
    with pytest.raises(TypeError, match="^table: expected dtype float32, float16 or bfloat16"):
        _C._op_embedding_forward(T([0, 1], "int32"), T(np.ones((6, 4)), "int32"))
    with pytest.raises(ValueError, match=r"^out: expected shape \(2, 4\), got \(2, 5\)"):
        _C._op_embedding_forward(T([0, 1], "int32"), table, out=T(np.ones((2, 5))))
    with pytest.raises(TypeError, match="^out: expected dtype float32, got bfloat16"):
        _C._op_embedding_forward(T([0, 1], "int32"), table, out=T(np.ones((2, 4)), "bfloat16"))
    with pytest.raises(ValueError, match=r"^dout: expected shape \(2, \*\), got \(3, 4\)"):
        _C._op_embedding_backward(T([0, 1], "int32"), T(np.ones((3, 4))), 6)
    with pytest.raises(ValueError, match=r"^dtable: expected shape \(6, 4\), got \(5, 4\)"):
        _C._op_embedding_backward(T([0, 1], "int32"), T(np.ones((2, 4))), 6, dtable=T(np.ones((5, 4))))
    with pytest.raises(TypeError, match="^dtable: expected dtype float32, got float16"):
        _C._op_embedding_backward(T([0, 1], "int32"), T(np.ones((2, 4))), 6, dtable=T(np.ones((6, 4)), "float16"))
    with pytest.raises(ValueError, match="^V: expected a table size"):
        _C._op_embedding_backward(T([0, 1], "int32"), T(np.ones((2, 4))), 0)


# ---- cross-entropy ------------------------------------------------------------------


@pytest.mark.parametrize("N,V", [(1, 1), (1, 2), (6, 5), (N_REAL // 2, 1026),
                                 pytest.param(N_REAL, 6681, marks=pytest.mark.slow)], ids=str)
def test_softmax_xent(rng, seed, N, V):
    logits = rand(rng, (N, V), scale=3.0, offset=5.0)
    targets = rng.integers(0, V, N).astype(np.int32)
    targets[rng.random(N) < 0.2] = -1  # ignored positions (padding)
    scale = float(np.float32(rng.uniform(0.1, 2.0)))  # the kernel takes a float32 scale
    msg = f"seed={seed} N,V={N},{V} scale={scale}"
    lt, tt = T(logits), T(targets, "int32")
    poison_cache(((N,), "float32"))
    losses, dlogits = _C._op_softmax_xent(lt, tt, scale=scale)
    assert_bits_equal(lt.numpy(), logits, msg + ": the caller's logits were modified")
    l64 = logits.astype(np.float64)
    ref, p, d = xent_ref(l64, targets)
    # loss = (max - x_t) + log(sum expf(x - max)) in double: each exp is off by < 1 ulp
    # plus d u from rounding d = max - x to float32, so log(sum) is off by ~(2 + E_p[d]) u
    # absolute; then one float32 rounding of the loss
    pd = (p * d).sum(-1)
    assert_within(f64(losses), ref, (4 + pd) * U + 2 * U * np.abs(ref), msg + " losses")
    grad = scale * (p - onehot(targets, V))
    grad[targets < 0] = 0
    # p = expf(x - max) * (1 / sum): (4 + d) u relative to p, then - onehot and * scale
    # (two more roundings of the result)
    tol = (8 + d + pd[:, None]) * U * scale * p + 3 * U * np.abs(grad) + 1e-40
    assert_within(f64(dlogits), grad, tol, msg + " dlogits")
    # ignored rows: exactly zero loss and gradient
    assert not np.any(losses.numpy()[targets < 0]), msg
    assert not np.any(dlogits.numpy()[targets < 0]), msg
    # forward only: the same losses, no gradient
    fl, none = _C._op_softmax_xent(lt, T(targets, "int32"), backward=False)
    assert none is None, msg
    assert_bits_equal(fl.numpy(), losses.numpy(), msg + " forward only")
    if N * V < 1e5:  # torch in float64 agrees with the NumPy reference
        tl = torch.from_numpy(l64).requires_grad_()
        tloss = torch.nn.functional.cross_entropy(tl, torch.from_numpy(targets.astype(np.int64)), ignore_index=-1,
                                                  reduction="none")
        (tloss.sum() * scale).backward()
        np.testing.assert_allclose(ref, tloss.detach().numpy(), rtol=1e-12, atol=1e-12, err_msg=msg)
        np.testing.assert_allclose(grad, tl.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=msg)


@pytest.mark.parametrize("N,V,ld", [(1, 1, 8), (6, 5, 8), (37, 101, 104), (N_REAL // 4, 6681, 6688)], ids=str)
def test_softmax_xent_of_leading_columns_with_a_bias(rng, seed, N, V, ld):
    # the heads: logits rows ld apart, the classes their first V columns, the bias added
    # inside. The same bits as the dense kernel on logits + bias (one float32 add, as NumPy's);
    # the columns past V are NaN on the way in (never read) and zeros in dlogits
    logits = rand(rng, (N, ld), scale=3.0, offset=2.0)
    logits[:, V:] = np.nan
    bias = rand(rng, V)
    targets = rng.integers(0, V, N).astype(np.int32)
    targets[rng.random(N) < 0.2] = -1
    msg = f"seed={seed} N,V,ld={N},{V},{ld}"
    tt = T(targets, "int32")
    dense = T(np.ascontiguousarray(logits[:, :V]) + bias)
    for backward in (False, True):
        losses, dlogits = _C._op_softmax_xent(T(logits), tt, scale=0.5, backward=backward, bias=T(bias),
                                              vocab=V)
        want, want_d = _C._op_softmax_xent(dense, tt, scale=0.5, backward=backward)
        assert_bits_equal(losses.numpy(), want.numpy(), msg + f" losses, backward={backward}")
        if backward:
            d = dlogits.numpy()
            assert d.shape == (N, ld), msg
            assert_bits_equal(d[:, :V], want_d.numpy(), msg + " dlogits")
            assert np.array_equal(d[:, V:], np.zeros((N, ld - V), np.float32)), msg + " the pad columns"
        else:
            assert dlogits is None and want_d is None, msg


def test_softmax_xent_vocab_and_bias_errors():
    logits, targets = T(np.zeros((3, 8))), T([0, 1, 1], "int32")
    with pytest.raises(ValueError, match="^vocab: expected at most logits' 8 columns, got 9"):
        _C._op_softmax_xent(logits, targets, vocab=9)
    with pytest.raises(ValueError, match=r"^bias: expected shape \(5\), got \(8\)"):
        _C._op_softmax_xent(logits, targets, vocab=5, bias=T(np.zeros(8)))
    with pytest.raises(TypeError, match="^bias: expected dtype float32, got bfloat16"):
        _C._op_softmax_xent(logits, targets, bias=T(np.zeros(8), "bfloat16"))
    with pytest.raises(ValueError, match=r"^targets: expected values in \[-1, 5\), got 6"):
        _C._op_softmax_xent(logits, T([0, 6, 1], "int32"), vocab=5)


def test_softmax_xent_finite_differences(rng, seed):
    N, V = 4, 9
    logits = rand(rng, (N, V), scale=2.0)
    targets = np.array([3, -1, 0, 8], np.int32)
    l64 = logits.astype(np.float64)
    msg = f"seed={seed} N,V={N},{V}"
    grad = xent_ref(l64, targets)[1] - onehot(targets, V)
    grad[targets < 0] = 0
    _, ours = _C._op_softmax_xent(T(logits), T(targets, "int32"))
    ours = f64(ours)
    ref_loss = lambda a: xent_ref(a, targets)[0].sum()  # noqa: E731
    our_loss = lambda a: f64(_C._op_softmax_xent(T(a), T(targets, "int32"), backward=False)[0]).sum()  # noqa: E731
    for _ in range(4):
        v = rng.standard_normal((N, V))
        check_fd(fd(ref_loss, l64, v, 1e-6), float((grad * v).sum()), float(np.abs(grad * v).sum()), 1e-6,
                 msg + " NumPy reference")
        check_fd(fd(our_loss, l64, v, 1e-2), float((ours * v).sum()), float(np.abs(ours * v).sum()), 1e-2,
                 msg + " kernel")


def test_softmax_xent_errors():
    logits = T(np.zeros((3, 5)))
    with pytest.raises(ValueError, match=r"^targets: expected values in \[-1, 5\), got 5 at flat index 1"):
        _C._op_softmax_xent(logits, T([0, 5, 1], "int32"))
    with pytest.raises(ValueError, match=r"^targets: expected values in \[-1, 5\), got -2"):
        _C._op_softmax_xent(logits, T([0, -2, 1], "int32"))
    with pytest.raises(TypeError, match="^logits: expected dtype float32, got bfloat16"):
        _C._op_softmax_xent(T(np.zeros((3, 5)), "bfloat16"), T([0, 1, 1], "int32"))
    with pytest.raises(TypeError, match="^targets: expected dtype int32, got int64"):
        _C._op_softmax_xent(logits, T([0, 1, 1], "int64"))
    with pytest.raises(ValueError, match=r"^targets: expected shape \(3\), got \(4\)"):
        _C._op_softmax_xent(logits, T([0, 1, 1, 1], "int32"))
    with pytest.raises(ValueError, match="^scale: expected a finite"):
        _C._op_softmax_xent(logits, T([0, 1, 1], "int32"), scale=float("inf"))


# ---- sum ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 3, 255, 257, 100_003, N_REAL * 1026])
def test_sum(rng, seed, n):
    x = rand(rng, n, scale=2.0, offset=0.5)
    got = _C._op_sum(T(x))
    assert isinstance(got, float)
    # double accumulation of float32 values: n u_double of sum |x|
    exact = math.fsum(x.astype(np.float64))
    assert abs(got - exact) <= n * 2.0**-53 * float(np.abs(x).sum()) + 1e-300, f"seed={seed} n={n}"
    with pytest.raises(TypeError, match="^x: expected dtype float32, got bfloat16"):
        _C._op_sum(T(x, "bfloat16"))


# ---- determinism --------------------------------------------------------------------

DETERMINISM_SCRIPT = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    import pyxtts
    from pyxtts import _C
    rng = np.random.default_rng(int(sys.argv[1]))
    N, C, V = 8 * 430, 1024, 1026
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    x, w, dout = f(N, C), f(C), f(N, C)
    ids = rng.integers(0, 50, N).astype(np.int32)  # many repeats
    h = hashlib.sha256()
    _, m, r = _C._op_layernorm_forward(x, w, w)
    for t in _C._op_layernorm_backward(dout, x, w, m, r):
        h.update(t.numpy().tobytes())
    for dt in ("float32", "bfloat16"):
        d = pyxtts.tensor(dout, dtype=getattr(pyxtts, dt))
        h.update(_C._op_embedding_backward(pyxtts.tensor(ids), d, V).numpy().tobytes())
        h.update(_C._op_bias_backward(d).numpy().tobytes())
    h.update(np.float64(_C._op_sum(f(N * V // 4))).tobytes())
    targets = rng.integers(-1, V, N).astype(np.int32)
    for t in _C._op_softmax_xent(f(N, V), pyxtts.tensor(targets), scale=0.5):
        h.update(t.numpy().tobytes())
    h.update(_C._op_gelu_backward(x, dout).numpy().tobytes())
    print(h.hexdigest())
""")


@pytest.mark.slow
def test_determinism_across_runs_and_threads(rng, seed):
    # repeated calls in this process: bit-identical
    N, C = N_REAL, 1024
    x, w, dout = rand(rng, (N, C)), rand(rng, C), rand(rng, (N, C))
    ids = rng.integers(0, 40, N).astype(np.int32)
    _, m, r = _C._op_layernorm_forward(T(x), T(w), T(w))

    def run():
        outs = [t.numpy() for t in _C._op_layernorm_backward(T(dout), T(x), T(w), m, r)]
        outs.append(_C._op_embedding_backward(T(ids, "int32"), T(dout), 40).numpy())
        outs.append(_C._op_bias_backward(T(dout)).numpy())
        outs.append(np.float64(_C._op_sum(T(dout))))
        return outs

    first = run()
    for a, b in zip(first, run()):
        assert_bits_equal(a, b, f"seed={seed}: a second run differs")
    # OMP_NUM_THREADS = 1..5 in fresh processes: the same bits
    digests = {}
    for threads in range(1, 6):
        res = run_python(DETERMINISM_SCRIPT, str(seed), env={"OMP_NUM_THREADS": str(threads)})
        assert res.returncode == 0, res.stderr
        digests[threads] = res.stdout.strip()
    assert len(set(digests.values())) == 1, f"seed={seed}: results depend on the thread count: {digests}"


# ---- reference counts, devices ------------------------------------------------------


def test_reference_counts_on_success_and_error_paths():
    x, w = T(np.ones((4, 5))), T(np.ones(5))
    C = T(np.zeros((4, 4)))
    objs = [x, w, C]
    before = [sys.getrefcount(o) for o in objs]
    for _ in range(3):
        _C._op_layernorm_forward(x, w, w)
        out = _C._op_gemm(x, x, trans_b=True, C=C)
        del out
        _C._op_layernorm_backward(x, x, w, *_C._op_layernorm_forward(x, w, w)[1:])
        with pytest.raises(ValueError):
            _C._op_gemm(x, x, C=C)  # (5, *) expected for B
        with pytest.raises(ValueError):
            _C._op_gemm(x, x, trans_b=True, C=T(np.zeros((3, 3))))
        with pytest.raises(TypeError):
            _C._op_layernorm_backward(x, x, w, T(np.ones(4), "float16"), T(np.ones(4)))
        with pytest.raises(ValueError):
            _C._op_softmax_xent(x, T([0, 1, 9, 2], "int32"))
        with pytest.raises(ValueError):
            _C._op_embedding_backward(T([0, 7], "int32"), T(np.ones((2, 5))), 3, dtable=T(np.zeros((3, 5))))
    assert [sys.getrefcount(o) for o in objs] == before


def test_numpy_inputs_are_accepted(rng):
    x = rand(rng, (3, 8))
    out, m, r = _C._op_layernorm_forward(x, np.ones(8, np.float32), np.zeros(8, np.float32))
    ref = ln_ref(x.astype(np.float64), 1.0, 0.0)[0]
    assert_within(f64(out), ref, 1e-5 * (1 + np.abs(ref)), "NumPy inputs")
    assert _C._op_sum(np.ones(10, np.float32)) == 10.0


@requires_cuda
def test_cuda_tensors_are_refused():
    xc = pyxtts.tensor(np.ones((4, 5), np.float32), device="cuda:0")
    x = T(np.ones((4, 5)))
    with pytest.raises(ValueError, match="^B: expected a tensor on cpu, got one on cuda:0"):
        _C._op_gemm(x, xc, trans_b=True)
    with pytest.raises(ValueError, match="^weight: expected a tensor on cpu"):
        _C._op_layernorm_forward(x, pyxtts.tensor(np.ones(5, np.float32), device="cuda:0"), T(np.ones(5)))

