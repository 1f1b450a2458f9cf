"""carryover-hf: Carryover drafting for Hugging Face Transformers.

Importing the package registers the drafter with `AutoConfig` / `AutoModel` and routes
`target.generate(..., assistant_model=drafter)` to the Carryover candidate generator.
"""

from .compatibility import check_transformers_version


check_transformers_version()  # before anything touches Transformers' internals: a clear message, not an AttributeError

from transformers import AutoConfig, AutoModel  # noqa: E402

from .compatibility import DrafterTargetMismatchError, check_compatibility  # noqa: E402
from .configuration_carryover import CarryoverDrafterConfig  # noqa: E402
from .generation import CarryoverCandidateGenerator, GenerationStats, install_generation_hook  # noqa: E402
from .modeling_carryover import CarryoverDrafterModel  # noqa: E402


__version__ = "0.3.0"

AutoConfig.register(CarryoverDrafterConfig.model_type, CarryoverDrafterConfig, exist_ok=True)
AutoModel.register(CarryoverDrafterConfig, CarryoverDrafterModel, exist_ok=True)
install_generation_hook()


def __getattr__(name: str):
    # Training pulls in `Trainer` (and accelerate); load it only when asked for.
    if name in ("CarryoverTrainer", "CarryoverTrainingArguments"):
        from . import training

        return getattr(training, name)
    raise AttributeError(f"module 'carryover_hf' has no attribute {name!r}")


__all__ = [
    "CarryoverCandidateGenerator",
    "CarryoverDrafterConfig",
    "CarryoverDrafterModel",
    "CarryoverTrainer",
    "DrafterTargetMismatchError",
    "GenerationStats",
    "check_compatibility",
    "__version__",
]
