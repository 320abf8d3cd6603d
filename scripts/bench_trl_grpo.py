#!/usr/bin/env python3
"""TRL's GRPOTrainer on terse's testbed checkpoint, for `cargo xtask bench grpo-step`.

Same settings as terse's default GRPO step: 8 prompts x 8 samples, at most 96 new tokens,
temperature 1, no KL, token-mean loss, one update per step, torch on 2 threads, f32. The
prompts are testbed chain problems of levels 1-6 in terse's format; the reward is 1 for the
right `<answer> d </answer>`. Prints one JSON line: seconds per step (the median over the
timed steps, after one warm-up step).

Setup (PyPI only): python3 -m venv ~/.cache/trl-venv &&
  ~/.cache/trl-venv/bin/pip install torch transformers trl datasets
Usage: ~/.cache/trl-venv/bin/python scripts/bench_trl_grpo.py tests/fixtures/testbed-sft [steps]
"""
import json
import random
import statistics
import sys
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
from trl import GRPOConfig, GRPOTrainer


def problem(rng):
    level = rng.randint(1, 6)
    start = rng.randint(0, 9)
    ops = [rng.randint(1, 3) for _ in range(level)]
    expr = " ".join([str(start)] + [f"+ {d}" for d in ops])
    answer = (start + sum(ops)) % 10
    prompt = f"<|im_start|> user {expr} mod 10 ? <|im_end|> <|im_start|> assistant <think>"
    return prompt, answer


def reward(completions, answer, **_):
    out = []
    for text, a in zip(completions, answer):
        got = text.split("<answer>")[-1].split("</answer>")[0].strip() if "<answer>" in text else ""
        out.append(1.0 if got == str(a) else 0.0)
    return out


class StepTimer(TrainerCallback):
    def __init__(self):
        self.t0, self.times = None, []

    def on_step_begin(self, args, state, control, **kw):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self.t0)


def main():
    model_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    torch.set_num_threads(2)
    torch.manual_seed(0)
    rng = random.Random(0)
    rows = [problem(rng) for _ in range(8 * (steps + 1))]
    data = Dataset.from_dict({"prompt": [p for p, _ in rows], "answer": [a for _, a in rows]})
    tok = PreTrainedTokenizerFast(tokenizer_file=f"{model_dir}/tokenizer.json")
    tok.pad_token, tok.eos_token = "<pad>", "<|im_end|>"
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    cfg = GRPOConfig(
        output_dir="/tmp/trl-grpo-bench",
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=96,
        temperature=1.0,
        beta=0.0,
        loss_type="dapo",  # token-mean over the batch, as terse's default
        learning_rate=2e-4,
        max_steps=steps + 1,
        logging_steps=1000,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data,
                          processing_class=tok, callbacks=[timer])
    trainer.train()
    timed = timer.times[1:]
    print(json.dumps({"trl_s_per_step": statistics.median(timed), "steps": len(timed),
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
