"""The README's commands still run: every ``sedd`` command line in it parses with today's CLI,
every JSON body its curl examples send is a valid body of its route, and every keyword its
Python examples pass to ``sedd.load`` or a ``Model`` method is one that method takes.

Cheap and static (nothing is sampled); the commands' behaviour is tested where each command is.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import re
import shlex
from pathlib import Path

import pytest

import sedd
from sedd.cli import _parse
from sedd.engine.forwards import STEP_BYTES_PER_TOKEN
from server.schemas import GenerateRequest, ImputeRequest, PredictRequest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
DOCS = Path(__file__).resolve().parents[1] / "docs"
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, re.S)
BODIES = {"/generate": GenerateRequest, "/predict": PredictRequest, "/impute": ImputeRequest}


def _command_lines() -> list[str]:
    """Every ``sedd ...`` command of 2+ arguments, in inline code or a shell block (a shorter
    one, like ``sedd merge``, names a command rather than running it)."""
    found = set(re.findall(r"`([^`\n]*\bsedd [a-z][^`]*)`", README))
    for lang, block in BLOCKS:
        if lang == "bash":
            found |= {line for line in block.replace("\\\n", " ").splitlines() if "sedd " in line}
    commands = []
    for text in found:
        command = text[text.index("sedd ") :].split("#")[0].split("&&")[0]
        argv = shlex.split(command)[1:]
        if len(argv) >= 3 and "/" not in argv[0]:
            commands.append(command.strip())
    return sorted(commands)


COMMANDS = _command_lines()


def test_the_readme_shows_commands_of_every_kind() -> None:
    shown = {shlex.split(c)[1] for c in COMMANDS}
    assert {"generate", "predict", "impute", "merge", "serve", "bench", "evaluate"} <= shown


@pytest.mark.parametrize("command", COMMANDS)
def test_each_readme_command_parses(command: str) -> None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _parse(shlex.split(command)[1:])
    except SystemExit as stop:
        assert stop.code == 0, f"{command}: {err.getvalue().strip().splitlines()[-1:]}"


def test_each_curl_body_is_a_valid_body_of_its_route() -> None:
    sent = re.findall(
        r"curl [^\n]*?(/\w+) [^\n]*\\\n\s+-d '([^']*)'", README
    )  # (route, body) of every POST example
    assert len(sent) >= 3
    for route, body in sent:
        BODIES[route].model_validate_json(body)  # raises on an unknown or mistyped field


def test_each_python_example_passes_keywords_the_api_takes() -> None:
    methods = {"load": sedd.load, **{m: getattr(sedd.Model, m) for m in ("generate", "predict",
               "impute")}}  # fmt: skip
    calls = 0
    for lang, block in BLOCKS:
        if lang != "python":
            continue
        for node in ast.walk(ast.parse(block)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            method = methods.get(node.func.attr)
            if method is None:
                continue
            calls += 1
            takes = inspect.signature(method).parameters
            for keyword in node.keywords:
                assert keyword.arg in takes, f"{node.func.attr}({keyword.arg}=...) in the README"
    assert calls >= 8


def _section(title: str) -> str:
    """The README's ``## title`` section, up to the next ``## `` heading."""
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : None if end < 0 else end]


def test_the_gpu_set_up_installs_the_test_extra_gpu_check_needs() -> None:
    """``scripts/gpu_check.sh`` starts with ``python -m pytest``: the GPU set-up's install of
    the project must bring the ``test`` extra, or the check fails at its first step."""
    shell = "".join(block for lang, block in re.findall(r"```(\w*)\n(.*?)```",
                    _section("GPU set-up"), re.S) if lang == "bash")  # fmt: skip
    targets = [
        argv[argv.index("-e") + 1]
        for line in shell.splitlines()
        if "pip install" in line and "-e" in (argv := shlex.split(line, comments=True))
    ]
    assert len(targets) == 1, targets  # one editable install of the project
    extras = re.fullmatch(r"\.(?:\[([\w,-]*)\])?", targets[0])
    assert extras is not None, targets[0]
    assert "test" in (extras.group(1) or "").split(","), targets[0]


K562_GENES, K562_TOKENS = 8563, 1724 + 1  # count bins + the mask (scripts/gpu_check.sh's shape)
PROSE = " ".join(README.split())  # wrapped lines joined, so a figure reads as one string


def test_the_k562_memory_figures_count_its_1725_tokens_and_add_up() -> None:
    """The per-row score tensor, recomputed from the shape, and a block step's memory a row."""
    score = r"rows × genes × ([\d,]+) tokens × (\d) bytes: (\d+) rows → ([\d.]+) GB"
    [(tokens, width, rows, gb)] = re.findall(score, PROSE)
    assert int(tokens.replace(",", "")) == K562_TOKENS
    assert float(gb) == round(int(rows) * K562_GENES * K562_TOKENS * int(width) / 1e9, 1)
    # a block step's peak per row, measured on the emulated lane and planned per gene x token
    row = r"([\d]+) MiB a row at the K562 shape \(([\d,]+) genes × ([\d,]+) tokens\)"
    [(mib, genes, tokens)] = re.findall(row, PROSE)
    assert (int(genes.replace(",", "")), int(tokens.replace(",", ""))) == (K562_GENES, K562_TOKENS)
    assert int(mib) == 237  # 16.8 B a gene x token: under the 18 B the block size plans with
    [planned] = re.findall(r"planned at (\d+) bytes per gene × token", PROSE)
    assert int(planned) == STEP_BYTES_PER_TOKEN
    assert int(mib) * 2**20 < K562_GENES * K562_TOKENS * STEP_BYTES_PER_TOKEN


def test_a_30_percent_mfu_plan_is_called_optimistic_beside_the_realistic_range() -> None:
    """Flash attention at head size 32 is exp-bound: 15-20% MFU is what to plan with."""
    docs = [PROSE, *(" ".join(f.read_text().split()) for f in sorted(DOCS.glob("*.md")))]
    uses = [(text, m.start()) for text in docs for m in re.finditer(r"30% MFU", text)]
    for text, at in uses:
        sentence = text[text.rfind(". ", 0, at) : text.find(". ", at)]
        assert "optimistic" in sentence, sentence
    assert "15–20% MFU" in PROSE
