"""Loads a checkpoint terse saved with HF transformers and compares its logits with a reference
file (tests/fixtures/*/reference.safetensors layout). Exit code 1 above the tolerance.

    .venv/bin/python scripts/transformers_loads.py SAVED_DIR REFERENCE [TOL]
"""
import sys

import torch
from safetensors.torch import load_file


def max_logit_diff(model, ref_path):
    """max |logits - reference| over the reference's real (unpadded) positions."""
    ref = load_file(ref_path)
    with torch.no_grad():
        logits = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"],
                       position_ids=ref["position_ids"]).logits
    real = ref["attention_mask"].bool()
    return (logits[real] - ref["logits"][real]).abs().max().item()


if __name__ == "__main__":
    from transformers import AutoModelForCausalLM

    saved, ref_path = sys.argv[1], sys.argv[2]
    tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
    model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    diff = max_logit_diff(model, ref_path)
    print(f"{saved}: transformers loads it; max abs logit diff {diff:.3g}")
    sys.exit(0 if diff <= tol else 1)
