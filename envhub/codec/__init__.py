"""The token codec: chat messages in, token ids out, and sampled token ids back to actions.

What it guarantees (and the tests in ``tests/rollout/test_chat_codec.py``, ``test_encoding.py``,
``test_frame_ids.py``, ``test_fidelity_*.py`` break on purpose to show):

* **Sampled ids are never re-tokenized.** The executor (and the gateway) append the ids a backend sampled as they
  are; the codec only ever tokenizes text that the *template* produced around them (:mod:`.chat`).
* **A delta is what the full rendering would give there.** ``ChatCodec.delta_ids(history, new)`` equals the ids of
  ``template(history + new + generation prompt)`` after ``template(history)``; a template that rewrites earlier
  turns raises :class:`ChatTemplateError` instead of producing wrong tokens.
* **Fast paths are exact or off.** The Python pre-tokenizer (:mod:`.pretok`), the cached word encoder
  (:mod:`.encoding`) and the template frames (:mod:`.frames`, :mod:`.frame_ids`) are used only where they provably
  give the same ids as ``tokenizer.encode`` and the real Jinja template; anywhere else the codec uses those two.
* **Tool calls round-trip.** A parser (:mod:`.toolcall`) turns decoded model text into an
  :class:`~envhub.env.Action` and formats an action as its model family would write it.

Modules: :mod:`.chat` (``ChatCodec``), :mod:`.messages` (messages as templates expect them), :mod:`.toolcall`
(parsers), :mod:`.encoding` / :mod:`.pretok` (fast exact tokenization), :mod:`.frames` / :mod:`.frame_ids` (template
frames). Nothing here imports torch, a trainer or a GPU library; ``transformers`` only for the tokenizer handed in.
"""
