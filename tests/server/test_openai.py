"""The openai Python client, unchanged, against barata serve on loopback:
chat and completion, streaming and not, the model list, errors as the
client's exceptions, the 429 path with Retry-After, API keys, and a SIGTERM
drain that lets a running stream finish and exits 0."""
import concurrent.futures as cf
import signal
import threading
import time

import openai

from common import Server, check

with Server("--slots", "4", "-t", "2") as s:
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    models = c.models.list()
    check(len(models.data) == 1 and models.data[0].id == "SmolLM2-135M-Instruct.Q4_1.gguf",
          f"models.list(): {[m.id for m in models.data]}")

    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = c.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0)
    text = r.choices[0].message.content
    check(r.object == "chat.completion" and text and r.choices[0].finish_reason in ("stop", "length"),
          f"chat.completions.create: {text!r} ({r.choices[0].finish_reason})")
    check(r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
          and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens,
          f"usage {r.usage}")

    pieces = []
    stream = c.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    usage = None
    finish = None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        if chunk.choices:
            if chunk.choices[0].delta.content:
                pieces.append(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
    check("".join(pieces) == text, f"the chat stream ({len(pieces)} pieces) equals the reply")
    check(len(pieces) > 3, "the chat stream comes in pieces")
    check(usage is not None and usage.completion_tokens == r.usage.completion_tokens,
          "the stream's usage chunk")
    check(finish == r.choices[0].finish_reason, f"the stream's finish_reason {finish}")

    cr = c.completions.create(model="x", prompt="The quick brown fox", max_tokens=16, temperature=0)
    check(cr.object == "text_completion" and cr.choices[0].text, f"completions.create: {cr.choices[0].text!r}")
    joined = "".join(ch.choices[0].text for ch in c.completions.create(
        model="x", prompt="The quick brown fox", max_tokens=16, temperature=0, stream=True)
        if ch.choices)
    check(joined == cr.choices[0].text, "the completion stream equals the completion")

    # Same seed, same sample; temperature sampling through the API.
    a = c.chat.completions.create(model="x", messages=msgs, max_tokens=16, temperature=0.9, seed=7)
    b = c.chat.completions.create(model="x", messages=msgs, max_tokens=16, temperature=0.9, seed=7)
    check(a.choices[0].message.content == b.choices[0].message.content, "seed makes a sample repeatable")

    stopped = c.completions.create(model="x", prompt="1, 2, 3, 4,", max_tokens=40, temperature=0,
                                   stop=["8"])
    check(stopped.choices[0].finish_reason == "stop" and "8" not in stopped.choices[0].text,
          f"stop=['8']: {stopped.choices[0].text!r}")

    for kwargs, what in [({"max_tokens": -1}, "a negative max_tokens"),
                         ({"n": 17}, "n=17"),
                         ({"temperature": 5}, "temperature 5"),
                         ({"extra_body": {"bogus": 1}}, "an unknown field")]:
        try:
            c.chat.completions.create(model="x", messages=msgs, **kwargs)
            check(False, f"{what} is refused")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and e.body and "message" in e.body, f"{what}: 400 {e.body['message']!r}")
    try:
        c.completions.create(model="x", prompt="word " * 5000, max_tokens=4)
        check(False, "a prompt longer than the context is refused")
    except openai.BadRequestError as e:
        check(e.code == "context_length_exceeded", f"a prompt longer than the context: {e.body['message']!r}")

# 429: one slot, one place in the queue, many clients at once.
with Server("--slots", "1", "--max-queue", "1", "-t", "2") as s:
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    go = threading.Event()

    def one(_):
        go.wait()
        try:
            r = c.completions.create(model="x", prompt="Once upon a time", max_tokens=48, temperature=0)
            return ("ok", r.choices[0].text)
        except openai.RateLimitError as e:
            return ("429", e.response.headers.get("retry-after"))

    with cf.ThreadPoolExecutor(12) as ex:
        futs = [ex.submit(one, i) for i in range(12)]
        time.sleep(0.2)
        go.set()
        res = [f.result() for f in futs]
    oks = [t for k, t in res if k == "ok"]
    rejected = [ra for k, ra in res if k == "429"]
    check(oks and rejected, f"{len(oks)} completed, {len(rejected)} got openai.RateLimitError")
    check(all(ra is not None and int(ra) >= 1 for ra in rejected), f"Retry-After on every 429: {rejected}")
    check(len(set(oks)) == 1, "the completed greedy replies agree")
    # The client's own retry honours Retry-After and gets through.
    patient = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=5)
    with cf.ThreadPoolExecutor(6) as ex:
        texts = list(ex.map(lambda _: patient.completions.create(
            model="x", prompt="Once upon a time", max_tokens=48, temperature=0).choices[0].text, range(6)))
    check(texts == [oks[0]] * 6, "6 clients with retries all get the reply")

# API keys.
with Server("--api-key", "k-123", "-t", "1") as s:
    bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
    try:
        bad.models.list()
        check(False, "a wrong key is refused")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, "a wrong key: openai.AuthenticationError (401)")
    good = openai.OpenAI(base_url=s.url + "/v1", api_key="k-123", max_retries=0)
    check(good.models.list().data[0].id, "the right key is let in")

# SIGTERM: the running stream finishes; then the process exits 0.
with Server("-t", "2", "--drain-grace", "60") as s:
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    stream = c.completions.create(model="x", prompt="1, 2, 3, 4, 5,", max_tokens=200,
                                  temperature=0, stream=True)
    it = iter(stream)
    first = next(it)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    try:
        c.completions.create(model="x", prompt="hello", max_tokens=4)
        refused = False
    except (openai.APIStatusError, openai.APIConnectionError):
        refused = True
    check(refused, "a request after SIGTERM is refused (503) or not accepted")
    rest = [ch for ch in it]
    check(rest and rest[-1].choices[0].finish_reason == "length",
          f"the stream running at SIGTERM finished ({len(rest) + 1} chunks, finish "
          f"{rest[-1].choices[0].finish_reason if rest else None})")
    rc = s.proc.wait(timeout=60)
    check(rc == 0, f"exit status {rc} after the drain")
print("test_openai: all passed")
