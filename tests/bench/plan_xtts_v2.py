"""The memory plan of the real XTTS v2 GPT (30 layers, d=1024, 16 heads) per
checkpoint policy at batch 1-8, ~490 tokens (32 conditioning + 150 text + 308 audio).
Planner only: nothing is allocated.

    python tests/bench/plan_xtts_v2.py
"""
import pyxtts

cfg = pyxtts.ModelConfig()
GiB = 2**30
print("| batch | policy | parameters | gradients | saved activations | residuals | scratch | total |")
print("|---:|---|---:|---:|---:|---:|---:|---:|")
for batch in (1, 2, 4, 8):
    for policy in ("none", "selective", "full"):
        p = pyxtts.estimate_memory(cfg, batch, 150, 308, checkpointing=policy)
        print(f"| {batch} | {policy} | {p.parameters / GiB:.2f} GiB | {p.gradients / GiB:.2f} GiB | "
              f"{p.saved_activations / GiB:.2f} GiB | {p.residuals / GiB:.2f} GiB | "
              f"{p.scratch / GiB:.2f} GiB | {p.total / GiB:.2f} GiB |")
