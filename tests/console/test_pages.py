"""Issue 54: pylog-console's pages over HTTP against a real broker: a clear page with its
status for what does not exist or cannot be read (never a stack trace), a page that never
waits past its timeout on a frozen broker, no change from a GET or a read-only console, the
changes of --allow-changes logged with their author, and the login of --token-file."""

from __future__ import annotations

import base64
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlencode

from broker.client import Admin, Producer
from broker.quotas import Kind
from broker.registry import Registry
from broker.zookeeper import free_port
from tests.conftest import wait_until
from tests.console.conftest import RunningConsole
from tests.curve import secret_file
from tests.pylogd import RunningBroker

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def registry_of(broker: RunningBroker) -> Registry:
    zookeeper, chroot = broker.arguments[:2]
    return Registry(zookeeper, chroot)


def form_token(page: str) -> str:
    found = re.search(r'name="form_token" value="([^"]+)"', page)
    assert found, "no form on the page"
    return found.group(1)


def test_what_does_not_exist_is_a_page_saying_so(
    broker: RunningBroker, console: Callable[..., RunningConsole], topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1)
    with Producer(broker.endpoint, topic) as producer:
        producer.send(b"the first message, 40 bytes and more")
    running = console("-b", broker.endpoint)
    for path, status, says in [
        ("/topics/no-such-topic", 404, "no topic 'no-such-topic'"),
        ("/groups/no-such-group", 404, "no consumer group 'no-such-group'"),
        (f"/messages?topic={topic}&partition=7", 404, f"no partition 7 of topic {topic!r}"),
        (f"/messages?topic={topic}&from=3", 400, "offset 3 is not a message boundary"),
        (f"/messages?topic={topic}&from=99999", 400, "out of range"),
        (f"/messages?topic={topic}&from=yesterday", 400, "give earliest, end, an offset"),
        (f"/messages?topic={topic}&count=0", 400, "count 0: 1 to 500 messages a page"),
        (f"/messages?topic={topic}&partition=x", 400, "partition 'x': a whole number"),
    ]:
        code, page = running.get(path)
        assert (code, says) == (status, says) and says in page.replace("&#39;", "'"), page
        assert "Traceback" not in page
    code, page = running.get(f"/messages?topic={topic}&from=3")
    assert f'value="{topic}"' in page  # the form kept, to be corrected


def test_a_page_never_waits_past_its_timeout_on_a_frozen_broker(
    pylogd: RunningBroker, console: Callable[..., RunningConsole]
) -> None:
    """Each request may wait --timeout (10 s here) for the broker; the page gives up after
    --page-timeout (2 s) and says so, and reads again once the broker answers."""
    running = console("-b", pylogd.endpoint, "--timeout", "10", "--page-timeout", "2")
    assert running.get("/")[0] == 200
    assert pylogd.process is not None
    os.kill(pylogd.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        code, page = running.get("/topics")
        waited = time.monotonic() - started
    finally:
        os.kill(pylogd.process.pid, signal.SIGCONT)
    assert code == 504 and "did not answer in time" in page, page
    assert waited < 2 + 3, waited  # the page timeout, and a margin for a busy machine
    wait_until(lambda: running.get("/topics")[0] == 200, 30, "the topics page again")


def test_a_broker_that_does_not_answer_is_a_page_saying_so(
    console: Callable[..., RunningConsole],
) -> None:
    running = console("-b", f"127.0.0.1:{free_port()}", "--timeout", "1")
    for path in ("/", "/topics", "/groups", "/messages?topic=t"):
        code, page = running.get(path)
        assert code == 503 and "Broker unreachable" in page, (path, page)
        assert "Traceback" not in page
    running.process.send_signal(signal.SIGINT)  # Ctrl-C: it stops, exit 0
    assert running.process.wait(20) == 0


def test_no_change_from_a_get_nor_from_a_read_only_console(
    broker: RunningBroker, console: Callable[..., RunningConsole]
) -> None:
    running = console("-b", broker.endpoint)
    code, page = running.get("/settings")
    assert code == 200 and "Read-only" in page and "form_token" not in page
    assert running.get("/settings/quota")[0] == 405  # GET changes nothing
    data = urlencode({"kind": "client", "name": "x", "produce": "100"}).encode()
    code, page = running.request("/settings/quota", data, FORM)
    assert code == 403 and "read-only" in page
    with registry_of(broker) as registry:
        assert "x" not in registry.quotas.read().quotas.get(Kind.CLIENT, {})


def test_changes_are_made_from_the_consoles_own_forms_and_logged_with_their_author(
    broker: RunningBroker, console: Callable[..., RunningConsole], tmp_path: Path
) -> None:
    token = "a-token-of-the-console-0123456789"
    token_file = secret_file(tmp_path / "console.token", token + "\n")
    running = console("-b", broker.endpoint, "--allow-changes", "--token-file", str(token_file))
    assert running.get("/")[0] == 401  # no login
    login = {"Authorization": "Basic " + base64.b64encode(f"ops:{token}".encode()).decode()}
    wrong = {"Authorization": "Basic " + base64.b64encode(b"ops:guess").decode()}
    assert running.get("/", wrong)[0] == 401
    assert running.get("/", {"Authorization": f"Bearer {token}"})[0] == 200  # for scripts
    code, page = running.get("/settings", login)
    assert code == 200
    fields = {"kind": "client", "name": "spark-nightly", "produce": "", "fetch": "52428800"}
    forged = urlencode({**fields, "form_token": "forged"}).encode()
    assert running.request("/settings/quota", forged, {**FORM, **login})[0] == 403

    data = urlencode({**fields, "action": "set", "form_token": form_token(page)}).encode()
    code, page = running.request("/settings/quota", data, {**FORM, **login})
    assert code == 200 and "Done: quota of client spark-nightly set" in page, page
    with registry_of(broker) as registry:
        quota = registry.quotas.read().quotas[Kind.CLIENT]["spark-nightly"]
    assert (quota.produce_bytes_per_s, quota.fetch_bytes_per_s) == (None, 52428800)
    assert "change by ops from 127.0.0.1: quota of client spark-nightly" in running.log.read_text()

    bad = urlencode({"name": "log.retention_ms", "value": "-5", "form_token": form_token(page)})
    code, page = running.request("/settings/broker", bad.encode(), {**FORM, **login})
    assert code == 400 and "retention_ms" in page, page  # refused, nothing written


def test_what_messages_hold_is_shown_as_text_never_as_markup(
    broker: RunningBroker, console: Callable[..., RunningConsole], topic: str
) -> None:
    with Admin(broker.endpoint) as admin:
        admin.create_topic(topic, 1)
    with Producer(broker.endpoint, topic) as producer:
        producer.send(b"<script>alert(1)</script>", key=b"<b>k</b>", headers=[("<i>", b"<u>")])
    running = console("-b", broker.endpoint)
    code, page = running.get(f"/messages?topic={topic}&view=text")
    assert code == 200, page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert "&lt;b&gt;k&lt;/b&gt;" in page and "&lt;i&gt;" in page and "&lt;u&gt;" in page
