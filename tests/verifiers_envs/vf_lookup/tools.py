"""The taskset's tool server (MCP, served by verifiers in a process of its own)."""

import verifiers.v1 as vf

CODES = {"alpha": "7", "bravo": "3", "charlie": "9", "delta": "1"}


class LookupToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "codes"

    @vf.tool
    def lookup(self, name: str) -> str:
        """The code of a name.

        Args:
            name: the name to look up.
        """
        return CODES.get(name.strip().lower(), "unknown")


if __name__ == "__main__":
    LookupToolset.run()
