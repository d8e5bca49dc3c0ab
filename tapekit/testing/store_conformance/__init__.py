"""The conformance suite of :class:`~tapekit.store.TapeStore`: what every backend must do, as
plain check functions that any test runner (or none) can run.

A check takes a *store factory*, a function that returns a new, empty store each time it is
called (a check may open two, e.g. to import an export), and a scratch directory; it closes the
stores it opens and raises ``AssertionError`` naming what is wrong. The suite runs on
:class:`~tapekit.store.MemoryStore`, :class:`~tapekit.store.SQLiteStore` and
:class:`~tapekit.store.PostgresStore` in tapekit's own tests; run it on your backend:

.. code-block:: python

    import pytest
    from tapekit.testing.store_conformance import CHECKS

    @pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
    def test_my_store(check, tmp_path):
        check(lambda: MyStore(...), tmp_path)

or, without pytest, :func:`run_conformance` (``run_conformance(MyStore)`` raises one
``AssertionError`` listing every check that failed).

What is checked: saving and reading tapes (typed steps and context, every metadata field, a
save is a snapshot, a growing tape writes only its new steps, a save under a stored id must
extend the stored tape), tags, every :class:`TapeFilter`
field with paging and counting, ancestry, LLM calls (token ids included; long conversations
read back byte for byte) and totals, JSONL
export and import (round trip, subsets, a bad line stores nothing), the errors (a missing tape,
bad arguments, text no database can hold, a closed store) and one store shared by threads.
Several processes on one database, crashes and a database that refuses a committed row are the
backend's own business and are not checked here.

The checks live by concern in private modules (tapes, tags and queries, LLM calls, JSONL, errors,
a store's life cycle and threads, the tool-effect journal); each is importable from here by name.
"""

from __future__ import annotations

import tempfile
import traceback
from pathlib import Path

from tapekit.testing.store_conformance._calls import (
    check_every_step_leads_to_its_exact_llm_call,
    check_llm_calls_keep_every_field_and_token_ids,
    check_long_conversations_read_back_byte_identical,
    check_totals_by_agent_node_and_tape,
)
from tapekit.testing.store_conformance._errors import (
    check_a_missing_tape_is_a_clear_key_error,
    check_bad_arguments_are_refused,
    check_text_no_database_holds_is_refused_at_save,
)
from tapekit.testing.store_conformance._journal import check_the_tool_effect_journal
from tapekit.testing.store_conformance._jsonl import (
    check_a_bad_jsonl_line_is_named_and_the_import_stores_nothing,
    check_jsonl_export_of_some_tapes_with_or_without_calls,
    check_jsonl_round_trips_exactly_and_imports_once,
)
from tapekit.testing.store_conformance._lifecycle import (
    check_a_closed_store_refuses_and_flush_commits,
    check_one_store_is_shared_by_threads,
)
from tapekit.testing.store_conformance._queries import (
    check_ancestry_and_descendants,
    check_every_filter_of_list_tapes,
    check_tags_are_added_by_saves_and_changed_only_explicitly,
)
from tapekit.testing.store_conformance._support import Check, StoreFactory

# the typed tape the checks store, importable from here as before the split
from tapekit.testing.store_conformance._support import ConformanceBrief as ConformanceBrief
from tapekit.testing.store_conformance._support import ConformanceNote as ConformanceNote
from tapekit.testing.store_conformance._support import ConformanceTape as ConformanceTape
from tapekit.testing.store_conformance._tapes import (
    check_a_recorded_session_round_trips,
    check_a_save_stores_the_tape_as_it_was,
    check_a_save_under_a_stored_id_must_extend_the_stored_tape,
    check_a_typed_tape_keeps_its_context_step_classes_and_metadata,
    check_get_steps_pages_a_long_tape,
    check_saving_a_growing_tape_writes_only_new_steps,
)

__all__ = ["CHECKS", "Check", "StoreFactory", "run_conformance"]

CHECKS: tuple[Check, ...] = (
    check_a_recorded_session_round_trips,
    check_a_typed_tape_keeps_its_context_step_classes_and_metadata,
    check_a_save_stores_the_tape_as_it_was,
    check_saving_a_growing_tape_writes_only_new_steps,
    check_a_save_under_a_stored_id_must_extend_the_stored_tape,
    check_get_steps_pages_a_long_tape,
    check_tags_are_added_by_saves_and_changed_only_explicitly,
    check_every_filter_of_list_tapes,
    check_ancestry_and_descendants,
    check_every_step_leads_to_its_exact_llm_call,
    check_llm_calls_keep_every_field_and_token_ids,
    check_long_conversations_read_back_byte_identical,
    check_totals_by_agent_node_and_tape,
    check_jsonl_round_trips_exactly_and_imports_once,
    check_jsonl_export_of_some_tapes_with_or_without_calls,
    check_a_bad_jsonl_line_is_named_and_the_import_stores_nothing,
    check_a_missing_tape_is_a_clear_key_error,
    check_bad_arguments_are_refused,
    check_text_no_database_holds_is_refused_at_save,
    check_a_closed_store_refuses_and_flush_commits,
    check_one_store_is_shared_by_threads,
    check_the_tool_effect_journal,
)
"""Every check, in the order :func:`run_conformance` runs them."""


def run_conformance(make_store: StoreFactory, checks: tuple[Check, ...] = CHECKS) -> None:
    """Run ``checks`` (default: all) on stores made by ``make_store``, each in a new scratch
    directory; raise one ``AssertionError`` naming every check that failed, with its error.
    Needs no test runner: ``run_conformance(MyStore)`` in a script is enough."""
    failures: list[str] = []
    for check in checks:
        with tempfile.TemporaryDirectory(prefix="tapekit-conformance-") as scratch:
            try:
                check(make_store, Path(scratch))
            except Exception as e:
                where = "".join(traceback.format_exception(e)[-3:]).strip()
                failures.append(f"{check.__name__}: {type(e).__name__}: {e}\n    {where}")
    if failures:
        raise AssertionError(
            f"{len(failures)} of {len(checks)} store conformance checks failed:\n" + "\n".join(failures)
        )
