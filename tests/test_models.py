"""Finding a preset's model: Hugging Face repo ids through huggingface_hub's real cache code."""

from __future__ import annotations

import hashlib
import io
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
    return load_preset(path)


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
