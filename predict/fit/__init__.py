"""The template fitter (docs/template-model.md): `fit_model(traces, progress=None, params=None)`.

Modules, lowest first: `params` (every threshold, `FitParams`), `data` (a kernel's launches,
`KernelData`: the data every step shares), `solve` and `likelihood` (formulas from bounds, and
the likeliest of those that hold), `shapes`, `strided`, `index_counts` and `index_values` (one
template class each, or a second look; `index_counts` the indexed class's counts), `region` (one base word: the ordered cascade of classes), `model` (kernels and
the model).
"""

from .data import KernelData
from .model import fit_kernel, fit_model
from .params import FitParams, RecordLoss, record_loss, trace_loss

__all__ = ["FitParams", "KernelData", "RecordLoss", "fit_kernel", "fit_model", "record_loss", "trace_loss"]
