"""CUDA graphs of the step (``XTTSGPT.cuda_graphs``): the forward and the backward
recorded once per batch shape and replayed. A replay launches the kernels the step runs
without graphs, with the same arguments, so every loss and gradient must be the same
bits; the dropout masks must still be new each step (their keys are read from the
arena), and the heads' gathers (decided by each batch's lengths) run between the phases.
The switch's refusals run everywhere; the rest needs a GPU."""
from __future__ import annotations

import numpy as np
import pytest

import pyxtts
from conftest import requires_cuda
from helpers import random_batch
from test_conditioning import randomized_state

pytestmark = pytest.mark.usefixtures("no_limit_no_fault")

CFG = pyxtts.ModelConfig(n_layers=2, d_model=64, n_heads=4, text_vocab_size=97, audio_vocab_size=61,
                         max_text_tokens=24, max_audio_tokens=40, n_cond_latents=5, dropout=0.1,
                         max_cond_frames=60)


def test_graphs_need_a_cuda_device():
    m = pyxtts.XTTSGPT(CFG)
    assert m.cuda_graphs is False
    with pytest.raises(ValueError, match="cuda_graphs: graphs need a CUDA device; this model is on cpu"):
        m.cuda_graphs = True
    with pytest.raises(TypeError, match="cuda_graphs: expected True or False, got int"):
        m.cuda_graphs = 1
    with pytest.raises(ValueError, match="cuda_graphs: graphs need a CUDA device"):
        pyxtts.XTTSGPT(CFG, cuda_graphs=True)
    assert m.cuda_graphs is False
    assert m.graph_stats == {"recorded": 0, "replayed": 0, "evicted": 0, "failed": 0, "cached": 0,
                             "capacity": 8, "error": ""}


def test_the_environment_switch(monkeypatch):
    monkeypatch.setenv("PYXTTS_CUDA_GRAPHS", "on")
    with pytest.raises(ValueError, match=r"PYXTTS_CUDA_GRAPHS: expected '0' or '1', got 'on'"):
        pyxtts.XTTSGPT(CFG)
    monkeypatch.setenv("PYXTTS_CUDA_GRAPHS", "1")
    assert pyxtts.XTTSGPT(CFG).cuda_graphs is False  # a switch for CUDA models: the CPU has none


def _grads(m) -> dict[str, bytes]:
    return {k: v.numpy().tobytes() for k, v in m.gradients().items()}


def _key(batch) -> tuple:
    """What a graph is recorded for, from the batch's side: its shape, and whether some
    text is shorter than the batch's (padding before the audio: attention takes the mask)."""
    tl = np.asarray(batch["text_lengths"])
    Lt, La = batch["text_inputs"].shape[1], batch["audio_inputs"].shape[1]
    S = batch["cond_mels"].shape[-1] if "cond_mels" in batch else 0
    return len(tl), Lt, La, S, bool((tl < Lt).any())


def _batch(rng, cond: str, B: int, Lt: int, La: int, full: bool) -> dict:
    batch = random_batch(rng, CFG, B, Lt, La, 0 if cond == "mels" else None, full)
    if not full:  # padding before the audio for sure: attention takes the key mask
        batch["text_lengths"][-1] = min(batch["text_lengths"][-1], Lt - 1)
    if cond == "mels":
        batch["cond_mels"] = rng.standard_normal((B, 80, 30)).astype(np.float32)
    return batch


def _batches(rng, cond: str) -> list[dict]:
    """The largest first (the arena then serves every later step where it is: graphs hold
    its addresses), then two shapes taking turns, the first with and without padding
    before the audio, then the first again: every graph is recorded once, then replayed."""
    out = [_batch(rng, cond, 3, 20, 36, False)]
    for _ in range(2):
        out += [_batch(rng, cond, 3, 14, 22, False), _batch(rng, cond, 2, 9, 31, False),
                _batch(rng, cond, 3, 14, 22, True)]
    return out + [_batch(rng, cond, 3, 14, 22, False)]


def _pair(precision, policy, rng, seed):
    """Two models with the same state and seed: one steps as it comes, one replays graphs."""
    models = [pyxtts.XTTSGPT(CFG, device="cuda:0", precision=precision, checkpointing=policy,
                             seed=seed % 1000, cuda_graphs=g) for g in (False, True)]
    state = randomized_state(models[0], rng, 0.1)
    for m in models:
        m.load_state_dict(state)
    return models


@requires_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("cond", ["mels", "latents"])
@pytest.mark.parametrize("policy", ["none", "full"])
def test_replays_give_the_bits_of_the_step_as_it_comes(precision, cond, policy, rng, seed):
    eager, graphed = _pair(precision, policy, rng, seed)
    batches = _batches(rng, cond)
    losses = []
    for i, batch in enumerate(batches):
        want, got = (m.forward_backward(batch, keep_larger_arena=True) for m in (eager, graphed))
        msg = f"seed={seed} step {i} {_key(batch)}"
        assert got == want, msg  # every loss, bit for bit
        assert _grads(graphed) == _grads(eager), msg  # accumulated over the steps so far
        losses.append(got["loss"])
    keys = {_key(b) for b in batches}
    st = graphed.graph_stats
    assert st["failed"] == 0, st["error"]
    assert st["recorded"] == 2 * len(keys), st  # a forward and a backward per key
    assert st["replayed"] == 2 * len(batches) - st["recorded"], st
    assert st["cached"] == st["recorded"] and st["evicted"] == 0, st
    assert eager.graph_stats["recorded"] == 0
    # the dropout masks of a replay are new each step: the same batch twice, two losses
    a, b = (graphed.forward_backward(batches[1], keep_larger_arena=True) for _ in range(2))
    assert a["loss"] != b["loss"], (a, b)
    # evaluation records its own forward (nothing saved for backward), equal as well
    ev_want, ev_got = eager.forward(batches[1]), graphed.forward(batches[1])
    assert ev_got == ev_want
    assert graphed.graph_stats["recorded"] == st["recorded"] + 1


@requires_cuda
def test_more_shapes_than_the_cache_holds(rng, seed):
    eager, graphed = _pair("bf16", "none", rng, seed)
    shapes = [(2, 11 - i, 20 - 2 * i) for i in range(6)]  # the largest first: one arena
    for rnd in range(2):  # 12 graphs for 8 slots: evictions, then records again
        for B, Lt, La in shapes:
            batch = random_batch(rng, CFG, B, Lt, La, None, True)
            want, got = (m.forward_backward(batch, keep_larger_arena=True) for m in (eager, graphed))
            assert got == want
            assert _grads(graphed) == _grads(eager)
    st = graphed.graph_stats
    assert st["failed"] == 0, st["error"]
    assert st["cached"] == st["capacity"] == 8 and st["evicted"] == st["recorded"] - 8 > 0, st
    graphed.cuda_graphs = False  # frees them
    assert graphed.graph_stats["cached"] == 0 and graphed.cuda_graphs is False


@requires_cuda
def test_a_gradient_callback_runs_the_step_as_it_comes(rng, seed):
    """on_gradients (the data-parallel all-reduce) calls back during the backward: a replay
    would not, so that step's backward runs as it comes (its forward is recorded)."""
    eager, graphed = _pair("fp32", "none", rng, seed)
    batch = random_batch(rng, CFG, 3, 12, 20)
    seen: list[tuple[int, int]] = []
    graphed.forward_backward(batch, on_gradients=lambda off, n: seen.append((off, n)))
    eager.forward_backward(batch)
    assert seen and _grads(graphed) == _grads(eager)
    st = graphed.graph_stats
    assert st["recorded"] == 1 and st["replayed"] == 0, st  # the forward only


@requires_cuda
def test_two_threads_record_at_once(rng, seed):
    """Each recording thread has its own capture stream: two models stepping in two
    threads (the step runs without the GIL) both record and replay, each equal to its
    twin stepping as it comes."""
    import threading

    pairs = [_pair("bf16", "none", rng, seed + k) for k in range(2)]
    batches = [[_batch(rng, "latents", 3, 14, 22, k % 2 == 1) for k in range(4)] for _ in pairs]
    errors: list[BaseException] = []

    def run(graphed, bs):
        try:
            for b in bs:
                graphed.forward_backward(b, keep_larger_arena=True)
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(p[1], bs)) for p, bs in zip(pairs, batches)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for (eager, graphed), bs in zip(pairs, batches):
        for b in bs:
            eager.forward_backward(b, keep_larger_arena=True)
        st = graphed.graph_stats
        assert st["failed"] == 0 and st["recorded"] == 4 and st["replayed"] == 4, st
        assert _grads(graphed) == _grads(eager)
