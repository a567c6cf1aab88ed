"""Shared fixtures: real tokenizers and a real tiny model, built offline once per session."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_path():
    from envhub.testing.models import build_tiny_model

    return build_tiny_model(template="chatml")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from envhub.testing.models import load_tokenizer

    return load_tokenizer(tiny_model_path)


@pytest.fixture(scope="session")
def llama3_tokenizer():
    from envhub.testing.models import build_tiny_model, load_tokenizer

    return load_tokenizer(build_tiny_model(template="llama3"))

