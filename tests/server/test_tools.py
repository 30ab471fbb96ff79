"""Tool calling through the openai client against barata serve on
Qwen2.5-Coder-0.5B-Instruct, whose own chat template (rendered by barata's
Jinja interpreter) writes Hermes <tool_call> blocks: the round trip (a call,
a `tool` message with its result, a final answer), streamed and not;
tool_choice "required" always yields a parseable call whose arguments
validate against the tool's parameter schema; a named function is the one
called; and the 400s (a tool_choice naming no tool, malformed tools, tools
on a template without a tool syntax)."""
import json
import os

import jsonschema
import openai

from common import ROOT, SMOLLM2, Server, check

QWEN = os.path.join(ROOT, "models", "Qwen2.5-Coder-0.5B-Instruct.gguf")

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 40},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
        "required": ["timezone"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now.",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a timezone now.",
                                      "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


def valid_call(call):
    try:
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
        return call.type == "function" and call.id.startswith("call_")
    except (ValueError, KeyError, jsonschema.ValidationError):
        return False


def streamed(c, **kw):
    """A streamed reply put together: content, tool calls by index, finish_reason."""
    content, calls, finish = "", {}, None
    for ch in c.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            e = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            e["id"] = tc.id or e["id"]
            if tc.function:
                e["name"] += tc.function.name or ""
                e["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


with Server("--slots", "2", "-t", "2", "-c", "4096", model=QWEN) as s:
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    user = {"role": "user", "content": "What is the weather in Lisbon right now, in celsius?"}

    # The round trip, tool_choice "required": the call, its result, the answer.
    r = c.chat.completions.create(model="x", messages=[user], tools=TOOLS, tool_choice="required",
                                  max_tokens=96, temperature=0)
    ch = r.choices[0]
    check(ch.finish_reason == "tool_calls" and ch.message.tool_calls and len(ch.message.tool_calls) == 1,
          f"required: finish_reason tool_calls with one call: {ch}")
    call = ch.message.tool_calls[0]
    check(call.function.name == "get_weather" and valid_call(call),
          f"the call is get_weather and its arguments validate: {call.function.arguments}")
    args = json.loads(call.function.arguments)
    check("lisb" in args["city"].lower(), f"the model's arguments name the city: {args}")
    history = [user, {"role": "assistant", "content": None,
                      "tool_calls": [{"id": call.id, "type": "function",
                                      "function": {"name": call.function.name,
                                                   "arguments": call.function.arguments}}]},
               {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 17})}]
    final = c.chat.completions.create(model="x", messages=history, tools=TOOLS, max_tokens=64, temperature=0)
    f = final.choices[0]
    check(f.finish_reason in ("stop", "tool_calls") and (f.message.content or f.message.tool_calls),
          f"after the tool message the model answers: {f.message}")
    if f.finish_reason == "stop":
        check("17" in f.message.content, f"the answer uses the tool's result: {f.message.content!r}")
    # tool_choice "none" on the same history: text only, never tool_calls.
    none = c.chat.completions.create(model="x", messages=history, tools=TOOLS, tool_choice="none",
                                     max_tokens=48, temperature=0)
    check(none.choices[0].message.tool_calls is None and none.choices[0].finish_reason != "tool_calls",
          "tool_choice none: no tool_calls in the reply")

    # The same call streamed: OpenAI's delta.tool_calls, equal to the plain reply.
    content, calls, finish = streamed(c, model="x", messages=[user], tools=TOOLS, tool_choice="required",
                                      max_tokens=96, temperature=0)
    check(finish == "tool_calls" and len(calls) == 1 and calls[0]["name"] == call.function.name
          and json.loads(calls[0]["arguments"]) == args and calls[0]["id"].startswith("call_"),
          f"streamed: the same call in delta.tool_calls ({calls}, {finish})")
    check(content.strip() == (ch.message.content or "").strip(), f"streamed content equals the plain: {content!r}")
    content, _, finish = streamed(c, model="x", messages=history, tools=TOOLS, max_tokens=64, temperature=0)
    if f.finish_reason == "stop":
        check(finish == "stop" and content == f.message.content, "the streamed final answer equals the plain one")

    # "required" always gives a parseable, valid call: prompts x samplings.
    prompts = ["What time is it in Tokyo?", "Weather in Oslo please, fahrenheit.",
               "Tell me a joke.", "Is it raining in Paris?"]
    ok = n = 0
    for p in prompts:
        for samp in (dict(temperature=0), dict(temperature=1.0, seed=3), dict(temperature=1.2, seed=9)):
            r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": p}], tools=TOOLS,
                                          tool_choice="required", max_tokens=96, **samp)
            n += 1
            good = (r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.tool_calls
                    and all(valid_call(t) for t in r.choices[0].message.tool_calls))
            ok += bool(good)
            if not good:
                print(f"INVALID ({p!r}, {samp}): {r.choices[0]}")
    check(ok == n, f"tool_choice required: {ok} of {n} replies are valid calls")

    # A named function is the one called, even where the question asks for another.
    r = c.chat.completions.create(model="x", messages=[user], tools=TOOLS, max_tokens=96, temperature=0,
                                  tool_choice={"type": "function", "function": {"name": "get_time"}})
    t = r.choices[0].message.tool_calls
    check(t and t[0].function.name == "get_time" and valid_call(t[0]), f"a named function: {t}")

    # "auto": whatever the model chose, a call it made parses and validates.
    r = c.chat.completions.create(model="x", messages=[user], tools=TOOLS, max_tokens=96, temperature=0)
    a = r.choices[0]
    check(a.finish_reason == "stop" and a.message.content and not a.message.tool_calls
          or a.finish_reason == "tool_calls" and all(valid_call(x) for x in a.message.tool_calls),
          f"auto: text, or valid calls ({a.finish_reason}: {a.message})")

    def bad(**kw):
        try:
            c.chat.completions.create(model="x", messages=[user], max_tokens=4, **kw)
        except openai.BadRequestError as e:
            return e.body["message"] if isinstance(e.body, dict) else str(e)
        raise AssertionError(f"no 400 for {kw}")

    m = bad(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_stock"}})
    check("names no tool" in m and "get_stock" in m, f"a tool_choice naming no tool: {m}")
    m = bad(tools=[{"type": "function"}])
    check("tools[0]" in m, f"a tool without its function: {m}")
    m = bad(tools=TOOLS, tool_choice="sometimes")
    check("tool_choice" in m, f"an unknown tool_choice: {m}")
    m = bad(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}],
            tool_choice="required")
    check("not" in m, f"a parameter schema the grammar cannot express: {m}")
    check(s.proc.poll() is None, "the server is still up after the bad requests")

with Server("--slots", "1", "-t", "2", model=SMOLLM2) as s:
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        c.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], tools=TOOLS)
        raise AssertionError("no 400 for tools on a template without a tool syntax")
    except openai.BadRequestError as e:
        m = e.body["message"] if isinstance(e.body, dict) else str(e)
        check("tool-call syntax" in m, f"tools on SmolLM2 (no tool syntax in its template): {m}")
print("all tool tests passed")
