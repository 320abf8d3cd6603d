"""HF transformers `generate` with its KV cache, random weights: the baseline for terse's decode
throughput.

    .venv/bin/python scripts/bench_hf_generate.py [BATCH ...]        # CPU, testbed-sized Qwen3
    python3 scripts/bench_hf_generate.py --gpu [BATCH ...]          # CUDA, Qwen3-0.6B shape, bf16

The CPU form matches `cargo xtask bench rollout` (2 threads, prompt 32 + 256 new, default
batches 1 16 64); the GPU form matches `cargo xtask gpu-check` (prompt 32 + 128 new, default
batches 1 64 256). Prints one line per batch and a JSON object as the last line.
"""
import json
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

args = sys.argv[1:]
gpu = "--gpu" in args
batches = [int(x) for x in args if x != "--gpu"]
if gpu:
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                      num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                      head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960,
                      rope_theta=1e6, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = Qwen3ForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    device, new, batches = "cuda", 128, batches or [1, 64, 256]
else:
    torch.set_num_threads(2)
    cfg = Qwen3Config(vocab_size=64, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      tie_word_embeddings=True, max_position_embeddings=4096, bos_token_id=1,
                      eos_token_id=2, pad_token_id=0)
    model = Qwen3ForCausalLM(cfg).eval()
    device, new, batches = "cpu", 256, batches or [1, 16, 64]
v = cfg.vocab_size
out = {}
for b in batches:
    ids = torch.tensor([[(i * 31 + j * 7) % (v - 1) + 1 for j in range(32)] for i in range(b)],
                       device=device)
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, top_p=1.0,
              top_k=0, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:, :8], **{**kw, "max_new_tokens": 8, "min_new_tokens": 8})  # warm-up
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, **kw)
        if gpu:
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
    tps = b * new / secs
    print(f"hf generate batch {b:>3}: prompt 32 + {new} new: {tps:.0f} tokens/s")
    out[str(b)] = tps
print(json.dumps({"hf_generate_tokens_per_s": out, "device": device, "torch": torch.__version__}))
