"""HDF5 inputs that hold their own data: the check every ``.h5ad`` read passes first.

HDF5 lets an object take its data from elsewhere: a dataset's raw bytes kept in other files
(*external storage*), a group member that is a link into another file (*external link*), a
dataset mapped from others, in any file (*virtual dataset*), or a link class a plugin resolves
(*user-defined link*). Read as cells, such a file copies whatever local file it names
(``/proc/self/environ``, a key file) into the counts. ``check_self_contained`` walks the links
and the dataset headers (no data) and refuses each of these; ``sedd.io.read.read_h5ad_safely``
runs it before anndata opens the file, and every product read of an ``.h5ad`` goes through it.

A soft link passes when its target is reached from the file's root (or the link's group) by
plain (hard) links alone, so it names an object the walk checks anyway.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py

_FIX = "nothing was read; pass an .h5ad that holds all of its own data (anndata writes one)"
_SHOWN_FILES = 3  # external storage may list many files: the first few say enough


class ExternalDataError(ValueError):
    """An HDF5 input with an object whose data would come from outside the file."""


class NotHdf5Error(ValueError):
    """An input given as an ``.h5ad`` that HDF5 cannot open (another format, or cut short)."""


def check_self_contained(path: str | Path, what: str = "h5ad file") -> None:
    """Refuse ``path`` unless every object in it reads only this file.

    Raises ``ExternalDataError`` naming ``what``, the file and the first offending object;
    ``NotHdf5Error`` when HDF5 cannot open the file. The operating system's own errors (a
    missing file, a directory, no permission) pass through unchanged.
    """
    path = Path(path)
    try:
        file = h5py.File(os.fspath(path), "r")
    except OSError as err:
        if err.errno is not None:  # the OS refused: its error already says why
            raise
        raise NotHdf5Error(
            f"{what} {path} is not an HDF5 file ({err}); pass an .h5ad written by anndata."
        ) from None
    with file:
        problem = _outside_reference(file.id)
    if problem is not None:
        raise ExternalDataError(f"{what} {path}: {problem}; {_FIX}.")


def _outside_reference(root: h5py.h5g.GroupID) -> str | None:
    """What the first object that reads outside the file is, or None.

    Both visits follow hard links only (each object once, however often it is linked) and
    never traverse a soft or external link, so nothing outside the file is opened."""

    def on_link(name: bytes, info: h5py.h5l.LinkInfo) -> str | None:
        return _link_problem(root, name, info.type)

    def on_object(name: bytes, info: h5py.h5o.ObjInfo) -> str | None:
        if info.type != h5py.h5o.TYPE_DATASET:
            return None
        return _dataset_problem(h5py.h5o.open(root, name), name)

    return root.links.visit(on_link, info=True) or h5py.h5o.visit(root, on_object, info=True)


def _link_problem(root: h5py.h5g.GroupID, name: bytes, kind: int) -> str | None:
    if kind == h5py.h5l.TYPE_HARD:
        return None
    if kind == h5py.h5l.TYPE_EXTERNAL:
        filename, target = root.links.get_val(name)
        return f"{_path(name)} is an HDF5 external link to {_shown(target)} in {_shown(filename)}"
    if kind == h5py.h5l.TYPE_SOFT:
        target = root.links.get_val(name)
        parent = name.rpartition(b"/")[0]
        if _reached_by_hard_links(root, parent, target):
            return None
        return (
            f"{_path(name)} is a soft link to {_shown(target)}, which plain links inside "
            "the file do not reach"
        )
    return f"{_path(name)} is a user-defined HDF5 link (class {kind}), which may read any file"


def _reached_by_hard_links(root: h5py.h5g.GroupID, parent: bytes, target: bytes) -> bool:
    """Whether ``target`` (absolute, or relative to group ``parent``) names an object through
    hard links only; each step looks at one link, so no other link is ever traversed."""
    group = root if target.startswith(b"/") or not parent else h5py.h5g.open(root, parent)
    steps = [step for step in target.split(b"/") if step not in (b"", b".")]
    for i, step in enumerate(steps):
        if not group.links.exists(step):
            return False
        if group.links.get_info(step).type != h5py.h5l.TYPE_HARD:
            return False
        if i < len(steps) - 1:
            try:
                group = h5py.h5g.open(group, step)
            except ValueError:  # a dataset in the middle of the path
                return False
    return True


def _dataset_problem(dataset: h5py.h5d.DatasetID, name: bytes) -> str | None:
    # The creation properties sit in the object header: no data is read.
    plist = dataset.get_create_plist()
    if plist.get_layout() == h5py.h5d.VIRTUAL:
        return (
            f"dataset {_path(name)} is an HDF5 virtual dataset (its values are mapped from "
            "other datasets, in any file)"
        )
    count = plist.get_external_count()
    if count > 0:
        shown = range(min(count, _SHOWN_FILES))
        files = ", ".join(_shown(plist.get_external(i)[0]) for i in shown)
        more = f" and {count - _SHOWN_FILES} more" if count > _SHOWN_FILES else ""
        return (
            f"dataset {_path(name)} keeps its values in other files (HDF5 external storage: "
            f"{files}{more})"
        )
    return None


def _path(name: bytes) -> str:
    """An object's path from the root, as h5py writes it: ``X`` -> ``/X``."""
    return "/" + _shown(name)


def _shown(name: bytes | str) -> str:
    """A name from the file, printable on one line (the file chose it, not the user)."""
    text = name.decode("utf-8", "backslashreplace") if isinstance(name, bytes) else name
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
