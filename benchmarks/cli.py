"""What every benchmark command shares on its command line."""

from __future__ import annotations

import argparse


def doc_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser whose --help is its module docstring: the first paragraph as the
    description, the rest (how to run it, what it writes) as the epilog."""
    description, epilog = doc.split("\n\n", 1)
    return argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog
    )
