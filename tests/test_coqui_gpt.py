"""pyxtts against Coqui's own GPT (coqui-tts 0.28.0, TTS.tts.layers.xtts.gpt.GPT):
``ModelConfig.from_xtts_config`` gives every parameter Coqui's GPT has its shape, and a
batch framed by ``collate`` gives Coqui's loss parts and gradients.

Tolerances: losses to 1e-5 relative, each gradient element to 1e-4 of its tensor's
largest magnitude (plus 1e-4 relative). Both sides compute in fp32 with sums in
different orders (Coqui: HF GPT-2 and F.cross_entropy; pyxtts: tiled attention and fused
heads); the differences seen are ~1e-7 on losses and ~1e-6 on gradients."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import pyxtts
from coqui import require_coqui
from fixtures_xtts import SMALL_ARGS, randomize, write_vocab
from pyxtts.coqui_config import XTTS_ARGS_DEFAULTS

CONDITIONING = ("conditioning_encoder.", "conditioning_perceiver.")
XTTS_V2 = {  # the sizes of the released XTTS v2 config.json
    "gpt_layers": 30, "gpt_n_model_channels": 1024, "gpt_n_heads": 16, "gpt_number_text_tokens": 6681,
    "gpt_start_text_token": 261, "gpt_stop_text_token": 0, "gpt_num_audio_tokens": 1026,
    "gpt_start_audio_token": 1024, "gpt_stop_audio_token": 1025, "gpt_max_text_tokens": 402,
    "gpt_max_audio_tokens": 605, "gpt_max_prompt_tokens": 70, "gpt_code_stride_len": 1024,
    "gpt_use_perceiver_resampler": True,
}


def coqui_gpt(args: dict, device=None):
    """Coqui's GPT built as Xtts.init_models builds it from these model_args."""
    c = require_coqui()
    a = {**XTTS_ARGS_DEFAULTS, **args}
    kw = dict(layers=a["gpt_layers"], model_dim=a["gpt_n_model_channels"], start_text_token=a["gpt_start_text_token"],
              stop_text_token=a["gpt_stop_text_token"], heads=a["gpt_n_heads"], max_text_tokens=a["gpt_max_text_tokens"],
              max_mel_tokens=a["gpt_max_audio_tokens"], max_prompt_tokens=a["gpt_max_prompt_tokens"],
              number_text_tokens=a["gpt_number_text_tokens"], num_audio_tokens=a["gpt_num_audio_tokens"],
              start_audio_token=a["gpt_start_audio_token"], stop_audio_token=a["gpt_stop_audio_token"],
              use_perceiver_resampler=a["gpt_use_perceiver_resampler"], code_stride_len=a["gpt_code_stride_len"])
    if device is None:
        return c.GPT(**kw)
    with c.torch.device(device):
        return c.GPT(**kw)


def test_xtts_args_defaults_are_coquis():
    c = require_coqui()
    args = c.XttsArgs()
    assert {k: getattr(args, k) for k in XTTS_ARGS_DEFAULTS} == XTTS_ARGS_DEFAULTS


@pytest.mark.parametrize("name, args", [
    ("small v2", SMALL_ARGS),
    ("xtts v2", XTTS_V2),
    ("v1, no perceiver", {**SMALL_ARGS, "gpt_use_perceiver_resampler": False, "gpt_n_heads": 8,
                          "gpt_max_prompt_tokens": 40, "gpt_num_audio_tokens": 8194, "gpt_start_audio_token": 8192,
                          "gpt_stop_audio_token": 8193}),
    ("defaults elsewhere", {"gpt_layers": 2, "gpt_n_model_channels": 64, "gpt_n_heads": 4,
                            "gpt_number_text_tokens": 256, "gpt_start_text_token": 255, "gpt_stop_text_token": 0}),
])
def test_every_parameter_has_coquis_shape(name, args):
    ref = {k: tuple(v.shape) for k, v in coqui_gpt(args, device="meta").state_dict().items()}
    cfg = pyxtts.ModelConfig.from_xtts_config({"model_args": args})
    assert cfg.n_heads == {**XTTS_ARGS_DEFAULTS, **args}["gpt_n_heads"]
    precision = "bf16" if cfg.d_model >= 512 else "fp32"  # the XTTS v2 size in half the memory
    params = pyxtts.XTTSGPT(cfg, precision=precision).parameters()
    assert {k: v.shape for k, v in params.items()} == {k: ref[k] for k in params}, name
    # XTTS v2's conditioning path is pyxtts's too; what Coqui has beyond that is XTTS v1's
    # conditioning (its encoder without the perceiver, and the prompt embeddings)
    rest = sorted(set(ref) - set(params))
    assert cfg.conditioning == cfg.use_perceiver_resampler
    prompt = [] if cfg.use_perceiver_resampler else ["prompt_embedding.weight", "prompt_pos_embedding.emb.weight"]
    assert [k for k in rest if not k.startswith(CONDITIONING)] == prompt
    assert len(rest) == (0 if cfg.use_perceiver_resampler else 38 + 2)
    a = {**XTTS_ARGS_DEFAULTS, **args}
    assert cfg.n_cond_latents == (32 if a["gpt_use_perceiver_resampler"] else a["gpt_max_prompt_tokens"])
    assert (cfg.start_text_token, cfg.stop_text_token, cfg.start_audio_token, cfg.stop_audio_token) == (
        a["gpt_start_text_token"], a["gpt_stop_text_token"], a["gpt_start_audio_token"], a["gpt_stop_audio_token"])


def test_text_tokens_come_from_vocab_json_as_coquis_loader_takes_them(tmp_path):
    c = require_coqui()
    vocab = write_vocab(tmp_path / "vocab.json", 310)
    doc = {"model_args": {**SMALL_ARGS, "gpt_number_text_tokens": None, "gpt_start_text_token": None,
                          "gpt_stop_text_token": None}}
    (tmp_path / "config.json").write_text(json.dumps(doc))
    cfg = pyxtts.ModelConfig.from_xtts_config(tmp_path / "config.json")
    tok = c.VoiceBpeTokenizer(vocab)
    assert (cfg.text_vocab_size, cfg.start_text_token, cfg.stop_text_token) == (
        tok.get_number_tokens(), tok.tokenizer.token_to_id("[START]"), tok.tokenizer.token_to_id("[STOP]"))
    with pytest.raises(ValueError, match="gpt_number_text_tokens: not set; Coqui takes it from the tokenizer"):
        pyxtts.ModelConfig.from_xtts_config(doc)


# ---- the framed batch through both ----------------------------------------------------

def random_samples(rng, B, max_text, max_codes, text_vocab):
    texts = [rng.integers(0, text_vocab, int(rng.integers(1, max_text + 1))) for _ in range(B)]
    codes = [rng.integers(0, 1024, int(rng.integers(1, max_codes + 1))) for _ in range(B)]
    return texts, codes


def coqui_losses(gpt, texts, codes, cond_latents, rng, cond_idxs=None):
    """Coqui's loss parts and gradients for the samples, fed as its trainer feeds them:
    text padded with 0, the DVAE codes of the padded batch (past each sample's codes
    anything: Coqui overwrites them), waveform lengths whose ceil(len / 1024) is the
    number of codes, cond_latents in place of the conditioning path."""
    c = require_coqui()
    torch = c.torch
    B = len(texts)
    text = np.zeros((B, max(map(len, texts))), np.int64)
    audio = rng.integers(0, 1024, (B, max(map(len, codes)) + 2))
    for i, (t, a) in enumerate(zip(texts, codes)):
        text[i, :len(t)] = t
        audio[i, :len(a)] = a
    wav = np.array([len(a) * 1024 - int(rng.integers(0, 1024)) for a in codes])
    gpt.zero_grad()
    lt, lm, _ = gpt(torch.from_numpy(text), torch.tensor([len(t) for t in texts]), torch.from_numpy(audio),
                    torch.from_numpy(wav), cond_mels=torch.zeros(B, 1, 80, 8),
                    cond_idxs=None if cond_idxs is None else torch.tensor(cond_idxs),
                    cond_latents=torch.from_numpy(cond_latents))
    (0.01 * lt + 1.0 * lm).backward()
    grads = {k: p.grad.numpy().copy() for k, p in gpt.named_parameters() if p.grad is not None}
    return float(lt.detach()), float(lm.detach()), grads


def pyxtts_losses(cfg, gpt, texts, codes, cond_latents, checkpointing, ignore=None):
    """With dropout 0, as Coqui's GPT in eval mode (test_dropout.py tests dropout)."""
    model = pyxtts.XTTSGPT(dataclasses.replace(cfg, dropout=0.0), checkpointing=checkpointing)
    missing, unexpected = model.load_state_dict({k: v.detach().numpy() for k, v in gpt.state_dict().items()},
                                                strict=False)
    assert not missing and not unexpected
    batch = pyxtts.collate([pyxtts.Sample(t, a) for t, a in zip(texts, codes)], config=cfg,
                           ignore_code_ranges=ignore)
    batch["cond_latents"] = cond_latents
    r = model.forward_backward(batch)
    return r, {k: v.numpy() for k, v in model.gradients().items()}


def assert_agree(r, grads, lt, lm, ref, texts, codes, seed):
    assert r["text_tokens"] == sum(len(t) + 1 for t in texts) and r["audio_tokens"] <= sum(len(a) + 4 for a in codes)
    assert r["text_loss"] == pytest.approx(lt, rel=1e-5), seed
    assert r["audio_loss"] == pytest.approx(lm, rel=1e-5), seed
    for k, want in ref.items():  # Coqui's reached tensors (cond_latents: the GPT's)
        g = grads[k]
        scale = float(np.abs(want).max())
        assert scale > 0, (k, "a zero reference gradient proves nothing")
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4 * scale, err_msg=f"{k} (seed {seed})")


SIZES = {
    "tiny": ({**SMALL_ARGS}, 4, 18, 25),
    "realistic": ({**SMALL_ARGS, "gpt_layers": 3, "gpt_n_model_channels": 128, "gpt_n_heads": 8,
                   "gpt_number_text_tokens": 6681, "gpt_max_text_tokens": 402, "gpt_max_audio_tokens": 605},
                  3, 150, 250),  # up to Coqui's longest sample: 255995 samples = 250 codes
}


@pytest.mark.parametrize("size, checkpointing", [("tiny", "none"), ("tiny", "full"), ("realistic", "selective")])
def test_loss_and_gradients_match_coquis_gpt(size, checkpointing, rng, seed):
    c = require_coqui()
    args, B, max_text, max_codes = SIZES[size]
    gpt = coqui_gpt(args)
    randomize(gpt, seed % 2**31)
    gpt.eval()  # dropout off (pyxtts_losses too); nothing else in GPT.forward depends on it
    cfg = pyxtts.ModelConfig.from_xtts_config({"model_args": args})
    texts, codes = random_samples(rng, B, max_text, max_codes, cfg.text_vocab_size)
    texts[0], codes[-1] = texts[0][:1], codes[-1][:1]  # the shortest text and audio there are
    cond = rng.standard_normal((B, cfg.n_cond_latents, cfg.d_model)).astype(np.float32)
    lt, lm, ref = coqui_losses(gpt, texts, codes, cond, rng)
    r, grads = pyxtts_losses(cfg, gpt, texts, codes, cond, checkpointing)
    # fixed cond_latents reach no conditioning tensor, in Coqui (.grad None) as here (0)
    assert set(ref) == {k for k in grads if not k.startswith(CONDITIONING)}
    assert not any(np.any(g) for k, g in grads.items() if k.startswith(CONDITIONING))
    assert_agree(r, grads, lt, lm, ref, texts, codes, seed)
    assert r["audio_tokens"] == sum(len(a) + 4 for a in codes)
    del c


def test_ignored_codes_are_the_ones_coqui_masks(rng, seed):
    """Coqui masks the reference slice's targets for the batch's last sample only, at
    cond_idxs // 256 (its perceiver's frame stride); the same code range given to
    collate for that sample gives the same loss and gradients, so a code index means
    the same target on both sides."""
    args, B, max_text, max_codes = SIZES["tiny"]
    gpt = coqui_gpt(args)
    randomize(gpt, seed % 2**31 + 7)
    gpt.eval()
    cfg = pyxtts.ModelConfig.from_xtts_config({"model_args": args})
    texts, codes = random_samples(rng, B, max_text, max_codes, cfg.text_vocab_size)
    codes[-1] = rng.integers(0, 1024, 20)
    start = int(rng.integers(0, 8))
    end = int(rng.integers(start + 2, 18))
    cond_idxs = np.zeros((B, 2), np.int64)
    cond_idxs[-1] = (start * 256 + int(rng.integers(0, 256)), end * 256 + int(rng.integers(0, 256)))
    cond = rng.standard_normal((B, cfg.n_cond_latents, cfg.d_model)).astype(np.float32)
    lt, lm, ref = coqui_losses(gpt, texts, codes, cond, rng, cond_idxs=cond_idxs)
    r, grads = pyxtts_losses(cfg, gpt, texts, codes, cond, "none", ignore=[None] * (B - 1) + [(start, end)])
    assert r["audio_tokens"] == sum(len(a) + 4 for a in codes) - (end - start)
    assert_agree(r, grads, lt, lm, ref, texts, codes, seed)
    # the control: the mask matters. Not through the mean loss, which a random model
    # makes nearly the same with or without a few targets, but through the gradients
    _, unmasked = pyxtts_losses(cfg, gpt, texts, codes, cond, "none")
    change = max(float(np.abs(unmasked[k] - grads[k]).max() / np.abs(grads[k]).max()) for k in ref)
    assert change > 1e-2, f"the control: masking {end - start} targets changed the gradients by {change:.1e}"


def test_other_start_stop_ids_are_used(rng, seed):
    """Ids other than XTTS v2's (Coqui's GPT defaults: audio 8192/8193 of 8194 codes)."""
    args = {**SMALL_ARGS, "gpt_num_audio_tokens": 8194, "gpt_start_audio_token": 8192, "gpt_stop_audio_token": 8193}
    gpt = coqui_gpt(args)
    randomize(gpt, seed % 2**31 + 3)
    gpt.eval()
    cfg = pyxtts.ModelConfig.from_xtts_config({"model_args": args})
    assert (cfg.start_audio_token, cfg.stop_audio_token) == (8192, 8193)
    texts, codes = random_samples(rng, 3, 15, 20, cfg.text_vocab_size)
    cond = rng.standard_normal((3, 32, cfg.d_model)).astype(np.float32)
    lt, lm, ref = coqui_losses(gpt, texts, codes, cond, rng)
    r, grads = pyxtts_losses(cfg, gpt, texts, codes, cond, "none")
    assert_agree(r, grads, lt, lm, ref, texts, codes, seed)
    swapped = dataclasses.replace(cfg, start_audio_token=8193, stop_audio_token=8192)
    # the control: the ids matter, seen in the gradients (the mean loss of a random model
    # hardly moves when 2 targets per sample change)
    _, grads2 = pyxtts_losses(swapped, gpt, texts, codes, cond, "none")
    change = max(float(np.abs(grads2[k] - grads[k]).max() / np.abs(grads[k]).max()) for k in ref)
    assert change > 1e-2, f"the control: swapping the audio start/stop ids changed the gradients by {change:.1e}"
