"""The code interpreter's results as E2B's SDK reads them: charts (E2B's own extractor, ``e2b-charts``), DataFrame
``data``, JSON, images saved through PIL and ``plt.savefig``, uncoloured tracebacks, ESM imports in JavaScript."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Server

ci = pytest.importorskip("e2b_code_interpreter", reason="pip install 'execspace[dev]' (e2b-code-interpreter)")
pytest.importorskip(
    "ipykernel", reason="the code interpreter's kernels are ipykernel: pip install 'execspace[jupyter]'"
)
charts_sdk = pytest.importorskip("e2b_code_interpreter.charts")
BarChart, BoxAndWhiskerChart, ChartType = charts_sdk.BarChart, charts_sdk.BoxAndWhiskerChart, charts_sdk.ChartType
LineChart, PieChart, ScaleType = charts_sdk.LineChart, charts_sdk.PieChart, charts_sdk.ScaleType
ScatterChart, SuperChart = charts_sdk.ScatterChart, charts_sdk.SuperChart

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
JS_SDK = os.environ.get("EXECSPACE_E2B_JS")


@pytest.fixture(scope="module")
def charts(e2b_server: Server) -> Iterator[ci.Sandbox]:
    """One sandbox for the chart cases: its kernel imports matplotlib once."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in e2b_server.sdk_env().items():
            patch.setenv(name, value)
        sandbox = ci.Sandbox.create(timeout=300)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def _bar(chart: Any) -> None:
    assert isinstance(chart, BarChart) and chart.type == ChartType.BAR
    assert (chart.title, chart.x_label, chart.y_label, chart.y_unit) == ("Units by region", "Region", "Units (k)", "k")
    assert [(e.label, e.value, e.group) for e in chart.elements] == [
        ("north", 3, "units"),
        ("south", 5, "units"),
        ("east", 7, "units"),
    ]


def _line(chart: Any) -> None:
    assert isinstance(chart, LineChart) and chart.type == ChartType.LINE
    assert (chart.title, chart.x_label, chart.y_label) == ("Powers", "n", "value")
    assert (chart.x_scale, chart.y_scale) == (ScaleType.LINEAR, ScaleType.LINEAR)
    assert [(e.label, e.points) for e in chart.elements] == [
        ("square", [(0, 0), (1, 1), (2, 4), (3, 9)]),
        ("cube", [(0, 0), (1, 1), (2, 8), (3, 27)]),
    ]
    assert all(isinstance(t, float) for t in chart.y_ticks) and len(chart.y_tick_labels) == len(chart.y_ticks)


def _scatter(chart: Any) -> None:
    assert isinstance(chart, ScatterChart) and chart.type == ChartType.SCATTER
    assert (chart.x_label, chart.x_unit, chart.title) == ("x (m)", "m", None)
    assert [(e.label, e.points) for e in chart.elements] == [
        ("pairs", [(1, 2), (3, 4), (5, 6)]),
        ("more", [(2, 1), (4, 3)]),
    ]


def _pie(chart: Any) -> None:
    assert isinstance(chart, PieChart) and chart.type == ChartType.PIE and chart.title == "Shares"
    assert [(e.label, e.angle, e.radius) for e in chart.elements] == [("a", 90, 1), ("b", 90, 1), ("c", 180, 1)]


def _box(chart: Any) -> None:
    assert isinstance(chart, BoxAndWhiskerChart) and chart.type == ChartType.BOX_AND_WHISKER
    assert (chart.title, chart.x_label, chart.y_label) == ("Spread", "set", "v")
    boxes = [(e.label, e.min, e.first_quartile, e.median, e.third_quartile, e.max, e.outliers) for e in chart.elements]
    assert boxes == [("low", 1, 2, 3, 4, 5, []), ("high", 11, 12.25, 13.5, 14.75, 15, [30])]


def _log(chart: Any) -> None:
    assert isinstance(chart, LineChart) and (chart.x_scale, chart.y_scale) == (ScaleType.LINEAR, ScaleType.LOG)
    assert chart.elements[0].points == [(1, 10), (2, 100), (3, 1000), (4, 10000)]


def _datetime(chart: Any) -> None:
    assert isinstance(chart, LineChart) and (chart.x_scale, chart.y_scale) == (ScaleType.DATETIME, ScaleType.LINEAR)
    assert [x for x, _ in chart.elements[0].points] == [f"2024-01-0{d}" for d in range(1, 6)]
    assert chart.x_ticks[0].startswith("2024-01-01T")  # ISO dates, as E2B gives them


def _categorical(chart: Any) -> None:
    assert isinstance(chart, LineChart) and (chart.x_scale, chart.y_scale) == (ScaleType.LINEAR, ScaleType.CATEGORICAL)
    assert chart.elements[0].points == [(1, "low"), (2, "mid"), (3, "high")]
    assert chart.y_tick_labels == ["low", "mid", "high"]


def _super(chart: Any) -> None:
    assert isinstance(chart, SuperChart) and chart.type == ChartType.SUPERCHART and chart.title == "Two views"
    left, right = chart.elements
    assert isinstance(left, LineChart) and left.title == "falling"
    assert left.elements[0].points == [(0, 2), (1, 1), (2, 0)]
    assert isinstance(right, BarChart) and right.title == "counts"
    assert [(e.label, e.value) for e in right.elements] == [("p", 1), ("q", 2)]


def _unknown(chart: Any) -> None:
    assert chart.type == ChartType.UNKNOWN and chart.title == "A circle" and chart.elements == []


PLT = "import matplotlib.pyplot as plt\n"
#: A figure of each kind → what the SDK's ``result.chart`` must say of it.
CHARTS: dict[str, tuple[str, Callable[[Any], None]]] = {
    "bar": (
        "plt.bar(['north', 'south', 'east'], [3, 5, 7], label='units')\n"
        "plt.title('Units by region'); plt.xlabel('Region'); plt.ylabel('Units (k)')\n",
        _bar,
    ),
    "line": (
        "plt.plot([0, 1, 2, 3], [0, 1, 4, 9], label='square')\nplt.plot([0, 1, 2, 3], [0, 1, 8, 27], label='cube')\n"
        "plt.title('Powers'); plt.xlabel('n'); plt.ylabel('value')\n",
        _line,
    ),
    "scatter": (
        "plt.scatter([1, 3, 5], [2, 4, 6], label='pairs')\nplt.scatter([2, 4], [1, 3], label='more')\n"
        "plt.xlabel('x (m)')\n",
        _scatter,
    ),
    "pie": ("plt.pie([1, 1, 2], labels=['a', 'b', 'c'])\nplt.title('Shares')\n", _pie),
    "box-and-whiskers": (
        "fig, ax = plt.subplots()\n"
        "ax.boxplot([[1, 2, 3, 4, 5], [11, 12, 13, 14, 15, 30]], tick_labels=['low', 'high'], patch_artist=True)\n"
        "ax.set_title('Spread'); ax.set_xlabel('set'); ax.set_ylabel('v')\n",
        _box,
    ),
    "log": ("plt.plot([1, 2, 3, 4], [10, 100, 1000, 10000], label='tenfold')\nplt.yscale('log')\n", _log),
    "datetime": (
        "import datetime\ndays = [datetime.date(2024, 1, 1) + datetime.timedelta(days=i) for i in range(5)]\n"
        "plt.plot(days, [1, 3, 2, 5, 4])\n",
        _datetime,
    ),
    "categorical": ("plt.plot([1, 2, 3], ['low', 'mid', 'high'])\n", _categorical),
    "superchart": (
        "fig, (left, right) = plt.subplots(1, 2)\nfig.suptitle('Two views')\n"
        "left.plot([0, 1, 2], [2, 1, 0]); left.set_title('falling')\n"
        "right.bar(['p', 'q'], [1, 2]); right.set_title('counts')\n",
        _super,
    ),
    "unknown": (
        "fig, ax = plt.subplots()\nax.add_artist(plt.Circle((0, 0), 1, fill=False))\nax.set_title('A circle')\n",
        _unknown,
    ),
}


def _shown(execution: Any) -> Any:
    """The one result of a cell that showed one figure: its PNG and its chart."""
    assert execution.error is None, execution.error
    (result,) = execution.results
    assert base64.b64decode(result.png).startswith(PNG_MAGIC) and "Figure" in result.text
    assert not result.is_main_result and not result.extra
    return result


@pytest.mark.parametrize("kind", list(CHARTS))
def test_a_shown_figure_is_the_sdks_chart(charts: ci.Sandbox, kind: str) -> None:
    code, check = CHARTS[kind]
    check(_shown(charts.run_code(PLT + code + "plt.show()\n")).chart)


def test_a_figure_left_at_the_cells_end_is_a_chart_too(charts: ci.Sandbox) -> None:
    """The inline backend shows what a cell left open, through the same formatters."""
    code, check = CHARTS["bar"]
    check(_shown(charts.run_code(PLT + code + "None\n")).chart)


def test_a_figure_the_extractor_cannot_read_stays_an_image(charts: ci.Sandbox) -> None:
    # E2B's extractor needs boxes of one height to find a whisker: these have two, it fails, the PNG stays
    code = "ax = plt.subplots()[1]\nax.boxplot([[1, 2, 3, 4, 5], [2, 4, 6, 8, 100]], patch_artist=True)\nplt.show()"
    assert _shown(charts.run_code(PLT + code)).chart is None
    assert charts.run_code("1 + 1").text == "2"


async def test_async_sdk_reads_charts_data_and_esm() -> None:
    sandbox = await ci.AsyncSandbox.create(timeout=120)
    try:
        for kind in ("superchart", "box-and-whiskers", "datetime"):
            code, check = CHARTS[kind]
            check(_shown(await sandbox.run_code(PLT + code + "plt.show()\n")).chart)
        frame = await sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2, 3]})")
        assert frame.results[0].data == {"a": [1, 2, 3]} and frame.results[0].is_main_result
        esm = await sandbox.run_code("import { join } from 'path'\njoin('a', 'b')", language="js")
        assert esm.error is None and esm.text == "a/b"
    finally:
        await sandbox.kill()


def test_a_dataframe_result_has_its_columns_as_data(sbx: ci.Sandbox) -> None:
    code = (
        "import pandas as pd\n"
        "pd.DataFrame({'n': [1, 2], 'name': ['a', None], 'day': pd.to_datetime(['2024-01-01', '2024-01-02'])})"
    )
    execution = sbx.run_code(code)
    (result,) = execution.results
    assert result.data == {"n": [1, 2], "name": ["a", None], "day": ["2024-01-01T00:00:00", "2024-01-02T00:00:00"]}
    assert set(result.formats()) == {"text", "html", "data"}
    assert sbx.run_code("import pandas as pd\npd.Series([1, 2])").results[0].data is None  # DataFrames only


def test_a_list_or_dict_result_is_json(sbx: ci.Sandbox) -> None:
    execution = sbx.run_code("import numpy as np\n{'a': np.int64(3), 'b': np.arange(3), 'c': [1.5, None]}")
    assert execution.results[0].json == {"a": 3, "b": [0, 1, 2], "c": [1.5, None]}
    assert sbx.run_code("[1, 'two']").results[0].json == [1, "two"]
    plain = sbx.run_code("{'a': object()}").results[0]  # not JSON: text only
    assert plain.json is None and plain.text.startswith("{'a': <object")


def test_savefig_then_show_gives_the_saved_image_and_the_figure(sbx: ci.Sandbox) -> None:
    """E2B's kernel displays an image saved to a path: ``plt.savefig`` saves through PIL, then ``show`` shows."""
    code = PLT + "plt.plot([1, 2, 3])\nplt.savefig('plot.png')\nplt.show()\n"
    execution = sbx.run_code(code)
    assert execution.error is None, execution.error
    saved, shown = execution.results
    assert base64.b64decode(saved.png).startswith(PNG_MAGIC) and saved.chart is None and "PIL" in saved.text
    assert base64.b64decode(shown.png).startswith(PNG_MAGIC) and isinstance(shown.chart, LineChart)
    assert sbx.files.read("/home/user/plot.png", format="bytes").startswith(PNG_MAGIC)


def test_an_image_pil_saves_to_a_path_is_a_result_and_one_to_a_buffer_is_not(sbx: ci.Sandbox) -> None:
    code = (
        "import io\nfrom PIL import Image\nimage = Image.new('RGB', (4, 4))\n"
        "image.save(io.BytesIO(), format='png')\nimage.save('made.png')\nprint('saved')"
    )
    execution = sbx.run_code(code)
    (result,) = execution.results
    assert base64.b64decode(result.png).startswith(PNG_MAGIC) and execution.logs.stdout == ["saved\n"]
    assert sbx.files.read("/home/user/made.png", format="bytes").startswith(PNG_MAGIC)
    assert len(sbx.run_code("from PIL import Image\nImage.new('RGB', (4, 4)).show()").results) == 1


def test_a_traceback_has_no_colour_codes(sbx: ci.Sandbox) -> None:
    error = sbx.run_code("1 / 0").error
    assert error is not None and error.name == "ZeroDivisionError"
    assert "\x1b" not in error.traceback and "----> 1 1 / 0" in error.traceback
    assert sbx.run_code("list(range(2000))").text.endswith("1999]")  # printed whole, as E2B's kernel does


def test_javascript_esm_imports_bind_names_for_later_cells(sbx: ci.Sandbox) -> None:
    home = "/home/user"
    sbx.files.write(f"{home}/node_modules/cjspkg/package.json", '{"name": "cjspkg", "main": "index.js"}')
    sbx.files.write(f"{home}/node_modules/cjspkg/index.js", "module.exports = { hello: () => 'hi', n: 1 }")
    esm_only = '{"name": "esmpkg", "type": "module", "exports": {".": {"import": "./index.js"}}}'
    sbx.files.write(f"{home}/node_modules/esmpkg/package.json", esm_only)
    sbx.files.write(f"{home}/node_modules/esmpkg/index.js", "export default 'esm'; export const two = 2")
    sbx.files.write(f"{home}/local.mjs", "export const where = 'here'")

    def js(code: str) -> Any:
        execution = sbx.run_code(code, language="js")
        assert execution.error is None, execution.error
        return execution

    assert js("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)").logs.stdout == ["function\n"]
    assert js("typeof readFileSync").text == "function"  # a later cell sees the name
    assert js("import { readFileSync } from 'fs'\n1").text == "1"  # and a cell run again declares it again
    cell = "import fs, * as ns from 'node:fs'\nimport {\n  join,\n  basename as base\n} from 'path'\n"
    assert js(cell + "[typeof fs.statSync, typeof ns.statSync, join('a', 'b'), base('/x/y')]").text == (
        "[ 'function', 'function', 'a/b', 'y' ]"
    )
    assert js("import pkg, { hello } from 'cjspkg'\n[pkg.n, hello()]").text == "[ 1, 'hi' ]"
    assert js("import e, { two } from 'esmpkg'\nimport { where } from './local.mjs'\n[e, two, where]").text == (
        "[ 'esm', 2, 'here' ]"
    )
    assert js("const os = await import('os')\ntypeof os.cpus").text == "function"
    assert js("const s = 'import x from \"y\"'\ns").text == 'import x from "y"'  # in a string: not an import
    missing = sbx.run_code("import x from 'no-such-package'", language="js").error
    assert missing is not None and "no-such-package" in missing.value
    failed = sbx.run_code("import fs from 'fs'\n\n\nthrow new Error('on line 4')", language="js").error
    assert failed is not None and ":4:" in failed.traceback  # the rewritten imports keep the cell's lines


@pytest.mark.skipif(not JS_SDK, reason="set EXECSPACE_E2B_JS to a directory with `npm install @e2b/code-interpreter`")
def test_js_sdk_reads_charts_data_and_esm(e2b_server: Server) -> None:
    node = shutil.which("node")
    assert node is not None, "node is not installed"
    script = Path(JS_SDK or "") / f"outputs-{os.getpid()}.mjs"  # beside its node_modules, so the import resolves
    shutil.copy(Path(__file__).with_name("js") / "outputs.mjs", script)
    try:
        env = {**os.environ, **e2b_server.sdk_env()}
        run = subprocess.run([node, str(script)], env=env, capture_output=True, text=True, timeout=120)
    finally:
        script.unlink()
    assert run.returncode == 0 and run.stdout.strip() == "ok", f"{run.stdout}{run.stderr}"
