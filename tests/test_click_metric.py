"""rankkit.click_metric, a deprecated name of rankkit.clicks: its import warns and gives the very
objects of their new homes (the check is tests/test_unbiased.py's)."""
from __future__ import annotations

from tests.test_unbiased import check


def test_the_old_module_warns_and_gives_the_new_objects():
    check("rankkit.click_metric")
