"""nbconvert's postprocessor: a notebook that nbconvert saves (``--execute --inplace``) stays
unchanged for git, as after a JupyterLab save (``tenantlab.gitsave``). ``make`` configures it in
the environment's nbconvert configuration (``python -m tenantlab.gitsave``)."""

from __future__ import annotations

from pathlib import Path

from nbconvert.postprocessors import PostProcessorBase

from .gitsave import refresh


class PostSave(PostProcessorBase):
    """After nbconvert writes a notebook: refresh it for git when the filter sees no change."""

    def postprocess(self, input_: str) -> None:
        refresh(Path(input_))
