"""Shared pytest fixtures: where the moet binary, the repository and ../shared/data are."""
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def moet_bin():
    path = os.environ.get("MOET_BIN", str(REPO / "build" / "moet"))
    if not os.path.exists(path):
        pytest.fail(f"moet binary not found at {path}; build first or set MOET_BIN")
    return path


@pytest.fixture(scope="session")
def run_moet(moet_bin):
    """Runs `moet ARGS...` and returns the CompletedProcess (text mode, never raises)."""

    def run(*args, timeout=300):
        return subprocess.run([moet_bin, *map(str, args)], capture_output=True, text=True,
                              timeout=timeout)

    return run


@pytest.fixture(scope="session")
def repo():
    return REPO


@pytest.fixture(scope="session")
def shared_data():
    if not SHARED_DATA.exists():
        pytest.fail(f"{SHARED_DATA} is missing (shared/ must sit beside the checkout)")
    return SHARED_DATA
