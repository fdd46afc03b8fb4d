"""Module templates for the code-repair tasks: correct code, the bug sites it offers (one per
bug kind), visible tests (what the agent may run) and hidden acceptance tests (what grades).

A site is ``(kind, correct, buggy, issue)``: `correct` occurs exactly once in the module's
source, replacing it with `buggy` plants the bug, and `issue` is the report the agent gets.
Hidden tests exercise inputs the visible tests do not, so special-casing the visible tests'
inputs does not pass them. The tests use only the standard library (`unittest`).
"""

from __future__ import annotations

from dataclasses import dataclass

BUG_KINDS = (
    "off_by_one",
    "wrong_operator",
    "missing_edge_case",
    "wrong_default",
    "swapped_arguments",
    "exception_not_raised",
)


@dataclass(frozen=True)
class Site:
    kind: str
    correct: str
    buggy: str
    issue: str


@dataclass(frozen=True)
class Template:
    name: str
    module: str  # file name inside the package
    source: str
    sites: tuple[Site, ...]
    visible_tests: str
    hidden_tests: str


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

TEXT = Template(
    "text",
    "text.py",
    '''"""Text helpers."""


def _fill(text, width, char):
    return char * (width - len(text)) + text


def truncate(s, n, suffix="..."):
    if n < len(suffix):
        raise ValueError("n is shorter than the suffix")
    if len(s) <= n:
        return s
    return s[: n - len(suffix)] + suffix


def pad_left(s, width, char=" "):
    return _fill(s, width, char)


def chunks(s, size):
    return [s[i:i + size] for i in range(0, len(s), size)]


def longest_word(s):
    words = s.split()
    if not words:
        return ""
    return max(words, key=len)


def is_longer(a, b):
    return len(a) > len(b)
''',
    (
        Site(
            "off_by_one",
            "len(s) <= n",
            "len(s) < n",
            'truncate("hello", 5) returns "he..." but the text already fits in 5 characters.',
        ),
        Site(
            "wrong_operator",
            "len(a) > len(b)",
            "len(a) >= len(b)",
            'is_longer("ab", "cd") returns True for strings of equal length.',
        ),
        Site(
            "missing_edge_case",
            '    if not words:\n        return ""\n',
            "",
            'longest_word("") raises ValueError; a text without words should give "".',
        ),
        Site(
            "wrong_default",
            'suffix="..."',
            'suffix="~"',
            'truncate("abcdefgh", 6) ends with "~"; the default suffix is "...".',
        ),
        Site(
            "swapped_arguments",
            "_fill(s, width, char)",
            "_fill(char, width, s)",
            'pad_left("7", 3, "0") returns "770" instead of "007".',
        ),
        Site(
            "exception_not_raised",
            '    if n < len(suffix):\n        raise ValueError("n is shorter than the suffix")\n',
            "",
            'truncate("abcdef", 2) returns a cut suffix; n shorter than the suffix must '
            "raise ValueError.",
        ),
    ),
    """import unittest

from {pkg}.text import chunks, is_longer, longest_word, pad_left, truncate


class TestText(unittest.TestCase):
    def test_truncate(self):
        self.assertEqual(truncate("hello world", 8), "hello...")

    def test_pad_left(self):
        self.assertEqual(pad_left("ab", 2), "ab")

    def test_chunks(self):
        self.assertEqual(chunks("abcd", 2), ["ab", "cd"])

    def test_longest_word(self):
        self.assertEqual(longest_word("a bbb cc"), "bbb")

    def test_is_longer(self):
        self.assertTrue(is_longer("abc", "a"))
""",
    """import unittest

from {pkg}.text import chunks, is_longer, longest_word, pad_left, truncate


class TestTextHidden(unittest.TestCase):
    def test_truncate(self):
        self.assertEqual(truncate("abcdef", 6), "abcdef")
        self.assertEqual(truncate("abcdefghij", 7), "abcd...")
        with self.assertRaises(ValueError):
            truncate("abcdef", 1)

    def test_pad_left(self):
        self.assertEqual(pad_left("5", 4, "0"), "0005")

    def test_chunks(self):
        self.assertEqual(chunks("abcde", 2), ["ab", "cd", "e"])

    def test_longest_word(self):
        self.assertEqual(longest_word("  to   three "), "three")
        self.assertEqual(longest_word("   "), "")

    def test_is_longer(self):
        self.assertFalse(is_longer("xy", "zw"))
        self.assertFalse(is_longer("x", "zw"))
""",
)

INVENTORY = Template(
    "inventory",
    "inventory.py",
    '''"""A stock ledger."""


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, qty=1):
        if qty <= 0:
            raise ValueError("qty must be positive")
        self.items[name] = self.items.get(name, 0) + qty

    def remove(self, name, qty=1):
        have = self.items.get(name, 0)
        if qty > have:
            raise ValueError(f"only {have} {name} in stock")
        self.items[name] = have - qty

    def total(self):
        return sum(self.items.values())

    def low_stock(self, threshold=5):
        return sorted(n for n, q in self.items.items() if q < threshold)

    def transfer(self, other, name, qty):
        move(self, other, name, qty)

    def last(self, n):
        names = sorted(self.items)
        return names[len(names) - n:]

    def average_stock(self):
        if not self.items:
            return 0.0
        return self.total() / len(self.items)


def move(src, dst, name, qty):
    src.remove(name, qty)
    dst.add(name, qty)
''',
    (
        Site(
            "off_by_one",
            "names[len(names) - n:]",
            "names[len(names) - n + 1:]",
            "Inventory.last(2) returns one name instead of the last two.",
        ),
        Site(
            "wrong_operator",
            "have - qty",
            "have + qty",
            "Inventory.remove adds to the stock instead of taking from it.",
        ),
        Site(
            "missing_edge_case",
            "        if not self.items:\n            return 0.0\n",
            "",
            "Inventory().average_stock() raises ZeroDivisionError; an empty inventory's "
            "average is 0.0.",
        ),
        Site(
            "wrong_default",
            "threshold=5",
            "threshold=2",
            "low_stock() should list items with fewer than 5 in stock by default.",
        ),
        Site(
            "swapped_arguments",
            "move(self, other, name, qty)",
            "move(other, self, name, qty)",
            "a.transfer(b, 'pen', 1) moves pens from b to a instead of from a to b.",
        ),
        Site(
            "exception_not_raised",
            "        if qty > have:\n"
            '            raise ValueError(f"only {have} {name} in stock")\n',
            "",
            "remove() lets the stock go negative; removing more than is in stock must raise "
            "ValueError.",
        ),
    ),
    """import unittest

from {pkg}.inventory import Inventory


class TestInventory(unittest.TestCase):
    def test_add_total(self):
        inv = Inventory()
        inv.add("pen", 2)
        self.assertEqual(inv.total(), 2)

    def test_low_stock(self):
        inv = Inventory()
        inv.add("pen", 1)
        self.assertEqual(inv.low_stock(), ["pen"])
""",
    """import unittest

from {pkg}.inventory import Inventory


class TestInventoryHidden(unittest.TestCase):
    def test_remove(self):
        inv = Inventory()
        inv.add("ink", 5)
        inv.remove("ink", 2)
        self.assertEqual(inv.items["ink"], 3)
        with self.assertRaises(ValueError):
            inv.remove("ink", 9)

    def test_low_stock_default(self):
        inv = Inventory()
        inv.add("a", 3)
        inv.add("b", 8)
        self.assertEqual(inv.low_stock(), ["a"])

    def test_transfer(self):
        a, b = Inventory(), Inventory()
        a.add("cap", 4)
        a.transfer(b, "cap", 3)
        self.assertEqual((a.items["cap"], b.items["cap"]), (1, 3))

    def test_last(self):
        inv = Inventory()
        for n in ("x", "y", "z"):
            inv.add(n)
        self.assertEqual(inv.last(2), ["y", "z"])

    def test_average_stock(self):
        inv = Inventory()
        self.assertEqual(inv.average_stock(), 0.0)
        inv.add("a", 2)
        inv.add("b", 4)
        self.assertEqual(inv.average_stock(), 3.0)
""",
)

TEMPLATES = {t.name: t for t in (STATS, TEXT, INVENTORY)}
