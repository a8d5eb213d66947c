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
    label_width = 120
    value_width = 90
    plot = max(10, width - label_width - value_width)
    top = 26
    height = top + max(1, len(bars)) * (bar_height + 6) + 4
    largest = max((float(value) for _, value in bars), default=0.0) or 1.0
    rows = []
    for index, (label, value) in enumerate(bars):
        y = top + index * (bar_height + 6)
        length = 0 if value <= 0 else max(2, round(plot * float(value) / largest))
        text = f"{_number(value)}{(' ' + unit) if unit else ''}"
        rows.append(
            (
                label_width - 6,
                y + bar_height * 0.7,
                label,
                label_width,
                y,
                length,
                bar_height,
                colors[index % len(colors)],
                label,
                text,
                label_width + length + 6,
                y + bar_height * 0.7,
                text,
            )
        )
    body = format_html_join(
        "",
        '<text x="{}" y="{}" text-anchor="end" class="tl-label">{}</text>'
        '<rect x="{}" y="{}" width="{}" height="{}" fill="{}" rx="2"><title>{}: {}</title></rect>'
        '<text x="{}" y="{}" class="tl-value">{}</text>',
        rows,
    )
    if not bars:
        body = format_html('<text x="{}" y="{}" class="tl-value">no data</text>', label_width, top + 14)
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


#: One colour per outcome, the same on every page (done, failed, given back).
OUTCOME_COLORS = {"done": "#2e7d32", "failed": "#c62828", "given back": "#8a6d00"}


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
    top, bottom, left = 26, 18, 36
    plot_height = height - top - bottom
    count = max(1, len(points))
    step = (width - left) / count
    largest = max((sum(values) for _, values in points), default=0) or 1
    columns = []
    for index, (label, values) in enumerate(points):
        x = left + index * step
        y = top + plot_height
        tip = f"{label}: " + ", ".join(
            f"{_number(v)} {name}" for name, v in zip(series, values, strict=False)
        )
        for name, value in zip(series, values, strict=False):
            if value <= 0:
                continue
            h = max(1.0, plot_height * value / largest)
            y -= h
            columns.append(
                (
                    f"{x:.1f}",
                    f"{y:.1f}",
                    f"{max(1.0, step - 1):.1f}",
                    f"{h:.1f}",
                    OUTCOME_COLORS.get(name, "#777"),
                    tip,
                )
            )
    body = format_html_join(
        "", '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>', columns
    )
    legend = format_html_join(
        "",
        '<rect x="{}" y="6" width="10" height="10" fill="{}"/><text x="{}" y="15" class="tl-label">{}</text>',
        (
            (width - 250 + i * 85, OUTCOME_COLORS.get(name, "#777"), width - 236 + i * 85, name)
            for i, name in enumerate(series)
        ),
    )
    first = points[0][0] if points else ""
    last = points[-1][0] if points else ""
    return format_html(
        '<svg class="tl-chart" role="img" aria-label="{}" width="{}" height="{}" viewBox="0 0 {} {}" '
        'xmlns="http://www.w3.org/2000/svg"><text x="0" y="16" class="tl-title">{}</text>{}'
        '<text x="0" y="{}" class="tl-label">{}</text><text x="0" y="{}" class="tl-label">0</text>'
        '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor" stroke-opacity="0.3"/>{}'
        '<text x="{}" y="{}" class="tl-label">{}</text><text x="{}" y="{}" text-anchor="end" class="tl-label">{}</text></svg>',
        title,
        width,
        height,
        width,
        height,
        title,
        legend,
        top + 10,
        _number(largest),
        top + plot_height,
        left,
        top + plot_height,
        width,
        top + plot_height,
        body,
        left,
        height - 4,
        first,
        width,
        height - 4,
        last,
    )
