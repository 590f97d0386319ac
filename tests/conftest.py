# SPDX-License-Identifier: BSD-2-Clause
"""Test options: ``--slow`` runs the long simulations (all widths, more seeds)."""

import sys
from pathlib import Path

import pytest

__all__ = ["ROOT", "GOLDEN_DIR", "PROTOCOL_MD", "protocol_md"]

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: The golden captures of Linux soft-RoCE traffic (../shared/golden beside the repo).
GOLDEN_DIR = ROOT.parent / "shared" / "golden"
#: The protocol reference the tests check constants and oracles against.
PROTOCOL_MD = ROOT.parent / "shared" / "PROTOCOL.md"


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run tests marked slow (every width, more seeds)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def golden_dir():
    if not GOLDEN_DIR.is_dir():
        pytest.fail(f"golden captures not found at {GOLDEN_DIR} (shared/ must sit beside the repo)")
    return GOLDEN_DIR


@pytest.fixture(scope="session")
def protocol_md():
    """Text of ../shared/PROTOCOL.md (the test fails clearly if it is missing)."""
    if not PROTOCOL_MD.is_file():
        pytest.fail(f"{PROTOCOL_MD} not found (shared/ must sit beside the repo)")
    return PROTOCOL_MD.read_text()
