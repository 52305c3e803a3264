"""The fuzz's child process (run by tests/test_fuzz.py; not a test module itself).

Draws `count` cases with hypothesis from the run's seed, each one public entry point
called with hostile arguments (wrong types, dtypes, shapes, strides, NaN/inf, ids out of
range, lengths beyond the arrays, missing/misspelled/extra batch keys, huge sizes, odd
device strings). Before a case runs its description is printed and flushed, so a child
that dies names the case it died in. A case passes when the call returns, or raises one
of the exception types a caller is promised (TypeError, ValueError, KeyError for batch
keys, BufferError from DLPack, MemoryError for sizes no machine has); anything else
(OverflowError, AttributeError, UnicodeEncodeError, SystemError, ...) is printed as a
finding. Usage: python fuzz_child.py COUNT SEED
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import pyxtts

ALLOWED = (TypeError, ValueError, KeyError, BufferError, MemoryError, NotImplementedError)
CFG = pyxtts.ModelConfig(n_layers=1, d_model=8, n_heads=2, text_vocab_size=7, audio_vocab_size=5,
                         max_text_tokens=6, max_audio_tokens=8, n_cond_latents=2)
MODEL = pyxtts.XTTSGPT(CFG, seed=0)
OPT = pyxtts.AdamW(MODEL)
TMP = Path(tempfile.mkdtemp(prefix="pyxtts-fuzz-"))

huge_ints = st.sampled_from([-(2**70), -(2**31), -1, 0, 1, 2, 3, 2**31 - 1, 2**31, 2**32, 2**63, 2**70])
odd_floats = st.sampled_from([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45, 1e38, 3e38, 1e308, -1.0])
odd_strings = st.sampled_from(["", "cpu", "cuda", "cuda:0", "cuda:99", "cpu:1", "cuda:-1", "CPU", "cuda:0 ",
                               "\ud800", "full\x00junk", "fp32", "bf16", "float16", "none", "full", "auto",
                               "selective", "torch.float32", "int8", "é", "cuda:" + "9" * 30])
dtypes = st.sampled_from([np.float32, np.float64, np.float16, np.int8, np.int32, np.int64, np.uint8,
                          np.uint64, np.bool_, np.complex64, object])


@st.composite
def arrays(draw, max_dims=4, max_side=5):
    dt = draw(dtypes)
    shape = tuple(draw(st.lists(st.integers(0, max_side), max_size=max_dims)))
    n = int(np.prod(shape)) if shape else 1
    if dt is object:
        a = np.empty(shape, dtype=object)
    else:
        base = draw(st.sampled_from([np.arange(n) - 2, np.full(n, np.nan), np.full(n, 1e38), np.ones(n)]))
        with np.errstate(all="ignore"):
            a = np.asarray(base).astype(dt).reshape(shape)
    kind = draw(st.sampled_from(["plain", "fortran", "strided", "readonly", "byteswapped"]))
    if kind == "fortran":
        a = np.asfortranarray(a)
    elif kind == "strided" and a.ndim:
        a = np.repeat(a, 2, axis=-1)[..., ::2]
    elif kind == "readonly":
        a = a.copy()
        a.flags.writeable = False
    elif kind == "byteswapped" and a.dtype.kind in "fiu":
        a = a.astype(a.dtype.newbyteorder())
    return a


values = st.one_of(st.none(), st.booleans(), huge_ints, odd_floats, odd_strings, arrays(),
                   st.lists(st.integers(-3, 3), max_size=4), st.just(object()), st.just({}),
                   st.tuples(st.integers(-2, 70), st.integers(-2, 70)))


@st.composite
def batches(draw):
    B = draw(st.integers(0, 3))
    Lt, La = draw(st.integers(0, 8)), draw(st.integers(0, 10))
    lo, hi = draw(st.sampled_from([(0, 7), (-2, 9), (0, 2**31 + 5)]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b = {"text_inputs": rng.integers(lo, hi, (B, Lt)), "text_targets": rng.integers(lo - 1, hi, (B, Lt)),
         "audio_inputs": rng.integers(lo, 5, (B, La)), "audio_targets": rng.integers(-1, 5, (B, La)),
         "text_lengths": rng.integers(-1, Lt + 2, B), "audio_lengths": rng.integers(-1, La + 2, B)}
    if draw(st.booleans()):
        b["cond_latents"] = draw(st.sampled_from([
            rng.standard_normal((B, 2, 8)).astype(np.float32), np.full((B, 2, 8), np.nan, np.float32),
            rng.standard_normal((B, 3, 7)), np.zeros((B, 0, 8))]))
    edit = draw(st.sampled_from(["none", "drop", "misspell", "extra", "replace"]))
    key = draw(st.sampled_from(sorted(b)))
    if edit == "drop":
        b.pop(key)
    elif edit == "misspell":
        b[key[:-1] + "z"] = b.pop(key)
    elif edit == "extra":
        b["speaker"] = np.zeros(B)
    elif edit == "replace":
        b[key] = draw(values)
    return b


def kw(draw, names):
    return {n: draw(values) for n in names if draw(st.booleans())}


def tensor_of(draw):
    a = draw(arrays())
    try:
        return pyxtts.tensor(a)
    except ALLOWED:
        return pyxtts.zeros((2, 3))


@st.composite
def cases(draw):
    """(description, thunk) of one call."""
    which = draw(st.sampled_from([
        "tensor", "empty", "from_dlpack", "to", "copy_", "dlpack", "attention", "config", "model",
        "forward_backward", "forward", "estimate", "plan", "load_state_dict", "adamw", "opt_load",
        "memory", "block", "accumulate", "save", "load", "checkpointing", "find_batch"]))
    v1, v2, v3 = draw(values), draw(values), draw(values)
    if which == "tensor":
        return which, (v1, v2, v3), lambda: pyxtts.tensor(draw(arrays()), dtype=v1, device=v2)
    if which == "empty":
        return which, (v1, v2, v3), lambda: pyxtts.empty(v1, dtype=v2, device=v3)
    if which == "from_dlpack":
        return which, (v1,), lambda: pyxtts.from_dlpack(v1)
    if which == "to":
        t = tensor_of(draw)
        return which, (v1, v2), lambda: t.to(device=v1, dtype=v2)
    if which == "copy_":
        t, src = tensor_of(draw), draw(st.one_of(values, st.builds(lambda: pyxtts.zeros((2, 3)))))
        return which, (src,), lambda: t.copy_(src)
    if which == "dlpack":
        t = tensor_of(draw)
        args = kw(draw, ["stream", "max_version", "dl_device", "copy"])
        return which, args, lambda: t.__dlpack__(**args)
    if which == "attention":
        shapes = [tuple(draw(st.lists(st.integers(0, 5), min_size=3, max_size=5))) for _ in range(3)]
        qkv = [np.ones(s, np.float32) if draw(st.booleans()) else draw(arrays()) for s in shapes]
        args = kw(draw, ["causal", "q_lengths", "k_lengths", "key_mask", "scale", "max_sequence_length"])
        return which, (shapes, args), lambda: pyxtts.attention(*qkv, **args)
    if which == "config":
        args = kw(draw, ["n_layers", "d_model", "n_heads", "text_vocab_size", "audio_vocab_size",
                         "max_text_tokens", "max_audio_tokens", "n_cond_latents", "layer_norm_eps",
                         "text_loss_weight", "max_attention_sequence_length", "start_text_token"])
        return which, args, lambda: pyxtts.ModelConfig(**args)
    if which == "model":
        args = kw(draw, ["device", "precision", "checkpointing", "seed"])
        return which, args, lambda: pyxtts.XTTSGPT(CFG, **args)
    if which in ("forward_backward", "forward"):
        b = draw(batches())
        tc = draw(st.one_of(st.none(), st.tuples(huge_ints, huge_ints), values))
        f = MODEL.forward_backward if which == "forward_backward" else MODEL.forward
        return which, {k: getattr(v, "shape", v) for k, v in b.items()}, lambda: f(b, token_counts=tc)
    if which == "estimate":
        return which, (v1, v2, v3), lambda: MODEL.estimate_memory(v1, v2, v3, **kw(draw, ["cond_len",
                                                                                         "checkpointing",
                                                                                         "budget"]))
    if which == "plan":
        return which, (v1, v2, v3), lambda: pyxtts.estimate_memory(CFG, v1, v2, v3, cond_len=draw(values))
    if which == "load_state_dict":
        state = MODEL.state_dict()
        key = draw(st.sampled_from(sorted(state)))
        state[draw(st.sampled_from([key, key + "x", "gpt." + key, 0]))] = v1
        return which, (key, v1), lambda: MODEL.load_state_dict(state, strict=draw(st.booleans()))
    if which == "adamw":
        args = kw(draw, ["lr", "betas", "eps", "weight_decay", "grad_clip", "loss_scale", "ema_decay",
                         "growth_interval", "decay"])
        return which, args, lambda: pyxtts.AdamW(MODEL, **args)
    if which == "opt_load":
        state = OPT.state_dict()
        key = draw(st.sampled_from(sorted(state)))
        state[key] = v1
        return which, (key, v1), lambda: OPT.load_state_dict(state)
    if which == "memory":
        f = draw(st.sampled_from([pyxtts.memory_stats, pyxtts.memory_allocated, pyxtts.empty_cache,
                                  pyxtts.device_info, pyxtts.reset_peak_memory_stats]))
        return which, (f.__name__, v1), lambda: f(v1)
    if which == "block":
        args = kw(draw, ["checkpointing", "device", "seed"])
        return which, (v1, v2, args), lambda: pyxtts.Block(v1, v2, **args)
    if which == "accumulate":
        b = draw(batches())
        return which, (v1,), lambda: pyxtts.train_step_with_accumulation(MODEL, OPT, b, v1)
    if which == "save":
        return which, (v1, v2), lambda: pyxtts.save_checkpoint(TMP / "f.safetensors", MODEL, step=v1, extra=v2)
    if which == "load":
        path = TMP / "g.safetensors"
        pyxtts.save_checkpoint(path, MODEL, OPT)
        raw = bytearray(path.read_bytes())
        # positions drawn independently of the file's length, which hypothesis must not see
        i = draw(st.integers(0, 2**31)) % len(raw)
        raw[i] ^= draw(st.integers(1, 255))
        cut = draw(st.one_of(st.none(), st.integers(0, 2**31)))
        path.write_bytes(bytes(raw if cut is None else raw[:cut % len(raw)]))
        return which, (i,), lambda: pyxtts.load_checkpoint(path, MODEL, OPT)
    if which == "checkpointing":
        return which, (v1,), lambda: setattr(MODEL, "checkpointing", v1)
    args = kw(draw, ["text_len", "audio_len", "start_batch_size", "max_batch_size", "safety_margin"])

    def find():  # a small budget, so that the verification step stays small
        pyxtts.set_memory_limit(pyxtts.memory_allocated("cpu") + (64 << 20), "cpu")
        pyxtts.find_optimal_batch_size(MODEL, OPT, **args)
    return which, args, find


def main() -> None:
    count, SEED = int(sys.argv[1]), int(sys.argv[2])  # the run's seed, from tests/test_fuzz.py
    findings = []
    tried = [0]

    @seed(SEED)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        name, desc, thunk = data.draw(cases())
        tried[0] += 1
        print(json.dumps({"start": f"{name} {desc!r}"[:400]}), flush=True)
        state = MODEL.state_dict()
        try:
            thunk()
        except ALLOWED:
            pass
        except Exception as exc:  # noqa: BLE001 - every other type is a finding
            findings.append(f"{name} {desc!r}"[:300] + f" -> {type(exc).__name__}: {exc}"[:300])
        finally:
            pyxtts.set_memory_limit(None, "cpu")
            MODEL.checkpointing = "none"
            MODEL.load_state_dict(state)  # the next case starts from the same model
        if not all(np.isfinite(v.astype(np.float32)).all() for v in MODEL.state_dict().values()):
            findings.append(f"{name} {desc!r}"[:300] + " -> left a non-finite parameter")

    run()
    print(json.dumps({"done": tried[0], "findings": findings}), flush=True)


if __name__ == "__main__":
    main()
