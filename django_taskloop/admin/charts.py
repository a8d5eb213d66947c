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
