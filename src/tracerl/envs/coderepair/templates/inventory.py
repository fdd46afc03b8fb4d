"""The `inventory` template: a stock ledger (held out)."""

from tracerl.envs.coderepair.templates.base import Site, Template

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
