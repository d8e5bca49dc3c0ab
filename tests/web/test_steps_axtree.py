"""The web steps, the call syntax, the compact tree and the split: no browser needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tapekit import Tape
from tapekit.web import (
    Click,
    Fill,
    GoBack,
    Noop,
    OpenTask,
    Press,
    Scroll,
    SelectOption,
    SendMsgToUser,
    WebObservation,
    WebThought,
    flatten_axtree,
    parse_action,
    parse_axtree,
)
from tapekit.web.axtree import DomInfo, snapshot_bids
from tapekit.web.miniwob import (
    HELD_OUT_TASKS,
    SPLIT,
    STEP_LIMITS,
    TRAIN_TASKS,
    episodes,
    eval_tasks,
    reward_scorer,
)

# --------------------------------------------------------------------------- actions


@pytest.mark.parametrize(
    "action",
    [
        Click(bid="12"),
        Fill(bid="7", text='say "hi"\nnow'),
        SelectOption(bid="3", options=["red", "blue"]),
        SelectOption(bid="3", options="Ana"),
        Press(bid="9", key_comb="Control+a"),
        Scroll(dx=0, dy=200.5),
        GoBack(),
        Noop(wait_ms=250),
        SendMsgToUser(text="done"),
        Fill(bid="7", text="it's a \\ path"),
        SelectOption(bid="3", options=["a'b", "c"]),
    ],
)
@pytest.mark.parametrize("quote", ['"', "'"])
def test_call_text_parses_back_to_the_same_action(action: object, quote: str) -> None:
    text = action.call(quote)  # type: ignore[attr-defined]
    parsed = parse_action(text)
    assert type(parsed) is type(action) and parsed.llm_dict() == action.llm_dict()  # type: ignore[attr-defined]


def test_single_quoted_call_text_and_a_bad_quote() -> None:
    assert Fill(bid="7", text="it's").call("'") == "fill('7', 'it\\'s')"
    assert SelectOption(bid="3", options=["a", "b"]).call("'") == "select_option('3', ['a', 'b'])"
    with pytest.raises(ValueError, match="quote must be"):
        Click(bid="1").call("`")


def test_parse_accepts_browsergym_spellings() -> None:
    def same(text: str, action: object) -> bool:
        return parse_action(text).llm_dict() == action.llm_dict()  # type: ignore[attr-defined]

    assert same("click('12')", Click(bid="12"))
    assert same("click(12)", Click(bid="12"))
    assert same("fill('4', value='Ana')", Fill(bid="4", text="Ana"))
    assert same("scroll(delta_x=0, delta_y=-50)", Scroll(dx=0, dy=-50))
    assert same("noop()", Noop())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("click", "not an action call"),
        ("click('1'", "not an action call"),
        ("os.system('x')", "not an action call"),
        ("drag('1', '2')", "unknown action 'drag'"),
        ("click('1', '2')", "takes 1 arguments"),
        ("fill('1')", "fill:"),
        ("click(bid=x)", "arguments must be literals"),
        ("click(target='1')", "has no argument 'target'"),
        # an argument given twice is an error, never the last value silently (issue 46, item 3)
        ("click('1', bid='2')", "click got argument 'bid' twice"),
        ("fill('1', 'a', value='b')", r"fill got argument 'value \(= text\)' twice"),
        ("fill('1', text='a', value='b')", r"fill got argument 'value \(= text\)' twice"),
        ("scroll(0, 1, dx=3)", "scroll got argument 'dx' twice"),
    ],
)
def test_parse_errors_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_action(text)


def test_web_tapes_round_trip_through_json() -> None:
    obs = WebObservation(
        task="miniwob.click-button", seed=3, episode_id="e1", goal="Click", axtree='[1] button "Ok"', step=0
    )
    tape = Tape(
        steps=[OpenTask(task="miniwob.click-button", seed=3), obs, WebThought(text="why"), Click(bid="1")]
    )
    again = Tape.model_validate_json(tape.model_dump_json())
    assert [s.model_dump() for s in again.steps] == [s.model_dump() for s in tape.steps]
    assert "function" not in Click(bid="1").llm_dict()  # class-level metadata stays off the tape


# --------------------------------------------------------------------------- the compact tree


def _node(node_id: int, role: str, name: str = "", children: tuple[int, ...] = (), **extra: object) -> dict:
    node: dict = {"nodeId": str(node_id), "role": {"value": role}, "childIds": [str(c) for c in children]}
    if name:
        node["name"] = {"value": name}
    node["backendDOMNodeId"] = 100 + node_id
    node.update(extra)
    return node


TREE = [
    _node(1, "RootWebArea", "Task", (2,)),
    _node(2, "generic", "", (3, 5, 7, 9, 12)),
    _node(3, "generic", "", (4,)),  # a clickable link made of a span: keeps its bid
    _node(4, "StaticText", "nam"),
    _node(5, "button", "Submit", (6,)),
    _node(6, "StaticText", "Submit"),  # repeats its parent's name: left out
    _node(
        7,
        "textbox",
        "",
        (8,),
        value={"value": "ana"},
        properties=[{"name": "focused", "value": {"value": True}}],
    ),
    _node(8, "StaticText", "ana"),
    _node(9, "generic", "", (10,), ignored=True),  # ignored: its children move up
    _node(10, "checkbox", "USa", properties=[{"name": "checked", "value": {"value": "true"}}]),
    _node(12, "image", ""),  # a nameless icon: shows its class
]
DOM = DomInfo(
    bids={100 + i: str(i) for i in (2, 3, 5, 7, 10, 12)},
    clickable={"3", "12"},
    hints={"12": ("class", "star"), "2": ("id", "area")},
)


def test_flatten_keeps_clickable_generics_and_drops_noise() -> None:
    text = flatten_axtree(TREE, DOM)
    assert text.splitlines() == [
        '[3] generic "nam"',
        '[5] button "Submit"',
        '[7] textbox "" value="ana" focused',
        '[10] checkbox "USa" checked',
        '[12] image class="star"',
    ]


def test_flatten_without_the_dom_shows_no_bids_but_keeps_text() -> None:
    text = flatten_axtree(TREE)
    assert "[" not in text
    assert 'text "nam"' in text and 'button "Submit"' in text


def test_flatten_cuts_long_trees_and_says_so() -> None:
    text = flatten_axtree(TREE, DOM, max_chars=30)
    assert text.endswith("more characters)")
    assert len(text.splitlines()[0]) <= 30


def test_parse_axtree_reads_lines_back_with_parents() -> None:
    lines = parse_axtree(
        '[1] dialog\n [2] button "Close" focused\n text "a \\"b\\""\n[4] textbox "" value="x y"'
    )
    assert [(x.bid, x.role, x.name, x.parent) for x in lines] == [
        ("1", "dialog", "", -1),
        ("2", "button", "Close", 0),
        ("", "text", 'a "b"', 0),
        ("4", "textbox", "", -1),
    ]
    assert lines[1].props == {"focused": True}
    assert lines[3].value == "x y"


def test_snapshot_bids_reads_bids_clicks_and_pointer_cursors() -> None:
    strings = ["bid", "0", "1", "2", "class", "row", "pointer", "auto"]
    snapshot = {
        "strings": strings,
        "documents": [
            {
                "nodes": {
                    "backendNodeId": [10, 11, 12],
                    "parentIndex": [-1, 0, 1],
                    "attributes": [[0, 1], [0, 2, 4, 5], [0, 3]],
                    "isClickable": {"index": [0]},
                },
                # node 1 sets a pointer cursor (a delegated handler); node 2 inherits it
                "layout": {"nodeIndex": [0, 1, 2], "styles": [[7], [6], [6]]},
            }
        ],
    }
    dom = snapshot_bids(snapshot)
    assert dom.bids == {10: "0", 11: "1", 12: "2"}
    assert dom.clickable == {"0", "1"}
    assert dom.hints == {"1": ("class", "row")}


def test_a_date_inputs_fields_take_its_bid_as_in_browsergym() -> None:
    """The month/day/year spin buttons and the picker button of a date input live in Chromium's
    user-agent shadow tree (not in the DOM snapshot): they show the input's bid, as BrowserGym's
    tree does; its wrappers stay nameless containers, and a text input's inner nodes get none."""
    strings = ["bid", "14", "15", "16", "type", "date", "INPUT", "BUTTON", "text"]
    snapshot = {
        "strings": strings,
        "documents": [
            {
                "nodes": {
                    "backendNodeId": [114, 115, 116],
                    "parentIndex": [-1, -1, -1],
                    "nodeName": [6, 7, 6],
                    "attributes": [[0, 1, 4, 5], [0, 2], [0, 3, 4, 8]],
                    "isClickable": {"index": [0, 1, 2]},
                },
            }
        ],
    }
    dom = snapshot_bids(snapshot)
    assert dom.field_hosts == {"14"} and dom.known == {114, 115, 116}
    tree = [
        _node(1, "RootWebArea", "Task", (14, 15, 16)),
        _node(14, "Date", "", (20,)),
        _node(20, "generic", "", (21, 22, 23, 24)),  # the shadow tree's wrapper: no bid
        _node(21, "spinbutton", "Month", value={"value": "0"}),
        _node(22, "spinbutton", "Day", value={"value": "0"}),
        _node(23, "spinbutton", "Year", value={"value": "0"}),
        _node(24, "button", "Show date picker"),
        _node(15, "button", "Submit"),
        _node(16, "textbox", "", (30,)),
        _node(30, "button", "inner"),  # not in the snapshot, but the host is no date input
    ]
    assert flatten_axtree(tree, dom).splitlines() == [
        "[14] Date",
        ' [14] spinbutton "Month" value="0"',
        ' [14] spinbutton "Day" value="0"',
        ' [14] spinbutton "Year" value="0"',
        ' [14] button "Show date picker"',
        '[15] button "Submit"',
        '[16] textbox ""',
        ' button "inner"',
    ]


def test_fill_problem_says_when_a_field_did_not_take_the_text() -> None:
    """What the environment reports after a fill (issue 46, item 14), from the field's value."""
    from tapekit.web.environment import fill_problem

    date = fill_problem("11/07/2016", {"value": "", "type": "date", "maxLength": -1})
    assert date == (
        'the date field holds "", not the text given; a date input takes YYYY-MM-DD (e.g. 2016-11-07)'
    )
    assert fill_problem("2016-11-07", {"value": "2016-11-07", "type": "date", "maxLength": -1}) == ""
    assert "at most 3 characters" in fill_problem("abcdef", {"value": "abc", "type": "text", "maxLength": 3})
    # the browser's own clean-up is no problem
    assert fill_problem("a\nb", {"value": "ab", "type": "text", "maxLength": -1}) == ""
    assert fill_problem(" a@b.c ", {"value": "a@b.c", "type": "email", "maxLength": -1}) == ""
    assert fill_problem("a\r\nb", {"value": "a\nb", "type": "textarea", "maxLength": -1}) == ""
    assert fill_problem("x", None) == ""  # a contenteditable: not checked
    assert 'holds "x"' in fill_problem("y", {"value": "x", "type": "textarea", "maxLength": -1})


# --------------------------------------------------------------------------- the split


def test_split_is_disjoint_and_sized_for_the_study() -> None:
    train, valid, test = (set(r) for r in (SPLIT.train_seeds, SPLIT.validation_seeds, SPLIT.test_seeds))
    assert not (train & valid) and not (train & test) and not (valid & test)
    assert not set(TRAIN_TASKS) & set(HELD_OUT_TASKS)
    assert len(episodes("test", tasks=TRAIN_TASKS[:4])) >= 160  # the learning study's test pairs, 4 tasks
    with pytest.raises(ValueError, match="has 20 seeds per task, 21 were asked for"):
        episodes("validation", n_seeds=21)  # never silently fewer episodes than asked for
    n_test = len(SPLIT.test_seeds)
    assert len(episodes("test", n_seeds=n_test, tasks=["click-button"])) == n_test
    assert set(STEP_LIMITS) >= set(TRAIN_TASKS) | set(HELD_OUT_TASKS)
    assert {t for t, _ in episodes("held_out")} == set(HELD_OUT_TASKS)


def test_split_tasks_exist_in_the_wheel() -> None:
    pytest.importorskip("miniwob")
    from tapekit.web.miniwob import all_tasks

    assert set(TRAIN_TASKS) | set(HELD_OUT_TASKS) <= set(all_tasks())


def test_eval_tasks_start_from_open_task() -> None:
    tasks = eval_tasks("validation", n_seeds=2, tasks=["click-button"])
    assert [t.id for t in tasks] == ["click-button/100000", "click-button/100001"]
    start = tasks[0].start_tape()
    assert [s.llm_dict() for s in start.steps] == [
        OpenTask(task="miniwob.click-button", seed=100000).llm_dict()
    ]
    assert tasks[0].metadata == {"seed": 100000, "split": "validation"}


def test_any_miniwob_task_and_any_seed_can_be_evaluated_marked_outside_the_split() -> None:
    """Issue 46, item 15a: tasks the split does not name and seeds outside it, without building
    tasks by hand; an episode outside the split says so (``split`` None)."""
    pytest.importorskip("miniwob")
    tasks = eval_tasks(tasks=["enter-date", "miniwob.click-widget"], seeds=range(300_000, 300_002))
    assert [t.id for t in tasks] == [
        "enter-date/300000",
        "enter-date/300001",
        "click-widget/300000",
        "click-widget/300001",
    ]
    assert all(t.metadata["split"] is None for t in tasks)
    start = tasks[0].start_tape().steps[0]
    assert start.llm_dict() == OpenTask(task="miniwob.enter-date", seed=300000).llm_dict()
    # a task outside the split on a part's seeds, and a split task on explicit seeds
    assert episodes("validation", 1, ["grid-coordinate"]) == [("grid-coordinate", 100_000)]
    marked = eval_tasks(tasks=["click-button"], seeds=[5, 100_001, 200_000, 300_000])
    assert [t.metadata["split"] for t in marked] == ["train", "validation", "test", None]
    assert eval_tasks("test", 1, ["click-button-sequence"])[0].metadata["split"] == "held_out"
    with pytest.raises(ValueError, match=r"'enter-dat' is not a MiniWob\+\+ task .*did you mean enter-date"):
        eval_tasks(tasks=["enter-dat"], seeds=[1])
    with pytest.raises(ValueError, match=r"either a split .* or seeds"):
        episodes("test", seeds=[1])


def test_reward_scorer_reads_the_last_observation() -> None:
    obs = WebObservation(task="t", seed=1, episode_id="e", goal="g", reward=1.0, done=True)
    assert reward_scorer(Tape(steps=[obs])).passed
    failed = obs.model_copy(update={"reward": 0.0, "last_action_error": "boom"})
    score = reward_scorer(Tape(steps=[obs, failed]))
    assert not score.passed and score.feedback == "boom"
    assert not reward_scorer(Tape()).passed


def test_raw_reward_reads_minwobs_raw_figure_beside_the_binary_one() -> None:
    from tapekit.web.miniwob import raw_reward, raw_reward_mean

    partial = WebObservation(
        task="t", seed=1, episode_id="e", goal="g", reward=1.0, done=True, info={"raw_reward": 0.2}
    )
    assert reward_scorer(Tape(steps=[partial])).value == 1.0 and raw_reward(Tape(steps=[partial])) == 0.2
    failed = partial.model_copy(update={"reward": 0.0, "info": {"raw_reward": -1}})
    assert raw_reward(Tape(steps=[partial, failed])) == -1.0
    assert raw_reward(Tape()) is None
    assert raw_reward_mean([Tape(steps=[partial]), Tape(steps=[failed]), Tape()]) == pytest.approx(-0.4)
    assert raw_reward_mean([]) is None


# --------------------------------------------------------------------------- lazy imports


def test_import_tapekit_does_not_import_the_browser() -> None:
    code = (
        "import sys, tapekit\n"
        "assert 'tapekit.web' not in sys.modules, 'tapekit imported tapekit.web'\n"
        "import tapekit.web\n"
        "assert 'playwright' not in sys.modules, 'tapekit.web imported playwright'\n"
        "assert 'miniwob' not in sys.modules, 'tapekit.web imported miniwob'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
