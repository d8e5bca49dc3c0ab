"""What tests of tapekit agents and stores need: deterministic stand-ins for models, small teams,
and the conformance suite every store backend passes.

- :class:`FunctionLLM` and :class:`ScriptedLLM` (re-exported from :mod:`tapekit.llm`): an LLM
  that is a function of the prompt, or a list of outputs played in order. They run the real code
  path (streaming events, usage, the LLM-call record), so a test sees what production sees.
- :mod:`tapekit.testing.analyst`: the paper's Figure 3 team (an analyst with tools that Calls a
  search helper) with its scripted brain; the project's demo and a realistic session fixture.
- :mod:`tapekit.testing.research`: a lead whose node makes a ``Fork`` of three concurrent
  searches, with a per-call latency to show the overlap.
- :mod:`tapekit.testing.mailer`: an assistant whose ``send_email`` tool waits for a person's
  approval (human in the loop).
- :mod:`tapekit.testing.react`: the ReAct loop most users write (the whole conversation as the
  prompt, one tool) on an instant scripted model: the workload of long-session tests and
  ``bench/peers.py``.
- :mod:`tapekit.testing.tiny`: a tiny causal LM and its tokenizer, built locally in seconds
  (nothing downloaded; the ``train`` extra): a model that trains and samples for real in a test
  (``make_tiny``, ``load_tiny``).
- :mod:`tapekit.testing.store_conformance`: what every :class:`~tapekit.store.TapeStore` backend
  must do, as check functions any test runner (or none) can run on a store factory; tapekit runs
  them on its memory, SQLite and PostgreSQL stores, and you can run them on your own backend.
- :mod:`tapekit.testing.postgres`: a throwaway PostgreSQL cluster (``TempPostgres``) from the
  server binaries on the machine, for tests and benchmarks of the PostgreSQL store.
- :mod:`tapekit.testing.chaos`: the crash-test harness (kill a stored session at every point
  that matters, resume it, count duplicate side effects and lost steps); ``PaymentsWorkload``.
- :mod:`tapekit.testing.payer`: an assistant whose ``once`` payment tool meets a bank that does
  not always answer (calls in doubt, for ``tapekit chat`` and the Studio).

Importing :mod:`tapekit` does not import this package; the teams and the suite load only when
named.
"""

from __future__ import annotations

from tapekit.llm.scripted import FunctionLLM, ScriptedLLM

__all__ = ["FunctionLLM", "ScriptedLLM"]
