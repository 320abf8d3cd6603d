"""Loads an adapter directory terse exported (`cargo xtask export`, OUT/adapter) with PEFT on its
base model and compares the adapted logits with a reference file (tests/fixtures/*/reference.safetensors
layout). Exit code 1 above the tolerance.

    .venv/bin/python scripts/peft_loads.py BASE_DIR ADAPTER_DIR REFERENCE [TOL]
"""
import pathlib
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from transformers_loads import max_logit_diff  # noqa: E402

base_dir, adapter, ref_path = sys.argv[1], sys.argv[2], sys.argv[3]
tol = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-4
base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
model = PeftModel.from_pretrained(base, adapter).eval()
diff = max_logit_diff(model, ref_path)
print(f"{adapter}: PEFT loads it; max abs logit diff {diff:.3g}")
sys.exit(0 if diff <= tol else 1)
