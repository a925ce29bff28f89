"""What the two LMDB checks share: fixture files, reading a file, the environments a dataset holds."""

from __future__ import annotations

import sys
from pathlib import Path

import lmdb
from torch.utils.data import get_worker_info

from packlab.course.grading.core import PartFailed, describe
from packlab.course.grading.fixtures import fixture_root, locked
from packlab.formats.lmdb_format import write_lmdb


def fixture_lmdb(name: str, samples) -> Path:
    """An LMDB file of ``samples`` written by the reference :func:`packlab.formats.write_lmdb`, cached."""
    root = fixture_root()
    target = root / f"{name}.lmdb"
    with locked(root):
        if not target.exists():
            write_lmdb(target, samples=samples, progress_bar=False)
    return target


def open_read_only(path: Path):
    """Open ``path`` as the checks read it; a failure becomes :class:`PartFailed` saying why."""
    try:
        return lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    except lmdb.Error as exc:
        if "already open in this process" in str(exc):
            raise PartFailed(
                f"{path.name} is still open in this process: an lmdb environment was opened and not closed "
                "(py-lmdb then refuses to open the file again in the same process)"
            ) from None
        raise PartFailed(f"{path.name} is not a readable LMDB file with subdir=False: {describe(exc)}") from None


def read_records(path: Path) -> dict[bytes, bytes]:
    """Every record of an LMDB file, read with a cursor."""
    env = open_read_only(path)
    try:
        with env.begin() as txn:
            return dict(txn.cursor())
    finally:
        env.close()


def environments_in(obj, depth: int = 2) -> list:
    """The open lmdb environments reachable from ``obj``: its attributes, the dicts, lists and objects in them."""
    found, seen = [], set()

    def visit(value, level):
        if id(value) in seen or level < 0:
            return
        seen.add(id(value))
        if isinstance(value, lmdb.Environment):
            try:
                value.flags()  # raises on a closed environment
                found.append(value)
            except lmdb.Error:
                pass
            return
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, (list, tuple, set)):
            children = list(value)
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            children = list(vars(value).values())
        else:
            return
        for child in children:
            visit(child, level - 1)

    visit(obj, depth)
    return found


def close_inherited_environments(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: close every open environment the worker inherited (see the module docstring).

    In a forked child, closing unmaps the child's view and closes the child's copies of the
    descriptors; the parent's environment is untouched.
    """
    dataset = get_worker_info().dataset
    module = sys.modules.get(type(dataset).__module__)
    for env in environments_in(dataset) + (environments_in(vars(module), depth=2) if module else []):
        env.close()


def close_quietly(dataset) -> None:
    """Close a candidate's dataset at the end of a part, whatever it is."""
    if dataset is not None and hasattr(dataset, "close"):
        try:
            dataset.close()
        except Exception:  # noqa: BLE001 - a part's verdict is already decided
            pass
