"""What every figure of the benches needs: matplotlib (the ``[bench]`` extra) and an empty figure
on its own Agg canvas (no pyplot state). Below both the plots of reports and the roofline."""
from __future__ import annotations

import importlib


def require_matplotlib() -> None:
    """Raise a clear error when no plot can be drawn."""
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise RuntimeError("the plots need matplotlib: pip install 'chorus-tts[bench]'") from None


def new_figure(width: float, height: float):
    """An empty figure on an Agg canvas, for :meth:`Figure.savefig`."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure
