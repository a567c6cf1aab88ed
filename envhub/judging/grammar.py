"""Grammar-constrained judge output: the verdict format as a llama.cpp GBNF grammar.

A small instruction-tuned judge often reaches the right verdict and then writes it in prose ("the grade is 10"):
the strict parser (:mod:`envhub.judging.format`) refuses that, rightly, and the judgment is lost. A grammar makes
the *decoder* produce the format instead: one line of reasoning, then exactly ``SCORE: N``. This is a decoding
setting sent with each request, not a second parser: the reply is still read by :func:`~envhub.judging.format.
parse_score`, and a server that ignores the grammar still gets its prose refused as a crash.

The reasoning line may hold neither a newline nor a colon (``[ -9;-~]``: printable ASCII less ``:``), so it cannot
carry a second ``SCORE: N`` that the parser would have to refuse as ambiguous (a judge quoting the answer's claimed
score), and it is capped in characters, so the verdict always fits in ``max_tokens``. ASCII only: a judge that
starts reasoning in the attacked language (a French or Chinese injection) is held to a short English line.

Servers that take it: llama.cpp's server (and xllamacpp, :mod:`envhub.judging.llamacpp`) read the request field
``grammar``. Others (vLLM's ``guided_grammar``, hosted APIs' structured outputs) name it differently or not at all;
pass their own field through ``JudgeModel(decoding=...)``.
"""
from __future__ import annotations

from typing import Any

REASON = r"[ -9;-~]"  # printable ASCII without ':' (0x3A): no verdict syntax inside the reasoning


def score_grammar(scale: int = 10, reason_chars: int = 100) -> str:
    """GBNF for one reasoning line (1..``reason_chars`` characters, no colon), a newline, ``SCORE: N``
    (N in ``0..scale``)."""
    if scale < 1 or reason_chars < 1:
        raise ValueError(f"score_grammar needs scale >= 1 and reason_chars >= 1 (got {scale}, {reason_chars})")
    numbers = " | ".join(f'"{n}"' for n in range(scale, -1, -1))  # longest first: "10" before "1"
    return (f'root ::= reason "\\n" "SCORE: " score\n'
            f"reason ::= {REASON}{{1,{reason_chars}}}\n"
            f"score ::= {numbers}\n")


def winner_grammar(reason_chars: int = 100) -> str:
    """GBNF for one reasoning line, a newline, ``WINNER: A|B|TIE`` (a pairwise judge)."""
    if reason_chars < 1:
        raise ValueError(f"winner_grammar needs reason_chars >= 1 (got {reason_chars})")
    return (f'root ::= reason "\\n" "WINNER: " ("A" | "B" | "TIE")\n'
            f"reason ::= {REASON}{{1,{reason_chars}}}\n")


def verdict_decoding(scale: int = 10, reason_chars: int = 100, *, pairwise: bool = False) -> dict[str, Any]:
    """The request fields for a llama.cpp-served judge: the grammar, and ``cache_prompt: False``.

    Why no prompt cache: llama.cpp reuses the KV cache of the longest common prefix with the previous request and
    evaluates only the rest; the logits of the first generated token then come from a differently shaped batch,
    and greedy decoding can take another path (measured: the same request twice, two different reasoning lines).
    Admission re-grades every verdict and refuses a judge that drifts, so every judgment evaluates its whole prompt.
    """
    grammar = winner_grammar(reason_chars) if pairwise else score_grammar(scale, reason_chars)
    return {"grammar": grammar, "cache_prompt": False}
