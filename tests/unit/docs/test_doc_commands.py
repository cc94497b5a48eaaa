"""Every command and example in README.md, docs/*.md, benchmarks/README.md and RESULTS.md, run in its
cheapest faithful form, so none rots.

- A `python -m MODULE ...` command runs `MODULE --help`: it fails when the module is gone, and
  every flag the command passes must be in that help. `./slo serve` is `launch_server`.
- A `launch_cluster FILE` command loads FILE through the launcher's own parser.
- A curl body is parsed and its SLO read by the server's own SLO parser; the route must exist.
- JSON, YAML and Python blocks are parsed; the adding-a-policy example is built and planned.
- What cannot run here is listed in NOT_RUNNABLE with its reason; the test fails when an entry
  matches no block (a stale excuse) and when a block is neither run nor listed.
The requests themselves are sent to a real server by tests/integration/test_doc_examples.py.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.core.slo import SloValidationError
from scheduler.core.slo_wire import extract_slo
from tests.unit.docs.doc_blocks import PAGES, ROOT, Block, all_blocks, blocks, flags, pipeline, shell_commands

# (page, a line of the block) -> why the block's other commands cannot run in a unit test.
NOT_RUNNABLE: dict[tuple[str, str], str] = {
    (
        "docs/deployment.md",
        "kubectl create namespace sglang-slo",
    ): "needs a Kubernetes cluster; the manifests are checked offline by tests/unit/deploy/",
    (
        "docs/deployment.md",
        "kubectl -n monitoring create secret generic",
    ): "needs a Kubernetes cluster with Prometheus; the scrape is checked by tests/unit/deploy/test_scrape.py",
}
# Commands that are clients of a running server (curl) are checked by their body here and sent
# for real by the integration test; these are routes the docs may send to.
ROUTES = {"/generate", "/v1/chat/completions", "/v1/completions", "/slo/status", "/health", "/metrics"}
# Examples whose SLO is wrong on purpose (they show the 400): (page, snippet) -> the field named.
INVALID_ON_PURPOSE = {("README.md", '"deadline_ms": -1'): "slo.deadline_ms"}
# Python examples: where each one runs, or why it is only parsed. (page, a line of it) -> which.
PYTHON_EXAMPLES = {
    ("docs/adding-a-policy.md", "class NewestFirstPolicy:"): "run: test_the_policy_example_builds_and_plans",
    ("docs/slo-api.md", "client = openai.OpenAI("): "run: tests/integration/test_doc_examples.py",
    ("docs/slo-api.md", 'SloRuntimeEndpoint("http'): (
        "parsed only: it runs a user's sgl.function program; SloRuntimeEndpoint itself is exercised by "
        "tests/integration/test_server_api.py and test_router.py"
    ),
}
# Console scripts the set-up installs, as the module each one runs.
CONSOLE_SCRIPTS = {
    "launch_server": "launch_server",
    "launch_router": "launch_router",
    "launch_cluster": "launch_cluster",
}
SHELL_LANGS = {"bash", "sh", "shell", "console"}
SLO_SUBCOMMANDS = ("serve", "test", "setup")

RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BLOCKS = all_blocks() + blocks(RESULTS)  # the results page's commands must run today too


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _excuse(block: Block) -> str | None:
    for (page, line), reason in NOT_RUNNABLE.items():
        if _rel(block.page) == page and line in block.text:
            return reason
    return None


# Runs `python -m M --help` for many modules in one fresh interpreter, so torch and SGLang are
# imported once, not once per module; prints {module: [exit code, stdout, stderr]} as JSON.
_HELP_RUNNER = """
import contextlib, io, json, runpy, sys
out = {}
for module in sys.argv[1:]:
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [module, "--help"]
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        except BaseException as error:
            code, _ = 1, stderr.write(repr(error))
    out[module] = [code, stdout.getvalue(), stderr.getvalue()[-2000:]]
sys.__stdout__.write(json.dumps(out))
"""


def _documented_modules() -> list[str]:
    modules: set[str] = set()
    for block in BLOCKS:
        if block.lang in SHELL_LANGS:
            for command in shell_commands(block.text):
                for words in pipeline(command):
                    program = Path(words[0]).name
                    if program.startswith("python") and words[1:2] == ["-m"]:
                        modules.add(words[2])
                    elif program in CONSOLE_SCRIPTS or (words[0] == "./slo" and words[1:2] == ["serve"]):
                        modules.add(CONSOLE_SCRIPTS.get(program, "launch_server"))
    for page in [*PAGES, RESULTS]:
        modules.update(shlex.split(" ".join(span.split()))[2] for span in _INLINE_COMMAND.findall(page.read_text()))
    return sorted(modules - {"pip", "json.tool"})


@functools.cache
def _all_help() -> dict[str, list[Any]]:
    done = subprocess.run(
        [sys.executable, "-c", _HELP_RUNNER, *_documented_modules()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(),
    )
    assert done.returncode == 0, f"the --help runner failed:\n{done.stderr[-2000:]}"
    result: dict[str, list[Any]] = json.loads(done.stdout)
    return result


@functools.cache
def module_help(module: str) -> str:
    """`python -m module --help`, as a user runs it from the repository root."""
    code, stdout, stderr = _all_help().get(module) or _single_help(module)
    assert code == 0, f"python -m {module} --help failed:\n{stderr}"
    return str(stdout)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "launch"), env.get("PYTHONPATH", "")])
    return env


def _single_help(module: str) -> list[Any]:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=600, env=_env()
    )
    return [done.returncode, done.stdout, done.stderr[-2000:]]


def check_module_command(module: str, words: list[str]) -> None:
    named_files = [w for w in words if not w.startswith("-") and "/" in w and w.endswith((".py", ".yaml", ".yml"))]
    missing = [name for name in named_files if not (ROOT / name).is_file()]
    assert not missing, f"`python -m {module}` is given files that do not exist: {missing}"
    help_text = module_help(module)
    for flag in flags(words):
        if flag == "--help":
            continue
        assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text), (
            f"`{flag}` is not in `python -m {module} --help`"
        )
    if module == "launch_cluster":
        files = [w for w in words if w.endswith((".yaml", ".yml"))]
        from launch_cluster import load_cluster_spec

        for name in files:
            load_cluster_spec(ROOT / name)


def check_curl(block: Block, words: list[str]) -> None:
    url = next(w for w in words[1:] if "127.0.0.1" in w or w.startswith("http"))
    path = "/" + url.split("/", 1)[1] if "/" in url.split("//")[-1] else "/"
    assert path in ROUTES, f"{block.where}: {path} is not a route the docs may use"
    if "-d" not in words:
        return
    body = json.loads(words[words.index("-d") + 1])
    headers = {
        words[i + 1].split(":")[0].lower(): words[i + 1].split(":", 1)[1].strip()
        for i, w in enumerate(words)
        if w == "-H"
    }
    on_purpose = [
        field
        for (page, snippet), field in INVALID_ON_PURPOSE.items()
        if _rel(block.page) == page and snippet in block.text
    ]
    if on_purpose:
        with pytest.raises(SloValidationError) as refused:
            extract_slo(body, headers, None, native=path == "/generate")
        assert on_purpose[0] in str(refused.value)
        return
    extract_slo(body, headers, None, native=path == "/generate")


def check_command(block: Block, command: str) -> str:
    """Runs the cheapest faithful form of `command`; returns what was done (or raises)."""
    done = []
    for words in pipeline(command):
        program = Path(words[0]).name
        if words[0] == "./slo":
            assert words[1] in SLO_SUBCOMMANDS and f"  {words[1]})" in (ROOT / "slo").read_text()
            if words[1] == "serve":
                check_module_command("launch_server", words[2:])
            done.append(f"./slo {words[1]}")
        elif program.startswith("python") and words[1:2] == ["-m"]:
            check_module_command(words[2], words[3:])
            done.append(f"python -m {words[2]}")
        elif program.startswith("python") and words[1:2] == ["-c"]:
            ast.parse(words[2])
            done.append("python -c (parsed)")
        elif program in CONSOLE_SCRIPTS:
            check_module_command(CONSOLE_SCRIPTS[program], words[1:])
            done.append(program)
        elif program == "curl":
            check_curl(block, words)
            done.append("curl (body checked)")
        elif program == "bash" and words[1].endswith(".sh"):
            assert (ROOT / words[1]).is_file(), f"{words[1]} is gone"
            done.append(words[1])
        elif _excuse(block):
            done.append("not runnable")
        else:
            raise AssertionError(
                f"{block.where}: no way to check `{' '.join(words)}`: run it or list it in NOT_RUNNABLE"
            )
    return ", ".join(done)


def _block_id(block: Block) -> str:
    return block.where


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang in SHELL_LANGS], ids=_block_id)
def test_shell_block_runs(block: Block) -> None:
    for command in shell_commands(block.text):
        check_command(block, command)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang not in SHELL_LANGS], ids=_block_id)
def test_example_block_parses(block: Block) -> None:
    if block.lang == "json":
        json.loads(block.text)
    elif block.lang == "yaml":
        yaml.safe_load(block.text)
    elif block.lang == "python":
        ast.parse(block.text)
        listed = [k for k in PYTHON_EXAMPLES if _rel(block.page) == k[0] and k[1] in block.text]
        assert listed, (
            f"{block.where}: a Python example must be run by a test or listed in PYTHON_EXAMPLES with why not"
        )
    else:
        assert block.lang == "text", f"{block.where}: a fence needs a language (`text` for output or a tree)"


def test_every_listed_example_names_a_block() -> None:
    listed = [*NOT_RUNNABLE, *PYTHON_EXAMPLES]
    stale = [key for key in listed if not any(_rel(b.page) == key[0] and key[1] in b.text for b in BLOCKS)]
    assert not stale, f"entries that match no block any more: {stale}"


def test_the_first_two_commands_are_serve_and_test() -> None:
    first = shell_commands(next(b for b in BLOCKS if b.page.name == "README.md" and b.lang == "bash").text)
    assert [pipeline(c)[0][:2] for c in first[:2]] == [["./slo", "serve"], ["./slo", "test"]]


def test_the_policy_example_builds_and_plans() -> None:
    block = next(b for b in BLOCKS if b.page.name == "adding-a-policy.md" and b.lang == "python")
    namespace: dict[str, Any] = {}
    exec(compile(block.text, block.where, "exec"), namespace)
    from scheduler.core.policies import PolicyContext
    from scheduler.core.request_view import RequestView
    from scheduler.core.slo import SloSpec
    from scheduler.core.types import EngineView

    entry = namespace["NEWEST_FIRST"]
    policy = entry.factory(entry.params_type(newest=2), PolicyContext())
    waiting = [RequestView(rid=f"r{i}", slo=SloSpec(), arrival=float(i), prompt_len=8) for i in range(4)]
    view = EngineView(
        now=10.0,
        waiting=waiting,
        running=[],
        max_running_requests=8,
        chunk_size=512,
        free_kv_tokens=1000,
        total_kv_tokens=1000,
    )
    assert policy.plan(view).order == ["r3", "r2", "r0", "r1"]


_INLINE_MODULE = re.compile(r"python3? -m ([\w.]+)")


@pytest.mark.parametrize("page", [*PAGES, RESULTS], ids=_rel)
def test_every_module_a_page_names_exists(page: Path) -> None:
    """Prose and the results page name commands too (`python -m benchmarks.x ...`)."""
    import importlib.util

    missing = sorted(
        {
            m
            for m in _INLINE_MODULE.findall(page.read_text())
            if m not in {"pip", "json.tool"} and importlib.util.find_spec(m) is None
        }
    )
    assert not missing, f"{_rel(page)} names modules that do not exist: {missing}"


_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#([\w-]+))?\)")


def _anchors(page: Path) -> set[str]:
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


# Pages written on other branches of this change, linked before they land: a missing one is
# tolerated until it exists (then its anchors are checked too). Remove an entry once merged.
LANDING_ELSEWHERE: dict[str, str] = {}


@pytest.mark.parametrize("page", [*PAGES, RESULTS], ids=_rel)
def test_links_between_pages_resolve(page: Path) -> None:
    """A link to another page (and to a heading in it) lands."""
    broken = []
    for target, anchor in _LINK.findall(page.read_text()):
        path = (page.parent / target).resolve()
        if not path.is_file():
            if path.name not in LANDING_ELSEWHERE:
                broken.append(target)
        elif anchor and anchor not in _anchors(path):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{_rel(page)}: broken links {broken}"


_REPO_PATH = re.compile(
    r"`((?:server|router|scheduler|speculative|launch|wire|benchmarks|tests|setup|deploy|examples|docs)/[\w/.\-]*)"
)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_path_a_page_names_exists(page: Path) -> None:
    """A file or folder named in `code` on a user's page is there (a move updates the page)."""
    missing = sorted(
        {
            path
            for path in (m.split(":")[0].rstrip(".") for m in _REPO_PATH.findall(page.read_text()))
            if not path.endswith("_") and not (ROOT / path).exists() and path.split("/")[-1] != "sglang.md"
        }
    )
    assert not missing, f"{_rel(page)} names paths that do not exist: {missing}"


_INLINE_COMMAND = re.compile(r"`((?:\.venv/bin/)?python3? -m [^`]+)`")


@pytest.mark.parametrize("page", [*PAGES, RESULTS], ids=_rel)
def test_inline_commands_run(page: Path) -> None:
    """A command written in prose (`python -m MODULE --flag ...`) is checked as a block's is."""
    for span in _INLINE_COMMAND.findall(page.read_text()):
        words = shlex.split(" ".join(span.split()))
        if words[2] not in {"pip", "json.tool"}:
            check_module_command(words[2], words[3:])
