"""Hub artifacts: ready configs for real targets, model cards, push/download, and checkpoint import/export."""

from .card import render_model_card
from .checkpoints import CheckpointError
from .configs import available_hub_configs, init_drafter, load_hub_config
from .convert import ConversionReport, export_speculators, import_checkpoint
from .formats import detect_format
from .loading import load_drafter
from .push import build_upload_folder, push_to_hub


__all__ = [
    "CheckpointError",
    "ConversionReport",
    "available_hub_configs",
    "build_upload_folder",
    "detect_format",
    "export_speculators",
    "import_checkpoint",
    "init_drafter",
    "load_drafter",
    "load_hub_config",
    "push_to_hub",
    "render_model_card",
]
