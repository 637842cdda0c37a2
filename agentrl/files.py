"""File helpers shared by the packages that write model directories (the tiny model builder, SFT, the trainer's
weight sync)."""

from __future__ import annotations

from pathlib import Path


def make_readable(model_dir: str | Path) -> None:
    """Mode 0644 for the files of a model directory: safetensors writes the weights 0600, which would hide the
    model from the other accounts of a machine (a server or a colleague loading it)."""
    for path in Path(model_dir).iterdir():
        if path.is_file():
            path.chmod(0o644)
