"""The web console in a real browser (headless chromium, Playwright) against real processes.

The main story, on a 3-node cluster of 1,024 vbuckets under a steady map-following write load,
as an operator would live it: the page asks for the login, then shows three healthy nodes,
the replication connections and the bucket's writes per second; a fourth node is added and
the console's Rebalance button (after its confirmation) starts a rebalance whose progress is
seen moving until the new node holds its share; the console fails a node over and it shows;
recovering it from the console starts a rebalance, which the console stops. Then, on a small
cluster, an automatic failover (a node killed) shows in the events. Screenshots of each step
are kept in build/artefacts/console/. Every wait is for a condition, with a deadline; nothing
is timed.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect

from dcpkv.client.settings import ConnectionSettings
from dcpkv.client.writer import KVWriter, WriteOp
from dcpkv.core.defaults import DEFAULT_PASSWORD, DEFAULT_USER
from support.managerproc import Cluster, ManagerProcess, start_cluster
from support.serverproc import ServerProcess

pytestmark = pytest.mark.slow

VBUCKETS = 1024
WAIT_MS = 60_000  # a deadline for what the page must come to show, on a busy machine
REBALANCE_S = 600.0
Shots = Callable[[Any, str], Path]


class Writes:
    """Upserts of a fixed key set, round after round, through the map (``KVWriter``), in a
    thread until stopped; what failed is kept for the test to report."""

    def __init__(self, node: ServerProcess) -> None:
        self.settings = ConnectionSettings.at("127.0.0.1", node.port)
        self.rounds = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writes:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        try:
            with KVWriter(self.settings, VBUCKETS) as writer:
                while not self._stop.is_set():
                    value = str(self.rounds).encode()
                    writer.write(WriteOp(f"k{i}".encode(), value=value) for i in range(100))
                    self.rounds += 1
                    self._stop.wait(0.2)  # a steady trickle: the story is the console's
        except BaseException as exc:  # noted for the test; the thread must not die silently
            self.errors.append(exc)


@pytest.fixture
def cluster(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> Cluster:
    return start_cluster(
        server_factory, manager_factory, tmp_path, nodes=3, replicas=1, num_vbuckets=VBUCKETS
    )


@pytest.fixture
def small_cluster(
    server_factory: type[ServerProcess], manager_factory: type[ManagerProcess], tmp_path: Path
) -> Cluster:
    return start_cluster(server_factory, manager_factory, tmp_path, nodes=3, replicas=1)


@pytest.fixture
def page(browser: Any) -> Iterator[Page]:
    context = browser.new_context(
        http_credentials={"username": DEFAULT_USER, "password": DEFAULT_PASSWORD},
        viewport={"width": 1400, "height": 1000},
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"the page's script failed: {errors}"


def api(cluster: Cluster, method: str, path: str, **params: str) -> dict[str, Any]:
    """The manager's admin API, from a thread of its own: Playwright's event loop runs in
    this one, and the admin client runs one of its own."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(cluster.manager.api, method, path, **params).result()


def row(page: Page, node: str) -> Any:
    return page.locator(f'[data-testid=node-row][data-node="{node}"]')


def confirm(page: Page, button: str) -> None:
    """Answer the console's confirmation with its action button."""
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    dialog.get_by_role("button", name=button).click()
    expect(dialog).to_be_hidden(timeout=WAIT_MS)


def watch_rebalance(page: Page) -> list[int]:
    """The vbuckets-moved counts the page showed, until it shows the rebalance over."""
    progress = page.get_by_test_id("rebalance-progress")
    state = page.get_by_test_id("rebalance-state")
    seen: list[int] = []
    deadline = time.monotonic() + REBALANCE_S
    while state.text_content() == "running" or not seen:
        assert time.monotonic() < deadline, f"the rebalance did not end; seen {seen}"
        text = progress.text_content(timeout=WAIT_MS) or ""
        moved = int(text.split(" of ")[0])
        if not seen or seen[-1] != moved:
            seen.append(moved)
        page.wait_for_timeout(100)  # (a poll of the page, not a measure of anything)
    return seen


# A rebalance of 1,024 vbuckets on a busy 2-core machine may take minutes: past the suite's
# default deadline for one test (a guard against hangs), not a measure.
@pytest.mark.timeout(900)
def test_the_console_shows_a_cluster_its_rebalance_and_a_failover(
    cluster: Cluster,
    server_factory: type[ServerProcess],
    tmp_path: Path,
    browser: Any,
    page: Page,
    shots: Shots,
) -> None:
    url = f"{cluster.manager.url}/ui/"
    names = [cluster.name(n) for n in cluster.nodes]

    # no login, no console: the browser is asked for one (and, having none, gives up)
    anonymous = browser.new_context()
    with pytest.raises(PlaywrightError, match="ERR_INVALID_AUTH_CREDENTIALS"):
        anonymous.new_page().goto(url)
    anonymous.close()

    page.goto(url)
    expect(page.get_by_test_id("node-row")).to_have_count(3, timeout=WAIT_MS)
    for name in names:
        expect(row(page, name)).to_contain_text("healthy", timeout=WAIT_MS)
    expect(page.get_by_test_id("card-nodes")).to_contain_text("3 active")
    # every node streams its actives to the others' replicas
    for name in names:
        dcp = page.locator(f'[data-testid=dcp] details[data-node="{name}"]')
        expect(dcp).to_contain_text("replication", timeout=WAIT_MS)
    with Writes(cluster.nodes[0]) as writes:
        heading = page.get_by_test_id("charts-default").locator("h3")
        writing = re.compile(r"default: [1-9][\d,]* mutations/s")
        expect(heading).to_have_text(writing, timeout=WAIT_MS)
        shots(page, "1-three-nodes")

        # a fourth node, then a rebalance from the console
        fourth = server_factory(tmp_path / "n3", tmp_path / "n3.log", "--managed", "--vbuckets",
                                str(VBUCKETS))  # fmt: skip
        fourth.start()
        fourth_name = f"127.0.0.1:{fourth.port}"
        api(cluster, "POST", "/controller/addNode", hostname=fourth_name)
        expect(row(page, fourth_name)).to_be_visible(timeout=WAIT_MS)
        page.get_by_role("button", name="Rebalance", exact=True).click()
        confirm(page, "Rebalance")
        expect(page.get_by_test_id("rebalance-state")).to_have_text("running", timeout=WAIT_MS)
        eta = page.get_by_test_id("rebalance-eta")
        expect(eta).to_have_text(re.compile(r"\d"), timeout=WAIT_MS)  # an estimate, once known
        shots(page, "2-rebalancing")
        seen = watch_rebalance(page)
    assert not writes.errors, writes.errors
    intermediate = [moved for moved in seen if 0 < moved < seen[-1]]
    assert len(intermediate) >= 2, f"the progress was not seen moving: {seen}"
    assert seen == sorted(seen), seen
    expect(page.get_by_test_id("rebalance-state")).to_have_text("idle")
    expect(row(page, fourth_name).locator("td").nth(4)).not_to_have_text("0", timeout=WAIT_MS)
    shots(page, "3-rebalanced")

    # a failover from the console
    victim = names[1]
    row(page, victim).get_by_role("button", name="Fail over").click()
    confirm(page, f"Fail over {victim}")
    failed = page.locator(f'[data-testid=failed-over] li[data-node="{victim}"]')
    expect(failed).to_be_visible(timeout=WAIT_MS)
    expect(row(page, victim)).to_contain_text("failedOver")
    expect(page.get_by_test_id("card-nodes")).to_contain_text("3 active, 1 failed over")
    shots(page, "4-failed-over")

    # its recovery from the console starts a rebalance, which the console stops
    failed.get_by_role("button", name="Recover (delta)").click()
    confirm(page, f"Recover {victim} (delta)")
    expect(row(page, victim).locator("td").nth(1)).to_have_text("active", timeout=WAIT_MS)
    page.get_by_role("button", name="Stop rebalance").click(timeout=WAIT_MS)
    confirm(page, "Stop the rebalance")
    expect(page.get_by_test_id("rebalance-state")).to_have_text("stopped", timeout=WAIT_MS)
    shots(page, "5-recovery-stopped")


def test_an_automatic_failover_shows_in_the_events(
    small_cluster: Cluster, page: Page, shots: Shots
) -> None:
    cluster = small_cluster
    names = [cluster.name(n) for n in cluster.nodes]
    page.goto(f"{cluster.manager.url}/ui/")
    for name in names:
        expect(row(page, name)).to_contain_text("healthy", timeout=WAIT_MS)
    expect(page.get_by_test_id("failover")).to_contain_text("Automatic failover: off")
    api(cluster, "POST", "/settings/autoFailover", enabled="true", timeout="2")
    expect(page.get_by_test_id("failover")).to_contain_text("on, after 2 s", timeout=WAIT_MS)
    cluster.nodes[2].kill9()
    events = page.get_by_test_id("failover-events")
    expect(events).to_contain_text(names[2], timeout=WAIT_MS)
    expect(events).to_contain_text("unresponsive")
    expect(row(page, names[2])).to_contain_text("failedOver")
    expect(page.get_by_test_id("failed-over")).to_contain_text(names[2])
    shots(page, "auto-failover")
