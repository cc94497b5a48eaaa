"""The requests README.md and docs/slo-api.md show, sent as written (the shell command itself)
to a real server on the default model, and the answers compared with what the pages print.

The unit doc-check (tests/unit/docs/test_doc_commands.py) checks these commands' bodies
without a server; here they run. The router and PD pages' requests need a pool of workers and
are sent by the router and PD integration tests with the same bodies' shape.
"""

from __future__ import annotations

import io
import json
import subprocess
from contextlib import redirect_stdout
from typing import Any

import pytest

from server.process import ServerProcess
from tests.unit.docs.doc_blocks import ROOT, Block, blocks, shell_commands

DOC_ADDRESS = "127.0.0.1:30000"


@pytest.fixture
def server(default_server: ServerProcess) -> ServerProcess:
    """The session's default-model server (conftest.py): these requests only read."""
    return default_server


def _send(command: str, server: ServerProcess) -> Any:
    """Runs the documented shell command against `server` and returns its JSON answer."""
    command = command.replace(DOC_ADDRESS, f"127.0.0.1:{server.port}")
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


def _readme() -> list[Block]:
    return blocks(ROOT / "README.md")


def _shown_after(block: Block) -> Any:
    """The JSON block the page prints right after `block`."""
    page = _readme()
    following = page[page.index(block) + 1]
    assert following.lang == "json", f"{block.where} is not followed by its answer"
    return json.loads(following.text)


def _keys(report: dict[str, Any]) -> dict[str, Any]:
    return {k: sorted(v) if isinstance(v, dict) else None for k, v in report.items()}


def test_readme_chat_request_answers_as_shown(server: ServerProcess) -> None:
    block = next(b for b in _readme() if b.lang == "bash" and "/v1/chat/completions" in b.text)
    (command,) = shell_commands(block.text)
    answer = _send(command, server)
    shown = _shown_after(block)
    assert answer["choices"][0]["message"]["content"] == shown["choices"][0]["message"]["content"]
    assert _keys(answer["slo"]) == _keys(shown["slo"])
    assert answer["slo"]["spec"] == shown["slo"]["spec"]
    assert answer["slo"]["output_tokens"] == shown["slo"]["output_tokens"]


def test_readme_invalid_slo_is_refused_as_shown(server: ServerProcess) -> None:
    block = next(b for b in _readme() if b.lang == "bash" and '"deadline_ms": -1' in b.text)
    (command,) = shell_commands(block.text)
    assert _send(command, server) == _shown_after(block)


def test_slo_api_generate_example_answers(server: ServerProcess) -> None:
    page = blocks(ROOT / "docs" / "slo-api.md")
    block = next(b for b in page if b.lang == "bash" and "/generate" in b.text)
    (command,) = shell_commands(block.text)
    answer = _send(command, server)
    assert "Paris" in answer["text"]
    report = answer["meta_info"]["slo"]
    assert report["spec"]["class"] == "latency"
    assert report["output_tokens"] > 0


def test_slo_api_openai_example_prints_the_report(server: ServerProcess) -> None:
    page = blocks(ROOT / "docs" / "slo-api.md")
    block = next(b for b in page if b.lang == "python" and "openai.OpenAI" in b.text)
    code = block.text.replace(f"http://{DOC_ADDRESS}", server.url)
    printed = io.StringIO()
    with redirect_stdout(printed):
        exec(compile(code, block.where, "exec"), {})
    report = printed.getvalue()
    assert "'class': 'deadline'" in report and "'attained'" in report
