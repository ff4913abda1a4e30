"""``shoal.backends._parts.part``: a front's method is its part's own, kept on the store after its
first use, and a subclass of the front that overrides it and calls ``super()`` stays in front."""

from __future__ import annotations

from shoal.backends._parts import part


class _Counter:
    def __init__(self) -> None:
        self.calls = 0

    def add(self, n: int) -> int:
        self.calls += n
        return self.calls


class _Front:
    add = part("counter", _Counter.add)

    def __init__(self) -> None:
        self.counter = _Counter()


class _Logging(_Front):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def add(self, n: int) -> int:
        self.seen.append(n)
        return super().add(n)


def test_the_front_calls_its_part_and_keeps_the_bound_method() -> None:
    front = _Front()
    assert front.add(2) == 2 and front.add(3) == 5
    assert vars(front)["add"] == front.counter.add


def test_a_subclass_override_calling_super_is_called_every_time() -> None:
    front = _Logging()
    assert [front.add(1), front.add(1), front.add(1)] == [1, 2, 3]
    assert front.seen == [1, 1, 1] and "add" not in vars(front)
