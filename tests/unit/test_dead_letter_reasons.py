"""The reason of a sealed dead letter withholds quoted values, and keeps the type named by Python's own
`'<type>' object ...` messages (a fault of the code, e.g. a cache found None, must say what it met)."""

from __future__ import annotations

from services.consolidator.deadletters import withhold_values


def test_quoted_values_are_withheld():
    assert withhold_values("ValidationError: at 'a secret' is bad") == "ValidationError: at '…' is bad"
    assert withhold_values('KeyError: "alice"') == "KeyError: '…'"
    assert withhold_values("ValueError: 'my secret' object") == "ValueError: '…' object"


def test_the_type_python_names_is_kept():
    assert (
        withhold_values("TypeError: 'NoneType' object does not support item assignment")
        == "TypeError: 'NoneType' object does not support item assignment"
    )
    assert (
        withhold_values("AttributeError: 'str' object has no attribute 'secret'")
        == "AttributeError: 'str' object has no attribute '…'"
    )
