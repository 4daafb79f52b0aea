import threading

import pytest

from nvrm.pipeline import PrepPool, default_workers


def test_default_workers_bounded():
    assert 1 <= default_workers() <= 16


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_results_in_order_and_errors_delivered(workers):
    pool = PrepPool(workers)

    def job(x):
        if x == 3:
            raise ValueError("bad 3")
        return x * x

    futures = pool.map_ordered(job, range(6))
    assert [f.result() for i, f in enumerate(futures) if i != 3] == [0, 1, 4, 16, 25]
    with pytest.raises(ValueError, match="bad 3"):
        futures[3].result()
    pool.close()


def test_jobs_run_off_the_calling_thread():
    pool = PrepPool(2)
    caller = threading.get_ident()
    idents = [f.result() for f in pool.map_ordered(lambda _: threading.get_ident(), range(4))]
    assert caller not in idents
    pool.close()


def test_batch_progress_is_a_bar_on_a_terminal_and_log_lines_otherwise():
    import io

    from nvrm.jobs.runner import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    bar = Progress(10, tty)
    bar.update(4, 1)
    bar.close()
    assert "4/10" in tty.getvalue() and "row/s" in tty.getvalue() and "failed=1" in tty.getvalue()
    plain = io.StringIO()
    log = Progress(10, plain, every_s=0.0)
    log.update(4, 1)
    log.update(6, 0)
    lines = plain.getvalue().splitlines()
    assert lines[0].startswith("nvrm batch: 4/10 rows,") and "ETA" in lines[0] and lines[-1].startswith("nvrm batch: 10/10 rows")
    assert "\r" not in plain.getvalue()


def test_reward_fn_groups_items_that_share_prompt_and_context():
    import numpy as np

    from nvrm import Clip
    from nvrm.rewardfn import plan_groups

    clip = Clip(np.zeros((2, 8, 8, 3), np.uint8), fps=1)
    prompts = ["a", "a", "b", "a", "a", "a"]
    contexts = ["x.mp4", "x.mp4", "x.mp4", clip, clip, object()]
    assert plan_groups(prompts, contexts) == [[0, 1], [2], [3, 4], [5]]


def test_prometheus_histogram_is_cumulative():
    from nvrm.serve.metrics import Histogram

    h = Histogram("lat", "latency", (0.1, 1.0))
    for v in (0.05, 0.5, 0.5, 3.0):
        h.observe(v, endpoint="/x")
    text = "\n".join(h.render())
    assert 'lat_bucket{endpoint="/x",le="0.1"} 1' in text
    assert 'lat_bucket{endpoint="/x",le="1"} 3' in text
    assert 'lat_bucket{endpoint="/x",le="+Inf"} 4' in text and 'lat_count{endpoint="/x"} 4' in text
