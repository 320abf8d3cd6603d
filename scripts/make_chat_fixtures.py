"""Writes tests/fixtures/chat_template/cases.json: conversations and the exact strings HF
transformers' apply_chat_template renders for them with the real Qwen3 tokenizer
(models/qwen3-tokenizer, Apache-2.0). terse's minijinja rendering must match byte for byte.

    .venv/bin/python scripts/make_chat_fixtures.py      # tested with transformers 5.24
"""
import json
import pathlib

from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
tok = AutoTokenizer.from_pretrained(ROOT / "models" / "qwen3-tokenizer")

CONVERSATIONS = {
    "user": [{"role": "user", "content": "What is 2+2?"}],
    "system_user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Solve x+1=3."}],
    "multi_turn_thinking": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello!"},
        {"role": "user", "content": "Who are the knights?"},
    ],
    "last_assistant_thinking": [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "<think>\nreasoning\n</think>\n\nA"},
    ],
    "unicode": [{"role": "user", "content": "Résumé: ∑ x² — 你好\n\nnew line"}],
}

cases = []
for name, messages in CONVERSATIONS.items():
    for add_generation_prompt in [True, False]:
        for enable_thinking in [None, True, False]:
            kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kw)
            cases.append({"name": name, "messages": messages, "add_generation_prompt": add_generation_prompt,
                          "enable_thinking": enable_thinking, "expected": text})
out = ROOT / "tests" / "fixtures" / "chat_template" / "cases.json"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")
print(f"wrote {len(cases)} cases to {out}")
