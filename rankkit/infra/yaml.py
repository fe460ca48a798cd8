"""YAML with limits: a config file cannot make rankkit allocate or loop without bound.

PyYAML shares an aliased node instead of copying it, so a few hundred bytes of nested aliases
(a "billion laughs" file) load quickly -- and then explode when anything walks, copies or dumps
the result (jsonargparse does all three: a 476-byte file grew past 3 GB). Before loading, the
text is composed into nodes (no Python objects built) and the nodes are counted **as if every
alias were expanded**, stopping at :data:`MAX_NODES` nodes, :data:`MAX_EXPANDED_BYTES`
characters of values and :data:`MAX_DEPTH` levels; the text itself is limited to
:data:`MAX_BYTES`. Every YAML rankkit reads goes through :func:`check_yaml`: ``compare``'s model
configs (:func:`safe_load`) and everything jsonargparse parses for ``rankkit fit|validate|test``
and ``rankkit compare`` (``--config`` files, values on the command line), by :func:`install`.
"""
from __future__ import annotations

import yaml

#: The largest YAML text rankkit parses (rankkit's own configs are under 4 KiB).
MAX_BYTES = 1 << 20
#: The most nodes (scalars, lists, mappings) a YAML text may hold with its aliases expanded.
MAX_NODES = 100_000
#: The most characters of scalars a YAML text may hold with its aliases expanded (one large
#: anchored string aliased many times stays under MAX_NODES but not under this).
MAX_EXPANDED_BYTES = 8 << 20
#: The deepest nesting of lists and mappings (PyYAML composes recursively).
MAX_DEPTH = 100


class YAMLLimitError(yaml.YAMLError, ValueError):
    """A YAML text beyond :data:`MAX_BYTES` or :data:`MAX_NODES` (also a ``ValueError``)."""


def check_yaml(text: str, source: str = "YAML") -> None:
    """Raise :class:`YAMLLimitError` when ``text`` is longer than :data:`MAX_BYTES` or holds more
    than :data:`MAX_NODES` nodes with aliases expanded; malformed YAML raises ``yaml.YAMLError``.

    >>> check_yaml("a: &x [1, 2]\\nb: *x")
    >>> letters = "abcdefghijklmnopqr"  # each level two aliases of the last: 2^17 leaves
    >>> bomb = "a: &a [x, x]\\n" + "".join(f"{c}: &{c} [*{p}, *{p}]\\n" for p, c in zip(letters, letters[1:]))
    >>> check_yaml(bomb, "bomb.yaml")
    Traceback (most recent call last):
    ...
    rankkit.infra.yaml.YAMLLimitError: bomb.yaml: more than 100000 YAML nodes with aliases expanded ...
    """
    if len(text) > MAX_BYTES:
        raise YAMLLimitError(f"{source}: {len(text)} characters of YAML, more than rankkit's limit "
                             f"rankkit.infra.yaml.MAX_BYTES = {MAX_BYTES}")
    _check_depth(text, source)
    try:
        roots = [node for node in yaml.compose_all(text, Loader=yaml.SafeLoader) if node is not None]
    except RecursionError:
        raise YAMLLimitError(f"{source}: YAML nested too deeply to read") from None
    stack = [(node, 1) for node in roots]
    count = chars = 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise YAMLLimitError(f"{source}: more than {MAX_NODES} YAML nodes with aliases expanded (an alias "
                                 f"bomb?); rankkit's limit is rankkit.infra.yaml.MAX_NODES")
        if depth > MAX_DEPTH:
            raise YAMLLimitError(f"{source}: YAML nested more than {MAX_DEPTH} levels deep; rankkit's limit is "
                                 f"rankkit.infra.yaml.MAX_DEPTH")
        if isinstance(node, yaml.ScalarNode):
            chars += len(node.value)
            if chars > MAX_EXPANDED_BYTES:
                raise YAMLLimitError(f"{source}: more than {MAX_EXPANDED_BYTES} characters of YAML values with "
                                     f"aliases expanded (an alias bomb?); rankkit's limit is "
                                     f"rankkit.infra.yaml.MAX_EXPANDED_BYTES")
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.extend(((key, depth + 1), (value, depth + 1)))


def _check_depth(text: str, source: str) -> None:
    """A quick bound on flow nesting (``[[[[...``, ``{{{{...``) before PyYAML's recursive reader
    sees it: more than :data:`MAX_DEPTH` open brackets at once is refused."""
    depth = top = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            top = max(top, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
    if top > MAX_DEPTH:
        raise YAMLLimitError(f"{source}: YAML nested more than {MAX_DEPTH} levels deep; rankkit's limit is "
                             f"rankkit.infra.yaml.MAX_DEPTH")


def safe_load(text: str, source: str = "YAML"):
    """``yaml.safe_load(text)`` after :func:`check_yaml`."""
    check_yaml(text, source)
    return yaml.safe_load(text)


def read_text(path, source: str | None = None) -> str:
    """The text of a YAML file, read with a bound: at most :data:`MAX_BYTES` + 1 bytes are read
    (a stream, ``/dev/zero`` or a pipe that never ends, stops there), then refused by size."""
    import os

    with open(os.fspath(path), "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise YAMLLimitError(f"{source or os.fspath(path)}: longer than {MAX_BYTES} bytes "
                             f"(rankkit.infra.yaml.MAX_BYTES)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise YAMLLimitError(f"{source or os.fspath(path)}: not UTF-8 text ({e.reason} at byte {e.start})") from None


_installed = False


def install() -> None:
    """Make jsonargparse check every YAML text it loads (config files and command-line values)
    with :func:`check_yaml` before its own loader runs. Idempotent."""
    global _installed
    if _installed:
        return
    from jsonargparse import get_loader, set_loader

    original = get_loader("yaml")

    def limited_load(stream):
        if isinstance(stream, str):
            check_yaml(stream)
        return original(stream)

    set_loader("yaml", limited_load, exceptions=(yaml.YAMLError,))
    _installed = True
