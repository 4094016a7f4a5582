"""Verdicts, the time limit of a check, the report and its table."""

import time

from eyas.preflight.result import CheckFailed, CheckResult, bounded, no_go, report, table_rows


def test_a_check_that_overruns_fails_at_its_limit_naming_the_fix():
    t0 = time.monotonic()
    r = bounded("stuck", lambda: time.sleep(30) or CheckResult("stuck", True, ""), 0.5)
    assert time.monotonic() - t0 < 5
    assert not r.ok and "did not finish within 0.5s" in r.detail
    assert "check_timeout_s" in r.fix


def test_a_failed_check_carries_its_fix_and_a_crash_is_a_failure():
    def fails():
        raise CheckFailed("the disk is full", fix="free space")

    r = bounded("disk", fails, 10)
    assert (r.ok, r.detail, r.fix) == (False, "the disk is full", "free space")
    r = bounded("capture", lambda: 1 / 0, 10)
    assert not r.ok and "ZeroDivisionError" in r.detail


def test_go_only_when_every_check_passed_and_the_table_says_what_was_not_checked():
    good = CheckResult("environment", True, "fine", figure="0 GPU(s)", partial="no GPU here")
    bad = CheckResult("disk", False, "full", fix="free space")
    rep = report([good, bad], {"extract_s": 1.0, "train_s": None})
    assert rep["ok"] is False
    assert set(rep["checks"][0]) >= {"name", "ok", "seconds", "detail"}
    rows = table_rows(rep)
    assert rows[0]["verdict"] == "GO (partial)" and "no GPU here" in rows[0]["detail"]
    assert rows[1]["verdict"] == "NO-GO" and rows[1]["fix"] == "free space"
    exc = no_go(rep)
    assert "disk: full -- fix: free space" in str(exc) and exc.report is rep
    assert report([good], {})["ok"] is True
