"""TEMPORARY LOCAL STAND-IN for ``tapekit.training.samples`` (written by helper "samples").

Used only while that module is missing: it renders each student tape's conversation with the
model's chat template and marks the assistant turns (what the student writes, its end-of-turn
token included) with loss_mask 1, one merged multi-turn sample per tape, in the training
schema's ``input_ids`` / ``loss_mask`` columns. It does not read stored token ids, makes no
drift or break reports, and is not token-exact for tapes sampled by the model itself. Delete
it once ``tapekit.training.samples`` lands.
"""

from __future__ import annotations

from typing import Any

from tapekit import Tape
from tapekit.llm.llamacpp import plain_messages

from .agents import student_messages


def standin_samples(tapes: list[Tape[Any, Any]], tokenizer: Any) -> list[dict[str, Any]]:
    """One sample per tape: the whole conversation, loss only on the assistant turns."""
    rows = []
    eos = tokenizer.eos_token or ""
    for tape in tapes:
        messages = plain_messages(student_messages(tape))
        ids: list[int] = []
        mask: list[int] = []
        rendered = ""
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = str(
                tokenizer.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True)
            )
            if not prompt.startswith(rendered):
                raise ValueError(f"tape {tape.metadata.id}: the chat template does not extend turn by turn")
            context = tokenizer(prompt[len(rendered) :], add_special_tokens=False)["input_ids"]
            answer = tokenizer(message["content"] + eos, add_special_tokens=False)["input_ids"]
            ids += context + answer
            mask += [0] * len(context) + [1] * len(answer)
            rendered = prompt + message["content"] + eos
        rows.append(
            {
                "input_ids": ids,
                "loss_mask": mask,
                "tape_id": tape.metadata.id,
                "agent": "student",
                "source": "template",
            }
        )
    return rows
