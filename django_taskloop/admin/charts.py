"""Charts drawn on the server as inline SVG: no JavaScript, no CDN, works offline."""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

__all__ = ["bar_chart", "PALETTE"]

# Colour-blind-safe (Okabe–Ito), readable on the admin's light and dark themes.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999")


def _number(value: float) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def _svg(title: str, width: int, height: int, body: SafeString) -> SafeString:
    """Return an accessible inline ``<svg>`` of ``width`` x ``height`` with ``title`` on top."""
    return format_html(
        '<svg class="tl-chart" role="img" aria-label="{}" width="{}" height="{}" viewBox="0 0 {} {}" '
        'xmlns="http://www.w3.org/2000/svg"><text x="0" y="16" class="tl-title">{}</text>{}</svg>',
        title,
        width,
        height,
        width,
        height,
        title,
        body,
    )


#: Room left of the bars for their labels, and right of the longest bar for its value.
_LABEL_WIDTH = 120
_VALUE_WIDTH = 90
#: Where the first bar (or column) starts, below the title.
_TOP = 26


def _bar(
    index: int, label: str, value: float, length: int, bar_height: int, color: str, unit: str
) -> SafeString:
    """Return one bar: its label, the bar (with the exact value as its tooltip) and the value."""
    y = _TOP + index * (bar_height + 6)
    text = f"{_number(value)}{(' ' + unit) if unit else ''}"
    return format_html(
        '<text x="{}" y="{}" text-anchor="end" class="tl-label">{}</text>'
        '<rect x="{}" y="{}" width="{}" height="{}" fill="{}" rx="2"><title>{}: {}</title></rect>'
        '<text x="{}" y="{}" class="tl-value">{}</text>',
        _LABEL_WIDTH - 6,
        y + bar_height * 0.7,
        label,
        _LABEL_WIDTH,
        y,
        length,
        bar_height,
        color,
        label,
        text,
        _LABEL_WIDTH + length + 6,
        y + bar_height * 0.7,
        text,
    )


def bar_chart(
    bars: Sequence[tuple[str, float]],
    *,
    title: str,
    unit: str = "",
    width: int = 420,
    bar_height: int = 22,
    colors: Sequence[str] = PALETTE,
) -> SafeString:
    """Return a horizontal bar chart of ``(label, value)`` pairs as an inline ``<svg>``.

    Labels and the title are escaped; the chart scales to the largest value and carries a
    ``<title>`` so that screen readers and hover tooltips give the exact numbers.
    """
    plot = max(10, width - _LABEL_WIDTH - _VALUE_WIDTH)
    height = _TOP + max(1, len(bars)) * (bar_height + 6) + 4
    largest = max((float(value) for _, value in bars), default=0.0) or 1.0
    body = SafeString(
        "".join(
            _bar(
                index,
                label,
                value,
                0 if value <= 0 else max(2, round(plot * float(value) / largest)),
                bar_height,
                colors[index % len(colors)],
                unit,
            )
            for index, (label, value) in enumerate(bars)
        )
    )
    if not bars:
        body = format_html('<text x="{}" y="{}" class="tl-value">no data</text>', _LABEL_WIDTH, _TOP + 14)
    return _svg(title, width, height, body)


#: One colour per outcome, the same on every page (done, failed, given back).
OUTCOME_COLORS = {"done": "#2e7d32", "failed": "#c62828", "given back": "#8a6d00"}


def _column(
    x: float,
    step: float,
    baseline: float,
    scale: tuple[float, float],
    label: str,
    values: Sequence[float],
    series: Sequence[str],
) -> SafeString:
    """Return one stacked column at ``x``: a rect per positive value, bottom up, with a tooltip.

    ``scale`` is ``(plot height, largest column)``: a value's height is its share of the plot.
    """
    plot_height, largest = scale
    tip = f"{label}: " + ", ".join(f"{_number(v)} {name}" for name, v in zip(series, values, strict=False))
    rects = []
    y = baseline
    for name, value in zip(series, values, strict=False):
        if value <= 0:
            continue
        h = max(1.0, plot_height * value / largest)
        y -= h
        rects.append(
            (
                f"{x:.1f}",
                f"{y:.1f}",
                f"{max(1.0, step - 1):.1f}",
                f"{h:.1f}",
                OUTCOME_COLORS.get(name, "#777"),
                tip,
            )
        )
    return format_html_join(
        "", '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>', rects
    )


def _legend(series: Sequence[str], width: int) -> SafeString:
    """Return a colour key of ``series`` at the top right."""
    return format_html_join(
        "",
        '<rect x="{}" y="6" width="10" height="10" fill="{}"/><text x="{}" y="15" class="tl-label">{}</text>',
        (
            (width - 250 + i * 85, OUTCOME_COLORS.get(name, "#777"), width - 236 + i * 85, name)
            for i, name in enumerate(series)
        ),
    )


def _value_axis(largest: float, left: int, baseline: int, width: int) -> SafeString:
    """Return the largest value and 0 on the left, and the baseline."""
    return format_html(
        '<text x="0" y="{}" class="tl-label">{}</text><text x="0" y="{}" class="tl-label">0</text>'
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" stroke-opacity="0.3"/>',
        _TOP + 10,
        _number(largest),
        baseline,
        left,
        baseline,
        width,
        baseline,
    )


def _time_axis(first: str, last: str, left: int, width: int, height: int) -> SafeString:
    """Return the first and last time labels under the columns."""
    return format_html(
        '<text x="{}" y="{}" class="tl-label">{}</text><text x="{}" y="{}" text-anchor="end" class="tl-label">{}</text>',
        left,
        height - 4,
        first,
        width,
        height - 4,
        last,
    )


def time_chart(
    points: Sequence[tuple[str, Sequence[float]]],
    *,
    title: str,
    series: Sequence[str] = ("done", "failed", "given back"),
    width: int = 520,
    height: int = 150,
) -> SafeString:
    """Return stacked columns over time, one per ``(label, values)`` point, as an inline ``<svg>``.

    Each column stacks ``values`` in the order of ``series`` (coloured by
    :data:`OUTCOME_COLORS`); the first and last labels mark the time axis, and every column
    carries a ``<title>`` with its exact numbers.
    """
    bottom, left = 18, 36
    plot_height = height - _TOP - bottom
    baseline = _TOP + plot_height
    step = (width - left) / max(1, len(points))
    largest = max((sum(values) for _, values in points), default=0) or 1
    columns = SafeString(
        "".join(
            _column(left + index * step, step, baseline, (plot_height, largest), label, values, series)
            for index, (label, values) in enumerate(points)
        )
    )
    first = points[0][0] if points else ""
    last = points[-1][0] if points else ""
    return _svg(
        title,
        width,
        height,
        _legend(series, width)
        + _value_axis(largest, left, baseline, width)
        + columns
        + _time_axis(first, last, left, width, height),
    )
