"""Discover and call the service of my_tools.py through a ToolRegistry: `python call_tools.py [URL]`."""

import asyncio
import sys
from pathlib import Path

import yaml

from agentrl.tools import ToolRegistry


async def main(url: str | None = None) -> list[str]:
    config = yaml.safe_load((Path(__file__).parent / "tools.yaml").read_text())
    if url:
        config["services"][0]["url"] = url
    out = []
    async with ToolRegistry.from_config(config) as registry:
        out.append(f"tools: {registry.names()}")
        out.append((await registry.call("convert_length", {"value": 5, "from_unit": "km", "to_unit": "mi"})).content)
        async with registry.episode_session({"add_to_cart": {"budget": 10}}) as episode:
            for item, price in [("apples", 3.5), ("bread", 4.0), ("cheese", 6.0)]:
                result = await registry.call("add_to_cart", {"item": item, "price": price}, session=episode)
                out.append(f"{result.content} (error_kind={result.error_kind})")
    return out


if __name__ == "__main__":
    print("\n".join(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))))
