"""pylog-console as an operator runs it: the command in a process of its own (`console`), and
headless Chromium from Debian's packages driven through Debian's chromium-driver (`browser`).
Each page a test looks at is kept as a screenshot under $PYLOG_TEST_ARTIFACTS/console
(default test-artifacts/console in the checkout)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import wait_until

ROOT = Path(__file__).parents[2]
ARTIFACTS = Path(os.environ.get("PYLOG_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "console"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
BROWSER_WAIT_S = 30.0
"""The longest a browser test waits for a page to show what it looks for."""
READY = re.compile(r"pylog-console ready on (http://\S+)")


@dataclass
class RunningConsole:
    """A pylog-console process; `url` where it serves, `log` its stderr's file."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        """The status and body of GET `path` (an error status is returned, not raised)."""
        return self.request(path, headers=headers)

    def request(
        self,
        path: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> tuple[int, str]:
        request = urllib.request.Request(self.url + path, data=data, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def stop(self) -> int:
        """SIGTERM, then the exit code (killed, and -9, past 20 s)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


def console_command(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("pylog-console")), *args]


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Callable[..., RunningConsole]]:
    """Start `pylog-console --port 0 ARGS` (on 127.0.0.1), ready once it says where it
    serves; each is stopped with SIGTERM at the end of the test and must exit 0."""
    started: list[RunningConsole] = []

    def start(*args: str) -> RunningConsole:
        out = tmp_path / f"console-{len(started)}.out"
        log = tmp_path / f"console-{len(started)}.log"
        with out.open("wb") as stdout, log.open("wb") as stderr:
            process = subprocess.Popen(
                console_command("--port", "0", *args), stdout=stdout, stderr=stderr
            )
        running = RunningConsole(process, "", log)
        started.append(running)

        def ready() -> bool:
            assert process.poll() is None, f"pylog-console exited: {log.read_text()}"
            found = READY.search(out.read_text())
            running.url = found.group(1) if found else ""
            return found is not None

        wait_until(ready, 30, "pylog-console ready")
        return running

    yield start
    codes = [running.stop() for running in started]
    for running in started:
        print(f"--- pylog-console log:\n{running.log.read_text()[-3000:]}")
    assert codes == [0] * len(codes), "pylog-console did not exit 0"


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """Headless Chromium at 1366x900 (a laptop's screen), without its background traffic
    (this machine's network is closed)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1366,900",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(BROWSER_WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(browser: WebDriver, name: str) -> Path:
    """The page as it is now, kept as ARTIFACTS/NAME.png."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    assert browser.save_screenshot(str(path)), path
    return path


def text_of(browser: WebDriver, selector: str) -> str:
    """The text of the first element `selector` finds ("" for none), read in one step of the
    page's script: the page may swap its content between two WebDriver calls."""
    found = browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : '';",
        selector,
    )
    return " ".join(str(found).split())


def shows(browser: WebDriver, condition: Callable[[WebDriver], object], what: str) -> None:
    """Wait until `condition(browser)` holds (the page refreshes itself meanwhile), at most
    BROWSER_WAIT_S; fail saying `what` was awaited, with a screenshot kept."""
    try:
        WebDriverWait(browser, BROWSER_WAIT_S, poll_frequency=0.1).until(condition)
    except TimeoutException as error:
        shot = screenshot(browser, "failed-" + re.sub(r"\W+", "-", what))
        raise AssertionError(f"the page did not show {what} (see {shot})") from error
