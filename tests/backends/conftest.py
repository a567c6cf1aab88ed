"""Fixtures for the backend tests: a tiny real model + tokenizer built offline, and a ChatCodec over it."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny random Qwen2 model with a real byte-level BPE tokenizer and the ChatML template (built in < 1 s)."""
    from envhub.testing.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models"), template="chatml", seed=0)


@pytest.fixture(scope="session")
def tiny_llama3_dir(tmp_path_factory):
    from envhub.testing.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models-llama3"), template="llama3", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from envhub.testing.models import load_tokenizer

    return load_tokenizer(tiny_dir)


@pytest.fixture(scope="session")
def codec(tokenizer):
    """The real ChatCodec (ChatML template, Hermes tool calls) over the tiny tokenizer."""
    from envhub.codec.chat import ChatCodec

    return ChatCodec(tokenizer)


@pytest.fixture(scope="session")
def hf(tiny_dir):
    """The hf backend on the tiny model (fp32, one torch thread: a tiny model gains nothing from more)."""
    from envhub.backends.hf import HFBackend

    return HFBackend(tiny_dir, num_threads=1)
