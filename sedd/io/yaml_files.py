"""YAML configs read within bounds: ``read_yaml`` reads what ``yaml.safe_load`` reads, but
refuses a file over ``MAX_BYTES`` before reading it and a document over ``MAX_NODES`` nodes
before building it.

``safe_load`` builds no Python objects, yet it expands aliases: a list of nine aliases to a list
of nine aliases, nine levels deep (a "billion laughs" file of 500 bytes), is 9**9 items, minutes
and gigabytes. So the document is first composed, a graph in which an alias is the very node it
names, and its size counted with each alias standing for the whole node it names. Sizes are
memoised per node, so the count takes one pass over the nodes as written, however far they
expand; only then is the document constructed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20  # 1 MiB; a config is a few kB
MAX_NODES = 100_000  # scalars, lists and mappings, aliases expanded; a config has hundreds


class YamlFileError(ValueError):
    """A YAML file that is too large, expands too far or is not YAML; the message names it."""


def read_yaml(path: str | Path, *, what: str) -> Any:
    """The document in the YAML file at ``path`` as ``yaml.safe_load`` gives it (None when the
    file is empty). ``what`` names the file in errors: ``"--config"`` gives ``--config PATH: ...``.

    A missing file raises ``FileNotFoundError`` (callers say what the file is for); a file too
    large, a document expanding past ``MAX_NODES`` nodes, nested too deeply, holding an alias
    inside the node it names, or not YAML raises ``YamlFileError``."""
    where = f"{what} {path}"
    loader = _BoundedLoader(_read_bounded(Path(path), where), where)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded_size(node, where)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise YamlFileError(f"{where}: not valid YAML ({first}); fix or replace it.") from None
    except RecursionError:
        raise YamlFileError(
            f"{where}: nested too deeply to be a config; fix or replace it."
        ) from None
    finally:
        loader.dispose()


def _too_many_nodes(where: str) -> YamlFileError:
    return YamlFileError(
        f"{where}: expands to more than {MAX_NODES:,} YAML nodes (each alias counted as the "
        "whole node it names), far more than a config holds; write the values out once or "
        "use fewer aliases."
    )


def _read_bounded(path: Path, where: str) -> bytes:
    """The file's bytes; ``YamlFileError`` past ``MAX_BYTES``. A regular file is judged by its
    size before it is opened; anything else (a pipe, a device such as /dev/zero) by reading at
    most one byte more than the limit."""
    info = os.stat(path)
    if stat.S_ISREG(info.st_mode) and info.st_size > MAX_BYTES:
        raise _too_large(where, f"{info.st_size:,} bytes")
    with path.open("rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise _too_large(where, f"more than {MAX_BYTES:,} bytes")
    return data


def _too_large(where: str, size: str) -> YamlFileError:
    return YamlFileError(
        f"{where}: {size}, over the {MAX_BYTES // 2**20} MiB a YAML config may have; pass the "
        "config file itself, not a data file."
    )


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that stops composing once the nodes as written pass ``MAX_NODES``, so a
    large flat document costs no more than a refused one (expanded sizes are counted after)."""

    def __init__(self, stream: bytes, where: str) -> None:
        super().__init__(stream)
        self.where, self.composed = where, 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self.composed += 1
        if self.composed > MAX_NODES:
            raise _too_many_nodes(self.where)
        return super().compose_node(parent, index)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]  # (key, value) pairs
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []  # a scalar


def _check_expanded_size(root: yaml.Node, where: str) -> None:
    """Refuse ``root`` when, aliases expanded, it has more than ``MAX_NODES`` nodes, or when an
    alias sits inside the node it names (a document that never ends when expanded).

    A depth-first walk without recursion: a node's size is 1 + its children's, each node's
    computed once (keyed by identity; an alias is the node it names), so shared nodes cost
    nothing more. ``open_nodes`` holds the nodes on the current path: meeting one again is a
    cycle."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            if sizes[key] > MAX_NODES:
                raise _too_many_nodes(where)
        elif key in open_nodes:
            raise YamlFileError(
                f"{where}: the node at line {node.start_mark.line + 1} holds an alias to itself "
                "(a recursive document); write the values out instead."
            )
        elif key not in sizes:
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node))
