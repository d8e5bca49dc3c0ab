"""The compact accessibility tree: what a web agent reads, a few hundred characters per page.

:func:`flatten_axtree` turns Chromium's full accessibility tree (CDP
``Accessibility.getFullAXTree``) into one line per meaningful node::

    [14] button "Submit"
    [17] textbox "Username" value="ana" focused
    text "Click on the link"
    [21] generic "sed"

A line starts with the node's bid in brackets when the node can be acted on (a control, or a
``generic`` element the page listens to for clicks: the links of click-link, the rows of an
inbox, the labels of a tree, which BrowserGym's default flattening hides), then its role, its
name as a JSON string, and its states: ``value=`` (JSON), bare flags (``focused``, ``checked``,
``selected``, ``disabled``, ``required``, ``expanded``, ``collapsed``). ``StaticText`` is written
``text``; text that repeats its parent's name, ignored nodes and nameless containers are left out
(their children move up a level). Indentation is one space per level.

:func:`parse_axtree` reads those lines back (for programmatic policies and tests).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# roles that are always worth a bid: the agent acts on them
_CONTROL_ROLES = frozenset(
    {
        "button", "link", "textbox", "searchbox", "checkbox", "radio", "combobox", "listbox", "option",
        "menuitem", "menuitemcheckbox", "menuitemradio", "tab", "treeitem", "slider", "spinbutton",
        "switch", "cell", "gridcell", "row", "columnheader", "rowheader", "ListBoxOption",
        "MenuListOption", "PopUpButton", "DisclosureTriangle",
    }
)  # fmt: skip
# roles never printed (their children still are)
_SKIPPED_ROLES = frozenset({"none", "presentation", "InlineTextBox", "LineBreak", "RootWebArea", "WebArea"})
# containers printed only when they carry a name or a bid worth showing
_CONTAINER_ROLES = frozenset(
    {"generic", "group", "paragraph", "Section", "div", "list", "listitem", "Canvas"}
)
_ICON_ROLES = frozenset({"img", "image"})
_FLAGS = ("focused", "checked", "selected", "pressed", "disabled", "required")


@dataclass
class AXLine:
    """One line of a compact tree: ``bid`` ('' when none), ``role``, ``name``, ``depth``,
    ``props`` (``value`` and flags: ``{"checked": True}``), and the index of its ``parent``
    line (-1 at the top)."""

    role: str
    name: str = ""
    bid: str = ""
    depth: int = 0
    props: dict[str, Any] = field(default_factory=dict)
    parent: int = -1

    @property
    def value(self) -> str | None:
        """The ``value=`` of the line (a text field's contents), or None."""
        value = self.props.get("value")
        return None if value is None else str(value)


# <input> types whose inner fields (a date's month, day and year spin buttons, its picker
# button) Chromium builds in a user-agent shadow tree and describes with the input's own
# aria-description, which is where BrowserGym reads a bid: in its tree they carry the input's bid
_FIELD_INPUT_TYPES = frozenset({"date", "time", "datetime-local", "month", "week"})


@dataclass
class DomInfo:
    """What the DOM adds to the accessibility tree: the bid of each backend node id, the bids
    of elements that take clicks, a hint for each bid, ``("class", ...)`` or ``("id", ...)``
    (what a nameless icon shows is often only in its class: ``star``, ``trash``), the bids of
    date and time inputs (``field_hosts``: their inner fields take their bid) and every backend
    node id of the snapshot (``known``: a node not among them is in a user-agent shadow tree)."""

    bids: dict[int, str] = field(default_factory=dict)
    clickable: set[str] = field(default_factory=set)
    hints: dict[str, tuple[str, str]] = field(default_factory=dict)
    field_hosts: set[str] = field(default_factory=set)
    known: set[int] = field(default_factory=set)


def snapshot_bids(snapshot: Mapping[str, Any]) -> DomInfo:
    """Read a CDP ``DOMSnapshot.captureSnapshot`` (best with ``computedStyles=["cursor"]``).

    An element takes clicks when Chromium says it is clickable (a click listener, a control)
    or when the page gave it a pointer cursor its parent does not have (a delegated handler).
    """
    strings: list[str] = snapshot["strings"]
    info = DomInfo()
    try:
        bid_name = strings.index("bid")
    except ValueError:
        return info
    class_name = strings.index("class") if "class" in strings else -1
    id_name = strings.index("id") if "id" in strings else -1
    type_name = strings.index("type") if "type" in strings else -1
    for document in snapshot["documents"]:
        info.known.update(document["nodes"]["backendNodeId"])
    for document in snapshot["documents"][:1]:  # the main frame only (MiniWob has no iframes)
        nodes = document["nodes"]
        names = nodes.get("nodeName", [])
        index_bid: dict[int, str] = {}
        for i, (backend, attributes) in enumerate(
            zip(nodes["backendNodeId"], nodes["attributes"], strict=False)
        ):
            bid = css = ident = kind = None
            for j in range(0, len(attributes), 2):
                if attributes[j] == bid_name:
                    bid = strings[attributes[j + 1]]
                elif attributes[j] == class_name:
                    css = " ".join(strings[attributes[j + 1]].split()[:2])
                elif attributes[j] == id_name:
                    ident = strings[attributes[j + 1]].strip()
                elif attributes[j] == type_name:
                    kind = strings[attributes[j + 1]].strip().lower()
            if bid is not None:
                index_bid[i] = info.bids[backend] = bid
                if css:
                    info.hints[bid] = ("class", css)
                elif ident:
                    info.hints[bid] = ("id", ident)
                if kind in _FIELD_INPUT_TYPES and i < len(names) and strings[names[i]].upper() == "INPUT":
                    info.field_hosts.add(bid)
        for i in nodes.get("isClickable", {}).get("index", []):
            if i in index_bid:
                info.clickable.add(index_bid[i])
        layout = document.get("layout", {})
        cursor: dict[int, str] = {}
        for i, styles in zip(layout.get("nodeIndex", []), layout.get("styles", []), strict=False):
            if styles:
                cursor[i] = strings[styles[0]]
        parents = nodes["parentIndex"]
        for i, value in cursor.items():
            if value == "pointer" and i in index_bid and cursor.get(parents[i]) != "pointer":
                info.clickable.add(index_bid[i])
    return info


def _prop(node: Mapping[str, Any], name: str) -> Any:
    for prop in node.get("properties", ()):
        if prop.get("name") == name:
            return prop.get("value", {}).get("value")
    return None


def _text_of(node_id: str, nodes: Mapping[str, Mapping[str, Any]], limit: int = 200) -> str:
    """The text under a node (its StaticText descendants, joined), for nameless clickables."""
    parts: list[str] = []
    stack = [node_id]
    while stack and sum(len(p) for p in parts) < limit:
        node = nodes.get(stack.pop())
        if node is None:
            continue
        if node.get("role", {}).get("value") == "StaticText":
            parts.append(str(node.get("name", {}).get("value", "")))
            continue
        stack.extend(reversed(node.get("childIds", [])))
    return " ".join(" ".join(parts).split())[:limit]


def _holds_control(node_id: str, nodes: Mapping[str, Mapping[str, Any]]) -> bool:
    stack = list(nodes.get(node_id, {}).get("childIds", []))
    while stack:
        node = nodes.get(str(stack.pop()))
        if node is None:
            continue
        if not node.get("ignored") and node.get("role", {}).get("value") in _CONTROL_ROLES:
            return True
        stack.extend(node.get("childIds", []))
    return False


def flatten_axtree(
    ax_nodes: Iterable[Mapping[str, Any]],
    dom: DomInfo | None = None,
    *,
    max_chars: int | None = None,
) -> str:
    """The compact tree of CDP ``Accessibility.getFullAXTree`` nodes.

    ``dom`` (from :func:`snapshot_bids`) gives each node's bid by its ``backendDOMNodeId``, the
    elements that take clicks and the class hints; a node may instead carry its bid as
    ``browsergym_id`` (BrowserGym's extracted trees). A nameless ``generic`` that takes clicks
    keeps its bid and shows its text; a nameless element with a bid shows its ``class`` (the
    star and trash icons of an inbox), or its ``id`` when it has no class. ``max_chars`` cuts
    the text (at a line end) and says so.
    """
    nodes_list = list(ax_nodes)
    if not nodes_list:
        return ""
    nodes = {str(n["nodeId"]): n for n in nodes_list}
    dom = dom or DomInfo()
    lines: list[str] = []

    def bid_of(node: Mapping[str, Any], role: str, host: str) -> str:
        if "browsergym_id" in node:
            return str(node["browsergym_id"])
        backend = node.get("backendDOMNodeId")
        if not isinstance(backend, int):
            return ""
        if backend in dom.bids:
            return dom.bids[backend]
        # a control of a date or time input's user-agent shadow tree (a spin button, the
        # picker button): the input's bid, as in BrowserGym (see _FIELD_INPUT_TYPES)
        if host and backend not in dom.known and role in _CONTROL_ROLES:
            return host
        return ""

    def visit(node_id: str, depth: int, parent_name: str, host: str = "") -> None:
        node = nodes.get(node_id)
        if node is None:
            return
        role = str(node.get("role", {}).get("value", ""))
        children = [str(c) for c in node.get("childIds", []) if str(c) != node_id]
        backend = node.get("backendDOMNodeId")
        own = dom.bids.get(backend, "") if isinstance(backend, int) else ""
        if own:  # the nearest element with a bid: a date or time input's fields take its bid
            host = own if own in dom.field_hosts else ""
        if node.get("ignored") or role in _SKIPPED_ROLES:
            for child in children:
                visit(child, depth, parent_name, host)
            return
        name = " ".join(str(node.get("name", {}).get("value", "")).split())
        if role == "StaticText" or (role == "LabelText" and name):
            if name and name not in parent_name:
                lines.append(f"{' ' * depth}text {json.dumps(name, ensure_ascii=False)}")
            for child in children if role == "LabelText" else ():
                visit(child, depth, name, host)
            return
        bid = bid_of(node, role, host)
        takes_clicks = bool(bid) and bid in dom.clickable and role != "LabelText"
        if takes_clicks and role in _CONTAINER_ROLES and _holds_control(node_id, nodes):
            takes_clicks = False  # a wrapper (a dialog's title bar): its control is what to click
        show_bid = bool(bid) and (role in _CONTROL_ROLES or takes_clicks or role in _ICON_ROLES)
        if not name and role in _CONTAINER_ROLES and takes_clicks:
            name = _text_of(node_id, nodes)
        if not name and not show_bid and role not in _CONTROL_ROLES:  # a nameless container
            for child in children:
                visit(child, depth, parent_name, host)
            return
        parts = [f"[{bid}] {role}" if show_bid else role]
        if name or role in _CONTROL_ROLES:
            parts.append(json.dumps(name, ensure_ascii=False))
        elif show_bid and bid in dom.hints and (role in _ICON_ROLES or role in _CONTAINER_ROLES):
            key, hint = dom.hints[bid]
            parts.append(f"{key}={json.dumps(hint[:40], ensure_ascii=False)}")
        value = node.get("value", {}).get("value") if isinstance(node.get("value"), dict) else None
        if value not in (None, "") and value != name:
            parts.append(f"value={json.dumps(str(value), ensure_ascii=False)}")
        for flag in _FLAGS:
            state = _prop(node, flag)
            if state is True or state in ("true", "mixed"):
                parts.append(flag if state in (True, "true") else f"{flag}=mixed")
        expanded = _prop(node, "expanded")
        if expanded is not None:
            parts.append("expanded" if expanded else "collapsed")
        lines.append(" " * depth + " ".join(parts))
        shown = f"{name} {value}" if value not in (None, "") else name
        for child in children:
            visit(child, depth + 1, shown, host)

    visit(str(nodes_list[0]["nodeId"]), 0, "")
    text = "\n".join(lines)
    if max_chars is not None and len(text) > max_chars:
        cut = text.rfind("\n", 0, max_chars)
        text = text[: cut if cut > 0 else max_chars] + f"\n... ({len(text) - max_chars} more characters)"
    return text


_LINE = re.compile(r'^( *)(?:\[([A-Za-z0-9]+)\] )?(\S+)(?: ("(?:[^"\\]|\\.)*"))?(.*)$')
_PROP = re.compile(r'\s*([a-z_]+)(?:=("(?:[^"\\]|\\.)*"|\S+))?')


def parse_axtree(text: str) -> list[AXLine]:
    """The lines of a compact tree as :class:`AXLine` objects, in order, with parents linked.

    Lines that do not parse (the truncation note) are skipped.
    """
    out: list[AXLine] = []
    stack: list[int] = []  # indices of the open ancestors, by depth
    for raw in text.splitlines():
        match = _LINE.match(raw)
        if match is None or raw.startswith("..."):
            continue
        indent, bid, role, name, rest = match.groups()
        props: dict[str, Any] = {}
        for prop in _PROP.finditer(rest or ""):
            key, value = prop.group(1), prop.group(2)
            if value is None:
                props[key] = True
            elif value.startswith('"'):
                props[key] = json.loads(value)
            else:
                props[key] = value
        depth = len(indent)
        while len(stack) > depth:
            stack.pop()
        parent = stack[-1] if stack else -1
        line = AXLine(
            role=role,
            name=json.loads(name) if name else "",
            bid=bid or "",
            depth=depth,
            props=props,
            parent=parent,
        )
        out.append(line)
        while len(stack) < depth:  # a jump of more than one level: attach to the nearest line
            stack.append(parent)
        stack.append(len(out) - 1)
    return out
