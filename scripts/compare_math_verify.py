"""Grades crates/tasks/src/math/graded.tsv with HF's math-verify, the checker TRL and open-r1
users verify with, so terse's agreement with the human verdicts (the graded-table test prints
it) can be set beside math-verify's on the same pairs.

    pip install "math-verify[antlr4_13_2]"
    python3 scripts/compare_math_verify.py [--show]

Each side is parsed as math-verify's README does for a ground truth and a model answer: the
text inside $...$ (LaTeX extraction), falling back to the plain-expression extraction.
"""

import sys
from collections import Counter
from pathlib import Path

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

TABLE = Path(__file__).resolve().parent.parent / "crates/tasks/src/math/graded.tsv"
CONFIG = [LatexExtractionConfig(), ExprExtractionConfig()]


def read(text: str):
    if not text:
        return []
    got = parse(f"${text}$", extraction_config=CONFIG, parsing_timeout=5)
    return got or parse(text, extraction_config=CONFIG, parsing_timeout=5)


def main() -> None:
    show = "--show" in sys.argv
    rows = [
        line.rstrip("\n").split("\t")
        for line in TABLE.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ]
    agree, false_pos, misses = 0, Counter(), Counter()
    for cls, answer, truth, verdict in rows:
        want = verdict == "1"
        try:
            got = bool(verify(read(truth), read(answer), timeout_seconds=5))
        except Exception:  # noqa: BLE001 - a crash is a "no", as in a training loop
            got = False
        if got == want:
            agree += 1
        elif got:
            false_pos[cls] += 1
            if show:
                print(f"accepted a wrong answer [{cls}]: {answer!r} for {truth!r}")
        else:
            misses[cls] += 1
            if show:
                print(f"rejected a right answer [{cls}]: {answer!r} for {truth!r}")
    n = len(rows)
    print(f"math-verify: {agree}/{n} agree ({100 * agree / n:.1f} %), "
          f"{sum(false_pos.values())} false positives, {sum(misses.values())} false negatives")
    print("false positives by class:", dict(false_pos))
    print("false negatives by class:", dict(misses))


if __name__ == "__main__":
    main()
