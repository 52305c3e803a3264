"""The PyTorch references the engine is tested against, written from DESIGN.md alone (plain
torch, no transformers): one pre-LN GPT-2 block (``ref_block``, optionally with
cross-attention) and the XTTS GPT built from it (``RefGPT``). float64 by default."""
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


def attend(q, k, v, allowed):
    """q (B, H, Tq, D), k/v (B, H, Tk, D), allowed (B, Tq, Tk): explicit masked softmax;
    a query row that sees no key gets zeros (the engine's convention)."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    allowed = allowed[:, None]
    any_key = allowed.any(-1, keepdim=True)
    s = torch.where(allowed, s, torch.tensor(float("-inf"), dtype=s.dtype))
    s = torch.where(any_key, s, torch.zeros((), dtype=s.dtype))
    p = torch.softmax(s, dim=-1) * allowed * any_key
    return p @ v


def ref_block(params, x, H, key_mask=None, causal=True, context=None, context_mask=None, eps=1e-5,
              sdpa=False):
    """y (B, T, C) of one block on x (B, T, C); params maps BLOCK_PARAMS (and crossattn.*
    with a context (B, Tc, C)) to tensors. sdpa: torch's fused attention (the benchmark
    baseline) instead of the explicit softmax; with no key mask and causal, its flash kernel."""
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
        o = attend(q, k, v, allowed)
    elif key_mask is None and causal:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
    x = x + o.transpose(1, 2).reshape(B, T, C) @ w["attn.c_proj.weight"] + w["attn.c_proj.bias"]
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
    return x + f @ w["mlp.c_proj.weight"] + w["mlp.c_proj.bias"]


class RefGPT(torch.nn.Module):
    """The XTTS GPT: embeddings, cfg.n_layers ref_blocks, the two final LayerNorms, the
    heads and the weighted cross-entropies. Parameters by DESIGN.md's names; load() takes
    a pyxtts state_dict."""

    def __init__(self, cfg, dtype=torch.float64, sdpa=False):
        super().__init__()
        self.cfg = cfg
        self.sdpa = sdpa
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

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def load(self, state):
        with torch.no_grad():
            for n in self.names:
                self.w(n).copy_(torch.from_numpy(np.asarray(state[n], dtype=np.float64)))

    def grads(self):
        return {n: self.w(n).grad.detach().numpy().copy() for n in self.names}

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
        if batch.get("cond_latents") is not None:
            cond = torch.as_tensor(np.asarray(batch["cond_latents"], dtype=np.float64)).to(dt)
            parts.insert(0, cond)
            valid.insert(0, torch.ones(B, cond.shape[1], dtype=torch.bool))
        x = torch.cat(parts, 1)
        key_valid = torch.cat(valid, 1)  # (B, T)
        key_mask = None if bool(key_valid.all()) else key_valid
        for i in range(cfg.n_layers):
            params = {name: w(f"gpt.h.{i}.{name}") for name in BLOCK_PARAMS}
            x = ref_block(params, x, cfg.n_heads, key_mask=key_mask, causal=True, eps=cfg.layer_norm_eps,
                          sdpa=self.sdpa)
        x = F.layer_norm(x, (cfg.d_model,), w("gpt.ln_f.weight"), w("gpt.ln_f.bias"), cfg.layer_norm_eps)
        x = F.layer_norm(x, (cfg.d_model,), w("final_norm.weight"), w("final_norm.bias"), cfg.layer_norm_eps)
        Nc = x.shape[1] - Lt - La
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
