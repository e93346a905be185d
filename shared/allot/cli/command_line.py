"""Reading an ``allot`` command line: the command's own usage for a word it does not
know (with the option meant, for a misspelt one), and the words as typed kept on the
result (``args.argv``: ``allot submit`` checks that its command came after ``--``)."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence


def parse_command_line(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but an unknown word is refused by the (sub)command's
    own parser (argparse refuses it with ``allot``'s top-level usage)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        refuse_unknown(_chosen_parser(parser, args), extra)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def _chosen_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``args`` were parsed for: ``allot budgets set``'s,
    not ``allot``'s."""
    while True:
        chosen = None
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(args, action.dest, None) or "")
        if chosen is None:
            return parser
        parser = chosen


def refuse_unknown(parser: argparse.ArgumentParser, extra: Sequence[str]) -> None:
    """Exit 2 with ``parser``'s usage, naming the unknown arguments and, for a misspelt
    option, the one meant (``--min-runtme``: did you mean --min-runtime?)."""
    options = [o for a in parser._actions for o in a.option_strings]
    words = []
    for word in extra:
        name = word.split("=", 1)[0]
        close = difflib.get_close_matches(name, options, n=1) if name[:2] == "--" else []
        if close and close[0] == name:  # its own option, typed before the command's name
            words.append(f"{word} (an option of {parser.prog}: put it after {parser.prog})")
        elif close:
            words.append(f"{word} (did you mean {close[0]}?)")
        else:
            words.append(word)
    parser.error(f"unrecognized arguments: {' '.join(words)}")
