"""The throughput chart's y-scale: it reads the peak the figures line shows, even when the samples in the window
(or the ones drawn at all) stayed below it (issue #24 item 6b: the scale read 0.14 under "peak 1.93")."""

from __future__ import annotations

from tui.widgets.chart import ThroughputChart


def top_label(chart: ThroughputChart) -> str:
    return chart.render().plain.splitlines()[0].split()[0]


def test_the_scale_reads_the_figures_peak():
    chart = ThroughputChart()
    for i in range(20):
        chart.add_sample(float(i), 0.14 if i % 2 else 0.1, peak=1.93)
    assert top_label(chart) == "1.93"


def test_without_a_peak_the_scale_is_the_window_and_clear_forgets_it():
    chart = ThroughputChart()
    chart.add_sample(0.0, 0.5)
    chart.add_sample(1.0, 0.75)
    assert top_label(chart) == "0.75"
    chart.add_sample(2.0, 0.2, peak=3.0)
    chart.add_sample(3.0, 0.2, peak=1.0)  # a peak never goes down within a run
    assert top_label(chart) == "3.00"
    chart.clear()
    chart.add_sample(0.0, 0.5)
    assert top_label(chart) == "0.50"
