"""The PyTorch references the engine is tested against, written from DESIGN.md alone (plain
torch, no transformers): one pre-LN GPT-2 block (``ref_block``, optionally with
cross-attention) and the XTTS GPT built from it (``RefGPT``). float64 by default. The
GPT's conditioning path is written from Coqui's source (TTS/tts/layers/tortoise/
{autoregressive,arch_utils}.py, TTS/tts/layers/xtts/perceiver_encoder.py), its dropout
applies the engine's masks from tests/philox.py."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

# the parameters of one block, as named under gpt.h.{i}. (and by pyxtts.Block), and of
# its optional cross-attention
BLOCK_PARAMS = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                "mlp.c_proj.weight", "mlp.c_proj.bias"]
CROSS_PARAMS = ["crossattn.ln.weight", "crossattn.ln.bias", "crossattn.q.weight", "crossattn.q.bias",
                "crossattn.kv.weight", "crossattn.kv.bias", "crossattn.c_proj.weight", "crossattn.c_proj.bias"]


def block_shapes(C, cross=False):
    """name -> shape of a block's parameters at width C."""
    s = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (C, 3 * C),
         "attn.c_attn.bias": (3 * C,), "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,),
         "ln_2.weight": (C,), "ln_2.bias": (C,), "mlp.c_fc.weight": (C, 4 * C), "mlp.c_fc.bias": (4 * C,),
         "mlp.c_proj.weight": (4 * C, C), "mlp.c_proj.bias": (C,)}
    if cross:
        s.update({"crossattn.ln.weight": (C,), "crossattn.ln.bias": (C,), "crossattn.q.weight": (C, C),
                  "crossattn.q.bias": (C,), "crossattn.kv.weight": (C, 2 * C), "crossattn.kv.bias": (2 * C,),
                  "crossattn.c_proj.weight": (C, C), "crossattn.c_proj.bias": (C,)})
    return s


def cond_groups(C: int) -> int:
    """Coqui's normalization(): 32 groups (8 up to 16 channels, 16 up to 64), halved until they divide C."""
    g = 8 if C <= 16 else 16 if C <= 64 else 32
    while C % g:
        g //= 2
    return g


def attend(q, k, v, allowed, keep=None):
    """q (B, H, Tq, D), k/v (B, H, Tk, D), allowed (B, Tq, Tk): explicit masked softmax;
    a query row that sees no key gets zeros (the engine's convention). keep (B, H, Tq, Tk):
    the dropout mask (0 or 1 / (1 - p)) on the probabilities."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    allowed = allowed[:, None]
    any_key = allowed.any(-1, keepdim=True)
    s = torch.where(allowed, s, torch.tensor(float("-inf"), dtype=s.dtype))
    s = torch.where(any_key, s, torch.zeros((), dtype=s.dtype))
    p = torch.softmax(s, dim=-1) * allowed * any_key
    return (p if keep is None else p * keep) @ v


def ref_block(params, x, H, key_mask=None, causal=True, context=None, context_mask=None, eps=1e-5,
              sdpa=False, drop=None):
    """y (B, T, C) of one block on x (B, T, C); params maps BLOCK_PARAMS (and crossattn.*
    with a context (B, Tc, C)) to tensors. sdpa: torch's fused attention (the benchmark
    baseline) instead of the explicit softmax; with no key mask and causal, its flash kernel.
    drop: GPT-2's dropout masks, (attention probabilities (B, H, T, T), attention branch
    (B, T, C or 1), MLP branch (B, T, C or 1)), or None."""
    B, T, C = x.shape
    D = C // H
    w = params

    def heads(t, L):
        return t.reshape(B, L, H, D).transpose(1, 2)

    kv = torch.ones(B, T, dtype=torch.bool) if key_mask is None else torch.as_tensor(key_mask) != 0
    allowed = kv[:, None, :].expand(B, T, T)
    if causal:
        allowed = allowed & torch.tril(torch.ones(T, T, dtype=torch.bool))[None]
    a = F.layer_norm(x, (C,), w["ln_1.weight"], w["ln_1.bias"], eps)
    qkv = a @ w["attn.c_attn.weight"] + w["attn.c_attn.bias"]
    q, k, v = (heads(t, T) for t in qkv.split(C, dim=2))
    if not sdpa:
        o = attend(q, k, v, allowed, None if drop is None else drop[0])
    elif key_mask is None and causal:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
    branch = o.transpose(1, 2).reshape(B, T, C) @ w["attn.c_proj.weight"] + w["attn.c_proj.bias"]
    x = x + (branch if drop is None else branch * drop[1])
    if context is not None:
        Tc = context.shape[1]
        cv = (torch.ones(B, Tc, dtype=torch.bool) if context_mask is None
              else torch.as_tensor(context_mask) != 0)
        a = F.layer_norm(x, (C,), w["crossattn.ln.weight"], w["crossattn.ln.bias"], eps)
        q = heads(a @ w["crossattn.q.weight"] + w["crossattn.q.bias"], T)
        kvx = context @ w["crossattn.kv.weight"] + w["crossattn.kv.bias"]
        k, v = (heads(t, Tc) for t in kvx.split(C, dim=2))
        o = attend(q, k, v, cv[:, None, :].expand(B, T, Tc)).transpose(1, 2).reshape(B, T, C)
        x = x + o @ w["crossattn.c_proj.weight"] + w["crossattn.c_proj.bias"]
    a = F.layer_norm(x, (C,), w["ln_2.weight"], w["ln_2.bias"], eps)
    f = F.gelu(a @ w["mlp.c_fc.weight"] + w["mlp.c_fc.bias"], approximate="tanh")
    branch = f @ w["mlp.c_proj.weight"] + w["mlp.c_proj.bias"]
    return x + (branch if drop is None else branch * drop[2])


class RefGPT(torch.nn.Module):
    """The XTTS GPT: embeddings, cfg.n_layers ref_blocks, the two final LayerNorms, the
    heads and the weighted cross-entropies. Parameters by DESIGN.md's names; load() takes
    a pyxtts state_dict. With cfg.conditioning, Coqui's conditioning encoder and perceiver
    (their names and shapes), which make the latents from batch["cond_mels"].
    dropout: None (none applied), or (seed, step, sample0): the masks the engine draws for
    that step, from tests/philox.py, at probability cfg.dropout."""

    def __init__(self, cfg, dtype=torch.float64, sdpa=False, dropout=None):
        super().__init__()
        self.cfg = cfg
        self.sdpa = sdpa
        self.dropout = dropout
        d, L = cfg.d_model, cfg.n_layers
        self.p = torch.nn.ParameterDict()
        self.names = []

        def add(name, *shape):
            self.p[name.replace(".", "__")] = torch.nn.Parameter(torch.zeros(*shape, dtype=dtype))
            self.names.append(name)

        add("text_embedding.weight", cfg.text_vocab_size, d)
        add("mel_embedding.weight", cfg.audio_vocab_size, d)
        add("text_pos_embedding.emb.weight", cfg.max_text_tokens, d)
        add("mel_pos_embedding.emb.weight", cfg.max_audio_tokens, d)
        shapes = block_shapes(d)
        for i in range(L):
            for name in BLOCK_PARAMS:
                add(f"gpt.h.{i}.{name}", *shapes[name])
        add("gpt.ln_f.weight", d); add("gpt.ln_f.bias", d)  # noqa: E702
        add("final_norm.weight", d); add("final_norm.bias", d)  # noqa: E702
        add("text_head.weight", cfg.text_vocab_size, d); add("text_head.bias", cfg.text_vocab_size)  # noqa: E702
        add("mel_head.weight", cfg.audio_vocab_size, d); add("mel_head.bias", cfg.audio_vocab_size)  # noqa: E702
        if getattr(cfg, "conditioning", False):  # Coqui's names and shapes
            F_ = int(d * 4 * 2 / 3)
            add("conditioning_encoder.init.weight", d, 80, 1); add("conditioning_encoder.init.bias", d)  # noqa: E702
            for k in range(6):
                a = f"conditioning_encoder.attn.{k}."
                add(a + "norm.weight", d); add(a + "norm.bias", d)  # noqa: E702
                add(a + "qkv.weight", 3 * d, d, 1); add(a + "qkv.bias", 3 * d)  # noqa: E702
                add(a + "proj_out.weight", d, d, 1); add(a + "proj_out.bias", d)  # noqa: E702
            add("conditioning_perceiver.latents", cfg.n_cond_latents, d)
            for k in range(2):
                a = f"conditioning_perceiver.layers.{k}."
                add(a + "0.to_q.weight", 512, d); add(a + "0.to_kv.weight", 1024, d)  # noqa: E702
                add(a + "0.to_out.weight", d, 512)
                add(a + "1.0.weight", 2 * F_, d); add(a + "1.0.bias", 2 * F_)  # noqa: E702
                add(a + "1.2.weight", d, F_); add(a + "1.2.bias", d)  # noqa: E702
            add("conditioning_perceiver.norm.gamma", d)

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def load(self, state):
        with torch.no_grad():
            for n in self.names:
                self.w(n).copy_(torch.from_numpy(np.asarray(state[n], dtype=np.float64)))

    def grads(self):
        """name -> gradient (zeros for a tensor the step did not reach)."""
        return {n: (self.w(n).grad.detach().numpy().copy() if self.w(n).grad is not None
                    else np.zeros(tuple(self.w(n).shape))) for n in self.names}

    def conditioning(self, mels):
        """Coqui's get_style_emb with the perceiver resampler: (B, 80, S) -> (B, Nl, d)."""
        cfg, w = self.cfg, self.w
        d, H = cfg.d_model, cfg.n_heads
        h = F.conv1d(mels, w("conditioning_encoder.init.weight"), w("conditioning_encoder.init.bias"))
        B, _, S = h.shape
        for k in range(6):  # AttentionBlock: the residual goes onto the normed input
            a = f"conditioning_encoder.attn.{k}."
            xn = F.group_norm(h, cond_groups(d), w(a + "norm.weight"), w(a + "norm.bias"), 1e-5)
            qkv = F.conv1d(xn, w(a + "qkv.weight"), w(a + "qkv.bias"))
            ch = d // H  # QKVAttentionLegacy: heads split before q, k, v
            q, kk, v = qkv.reshape(B * H, 3 * ch, S).split(ch, dim=1)
            scale = 1 / math.sqrt(math.sqrt(ch))
            att = torch.softmax(torch.einsum("bct,bcs->bts", q * scale, kk * scale), dim=-1)
            o = torch.einsum("bts,bcs->bct", att, v).reshape(B, d, S)
            h = xn + F.conv1d(o, w(a + "proj_out.weight"), w(a + "proj_out.bias"))
        context = h.transpose(1, 2)
        lat = w("conditioning_perceiver.latents")[None].expand(B, -1, -1)
        for k in range(2):  # Attention over cat(latents, context), then GEGLU feed-forward
            a = f"conditioning_perceiver.layers.{k}."
            kv = torch.cat([lat, context], 1) @ w(a + "0.to_kv.weight").T
            heads = lambda t: t.reshape(B, t.shape[1], 8, 64).transpose(1, 2)  # noqa: E731
            q, kk, v = heads(lat @ w(a + "0.to_q.weight").T), heads(kv[..., :512]), heads(kv[..., 512:])
            o = torch.softmax(q @ kk.transpose(-1, -2) * 64**-0.5, dim=-1) @ v
            lat = o.transpose(1, 2).reshape(B, -1, 512) @ w(a + "0.to_out.weight").T + lat
            u = lat @ w(a + "1.0.weight").T + w(a + "1.0.bias")
            x, gate = u.chunk(2, dim=-1)
            lat = (x * F.gelu(gate)) @ w(a + "1.2.weight").T + w(a + "1.2.bias") + lat
        return F.normalize(lat, dim=-1) * math.sqrt(d) * w("conditioning_perceiver.norm.gamma")

    def _mask(self, site, kind, B, T, Nc, Lt):
        """The engine's mask of a site as float64: rows (B, T, d) or attention (B, H, T, T)."""
        import philox

        seed, step, sample0 = self.dropout
        p, key = self.cfg.dropout, philox.dropout_key(seed, step, site)
        if kind == "rows":
            m = philox.row_mask(p, key, B * T, self.cfg.d_model, T, Nc, Nc + Lt, sample0)
            return torch.from_numpy(m.astype(np.float64).reshape(B, T, -1))
        m = philox.attention_mask(p, key, B, self.cfg.n_heads, T, T, Nc, Nc + Lt, sample0)
        return torch.from_numpy(m.astype(np.float64))

    def forward(self, batch, token_counts=None):
        cfg, w = self.cfg, self.w
        dt = self.w("gpt.ln_f.weight").dtype
        ti = torch.as_tensor(np.asarray(batch["text_inputs"]), dtype=torch.long)
        ai = torch.as_tensor(np.asarray(batch["audio_inputs"]), dtype=torch.long)
        tt = torch.as_tensor(np.asarray(batch["text_targets"]), dtype=torch.long)
        at = torch.as_tensor(np.asarray(batch["audio_targets"]), dtype=torch.long)
        tl = torch.as_tensor(np.asarray(batch["text_lengths"]), dtype=torch.long)
        al = torch.as_tensor(np.asarray(batch["audio_lengths"]), dtype=torch.long)
        B, Lt = ti.shape
        La = ai.shape[1]
        tv = torch.arange(Lt)[None] < tl[:, None]
        av = torch.arange(La)[None] < al[:, None]
        ti, ai = torch.where(tv, ti, 0), torch.where(av, ai, 0)
        tt, at = torch.where(tv, tt, -1), torch.where(av, at, -1)
        xt = w("text_embedding.weight")[ti] + w("text_pos_embedding.emb.weight")[:Lt][None]
        xa = w("mel_embedding.weight")[ai] + w("mel_pos_embedding.emb.weight")[:La][None]
        parts, valid = [xt, xa], [tv, av]
        cond = None
        if batch.get("cond_latents") is not None:
            cond = torch.as_tensor(np.asarray(batch["cond_latents"], dtype=np.float64)).to(dt)
        elif batch.get("cond_mels") is not None:
            mels = np.asarray(batch["cond_mels"], dtype=np.float64)
            cond = self.conditioning(torch.from_numpy(mels.reshape(B, 80, -1)).to(dt))
        if cond is not None:
            parts.insert(0, cond)
            valid.insert(0, torch.ones(B, cond.shape[1], dtype=torch.bool))
        x = torch.cat(parts, 1)
        key_valid = torch.cat(valid, 1)  # (B, T)
        key_mask = None if bool(key_valid.all()) else key_valid
        T, Nc = x.shape[1], x.shape[1] - Lt - La
        drop = self.dropout is not None and getattr(cfg, "dropout", 0.0) > 0
        if drop:  # GPT-2's embedding dropout, over every row the stack sees
            x = x * self._mask(0, "rows", B, T, Nc, Lt)
        for i in range(cfg.n_layers):
            params = {name: w(f"gpt.h.{i}.{name}") for name in BLOCK_PARAMS}
            masks = None
            if drop:  # sites 1 + 3i (probabilities), 2 + 3i and 3 + 3i (the branches)
                masks = (self._mask(1 + 3 * i, "attention", B, T, Nc, Lt), self._mask(2 + 3 * i, "rows", B, T, Nc, Lt),
                         self._mask(3 + 3 * i, "rows", B, T, Nc, Lt))
            x = ref_block(params, x, cfg.n_heads, key_mask=key_mask, causal=True, eps=cfg.layer_norm_eps,
                          sdpa=self.sdpa, drop=masks)
        x = F.layer_norm(x, (cfg.d_model,), w("gpt.ln_f.weight"), w("gpt.ln_f.bias"), cfg.layer_norm_eps)
        x = F.layer_norm(x, (cfg.d_model,), w("final_norm.weight"), w("final_norm.bias"), cfg.layer_norm_eps)
        text_logits = x[:, Nc:Nc + Lt] @ w("text_head.weight").T + w("text_head.bias")
        audio_logits = x[:, Nc + Lt:] @ w("mel_head.weight").T + w("mel_head.bias")
        t_sum = F.cross_entropy(text_logits.reshape(-1, text_logits.shape[-1]), tt.reshape(-1),
                                ignore_index=-1, reduction="sum")
        a_sum = F.cross_entropy(audio_logits.reshape(-1, audio_logits.shape[-1]), at.reshape(-1),
                                ignore_index=-1, reduction="sum")
        n_text, n_audio = int((tt >= 0).sum()), int((at >= 0).sum())
        if token_counts is not None:
            n_text, n_audio = token_counts
        text_loss = t_sum / n_text if n_text else t_sum * 0
        audio_loss = a_sum / n_audio if n_audio else a_sum * 0
        loss = cfg.text_loss_weight * text_loss + cfg.audio_loss_weight * audio_loss
        return loss, text_loss, audio_loss
