"""Loads an adapter directory terse exported (`cargo xtask export --adapter DIR`) with PEFT on its
base model and compares the adapted logits with a reference file (tests/fixtures/*/reference.safetensors
layout). Exit code 1 above the tolerance.

    .venv/bin/python scripts/peft_loads.py BASE_DIR ADAPTER_DIR REFERENCE [TOL]
"""
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

base_dir, adapter, ref_path = sys.argv[1], sys.argv[2], sys.argv[3]
tol = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-4
base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
model = PeftModel.from_pretrained(base, adapter).eval()
ref = load_file(ref_path)
with torch.no_grad():
    logits = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"],
                   position_ids=ref["position_ids"]).logits
real = ref["attention_mask"].bool()
diff = (logits[real] - ref["logits"][real]).abs().max().item()
print(f"{adapter}: PEFT loads it; max abs logit diff {diff:.3g}")
sys.exit(0 if diff <= tol else 1)
