"""Shared fixtures, and a progress line while a slow test runs.

Some tests run real ``flwr run`` simulations or SuperLink/SuperNode processes for
tens of seconds, during which pytest prints nothing (its output is captured).
Every ``FEDROUTE_TEST_PROGRESS_SECONDS`` seconds (default 30; ``0`` turns it
off) a background thread writes one line to the terminal pytest started in,
naming the running test, its phase (a module fixture's Flower run shows as
``setup``) and how long it and the suite have been running.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from support.app_config import REPOSITORY, app_defaults
from support.grid import server_task_identity
from support.process_guard import MARKER, ProcessGuard

PROGRESS_ENV = "FEDROUTE_TEST_PROGRESS_SECONDS"


@pytest.fixture(scope="session")
def repository() -> Path:
    """The repository root (the Flower app)."""
    return REPOSITORY


@pytest.fixture(scope="session")
def repository_fab(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The FAB ``flwr build --app <repository>`` makes (built once per session)."""
    from support.fab import built_fab

    return built_fab(repository, tmp_path_factory.mktemp("fab"))


@pytest.fixture(scope="session")
def flower_app(repository: Path, repository_fab: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's Flower app for ``flwr run``: its files that Flower packs, copied once per session
    (:func:`support.fab.staged_app`), so that a run does not list a virtualenv inside the checkout.  Its FAB is
    the repository's, byte for byte."""
    from support.fab import fab_bytes, staged_app

    app_dir = staged_app(repository, tmp_path_factory.mktemp("flower-app") / repository.name)
    assert fab_bytes(app_dir) == repository_fab.read_bytes(), "the staged app's FAB differs from the repository's"
    return app_dir


@pytest.fixture()
def task_identity() -> Iterator[None]:
    """Flower stamps new messages with the running task's identity: this process is a ServerApp's
    for the test (``pytestmark = pytest.mark.usefixtures("task_identity")`` in a module that builds messages)."""
    with server_task_identity():
        yield


@pytest.fixture()
def one_torch_thread() -> Iterator[None]:
    """One torch thread for the test: tiny tensors, where more threads only contend on busy cores (a docs
    snippet's run took 15 s instead of about 1 s); the previous count is restored after it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def defaults() -> dict[str, Any]:
    """A fresh copy of the app's run config defaults (``[tool.flwr.app.config]``)."""
    return app_defaults()


@pytest.fixture()
def test_app(repository: Path, tmp_path: Path):
    """``make(name)``: a Flower app in ``tmp_path/name`` whose ClientApp is ``tests/apps/<name>/<name>_client.py``
    and whose ServerApp and run config are fedroute's."""
    import json
    import shutil

    def make(name: str) -> Path:
        app_dir = tmp_path / name
        app_dir.mkdir()
        shutil.copy(repository / "tests" / "apps" / name / f"{name}_client.py", app_dir)
        config_lines = "\n".join(f"{key} = {json.dumps(value)}" for key, value in app_defaults().items())
        (app_dir / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "{name}"\nversion = "0.1.0"\ndependencies = []\n\n'
            '[tool.flwr.app]\npublisher = "fedroute-tests"\n\n'
            '[tool.flwr.app.components]\nserverapp = "fedroute.server.app:app"\n'
            f'clientapp = "{name}_client:app"\n\n'
            f"[tool.flwr.app.config]\n{config_lines}\n"
        )
        return app_dir

    return make


FLOWER_SCRIPTS = ("flwr", "flower-superlink", "flower-supernode", "flower-superexec", "flwr-serverapp",
                  "flwr-clientapp", "flwr-simulation")


@pytest.fixture(scope="session")
def no_fedroute_bin(tmp_path_factory) -> Path:
    """``bin/`` of a virtualenv that sees this interpreter's packages (flwr, numpy, pandas, ray …) but where
    ``import fedroute`` fails (checked here).

    Its ``site-packages`` holds one ``.pth`` line naming this environment's ``site-packages``: that directory
    joins ``sys.path``, but its own ``.pth`` files (the editable install's finder) are not processed.  Flower's
    scripts are copied with this environment's interpreter.
    """
    import subprocess
    import sys
    import sysconfig

    directory = tmp_path_factory.mktemp("no-fedroute") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True, timeout=120)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (directory / "lib" / version / "site-packages" / "shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    bin_dir = directory / "bin"
    for name in FLOWER_SCRIPTS:
        source = (Path(sys.executable).parent / name).read_text().splitlines(keepends=True)
        (bin_dir / name).write_text(f"#!{bin_dir / 'python'}\n" + "".join(source[1:]))
        (bin_dir / name).chmod(0o755)
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    check = subprocess.run([str(bin_dir / "python"), "-c", "import flwr, numpy, pandas, ray\nimport fedroute"],
                           capture_output=True, text=True, cwd=directory, env=environment, timeout=120)
    assert "No module named 'fedroute'" in check.stderr, check.stderr  # the others imported first
    return bin_dir


@pytest.fixture(scope="session")
def reproduced(tmp_path_factory):
    """``reproduced(name, *args)``: the output directory of ``fedroute reproduce NAME --quick *args``, run once per
    session in this process (housing reads the table shipped with the package, offline)."""
    from fedroute.cli import main
    from fedroute.tasks.housing import EMBEDDED_TABLE

    outputs: dict[tuple[str, ...], Path] = {}

    def run(name: str, *args: str) -> Path:
        if (name, *args) not in outputs:
            out = tmp_path_factory.mktemp(name)
            data = ["--data-file", str(EMBEDDED_TABLE)] if name == "housing" and "--data-file" not in args else []
            assert main(["reproduce", name, "--quick", "--out", str(out), *data, *args]) == 0
            (outputs[(name, *args)],) = out.iterdir()
        return outputs[(name, *args)]

    return run


class SlowTestReporter:
    """Writes ``[still running 90 s] <test> (setup; suite 4 min 10 s)`` every ``interval`` seconds of one test.

    The lines go to a duplicate of the terminal's file descriptor taken before any test
    runs, so pytest's output capturing does not swallow them.
    """

    def __init__(self, interval: float, terminal_fd: int) -> None:
        self.interval = interval
        self.terminal_fd = terminal_fd
        self.suite_started = time.monotonic()
        self.test: Optional[str] = None
        self.phase = ""
        self.test_started = 0.0
        self._last_line = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-test-reporter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        os.close(self.terminal_fd)

    def begin(self, nodeid: str) -> None:
        with self._lock:
            self.test, self.phase, self.test_started = nodeid, "setup", time.monotonic()
            self._last_line = self.test_started

    def enter(self, phase: str) -> None:
        with self._lock:
            self.phase = phase

    def end(self) -> None:
        with self._lock:
            self.test = None

    def line(self, now: float) -> Optional[str]:
        """The progress line due at ``now`` (one per full interval of the running test), else None."""
        with self._lock:
            if self.test is None or now - self._last_line < self.interval:
                return None
            self._last_line = now
            suite = int(now - self.suite_started)
            return (f"\n[still running {now - self.test_started:.0f} s] {self.test} "
                    f"({self.phase}; suite {suite // 60} min {suite % 60:02d} s)\n")

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.interval / 4)):
            text = self.line(time.monotonic())
            if text:
                try:
                    os.write(self.terminal_fd, text.encode())
                except OSError:
                    return


_REPORTER_KEY = pytest.StashKey[SlowTestReporter]()
_GUARD_KEY = pytest.StashKey[ProcessGuard]()


def pytest_configure(config: pytest.Config) -> None:
    guard = ProcessGuard()
    guard.install()
    config.stash[_GUARD_KEY] = guard
    text = os.environ.get(PROGRESS_ENV, "30") or "0"
    try:
        interval = float(text)
    except ValueError:
        raise pytest.UsageError(f"{PROGRESS_ENV} = {text!r} is invalid; allowed: seconds (a number; 0 = off)") from None
    if interval <= 0:
        return
    # Output capturing is suspended between tests: fd 1 is the terminal here.
    reporter = SlowTestReporter(interval, os.dup(1))
    config.stash[_REPORTER_KEY] = reporter
    reporter.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    reporter = config.stash.get(_REPORTER_KEY, None)
    if reporter is not None:
        reporter.stop()


def _reporter(item: pytest.Item) -> Optional[SlowTestReporter]:
    return item.config.stash.get(_REPORTER_KEY, None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if (reporter := _reporter(item)) is not None:
        reporter.begin(item.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if (reporter := _reporter(item)) is not None:
        reporter.enter("call")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    if (reporter := _reporter(item)) is not None:
        reporter.enter("teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> Iterator[None]:
    """Only a test marked ``process`` may start Flower or Ray processes (:mod:`support.process_guard`)."""
    guard = item.config.stash[_GUARD_KEY]
    guard.enter(item.nodeid, allowed=item.get_closest_marker(MARKER) is not None)
    try:
        yield
    finally:
        guard.leave()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    guard = item.config.stash[_GUARD_KEY]
    if guard.refused:
        if report.passed:  # the code under test caught the refusal: fail anyway
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid} started {sorted(set(guard.refused))} without the `{MARKER}` "
                               "marker (see docs/testing.md)")
        guard.refused.clear()  # reported once
    if call.when == "teardown" and (reporter := _reporter(item)) is not None:
        reporter.end()
