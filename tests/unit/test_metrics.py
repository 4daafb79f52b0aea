"""Service metrics: prometheus_client series, one registry per app."""

from nvrm.serve.metrics import Metrics


def test_metrics_render_cumulative_histograms_and_live_gauges():
    depth = [3]
    m = Metrics(lambda: depth[0], lambda: 1024)
    for v in (0.003, 0.2, 0.2, 3.0):
        m.latency.labels(endpoint="/x").observe(v)
    m.context_cache.labels(result="hit").inc(2)
    text = m.render().decode()
    assert 'nvrm_request_seconds_bucket{endpoint="/x",le="0.005"} 1.0' in text
    assert 'nvrm_request_seconds_bucket{endpoint="/x",le="0.25"} 3.0' in text
    assert 'nvrm_request_seconds_count{endpoint="/x"} 4.0' in text
    assert 'nvrm_context_cache_total{result="hit"} 2.0' in text
    assert "nvrm_items_admitted 3.0" in text and "nvrm_context_cache_bytes 1024.0" in text
    depth[0] = 0
    assert "nvrm_items_admitted 0.0" in m.render().decode()
    Metrics(lambda: 0, lambda: 0)  # a second app in one process gets its own registry
