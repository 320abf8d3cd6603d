"""Writes tests/fixtures/adamw/reference.safetensors: torch.optim.AdamW trajectories that
terse-optim must reproduce to 1e-6.

Three parameters of different shapes, 6 steps with seeded gradients, weight decay on, an LR that
changes per step; once without clipping and once with clip_grad_norm_(max_norm=0.5) (which
bites on every step). Stored: initial params `p0.<name>`, gradients `g<step>.<name>`, the LR of
each step `lr`, and the params after the last step `final.<variant>.<name>`.

    .venv/bin/python scripts/make_adamw_reference.py      # tested with torch 2.15
"""
import pathlib

import torch
from safetensors.torch import save_file

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "adamw" / "reference.safetensors"
SHAPES = {"a.weight": (4, 3), "b.bias": (5,), "c.norm": (2, 3, 2)}
STEPS = 6
HP = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
LRS = [1e-2, 2e-2, 3e-2, 3e-2, 2e-2, 1e-2]

torch.manual_seed(0)
p0 = {k: torch.randn(s, dtype=torch.float64).float() for k, s in SHAPES.items()}
grads = [{k: (torch.randn(s) * (1 + i)).float() for k, s in SHAPES.items()} for i in range(STEPS)]
out = {f"p0.{k}": v.clone() for k, v in p0.items()}
for i, g in enumerate(grads):
    for k, v in g.items():
        out[f"g{i}.{k}"] = v.clone()
out["lr"] = torch.tensor(LRS, dtype=torch.float64)

for variant, clip in [("noclip", None), ("clip", 0.5)]:
    params = {k: torch.nn.Parameter(v.clone()) for k, v in p0.items()}
    opt = torch.optim.AdamW(list(params.values()), lr=LRS[0], foreach=False, **HP)
    norms = []
    for i, g in enumerate(grads):
        for k, p in params.items():
            p.grad = g[k].clone()
        if clip is not None:
            norms.append(torch.nn.utils.clip_grad_norm_(list(params.values()), clip, foreach=False).item())
        for group in opt.param_groups:
            group["lr"] = LRS[i]
        opt.step()
    for k, p in params.items():
        out[f"final.{variant}.{k}"] = p.detach().clone()
    if norms:
        out[f"norms.{variant}"] = torch.tensor(norms, dtype=torch.float64)

OUT.parent.mkdir(parents=True, exist_ok=True)
save_file({k: v.contiguous() for k, v in out.items()}, OUT)
print(f"wrote {OUT} ({len(out)} tensors)")
