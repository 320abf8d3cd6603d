"""torch's peers of gpu-check's attention and training rows, on the same machine and shapes:
the baselines that issues 57 and 58 hold terse to.

    python3 scripts/bench_torch_peers.py [--quick]

- flash_fwd_t8192: SDPA's forward, causal, bf16, batch 1, Hq 16, Hkv 8, D 128, T 8192, with
  the flash and cuDNN backends (and the others, which may refuse), as TFLOP/s by gpu-check's
  formula (4 Hq D T^2 / 2) and share of the 989 TFLOP/s dense bf16 peak;
- attention_paths: SDPA's forward+backward at T 1024 and 4096, flash and cuDNN, in seconds;
- hf_long_context: HF transformers' Qwen3-0.6B training step (random weights, f32 master and
  bf16 autocast, SDPA attention, gradient checkpointing, one sequence of T tokens, cross-entropy
  over the vocabulary) at T 8192 and 16384: tokens/s, MFU by gpu-check's formula (6 x params x
  T + the causal attention's 3 x 4 Hq D T^2 / 2 per layer) and the peak memory torch allocated.

`--quick` runs T 8192 only for the training step. Needs CUDA; prints a line per figure and a
JSON object as the last line (gpu-check's `torch_peers` step reads it).
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

PEAK = 989e12
HQ, HKV, D = 16, 8, 128
quick = "--quick" in sys.argv[1:]
dev = "cuda"
out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}


def timed(f, reps):
    f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def qkv(t, grad):
    g = torch.Generator(device=dev).manual_seed(0)
    mk = lambda h: torch.randn(1, h, t, D, device=dev, dtype=torch.bfloat16, generator=g,
                                requires_grad=grad)
    return mk(HQ), mk(HKV), mk(HKV)


def sdpa(q, k, v):
    # GQA without repeating K/V where this torch has it.
    try:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    except TypeError:
        r = HQ // HKV
        return F.scaled_dot_product_attention(q, k.repeat_interleave(r, 1),
                                              v.repeat_interleave(r, 1), is_causal=True)


BACKENDS = {}
try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
except ImportError:
    pass

t = 8192
flops = 4.0 * HQ * D * t * t / 2.0
fwd = {}
for name, backend in BACKENDS.items():
    q, k, v = qkv(t, False)
    try:
        with torch.no_grad(), sdpa_kernel(backend):
            secs = timed(lambda: sdpa(q, k, v), 3 if name == "math" else 10)
        fwd[name] = {"seconds": secs, "tflops": flops / secs / 1e12, "peak_fraction": flops / secs / PEAK}
        print(f"sdpa {name} forward T={t}: {flops / secs / 1e12:.0f} TFLOP/s ({100 * flops / secs / PEAK:.1f} % of peak)")
    except RuntimeError as e:
        fwd[name] = {"error": str(e).splitlines()[0]}
out["flash_fwd_t8192"] = fwd

paths = []
for t in [1024, 4096]:
    row = {"t": t}
    for name in ["flash", "cudnn"]:
        if name not in BACKENDS:
            continue
        q, k, v = qkv(t, True)
        try:
            with sdpa_kernel(BACKENDS[name]):
                def step():
                    o = sdpa(q, k, v)
                    o.backward(torch.ones_like(o))
                secs = timed(step, 10)
            row[f"{name}_s"] = secs
            print(f"sdpa {name} forward+backward T={t}: {secs * 1e3:.2f} ms")
        except RuntimeError as e:
            row[f"{name}_error"] = str(e).splitlines()[0]
    paths.append(row)
out["attention_paths"] = paths

from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                  num_hidden_layers=28, num_attention_heads=HQ, num_key_value_heads=HKV,
                  head_dim=D, tie_word_embeddings=True, max_position_embeddings=40960,
                  rope_theta=1e6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  attn_implementation="sdpa")
model = Qwen3ForCausalLM(cfg).to(dev)  # f32 master weights
model.gradient_checkpointing_enable()
model.train()
params = sum(p.numel() for p in model.parameters())
train = []
for t in [8192] if quick else [8192, 16384]:
    ids = torch.tensor([[(j * 17) % (cfg.vocab_size - 1) + 1 for j in range(t)]], device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    step()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    secs = timed(step, 2)
    attn = 3.0 * 4.0 * HQ * D * (t * t / 2.0) * cfg.num_hidden_layers
    mfu = (6.0 * params * t + attn) / secs / PEAK
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"hf qwen3-0.6b fwd+bwd T={t}: {t / secs:.0f} tokens/s, MFU {100 * mfu:.1f} %, peak {peak:.1f} GiB")
    train.append({"t": t, "tokens_per_s": t / secs, "mfu": mfu, "peak_gib": peak, "params": params})
out["hf_long_context"] = train
print(json.dumps(out))
