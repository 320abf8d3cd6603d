"""Writes the tiny HF-transformers Qwen3 and Qwen2 checkpoints terse's golden tests check against.

Each variant goes to tests/fixtures/<name>/: config.json + weights written by
`save_pretrained`, and reference.safetensors in the layout of tests/fixtures/qwen3-tiny
(see its REFERENCE.json): logits, token log-probs, greedy continuation and per-step decode logits,
all computed by transformers in float32 from the weights exactly as stored.

    python -m venv .venv && .venv/bin/pip install torch transformers safetensors
    .venv/bin/python scripts/make_fixtures.py            # tested with torch 2.15, transformers 5.24
"""
import json
import pathlib
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

ROOT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"

BASE = dict(
    vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
    rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.1,
)

VARIANTS = {
    # Untied head, one KV head (every query head shares it), head_dim != hidden/heads,
    # rope_theta 1e4 written the transformers-4 way (top-level `rope_theta`).
    "qwen3-untied-1kv": dict(
        config=dict(tie_word_embeddings=False, num_key_value_heads=1, num_attention_heads=4,
                    head_dim=24, hidden_size=48, num_hidden_layers=3),
        rope_theta=1e4, legacy_rope_key=True, dtype=torch.float32, shard=None, seed=1),
    # bf16 storage, sharded into several files with an index, tied embeddings.
    "qwen3-sharded-bf16": dict(
        config=dict(tie_word_embeddings=True), rope_theta=1e6, legacy_rope_key=False,
        dtype=torch.bfloat16, shard="60KB", seed=2),
    # Qwen2 (Qwen2.5, DeepSeek-R1-Distill-Qwen): biases on q/k/v (drawn at random, since
    # transformers initialises them to zero and a zero bias would test nothing), no q/k norm,
    # head_dim = hidden / heads, untied head, rope_theta 1e4 as R1-Distill-Qwen writes it.
    "qwen2-tiny": dict(
        arch="qwen2", config=dict(tie_word_embeddings=False, num_key_value_heads=2),
        rope_theta=1e4, legacy_rope_key=True, dtype=torch.float32, shard=None, seed=3),
}


def reference(model, vocab, gen):
    """Reference tensors in the qwen3-tiny layout (row 1 left-padded by 3, row 2 right-padded by 2)."""
    b, t = 3, 11
    ids = torch.randint(3, vocab, (b, t), generator=gen)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, -2:] = 0
    ids[mask == 0] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
        lp = lp * mask[:, :-1] * mask[:, 1:]
        prompt = torch.randint(3, vocab, (1, 7), generator=gen)
        out = model.generate(prompt, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, eos_token_id=None,
                             pad_token_id=0)
    return {
        "input_ids": ids, "attention_mask": mask, "position_ids": pos,
        "logits": logits.contiguous(), "token_logprobs": lp.float().contiguous(),
        "greedy_prompt": prompt, "greedy_output": out.sequences.contiguous(),
        "greedy_step_logits": torch.cat([l.float() for l in out.logits], 0).contiguous(),
    }


def make(name, spec):
    torch.manual_seed(spec["seed"])
    qwen2 = spec.get("arch") == "qwen2"
    Config, Model = (Qwen2Config, Qwen2ForCausalLM) if qwen2 else (Qwen3Config, Qwen3ForCausalLM)
    base = {k: v for k, v in BASE.items() if not (qwen2 and k == "head_dim")}
    cfg = Config(**{**base, **spec["config"]})
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": spec["rope_theta"]}
    model = Model(cfg).eval().to(spec["dtype"])
    if qwen2:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith(".bias"):
                    p.normal_(0.0, 0.5)
    out = ROOT / name
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*"):
        f.unlink()
    kw = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
    model.save_pretrained(out, **kw)
    if spec["legacy_rope_key"]:
        c = json.loads((out / "config.json").read_text())
        c.pop("rope_parameters", None)
        c["rope_theta"] = spec["rope_theta"]
        (out / "config.json").write_text(json.dumps(c, indent=2) + "\n")
    (out / "generation_config.json").unlink(missing_ok=True)
    # References come from the checkpoint as stored, upcast to float32.
    ref_model = Model.from_pretrained(out, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(spec["seed"])
    save_file(reference(ref_model, cfg.vocab_size, gen), out / "reference.safetensors")
    print(name, sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    for n in sys.argv[1:] or VARIANTS:
        make(n, VARIANTS[n])
