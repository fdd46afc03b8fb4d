"""The `text` template: text helpers."""

from tracerl.envs.coderepair.templates.base import Site, Template

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
