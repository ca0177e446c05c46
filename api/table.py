"""Plain-text tables for the CLI and the benchmarks: columns two spaces apart.

The one table formatter of the project: every listing (topics, groups,
cluster status, chaos reports, benchmark figures) goes through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def format_table(header: Sequence[str], rows: Iterable[Sequence[str]], *,
                 numbers_right: bool = False, rule: bool = False) -> str:
    """``header`` and ``rows`` (cells made strings) as aligned lines.
    ``numbers_right`` right-aligns every column but the first (figures);
    ``rule`` puts a line of dashes under the header."""
    table = [tuple(str(cell) for cell in header)] + [tuple(str(c) for c in row) for row in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [
            cell.rjust(width) if numbers_right else cell.ljust(width)
            for cell, width in zip(row[1:], widths[1:])]
        return "  ".join(cells).rstrip()

    lines = [line(table[0])]
    if rule:
        lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines + [line(row) for row in table[1:]])
