"""The `stats` template: small statistics helpers."""

from tracerl.envs.coderepair.templates.base import Site, Template

STATS = Template(
    "stats",
    "stats.py",
    '''"""Small statistics helpers."""


def _bound(value, low, high):
    return max(low, min(value, high))


def mean(xs):
    if not xs:
        return 0.0
    return sum(xs) / len(xs)


def clamp(x, lo, hi):
    return _bound(x, lo, hi)


def window_sums(xs, k):
    return [sum(xs[i:i + k]) for i in range(len(xs) - k + 1)]


def percent(part, whole, digits=1):
    if whole == 0:
        raise ValueError("whole must be non-zero")
    return round(100 * part / whole, digits)
''',
    (
        Site(
            "off_by_one",
            "range(len(xs) - k + 1)",
            "range(len(xs) - k)",
            "window_sums([1, 2, 3], 2) returns [3] but should return [3, 5]: the last "
            "window is missing.",
        ),
        Site(
            "wrong_operator",
            "100 * part / whole",
            "100 * part // whole",
            "percent(1, 3) returns 33 instead of 33.3.",
        ),
        Site(
            "missing_edge_case",
            "    if not xs:\n        return 0.0\n",
            "",
            "mean([]) raises ZeroDivisionError; the mean of no numbers should be 0.0.",
        ),
        Site(
            "wrong_default",
            "digits=1",
            "digits=0",
            "percent(1, 3) returns 33.0; by default it should keep one decimal (33.3).",
        ),
        Site(
            "swapped_arguments",
            "_bound(x, lo, hi)",
            "_bound(x, hi, lo)",
            "clamp(5, 0, 10) returns 10 instead of 5.",
        ),
        Site(
            "exception_not_raised",
            '    if whole == 0:\n        raise ValueError("whole must be non-zero")\n',
            "",
            "percent(1, 0) raises ZeroDivisionError; it should raise ValueError.",
        ),
    ),
    """import unittest

from {pkg}.stats import clamp, mean, percent, window_sums


class TestStats(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([2, 4]), 3)

    def test_clamp(self):
        self.assertEqual(clamp(-5, 0, 10), 0)

    def test_window_sums(self):
        self.assertEqual(window_sums([1, 1, 1, 1], 2)[:2], [2, 2])

    def test_percent(self):
        self.assertEqual(percent(1, 2), 50)
""",
    """import unittest

from {pkg}.stats import clamp, mean, percent, window_sums


class TestStatsHidden(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 6]), 3)
        self.assertEqual(mean([]), 0.0)

    def test_clamp(self):
        self.assertEqual(clamp(7, 0, 9), 7)
        self.assertEqual(clamp(12, 0, 9), 9)
        self.assertEqual(clamp(-1, 0, 9), 0)

    def test_window_sums(self):
        self.assertEqual(window_sums([4, 5, 6, 7], 3), [15, 18])
        self.assertEqual(window_sums([2], 1), [2])

    def test_percent(self):
        self.assertEqual(percent(2, 3), 66.7)
        self.assertEqual(percent(1, 8, 2), 12.5)
        with self.assertRaises(ValueError):
            percent(3, 0)
""",
)
