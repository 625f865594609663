"""What-if from a measured run (issue 22): a step model fitted to the run's own numbers
(`model.fit`), link models fitted to its collectives (`linkfit`), and the answer for a
changed configuration (`model.answer`). docs/whatif.md says what the model includes."""

from .linkfit import LinkFit, fit_links
from .stepmodel import Changes, StepModel, answer, fit, summary

__all__ = ["Changes", "LinkFit", "StepModel", "answer", "fit", "fit_links", "summary"]
