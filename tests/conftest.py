"""Shared fixtures: the real engine in this process, and the app in a subprocess.

The in-process engine runs the embedded SmolLM2 model on vLLM's CPU build; it is started in pytest's
session event loop (all async tests share it, as Gradio's handlers share the server's loop). The apps
run exactly as `python app.py` does, on a free local port: `real_app` (and the apps of the tests of
engines, workers and logins) on the real engine, `app_server` (shared by the tests whose subject is
the page, the protocol or hostile input) on the stand-in engine of tests/stand_in.py, whose replies
are scripted and quick to write.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import random
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import psutil
import pytest

from chat.lifeline import ends_with_parent
from tests.pages import wait_drawn

if TYPE_CHECKING:
    from gradio_client import Client
    from playwright.sync_api import Browser, BrowserContext, Page

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "tests" / "output"
pytest_plugins = ["tests.costs"]  # each tier's wall and CPU time, printed after the run


TIERS = ("unit", "engine", "app", "browser")
EXIT_STATUS = pytest.StashKey[int]()  # the session's, for the exit without clean-up (pytest_unconfigure)
# A test's tier, when its module does not say: the heaviest of what its fixtures start; else `engine`
# where its module imports vLLM's library (`USES_VLLM = True`: 7-10 s of CPU, torch with it, that
# `scripts/test --fast` never pays), else `unit`.
TIER_FIXTURES = {"browser": {"browser", "cached_context"}, "app": {"app_server", "real_app", "client", "workers_app", "front_door_app"},
                 "engine": {"engine", "registry", "stand_in_registry"}}
# The fixtures that start the real engine (the embedded model on vLLM's CPU build), by the module that
# defines them (test modules whose tests run on the stand-in engine name theirs `registry` and `engine`
# too). A test that uses one is marked `real_engine`; `scripts/test --dev` runs every other test.
REAL_ENGINE_FIXTURES = {
    "real_app": "tests.conftest", "real_page": "tests.conftest",
    "registry": "tests.conftest", "engine": "tests.conftest", "workers_app": "tests.test_workers",
}
# Apps on the stand-in engine other than the browsers' shared one: those app-tier tests start too (the
# app behind a login, the two workers behind Caddy) and one a browser test starts for itself (two
# engines for a preset switch). Their tests in other tiers (a browser's) are marked `beside_app_tests`,
# and scripts/test --dev runs them in the app tests' process, which starts a shared app once, not twice,
# and would otherwise end well before the browsers' (docs/testing.md).
BESIDE_APP_TESTS = {"protected_app", "front_door_app", "two_engine_app"}
STOPS_FRONT_DOOR = "stops_front_door"  # the marker of the test that ends front_door_app: it runs after every other


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test exactly one tier marker, so `-m unit` (scripts/test --fast) runs the quick ones;
    run the unit tier first (the quickest failures first); run the tests of the
    app behind a login (`protected_app`, from three modules) last and together, so that one start of
    that app serves them all and it never idles beside other tests; and the test that stops the two
    workers behind Caddy (`front_door_app`) after every other."""
    for item in items:
        if uses_real_engine(item):
            item.add_marker("real_engine")
        elif BESIDE_APP_TESTS & set(getattr(item, "fixturenames", ())):
            item.add_marker("beside_app_tests")
        if len(marked := {m.name for m in item.iter_markers() if m.name in TIERS}) > 1:  # a module's and its own
            raise pytest.UsageError(f"{item.nodeid} is marked {' and '.join(sorted(marked))}; a test has one tier")
        if marked:
            continue
        used = set(getattr(item, "fixturenames", ()))
        by_module = "engine" if getattr(getattr(item, "module", None), "USES_VLLM", False) else "unit"
        tier = next((tier for tier in ("browser", "app", "engine") if used & TIER_FIXTURES[tier]), by_module)
        item.add_marker(tier)
    items.sort(key=lambda item: (item.get_closest_marker(STOPS_FRONT_DOOR) is not None,  # stable
                                 "protected_app" in getattr(item, "fixturenames", ()), tier_of(item) != "unit"))


def uses_real_engine(item: pytest.Item) -> bool:
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(definitions[name][-1].func.__module__ == module
               for name, module in REAL_ENGINE_FIXTURES.items() if name in definitions)


def tier_of(item: pytest.Item) -> str:
    return next(marker.name for marker in item.iter_markers() if marker.name in TIERS)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The session has ended and said so: leave at once. What it imported (vLLM, torch, Gradio) is
    millions of objects, which the interpreter's exit would walk in several garbage collections,
    4-12 s of every run by the machine's speed (docs/testing.md), and which nobody needs freed:
    the fixtures have stopped every engine, server and browser the tests started."""
    status = config.stash.get(EXIT_STATUS, None)
    # Not after a usage or internal error: pytest prints what it was only after this hook.
    if status is not None and status not in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERNAL_ERROR):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


@pytest.fixture(scope="session")
def default_preset():
    from chat.presets import load_presets
    from chat.settings import DEFAULT_PRESET

    return load_presets(check_engine=False).get(DEFAULT_PRESET)  # vLLM checks its engine settings at its start


@pytest.fixture(scope="session")
async def registry():
    from chat.registry import EngineRegistry

    registry = EngineRegistry()
    yield registry
    await registry.close_all()


@pytest.fixture(scope="session")
async def engine(registry, default_preset):
    return await registry.get(default_preset)


@pytest.fixture(scope="session")
async def stand_in_registry(default_preset):
    """Engines in the test process: vLLM's own front end (`AsyncLLM`) with the stand-in's schedule in
    place of its engine core (bench/token_source.py), for the tests of the reply pipeline and the
    capacity test, so that the engine layer's translation of vLLM is tested too; test modules that
    use it name it `registry`. The apps of tests/stand_in.py use `StandInEngine`, without vLLM."""
    from chat.registry import EngineRegistry

    registry = EngineRegistry()
    await stand_in_ready(registry, default_preset)
    yield registry
    await registry.close_all()


async def stand_in_ready(registry, preset):
    """The engine of `preset` in `registry`, started on the stand-in engine (vLLM's engine core
    replaced while it starts, and only then)."""
    from bench.token_source import install, uninstall
    from tests.stand_in import STEP_MS, replies

    install(step_s=STEP_MS / 1000, replies=replies())
    try:
        return await registry.get(preset)
    finally:
        uninstall()


@pytest.fixture(scope="session")
def service(registry, default_preset):
    """The reply pipeline in the test process, on the session's registry (the engine tier's)."""
    from chat.presets import load_presets
    from chat.service import ChatService

    return ChatService(load_presets(), registry, default_preset.name)


async def eventually(condition, within_s: float = 15.0, every_s: float = 0.05) -> bool:
    """Wait until `condition()` is true (polling; no fixed sleeps in tests); whether it came true in time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(every_s)
    return True


def free_port() -> int:
    """A port free to listen on, below the kernel's range for outgoing connections' own ports: one
    from that range, free when picked, was taken by a connection (a flood test opens thousands) before
    the app bound it ("Cannot find empty port")."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(100):
        port = random.randrange(10_000, max(low, 10_001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # that range is full: any free one
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@dataclass
class RunningApp:
    url: str
    process: subprocess.Popen
    log_path: Path
    folder: tempfile.TemporaryDirectory | None = None  # what its recipe wrote for it (presets, votes); gone at its stop

    def health(self) -> tuple[int, dict]:
        return get_json(self.url + "healthz")

    def wait_idle(self, timeout: float = 10) -> dict:
        """Wait until no request is running or tracked in any engine; return the last health."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                _, body = self.health()
            except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
                body = None  # a busy machine answered late: ask again
            busy = body is None or [e for e in body.get("engines", [])
                                    if e["running"] or e["waiting"] or e["unfinished"] or e["streams"]]
            if not busy or time.monotonic() > deadline:
                return body or {}
            time.sleep(0.2)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def public_address() -> str:
    """This machine's address on its outgoing interface (not loopback), as another machine reaches it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        return s.getsockname()[0]


def stranger_url(app: RunningApp) -> str:
    """The app (listening on every interface) as a visitor from another machine reaches it: this
    machine's non-loopback address, which its requests also come from."""
    return f"http://{public_address()}:{app.url.rstrip('/').rsplit(':', 1)[1]}/"


def launch_app(name: str, *args: str, env: dict[str, str] | None = None, stand_in: bool = False,
               new_session: bool = False) -> RunningApp:
    """app.py on a free port (on the stand-in engine, tests/stand_in.py, with `stand_in`; in a session
    of its own, as in a terminal, with `new_session`), started: it serves nothing yet (`wait_ready`)."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = OUTPUT / f"{name}-{port}.log"  # concurrent test runs must not share a log
    log = open(log_path, "w")  # noqa: SIM115 - kept open for the subprocess's lifetime
    process = subprocess.Popen(
        [sys.executable, str(ROOT / ("tests/stand_in.py" if stand_in else "app.py")), "--port", str(port), *args],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})},
        start_new_session=new_session,
        # Out of the tests' group, a signal to it (a killed test run) no longer reaches the app: it ends
        # with the test process instead.
        preexec_fn=ends_with_parent() if new_session else None,
    )
    return RunningApp(url=f"http://127.0.0.1:{port}/", process=process, log_path=log_path)


def wait_ready(app: RunningApp, ready_timeout: float = 420, engine_ready: bool = True) -> RunningApp:
    """`app` once healthy (or, with engine_ready=False, once it serves pages while its engine may
    still be starting). The bound only ends a failing run: two UI workers' start took ~56 s of CPU in
    their processes alone on the stand-in engine (2-core EPYC), more on the real one, and a loaded
    machine shares its two cores with the other half of the suite."""
    deadline = time.monotonic() + ready_timeout
    while True:
        if app.process.poll() is not None:
            raise RuntimeError(f"app.py exited with {app.process.returncode}:\n{app.log_tail()}")
        try:
            status, _ = app.health()
            if status == 200 or (status == 503 and not engine_ready):
                return app
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass
        if time.monotonic() > deadline:
            app.process.kill()
            raise RuntimeError(f"app.py was not healthy within {ready_timeout} s:\n{app.log_tail()}")
        time.sleep(0.5)


def start_app(name: str, *args: str, env: dict[str, str] | None = None, ready_timeout: float = 420,
              engine_ready: bool = True, stand_in: bool = False) -> RunningApp:
    """app.py on a free port, returned once ready (`wait_ready`)."""
    return wait_ready(launch_app(name, *args, env=env, stand_in=stand_in), ready_timeout, engine_ready)


def app_command(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python app.py ARGS` for a command that prints and exits (--check-presets, --list-presets)."""
    return subprocess.Popen([sys.executable, "app.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finished(process: subprocess.Popen) -> subprocess.CompletedProcess:
    """What an `app_command` printed and returned, once it has ended."""
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def without_vllm(folder: Path) -> dict[str, str]:
    """An environment for a process in which `import vllm` fails (a package of that name under
    `folder`, first on the path, that refuses): what must not need vLLM shows it does not."""
    (package := folder / "no-vllm" / "vllm").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('this command must not import vLLM')\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")]))}


@functools.cache
def ran_app(*args: str) -> subprocess.CompletedProcess:
    """What `python app.py ARGS` printed and returned; each distinct command runs once a session (it
    imports vLLM, ~6 s): the same arguments give the same answer."""
    return finished(app_command(*args))


def replies_started(app: RunningApp, by: str) -> float:
    """How many replies `by` ("page": a page's socket, "turn": a Chat-tab turn, "api") started (chat/live.py)."""
    with urllib.request.urlopen(app.url + "metrics", timeout=10) as response:
        found = re.search(rf'^chat_replies_started_total{{started_by="{by}"}} (\S+)$', response.read().decode(), re.M)
    return float(found.group(1)) if found else 0.0


def running(process) -> bool:
    """A psutil.Process alive, not a zombie: one that has ended but is not reaped yet holds nothing
    (and this sandbox's init may be slow to reap a process whose parent was killed)."""
    import psutil

    try:
        return process.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def still_running(processes: list, within_s: float) -> list:
    """Wait up to `within_s` for every psutil.Process in `processes` to end; those still running then."""
    deadline = time.monotonic() + within_s
    while (alive := [p for p in processes if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def stop_app(app: RunningApp) -> None:
    app.process.terminate()
    try:
        app.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        app.process.kill()
        app.process.wait()
    if app.folder is not None:
        app.folder.cleanup()


def start_in_folder(fixture: str, launch: Callable[[Path], RunningApp]) -> RunningApp:
    """The app that `launch` writes into a fresh folder (removed by `stop_app`) and launches, once ready."""
    folder = tempfile.TemporaryDirectory(prefix=f"{fixture}-")
    app = launch(Path(folder.name))
    app.folder = folder
    return wait_ready(app)


RESUME_GRACE_S = 5  # the shared apps': shorter than their longest replies (1,000 tokens: 15 s on the stand-in)
LEFT_BEHIND_WITHIN_S = 15.0  # after a test, its engine requests must be gone within this (aborts take a moment)
PROBLEM_LINE = re.compile(r"Traceback \(most recent call last\)|\bERROR\b")


async def _settled(registry, within_s: float) -> list[str]:
    """Wait until no engine of `registry` streams or tracks a request; what is left behind otherwise."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        left = [f"{e.preset.name}: {e.streams} streaming, {e.num_unfinished()} unfinished"
                for e in registry if e.streams or e.num_unfinished()]
        if not left or loop.time() > deadline:
            return left
        await asyncio.sleep(0.05)


@pytest.fixture(autouse=True)
def nothing_left_behind(request):
    """After every test: no engine request it started is left running, in this process or in the
    shared app, and the shared app logged no traceback or ERROR line while it ran (a test that
    causes one on purpose says so with @pytest.mark.logs_errors)."""
    used = set(request.fixturenames)
    registries = [request.getfixturevalue(name) for name in ("registry", "stand_in_registry") if name in used]
    apps = [request.getfixturevalue(name) for name in ("app_server", "real_app") if name in used]
    logs_from = [app.log_path.stat().st_size for app in apps]
    yield
    for registry in registries:
        loop = next((e.task.get_loop() for e in registry if e.task is not None), None)
        left = loop.run_until_complete(_settled(registry, LEFT_BEHIND_WITHIN_S)) if loop else []
        assert not left, f"engine requests left behind: {left}"
    for app, log_from in zip(apps, logs_from, strict=True):
        busy = [e for e in app.wait_idle(LEFT_BEHIND_WITHIN_S).get("engines", [])
                if e["running"] or e["waiting"] or e["unfinished"] or e["streams"]]
        assert not busy, f"the app still has requests in flight: {busy}"
        if not request.node.get_closest_marker("logs_errors"):
            with open(app.log_path, errors="replace") as log:
                log.seek(log_from)
                lines = log.readlines()
            first = next((i for i, line in enumerate(lines) if PROBLEM_LINE.search(line)), None)
            assert first is None, "the app logged a problem during this test:\n" + "".join(lines[first:first + 40])


def launch_shared_app(folder: Path) -> RunningApp:
    return launch_app("app", "--resume-grace-s", str(RESUME_GRACE_S), "--votes-db", str(folder / "votes.sqlite3"),
                      stand_in=True)


@pytest.fixture(scope="session")
def app_server() -> Iterator[RunningApp]:
    """The app on the stand-in engine (tests/stand_in.py), shared by every test whose subject is not
    the engine."""
    app = start_in_folder("app_server", launch_shared_app)
    yield app
    stop_app(app)


def launch_front_door_app(folder: Path) -> RunningApp:
    import resource

    # Started under a soft limit of 1,024 open files (the hard one as it is), as systemd and Docker start
    # a service: the app raises it itself (tests/test_strangers.py's flood). Only the child gets it.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
    try:
        # In a session of its own, as in a terminal: its last test stops it with a signal to its group
        # (tests/test_stop.py, STOPS_FRONT_DOOR).
        return launch_app("front-door", "--ui-workers", "2", "--host", "0.0.0.0", "--admin-local", "--resume-grace-s",
                          str(RESUME_GRACE_S), "--votes-db", str(folder / "votes.sqlite3"), stand_in=True,
                          new_session=True)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="session")
def front_door_app() -> Iterator[RunningApp]:
    """Two UI workers behind Caddy on the stand-in engine, on every interface, as a stranger on another
    machine meets the app (`stranger_url`): for the tests of hostile input, floods and vote stuffing
    through the front door. The real engine's several-worker tests are tests/test_workers.py's."""
    app = start_in_folder("front_door_app", launch_front_door_app)
    yield app  # perhaps stopped by its last test (STOPS_FRONT_DOOR)
    started = psutil.Process(app.process.pid).children(recursive=True) if app.process.poll() is None else []
    stop_app(app)
    assert not (alive := still_running(started, 30)), f"processes outlived the app: {alive}"
    problems = [line for line in app.log_path.read_text(errors="replace").splitlines() if PROBLEM_LINE.search(line)]
    assert not problems, "the app logged a problem:\n" + "\n".join(problems[:20])


def launch_real_app(folder: Path) -> RunningApp:
    return launch_app("real", "--resume-grace-s", str(RESUME_GRACE_S), "--votes-db", str(folder / "votes.sqlite3"),
                      "--admin-local")


@pytest.fixture(scope="session")
def real_app() -> Iterator[RunningApp]:
    """The app on the real engine (the embedded model), for the tests that prove each feature on it
    (docs/testing.md lists them). Its pages on this machine are administrators (`--admin-local`: the
    capacity test); tests/test_robustness.py kills its engine twice (it restarts)."""
    app = start_in_folder("real_app", launch_real_app)
    yield app
    stop_app(app)


# The accounts of `protected_app`: a user, the administrator and a guest.
USER, ADMIN, GUEST = ("demo", "s3cret"), ("admin", "a-secret"), ("guest", "g-secret")


def launch_protected_app(folder: Path) -> RunningApp:
    accounts = ",".join(":".join(account) for account in (USER, ADMIN, GUEST))
    return launch_app("protected", "--auth", accounts, "--admins", ADMIN[0], "--votes-db", str(folder / "votes.sqlite3"),
                      stand_in=True)


@pytest.fixture(scope="session")
def protected_app() -> Iterator[RunningApp]:
    """The app behind a login (`--auth`, three accounts, `admin` the administrator) on the stand-in
    engine, for the tests of logins, administrators and hostile sign-ins. One for the session, whose tests
    run last (`pytest_collection_modifyitems`): when it started with the first of them and idled
    beside every later test, a Compare test after the capacity tests failed in two full runs of two
    (it passes alone); one per module cost two more starts of a minute each. Failed sign-ins lock an
    address out: a test that does that on purpose comes from an address of its own (the loopback
    network is 127.0.0.0/8)."""
    app = start_in_folder("protected_app", launch_protected_app)
    yield app
    stop_app(app)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for gradio_client's calls. httpx makes a new one for each client it makes
    unless given one (~30 ms of CPU on these machines: OpenSSL 3 loading certifi's bundle), and
    gradio_client makes a new httpx client for every call and every stream: tests/test_bad_input.py
    and tests/test_votes_app.py took 36 s of CPU with them, 23 s without. The apps are spoken to
    over plain HTTP anyway."""
    import httpx

    return httpx.create_ssl_context()


def api_client(url: str, *, auth: tuple[str, str] | None = None, cookies: dict[str, str] | None = None) -> Client:
    """gradio_client's `Client` on `url`, quietly, with the shared TLS context."""
    from gradio_client import Client

    # `ssl_verify` is typed as a bool, but gradio_client hands it to every httpx call as `verify`,
    # which takes a context.
    return Client(url, auth=auth, verbose=False, ssl_verify=tls_context(), httpx_kwargs={"cookies": cookies or {}})


@pytest.fixture
def client(app_server):
    """A new client per test: each has its own session, so conversations never leak between tests."""
    return api_client(app_server.url)


CHROMIUM = dict(executable_path="/usr/bin/chromium-headless-shell",  # Playwright's headless build: docs/testing.md
                args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                      "--disable-component-update", "--disable-sync"])
LAPTOP = {"width": 1280, "height": 900}


@pytest.fixture(scope="session")
def browser_profile(tmp_path_factory) -> Path:
    """Chromium's profile folder for the session: its disk cache outlives each module's browser (which
    saves little on its own: the gain is within a browser's run)."""
    return tmp_path_factory.mktemp("chromium")


@pytest.fixture(scope="module")
def cached_context(browser_profile: Path) -> Iterator[BrowserContext]:
    """Debian's Chromium, headless, and its one context (on the session's profile folder): the pages
    of `open_page` share it and its caches, so within a module Gradio's ~80 scripts and stylesheets
    are not fetched and compiled again for every page (a later page costs the machine about half the
    CPU of a first, docs/testing.md). Module-scoped: Playwright's sync API holds an event loop in
    this thread until it stops, which the async tests of later modules need free."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(browser_profile, viewport=LAPTOP, **CHROMIUM)
        yield context
        context.close()


@pytest.fixture(scope="module")
def browser(cached_context: BrowserContext) -> Browser:
    """The browser, for a test that needs a context of its own (`browser.new_context`): a phone's, two
    visitors at once, a time zone; it fetches and compiles the page afresh."""
    assert cached_context.browser is not None
    return cached_context.browser


@pytest.fixture
def open_page(cached_context: BrowserContext) -> Iterator[Callable[..., Page]]:
    """`open_page(url, width=, height=, touch=, mobile=, reduced_motion=, color_scheme=, init_script=)`:
    a page on `url` (`init_script` runs before the page's own scripts), drawn (`wait_drawn`), in the shared context; a touch screen or a phone's mobile viewport
    (context settings) gets a context of its own. When the test ends its pages close and the shared
    context forgets their sites' cookies and storage, as a context of its own would: only the cache
    stays."""
    opened: list[Page] = []
    own: list[BrowserContext] = []

    def open_page(url: str, *, width: int = LAPTOP["width"], height: int = LAPTOP["height"], touch: bool = False,
                  mobile: bool = False, reduced_motion: str | None = None, color_scheme: str | None = None,
                  init_script: str | None = None) -> Page:
        if touch or mobile:
            assert cached_context.browser is not None
            own.append(cached_context.browser.new_context(viewport={"width": width, "height": height},
                                                          has_touch=touch, is_mobile=mobile))
            page = own[-1].new_page()
        else:
            page = cached_context.new_page()
            opened.append(page)
            page.set_viewport_size({"width": width, "height": height})
        if reduced_motion or color_scheme:
            page.emulate_media(reduced_motion=reduced_motion, color_scheme=color_scheme)
        if init_script:
            page.add_init_script(init_script)
        page.set_default_timeout(30_000)
        page.goto(url)
        wait_drawn(page)
        return page

    yield open_page
    forget(cached_context, opened)
    for context in own:
        context.close()


SITE_DATA = "cookies,file_systems,indexeddb,local_storage,websql,service_workers,cache_storage,shared_storage,storage_buckets"


def forget(context: BrowserContext, pages: list[Page]) -> None:
    """Close `pages` and clear what their sites stored in `context` (cookies, local storage, IndexedDB,
    ...), keeping the cache."""
    origins = {f"{url.scheme}://{url.netloc}" for url in (urlsplit(page.url) for page in pages) if url.netloc}
    for page in pages:
        page.close()
    if origins:
        blank = context.new_page()  # any page of the context can clear every site's data
        cdp = context.new_cdp_session(blank)
        for origin in origins:
            cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": SITE_DATA})
        cdp.detach()
        blank.close()
    context.clear_cookies()


@pytest.fixture
def page(open_page, app_server, request):
    """A fresh page on the app, at a laptop's size; its screenshot lands in tests/output/ if the test fails."""
    yield from screenshot_after(open_page(app_server.url), request)


@pytest.fixture
def real_page(open_page, real_app, request):
    """`page`, on the app on the real engine."""
    yield from screenshot_after(open_page(real_app.url), request)


def screenshot_after(page: Page, request) -> Iterator[Page]:
    """The page, and its screenshot in tests/output/ if the test failed (what it showed then)."""
    yield page
    if request.node.stash.get(FAILED, False):
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / f"{request.node.name}.png"), full_page=True)


FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report


def small_preset(folder: Path, name: str, *, context: int = 1024, **fields: object) -> Path:
    """Write a preset of the embedded model with a small KV cache (a separate engine per context
    length); `fields` add or replace top-level keys such as description or system_prompt."""
    import yaml

    spec: dict[str, object] = {
        "name": name,
        "description": f"{name}: a small-cache preset for tests.",
        "model": "embedded",
        "engine": {"dtype": "float32", "max_model_len": context, "kv_cache_memory_bytes": 268435456,
                   "enforce_eager": True, "max_num_seqs": 8},
        "sampling": {"max_tokens": {"default": 32, "max": 512}},
        **fields,
    }
    path = folder / (name.lower().replace(" ", "-") + ".yaml")
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
