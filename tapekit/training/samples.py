"""Token-exact training samples from tapes (the schema in docs/training.md).

Each LLM-backed node run of a tape becomes tokens: the stored ids of its LLM call when the
backend recorded them (``source="ids"``: exactly what the model was fed and sampled), else its
prompt and output re-rendered with the training tokenizer's chat template
(``source="template"``). ``loss_mask`` is 1 only on the tokens the model sampled in a selected
node run. Consecutive calls of one agent whose prompt ids extend the previous prompt +
completion merge into one sample; where they do not, a :class:`Break` says where and why.

Entry points: :func:`make_samples` (a ``datasets.Dataset`` and its reports, in a
:class:`SampleSet`), :func:`iter_samples` (rows one by one, for large tape sets),
:func:`drift_report` (stored ids against the re-rendered ones).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tapekit.core import Tape
from tapekit.errors import TrainingError
from tapekit.llm.base import LLMCall
from tapekit.store.base import TapeStore
from tapekit.training._chat_tokenizer import ChatTokenizer

LLMCalls = TapeStore | Mapping[str, LLMCall] | Iterable[LLMCall] | Callable[[str], LLMCall | None] | None
"""Where the LLM calls behind tapes' steps are found by prompt id: a store, a ``{prompt_id:
LLMCall}`` mapping, the calls themselves, or a function of a prompt id (None: nowhere)."""

Reward = Callable[[Tape[Any, Any]], float] | str | None


@dataclass(frozen=True)
class SampleConfig:
    """What to make samples of. ``agents``/``nodes``: only these agents' (full names) and nodes'
    sampled tokens get loss (None: all); other nodes' tokens stay in merged samples, masked.
    ``reward``: a function of the tape or a key of ``tape.metadata.result`` (a dict);
    ``min_reward``: drop tapes below it. ``merge``: merge multi-turn calls. ``check_drift``:
    compare stored ids with the re-rendered ones (reports in :attr:`SampleSet.drift`)."""

    agents: tuple[str, ...] | None = None
    nodes: tuple[str, ...] | None = None
    min_reward: float | None = None
    merge: bool = True
    check_drift: bool = False

    def as_json(self) -> str:
        """The config as canonical JSON (part of the content hash)."""
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True)
class Break:
    """Where a multi-turn merge broke: the call at ``step_index`` (tape, agent, node) does not
    start with the previous prompt + completion ids; ``position`` is the first differing token
    and ``context`` the decoded text around it (previous | this call)."""

    tape_id: str
    step_index: int
    agent: str
    node: str
    position: int
    reason: str
    context: str


@dataclass(frozen=True)
class Drift:
    """Stored ids that the chat template does not reproduce: the first differing ``position``
    of prompt + completion, and the decoded text around it (stored | re-rendered)."""

    tape_id: str
    step_index: int
    agent: str
    node: str
    position: int
    context: str


@dataclass
class SampleSet:
    """The samples (``dataset``, a ``datasets.Dataset``) with the breaks and drift found, and a
    ``content_hash`` of the tapes, LLM calls, chat template and config that made them."""

    dataset: Any
    breaks: list[Break] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    content_hash: str = ""

    def save(self, path: str | Path) -> Path:
        """Write the rows to ``.parquet`` or ``.jsonl`` (byte-identical for the same samples; the
        content hash goes into the parquet schema metadata, or a ``.meta.json`` next to JSONL)."""
        path = Path(path)
        meta = {"tapekit.content_hash": self.content_hash}
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq  # type: ignore[import-untyped]

            table = self.dataset.data.table
            pq.write_table(table.replace_schema_metadata({**meta}), path)
        elif path.suffix == ".jsonl":
            with path.open("w") as f:
                for row in self.dataset:
                    f.write(json.dumps(row, sort_keys=True) + "\n")
            path.with_suffix(".meta.json").write_text(json.dumps(meta, sort_keys=True))
        else:
            raise TrainingError(f"cannot save samples to {path}: use a .parquet or .jsonl path")
        return path


def make_samples(
    tapes: Iterable[Tape[Any, Any]],
    agent: Any = None,
    *,
    llm_calls: LLMCalls = None,
    tokenizer: Any = None,
    reuse_with: Any = None,
    reward: Reward = None,
    config: SampleConfig | None = None,
    **options: Any,
) -> SampleSet:
    """Samples from ``tapes`` as a :class:`SampleSet` (its ``dataset`` in the training schema).

    ``llm_calls``: where the tapes' calls are (:data:`LLMCalls`: a store, a ``{prompt_id:
    LLMCall}`` mapping, a list of calls or a function of a prompt id); calls with token ids
    give ``source="ids"``.
    ``tokenizer``: the training tokenizer (HF tokenizer, ``TransformersLLM`` or
    ``LlamaCppLLM``); default: ``agent``'s LLM. ``reuse_with``: a student agent; each tape goes
    through ``reuse_with.reuse`` first and is rendered with the template (teacher → student).
    ``options`` are :class:`SampleConfig` fields (``nodes=("act",)``, ``min_reward=1.0``).
    Ids recorded with another tokenizer fingerprint are an error.
    """
    config = _config(config, options)
    tapes = list(tapes)
    state = _State()
    rows = list(_rows(tapes, agent, llm_calls, tokenizer, reuse_with, reward, config, state))
    from datasets import Dataset, Features, Sequence, Value

    features = _features(Features, Sequence, Value)
    if rows:
        dataset = Dataset.from_list(rows, features=features)
    else:  # (from_list cannot take its columns from no rows)
        dataset = Dataset.from_dict({name: [] for name in features}, features=features)
    digest = _content_hash(tapes, state, config)
    info = {"tapekit.content_hash": digest, "config": json.loads(config.as_json())}
    dataset.info.description = json.dumps(info)
    return SampleSet(dataset, state.breaks, state.drift, digest)


def iter_samples(
    tapes: Iterable[Tape[Any, Any]],
    agent: Any = None,
    *,
    llm_calls: LLMCalls = None,
    tokenizer: Any = None,
    reuse_with: Any = None,
    reward: Reward = None,
    config: SampleConfig | None = None,
    breaks: list[Break] | None = None,
    **options: Any,
) -> Iterator[dict[str, Any]]:
    """The rows of :func:`make_samples` one at a time, tapes read lazily (for tape sets larger
    than memory: ``datasets.Dataset.from_generator(lambda: iter_samples(...))``). Breaks are
    appended to ``breaks`` when given."""
    state = _State()
    for row in _rows(tapes, agent, llm_calls, tokenizer, reuse_with, reward, _config(config, options), state):
        if breaks is not None:
            breaks.extend(state.breaks)
            state.breaks.clear()
        yield row


def drift_report(tapes: Iterable[Tape[Any, Any]], llm_calls: LLMCalls, tokenizer: Any) -> list[Drift]:
    """Every LLM call with stored ids whose prompt + completion the tokenizer's chat template
    does not reproduce token for token (the fingerprint is not checked: this is the check)."""
    tok, lookup, out = ChatTokenizer(tokenizer), _lookup(llm_calls), []
    for tape in tapes:
        for run in _runs(tape):
            call = lookup(run.prompt_id)
            if call is not None and call.tokens is not None:
                drift = _drift(tok, tape, run, call)
                if drift is not None:
                    out.append(drift)
    return out


# -- internals ------------------------------------------------------------------------------


@dataclass
class _State:
    breaks: list[Break] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # JSON of the calls used, for the content hash
    template: str = ""


@dataclass(frozen=True)
class _Run:
    prompt_id: str
    index: int
    agent: str
    node: str


@dataclass
class _Open:
    row: dict[str, Any]
    context: list[int]  # prompt + completion ids so far


def _config(config: SampleConfig | None, options: dict[str, Any]) -> SampleConfig:
    values = asdict(config or SampleConfig())
    unknown = sorted(set(options) - set(values))
    if unknown:
        raise TrainingError(f"unknown sample options {unknown} (known: {sorted(values)})")
    values.update(options)
    for key in ("agents", "nodes"):
        if values[key] is not None:
            values[key] = (values[key],) if isinstance(values[key], str) else tuple(values[key])
    return SampleConfig(**values)


def _features(features: Any, sequence: Any, value: Any) -> Any:
    return features(
        {
            "input_ids": sequence(value("int32")),
            "loss_mask": sequence(value("int8")),
            "logprobs": sequence(value("float32")),
            "has_logprobs": value("bool"),
            "tape_id": value("string"),
            "agent": value("string"),
            "nodes": sequence(value("string")),
            "prompt_ids": sequence(value("string")),
            "step_index": value("int32"),
            "reward": value("float64"),
            "source": value("string"),
        }
    )


def _lookup(calls: LLMCalls) -> Callable[[str], LLMCall | None]:
    if calls is None:
        return lambda _: None
    if isinstance(calls, TapeStore):
        return calls.get_llm_call
    if isinstance(calls, Mapping):
        return calls.get
    if callable(calls):
        return calls
    table = {c.prompt.id: c for c in calls}
    return table.get


def _runs(tape: Tape[Any, Any]) -> list[_Run]:
    runs: dict[str, _Run] = {}
    for i, step in enumerate(tape.steps):
        m = step.metadata
        if m.agent and m.prompt_id and m.prompt_id not in runs:
            runs[m.prompt_id] = _Run(m.prompt_id, i, m.agent, m.node)
    return list(runs.values())


def _reward(tape: Tape[Any, Any], reward: Reward) -> float:
    if reward is None:
        return 0.0
    if callable(reward):
        return float(reward(tape))
    result = tape.metadata.result
    if not isinstance(result, dict) or reward not in result:
        raise TrainingError(f"tape {tape.metadata.id}: metadata.result has no {reward!r} (the reward key)")
    return float(result[reward])


def _rows(
    tapes: Iterable[Tape[Any, Any]],
    agent: Any,
    llm_calls: LLMCalls,
    tokenizer: Any,
    reuse_with: Any,
    reward: Reward,
    config: SampleConfig,
    state: _State,
) -> Iterator[dict[str, Any]]:
    if tokenizer is None:
        owner = reuse_with or agent
        if owner is None:
            raise TrainingError("make_samples needs a tokenizer, or an agent whose LLM gives one")
        llms = getattr(owner, "llms", None) or {}
        if not llms:
            raise TrainingError(f"agent {getattr(owner, 'name', owner)!r} has no LLM: pass tokenizer=")
        tokenizer = next(iter(llms.values()))
    tok = ChatTokenizer(tokenizer)
    state.template = tok.template
    lookup = _lookup(llm_calls)
    for tape in tapes:
        value = _reward(tape, reward)
        if config.min_reward is not None and value < config.min_reward:
            continue
        tape_lookup = lookup
        if reuse_with is not None:
            tape, calls = reuse_with.reuse(tape)
            table = {c.prompt.id: c.model_copy(update={"tokens": None}) for c in calls}
            tape_lookup = table.get
        yield from _tape_rows(tape, tape_lookup, tok, config, value, state)


def _tape_rows(
    tape: Tape[Any, Any],
    lookup: Callable[[str], LLMCall | None],
    tok: ChatTokenizer,
    config: SampleConfig,
    reward: float,
    state: _State,
) -> Iterator[dict[str, Any]]:
    open_: dict[str, _Open] = {}
    order: list[str] = []
    for run in _runs(tape):
        if config.agents is not None and run.agent not in config.agents:
            continue
        call = lookup(run.prompt_id)
        if call is None:
            continue
        state.calls.append(call.model_dump_json(exclude={"timestamp", "latency_s"}))
        prompt_ids, output_ids, logprobs, source = _tokens(tok, tape, run, call)
        if config.check_drift and source == "ids":
            drift = _drift(tok, tape, run, call)
            if drift is not None:
                state.drift.append(drift)
        selected = config.nodes is None or run.node in config.nodes
        current = open_.get(run.agent)
        if config.merge and current is not None:
            context = current.context
            if prompt_ids[: len(context)] == context:
                _extend(current, prompt_ids[len(context) :], output_ids, logprobs, selected, run)
                continue
            state.breaks.append(_break(tok, tape, run, context, prompt_ids))
        if current is not None:
            order.remove(run.agent)
            if any(current.row["loss_mask"]):
                yield current.row
        row = _row(tape, run, reward, source)
        open_[run.agent] = _Open(row, [])
        order.append(run.agent)
        _extend(open_[run.agent], prompt_ids, output_ids, logprobs, selected, run)
    for name in order:
        if any(open_[name].row["loss_mask"]):
            yield open_[name].row


def _tokens(
    tok: ChatTokenizer, tape: Tape[Any, Any], run: _Run, call: LLMCall
) -> tuple[list[int], list[int], list[float] | None, str]:
    trace = call.tokens
    if trace is not None:
        if trace.tokenizer != tok.fingerprint():
            raise TrainingError(
                f"tape {tape.metadata.id}, step {run.index} ({run.agent}.{run.node}): its token ids were "
                f"made by tokenizer {trace.tokenizer or '(unknown)'}, not the training tokenizer "
                f"{tok.fingerprint()}; train with the model that sampled them, or drop the ids "
                "(re-render with the template: reuse_with=the student agent)"
            )
        return list(trace.prompt_ids), list(trace.output_ids), trace.output_logprobs, "ids"
    prompt_ids, output_ids = tok.render_call(call.prompt.messages, call.output)
    return prompt_ids, output_ids, None, "template"


def _row(tape: Tape[Any, Any], run: _Run, reward: float, source: str) -> dict[str, Any]:
    return {
        "input_ids": [],
        "loss_mask": [],
        "logprobs": [],
        "has_logprobs": True,
        "tape_id": tape.metadata.id,
        "agent": run.agent,
        "nodes": [],
        "prompt_ids": [],
        "step_index": run.index,
        "reward": reward,
        "source": source,
    }


def _extend(
    current: _Open,
    context_ids: list[int],
    output_ids: list[int],
    logprobs: list[float] | None,
    selected: bool,
    run: _Run,
) -> None:
    row = current.row
    row["input_ids"] += context_ids + output_ids
    row["loss_mask"] += [0] * len(context_ids) + [int(selected)] * len(output_ids)
    row["logprobs"] += [0.0] * len(context_ids)
    if selected and logprobs is not None and len(logprobs) == len(output_ids):
        row["logprobs"] += [float(x) for x in logprobs]
    else:
        row["logprobs"] += [0.0] * len(output_ids)
        row["has_logprobs"] = row["has_logprobs"] and not selected
    row["prompt_ids"].append(run.prompt_id)
    if selected and run.node not in row["nodes"]:
        row["nodes"].append(run.node)
    current.context = current.context + context_ids + output_ids


def _first_difference(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _around(tok: ChatTokenizer, ids: list[int], at: int) -> str:
    return tok.decode(ids[max(0, at - 8) : at]) + "⟦" + tok.decode(ids[at : at + 8]) + "⟧"


def _break(
    tok: ChatTokenizer, tape: Tape[Any, Any], run: _Run, context: list[int], prompt: list[int]
) -> Break:
    at = _first_difference(context, prompt)
    if at == len(prompt):
        reason = "the prompt is shorter than the previous prompt + completion"
    else:
        reason = "the prompt does not start with the previous prompt + completion"
    text = f"previous: {_around(tok, context, at)!r} | this call: {_around(tok, prompt, at)!r}"
    return Break(tape.metadata.id, run.index, run.agent, run.node, at, reason, text)


def _drift(tok: ChatTokenizer, tape: Tape[Any, Any], run: _Run, call: LLMCall) -> Drift | None:
    assert call.tokens is not None
    stored = list(call.tokens.prompt_ids) + list(call.tokens.output_ids)
    prompt_ids, output_ids = tok.render_call(call.prompt.messages, call.output)
    rendered = prompt_ids + output_ids
    if call.tokens.finish_reason == "length":  # no end-of-turn was sampled
        rendered = rendered[: len(stored)]
    if stored == rendered:
        return None
    at = _first_difference(stored, rendered)
    text = f"stored: {_around(tok, stored, at)!r} | re-rendered: {_around(tok, rendered, at)!r}"
    return Drift(tape.metadata.id, run.index, run.agent, run.node, at, text)


def _content_hash(tapes: list[Tape[Any, Any]], state: _State, config: SampleConfig) -> str:
    digest = hashlib.sha256()
    for tape in tapes:
        digest.update(tape.model_dump_json().encode())
    for call in state.calls:
        digest.update(call.encode())
    digest.update(state.template.encode())
    digest.update(config.as_json().encode())
    return "sha256:" + digest.hexdigest()
