"""Find a preset's model on disk: the embedded one (converted once), a folder, or a Hugging Face repo.

Hub downloads go through huggingface_hub (HF_TOKEN is honoured by it) and report progress; when
the machine is offline and the repo is not cached, the error names the repo.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from chat import embedded
from chat.errors import ModelUnavailable
from chat.presets import Preset

Report = Callable[[str], None]


def resolve_model(preset: Preset, report: Report) -> Path:
    """The local folder holding the preset's model; may convert or download first (blocking)."""
    if preset.model_kind == "embedded":
        if not embedded.is_converted():
            report("Converting the embedded model (once, about a minute)")
        return embedded.ensure_converted(report=report)
    if preset.model_kind == "folder":
        folder = Path(preset.model)
        if not folder.is_dir():
            raise ModelUnavailable(f"The model folder {folder} does not exist; check the preset's 'model'.")
        return folder
    return download(preset.model, report)


def download(repo_id: str, report: Report) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        pass  # not cached yet: download it
    report(f"Downloading {repo_id} from Hugging Face")
    try:
        return Path(
            snapshot_download(
                repo_id,
                allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"],
                tqdm_class=_progress_class(repo_id, report),
            )
        )
    except GatedRepoError as exc:
        raise ModelUnavailable(
            f"{repo_id} needs permission on Hugging Face: accept its licence there and set HF_TOKEN."
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ModelUnavailable(f"There is no Hugging Face repo {repo_id} (or it is private: set HF_TOKEN).") from exc
    except Exception as exc:  # offline, DNS, proxy: huggingface_hub raises several kinds
        raise ModelUnavailable(
            f"Could not download {repo_id}: this machine cannot reach Hugging Face and the model is not "
            "in the local cache. Connect it to the internet once, or point the preset at a local folder."
        ) from exc


def _progress_class(repo_id: str, report: Report) -> type:
    from tqdm.auto import tqdm

    reported: set[str] = set()

    class DownloadProgress(tqdm):
        """tqdm that also reports to the UI, at most once per percent (huggingface_hub draws several
        bars for one download, interleaved: each line is reported once)."""

        def update(self, n: float | None = 1) -> bool | None:
            shown: bool | None = super().update(n)
            if self.total and self.unit == "B":
                line = f"Downloading {repo_id}: {int(100 * self.n / self.total)}% of {self.total / 1e9:.1f} GB"
                if line not in reported:
                    reported.add(line)
                    report(line)
            return shown

    return DownloadProgress


def weights_bytes(folder: Path, dtype: str | None) -> int:
    """Memory the weights take once loaded, estimated from the checkpoint files and dtype."""
    stored = sum(f.stat().st_size for f in folder.glob("*.safetensors")) or sum(
        f.stat().st_size for f in folder.glob("*.bin")
    )
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    stored_dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    stored_width = 4 if "32" in stored_dtype else 2
    loaded_width = {"float32": 4, "float": 4}.get(dtype or "auto", stored_width)
    return stored * loaded_width // stored_width
