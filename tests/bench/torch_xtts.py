"""The XTTS GPT as an ordinary PyTorch module: the baseline of the GPU benchmark.

Written the way a PyTorch user would train it: nn.Embedding / nn.LayerNorm / nn.Linear,
F.scaled_dot_product_attention (causal, so torch picks its flash kernel), autocast for
16-bit, no host synchronisation inside forward (torch.compile traces it whole, or block
by block with ``compile_regions``). Weights
load from a pyxtts state dict (XTTS's Conv1D weights are (in, out): transposed here), so
both sides start from the same parameters. Batches are full-length (no padding).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int, eps: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln_1 = nn.LayerNorm(d, eps=eps)
        self.c_attn = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d, eps=eps)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)  # (B, T, d) each
        q, k, v = (t.view(B, T, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, Dh)
        x = x + self.attn_proj(o.transpose(1, 2).reshape(B, T, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class TorchXTTSGPT(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        d, eps = cfg.d_model, cfg.layer_norm_eps
        self.cfg = cfg
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, d)
        self.mel_embedding = nn.Embedding(cfg.audio_vocab_size, d)
        self.text_pos = nn.Embedding(cfg.max_text_tokens, d)
        self.mel_pos = nn.Embedding(cfg.max_audio_tokens, d)
        self.h = nn.ModuleList(Block(d, cfg.n_heads, eps) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(d, eps=eps)
        self.final_norm = nn.LayerNorm(d, eps=eps)
        self.text_head = nn.Linear(d, cfg.text_vocab_size)
        self.mel_head = nn.Linear(d, cfg.audio_vocab_size)

    def load_pyxtts(self, state: dict) -> None:
        """Copies a pyxtts ``state_dict()`` (DESIGN.md's names) into this module."""
        t = lambda name: torch.as_tensor(state[name].astype("float32"))  # noqa: E731
        with torch.no_grad():
            self.text_embedding.weight.copy_(t("text_embedding.weight"))
            self.mel_embedding.weight.copy_(t("mel_embedding.weight"))
            self.text_pos.weight.copy_(t("text_pos_embedding.emb.weight"))
            self.mel_pos.weight.copy_(t("mel_pos_embedding.emb.weight"))
            for i, blk in enumerate(self.h):
                p = f"gpt.h.{i}."
                for mod, name in ((blk.ln_1, "ln_1"), (blk.ln_2, "ln_2")):
                    mod.weight.copy_(t(p + name + ".weight"))
                    mod.bias.copy_(t(p + name + ".bias"))
                for mod, name in ((blk.c_attn, "attn.c_attn"), (blk.attn_proj, "attn.c_proj"),
                                  (blk.c_fc, "mlp.c_fc"), (blk.mlp_proj, "mlp.c_proj")):
                    mod.weight.copy_(t(p + name + ".weight").T)  # Conv1D (in, out) -> Linear (out, in)
                    mod.bias.copy_(t(p + name + ".bias"))
            for mod, name in ((self.ln_f, "gpt.ln_f"), (self.final_norm, "final_norm"),
                              (self.text_head, "text_head"), (self.mel_head, "mel_head")):
                mod.weight.copy_(t(name + ".weight"))
                mod.bias.copy_(t(name + ".bias"))

    def forward(self, text_inputs, text_targets, audio_inputs, audio_targets, cond=None):
        """Loss of a full-length batch: text_* (B, Lt), audio_* (B, La), cond (B, Nc, d)."""
        x = self.embed(text_inputs, audio_inputs, cond)  # (B, T, d)
        for blk in self.h:
            x = blk(x)
        return self.loss(x, text_targets, audio_targets)

    def embed(self, text_inputs, audio_inputs, cond=None):
        Lt, La = text_inputs.shape[1], audio_inputs.shape[1]
        xt = self.text_embedding(text_inputs) + self.text_pos.weight[:Lt]
        xa = self.mel_embedding(audio_inputs) + self.mel_pos.weight[:La]
        parts = [xt, xa] if cond is None else [cond.to(xt.dtype), xt, xa]
        return torch.cat(parts, 1)  # (B, T, d)

    def loss(self, x, text_targets, audio_targets):
        Lt, La = text_targets.shape[1], audio_targets.shape[1]
        x = self.final_norm(self.ln_f(x))
        Nc = x.shape[1] - Lt - La
        tl = self.text_head(x[:, Nc:Nc + Lt]).float()  # (B, Lt, Vt)
        al = self.mel_head(x[:, Nc + Lt:]).float()  # (B, La, Va)
        t_loss = F.cross_entropy(tl.reshape(-1, tl.shape[-1]), text_targets.reshape(-1), ignore_index=-1)
        a_loss = F.cross_entropy(al.reshape(-1, al.shape[-1]), audio_targets.reshape(-1), ignore_index=-1)
        return self.cfg.text_loss_weight * t_loss + self.cfg.audio_loss_weight * a_loss

    def compile_regions(self) -> None:
        """torch.compile as PyTorch recommends for a stack of identical layers ("regional
        compilation"): each block, the embedding and the loss compiled on their own. The 30
        blocks share one compiled graph (their parameters are its inputs), so compiling
        costs about one block; compiling the whole module unrolls all 30 (it ran past 100 s
        on an H200). Every kernel inside a block, the loss and the embedding is compiled;
        only the Python loop over the blocks stays eager."""
        for blk in self.h:
            blk.compile()
        self.embed = torch.compile(self.embed)
        self.loss = torch.compile(self.loss)
