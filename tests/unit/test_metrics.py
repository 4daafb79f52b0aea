"""Service metrics rendering."""


def test_prometheus_histogram_is_cumulative():
    from nvrm.serve.metrics import Histogram

    h = Histogram("lat", "latency", (0.1, 1.0))
    for v in (0.05, 0.5, 0.5, 3.0):
        h.observe(v, endpoint="/x")
    text = "\n".join(h.render())
    assert 'lat_bucket{endpoint="/x",le="0.1"} 1' in text
    assert 'lat_bucket{endpoint="/x",le="1"} 3' in text
    assert 'lat_bucket{endpoint="/x",le="+Inf"} 4' in text and 'lat_count{endpoint="/x"} 4' in text
