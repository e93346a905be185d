"""Load YAML for the CLI and the simulator without letting YAML rewrite names.

YAML 1.1 resolves plain scalars by their look: ``103959`` becomes an int, ``0755`` the
octal int 493, ``1_000`` the int 1000, ``1.5e3`` a float, ``yes`` a boolean. Team and
allocation names are text, so ``NameKeepingLoader`` keeps as text, exactly as typed:

* every plain scalar that is a mapping *key*, and
* every plain scalar that is the *value* of a ``name`` or ``parent`` key (the keys that hold
  node names in the budget tree's nested and flat forms),

whenever YAML would otherwise have read it as an int, a float or a boolean. The loader also
reads YAML 1.2 / JSON exponents (``1.5e3``, ``6214e9``) as floats, which YAML 1.1 leaves as
text, so ``usage: 1.5e3`` is a number; that is what would turn an unquoted name ``6214e9``
into 6214000000.0 if names were not protected. Nulls stay null
(so a missing name is still reported as missing) and everything else loads as safe YAML
normally does, so ``shares: 40`` is still the int 40 and ``shares: parent`` the text.
Duplicate keys in one mapping are an error rather than silently keeping the last.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from allot.core.errors import ValidationError
from allot.sim.input_files import unreadable

NAME_KEYS = frozenset({"name", "parent"})
"""Keys whose plain scalar values are always loaded as text."""

_STR = "tag:yaml.org,2002:str"
_REWRITTEN = frozenset(
    {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool"}
)


class NameKeepingLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that keeps keys and ``name``/``parent`` values as typed."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[object, object]:
        seen: dict[object, Node] = {}
        for key_node, value_node in node.value:
            _keep_as_text(key_node)
            if isinstance(key_node, ScalarNode) and key_node.tag == _STR:
                if key_node.value in NAME_KEYS:
                    _keep_as_text(value_node)
                if key_node.value in seen:
                    first = seen[key_node.value].start_mark.line + 1
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key_node.value!r} (first at line {first})",
                        key_node.start_mark,
                    )
                seen[key_node.value] = key_node
        return super().construct_mapping(node, deep=deep)


def _keep_as_text(node: Node) -> None:
    # Only plain (unquoted) scalars were typed by the implicit resolvers; an explicit tag
    # such as !!int is the author's choice and is left alone.
    if isinstance(node, ScalarNode) and node.style is None and node.tag in _REWRITTEN:
        node.tag = _STR


# YAML 1.1 (PyYAML) wants a dot and a signed exponent in a float, so `usage: 1.5e3` would load
# as the text "1.5e3". Accept the YAML 1.2 / JSON spelling too; names are protected above, so
# this is exactly what turns an unquoted name `6214e9` into 6214000000.0 elsewhere.
NameKeepingLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(path: Path) -> object:
    """Parse one YAML document from ``path``. A missing or unreadable file, or bad YAML,
    raises ``ValidationError(str(path), reason)`` with a one-line reason."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise unreadable(where, exc) from None
    try:
        return yaml.load(text, Loader=NameKeepingLoader)
    except yaml.MarkedYAMLError as exc:
        raise ValidationError(where, _one_line(exc)) from None
    except yaml.YAMLError as exc:
        raise ValidationError(where, f"invalid YAML: {' '.join(str(exc).split())}") from None
    except ValueError as exc:  # a scalar Python cannot hold, e.g. an int of 5,000 digits
        reason = " ".join(str(exc).split())[:200]
        raise ValidationError(where, f"invalid YAML: a value out of range ({reason})") from None


def _one_line(exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    problem = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
    if exc.context and exc.problem:
        problem = f"{' '.join(exc.context.split())}: {problem}"
    if mark is None:
        return f"invalid YAML: {problem}"
    return f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
