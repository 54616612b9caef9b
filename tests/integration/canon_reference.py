# SPDX-License-Identifier: Apache-2.0
"""A second implementation of docs/canonical.md, over Python's json module: the canonical prefix
stream of a request body (completions, chat, responses), or the reason it is rejected. test_canon_differential.py compares it
byte for byte with router/body.c through tests/unit/router/body_driver --api."""
import xxhash

from test_body_differential import Pairs, reference

TOKEN_MAX = 4294967295
SEP_RECORD, SEP_UNIT, SEP_GROUP, SEP_FILE = b"\x1e", b"\x1f", b"\x1d", b"\x1c"
PART_TAGS = {"image_url": "image", "input_audio": "input_audio", "file": "file",
             "video_url": "video_url"}


class Reject(Exception):
    """A type error (KVG_ETYPE): the message names the field."""


def is_array(v):
    return isinstance(v, list) and not isinstance(v, Pairs)


def is_string(v):
    return isinstance(v, str)


def canonical_json(v):
    """No whitespace, member order and duplicates kept, strings minimally escaped (Python's
    ensure_ascii=False rule), numbers as their source text."""
    if isinstance(v, Pairs):
        return "{" + ",".join(canonical_json(k) + ":" + canonical_json(x) for k, x in v) + "}"
    if isinstance(v, list):
        return "[" + ",".join(canonical_json(x) for x in v) + "]"
    if isinstance(v, str):
        import json
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, tuple):  # ("int" | "float", source text)
        return v[1]
    return {True: "true", False: "false", None: "null"}[v]


def members(obj, keys, path):
    """{key: value} for the keys of obj listed in keys; a repeated one is a type error."""
    found = {}
    for k, v in obj:
        if k in keys:
            if k in found:
                raise Reject(f"{path}.{k}: appears more than once")
            found[k] = v
    return found


def token_id(v, path):
    if isinstance(v, tuple) and v[0] == "int":
        digits = v[1].lstrip("-")
        if len(digits) <= 10 and int(v[1]) >= 0 and int(v[1]) <= TOKEN_MAX:
            return int(v[1])
    raise Reject(f"{path}: must be a token id")


def completions(top):
    prompts = [v for k, v in top if k == "prompt"]
    if len(prompts) > 1:
        raise Reject("prompt: appears more than once")
    if not prompts or prompts[0] is None:
        return False, b""
    p = prompts[0]
    if is_string(p):
        return False, p.encode()
    if not is_array(p):
        raise Reject("prompt: must be a string or an array")
    if not p:
        raise Reject("prompt: must not be empty")
    first = p[0]
    if is_string(first):
        for i, x in enumerate(p):
            if not is_string(x):
                raise Reject(f"prompt[{i}]: must be a string")
        return False, first.encode()
    if isinstance(first, tuple):
        return True, [token_id(x, f"prompt[{i}]") for i, x in enumerate(p)]
    if is_array(first):
        lists = []
        for i, x in enumerate(p):
            if not is_array(x):
                raise Reject(f"prompt[{i}]: must be an array of token ids")
            if not x:
                raise Reject(f"prompt[{i}]: must not be empty")
            lists.append([token_id(t, f"prompt[{i}][{j}]") for j, t in enumerate(x)])
        return True, lists[0]
    raise Reject("prompt[0]: must be a string, a token id or an array of token ids")


def media(part, kind, path):
    obj = part.get(kind)
    if not isinstance(obj, Pairs):
        raise Reject(f"{path}.{kind}: must be an object")
    wanted = {"file": ("file_id", "file_data"), "input_audio": ("data",)}.get(kind, ("url",))
    refs = members(obj, wanted, f"{path}.{kind}")
    for name, v in refs.items():
        if not is_string(v):
            raise Reject(f"{path}.{kind}.{name}: must be a string")
    ref = next((refs[n] for n in wanted if n in refs), None)
    if ref is None:
        raise Reject(f"{path}.{kind}: missing")
    digest = xxhash.xxh3_128(ref.encode()).hexdigest()
    return SEP_FILE + PART_TAGS[kind].encode() + b":" + digest.encode() + SEP_FILE


def content(c, path):
    if c is None:
        return b""
    if is_string(c):
        return c.encode()
    if not is_array(c):
        raise Reject(f"{path}: must be a string, an array or null")
    out, prev_text = b"", False
    for j, part in enumerate(c):
        pp = f"{path}[{j}]"
        if not isinstance(part, Pairs):
            raise Reject(f"{pp}: must be an object")
        m = members(part, ("type", "text") + tuple(PART_TAGS), pp)
        kind = m.get("type")
        if not is_string(kind) or (kind != "text" and kind not in PART_TAGS):
            raise Reject(f"{pp}.type: missing, not a string or unknown")
        if kind not in m:
            raise Reject(f"{pp}.{kind}: missing")
        if kind == "text":
            if not is_string(m["text"]):
                raise Reject(f"{pp}.text: must be a string")
            out += (b"\n" if prev_text else b"") + m["text"].encode()
            prev_text = True
        else:
            out += media(m, kind, pp)
            prev_text = False
    return out


def message(msg, path):
    if not isinstance(msg, Pairs):
        raise Reject(f"{path}: must be an object")
    m = members(msg, ("role", "name", "content", "tool_calls", "tool_call_id"), path)
    if "role" not in m or not is_string(m["role"]):
        raise Reject(f"{path}.role: missing or not a string")
    out = SEP_RECORD + m["role"].encode() + SEP_UNIT
    for key in ("name", "tool_call_id"):
        if m.get(key) is not None and not is_string(m[key]):
            raise Reject(f"{path}.{key}: must be a string or null")
    if m.get("tool_calls") is not None and not is_array(m["tool_calls"]):
        raise Reject(f"{path}.tool_calls: must be an array or null")
    if m.get("name") is not None:
        out += b"name=" + m["name"].encode() + SEP_UNIT
    out += content(m.get("content"), f"{path}.content")
    if m.get("tool_calls") is not None:
        out += SEP_UNIT + b"tool_calls=" + canonical_json(m["tool_calls"]).encode()
    if m.get("tool_call_id") is not None:
        out += SEP_UNIT + b"tool_call_id=" + m["tool_call_id"].encode()
    return out + SEP_GROUP


def chat(top):
    msgs = [v for k, v in top if k == "messages"]
    tools = [v for k, v in top if k == "tools"]
    if len(msgs) > 1 or len(tools) > 1:
        raise Reject("messages or tools: appears more than once")
    out = b""
    if tools and tools[0] is not None:
        if not is_array(tools[0]):
            raise Reject("tools: must be an array or null")
        out += SEP_RECORD + b"tools" + SEP_UNIT + canonical_json(tools[0]).encode() + SEP_GROUP
    if msgs:
        if not is_array(msgs[0]):
            raise Reject("messages: must be an array")
        if not msgs[0]:
            raise Reject("messages: must not be empty")
        for i, msg in enumerate(msgs[0]):
            out += message(msg, f"messages[{i}]")
    return False, out


RESP_PART_TEXT = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
RESP_PART_KEYS = ("type", "text", "refusal", "image_url", "file_id", "file_data", "file_url",
                  "input_audio")


def resp_ref(m, names, pp, kind):
    ref = None
    for n in names:
        v = m.get(n)
        if v is None:
            continue
        if not is_string(v):
            raise Reject(f"{pp}.{n}: must be a string or null")
        if ref is None:
            ref = v
    if ref is None:
        raise Reject(f"{pp}: {kind} needs {names}")
    return ref


def resp_content(c, path):
    """A Responses message's content (or a function_call_output's output)."""
    if c is None:
        return b""
    if is_string(c):
        return c.encode()
    if not is_array(c):
        raise Reject(f"{path}: must be a string, an array or null")
    out, prev_text = b"", False
    for j, part in enumerate(c):
        pp = f"{path}[{j}]"
        if not isinstance(part, Pairs):
            raise Reject(f"{pp}: must be an object")
        m = members(part, RESP_PART_KEYS, pp)
        kind = m.get("type")
        if not is_string(kind):
            raise Reject(f"{pp}.type: missing or not a string")
        if kind in RESP_PART_TEXT:
            key = RESP_PART_TEXT[kind]
            if not is_string(m.get(key)):
                raise Reject(f"{pp}.{key}: missing or not a string")
            out += (b"\n" if prev_text else b"") + m[key].encode()
            prev_text = True
            continue
        if kind == "input_image":
            ref = resp_ref(m, ("image_url", "file_id"), pp, kind)
            tag = "image"
        elif kind == "input_file":
            ref = resp_ref(m, ("file_id", "file_data", "file_url"), pp, kind)
            tag = "file"
        elif kind == "input_audio":
            if "input_audio" not in m:
                raise Reject(f"{pp}.input_audio: missing")
            out += media(m, "input_audio", pp)
            prev_text = False
            continue
        else:
            raise Reject(f"{pp}.type: unknown part type")
        digest = xxhash.xxh3_128(ref.encode()).hexdigest()
        out += SEP_FILE + tag.encode() + b":" + digest.encode() + SEP_FILE
        prev_text = False
    return out


def json_string(s):
    return canonical_json(s).encode()


def resp_item(item, path):
    if not isinstance(item, Pairs):
        raise Reject(f"{path}: must be an object")
    m = members(item, ("type",), path)
    kind = m.get("type", "message")
    if not is_string(kind):
        raise Reject(f"{path}.type: must be a string")
    if kind == "message":
        m = members(item, ("role", "content"), path)
        if not is_string(m.get("role")):
            raise Reject(f"{path}.role: missing or not a string")
        return (SEP_RECORD + m["role"].encode() + SEP_UNIT +
                resp_content(m.get("content"), f"{path}.content") + SEP_GROUP)
    if kind == "function_call":
        m = members(item, ("call_id", "name", "arguments"), path)
        for k in ("call_id", "name", "arguments"):
            if not is_string(m.get(k)):
                raise Reject(f"{path}.{k}: missing or not a string")
        call = (b'[{"id":' + json_string(m["call_id"]) + b',"type":"function","function":{"name":' +
                json_string(m["name"]) + b',"arguments":' + json_string(m["arguments"]) + b"}}]")
        return SEP_RECORD + b"assistant" + SEP_UNIT + SEP_UNIT + b"tool_calls=" + call + SEP_GROUP
    if kind == "function_call_output":
        m = members(item, ("call_id", "output"), path)
        if not is_string(m.get("call_id")):
            raise Reject(f"{path}.call_id: missing or not a string")
        return (SEP_RECORD + b"tool" + SEP_UNIT + resp_content(m.get("output"), f"{path}.output") +
                SEP_UNIT + b"tool_call_id=" + m["call_id"].encode() + SEP_GROUP)
    return SEP_RECORD + b"item" + SEP_UNIT + canonical_json(item).encode() + SEP_GROUP


def responses(top):
    """POST /v1/responses: tools, then instructions (a system message), then input (a string is
    one user message; items are messages, function calls and their outputs, or other items)."""
    found = {}
    for k, v in top:
        if k in ("tools", "instructions", "input", "previous_response_id"):
            if k in found:
                raise Reject(f"{k}: appears more than once")
            found[k] = v
    prev = found.get("previous_response_id")
    if prev is not None and not is_string(prev):
        raise Reject("previous_response_id: must be a string or null")
    out = b""
    tools = found.get("tools")
    if tools is not None:
        if not is_array(tools):
            raise Reject("tools: must be an array or null")
        out += SEP_RECORD + b"tools" + SEP_UNIT + canonical_json(tools).encode() + SEP_GROUP
    ins = found.get("instructions")
    if ins is not None:
        if not is_string(ins):
            raise Reject("instructions: must be a string or null")
        out += SEP_RECORD + b"system" + SEP_UNIT + ins.encode() + SEP_GROUP
    inp = found.get("input")
    if is_string(inp):
        out += SEP_RECORD + b"user" + SEP_UNIT + inp.encode() + SEP_GROUP
    elif is_array(inp):
        if not inp:
            raise Reject("input: must not be empty")
        for i, item in enumerate(inp):
            out += resp_item(item, f"input[{i}]")
    elif inp is not None:
        raise Reject("input: must be a string, an array or null")
    return False, out


def canonical_stream(body: bytes, api: str):
    """('ok', (is_tokens, bytes or [ids])), or (verdict, None) with verdict one of
    test_body_differential.reference's errors or 'ETYPE'."""
    verdict, top = reference(body)
    if verdict != "ok":
        return verdict, None
    try:
        if api == "completions":
            return "ok", completions(top)
        if api == "chat":
            return "ok", chat(top)
        if api == "responses":
            return "ok", responses(top)
        return "ok", (False, b"")
    except Reject:
        return "ETYPE", None
