"""An answer contract: deterministic steps an env publishes as part of its grading, applied before a judge reads.

A judge reads whatever it is shown, and a small one follows instructions wherever they hide. Some of what an answer
can carry is no part of an answer an env asks for, and a rule decides it better than a model can:

* **Hidden and non-prose parts are removed** before the judge reads the answer (``strip_markup``, ``strip_code``,
  ``strip_structured``): HTML/XML comments, elements hidden by ``display:none``/``visibility:hidden``/``hidden``
  with everything inside them, the remaining tags (their visible text is kept), Markdown comments
  (``[//]: # (...)``), fenced and inline code, JSON-like objects (``{...}``; an unclosed one to the end of the
  text) and zero-width characters. An env whose answers are one sentence of prose loses nothing a reader would
  see; an instruction to the grader hidden in any of them is gone before the judge is asked.
* **A word budget** (``max_words``, like DAPO's overlong penalty, but a hard limit): an answer longer than the env
  asks for fails unjudged. Padding (hundreds of words restating the question) is the attack a judge is worst at
  (it reads effort as quality); a budget the env states in its task text costs an honest answer nothing.
* **Nothing left** after the removals: the answer fails unjudged (an answer that was all markup, code or a JSON
  reward claim says nothing).

Every step is reported in ``Score.details`` (``contract_removed``: which kinds were removed; ``reason`` when it
failed), so a trainer's reward is explainable. This is one layer, not the defence: plain prose instructions get
through it by design, and the judge's own prompt (:mod:`envhub.judging.format`) must refuse them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_FLAGS = re.I | re.S
# An opening tag never spans another "<" ([^<>], not [^>]): with [^>] an answer of 10,000 unclosed "<a " took 18 s
# (each "<" scanned to the end of the text, quadratic); now each scans to the next "<".
HIDDEN = re.compile(r"<(\w+)\b[^<>]*?(?:display\s*:\s*none|visibility\s*:\s*hidden|\shidden\b)[^<>]*>.*?</\1\s*>",
                    _FLAGS)
STEPS: list[tuple[str, str, re.Pattern[str]]] = [
    ("markup", "comment", re.compile(r"<!--.*?(?:-->|$)", _FLAGS)),
    ("markup", "hidden", HIDDEN),
    ("markup", "markdown-comment", re.compile(r"^\s*\[//\]:\s*#\s*[(\"'].*?$", re.M)),
    ("code", "fenced-code", re.compile(r"(```|~~~).*?(?:\1|$)", re.S)),
    ("code", "inline-code", re.compile(r"`[^`\n]*`")),
    ("markup", "tag", re.compile(r"</?[A-Za-z][\w:-]*\b[^<>]*>|</?[A-Za-z][\w:-]*\s*$")),
    ("structured", "json", re.compile(r"\{.*?(?:\}|$)|\[\s*[\"{\[].*?(?:\]|$)", re.S)),
    ("markup", "zero-width", re.compile("[\u200b-\u200f\u2060-\u2064\ufeff]")),
]


@dataclass(frozen=True)
class AnswerContract:
    """What an env guarantees about the answers its judge reads (see the module docstring).

    Args:
        strip_markup: remove comments, hidden elements, tags, Markdown comments, zero-width characters.
        strip_code: remove fenced code blocks and inline code spans.
        strip_structured: remove JSON-like objects (and an unclosed one to the end of the text).
        max_words: an answer (after the removals) with more words fails unjudged; ``None``: no budget.
        max_chars: an answer longer than this (before the removals) fails unjudged, unread: the removals are
            regular expressions, and a policy must not be able to make grading slow by sending a huge answer.
    """

    strip_markup: bool = True
    strip_code: bool = True
    strip_structured: bool = True
    max_words: int | None = None
    max_chars: int = 20_000

    def __post_init__(self) -> None:
        if self.max_words is not None and self.max_words < 1:
            raise ValueError(f"AnswerContract(max_words=...) must be at least 1, got {self.max_words}")
        if self.max_chars < 1:
            raise ValueError(f"AnswerContract(max_chars=...) must be at least 1, got {self.max_chars}")

    def apply(self, answer: str) -> tuple[str, list[str], str | None]:
        """``(text the judge reads, kinds removed, why it fails unjudged or None)``."""
        if len(answer) > self.max_chars:
            return "", [], f"answer of {len(answer)} characters, over the contract's limit of {self.max_chars}"
        on = {"markup": self.strip_markup, "code": self.strip_code, "structured": self.strip_structured}
        text, removed = answer, []
        for group, kind, pattern in STEPS:
            if on[group]:
                text, n = pattern.subn(" ", text)
                if n:
                    removed.append(kind)
        if removed:  # tidy the gaps; an answer with nothing removed is judged exactly as written (and cached so)
            text = re.sub(r"[ \t]+", " ", text)
            text = "\n".join(ln.strip() for ln in text.splitlines() if ln.strip())
        if not re.search(r"\w", text):
            return text, removed, f"nothing left to judge once {', '.join(removed) or 'whitespace'} was removed"
        words = len(re.findall(r"\w+", text))
        if self.max_words is not None and words > self.max_words:
            return text, removed, f"answer of {words} words, over the env's budget of {self.max_words}"
        return text, removed, None
