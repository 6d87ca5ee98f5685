"""`hyflash serve` through a real client (the `openai` package) against real server processes on loopback, on a
tiny random Llama that reads characters (a chat template included), plus the worker's parts in-process.

Every request has a timeout and every loop a bound; the servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from hyflash.cli import main
from hyflash.sampling import SamplingConfig
from hyflash.serve.worker import Delta, Done, EngineWorker, Failed, GenerationRequest, Started, TextStream

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ["--dtype", "float32", "--drafter", "ngram", "--no-adaptive"]  # what server and `generate` both run
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")
START_TIMEOUT_S = 90
REQUEST_TIMEOUT_S = 30
LONG = 480  # tokens: a generation of ~0.5-1.5 s on the tiny model (its context is 512)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    from conftest import tiny_llama

    from hyflash.distill.student import char_tokenizer

    tokenizer = char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    folder = tmp_path_factory.mktemp("serve") / "model"
    tiny_llama(vocab=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_command(model: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hyflash.cli", "serve", "--model", str(model), *ENGINE, "--port", str(port), *extra]


def _server_env(folder: Path) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HYFLASH_CACHE": str(folder / "cache"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


class Server:
    def __init__(self, model: Path, log: Path, *extra: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.process = subprocess.Popen(_serve_command(model, self.port, *extra), stdout=log.open("w"),
                                        stderr=subprocess.STDOUT, env=_server_env(log.parent), cwd=ROOT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if _get(self.url + "/health", timeout=1)[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise AssertionError(f"the server did not start:\n{log.read_text()[-3000:]}")

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S)

    def metric(self, line_start: str) -> float:
        text = _get(self.url + "/metrics")[1]
        values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(line_start)]
        return values[0] if values else 0.0

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode


def _get(url: str, timeout: float = REQUEST_TIMEOUT_S) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read().decode()


def _post(url: str, data: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture(scope="module")
def server(model_folder):
    srv = Server(model_folder, model_folder.parent / "server.log")
    yield srv
    srv.stop()


def _generate_cli(model: Path, prompt: str, max_new_tokens: int, capsys) -> str:
    """`hyflash generate`'s greedy text with the server's engine settings."""
    capsys.readouterr()
    assert main(["generate", "--model", str(model), *ENGINE, "--prompt", prompt,
                 "--max-new-tokens", str(max_new_tokens), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["text"]


def _chat(client: openai.OpenAI, prompt: str, stream: bool, **settings) -> tuple[str, str, dict]:
    """(text, finish reason, usage) of one chat completion, streamed or not."""
    messages = [{"role": "user", "content": prompt}]
    if not stream:
        out = client.chat.completions.create(model=settings.pop("model", None) or client.models.list().data[0].id,
                                             messages=messages, **settings)
        return out.choices[0].message.content, out.choices[0].finish_reason, out.model_dump()
    chunks = list(client.chat.completions.create(model=client.models.list().data[0].id, messages=messages,
                                                 stream=True, **settings))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and not chunks[-1].choices  # the last chunk carries usage and the extension
    return text, finish[0], chunks[-1].model_dump()


def test_chat_greedy_equals_generate_streamed_and_not(server, model_folder, capsys):
    expected = _generate_cli(model_folder, "Say hello", 40, capsys)
    client = server.client()
    for stream in (False, True):
        text, finish, body = _chat(client, "Say hello", stream, temperature=0, max_tokens=40)
        assert text == expected and len(expected) > 10
        assert finish == "length"
        assert body["usage"]["completion_tokens"] == 40 and body["usage"]["prompt_tokens"] == 27
        extension = body["hyflash"]
        assert extension["tau"] >= 1 and extension["decode_tokens_per_second"] > 0
        assert sum(extension["drafts_verified_by_source"].values()) >= 1  # the n-gram drafter drafted


def test_text_completion_stops_at_first_stop_string(server, model_folder, capsys):
    expected = _generate_cli(model_folder, "Q: 1+1", 40, capsys)
    # The raw prompt, without the chat template: what /v1/completions continues.
    capsys.readouterr()
    assert main(["generate", "--model", str(model_folder), *ENGINE, "--prompt", "Q: 1+1", "--no-chat",
                 "--max-new-tokens", "40", "--json"]) == 0
    raw = json.loads(capsys.readouterr().out)["text"]
    stop = raw[12:14]
    client = server.client()
    out = client.completions.create(model=client.models.list().data[0].id, prompt="Q: 1+1", temperature=0,
                                    max_tokens=40, stop=[stop, "never appears"])
    assert out.choices[0].text == raw[: raw.find(stop)] and out.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=out.model, prompt="Q: 1+1", temperature=0, max_tokens=40,
                                            stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == raw[: raw.find(stop)]
    assert chunks[-1].usage.completion_tokens < 40
    assert expected != raw  # the chat endpoint applies the template, the text one does not


def test_sampling_with_a_seed_is_reproducible(server):
    client = server.client()
    settings = dict(temperature=1.0, top_p=0.95, max_tokens=24, extra_body={"top_k": 40})
    first = _chat(client, "Say hello", False, seed=7, **settings)[0]
    assert _chat(client, "Say hello", True, seed=7, **settings)[0] == first
    others = {_chat(client, "Say hello", False, seed=s, **settings)[0] for s in (8, 9)}
    assert others != {first}  # it does sample


def test_sixteen_concurrent_clients_all_get_their_answer(server, model_folder):
    from hyflash import engine
    from hyflash.decoding import generate

    prompts = [f"Say {i}" for i in range(16)]
    target, drafter, policy, _ = engine.load(str(model_folder), "float32", "ngram", adaptive=False)
    expected = [generate(target, target.encode_prompt(p), drafter, 16, policy=policy).text for p in prompts]
    client = server.client()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: _chat(client, prompts[i], i % 2 == 1, temperature=0, max_tokens=16),
                                range(16)))
    assert [a[0] for a in answers] == expected
    assert all(a[1] == "length" for a in answers)
    assert server.metric("hyflash_queue_depth") == 0


def test_a_client_gone_mid_stream_frees_the_engine(server):
    client = server.client()
    cancelled = server.metric('hyflash_generations_total{finish_reason="cancelled"}')
    stream = client.chat.completions.create(model=client.models.list().data[0].id, stream=True, max_tokens=LONG,
                                            messages=[{"role": "user", "content": "Say hello"}], temperature=0)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    stream.close()  # the connection drops, as when the client is killed
    started = time.monotonic()
    text, finish, _ = _chat(client, "Say 1", False, temperature=0, max_tokens=8)
    assert finish == "length" and time.monotonic() - started < 10
    deadline = time.monotonic() + 10
    while server.metric('hyflash_generations_total{finish_reason="cancelled"}') != cancelled + 1:
        assert time.monotonic() < deadline, "the abandoned generation was not cancelled"
        time.sleep(0.1)


LONG_PROMPT = "x" * 600  # 600 tokens for a 512-token context
BAD_REQUESTS = [  # (endpoint, body, status, param)
    ("chat/completions", b'{"messages": [', 400, None),
    ("chat/completions", b'[1, 2]', 400, None),
    ("chat/completions", b'{"messages": "hello"}', 400, "messages"),
    ("chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}', 400,
     "temperature"),
    ("completions", b'{"prompt": "hi", "max_tokens": "ten"}', 400, "max_tokens"),
    ("completions", b'{"prompt": "hi", "stream": "yes"}', 400, "stream"),
    ("chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": -0.5}', 400,
     "temperature"),
    ("completions", b'{"prompt": "hi", "top_p": 0}', 400, "top_p"),
    ("completions", b'{"prompt": "hi", "top_p": 1.5}', 400, "top_p"),
    ("chat/completions", b'{"messages": []}', 400, "messages"),
    ("chat/completions", b'{"messages": [{"role": "user", "content": "  "}]}', 400, "messages"),
    ("completions", b'{"prompt": ""}', 400, "prompt"),
    ("completions", b'{}', 400, "prompt"),
    ("completions", json.dumps({"prompt": LONG_PROMPT}).encode(), 400, "prompt"),
    ("chat/completions", json.dumps({"messages": [{"role": "user", "content": LONG_PROMPT}]}).encode(), 400,
     "messages"),
    ("completions", b'{"prompt": [5, 100000]}', 400, "prompt"),
    ("completions", b'{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens"),
    ("chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}', 400, "max_tokens"),
    ("chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "model": "gpt-9"}', 404, "model"),
    ("completions", b'{"prompt": "hi", "model": "gpt-9"}', 404, "model"),
]


def test_every_bad_input_gets_an_openai_error_and_the_server_serves_on(server):
    for endpoint, body, status, param in BAD_REQUESTS:
        got, answer = _post(f"{server.url}/v1/{endpoint}", body)
        assert (got, answer["error"]["param"]) == (status, param), (body, answer)
        error = answer["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["type"]
        assert "\n" not in error["message"]
    got, answer = _post(f"{server.url}/v1/no-such-route", b"{}")
    assert got == 404 and answer["error"]["type"] == "not_found_error"
    with pytest.raises(openai.BadRequestError) as raised:  # the openai client reads the error object
        server.client().completions.create(model="unused", prompt="hi", temperature=-1)
    assert raised.value.status_code in (400, 404)
    status, health = _get(server.url + "/health")
    assert status == 200 and json.loads(health)["status"] == "ok"
    assert server.metric('hyflash_requests_total{endpoint="/v1/completions",status="400"}') >= 8


def test_queue_timeout_gives_503_and_sigterm_finishes_the_request_in_flight(model_folder):
    srv = Server(model_folder, model_folder.parent / "short-queue.log", "--queue-timeout", "0.05")
    try:
        client = srv.client()
        model = client.models.list().data[0].id
        stream = client.completions.create(model=model, prompt="Say hello", temperature=0, max_tokens=LONG,
                                           stream=True)
        first = next(iter(stream))  # the engine is busy with it now
        status, answer = _post(f"{srv.url}/v1/completions", b'{"prompt": "hi", "max_tokens": 4}')
        assert status == 503 and answer["error"]["code"] == "queue_timeout"
        rest = list(stream)
        assert rest[-1].usage.completion_tokens == LONG and first.choices[0].text

        # SIGTERM while a generation streams: it finishes, then the server exits cleanly.
        done: dict = {}

        def read_all():
            chunks = list(client.completions.create(model=model, prompt="Say hello", temperature=0,
                                                    max_tokens=LONG, stream=True))
            done["tokens"] = chunks[-1].usage.completion_tokens

        reader = threading.Thread(target=read_all)
        reader.start()
        deadline = time.monotonic() + 10
        while srv.metric("hyflash_engine_busy") != 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        srv.process.send_signal(signal.SIGTERM)
        reader.join(timeout=30)
        assert done.get("tokens") == LONG
        assert srv.process.wait(timeout=30) == 0
        log = srv.log.read_text()
        assert "engine stopped" in log and "Application shutdown complete" in log and "Traceback" not in log
    finally:
        srv.stop()


def test_a_port_in_use_is_a_clear_error_and_the_process_exits(model_folder):
    """The engine runs on the main thread and HTTP in a second one: if the HTTP side cannot start, the engine
    must stop too (not serve a queue nobody can reach) and the user is told what to change."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(_serve_command(model_folder, port), capture_output=True, text=True,
                              env=_server_env(model_folder.parent), cwd=ROOT, timeout=START_TIMEOUT_S)
    assert done.returncode != 0
    assert f"did not start on 127.0.0.1:{port}" in done.stderr and "--port" in done.stderr


# ----- in-process: the worker's parts ---------------------------------------------------------------------


def test_text_stream_holds_back_partial_characters_and_stop_strings():
    byte_level = TextStream(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    pieces = [byte_level.feed([b]) for b in "é!".encode()]
    assert pieces == ["", "é", "!"] and byte_level.finish() == ""

    chars = TextStream(lambda ids: "".join(map(chr, ids)), stop=("lo w", "xyz"))
    deltas = [chars.feed([ord(c)]) for c in "hello w"]
    # The last 3 characters wait (a stop string may begin there); "lo" never goes out.
    assert deltas == ["", "", "", "h", "e", "l", ""] and chars.stopped and chars.text == "hel"
    assert chars.finish() == ""


def test_an_engine_failure_fails_one_request_and_the_worker_serves_on(model_folder):
    from hyflash.targets import HFTarget as Target

    target = Target.load(str(model_folder), dtype="float32")
    real_prefill, calls = target.prefill, []

    def prefill_failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom\nsecond line")
        return real_prefill(*args, **kwargs)

    target.prefill = prefill_failing_once
    finished = []
    worker = EngineWorker(target, on_finish=lambda reason, summary: finished.append(reason))
    request = GenerationRequest(target.encode_prompt("Say hello"), 6, SamplingConfig(), seed=0)

    async def events_of(job, bound: int = 100) -> list:
        out = []
        for _ in range(bound):
            out.append(await asyncio.wait_for(job.events.get(), timeout=REQUEST_TIMEOUT_S))
            if isinstance(out[-1], (Done, Failed)):
                return out
        raise AssertionError("no end event")

    async def run():
        loop = asyncio.get_running_loop()
        worker.start()
        try:
            failed = await events_of(worker.submit(request, loop))
            served = await events_of(worker.submit(request, loop))
        finally:
            worker.stop()
        return failed, served

    failed, served = asyncio.run(run())
    assert isinstance(failed[0], Started) and failed[-1] == Failed(500, "generation failed: RuntimeError: boom")
    assert isinstance(served[-1], Done) and served[-1].summary.completion_tokens == 6
    assert "".join(e.text for e in served if isinstance(e, Delta)) == served[-1].summary.text
    assert finished == ["error", "length"]


def test_a_request_that_repeats_the_last_prompt_reports_its_cached_tokens_as_openai_does():
    """On llama.cpp a prompt the previous request prefilled runs from the cache: the summary's usage says how
    many prompt tokens were cached (OpenAI's usage.prompt_tokens_details.cached_tokens), 0 the first time."""
    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        pytest.skip("HYFLASH_SKIP_REAL_MODEL is set")
    from conftest import import_llama_cpp

    import_llama_cpp()
    from hyflash.serve.metrics import ServerMetrics
    from hyflash.targets.llamacpp import LlamaCppTarget

    target = LlamaCppTarget.load("smollm2-135m", n_threads=1)
    metrics = ServerMetrics()
    worker = EngineWorker(target, on_finish=metrics.finished)
    prompt = target.encode_prompt("Say hello in three languages.")
    request = GenerationRequest(prompt, 4, SamplingConfig(), seed=0)

    async def done(job) -> Done:
        while True:
            event = await asyncio.wait_for(job.events.get(), timeout=REQUEST_TIMEOUT_S)
            if isinstance(event, (Done, Failed)):
                return event

    async def run():
        loop = asyncio.get_running_loop()
        worker.start()
        try:
            return [await done(worker.submit(request, loop)) for _ in range(2)]
        finally:
            worker.stop()

    first, second = asyncio.run(run())
    assert first.summary.usage()["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second.summary.usage()["prompt_tokens_details"] == {"cached_tokens": len(prompt)}
    assert second.summary.text == first.summary.text
    assert f"hyflash_cached_prompt_tokens_total {float(len(prompt))}" in metrics.render().decode()
