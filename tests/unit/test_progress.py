"""Batch progress: a bar on a terminal, plain log lines otherwise."""


def test_batch_progress_is_a_bar_on_a_terminal_and_log_lines_otherwise():
    import io

    from nvrm.batch.runner import Progress

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
