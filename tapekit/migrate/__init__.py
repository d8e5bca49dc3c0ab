"""Migration from the reference TapeAgents package: its JSON and YAML tapes, its SQLite LLM-call
database and its training texts, read into a tapekit store (``tapekit import reference``).

See docs/migrate.md. The reference package itself is not needed.
"""

from tapekit.migrate.reference import (
    ImportReport,
    import_reference,
    read_llm_calls,
    read_reference_file,
    read_training_texts,
    reference_tape,
    to_reference_tape,
)
from tapekit.migrate.steps import (
    GenericAction,
    GenericObservation,
    GenericThought,
    ReferenceFormatError,
    from_reference_steps,
    to_reference_steps,
)

__all__ = [
    "GenericAction",
    "GenericObservation",
    "GenericThought",
    "ImportReport",
    "ReferenceFormatError",
    "from_reference_steps",
    "import_reference",
    "read_llm_calls",
    "read_reference_file",
    "read_training_texts",
    "reference_tape",
    "to_reference_steps",
    "to_reference_tape",
]
