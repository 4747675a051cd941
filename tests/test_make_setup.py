"""`make setup` refuses to start a new environment on a disk that cannot hold it (real make, no install)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_setup_stops_before_pip_when_the_disk_is_too_small(tmp_path):
    venv = tmp_path / "venv"
    result = subprocess.run(
        ["make", "-C", str(REPO), "setup", f"VENV={venv}", "SETUP_FREE_GIB=1000000", f"PYTHON={sys.executable}"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "GiB free on this disk; the environment needs about 1000000 GiB" in result.stderr
    assert not venv.exists()  # stopped before the venv and pip


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_setup_goes_on_to_the_venv_where_the_disk_has_room(tmp_path):
    # A stand-in interpreter: the real one for the disk check (`-c`), a marker and a stop for `-m venv`.
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exec {sys.executable} "$@"\necho venv step reached >&2\nexit 3\n')
    python.chmod(0o755)
    result = subprocess.run(
        ["make", "-C", str(REPO), "setup", f"VENV={tmp_path / 'venv'}", "SETUP_FREE_GIB=0", f"PYTHON={python}"],
        capture_output=True, text=True, timeout=60)
    assert "GiB free on this disk" not in result.stderr
    assert "venv step reached" in result.stderr
