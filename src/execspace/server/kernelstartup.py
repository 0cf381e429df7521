"""What a code interpreter's Python kernel runs as it starts, so that its results are E2B's.

E2B's template gives its IPython kernel display formatters and a PIL hook at start-up; the SDK's ``Result`` reads
what they add. :data:`E2B_DISPLAY` does the same here, in the kernel, before its first cell:

* ``e2b/chart``: a matplotlib figure that is displayed (``plt.show()``, or the inline backend at the cell's end)
  also goes through ``e2b_charts.chart_figure_to_dict``, E2B's own extractor (the ``e2b-charts`` package of the
  ``code-interpreter`` environment): the SDK's ``result.chart``. Without the package, or for a figure it cannot
  read, there is no chart, as on E2B.
* ``e2b/data``: a displayed pandas DataFrame as ``{column: [values…]}`` (timestamps in ISO form): ``result.data``.
* ``application/json``: a displayed list or dict as JSON (numpy values as numbers and lists): ``result.json``.
* an image PIL saves to a path (``Image.save``, which ``plt.savefig`` to a PNG or JPEG path also calls) is
  displayed too: the file is written and the image is a result of the cell.

Each formatter looks at ``sys.modules`` before anything else, so a cell that never imported pandas or matplotlib
pays no import for them. The text runs with its own globals: the cells' namespace gets none of its names.
"""

from __future__ import annotations

__all__ = ["E2B_DISPLAY", "E2B_KERNEL_ARGS"]

#: IPython settings of E2B's kernel: tracebacks without colour codes, long sequences printed whole.
E2B_KERNEL_ARGS = ("--InteractiveShell.colors=NoColor", "--PlainTextFormatter.max_seq_length=0")

E2B_DISPLAY = r"""
import importlib.util, os, sys
from IPython import get_ipython
from IPython.core.formatters import BaseFormatter
from traitlets import ObjectName, Unicode


def _frame_data(frame):
    # the SDK's result.data: column name -> its values, as the JSON the message carries
    pandas = sys.modules["pandas"]
    columns = frame.to_dict(orient="list")
    return {
        str(name): [v.isoformat() if isinstance(v, pandas.Timestamp) else v for v in values]
        for name, values in columns.items()
    }


class DataFormatter(BaseFormatter):
    format_type = Unicode("e2b/data")
    print_method = ObjectName("_repr_e2b_data_")
    _return_type = (dict, str)

    def __call__(self, obj):
        pandas = sys.modules.get("pandas")
        if pandas is not None and isinstance(obj, pandas.DataFrame):
            return _frame_data(obj)
        return super().__call__(obj)


class ChartFormatter(BaseFormatter):
    format_type = Unicode("e2b/chart")
    print_method = ObjectName("_repr_e2b_chart_")
    _return_type = (dict, str)

    def __call__(self, obj):
        figure = getattr(sys.modules.get("matplotlib.figure"), "Figure", None)
        if figure is None or not isinstance(obj, figure):
            return super().__call__(obj)
        try:
            from e2b_charts import chart_figure_to_dict

            return chart_figure_to_dict(obj) or None
        except Exception:  # no extractor here, or a figure it cannot read: the figure stays an image
            return None


def _plain(value):
    # numpy values become what JSON has; anything else makes the object no JSON result
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(value, numpy.ndarray):
            return value.tolist()
        if isinstance(value, numpy.generic):
            return value.item()
    raise TypeError(type(value).__name__)


def _json_formatter(base):
    import json

    class JSONFormatter(type(base)):
        def __call__(self, obj):
            if isinstance(obj, (list, dict)):
                try:
                    return json.loads(json.dumps(obj, default=_plain)), {"expanded": True}
                except (TypeError, ValueError):
                    pass
            return super().__call__(obj)

    return JSONFormatter(parent=base.parent)


def _display_saved_images(module):
    # an image saved to a path is also a result of the cell (plt.savefig to a PNG or JPEG path saves through PIL)
    from IPython.display import display

    save = module.Image.save

    def save_and_display(image, fp, format=None, **params):
        save(image, fp, format, **params)
        if isinstance(fp, (str, os.PathLike)):
            display(image)

    module.Image.save = save_and_display


class _AfterImport:
    # runs then(module) once name is imported: a cell that never imports it pays nothing for it

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # the other finders' spec, found without this one
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
                self.then(module)

        spec.loader.exec_module = exec_module
        return spec


ip = get_ipython()
formatters = ip.display_formatter.formatters
formatters["e2b/data"] = DataFormatter(parent=ip.display_formatter)
formatters["e2b/chart"] = ChartFormatter(parent=ip.display_formatter)
formatters["application/json"] = _json_formatter(formatters["application/json"])
sys.meta_path.insert(0, _AfterImport("PIL.Image", _display_saved_images))
"""
