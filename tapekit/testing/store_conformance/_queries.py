"""The conformance checks of tags and queries: tags added by saves and changed only
explicitly, every :class:`~tapekit.store.TapeFilter` field with paging and counting, and
ancestry and descendants.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tapekit.core import Tape
from tapekit.dialog import UserStep
from tapekit.store.base import TapeFilter, TapeInfo, TapeNotFoundError
from tapekit.testing.store_conformance._support import StoreFactory, equal, made_by, raises


def check_tags_are_added_by_saves_and_changed_only_explicitly(make_store: StoreFactory, tmp: Path) -> None:
    """Saves add tags and never remove them; ``add_tags``/``remove_tags`` change them; tags
    list sorted, once each."""
    tape: Tape[Any, Any] = Tape(steps=[UserStep(content="0")])
    with make_store() as store:
        key = store.save_tape(tape, tags=["eval", "v1"])
        tape = tape.append(UserStep(content="1"))
        store.save_tape(tape, key, tags=["v2", "eval"])
        store.save_tape(tape.append(UserStep(content="2")), key)  # no tags: nothing removed
        equal(store.get_tape_info(key).tags, ["eval", "v1", "v2"], "tags after saves")
        store.remove_tags(key, ["v1", "never-there"])
        store.add_tags(key, ["gold", "gold"])
        equal(store.get_tape_info(key).tags, ["eval", "gold", "v2"], "tags after add/remove")
        other = store.save_tape(Tape(steps=[UserStep(content="o")]), tags=["eval"])
        equal(set(store.list_tapes(TapeFilter(tag="eval"))), {key, other}, "tag=eval")
        equal(store.list_tapes(TapeFilter(tag="gold")), [key], "tag=gold")
        equal(store.list_tapes(TapeFilter(tag="v1")), [], "tag=v1")
        equal(store.list_tape_infos(TapeFilter(tag="gold"))[0].tags, ["eval", "gold", "v2"], "listed tags")
        with raises(TypeError, "list of strings"):
            store.add_tags(key, "gold")
        with raises(TypeError, "non-empty"):
            store.save_tape(tape, key, tags=[""])
        with raises(TapeNotFoundError, "nope"):
            store.add_tags("nope", ["x"])


def check_every_filter_of_list_tapes(make_store: StoreFactory, tmp: Path) -> None:
    """Each :class:`TapeFilter` field selects what it says, alone and combined; lists are
    newest first and page with ``limit``/``offset``; ``count_tapes`` agrees."""
    root: Tape[Any, Any] = Tape(steps=[made_by("analyst", "plan", "p1")]).with_metadata(author="analyst")
    child = root.with_new_steps([made_by("analyst/search_agent", "search", "p2")], author="search_agent")
    failed: Tape[Any, Any] = Tape(steps=[UserStep(content="x")]).with_metadata(
        error="timeout", author="analyst"
    )
    with make_store() as store:
        store.save_tape(root, tags=["a"])
        store.flush()
        time.sleep(0.02)
        store.save_tape(child, tags=["a", "b"])
        store.flush()
        time.sleep(0.02)
        store.save_tape(failed, tags=["b"])
        r, c, f = root.metadata.id, child.metadata.id, failed.metadata.id
        t_child = store.get_tape_info(c).created

        def ids(**fields: Any) -> list[str]:
            return store.list_tapes(TapeFilter(**fields))

        equal(store.list_tapes(), [f, c, r], "every tape, newest first")
        equal(store.list_tapes(TapeFilter()), [f, c, r], "TapeFilter()")
        equal(ids(author="analyst"), [f, r], "author")
        equal(ids(agent="analyst/search_agent"), [c], "agent")
        equal(
            (ids(agent="analyst"), ids(agent="analyst/x")), ([c, r], []), "agent (a full name, not a prefix)"
        )
        equal((ids(has_error=True), ids(has_error=False)), ([f], [c, r]), "has_error")
        equal((ids(tag="a"), ids(tag="b", author="analyst")), ([c, r], [f]), "tag")
        equal((ids(since=t_child), ids(until=t_child)), ([f, c], [r]), "since, until")
        equal(ids(since=t_child, until=t_child + 0.001), [c], "since and until")
        equal((ids(parent_id=r), ids(parent_id=c)), ([c], []), "parent_id")
        equal(store.list_tapes(limit=2), [f, c], "limit")
        equal(store.list_tapes(limit=2, offset=2), [r], "limit and offset")
        equal((store.list_tapes(offset=1), store.list_tapes(limit=0)), ([c, r], []), "offset, limit=0")
        equal(store.list_tapes(TapeFilter(tag="a"), limit=1, offset=1), [r], "a filter with a page")
        infos = store.list_tape_infos(TapeFilter(has_error=False), limit=5)
        equal([i.id for i in infos], [c, r], "list_tape_infos")
        assert all(isinstance(i, TapeInfo) for i in infos), "list_tape_infos must give TapeInfo"
        equal((infos[0].parent_id, infos[0].n_added_steps, infos[0].n_steps), (r, 1, 2), "a listed info")
        equal(store.count_tapes(), 3, "count_tapes()")
        equal(store.count_tapes(TapeFilter(tag="a", has_error=False)), 2, "count_tapes(tag, has_error)")
        equal(store.count_tapes(TapeFilter(agent="analyst/search_agent", since=t_child)), 1, "count by agent")


def check_ancestry_and_descendants(make_store: StoreFactory, tmp: Path) -> None:
    """``ancestry`` walks parents (nearest first, stopping at one not stored); ``descendants``
    is breadth-first, each level newest first."""
    root: Tape[Any, Any] = Tape(steps=[UserStep(content="r")])
    a = root.with_new_steps([UserStep(content="a")])
    b = root.with_new_steps([UserStep(content="b")])
    a1 = a.with_new_steps([UserStep(content="a1")])
    a1x = a1.with_new_steps([UserStep(content="a1x")])
    orphan: Tape[Any, Any] = Tape(steps=[UserStep(content="o")]).with_metadata(parent_id="not stored")
    with make_store() as store:
        for tape in (root, a, b, a1, a1x, orphan):
            store.save_tape(tape)
            store.flush()
            time.sleep(0.002)
        i = {name: t.metadata.id for name, t in dict(root=root, a=a, b=b, a1=a1, a1x=a1x).items()}
        equal([x.id for x in store.ancestry(i["a1x"])], [i["a1"], i["a"], i["root"]], "ancestry")
        equal((store.ancestry(i["root"]), store.ancestry(orphan.metadata.id)), ([], []), "no ancestry")
        equal(
            [x.id for x in store.descendants(i["root"])], [i["b"], i["a"], i["a1"], i["a1x"]], "descendants"
        )
        equal([x.id for x in store.descendants(i["a"])], [i["a1"], i["a1x"]], "descendants of a")
        equal(store.descendants(i["a1x"]), [], "descendants of a leaf")
