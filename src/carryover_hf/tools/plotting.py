"""Figures of the tools' results (bench reports, the campaign's curve, vLLM's concurrency): one place for the Agg
backend, a figure's life and how it is saved."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


@contextmanager
def saved_figure(path: str | Path, figsize: tuple[float, float] = (7, 4), ncols: int = 1) -> Iterator[tuple[Any, list]]:
    """Yields `(figure, axes)`, a row of `ncols` axes; on leaving, lays the figure out, saves it to `path` (PNG,
    120 dpi) and closes it (closed also when drawing fails). matplotlib draws without a display (Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=figsize, squeeze=False)
    try:
        yield fig, list(axes[0])
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


__all__ = ["saved_figure"]
