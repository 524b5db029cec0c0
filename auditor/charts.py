"""Small bar charts as inline SVG, drawn on the server: no JavaScript and nothing from a CDN."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext

WIDTH = 360
HEIGHT = 64
TOP = 2  # the largest bar stops just under the top


def bar_chart(
    values: Sequence[float | None],
    labels: Sequence[str],
    *,
    colour: str,
    unit: str = "",
    title: str = "",
    show: Callable[[float], str] | None = None,
) -> SafeString:
    """One bar per value (``None``: no bar, e.g. no latency in an hour without calls), scaled to the largest;
    each bar's tooltip says its label and value (``show(value)``, or the value and ``unit``). The largest value is
    written above the chart, as HTML: SVG text would shrink with the chart, which pages scale to fit their columns
    (at 9 px in the drawing it read about 6 px high on the tool metrics page)."""
    if show is None:

        def show(value: float) -> str:
            return f"{value:g}{unit}"

    largest = max((v for v in values if v is not None), default=0.0)
    count = max(len(values), 1)
    slot = WIDTH / count
    gap = 1.0 if slot > 3 else 0.0
    bars = []
    for index, (value, label) in enumerate(zip(values, labels, strict=True)):
        if value is None:
            continue
        height = (HEIGHT - TOP) * (value / largest) if largest else 0.0
        shown = show(value)
        bars.append(
            (
                f"{index * slot:.2f}",
                f"{HEIGHT - max(height, 0.5 if value else 0.0):.2f}",
                f"{max(slot - gap, 0.5):.2f}",
                f"{max(height, 0.5 if value else 0.0):.2f}",
                colour,
                f"{label}: {shown}",
            )
        )
    return format_html(
        '<div class="chart-scale" style="font-size: 0.75rem; color: var(--body-quiet-color, #666);">{}</div>'
        '<svg class="chart" viewBox="0 0 {} {}" width="{}" height="{}" role="img" aria-label="{}">'
        '<line x1="0" y1="{}" x2="{}" y2="{}" stroke="currentColor" stroke-opacity="0.3"/>{}</svg>',
        gettext("max %(value)s") % {"value": show(largest)},
        WIDTH,
        HEIGHT,
        WIDTH,
        HEIGHT,
        title,
        HEIGHT - 0.5,
        WIDTH,
        HEIGHT - 0.5,
        format_html_join(
            "",
            '<rect x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>',
            bars,
        ),
    )
