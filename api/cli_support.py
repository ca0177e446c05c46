"""What every part of the command line shares: its error, its help
formatter, and a JSON GET for the inspection endpoints.

The command modules (``api.cli``, ``api.console``, ``api.groups_cli``, the
chaos harness's ``chaos.chaos_cli``, the Spark example) import these from
here, never from ``api.cli``, so ``api.cli`` can import them without a cycle.
"""

from __future__ import annotations

import argparse

from protocol import DEFAULT_BOOTSTRAP

__all__ = ["DEFAULT_BOOTSTRAP", "CliError", "ExamplesFormatter", "get_json"]


class CliError(Exception):
    """A failure to report in one line, exit status 1."""


class ExamplesFormatter(argparse.HelpFormatter):
    """Wraps each line of prose to the terminal; keeps indented lines (the
    examples) exactly as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        return "\n".join(indent + line if line.startswith(" ") or not line else
                         textwrap.fill(line, width, initial_indent=indent,
                                       subsequent_indent=indent)
                         for line in text.splitlines())


def post_json(url: str, body: object, timeout_s: float = 30.0) -> object:
    """POST ``body`` as JSON; the decoded answer (an error body too)."""
    import json

    return get_json(url, timeout_s, json.dumps(body).encode())


def get_json(url: str, timeout_s: float = 10.0, data: bytes | None = None) -> object:
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=data, headers={
        "Accept": "application/json", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        try:
            return json.load(exc)
        except ValueError:
            raise CliError(f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}; is the node "
                       "running? (set --bootstrap or $KRAFTLOG_BOOTSTRAP)") from None
