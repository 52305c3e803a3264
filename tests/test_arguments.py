"""Every entry point converts its arguments with one set of converters: a bad argument
is a TypeError or ValueError whose message names the argument and what came, never a
bare OverflowError, a UnicodeEncodeError or a crash, and nothing changes. The model
config's rules live in the engine alone: ModelConfig, the model and the planner say
the same."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import pyxtts
from pyxtts import _C

CFG = pyxtts.ModelConfig(n_layers=1, d_model=16, n_heads=2, text_vocab_size=11, audio_vocab_size=9,
                         max_text_tokens=8, max_audio_tokens=8, n_cond_latents=2)


@pytest.fixture(scope="module")
def model() -> pyxtts.XTTSGPT:
    return pyxtts.XTTSGPT(CFG)


def raises(exc, name: str, fn, *args, shows: str | None = None, **kwargs) -> str:
    """Calls fn; asserts exc with a message that starts with the argument's name (and
    shows the value that came, when given). Returns the message."""
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    assert type(info.value) is exc, repr(info.value)  # not a subclass such as OverflowError
    msg = str(info.value)
    del info  # the traceback holds this frame, which held info: a cycle that kept fn's model
    assert msg.startswith(name + ":"), msg
    if shows is not None:
        assert shows in msg, msg
    return msg


BIG = [2**31, 2**63, 2**70, -(2**70)]


@pytest.mark.parametrize("value", BIG)
def test_integers_out_of_range_name_the_argument(model, value):
    # for arguments without an upper bound: past 64 bits, or below their lower bound
    unbounded = value if abs(value) >= 2**63 else -value
    raises(ValueError, "device", pyxtts.tensor, [1.0], device=value, shows=str(value))
    raises(ValueError, "device", pyxtts.zeros, 2, device=value)
    raises(ValueError, "d_model", pyxtts.Block, value, 2, shows=str(value))
    raises(ValueError, "n_heads", pyxtts.Block, 16, value)
    raises(ValueError, "growth_interval", pyxtts.AdamW, model, growth_interval=unbounded,
           shows=str(unbounded))
    raises(ValueError, "batch_size", model.estimate_memory, value, 4, 4, shows=str(value))
    raises(ValueError, "cond_len", model.estimate_memory, 1, 4, 4, cond_len=value)
    raises(ValueError, "batch", pyxtts.Block(16, 2).estimate_memory, value, 4)
    raises(ValueError, "after", _C._inject_oom, 2**64 if value > 0 else -1, "cpu")  # never arms
    q = np.zeros((1, 2, 3, 4), np.float32)
    raises(ValueError, "max_sequence_length", pyxtts.attention, q, q, q,
           max_sequence_length=unbounded, shows=str(unbounded))
    raises(ValueError, "n_heads", _C._attention_qkv_forward, np.zeros((1, 3, 12), np.float32), value)


@pytest.mark.parametrize("value", [np.array(2.5), np.array([3]), np.float32(3.0)])
def test_integers_refused_by_their_own_index_name_the_argument(model, value):
    """A NumPy array has __index__, which refuses every array but a 0-d integer one; the
    refusal used to be NumPy's nameless "only integer scalar arrays can be converted"."""
    shown = repr(value) if isinstance(value, np.ndarray) else type(value).__name__
    raises(TypeError, "d_model", pyxtts.Block, value, 2, shows=shown)
    raises(TypeError, "growth_interval", pyxtts.AdamW, model, growth_interval=value, shows=shown)
    raises(TypeError, "seed", pyxtts.XTTSGPT, CFG, seed=value, shows=shown)
    raises(TypeError, "batch_size", model.estimate_memory, value, 4, 4, shows=shown)
    at = "shape at dim 1" if isinstance(value, np.ndarray) else "shape"
    raises(TypeError, at, pyxtts.zeros, (2, value), shows=shown)
    assert pyxtts.Block(np.array(16), np.int8(2)).d_model == 16  # integers NumPy hands out are ints


@pytest.mark.parametrize("value", [[], np.zeros(5, bool), 1, "no", None])
def test_flags_take_bools_only(model, value, rng):
    """A flag was parsed by truth value: causal=[] meant bidirectional, causal="no" causal,
    and an array raised NumPy's nameless "truth value ... is ambiguous"."""
    q = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    shown = type(value).__name__
    raises(TypeError, "causal", pyxtts.attention, q, q, q, causal=value, shows=shown)
    raises(TypeError, "causal", pyxtts.attention_forward, q, q, q, causal=value)
    out, lse = pyxtts.attention_forward(q, q, q)
    raises(TypeError, "causal", pyxtts.attention_backward, q, q, q, q, out, lse, causal=value)
    raises(TypeError, "cross_attention", pyxtts.Block, 16, 2, cross_attention=value, shows=shown)
    x = np.zeros((1, 3, 16), np.float32)
    raises(TypeError, "causal", pyxtts.Block(16, 2).forward, x, causal=value)
    raises(TypeError, "train", model.estimate_memory, 1, 4, 4, train=value)
    raises(TypeError, "train", pyxtts.estimate_memory, CFG, 1, 4, 4, train=value)
    raises(TypeError, "copy", pyxtts.tensor([1.0]).to, "cpu", copy=value)
    # NumPy's bools are bools
    np.testing.assert_array_equal(pyxtts.attention(q, q, q, causal=np.bool_(False)).numpy(),
                                  pyxtts.attention(q, q, q, causal=False).numpy())


@pytest.mark.parametrize("field", ["n_layers", "d_model", "n_heads", "text_vocab_size",
                                   "audio_vocab_size", "max_text_tokens", "max_audio_tokens",
                                   "n_cond_latents", "max_attention_sequence_length"])
@pytest.mark.parametrize("value", [2**31, -(2**40)])
def test_config_integers_out_of_range_name_the_field(field, value):
    raises(ValueError, f"ModelConfig.{field}", pyxtts.ModelConfig,
           **{**dataclasses.asdict(CFG), field: value}, shows=str(value))
    cfg = dataclasses.replace(CFG)
    setattr(cfg, field, value)  # a config changed after its checks: the engine still refuses it
    raises(ValueError, f"ModelConfig.{field}", pyxtts.XTTSGPT, cfg, shows=str(value))
    raises(ValueError, f"ModelConfig.{field}", pyxtts.estimate_memory, cfg, 1, 4, 4)


def test_seed_precision_and_policy_none_name_the_argument():
    raises(TypeError, "seed", pyxtts.XTTSGPT, CFG, seed=None, shows="NoneType")
    raises(TypeError, "seed", pyxtts.XTTSGPT, CFG, seed=1.5)
    raises(ValueError, "seed", pyxtts.XTTSGPT, CFG, seed=-1, shows="-1")
    raises(ValueError, "seed", pyxtts.XTTSGPT, CFG, seed=2**64, shows=str(2**64))
    raises(TypeError, "checkpointing", pyxtts.XTTSGPT, CFG, checkpointing=None, shows="NoneType")
    raises(TypeError, "precision", pyxtts.XTTSGPT, CFG, precision=None, shows="NoneType")
    raises(ValueError, "precision", pyxtts.XTTSGPT, CFG, precision="fp64", shows="'fp64'")
    raises(TypeError, "device", pyxtts.XTTSGPT, CFG, device=True, shows="bool")


@pytest.mark.parametrize("bad", ["\ud800", "full\x00junk", "none\x00", "\udcff\x00"])
def test_checkpointing_strings_that_are_not_names_are_refused(model, bad):
    before = model.checkpointing
    with pytest.raises(ValueError) as info:
        model.checkpointing = bad
    assert str(info.value).startswith("checkpointing:"), str(info.value)
    assert model.checkpointing == before
    block = pyxtts.Block(16, 2, checkpointing="selective")
    with pytest.raises(ValueError, match="^checkpointing:"):
        block.checkpointing = bad
    assert block.checkpointing == "selective"
    raises(ValueError, "checkpointing", pyxtts.Block, 16, 2, checkpointing=bad)
    raises(ValueError, "checkpointing", pyxtts.XTTSGPT, CFG, checkpointing=bad)
    raises(ValueError, "checkpointing", model.estimate_memory, 1, 4, 4, checkpointing=bad)
    raises(ValueError, "precision", pyxtts.XTTSGPT, CFG, precision=bad)


@pytest.mark.parametrize("bad", ["\ud800", "cpu\x00", "cuda:\udcff"])
def test_device_dtype_and_kind_strings_without_utf8_or_with_nul(bad):
    raises(ValueError, "device", pyxtts.tensor, [1.0], device=bad)
    raises(ValueError, "device", pyxtts.memory_stats, bad)
    raises(ValueError, "dtype", pyxtts.tensor, [1.0], dtype=bad)
    raises(ValueError, "dtype", pyxtts.empty, 2, dtype=bad)
    raises(ValueError, "kind", pyxtts.device_count, bad)
    raises(ValueError, "name", _C._attention_cpu_isa, bad)


def test_reals_name_the_argument(model):
    raises(TypeError, "fraction", pyxtts.set_memory_fraction, "0.5", "cpu", shows="str")
    raises(ValueError, "fraction", pyxtts.set_memory_fraction, 10**400, "cpu")
    raises(ValueError, "lr", pyxtts.AdamW, model, lr=10**400)
    raises(TypeError, "lr", pyxtts.AdamW, model, lr=True, shows="bool")
    raises(ValueError, "layer_norm_eps", pyxtts.Block, 16, 2, layer_norm_eps=1e300)
    raises(TypeError, "alpha", _C._op_gemm, np.eye(2, dtype=np.float32), np.eye(2, dtype=np.float32),
           alpha="1")
    assert model.estimate_memory(1, 4, 4).optimizer == 0  # every refused AdamW left nothing


def test_c_reals_refuse_complex_numbers_and_arrays(model):
    """A NumPy complex converted to its real part with a mere warning (grad_clip=1j was 0,
    clipping off; found by the fuzz), and arrays of one element or of a bool converted too."""
    for bad in (np.complex64(1j), np.complex128(2), 1j, np.array([0.5]), np.array(True), np.bool_(True)):
        raises(TypeError, "grad_clip", pyxtts.AdamW, model, grad_clip=bad, shows=type(bad).__name__)
        state = pyxtts.AdamW(model).state_dict()
        raises(TypeError, "grad_clip", pyxtts.AdamW(model).load_state_dict, {**state, "grad_clip": bad})
    for good in (np.float32(0.5), np.array(0.5), np.int64(2), np.longdouble(3.0)):
        assert pyxtts.AdamW(model, grad_clip=good).grad_clip == float(good)


def test_optional_none_keeps_the_default(model):
    assert pyxtts.tensor([1.0], device=None, dtype=None).device == "cpu"
    assert model.estimate_memory(1, 4, 4, cond_len=None, checkpointing=None).total > 0
    assert pyxtts.Block(16, 2, seed=None).estimate_memory(1, 4, checkpointing=None)["total"] > 0
    pyxtts.set_memory_limit(None, "cpu")
    assert pyxtts.memory_stats("cpu")["limit_bytes"] is None


def bad_configs():
    base = CFG.engine_args()  # the fields the engine takes (the framing ids are not its)
    return [
        {**base, "n_layers": 0}, {**base, "d_model": 15}, {**base, "n_heads": -1},
        {**base, "text_vocab_size": 0}, {**base, "n_cond_latents": -1},
        {**base, "max_attention_sequence_length": 0}, {**base, "layer_norm_eps": 0.0},
        {**base, "layer_norm_eps": float("inf")}, {**base, "text_loss_weight": -0.5},
        {**base, "audio_loss_weight": float("nan")}, {**base, "d_model": 4096, "n_heads": 16,
                                                      "max_attention_sequence_length": 1 << 20},
    ]


@pytest.mark.parametrize("fields", bad_configs(), ids=lambda f: None)
def test_config_rules_are_the_engines_in_every_entry_point(fields):
    with pytest.raises(ValueError) as engine:
        _C.check_model_config(**fields)
    msg = str(engine.value)
    assert msg.startswith("ModelConfig"), msg
    with pytest.raises(ValueError) as cfg:
        pyxtts.ModelConfig(**fields)
    assert str(cfg.value) == msg
    with pytest.raises(ValueError) as gpt:
        _C.GPT(**fields)
    assert str(gpt.value) == msg
    with pytest.raises(ValueError) as plan:
        _C.plan_memory(**fields, batch_size=1, text_len=1, audio_len=1)
    assert str(plan.value) == msg


def test_config_messages_name_field_rule_and_value():
    base = CFG.engine_args()  # the fields the engine takes (the framing ids are not its)
    assert pyxtts.ModelConfig(**base).d_model == 16
    raises(ValueError, "ModelConfig.d_model", pyxtts.ModelConfig, **{**base, "d_model": 15},
           shows="divisible by n_heads=2, got 15")
    raises(ValueError, "ModelConfig.text_vocab_size", pyxtts.ModelConfig,
           **{**base, "text_vocab_size": 0}, shows="must be >= 1, got 0")
    raises(ValueError, "ModelConfig.audio_loss_weight", pyxtts.ModelConfig,
           **{**base, "audio_loss_weight": -1.0}, shows="finite and >= 0")


def test_python_flags_and_devices_are_not_judged_by_truth_value(model):
    """keep_precision="no" was true; device=<array> raised NumPy's "truth value of an array
    is ambiguous" from `device or default` (found by the fuzz)."""
    cfg = pyxtts.XTTSConfig()
    raises(TypeError, "keep_precision", pyxtts.optimize_config, cfg, "80GiB", keep_precision="no", shows="'no'")
    raises(TypeError, "device", pyxtts.optimize_config, cfg, "80GiB", device=np.zeros(3))
    raises(TypeError, "device", cfg.memory_plan, device=np.zeros(3))
    raises(TypeError, "verify", pyxtts.find_optimal_batch_size, model, verify=1, shows="1")
    assert pyxtts.optimize_config(cfg, "80GiB", keep_precision=np.bool_(True))[0].training.precision == \
        cfg.training.precision


def test_python_integers_take_integers_only(model, tmp_path, rng):
    """Every integer argument of the Python layer goes through pyxtts._args.integer: a float,
    a 0-d float array or a bool is a TypeError naming the argument (bucket_factor=2.5 used to
    become 2 through int(), and the other validators raised ValueError for a wrong type);
    an integer out of range is a ValueError showing the range and the value."""
    from pyxtts.data import Sample, TTSDataset, batch_groups, write_shards
    from pyxtts.memtest import run_memtest
    from pyxtts.prepare.conditioning import reference_slice
    from pyxtts.prepare.pipeline import prepare
    from pyxtts.references import References

    ids = np.arange(3, dtype=np.int64)
    data = TTSDataset([Sample(ids, ids) for _ in range(4)])
    opt = pyxtts.AdamW(model)
    stats = np.ones(80)
    wav = np.ones(1000, np.float32)
    cases = [
        ("text_len", lambda v: pyxtts.find_optimal_batch_size(model, text_len=v)),
        ("max_batch_size", lambda v: pyxtts.find_optimal_batch_size(model, max_batch_size=v)),
        ("accumulation_steps", lambda v: pyxtts.train_step_with_accumulation(model, opt, {}, v)),
        ("samples_per_shard", lambda v: write_shards([], tmp_path / "s", samples_per_shard=v)),
        ("n_eval", lambda v: data.split(v)),
        ("batch_size", lambda v: batch_groups(data, v)),
        ("bucket_factor", lambda v: batch_groups(data, 2, bucket_factor=v)),
        ("batch_size", lambda v: run_memtest(pyxtts.XTTSConfig(), batch_size=v)),
        ("seed", lambda v: References(stats, seed=v)),
        ("code_stride_len", lambda v: References(stats, code_stride_len=v)),
        ("min_samples", lambda v: reference_slice(wav, rng, min_samples=v)),
        ("workers", lambda v: prepare(tmp_path, tmp_path, tmp_path / "o", workers=v)),
        ("max_text_tokens", lambda v: prepare(tmp_path, tmp_path, tmp_path / "o", max_text_tokens=v)),
        ("dropout_step", lambda v: setattr(model, "dropout_step", v)),
    ]
    for name, call in cases:
        for bad in (2.5, 2.0, np.array(2.5), True, "2"):
            raises(TypeError, name, call, bad, shows=repr(bad))
        raises(ValueError, name, call, -1, shows="got -1")
    raises(ValueError, "n_eval", data.split, 4, shows="expected an int in [1, 3], got 4")
    raises(ValueError, "dropout_step", setattr, model, "dropout_step", 2**64, shows=f"got {2**64}")
    assert [len(g) for g in batch_groups(data, np.int64(2), bucket_factor=np.array(3))] == [2, 2]


def test_python_reals_take_finite_real_numbers(model, tmp_path, rng):
    """Every real-number argument of the Python layer goes through pyxtts._args.real: a
    string, a bool, a complex number or an array is a TypeError naming the argument (the
    fractions and the monitor's interval raised ValueError for a wrong type, and refused
    np.float32, which is not a float); NaN, an infinity or a value out of range is a
    ValueError showing the rule and the value."""
    from helpers import random_batch
    from pyxtts.prepare.pipeline import prepare

    batch = random_batch(rng, CFG, 2, 4, 4)
    cases = [  # name, call, a value out of range, an accepted value
        ("safety_margin", lambda v: pyxtts.find_optimal_batch_size(model, safety_margin=v, verify=False),
         1.0, np.float32(0.25)),
        ("margin", lambda v: pyxtts.optimize_config(pyxtts.XTTSConfig(), "80GiB", margin=v), -0.5, np.float32(0.1)),
        ("interval", lambda v: pyxtts.GPUMonitor(interval=v), 0.0, np.float32(0.5)),
        ("lr", lambda v: pyxtts.ConstantLR(v), -1.0, np.float16(1e-3)),
        ("loss_scale", lambda v: model.forward_backward(batch, loss_scale=v), 0.0, np.array(2.0)),
        ("eval_fraction", lambda v: prepare(tmp_path, tmp_path, tmp_path / "o", eval_fraction=v), 1.0, None),
        ("min_seconds", lambda v: prepare(tmp_path, tmp_path, tmp_path / "o", min_seconds=v), 0.0, None),
    ]
    for name, call, out_of_range, good in cases:
        for bad in ("0.5", True, 1j, np.zeros(2), np.array("1")):
            raises(TypeError, name, call, bad)
        for bad in (float("nan"), float("inf"), -float("inf"), 10**400, out_of_range):
            raises(ValueError, name, call, bad, shows=f"got {bad!r}")
        if good is not None:
            call(good)


def test_a_value_is_not_a_dtype():
    """NumPy reads a dtype off an array or a scalar (its .dtype), so dtype=np.float32(1)
    was float32 and t.to(np.int32(-1)) cast to int32 where t.to(-1) is refused as a
    device (found by the fuzz's NumPy scalars). A value in either place is a TypeError."""
    t = pyxtts.zeros((2, 3), dtype=pyxtts.bool)
    for value in (np.int32(-1), np.float32(np.nan), np.int64(0), np.zeros(2), np.array(1.5)):
        raises(TypeError, "dtype", pyxtts.tensor, [1.0], dtype=value)
        raises(TypeError, "device", t.to, value)
        raises(TypeError, "dtype", t.to, None, value)
    assert t.to(np.float16).dtype is pyxtts.float16 and t.to(np.dtype("<f4")).dtype is pyxtts.float32
    assert pyxtts.tensor([1.0], dtype=np.uint8).dtype is pyxtts.uint8


def test_cli_messages_spell_the_arguments_they_name_as_flags():
    """The API's messages name its arguments; at the command line they read as the flags:
    "pass --overwrite (overwrite=True)" and "pass it: vocab= (--vocab)" showed both."""
    import pyxtts.cli
    from pyxtts._args import as_flags

    with pytest.raises(SystemExit):
        pyxtts.cli.main(["--version"])  # fills each command's flags
    assert as_flags("export", "vocab: missing: pass vocab='my vocab.json', or overwrite=True") == \
        "--vocab: missing: pass --vocab 'my vocab.json', or --overwrite"
    assert as_flags("memtest", "x: give its memory (memory='8GiB') or") == "x: give its memory (--memory 8GiB) or"
    # not the command's arguments, nor a config field's dotted name: left as they are
    assert as_flags("export", "strict=True and training.vocab='v.json'") == "strict=True and training.vocab='v.json'"
    assert as_flags("train", "vocab: x") == "vocab: x"


def test_the_walks_wrong_objects_name_their_argument(model, tmp_path):
    """A notebook user's slips that once failed inside (an AttributeError, a KeyError, a
    pathlib TypeError) or were taken as something else (an empty evaluation as loss 0,
    optimizer='adamw' by its truth value, a negative budget, apply='yes')."""
    from pyxtts.data import Sample, SyntheticDataset, TTSDataset, collate

    cfg = pyxtts.XTTSConfig(model=CFG)
    cfg.training.device = "cpu"
    cfg.training.checkpoint_dir = str(tmp_path / "run")
    t = pyxtts.Trainer(cfg, progress=False)
    ids = np.arange(1, 4)
    raises(ValueError, "dataset", t.evaluate, [], shows="empty list")
    raises(TypeError, "dataset", t.evaluate, {"text_inputs": ids}, shows="dict")
    raises(TypeError, "dataset", t.evaluate, [{"text": ids, "audio": ids}], shows="sample 0")
    raises(TypeError, "apply", t.find_optimal_batch_size, apply="yes")
    raises(TypeError, "resume", t.fit, TTSDataset([Sample(ids, ids)]), resume=1)
    raises(TypeError, "log_path", pyxtts.Trainer, cfg, log_path=5)
    raises(TypeError, "path", pyxtts.XTTSConfig.load, None)
    raises(ValueError, "path", pyxtts.XTTSConfig.load, "")
    raises(TypeError, "config", SyntheticDataset, cfg, 4, shows="XTTSConfig's .model")
    raises(ValueError, "n_samples", SyntheticDataset, CFG, -1)
    raises(TypeError, "n_samples", SyntheticDataset, CFG, 1.5)
    raises(ValueError, "seed", SyntheticDataset, CFG, 4, seed=-1)
    raises(TypeError, "collate: config", collate, [Sample(ids, ids)], config=cfg)
    raises(TypeError, "optimizer", model.estimate_memory, 1, 4, 4, optimizer="adamw")
    raises(TypeError, "optimizer", pyxtts.estimate_memory, CFG, 1, 4, 4, optimizer=0)
    raises(ValueError, "budget", model.estimate_memory, 1, 4, 4, budget=-1)
    raises(ValueError, "budget", pyxtts.estimate_memory, CFG, 1, 4, 4, budget=0)


def test_a_tensor_numpy_cannot_convert_is_refused_with_numpys_reason(model):
    """A torch tensor that requires grad, or in bfloat16, was refused as 'expected an
    array, got Tensor', which hid what to do about it."""
    torch = pytest.importorskip("torch")
    from pyxtts.batch import _synthetic_batch

    batch = _synthetic_batch(CFG, 2, 4, 4, 2)
    for bad, said in ((torch.ones(2, 5, requires_grad=True), "detach"),
                      (torch.ones(2, 5, dtype=torch.bfloat16), "BFloat16")):
        raises(TypeError, "batch['text_inputs']", model.forward, {**batch, "text_inputs": bad}, shows=said)
