"""The memory plan of the real XTTS v2 GPT (30 layers, d=1024, 16 heads) per
checkpoint policy at batch 1-8, ~490 tokens (32 conditioning + 150 text + 308 audio).
Planner only: nothing is allocated. Then, in a build with the CUDA backend, the plans
for cuda:0 with the optimizer's state on the device and in host memory (Coqui's recipe,
and the GPU benchmark's step against torch eager's measured peak).

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

# The optimizer's state on the device or in host memory (AdamW(state_device="cpu")): the
# plan for cuda:0 (a build with the CUDA backend computes it without a GPU), bf16, with
# AdamW's state counted where it lives.
#   - Coqui's recipe: the conditioning path over 517-frame references, dropout 0.1, batch
#     3, at the longest sequences (32 + 404 + 608) and at Coqui's max_text_length 200;
#   - the GPU benchmark's step (tests/bench/bench_xtts_gpu.py): batch 8 x 490 tokens, no
#     conditioning path, whose torch eager peak an H200 measured at 10,139,451,904 bytes
#     (tests/bench/results/xtts_gpu_h200_run2.json; pyxtts's peak there equalled its plan).
if pyxtts.build_info()["cuda"]:
    EAGER_PEAK = 10_139_451_904
    print()
    print("| step | checkpointing | optimizer state | device plan | host plan | vs torch eager's peak |")
    print("|---|---|---|---:|---:|---:|")
    bench = pyxtts.ModelConfig(dropout=0.0, conditioning=False)
    rows = [("Coqui's recipe, batch 3 x (32 + 404 + 608), 517 mel frames", cfg, 3, 404, 608, 517),
            ("Coqui's recipe, batch 3 x (32 + 200 + 252), 517 mel frames", cfg, 3, 200, 252, 517),
            ("GPU bench, batch 8 x (32 + 150 + 308)", bench, 8, 150, 308, 0)]
    for what, c, batch, lt, la, frames in rows:
        for offload in (False, True):
            p = pyxtts.estimate_memory(c, batch, lt, la, checkpointing="full", optimizer=True, precision="bf16",
                                       device="cuda:0", cond_frames=frames, offload=offload)
            vs = f"{p.total / EAGER_PEAK:.2f}x" if c is bench else ""
            print(f"| {what} | full | {'host' if offload else 'device'} | {p.total / GiB:.2f} GiB | "
                  f"{p.host_total / GiB:.2f} GiB | {vs} |")
