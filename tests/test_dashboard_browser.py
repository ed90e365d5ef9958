"""`autoscout dashboard` in a real browser: the study page shows the trials, their decision
attrs and the AutoScout note with its plots. A screenshot is kept under ``test-artifacts/``."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autoscout_optuna import _dashboard

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM = os.environ.get("AUTOSCOUT_CHROMIUM") or shutil.which("chromium")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, server: subprocess.Popen, deadline_s: float = 60.0) -> None:
    """Poll until the server accepts connections (bounded); fail early if it died."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"dashboard exited early: {server.stderr.read()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"dashboard did not listen on port {port} within {deadline_s} s")


def _chromium(profile: Path, *args: str) -> str:
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=10000", *args,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.fixture
def dashboard(tmp_path):
    """A small explained study in SQLite, and `autoscout dashboard` serving it."""
    storage = f"sqlite:///{tmp_path / 'autoscout.db'}"
    study = optuna.create_study(storage=storage, study_name="browser-demo", direction="maximize")

    def objective(trial):
        layout = trial.suggest_categorical("layout", ["flat", "tree"])
        x = trial.suggest_float("x", 0.0, 1.0)
        trial.set_user_attr("autoscout:arm", "explore" if trial.number % 2 else "refine")
        trial.set_user_attr("autoscout:reason", f"demo decision {trial.number}")
        trial.set_user_attr("mcts:order", ["layout", "x"])
        trial.report(1.1 * x, 0)
        if trial.number % 3 == 2:
            raise optuna.TrialPruned()
        return x + (layout == "tree")

    study.optimize(objective, n_trials=6)
    _dashboard.publish(study, artifact_dir=tmp_path / "artifacts")
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "autoscout_optuna.cli", "dashboard", "--storage", storage,
         "--port", str(port), "--artifact-dir", str(tmp_path / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        _wait_for_port(port, server)
        yield f"http://127.0.0.1:{port}/dashboard/studies/{study._study_id}", study
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: set AUTOSCOUT_CHROMIUM or install "
                    "Debian's chromium (.ci/services.sh does)")
def test_study_page_renders_trials_decisions_and_note(dashboard, tmp_path):
    url, study = dashboard
    profile = tmp_path / "chromium-profile"

    note_dom = _chromium(profile, "--dump-dom", f"{url}/note")
    assert "AutoScout: browser-demo" in note_dom
    assert "Best configuration" in note_dom and "Arm allocation" in note_dom
    ids = study.user_attrs[_dashboard.ARTIFACT_IDS_KEY]
    assert f'src="/artifacts/{study._study_id}/{ids["best_so_far_by_arm.png"]}"' in note_dom

    trials_dom = _chromium(profile, "--dump-dom", f"{url}/trials")
    assert "autoscout:arm" in trials_dom and "demo decision" in trials_dom
    assert "Trial 5" in trials_dom or "(number=5)" in trials_dom

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard_note.png"
    _chromium(profile, "--window-size=1280,1600", f"--screenshot={shot}", f"{url}/note")
    assert shot.stat().st_size > 10_000
