"""A PyTorch implementation of the XTTS GPT written from DESIGN.md alone (plain torch,
no transformers), the reference the engine is tested against."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


class RefGPT(torch.nn.Module):
    def __init__(self, cfg, dtype=torch.float64, sdpa=False):
        super().__init__()
        self.cfg = cfg
        self.sdpa = sdpa  # torch's fused attention (the benchmark baseline) instead of explicit softmax
        d, L = cfg.d_model, cfg.n_layers
        P = lambda *shape: torch.nn.Parameter(torch.zeros(*shape, dtype=dtype))  # noqa: E731
        self.p = torch.nn.ParameterDict()
        self.names = []

        def add(name, *shape):
            self.p[name.replace(".", "__")] = P(*shape)
            self.names.append(name)

        add("text_embedding.weight", cfg.text_vocab_size, d)
        add("mel_embedding.weight", cfg.audio_vocab_size, d)
        add("text_pos_embedding.emb.weight", cfg.max_text_tokens, d)
        add("mel_pos_embedding.emb.weight", cfg.max_audio_tokens, d)
        for i in range(L):
            h = f"gpt.h.{i}."
            add(h + "ln_1.weight", d); add(h + "ln_1.bias", d)
            add(h + "attn.c_attn.weight", d, 3 * d); add(h + "attn.c_attn.bias", 3 * d)
            add(h + "attn.c_proj.weight", d, d); add(h + "attn.c_proj.bias", d)
            add(h + "ln_2.weight", d); add(h + "ln_2.bias", d)
            add(h + "mlp.c_fc.weight", d, 4 * d); add(h + "mlp.c_fc.bias", 4 * d)
            add(h + "mlp.c_proj.weight", 4 * d, d); add(h + "mlp.c_proj.bias", d)
        add("gpt.ln_f.weight", d); add("gpt.ln_f.bias", d)
        add("final_norm.weight", d); add("final_norm.bias", d)
        add("text_head.weight", cfg.text_vocab_size, d); add("text_head.bias", cfg.text_vocab_size)
        add("mel_head.weight", cfg.audio_vocab_size, d); add("mel_head.bias", cfg.audio_vocab_size)

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
        key_valid = torch.cat(valid, 1)
        T, d, H = x.shape[1], cfg.d_model, cfg.n_heads
        Dh = d // H
        allowed = torch.tril(torch.ones(T, T, dtype=torch.bool))[None] & key_valid[:, None, :]  # (B, T, T)
        for i in range(cfg.n_layers):
            h = f"gpt.h.{i}."
            a = F.layer_norm(x, (d,), w(h + "ln_1.weight"), w(h + "ln_1.bias"), cfg.layer_norm_eps)
            qkv = a @ w(h + "attn.c_attn.weight") + w(h + "attn.c_attn.bias")
            q, k, v = (t.view(B, T, H, Dh).transpose(1, 2) for t in qkv.split(d, dim=2))
            if self.sdpa:  # causal without padding lets torch pick its flash kernel
                o = (F.scaled_dot_product_attention(q, k, v, is_causal=True) if bool(key_valid.all())
                     else F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None]))
            else:
                s = (q @ k.transpose(-1, -2)) / math.sqrt(Dh)
                s = s.masked_fill(~allowed[:, None], float("-inf"))
                p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row with no valid key: zeros
                o = p @ v
            o = o.transpose(1, 2).reshape(B, T, d)
            x = x + o @ w(h + "attn.c_proj.weight") + w(h + "attn.c_proj.bias")
            a = F.layer_norm(x, (d,), w(h + "ln_2.weight"), w(h + "ln_2.bias"), cfg.layer_norm_eps)
            f = F.gelu(a @ w(h + "mlp.c_fc.weight") + w(h + "mlp.c_fc.bias"), approximate="tanh")
            x = x + f @ w(h + "mlp.c_proj.weight") + w(h + "mlp.c_proj.bias")
        x = F.layer_norm(x, (d,), w("gpt.ln_f.weight"), w("gpt.ln_f.bias"), cfg.layer_norm_eps)
        x = F.layer_norm(x, (d,), w("final_norm.weight"), w("final_norm.bias"), cfg.layer_norm_eps)
        Nc = T - Lt - La
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


from batches import random_batch  # noqa: E402,F401  (re-exported for the tests)


# ---- the deterministic reductions' exact semantics (backend.h) ---------------------------
# Mirrors of the chunking every backend follows, in float64 NumPy: a kernel's result must be
# these bits exactly, on the CPU and on a GPU.
COLSUM_PARALLEL = 1 << 17
COLSUM_MIN_ROWS = 16
EMB_CHUNK = 64


def colsum_chunk_rows(rows: int, cols: int) -> int:
    want = max(1, COLSUM_PARALLEL // max(cols, 1))
    return max(-(-rows // want), COLSUM_MIN_ROWS)


def colsum_exact(terms: np.ndarray) -> np.ndarray:
    """Column sums of terms (rows, cols) float64: chunks of colsum_chunk_rows rows, each
    summed from 0.0 row by row, then the chunk sums from 0.0 in chunk order."""
    rows, cols = terms.shape
    r = colsum_chunk_rows(rows, cols)
    total = np.zeros(cols)
    for i0 in range(0, rows, r):
        part = np.zeros(cols)
        for row in terms[i0:i0 + r]:
            part += row
        total += part
    return total


def add_once(acc32: np.ndarray, total64: np.ndarray) -> np.ndarray:
    """(float)(acc + total): the fp32 accumulator plus the double total, rounded once."""
    return (acc32.astype(np.float64) + total64).astype(np.float32)


def embedding_backward_exact(dtable: np.ndarray, ids: np.ndarray, dout: np.ndarray) -> np.ndarray:
    """dtable (V, C) fp32 after the scatter of dout (N, C) by ids (N): per chunk of EMB_CHUNK
    rows and id, the id's rows from 0.0 in order; per id, its chunk sums from 0.0 in chunk
    order; added once. Ids that never occur keep their rows untouched."""
    d64 = dout.astype(np.float64)
    total = np.zeros((dtable.shape[0], dout.shape[1]))
    for c0 in range(0, len(ids), EMB_CHUNK):
        part = np.zeros_like(total)
        np.add.at(part, ids[c0:c0 + EMB_CHUNK], d64[c0:c0 + EMB_CHUNK])  # unbuffered, in order
        present = np.unique(ids[c0:c0 + EMB_CHUNK])
        total[present] += part[present]
    out = dtable.copy()
    seen = np.unique(ids)
    out[seen] = add_once(dtable[seen], total[seen])
    return out
