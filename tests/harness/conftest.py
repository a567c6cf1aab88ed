"""The harness tier (``make test-harness``): real agent CLIs from .harness/ (scripts/setup-harness.sh) in bwrap."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "gateway"))  # gw_helpers


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/harness/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.harness)


@pytest.fixture(scope="session")
def swe_gym():
    import envhub
    from helpers import bwrap_why_not

    why = bwrap_why_not()
    if why:
        pytest.skip(why)
    spec = envhub.get_spec("swe-gym")
    return spec, [dict(t) for t in spec.load_tasks()]


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from envhub.cli.common import default_tokenizer
    from envhub.testing.models import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model(default_tokenizer()))
