"""Issue 54: the console in a real browser (headless Chromium, tests/console/conftest.py)
against real brokers and ZooKeeper, each page kept as a screenshot: the cluster page shows a
broker going down within its refresh; a group's lag grows while its member is stopped and
shrinks when it resumes; the message browser pages through compressed sets and headers; a
Curve cluster reached without the console's keys shows the error page, and with them what
its principal's ACLs allow."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.expected_conditions import staleness_of

from broker.client import Ack, Admin, Producer
from broker.zookeeper import PrivateZooKeeper
from tests.cluster.conftest import Member, make_member  # noqa: F401 (fixture)
from tests.console.conftest import RunningConsole, screenshot, shows, text_of
from tests.curve import SUPER_USER, running_curve_broker
from tests.pylogd import ThreeBrokers

REFRESH_S = 1.0
REPLICATED = {"replication_factor": "3", "min_insync_replicas": "2"}


def broker_row_state(browser: WebDriver, broker_id: int) -> str:
    return text_of(browser, f'#brokers tr[data-broker="{broker_id}"] .state')


def test_the_cluster_page_shows_a_broker_going_down_within_its_refresh(
    shared_three_brokers: ThreeBrokers,
    console: Callable[..., RunningConsole],
    browser: WebDriver,
    topic: str,
) -> None:
    three = shared_three_brokers
    single = f"{topic}-single"
    with Admin(three.endpoints[1]) as admin:
        admin.create_topic(topic, 3, REPLICATED)  # every broker holds a replica of each
        admin.create_topic(single, 3)  # one replica each: one of them on broker 3
    running = console("-b", three.endpoints[1], "--refresh", str(REFRESH_S), "--timeout", "2")
    browser.get(running.url + "/")
    shows(browser, lambda b: broker_row_state(b, 3) == "up", "broker 3 up")
    assert text_of(browser, "#health") == "healthy"
    screenshot(browser, "cluster-healthy")

    three.brokers[3].stop()
    # Within its refresh: the next update reads the registry that broker 3 has left (the
    # bound is a few refreshes, for a busy machine; the page is never reloaded).
    shows(browser, lambda b: broker_row_state(b, 3) == "down", "broker 3 down")
    shows(browser, lambda b: text_of(b, "#health") == "not healthy", "unhealthy")
    assert topic in text_of(browser, "main")  # its partitions, under-replicated, listed
    screenshot(browser, "cluster-broker-down")
    code, page = running.get("/topics")  # the topic with an offline partition first
    assert code == 200 and page.index(f">{single}<") < page.index(f">{topic}<"), page
    code, page = running.get(f"/topics/{single}")
    assert code == 200 and "offline (" in page
    offline = next(
        p.partition
        for p in Admin(three.endpoints[1]).metadata([single]).topics[0].partitions
        if p.broker_id in (-1, 3) or p.error_code
    )
    code, page = running.get(f"/messages?topic={single}&partition={offline}")
    assert code in (502, 503) and '<section class="error"' in page, page

    three.restart(3)
    shows(browser, lambda b: broker_row_state(b, 3) == "up", "broker 3 up again")


def lag_shown(browser: WebDriver) -> int:
    shown = text_of(browser, "#lag-messages")
    return int(shown.lstrip("~")) if shown else -1


def test_a_groups_lag_grows_while_its_member_is_stopped_and_shrinks_when_it_resumes(
    shared_three_brokers: ThreeBrokers,
    console: Callable[..., RunningConsole],
    browser: WebDriver,
    make_member: Callable[..., Member],  # noqa: F811 (the fixture)
    topic: str,
) -> None:
    endpoint = shared_three_brokers.endpoints[1]
    group = f"watched-{topic}"
    with Admin(endpoint) as admin:
        admin.create_topic(topic, 2)
    with Producer(endpoint, topic, ack=Ack.FLUSHED) as producer:
        for i in range(20):
            producer.send(b"first %d" % i, key=b"k%d" % i)
    member = make_member(endpoint, group, [topic])
    running = console("-b", endpoint, "--refresh", str(REFRESH_S), "--history-interval", "1")
    browser.get(f"{running.url}/groups/{group}")
    shows(browser, lambda b: lag_shown(b) == 0 and len(member.records) == 20, "lag 0")

    member.close()  # stopped: commits what it read, and leaves
    with Producer(endpoint, topic, ack=Ack.FLUSHED) as producer:
        for i in range(30):
            producer.send(b"second %d" % i, key=b"k%d" % i)
    shows(browser, lambda b: lag_shown(b) == 30, "lag 30 messages")
    assert "No member is consuming" in text_of(browser, "main")
    screenshot(browser, "group-lag-grown")

    resumed = make_member(endpoint, group, [topic])
    shows(browser, lambda b: lag_shown(b) == 0, "lag back to 0")
    resumed_values = sorted(record.value for _, record in resumed.records)
    assert resumed_values == sorted(b"second %d" % i for i in range(30))
    shows(browser, lambda b: "30 messages" in text_of(b, "svg.chart"), "the chart's peak")
    screenshot(browser, "group-lag-caught-up")


def test_the_message_browser_pages_through_compressed_sets_and_headers(
    shared_three_brokers: ThreeBrokers,
    console: Callable[..., RunningConsole],
    browser: WebDriver,
    topic: str,
) -> None:
    endpoint = shared_three_brokers.endpoints[1]
    with Admin(endpoint) as admin:
        admin.create_topic(topic, 1)
    sent = [(b'{"n": %d}' % i, (("trace", b"t-%d" % i),)) for i in range(25)]
    with Producer(
        endpoint, topic, ack=Ack.FLUSHED, batch_messages=10, compression="zstd"
    ) as producer:  # sets of 10, 10 and 5: pages of 4 end inside them
        for value, headers in sent:
            producer.send(value, headers=headers)
    running = console("-b", endpoint)
    browser.get(f"{running.url}/messages?topic={topic}&partition=0&from=earliest&count=4")
    seen: list[tuple[str, str]] = []
    for page in range(10):
        rows = browser.find_elements(By.CSS_SELECTOR, "#messages tbody tr")
        for row in rows:
            cells = row.find_elements(By.TAG_NAME, "td")
            assert "set" in cells[0].text, cells[0].text  # shown as a compressed set's
            seen.append((cells[4].text, cells[3].text))
        if page == 1:
            screenshot(browser, "messages-compressed-with-headers")
        if browser.find_elements(By.ID, "at-end"):
            break
        browser.find_element(By.ID, "next").click()
        shows(browser, staleness_of(rows[0]), "the next page")
    values = [value for value, _ in seen]
    assert values == [f'{{\n  "n": {i}\n}}' for i in range(25)]  # each once, in order, as JSON
    assert [headers for _, headers in seen] == [f"trace: t-{i}" for i in range(25)]


def key_options(key_dir: Path, name: str) -> tuple[str, ...]:
    return (
        "--key-file",
        str(key_dir / f"{name}.key_secret"),
        "--broker-key",
        str(key_dir / "broker.key"),
    )


def running_status(console: RunningConsole, path: str) -> tuple[int, str]:
    """The status of GET `path` and the title of its error page ("" for none)."""
    code, page = console.get(path)
    found = re.search(r'<section class="error" id="error">\s*<h2>(.*?)</h2>', page)
    return code, found.group(1) if found else ""


def test_a_curve_cluster_shows_the_error_page_without_keys_and_what_the_acls_allow_with_them(
    zookeeper: PrivateZooKeeper,
    tmp_path: Path,
    console: Callable[..., RunningConsole],
    browser: WebDriver,
) -> None:
    with running_curve_broker(zookeeper, tmp_path / "curve") as curve:
        endpoint = curve.broker.endpoint
        keyless = console("-b", endpoint, "--timeout", "1")
        browser.get(keyless.url + "/")
        shows(browser, lambda b: text_of(b, "#error"), "the error page")
        text = text_of(browser, "#error")
        assert "The broker refused the console" in text, text
        assert "serves CurveZMQ" in text and "--key-file and --broker-key" in text, text
        assert "Traceback" not in browser.page_source
        screenshot(browser, "curve-without-keys")

        keyed = console("-b", endpoint, *key_options(curve.key_dir, SUPER_USER))
        browser.get(keyed.url + "/")
        shows(browser, lambda b: text_of(b, "#health") == "healthy", "healthy")

        # The principal's ACLs decide what the console shows: alice has none.
        with Admin(endpoint, keys=curve.keys(SUPER_USER)) as admin:
            admin.create_topic("guarded", 1)
        alice = console("-b", endpoint, *key_options(curve.key_dir, "alice"))
        assert running_status(alice, "/topics/guarded") == (403, "Not allowed")
        assert keyed.get("/topics/guarded")[0] == 200
