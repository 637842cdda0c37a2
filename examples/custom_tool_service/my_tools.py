"""A custom tool service in ~20 lines: `python examples/custom_tool_service/my_tools.py --port 8765`."""

import argparse
from typing import Literal

from agentrl.tools import ToolError, tool
from agentrl.tools.service import serve

Unit = Literal["m", "km", "mi", "ft"]
TO_METERS = {"m": 1.0, "km": 1000.0, "mi": 1609.344, "ft": 0.3048}


@tool
def convert_length(value: float, from_unit: Unit, to_unit: Unit) -> str:
    """Convert a length between units.

    Args:
        value: The length to convert.
        from_unit: The unit of `value`.
        to_unit: The unit to convert to.
    """
    return f"{value * TO_METERS[from_unit] / TO_METERS[to_unit]:.6g} {to_unit}"


class Cart(list):  # per-episode state: one cart per agent episode, dropped when the episode ends
    def __init__(self, budget: float = 100.0):
        super().__init__()
        self.budget = budget


@tool(session_factory=Cart)
def add_to_cart(item: str, price: float, *, session: Cart) -> str:
    """Add an item to the shopping cart and return the cart's total.

    Args:
        item: What to buy.
        price: Its price in dollars.
    """
    if sum(p for _, p in session) + price > session.budget:
        raise ToolError(f"adding {item} would exceed the budget of ${session.budget:g}")
    session.append((item, price))
    return f"{len(session)} item(s), total ${sum(p for _, p in session):.2f}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8765)
    serve([convert_length, add_to_cart], port=parser.parse_args().port)
