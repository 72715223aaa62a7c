"""`make test`'s two workers take a file at a time in the order tests/conftest.py leaves them: the costliest tiers'
files first, files with a slow or process-starting test before the rest of their tier, each file's tests together
and in their own order."""
from dataclasses import dataclass

from tests.conftest import _costliest_files_first


@dataclass
class Item:
    fspath: str
    markers: tuple[str, ...]

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None


def test_the_costliest_files_go_first_each_files_tests_together_in_their_order():
    items = [Item("unit/test_a.py", ("unit",)), Item("unit/test_b.py", ("unit",)),
             Item("unit/test_b.py", ("unit", "process")), Item("parity/test_c.py", ("parity",)),
             Item("zoo/test_d.py", ("zoo", "slow")), Item("unit/test_a.py", ("unit",)),
             Item("install/test_e.py", ("install", "slow")), Item("notebooks/test_f.py", ("notebooks", "slow"))]
    expected = [items[6], items[7], items[4], items[3], items[1], items[2], items[0], items[5]]
    _costliest_files_first(items)
    assert items == expected
