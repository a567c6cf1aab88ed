"""Fixtures for the chat / tool-call / fidelity tests: tiny real models (ChatML and Llama-3.1 templates), built
offline once per session into a temporary directory, and codecs over them."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # rollout_sim, whatever the import mode

from rollout_sim import TOOLS  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """``{"chatml": dir, "llama3": dir}``: tiny random Qwen2 models with real BPE tokenizers and chat templates."""
    from envhub.testing.models import build_tiny_model

    root = tmp_path_factory.mktemp("tiny-models")
    return {t: build_tiny_model(root, template=t) for t in ("chatml", "llama3")}


@pytest.fixture(scope="session")
def tiny_tokenizers(tiny_models):
    from envhub.testing.models import load_tokenizer

    return {t: load_tokenizer(p) for t, p in tiny_models.items()}


@pytest.fixture(scope="session", params=["chatml", "llama3"])
def family(request):
    """Each test using it runs once per chat template family."""
    return request.param


@pytest.fixture(scope="session")
def tok(tiny_tokenizers, family):
    return tiny_tokenizers[family]


@pytest.fixture(scope="session")
def codec(tok):
    from envhub.codec.chat import ChatCodec

    return ChatCodec(tok, tools=TOOLS)


@pytest.fixture(scope="session")
def text_codec(tok):
    from envhub.codec.chat import ChatCodec

    return ChatCodec(tok)


@pytest.fixture(scope="session")
def built():
    """Offline-trained tokenizers over the pipelines the fast encoder covers and those it refuses (built_tokenizers)."""
    from built_tokenizers import built_tokenizers

    return built_tokenizers()
