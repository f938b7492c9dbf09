"""Finding a preset's model: Hugging Face repo ids through huggingface_hub's real cache and download code
(a hub on loopback serves the embedded model)."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from chat import embedded
from chat.errors import ModelUnavailable
from chat.models import _progress_class, resolve_model
from chat.presets import load_preset
from tests.test_stream import reply_to

REPO = "local-test/smollm2-copy"


def lay_out_hub_cache(cache: Path, repo_id: str, source: Path) -> Path:
    """Put `source`'s files in a Hugging Face cache exactly as huggingface_hub lays out a download:
    content-addressed blobs, a snapshot of symlinks, and refs/main naming the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        if not file.is_file() or file.name.startswith("conversion-"):
            continue
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, repo / "blobs" / digest)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / digest)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)  # as in the tests' environment: no network at all
    return tmp_path / "hub"


def hub_preset(folder: Path, repo_id: str):
    path = folder / "hub.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: From the hub
        description: The embedded model, found through the Hugging Face cache.
        model: {repo_id}
        engine:
          dtype: float32
          max_model_len: 1024
          kv_cache_memory_bytes: 268435456
          enforce_eager: true
          max_num_seqs: 4
        """))
    return load_preset(path, check_engine=False)  # vLLM checks them at its start


def test_offline_and_not_cached_names_the_repo(hub_cache, tmp_path):
    preset = hub_preset(tmp_path, "nobody/not-here")
    assert preset.model_kind == "hub"
    with pytest.raises(ModelUnavailable) as caught:
        resolve_model(preset, report=lambda line: None)
    assert caught.value.message == (
        "Could not download nobody/not-here: this machine cannot reach Hugging Face and the model is not in the "
        "local cache. Connect it to the internet once, or point the preset at a local folder."
    )


async def test_a_cached_hub_model_loads_and_answers(hub_cache, tmp_path, registry):
    snapshot = lay_out_hub_cache(hub_cache, REPO, embedded.ensure_converted(report=lambda line: None))
    preset = hub_preset(tmp_path, REPO)
    found = resolve_model(preset, report=lambda line: None)
    assert found == snapshot and (found / "config.json").is_file()
    engine = await registry.get(preset)
    assert engine.model_dir == snapshot
    reply = reply_to(engine, preset, "Say hello.", max_tokens=6)
    async for _ in reply.stream():
        pass
    assert reply.stats.generated_tokens == 6
    await registry.unload(engine)


def test_download_progress_is_reported_once_per_percent():
    lines: list[str] = []
    progress = _progress_class("org/model", lines.append)(total=2_000_000_000, unit="B", file=io.StringIO())
    for _ in range(4):
        progress.update(5_000_000)  # 0.25% each
    progress.update(20_000_000)
    assert lines == ["Downloading org/model: 0% of 2.0 GB", "Downloading org/model: 1% of 2.0 GB", "Downloading org/model: 2% of 2.0 GB"]


class FakeHub:
    """A Hugging Face hub on loopback serving one repo, with the endpoints huggingface_hub's
    snapshot_download uses (file list, then HEAD and GET of each file), and a log of requests."""

    def __init__(self, repo_id: str, source: Path) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        files = {f.name: f.read_bytes() for f in source.iterdir() if f.is_file() and not f.name.startswith("conversion-")}
        commit = hashlib.sha1(repo_id.encode()).hexdigest()
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                hub.requests.append(f"{self.command} {self.path}")

            def reply(self, code: int, body: bytes = b"", **headers: str) -> None:
                self.send_response(code)
                for key, value in headers.items():
                    self.send_header(key.replace("_", "-"), value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path.startswith(f"/api/models/{repo_id}/tree/"):
                    tree = [{"type": "file", "path": name, "size": len(body), "oid": hashlib.sha1(body).hexdigest()}
                            for name, body in files.items()]
                    return self.reply(200, json.dumps(tree).encode(), Content_Type="application/json")
                if path.startswith(f"/{repo_id}/resolve/{commit}/") and (name := path.rsplit("/", 1)[1]) in files:
                    body = files[name]
                    return self.reply(200, body, X_Repo_Commit=commit, ETag=f'"{hashlib.sha256(body).hexdigest()}"')
                if path.startswith(f"/api/models/{repo_id}"):
                    return self.reply(200, json.dumps({"id": repo_id, "sha": commit}).encode(),
                                      Content_Type="application/json")
                self.reply(404, X_Error_Code="RepoNotFound", X_Error_Message="Repository not found")

            do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub_source(tmp_path) -> Path:
    """The repo the fake hub serves: the embedded model's files with 60 MB of stand-in weights (its
    270 MB took 3 s to serve and check; the download's progress is what the test reads). Over 50 MB,
    the weights' lines ("... of 0.1 GB") differ from the small files' ("... of 0.0 GB")."""
    source = embedded.ensure_converted(report=print)
    repo = tmp_path / "repo"
    repo.mkdir()
    for file in source.iterdir():
        if file.is_file() and file.name != "model.safetensors":
            shutil.copy(file, repo / file.name)
    (repo / "model.safetensors").write_bytes(os.urandom(1 << 20) * 60)
    return repo


@pytest.fixture
def fake_hub(hub_cache, hub_source, monkeypatch):
    import huggingface_hub.constants as hub

    server = FakeHub(REPO, hub_source)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    # 1 MB a read (10 MB as shipped): the small weights still come in enough steps to report percents.
    monkeypatch.setattr(hub, "DOWNLOAD_CHUNK_SIZE", 1 << 20)
    monkeypatch.setattr(hub, "ENDPOINT", server.url)
    monkeypatch.setattr(hub, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}")
    yield server
    server.close()


def test_a_hub_model_is_downloaded_once_with_progress(fake_hub, hub_source, tmp_path):
    source = hub_source
    lines: list[str] = []
    folder = resolve_model(hub_preset(tmp_path, REPO), report=lines.append)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (folder / name).read_bytes() == (source / name).read_bytes()
    assert lines[0] == f"Downloading {REPO} from Hugging Face"
    percents = [line for line in lines if line.startswith(f"Downloading {REPO}: ") and line.endswith(" GB")]
    assert len(percents) > 10 and percents[-1].startswith(f"Downloading {REPO}: 100% of 0.")
    assert len(set(lines)) == len(lines), "each progress line is reported once"
    weights = [r for r in fake_hub.requests if r.startswith("GET ") and r.endswith("/model.safetensors")]
    assert len(weights) == 1

    fake_hub.close()  # now the hub is gone: the cached copy is used without asking it
    again: list[str] = []
    assert resolve_model(hub_preset(tmp_path, REPO), report=again.append) == folder
    assert again == []


def test_an_unknown_repo_on_the_hub_is_named(fake_hub, tmp_path):
    with pytest.raises(ModelUnavailable) as error:
        resolve_model(hub_preset(tmp_path, "local-test/no-such-model"), report=print)
    assert error.value.message == "There is no Hugging Face repo local-test/no-such-model (or it is private: set HF_TOKEN)."
