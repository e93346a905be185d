"""``allot.adapters.batch_staging``: which staging directories become links to tmpfs, and
which are left alone (no server here: the layout nats-server uses, made by hand; the
integration test runs a real nats-server on it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from allot.adapters.batch_staging import (
    memory_root,
    remove_root,
    stage_in_memory,
    staging_dir,
)


def _nothing(_link: Path) -> None:
    pass


def _empty_dir(link: Path) -> None:
    link.mkdir(parents=True)


def _batch_being_staged(link: Path) -> None:
    (link / "q6UcUFMT" / "msgs").mkdir(parents=True)
    (link / "q6UcUFMT" / "meta.inf").write_text("{}")


def _stale_link(link: Path) -> None:
    link.parent.mkdir(parents=True)
    link.symlink_to(link.parent / "gone", target_is_directory=True)


# (what the store holds before, linked to tmpfs after?)
CASES: list[tuple[str, Callable[[Path], None], bool]] = [
    ("stream not created yet", _nothing, True),
    ("empty staging dir (a stream restored by nats-server)", _empty_dir, True),
    ("a batch being staged on disk", _batch_being_staged, False),
    ("a link left by an earlier run", _stale_link, True),
]


@pytest.mark.parametrize(("case", "before", "linked"), CASES, ids=[c[0] for c in CASES])
def test_staging_dir_becomes_a_link_unless_a_batch_is_in_it(
    tmp_path: Path, case: str, before: Callable[[Path], None], linked: bool
) -> None:
    store, root = tmp_path / "store", tmp_path / "shm"
    link = staging_dir(store, "$G", "WORKLOADS")
    before(link)
    placed = stage_in_memory(store, ["WORKLOADS"], root)
    assert placed == (["WORKLOADS"] if linked else [])
    assert link.is_symlink() is linked
    if linked:
        assert link.resolve() == (root / "$G" / "WORKLOADS").resolve()
        assert link.is_dir()
    else:  # the staged batch is untouched
        assert (link / "q6UcUFMT" / "meta.inf").read_text() == "{}"


def test_idempotent_and_per_account(tmp_path: Path) -> None:
    store, root = tmp_path / "store", tmp_path / "shm"
    names = ["ALLOT/WORKLOADS", "HOSTS"]
    links = [staging_dir(store, "ALLOT", "WORKLOADS"), staging_dir(store, "$G", "HOSTS")]
    assert stage_in_memory(store, names, root) == names
    first = [os.readlink(link) for link in links]
    assert stage_in_memory(store, names, root) == names
    assert [os.readlink(link) for link in links] == first
    assert staging_dir(store, "ALLOT", "WORKLOADS").resolve() == (root / "ALLOT" / "WORKLOADS")
    assert staging_dir(store, "$G", "HOSTS").resolve() == (root / "$G" / "HOSTS")
    assert not staging_dir(store, "$G", "WORKLOADS").exists()


def test_memory_root_only_where_there_is_one(tmp_path: Path) -> None:
    assert memory_root(tmp_path / "missing") is None
    root = memory_root(tmp_path)
    assert root is not None and root.parent == tmp_path and root.is_dir()
    (root / "$G" / "WORKLOADS").mkdir(parents=True)
    remove_root(root)
    assert not root.exists()
    remove_root(root)  # already gone: nothing to do
    remove_root(None)
