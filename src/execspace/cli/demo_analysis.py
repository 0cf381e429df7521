"""The program ``execspace demo`` runs inside the workspace (stdlib only, copied in as analyze.py).

Reads a CSV of daily sales (date, region, temperature_c, sales) and writes
``$OUTPUT_DIR/summary.json`` (count, mean, min, max, totals per region) and
``$OUTPUT_DIR/chart.svg`` (daily sales as a line, region totals as bars).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 820, 400
TOP, BOTTOM = 60, 340  # plot area, in SVG y coordinates
LINE_LEFT, LINE_RIGHT = 70, 480
BAR_LEFT, BAR_STEP, BAR_WIDTH = 540, 66, 44


class Row(TypedDict):
    """One day of the CSV."""

    date: str
    region: str
    temperature_c: float
    sales: int


class Stats(TypedDict):
    mean: float
    min: float
    max: float


class Summary(TypedDict):
    """What ``summary.json`` holds."""

    metric: str
    count: int
    mean: float
    min: float
    max: float
    total: int
    by_region: dict[str, int]
    temperature_c: Stats
    first_date: str
    last_date: str


def read_rows(path: str) -> list[Row]:
    with Path(path).open(newline="") as f:
        return [
            {
                "date": r["date"],
                "region": r["region"],
                "temperature_c": float(r["temperature_c"]),
                "sales": int(r["sales"]),
            }
            for r in csv.DictReader(f)
        ]


def _stats(values: Sequence[float]) -> Stats:
    return {"mean": round(sum(values) / len(values), 3), "min": min(values), "max": max(values)}


def summarize(rows: list[Row]) -> Summary:
    sales = [r["sales"] for r in rows]
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["region"]] = totals.get(r["region"], 0) + r["sales"]
    stats = _stats(sales)
    return {
        "metric": "sales",
        "count": len(rows),
        "mean": stats["mean"],
        "min": stats["min"],
        "max": stats["max"],
        "total": sum(sales),
        "by_region": dict(sorted(totals.items())),
        "temperature_c": _stats([r["temperature_c"] for r in rows]),
        "first_date": rows[0]["date"],
        "last_date": rows[-1]["date"],
    }


def _text(x: float, y: float, label: object, anchor: str = "middle", size: int = 12) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
        f'font-family="sans-serif">{escape(str(label))}</text>'
    )


def _line_panel(rows: list[Row], summary: Summary) -> list[str]:
    lo, hi = summary["min"], summary["max"]
    span = (hi - lo) or 1
    step = (LINE_RIGHT - LINE_LEFT) / max(len(rows) - 1, 1)
    points = " ".join(
        f"{LINE_LEFT + i * step:.1f},{BOTTOM - (r['sales'] - lo) / span * (BOTTOM - TOP):.1f}"
        for i, r in enumerate(rows)
    )
    return [
        f'<line x1="{LINE_LEFT}" y1="{BOTTOM}" x2="{LINE_RIGHT}" y2="{BOTTOM}" stroke="#333"/>',
        f'<line x1="{LINE_LEFT}" y1="{TOP}" x2="{LINE_LEFT}" y2="{BOTTOM}" stroke="#333"/>',
        f'<polyline points="{points}" fill="none" stroke="#1f77b4" stroke-width="2"/>',
        _text(LINE_LEFT - 6, BOTTOM + 4, lo, "end"),
        _text(LINE_LEFT - 6, TOP + 4, hi, "end"),
        _text(LINE_LEFT, BOTTOM + 20, rows[0]["date"], "start"),
        _text(LINE_RIGHT, BOTTOM + 20, rows[-1]["date"], "end"),
        _text((LINE_LEFT + LINE_RIGHT) / 2, TOP - 14, "Daily sales", size=14),
    ]


def _bar_panel(totals: dict[str, int]) -> list[str]:
    peak = max(totals.values()) or 1
    parts = [_text(BAR_LEFT + BAR_STEP * len(totals) / 2, TOP - 14, "Sales by region", size=14)]
    for k, (region, total) in enumerate(totals.items()):
        height = total / peak * (BOTTOM - TOP)
        x = BAR_LEFT + k * BAR_STEP
        parts += [
            f'<rect x="{x}" y="{BOTTOM - height:.1f}" width="{BAR_WIDTH}" height="{height:.1f}" '
            f'fill="#ff7f0e"><title>{escape(region)}: {total}</title></rect>',
            _text(x + BAR_WIDTH / 2, BOTTOM + 20, region),
            _text(x + BAR_WIDTH / 2, BOTTOM - height - 6, total, size=11),
        ]
    return parts


def render_svg(rows: list[Row], summary: Summary) -> str:
    body = _line_panel(rows, summary) + _bar_panel(summary["by_region"])
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}">',
            f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
            *body,
            "</svg>",
        ]
    )


def main(argv: list[str]) -> int:
    source = argv[1] if len(argv) > 1 else "inputs/sales.csv"
    out = Path(os.environ.get("OUTPUT_DIR", "../out"))
    rows = read_rows(source)
    if not rows:
        print(f"{source} has no rows", file=sys.stderr)
        return 1
    summary = summarize(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "chart.svg").write_text(render_svg(rows, summary) + "\n")
    print(f"analysed {summary['count']} rows from {source}: mean sales {summary['mean']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
