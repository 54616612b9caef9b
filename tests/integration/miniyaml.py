# SPDX-License-Identifier: Apache-2.0
"""A small YAML reader for the subset deploy/kubernetes uses, for machines without PyYAML:
documents split by `---`, block mappings and sequences by indentation, flow mappings and
sequences on one line (`{a: b}`, `["x", "y"]`), single- and double-quoted strings, integers,
booleans, null, `|` literal blocks and `#` comments. Anything else raises ValueError rather
than being read differently from PyYAML (test_deploy.py checks both agree where both exist)."""
import json
import re

_INT = re.compile(r"^-?[0-9]+$")


def _scalar(text):
    t = text.strip()
    if t == "" or t in ("~", "null"):
        return None
    if t in ("true", "false"):
        return t == "true"
    if _INT.match(t):
        return int(t)
    if t[0] == '"':
        return json.loads(t)
    if t[0] == "'":
        if not t.endswith("'"):
            raise ValueError(f"unterminated string: {t}")
        return t[1:-1].replace("''", "'")
    if t[0] in "{[":
        return _flow(t)
    if t[0] in "&*!|>%@`":
        raise ValueError(f"unsupported YAML: {t}")
    return t


def _split_flow(body):
    """Split 'a: b, c: [d, e]' at top-level commas."""
    parts, depth, quote, cur = [], 0, None, ""
    for ch in body:
        if quote:
            cur += ch
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts]


def _flow(t):
    if t[0] == "[":
        if not t.endswith("]"):
            raise ValueError(f"unterminated flow sequence: {t}")
        return [_scalar(p) for p in _split_flow(t[1:-1])]
    if not t.endswith("}"):
        raise ValueError(f"unterminated flow mapping: {t}")
    out = {}
    for p in _split_flow(t[1:-1]):
        k, sep, v = _key_value(p)
        if not sep:
            raise ValueError(f"not key: value: {p}")
        out[k] = _scalar(v)
    return out


def _key_value(line):
    """'key: value' -> (key, ':', value); a colon inside quotes or flow brackets is not one."""
    m = re.match(r'^("(?:[^"\\]|\\.)*"|\'[^\']*\'|[^:{}\[\]"\'#]+?):(\s+|$)(.*)$', line)
    if not m:
        return line, "", ""
    return _scalar(m.group(1)), ":", m.group(3)


def _strip_comment(line):
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


class _Lines:
    def __init__(self, lines):
        self.lines = lines
        self.i = 0

    def peek(self):
        while self.i < len(self.lines):
            raw = self.lines[self.i]
            s = _strip_comment(raw)
            if s.strip():
                return len(s) - len(s.lstrip(" ")), s.strip()
            self.i += 1
        return None

    def literal(self, parent_indent):
        """The lines of a | block (more indented than its key), newline-terminated."""
        out, indent = [], None
        while self.i < len(self.lines):
            raw = self.lines[self.i].rstrip("\n")
            if raw.strip() == "":
                out.append("")
                self.i += 1
                continue
            ind = len(raw) - len(raw.lstrip(" "))
            if ind <= parent_indent:
                break
            indent = ind if indent is None else indent
            out.append(raw[indent:])
            self.i += 1
        while out and out[-1] == "":
            out.pop()
        return "\n".join(out) + "\n"


def _value(lines, rest, indent):
    """The value after 'key:' (rest) or after '- ' at indent."""
    if rest.strip() in ("|", "|-"):
        text = lines.literal(indent)
        return text.rstrip("\n") if rest.strip() == "|-" else text
    if rest.strip():
        return _scalar(rest)
    nxt = lines.peek()
    if nxt is None or nxt[0] < indent or (nxt[0] == indent and not nxt[1].startswith("- ")):
        return None
    return _block(lines, nxt[0])


def _block(lines, indent):
    first = lines.peek()
    if first[1].startswith("- ") or first[1] == "-":
        out = []
        while True:
            nxt = lines.peek()
            if nxt is None or nxt[0] != indent or not (nxt[1].startswith("- ") or nxt[1] == "-"):
                return out
            lines.i += 1
            item = nxt[1][2:] if nxt[1] != "-" else ""
            k, sep, v = _key_value(item)
            if sep and not item.startswith(("{", "[", '"', "'")):
                # "- key: value" opens a mapping whose keys sit at indent + 2.
                lines.lines.insert(lines.i, " " * (indent + 2) + item)
                out.append(_block(lines, indent + 2))
            else:
                out.append(_value(lines, item, indent))
    out = {}
    while True:
        nxt = lines.peek()
        if nxt is None or nxt[0] < indent:
            return out
        if nxt[0] > indent:
            raise ValueError(f"unexpected indentation at line {lines.i + 1}: {nxt[1]}")
        if nxt[1].startswith("- "):
            return out
        k, sep, v = _key_value(nxt[1])
        if not sep:
            raise ValueError(f"not key: value at line {lines.i + 1}: {nxt[1]}")
        lines.i += 1
        out[k] = _value(lines, v, indent)


def load_all(text):
    """The documents of text, as PyYAML's safe_load_all would give them."""
    docs, cur = [], []
    for line in text.splitlines():
        if line.rstrip() == "---":
            docs.append(cur)
            cur = []
        else:
            cur.append(line)
    docs.append(cur)
    out = []
    for d in docs:
        lines = _Lines(d)
        if lines.peek() is None:
            continue
        out.append(_block(lines, lines.peek()[0]))
        if lines.peek() is not None:
            raise ValueError(f"trailing content at line {lines.i + 1}")
    return out
