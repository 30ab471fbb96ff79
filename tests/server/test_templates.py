"""barata's Jinja interpreter (barata template) against Python's jinja2,
configured as Hugging Face transformers renders chat templates (trim_blocks,
lstrip_blocks, loop controls, json.dumps-based tojson, raise_exception,
strftime_now): every template of the models here (SmolLM2, Qwen2.5-Coder, the
phi-3, qwen2 and command-r vocabularies) and llama.cpp's collection of popular
families' templates (Llama 3.x, Qwen2.5/3, Phi-3.5, Mistral, Gemma 2,
Hermes, DeepSeek R1, Granite, ...; from the llama-cpp-python 0.3.16 sdist that
scripts/fetch-test-data.sh fetches), each over a set of conversations (with
and without a system prompt and a generation prompt, with tools, tool calls
and tool results), byte for byte. A template that raises in jinja2 must
raise in barata with the same message."""
import glob
import json
import os
import subprocess
import sys
import tempfile

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from common import ROOT, barata, check

MODELS = [os.path.join(ROOT, "models", m) for m in (
    "SmolLM2-135M-Instruct.Q4_1.gguf", "Qwen2.5-Coder-0.5B-Instruct.gguf",
    "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf")] + [
    os.path.join(ROOT, "models", "vocab", f"ggml-vocab-{v}.gguf") for v in ("phi-3", "qwen2", "command-r")]
TEMPLATES = sorted(glob.glob(os.path.join(ROOT, "models", "templates", "*.jinja")))
if len(TEMPLATES) < 20:
    sys.exit("error: models/templates is incomplete: run scripts/fetch-test-data.sh")


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
ENV.globals["strftime_now"] = lambda fmt: __import__("datetime").datetime.now().strftime(fmt)

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}]
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
CONVS = {
    "plain": [{"role": "user", "content": "Hello!"}],
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
               {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3, caf\u00e9?"}],
    "tools": [{"role": "user", "content": "Weather in Paris?"}, CALL,
              {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"}],
}


def contexts():
    for name, msgs in CONVS.items():
        for gen in (True, False):
            ctx = {"messages": msgs, "add_generation_prompt": gen, "bos_token": "<s>", "eos_token": "</s>",
                   "date_string": "26 Jul 2024"}
            if name == "tools":
                ctx["tools"] = TOOLS
            yield f"{name}/gen={gen}", ctx


def render_py(src, ctx):
    try:
        return ENV.from_string(src).render(**ctx), None
    except jinja2.exceptions.UndefinedError as e:
        return None, f"UndefinedError: {e}"
    except jinja2.exceptions.TemplateError as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001  (a template that fails in Python)
        return None, f"{type(e).__name__}: {e}"


def render_barata(args, ctx):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(ctx, f)
    try:
        p = subprocess.run([barata(), "template", *args, "--context", f.name], capture_output=True, timeout=60)
    finally:
        os.unlink(f.name)
    if p.returncode != 0:
        return None, p.stderr.decode(errors="replace").strip()
    return p.stdout.decode(), None


sources = []
for m in MODELS:
    if not os.path.exists(m):
        sys.exit(f"error: {m} is absent: run the fetch scripts")
    src = subprocess.run([barata(), "template", "-m", m, "--source"], capture_output=True).stdout.decode()
    if src:
        sources.append((os.path.basename(m), ["-m", m], src))
for t in TEMPLATES:
    sources.append((os.path.basename(t), ["--file", t], open(t, encoding="utf-8").read()))

same = raised = differ = py_only = 0
for label, args, src in sources:
    for cname, ctx in contexts():
        want, want_err = render_py(src, ctx)
        got, got_err = render_barata(args, ctx)
        if want is not None and got == want:
            same += 1
        elif want is None and got is None and (want_err.startswith("UndefinedError")
                                               or want_err.split(":")[-1].strip() in got_err):
            # raise_exception's message, the same; or an undefined value used (an error in both)
            raised += 1
        elif want is None and not want_err.startswith("TemplateError") and ":" in want_err and \
                want_err.split(":")[0] in ("TypeError", "ValueError", "AttributeError"):
            # Python itself fails on it (a generator given to json.dumps, str + dict): no reference.
            py_only += 1
            print(f"no reference ({label}, {cname}): jinja2 fails with {want_err[:100]}")
        else:
            differ += 1
            print(f"DIFFER {label} {cname}:\n  jinja2: {want!r} {want_err or ''}\n  barata: {got!r} {got_err or ''}")
check(differ == 0, f"{len(sources)} templates x {len(list(contexts()))} conversations: {same} rendered byte for "
      f"byte as jinja2, {raised} raised as in jinja2, {differ} differ ({py_only} fail in jinja2 itself)")
