"""Writes tests/fixtures/datasets/: small JSONL and Parquet files in the layouts users bring
(GSM8K-like flat columns; verl-style chat prompts with a nested reward_model.ground_truth),
written by pyarrow (snappy), as HF `datasets.to_parquet` does, plus a JSONL file with bad rows.

    .venv/bin/python scripts/make_dataset_fixtures.py       # needs pyarrow
"""
import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "datasets"
OUT.mkdir(parents=True, exist_ok=True)

flat = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3} for i in range(5)]
pq.write_table(pa.Table.from_pylist(flat), OUT / "flat.parquet", compression="snappy")
(OUT / "flat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in flat))

verl = [{"data_source": "kk_logic",
         "prompt": [{"role": "user", "content": f"Puzzle {i}"}],
         "reward_model": {"style": "rule", "ground_truth": f"(1) Zoey is a {'knight' if i % 2 else 'knave'}"},
         "extra_info": {"index": i}} for i in range(4)]
pq.write_table(pa.Table.from_pylist(verl), OUT / "verl.parquet", compression="zstd")

bad = [json.dumps(flat[0]), "{not json", json.dumps({"question": "no answer"}), "",
       json.dumps({"question": 5, "answer": "1"}), json.dumps(flat[1])]
(OUT / "bad.jsonl").write_text("\n".join(bad) + "\n")
print("wrote", sorted(p.name for p in OUT.iterdir()))
