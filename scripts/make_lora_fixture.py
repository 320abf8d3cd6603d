"""Writes tests/fixtures/qwen3-tiny-lora: a PEFT LoRA adapter on tests/fixtures/qwen3-tiny (rank 4,
alpha 8, every linear projection; lora_B drawn at random, since PEFT starts it at zero and a zero
delta would test nothing) saved by PEFT, and reference.safetensors with the adapted model's
outputs computed by transformers + peft in float32, in the qwen3-tiny layout (REFERENCE.json).

    .venv/bin/pip install torch transformers safetensors peft
    .venv/bin/python scripts/make_lora_fixture.py      # tested with torch 2.15, transformers 5.24, peft 0.21
"""
import json
import pathlib
import sys

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import Qwen3ForCausalLM

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from make_fixtures import ROOT, reference  # noqa: E402

base = Qwen3ForCausalLM.from_pretrained(ROOT / "qwen3-tiny", dtype=torch.float32).eval()
torch.manual_seed(5)
cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                 "down_proj"])
model = get_peft_model(base, cfg)
with torch.no_grad():
    for n, p in model.named_parameters():
        if "lora_B" in n:
            p.normal_(0.0, 0.05)
model.eval()
out = ROOT / "qwen3-tiny-lora"
out.mkdir(parents=True, exist_ok=True)
model.save_pretrained(out)
# The base by its path in the repository, and no generated model card.
c = json.loads((out / "adapter_config.json").read_text())
c["base_model_name_or_path"] = "tests/fixtures/qwen3-tiny"
(out / "adapter_config.json").write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
(out / "README.md").unlink(missing_ok=True)
gen = torch.Generator().manual_seed(5)
save_file(reference(model, base.config.vocab_size, gen), out / "reference.safetensors")
print(sorted(p.name for p in out.iterdir()))
