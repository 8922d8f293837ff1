"""The one back-off formula every retry uses (core/backoff.py)."""

import pytest

from heartbeat_runner.core.backoff import Backoff


def test_waits_double_from_the_first_and_stop_growing_at_the_cap():
    backoff = Backoff(first_s=1.0, max_s=10.0)
    assert [backoff.after(n) for n in range(0, 7)] == [0.0, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_a_long_outage_stays_at_the_cap_without_overflowing():
    assert Backoff(first_s=0.5, max_s=300.0, factor=3.0).after(10_000) == 300.0


@pytest.mark.parametrize("bad", [dict(first_s=-1.0, max_s=1.0), dict(first_s=1.0, max_s=-1.0),
                                 dict(first_s=1.0, max_s=1.0, factor=0.5)])
def test_a_back_off_that_would_shrink_or_go_negative_is_refused(bad):
    with pytest.raises(ValueError, match="back-off"):
        Backoff(**bad)
