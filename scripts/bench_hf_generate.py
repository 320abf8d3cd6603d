"""HF transformers `generate` with its KV cache on the testbed-sized Qwen3 of
`cargo xtask bench rollout` (random weights): the baseline for terse's decode throughput.

    .venv/bin/python scripts/bench_hf_generate.py [BATCH ...]     # default batches 1 16 64
Prints one line per batch and a JSON object as the last line. Uses 2 CPU threads.
"""
import json
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

torch.set_num_threads(2)
cfg = Qwen3Config(vocab_size=64, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                  max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0)
model = Qwen3ForCausalLM(cfg).eval()
out = {}
for b in [int(x) for x in sys.argv[1:]] or [1, 16, 64]:
    ids = torch.tensor([[(i * 31 + j * 7) % 63 + 1 for j in range(32)] for i in range(b)])
    kw = dict(max_new_tokens=256, min_new_tokens=256, do_sample=True, temperature=1.0, top_p=1.0,
              top_k=0, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:, :8], **{**kw, "max_new_tokens": 8, "min_new_tokens": 8})  # warm-up
        t0 = time.perf_counter()
        model.generate(ids, **kw)
        secs = time.perf_counter() - t0
    tps = b * 256 / secs
    print(f"hf generate batch {b:>2}: prompt 32 + 256 new: {tps:.0} tokens/s")
    out[str(b)] = tps
print(json.dumps({"hf_generate_tokens_per_s": out, "torch": torch.__version__}))
