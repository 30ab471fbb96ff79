"""Structured output through the openai client against barata serve, on
SmolLM2-135M and Qwen2.5-Coder-0.5B: a suite of JSON Schemas (nested
objects, arrays, enums, patterns, formats, integer bounds, $ref recursion,
nullable unions) x greedy and two seeded samples, each reply parsed with
Python's json and validated with jsonschema: 100% must pass. The same
prompts without response_format are counted too (printed, not asserted):
what the constraint buys. Then json_object mode, a streamed reply equal to
the plain one, llama-server's "grammar" field, and the 400s naming what is
wrong. Last, n > 1: the samples fork the first's cache and each equals its
seed alone."""
import concurrent.futures as cf
import json
import os

import jsonschema
import openai

from common import ROOT, SMOLLM2, Server, check

QWEN = os.path.join(ROOT, "models", "Qwen2.5-Coder-0.5B-Instruct.gguf")

S = lambda n, **kw: {"type": "string", "maxLength": n, **kw}  # noqa: E731
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": S(24),
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "email": {"type": ["string", "null"], "maxLength": 40},
            "address": {"type": "object",
                        "properties": {"city": S(24), "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                        "required": ["city", "zip"]},
        },
        "required": ["name", "age", "address"],
    },
    "inventory": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                               "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                               "status": {"enum": ["in_stock", "backorder", "discontinued"]}},
                "required": ["sku", "qty", "status"]}},
        },
        "required": ["items"],
    },
    "event": {
        "type": "object",
        "properties": {
            "title": S(30),
            "date": {"type": "string", "format": "date"},
            "start": {"type": "string", "format": "time"},
            "id": {"type": "string", "format": "uuid"},
            "online": {"type": "boolean"},
            "price": {"anyOf": [{"type": "number", "minimum": 0}, {"type": "null"}]},
        },
        "required": ["title", "date", "id", "online"],
    },
    "tree": {
        # $ref through two levels (a recursive node could nest past max_tokens).
        "$defs": {"leaf": {"type": "object", "properties": {"label": S(12)}, "required": ["label"]},
                  "node": {"type": "object",
                           "properties": {"label": S(12),
                                          "children": {"type": "array", "maxItems": 3,
                                                       "items": {"$ref": "#/$defs/leaf"}}},
                           "required": ["label", "children"]}},
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/node"}, "depth": {"type": "integer", "minimum": 1, "maximum": 5}},
        "required": ["root", "depth"],
    },
    "answer": {
        "type": "object",
        "properties": {"verdict": {"const": "final"}, "score": {"type": "integer", "minimum": -10, "maximum": 10},
                       "tags": {"type": "array", "items": S(10), "maxItems": 3},
                       "note": {"type": "string", "minLength": 1, "maxLength": 40}},
        "required": ["verdict", "score", "tags"],
        "additionalProperties": False,
    },
    "tuple": {"type": "array", "prefixItems": [S(16), {"type": "integer", "minimum": 0, "maximum": 999},
                                               {"type": "boolean"}], "items": False},
}
PROMPTS = {
    "person": "Describe a fictional person as JSON (name, age, email, address with city and zip).",
    "inventory": "Give a JSON inventory of up to three warehouse items with sku, qty and status.",
    "event": "Describe a conference event as JSON: title, date, start time, id, online, price.",
    "tree": "Give a small tree of animal categories as JSON, with labels and children, and its depth.",
    "answer": "Grade the sentence 'the cat sat on the mat' as JSON with a verdict, score and tags.",
    "tuple": "Give a JSON array of a city name, its rank and whether it is a capital.",
}
SAMPLINGS = [dict(temperature=0), dict(temperature=0.8, seed=1), dict(temperature=1.0, seed=2)]
MAX_TOKENS = 320


def valid(schema, text):
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def run_model(path, label):
    with Server("--slots", "4", "-t", "2", "-c", "2048", model=path) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=600)

        def ask(name, samp, constrained):
            msgs = [{"role": "user", "content": PROMPTS[name] + " Schema: " + json.dumps(SCHEMAS[name])}]
            extra = {}
            if constrained:
                extra["response_format"] = {"type": "json_schema",
                                            "json_schema": {"name": name, "schema": SCHEMAS[name]}}
            r = c.chat.completions.create(model="x", messages=msgs, max_tokens=MAX_TOKENS, **samp, **extra)
            return name, samp, r.choices[0].message.content, r.choices[0].finish_reason

        jobs = [(n, samp, True) for n in SCHEMAS for samp in SAMPLINGS]
        jobs += [(n, SAMPLINGS[0], False) for n in SCHEMAS]
        with cf.ThreadPoolExecutor(4) as ex:
            results = list(ex.map(lambda j: (j[2], *ask(*j)), jobs))
        good = bad = free_good = free_n = 0
        for constrained, name, samp, text, finish in results:
            ok = valid(SCHEMAS[name], text)
            if constrained:
                if ok and finish == "stop":
                    good += 1
                else:
                    bad += 1
                    print(f"INVALID ({label}, {name}, {samp}, finish {finish}): {text!r}")
            else:
                free_n += 1
                free_good += ok
        check(bad == 0, f"{label}: {good} of {good + bad} constrained replies parse and validate "
                        f"({len(SCHEMAS)} schemas x {len(SAMPLINGS)} samplings), all ending with 'stop'")
        print(f"{label}: without response_format, {free_good} of {free_n} greedy replies were valid")

        # Greedy replies are the same streamed.
        msgs = [{"role": "user", "content": PROMPTS["person"]}]
        rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS["person"]}}
        plain = c.chat.completions.create(model="x", messages=msgs, max_tokens=MAX_TOKENS, temperature=0,
                                          response_format=rf).choices[0].message.content
        streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="x", messages=msgs, max_tokens=MAX_TOKENS, temperature=0, response_format=rf, stream=True)
            if ch.choices)
        check(streamed == plain, f"{label}: the streamed schema reply equals the plain one")

        obj = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Say hello."}],
                                        max_tokens=120, temperature=0.7, seed=3,
                                        response_format={"type": "json_object"})
        text = obj.choices[0].message.content
        check(obj.choices[0].finish_reason != "stop" or isinstance(json.loads(text), dict),
              f"{label}: json_object mode gives an object: {text[:60]!r}")
        return s.url


run_model(SMOLLM2, "SmolLM2-135M")
if os.path.exists(QWEN):
    run_model(QWEN, "Qwen2.5-Coder-0.5B")
else:
    raise SystemExit(f"error: {QWEN} is absent: run scripts/fetch-qwen2.sh")

with Server("--slots", "2", "-t", "2") as s:
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    g = c.completions.create(model="x", prompt="Three colours:", max_tokens=40, temperature=0,
                             extra_body={"grammar": 'root ::= ("- " [a-z]{1,10} "\\n"){3}'})
    lines = g.choices[0].text.split("\n")
    check(g.choices[0].finish_reason == "stop" and len(lines) == 4 and all(x.startswith("- ") for x in lines[:3]),
          f"a GBNF grammar on /v1/completions: {g.choices[0].text!r}")

    def bad(what, **body):
        try:
            c.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=4, **body)
        except openai.BadRequestError as e:
            return e.body.get("message", "") if isinstance(e.body, dict) else str(e)
        raise AssertionError(f"{what}: no 400")

    m = bad("not", response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"not": {}}}}}})
    check("'not'" in m and "#/properties/a/not" in m, f"an unsupported keyword is named: {m}")
    m = bad("grammar", extra_body={"grammar": "root ::= [a-"})
    check("line 1, column 10" in m, f"a bad grammar's position is named: {m}")
    m = bad("type", response_format={"type": "xml"})
    check("xml" in m, f"an unknown response_format type: {m}")
    m = bad("both", response_format={"type": "json_object"}, extra_body={"grammar": 'root ::= "a"'})
    check("one of" in m, f"two constraints at once: {m}")
    check(s.proc.poll() is None, "the server is still up after the bad requests")

    # llama-server's tokenizer endpoints, and the OpenAI penalties.
    import urllib.request

    def post(path, body):
        req = urllib.request.Request(s.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    st, t = post("/tokenize", {"content": "Hello world, caf\u00e9!"})
    check(st == 200 and len(t["tokens"]) > 3 and all(isinstance(x, int) for x in t["tokens"]),
          f"/tokenize: {t}")
    st, d = post("/detokenize", {"tokens": t["tokens"]})
    check(st == 200 and d["content"] == "Hello world, caf\u00e9!", f"/detokenize gives the text back: {d}")
    st, p = post("/tokenize", {"content": "Hi there", "with_pieces": True})
    check(st == 200 and "".join(x["piece"] for x in p["tokens"]).strip() == "Hi there",
          f"/tokenize with_pieces: {p}")
    st, e = post("/detokenize", {"tokens": [10 ** 9]})
    check(st == 400 and "tokens" in e["error"]["message"], f"/detokenize refuses an unknown id: {e}")
    r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Count to ten."}],
                                  max_tokens=24, temperature=0, presence_penalty=1.5, frequency_penalty=0.5)
    plain = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "Count to ten."}],
                                      max_tokens=24, temperature=0)
    check(r.choices[0].message.content != plain.choices[0].message.content,
          "presence/frequency penalties change a greedy reply")
    m = bad("penalty", presence_penalty=3)
    check("presence_penalty" in m, f"a penalty outside [-2, 2]: {m}")

    # logprobs: chat's content entries and completions' arrays, the same streamed.
    msgs = [{"role": "user", "content": "Name three fruits."}]
    r = c.chat.completions.create(model="x", messages=msgs, max_tokens=12, temperature=0,
                                  logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    check(len(lp) >= 1 and "".join(e.token for e in lp) == r.choices[0].message.content,
          f"chat logprobs: one entry per token, the tokens make the reply ({len(lp)})")
    check(all(e.logprob <= 0 and len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
              and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
              and bytes(e.bytes).decode("utf-8", "replace") for e in lp),
          "greedy: each token is its top alternative, alternatives sorted, logprobs <= 0")
    streamed = []
    for ch in c.chat.completions.create(model="x", messages=msgs, max_tokens=12, temperature=0,
                                        logprobs=True, top_logprobs=3, stream=True):
        if ch.choices and ch.choices[0].logprobs:
            streamed += ch.choices[0].logprobs.content
    check([(e.token, round(e.logprob, 5)) for e in streamed] == [(e.token, round(e.logprob, 5)) for e in lp],
          "streamed logprobs equal the plain reply's")
    cr = c.completions.create(model="x", prompt="The capital of France is", max_tokens=6,
                              temperature=0, logprobs=2)
    L = cr.choices[0].logprobs
    check(len(L.tokens) == len(L.token_logprobs) == len(L.top_logprobs) == len(L.text_offset) >= 1
          and "".join(L.tokens) == cr.choices[0].text and L.text_offset[0] == 0
          and all(len(t) <= 2 for t in L.top_logprobs),
          f"completions logprobs: {L.tokens}")
    m = bad("top_logprobs", top_logprobs=2)
    check("logprobs" in m, f"top_logprobs without logprobs: {m}")

    # n samples of one prompt: the others fork the first's cache (the
    # metrics count the forks), sample i equals seed + i alone, streamed or
    # not, and a grammar holds for each.
    msgs = [{"role": "user", "content": "Name a colour and say why you like it."}]
    forks0 = s.metrics().get("barata_sample_forks_total", 0)
    r = c.chat.completions.create(model="x", messages=msgs, max_tokens=16, temperature=0.9, seed=21, n=4)
    check([ch.index for ch in r.choices] == [0, 1, 2, 3], f"n=4: four choices in order ({len(r.choices)})")
    alone = [c.chat.completions.create(model="x", messages=msgs, max_tokens=16, temperature=0.9, seed=21 + i)
             for i in range(4)]
    check([ch.message.content for ch in r.choices] == [a.choices[0].message.content for a in alone],
          "each sample equals its seed (seed + index) alone")
    check(len({ch.message.content for ch in r.choices}) > 1, "the samples differ")
    check(r.usage.prompt_tokens == alone[0].usage.prompt_tokens
          and r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone),
          f"usage: the prompt once, every sample's tokens ({r.usage})")
    check(s.metrics().get("barata_sample_forks_total", 0) - forks0 == 3,
          "three samples forked the first's cache instead of computing the prompt")
    texts = {}
    for ch in c.chat.completions.create(model="x", messages=msgs, max_tokens=16, temperature=0.9, seed=21, n=4,
                                        stream=True):
        for x in ch.choices:
            texts[x.index] = texts.get(x.index, "") + (x.delta.content or "")
    check([texts[i] for i in range(4)] == [ch.message.content for ch in r.choices],
          "streamed: each index's text equals the plain sample")
    j = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "A JSON object about a cat."}],
                                  max_tokens=80, temperature=1.0, seed=3, n=3, response_format={"type": "json_object"})
    check(all(ch.finish_reason != "stop" or isinstance(json.loads(ch.message.content), dict) for ch in j.choices)
          and sum(ch.finish_reason == "stop" for ch in j.choices) >= 1,
          f"n=3 under json_object: every finished sample is an object ({[ch.finish_reason for ch in j.choices]})")
    m = bad("n", n=17)
    check("'n'" in m, f"n above 16: {m}")
print("all structured-output tests passed")
