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


def _svg(title: str, height: int, body: SafeString) -> SafeString:
    """Return an accessible inline ``<svg>`` as wide as its container, ``height`` pixels high,
    with ``title`` on top. Its shapes are laid out in percentages of the width, its text in
    pixels: the chart takes its card's width and its text keeps the page's size."""
    return format_html(
        '<svg class="tl-chart" role="img" aria-label="{}" width="100%" height="{}" '
        'xmlns="http://www.w3.org/2000/svg"><text x="0" y="16" class="tl-title">{}</text>{}</svg>',
        title,
        height,
        title,
        body,
    )


#: Where the bars start (percent of the width: their labels are left of it), and how long the
#: longest bar is (the rest is for its value).
_LABEL_SHARE = 30
_BAR_SHARE = 52
#: Where the first bar (or column) starts, below the title.
_TOP = 26


def _bar(
    index: int, label: str, value: float, share: float, bar_height: int, fill: tuple[str, str], unit: str
) -> SafeString:
    """Return one bar (``share`` percent of the width long): its label, the bar (with the
    exact value as its tooltip) and the value. ``fill`` is ``(colour, state class)``: a
    state's class colours it as the page's badges of that state (admin.css)."""
    y = _TOP + index * (bar_height + 6)
    text = f"{_number(value)}{(' ' + unit) if unit else ''}"
    color, css = fill
    return format_html(
        '<text x="{}%" y="{}" text-anchor="end" class="tl-label">{}</text>'
        '<rect x="{}%" y="{}" width="{}%" height="{}" fill="{}" class="{}" rx="2"><title>{}: {}</title></rect>'
        '<text x="{}%" dx="5" y="{}" class="tl-value">{}</text>',
        _LABEL_SHARE - 1,
        y + bar_height * 0.7,
        label,
        _LABEL_SHARE,
        y,
        f"{share:.2f}",
        bar_height,
        color,
        f"tl-{css}" if css else "",
        label,
        text,
        f"{_LABEL_SHARE + share:.2f}",
        y + bar_height * 0.7,
        text,
    )


def bar_chart(
    bars: Sequence[tuple[str, float]],
    *,
    title: str,
    unit: str = "",
    width: int | None = None,
    bar_height: int = 20,
    colors: Sequence[str] = PALETTE,
    states: Sequence[str] | None = None,
) -> SafeString:
    """Return a horizontal bar chart of ``(label, value)`` pairs as an inline ``<svg>`` as wide
    as its container (``width`` is accepted and ignored, for callers of old).

    ``states`` names each bar's state: the bar then takes that state's colour (the class
    ``tl-<state>`` of admin.css), the same as its badges everywhere. Labels and the title are
    escaped; the chart scales to the largest value and carries a ``<title>`` per bar so that
    screen readers and hover tooltips give the exact numbers.
    """
    height = _TOP + max(1, len(bars)) * (bar_height + 6) + 4
    largest = max((float(value) for _, value in bars), default=0.0) or 1.0
    body = SafeString(
        "".join(
            _bar(
                index,
                label,
                value,
                0.0 if value <= 0 else max(0.4, _BAR_SHARE * float(value) / largest),
                bar_height,
                (colors[index % len(colors)], states[index] if states else ""),
                unit,
            )
            for index, (label, value) in enumerate(bars)
        )
    )
    if not bars:
        body = format_html('<text x="{}%" y="{}" class="tl-value">no data</text>', _LABEL_SHARE, _TOP + 14)
    return _svg(title, height, body)


#: One colour per outcome, the same on every page (done, failed, given back): the colours of
#: the states ``done``, ``failed`` and ``delayed`` in admin.css.
OUTCOME_COLORS = {"done": "#2e7d32", "failed": "#c62828", "given back": "#8a6d00"}


def _column(
    index: int,
    count: int,
    top: float,
    scale: tuple[float, float],
    label: str,
    values: Sequence[float],
    series: Sequence[str],
) -> SafeString:
    """Return column ``index`` of ``count``: a rect per positive value, stacked up from the
    baseline, with a tooltip. ``scale`` is ``(plot height, largest column)``."""
    plot_height, largest = scale
    step = 100 / max(1, count)
    tip = f"{label}: " + ", ".join(f"{_number(v)} {name}" for name, v in zip(series, values, strict=False))
    rects = []
    y = top + plot_height
    for name, value in zip(series, values, strict=False):
        if value <= 0:
            continue
        h = max(1.0, plot_height * value / largest)
        y -= h
        rects.append(
            (
                f"{index * step:.3f}",
                f"{y:.1f}",
                f"{step * 0.8:.3f}",
                f"{h:.1f}",
                OUTCOME_COLORS.get(name, "#777"),
                tip,
            )
        )
    return format_html_join(
        "", '<rect x="{}%" y="{}" width="{}%" height="{}" fill="{}"><title>{}</title></rect>', rects
    )


def _legend(series: Sequence[str], y: int) -> SafeString:
    """Return a colour key of ``series`` on the right at height ``y`` (under the title)."""
    keys = format_html_join(
        " ",
        '<tspan fill="{}">■</tspan> <tspan>{}</tspan>',
        ((OUTCOME_COLORS.get(n, "#777"), n) for n in series),
    )
    return format_html('<text x="100%" y="{}" text-anchor="end" class="tl-label">{}</text>', y, keys)


def _axes(largest: float, top: int, baseline: int, labels: Sequence[str], height: int) -> SafeString:
    """Return the largest column's value above the plot, the baseline, and the time labels
    under it (first, middle and last)."""
    first, middle, last = (labels[0], labels[len(labels) // 2], labels[-1]) if labels else ("", "", "")
    return format_html(
        '<text x="0" y="{}" class="tl-label">{} {}</text>'
        '<line x1="0" y1="{}" x2="100%" y2="{}" stroke="currentColor" stroke-opacity="0.3"/>'
        '<text x="0" y="{}" class="tl-label">{}</text>'
        '<text x="50%" y="{}" text-anchor="middle" class="tl-label">{}</text>'
        '<text x="100%" y="{}" text-anchor="end" class="tl-label">{}</text>',
        top - 4,
        "max",
        _number(largest),
        baseline,
        baseline,
        height - 4,
        first,
        height - 4,
        middle,
        height - 4,
        last,
    )


def time_chart(
    points: Sequence[tuple[str, Sequence[float]]],
    *,
    title: str,
    series: Sequence[str] = ("done", "failed", "given back"),
    width: int | None = None,
    height: int = 170,
) -> SafeString:
    """Return stacked columns over time, one per ``(label, values)`` point, as an inline
    ``<svg>`` as wide as its container (``width`` is accepted and ignored).

    Each column stacks ``values`` in the order of ``series`` (coloured by
    :data:`OUTCOME_COLORS`); the first, middle and last labels mark the time axis (give them
    a date when the points span days), and every column carries a ``<title>`` with its
    exact numbers.
    """
    top, bottom = _TOP + 16, 18
    plot_height = height - top - bottom
    largest = max((sum(values) for _, values in points), default=0) or 1
    columns = SafeString(
        "".join(
            _column(index, len(points), top, (plot_height, largest), label, values, series)
            for index, (label, values) in enumerate(points)
        )
    )
    labels = [label for label, _values in points]
    return _svg(
        title,
        height,
        _legend(series, top - 4) + _axes(largest, top, top + plot_height, labels, height) + columns,
    )
