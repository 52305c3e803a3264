"""``forward_backward(on_gradients=)``: the backward tells its caller, group by group, which
gradients are done, so their all-reduce (``pyxtts.distributed``'s buckets) can start while
the rest of the backward runs. Checked here in one process: the groups cover every
parameter once, in backward order; each group's values at the call are its final values;
the step's bits do not change; the buckets launch what the groups cover."""
from __future__ import annotations

import numpy as np
import pytest

import pyxtts
from pyxtts.batch import train_step_with_accumulation
from pyxtts.strategy import SingleProcess

from dist_common import CFG, SEED, global_batch  # noqa: E402

# with the conditioning path: its group comes last, after the embeddings'
COND_CFG = pyxtts.ModelConfig(n_layers=3, d_model=32, n_heads=4, text_vocab_size=41, audio_vocab_size=23,
                              max_text_tokens=16, max_audio_tokens=24, n_cond_latents=32, conditioning=True,
                              max_cond_frames=40, dropout=0.1)


def cond_batch(rng: np.random.Generator, b: int = 3) -> dict[str, np.ndarray]:
    lt, la = 10, 14
    return {"text_inputs": rng.integers(0, 41, (b, lt)), "text_targets": rng.integers(0, 41, (b, lt)),
            "audio_inputs": rng.integers(0, 23, (b, la)), "audio_targets": rng.integers(0, 23, (b, la)),
            "text_lengths": np.array([lt] + [lt - 2] * (b - 1)), "audio_lengths": np.array([la] + [la - 3] * (b - 1)),
            "cond_mels": rng.standard_normal((b, 80, 40)).astype(np.float32)}


def offsets(model: pyxtts.XTTSGPT) -> dict[str, tuple[int, int]]:
    """Each gradient's [start, end) in elements of the flat gradient buffer."""
    base = model.flat_gradients().data_ptr()
    out = {}
    for name, g in model.gradients().items():
        start = (g.data_ptr() - base) // 4
        out[name] = (start, start + int(np.prod(g.shape)))
    return out


def flat_view(model: pyxtts.XTTSGPT) -> np.ndarray:
    """The flat gradients as a NumPy view (no copy), taken outside a step."""
    return np.from_dlpack(model.flat_gradients())


def run_with_hook(model: pyxtts.XTTSGPT, batch: dict) -> tuple[list[tuple[int, int]], list[np.ndarray]]:
    calls: list[tuple[int, int]] = []
    seen: list[np.ndarray] = []
    flat = flat_view(model)  # taken before the step: the model is busy inside it

    def hook(offset: int, count: int) -> None:
        calls.append((offset, count))
        seen.append(flat[offset:offset + count].copy())

    model.forward_backward(batch, zero_grad=True, dropout_step=3, on_gradients=hook)
    return calls, seen


@pytest.mark.parametrize("which", ["plain", "conditioning"])
def test_groups_cover_every_gradient_once_in_backward_order_with_their_final_values(which, rng):
    if which == "plain":
        model, batch = pyxtts.XTTSGPT(CFG, seed=SEED), global_batch(0)
    else:
        model, batch = pyxtts.XTTSGPT(COND_CFG, seed=SEED), cond_batch(rng)
    flat = flat_view(model)
    flat[:] = np.nan  # poison: the step zeroes, then adds
    calls, seen = run_with_hook(model, batch)
    n_layers = model.config.n_layers
    assert len(calls) == n_layers + 2 + (which == "conditioning")
    cover = np.zeros(flat.size, np.int64)
    for offset, count in calls:
        cover[offset:offset + count] += 1
    spans = offsets(model)
    assert len(spans) == len(model.parameters())
    assert all(0 <= lo < hi <= flat.size for lo, hi in spans.values())
    for name, (lo, hi) in spans.items():
        assert (cover[lo:hi] == 1).all(), name
    # everything a group covers beyond the tensors is padding, zero
    inside = np.zeros(flat.size, bool)
    for lo, hi in spans.values():
        inside[lo:hi] = True
    assert (flat[(cover == 1) & ~inside] == 0).all()
    # backward order: the heads' group above the blocks', the blocks from the last, the
    # embeddings at the bottom; then the conditioning path's (at the buffer's end)
    starts = [o for o, _ in calls]
    gpt = starts[:n_layers + 2]
    assert gpt == sorted(gpt, reverse=True)
    assert gpt[-1] == 0
    if which == "conditioning":
        assert starts[-1] > gpt[0]
        assert np.abs(seen[-1]).sum() > 0  # the path was trained
    # each group's values when the hook ran are its final ones (nothing adds to it later)
    for (offset, count), values in zip(calls, seen):
        np.testing.assert_array_equal(values, flat[offset:offset + count])
    assert np.isfinite(flat).all() and np.abs(flat).sum() > 0


def test_the_hook_changes_no_bit():
    a, b = pyxtts.XTTSGPT(CFG, seed=SEED), pyxtts.XTTSGPT(CFG, seed=SEED)
    batch = global_batch(1)
    run_with_hook(a, batch)
    b.forward_backward(batch, zero_grad=True, dropout_step=3)
    np.testing.assert_array_equal(a.flat_gradients().numpy(), b.flat_gradients().numpy())


def test_a_hook_that_raises_stops_the_step_with_its_exception_and_the_model_stays_usable():
    model = pyxtts.XTTSGPT(CFG, seed=SEED)
    batch = global_batch(2)
    calls: list = []

    def hook(offset: int, count: int) -> None:
        calls.append(offset)
        raise KeyError("collective failed")

    with pytest.raises(KeyError, match="collective failed"):
        model.forward_backward(batch, on_gradients=hook)
    assert len(calls) == 1  # the first group stopped the step
    model.forward_backward(batch, zero_grad=True)  # not left busy


def test_the_model_is_busy_while_the_hook_runs():
    model = pyxtts.XTTSGPT(CFG, seed=SEED)
    errors: list[str] = []

    def hook(offset: int, count: int) -> None:
        try:
            model.zero_grad()
        except RuntimeError as exc:
            errors.append(str(exc))

    model.forward_backward(global_batch(0), on_gradients=hook)
    assert len(errors) == CFG.n_layers + 2 and all("a step of this model is running" in e for e in errors)


@pytest.mark.parametrize("bad", [3, "f", object()])
def test_on_gradients_must_be_callable(bad):
    model = pyxtts.XTTSGPT(CFG, seed=SEED)
    with pytest.raises(TypeError, match="on_gradients: expected None or a callable"):
        model.forward_backward(global_batch(0), on_gradients=bad)


class HookedProcess(SingleProcess):
    """One process whose gradient hook records what it is told, and when."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, np.ndarray]] = []
        self.handed = 0

    def gradient_hook(self, model):
        self.handed += 1
        flat = flat_view(model)
        return lambda offset, count: self.calls.append((offset, count, flat[offset:offset + count].copy()))


@pytest.mark.parametrize("accumulation", [1, 3])
def test_the_step_hands_the_hook_to_its_last_micro_batch_only(accumulation):
    plain, hooked = pyxtts.XTTSGPT(CFG, seed=SEED), pyxtts.XTTSGPT(CFG, seed=SEED)
    strategy = HookedProcess()
    for model, s in ((plain, None), (hooked, strategy)):
        opt = pyxtts.AdamW(model, lr=1e-3, grad_clip=1.0)
        for step in range(2):
            train_step_with_accumulation(model, opt, global_batch(step), accumulation, strategy=s)
    assert strategy.handed == 2
    assert len(strategy.calls) == 2 * (CFG.n_layers + 2)
    for name, value in plain.state_dict().items():
        np.testing.assert_array_equal(value, hooked.state_dict()[name], err_msg=name)
    # the values each call saw are the step's whole accumulated gradient there (the last
    # step's: its gradients stay in the buffer after the optimizer step)
    flat = flat_view(hooked)
    for offset, count, values in strategy.calls[CFG.n_layers + 2:]:
        np.testing.assert_array_equal(values, flat[offset:offset + count])


class FakeWork:
    def __init__(self, log: list, bucket: np.ndarray) -> None:
        self.log, self.bucket = log, bucket

    def wait(self) -> None:
        self.log.append(("wait", self.bucket.size))


class FakeDist:
    """What ``_Buckets`` asks of torch.distributed: an async all-reduce, recorded."""

    class ReduceOp:
        SUM = "sum"

    def __init__(self) -> None:
        self.log: list = []
        self.ranges: list[tuple[int, int]] = []

    def all_reduce(self, bucket: np.ndarray, op: str, async_op: bool) -> FakeWork:
        assert op == "sum" and async_op
        base = self.base.__array_interface__["data"][0]
        start = (bucket.__array_interface__["data"][0] - base) // 4
        self.ranges.append((start, start + bucket.size))
        self.log.append(("launch", bucket.size))
        return FakeWork(self.log, bucket)


@pytest.mark.parametrize("cap", [1, 4096, 1 << 40])
def test_buckets_launch_every_gradient_once_and_merge_neighbours_up_to_their_size(cap, rng):
    from pyxtts.distributed import _Buckets

    model = pyxtts.XTTSGPT(COND_CFG, seed=SEED)
    flat = flat_view(model)
    dist = FakeDist()
    dist.base = flat
    buckets = _Buckets(dist, flat, cap)
    model.forward_backward(cond_batch(rng), zero_grad=True, on_gradients=buckets)
    launched_in_backward = len(dist.ranges)
    buckets.wait()
    cover = np.zeros(flat.size, np.int64)
    for lo, hi in dist.ranges:
        cover[lo:hi] += 1
    spans = offsets(model)
    assert all(0 <= lo < hi <= flat.size for lo, hi in spans.values())
    for name, (lo, hi) in spans.items():
        assert (cover[lo:hi] == 1).all(), name
    assert cover.max() == 1 and buckets.covered == cover.sum()
    groups = COND_CFG.n_layers + 3
    if cap == 1:  # every group is a bucket, each launched during the backward
        assert len(dist.ranges) == groups and launched_in_backward == groups
    if cap == 1 << 40:  # the GPT's groups are neighbours: one bucket; the conditioning path's another
        assert len(dist.ranges) == 2
    if cap == 4096:  # 1024 elements or more: launched as soon as they are
        assert all(hi - lo >= 1024 for lo, hi in dist.ranges[:launched_in_backward])
    waits = [e for e in dist.log if e[0] == "wait"]
    assert len(waits) == len(dist.ranges) and dist.log[-1][0] == "wait"


@pytest.mark.parametrize("behaviour", ["returns", "interrupt", "nested", "same_model"])
def test_odd_hooks(behaviour):
    """What a hook returns is ignored; Ctrl-C inside it stops the step like any exception; a
    hook may run another model's step; the same model's step inside it is refused."""
    model, other = pyxtts.XTTSGPT(CFG, seed=SEED), pyxtts.XTTSGPT(CFG, seed=SEED + 1)
    batch = global_batch(0)
    refused: list[str] = []

    def hook(offset: int, count: int) -> object:
        if behaviour == "interrupt":
            raise KeyboardInterrupt
        if behaviour == "nested":
            other.forward_backward(batch)
        if behaviour == "same_model":
            try:
                model.forward_backward(batch)
            except RuntimeError as exc:
                refused.append(str(exc))
        return object()

    if behaviour == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            model.forward_backward(batch, on_gradients=hook)
    else:
        model.forward_backward(batch, zero_grad=True, dropout_step=0, on_gradients=hook)
        ref = pyxtts.XTTSGPT(CFG, seed=SEED)
        ref.forward_backward(batch, zero_grad=True, dropout_step=0)
        np.testing.assert_array_equal(model.flat_gradients().numpy(), ref.flat_gradients().numpy())
    assert len(refused) == (CFG.n_layers + 2 if behaviour == "same_model" else 0)
    model.forward_backward(batch)  # usable afterwards
