"""The README and the docs pages it links to: the README fits on a few screens (the two
commands, the Python API in brief, the command table, links) and every page it links to exists
and is in the site's nav; the rest of what it used to hold lives in those pages (``docs/*.md``),
and each check below reads the README and the pages together, so a claim is checked wherever
its text now lives.

Their commands still run: every ``sedd`` command line parses with today's CLI, every JSON body
a curl example sends is a valid body of its route, and every keyword a Python example passes to
``sedd.load`` or a ``Model`` method is one that method takes.

Cheap and static (nothing is sampled); the commands' behaviour is tested where each command is.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import io
import re
import shlex
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml

import sedd
from sedd.cli import _parse
from sedd.engine.forwards import STEP_BYTES_PER_TOKEN
from sedd.request.plan import SamplingOptions
from server.schemas import GenerateRequest, ImputeRequest, PredictRequest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
# The README and every page of the site beside the API reference: name -> text.
TEXTS = {"README.md": README} | {
    f"docs/{page.name}": page.read_text() for page in sorted(DOCS.glob("*.md"))
}
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)
BLOCKS = [block for text in TEXTS.values() for block in FENCE.findall(text)]
MAX_README_LINES = 200
BODIES = {"/generate": GenerateRequest, "/predict": PredictRequest, "/impute": ImputeRequest}


def _command_lines() -> list[str]:
    """Every ``sedd ...`` command of 2+ arguments, in inline code or a shell block of the README
    or a docs page (a shorter one, like ``sedd merge``, names a command rather than running it)."""
    inline = re.compile(r"`([^`\n]*\bsedd [a-z][^`]*)`")
    found = {command for text in TEXTS.values() for command in inline.findall(text)}
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


def _curl_bodies(text: str) -> list[tuple[str, str]]:
    """(route, body) of every POST example."""
    return re.findall(r"curl [^\n]*?(/\w+) [^\n]*\\\n\s+-d '([^']*)'", text)


def test_each_curl_body_is_a_valid_body_of_its_route() -> None:
    assert len(_curl_bodies(README)) >= 3  # the main job's examples stay in the README
    sent = [pair for text in TEXTS.values() for pair in _curl_bodies(text)]
    for route, body in sent:
        BODIES[route].model_validate_json(body)  # raises on an unknown or mistyped field


API_METHODS = {"load": sedd.load, **{m: getattr(sedd.Model, m) for m in ("generate", "predict",
               "impute")}}  # fmt: skip


def _api_calls(blocks: list[tuple[str, str]]) -> list[ast.Call]:
    """The calls of ``sedd.load`` and the ``Model`` methods in the Python blocks."""
    return [
        node
        for lang, block in blocks
        if lang == "python"
        for node in ast.walk(ast.parse(block))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in API_METHODS
    ]


def _keywords_taken(method: Any) -> set[str]:
    """The keywords ``method`` takes: its parameters, and where it gathers ``**options``, the
    sampling options (the fields of ``SamplingOptions``, which reject any other name)."""
    parameters = inspect.signature(method).parameters
    taken = {name for name, p in parameters.items() if p.kind is not p.VAR_KEYWORD}
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        taken |= {f.name for f in dataclasses.fields(SamplingOptions)}
    return taken


def test_each_python_example_passes_keywords_the_api_takes() -> None:
    calls = _api_calls(BLOCKS)
    for node in calls:
        assert isinstance(node.func, ast.Attribute)
        takes = _keywords_taken(API_METHODS[node.func.attr])
        for keyword in node.keywords:
            assert keyword.arg in takes, f"{node.func.attr}({keyword.arg}=...) in the docs"
    assert len(calls) >= 8
    # the README's own example shows each of the four
    shown = {node.func.attr for node in _api_calls(FENCE.findall(README))}  # type: ignore[union-attr]
    assert shown == set(API_METHODS), shown


def test_the_gpu_set_up_installs_the_test_extra_gpu_check_needs() -> None:
    """``scripts/gpu_check.sh`` starts with ``python -m pytest``: the GPU set-up's install of
    the project (docs/gpu.md) must bring the ``test`` extra, or the check fails at its first
    step."""
    page = TEXTS["docs/gpu.md"]
    assert page.startswith("# GPU set-up\n"), page[:40]
    shell = "".join(block for lang, block in FENCE.findall(page) if lang == "bash")
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
# wrapped lines joined, so a figure reads as one string; the README and every page, each apart
PROSES = {name: " ".join(text.split()) for name, text in TEXTS.items()}
PROSE = "\n".join(PROSES.values())


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
    uses = [(text, m.start()) for text in PROSES.values() for m in re.finditer(r"30% MFU", text)]
    assert uses  # the one-million-cell plan (docs/slurm.md) names it
    for text, at in uses:
        sentence = text[text.rfind(". ", 0, at) : text.find(". ", at)]
        assert "optimistic" in sentence, sentence
    assert "15–20% MFU" in PROSE


def test_the_readme_fits_on_a_few_screens() -> None:
    lines = README.splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_test_command_is_the_one_ci_runs_first() -> None:
    """``.ci/run``'s first step is the README's test command, character for character."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    step = next(i for i, line in enumerate(ci) if line.startswith('step "README test command'))
    command = ci[step + 1]
    assert "pytest -q" in command and "ruff check ." in command, command
    assert "ruff format --check ." in command, command  # the formatter, in CI
    # the slow end-to-end tests the README's command skips are CI's very next step
    assert "-m 'not slow'" in command and ci[step + 4].endswith(
        "pytest -q -p no:cacheprovider -m slow"
    )
    shell = [line for lang, block in FENCE.findall(README) if lang == "bash" for line in
             block.splitlines()]  # fmt: skip
    assert command in shell, command
    install = "python3 -m venv .venv && .venv/bin/pip install -q torch==2.13.0 -e . && "
    assert install + ".venv/bin/sedd serve" in shell


def _slugs(heading: str) -> tuple[str, str]:
    """The anchor of a heading as mkdocs gives it (Python-Markdown's toc: ASCII, runs of spaces
    and hyphens made one hyphen) and as GitHub does (each space a hyphen, nothing collapsed).
    Code spans keep their text in both."""
    text = heading.replace("`", "").strip()
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    mkdocs = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_text).strip().lower())
    github = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
    return mkdocs, github


def _anchors(text: str) -> set[str]:
    """The anchors of a page's headings that are the same on the site and on GitHub (a link
    from the README is followed on GitHub, one between pages on both)."""
    prose = FENCE.sub("", text)  # a '#' line inside a code block is no heading
    slugs = [_slugs(title) for title in re.findall(r"^#{1,6} (.+)$", prose, re.M)]
    return {mkdocs for mkdocs, github in slugs if mkdocs == github}


def _nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    values = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    return [page for value in values for page in _nav_pages(value)]


def test_every_docs_page_the_readme_links_exists_is_in_the_nav_and_has_the_anchor() -> None:
    nav = set(_nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([\w-]+))?\)", README)
    assert len(links) >= 10, links
    for target, anchor in links:
        path = ROOT / target
        assert path.is_file(), f"README links {target}, which does not exist"
        assert Path(target).relative_to("docs").as_posix() in nav, f"{target} is not in the nav"
        if anchor:
            assert anchor in _anchors(path.read_text()), f"README links {target}#{anchor}"
    # every other relative link in the README points at a file of the repository
    for target in re.findall(r"\]\((?!https?://|#)([^)#\s]+)", README):
        assert (ROOT / target).exists(), f"README links {target}, which does not exist"


def test_every_page_of_the_site_is_reachable_from_the_readme() -> None:
    """What moved out of the README stays one click away: each page of the nav but the API
    reference (reached from the index and from docs/reference/api.md's link) is linked from it."""
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    linked = set(re.findall(r"\]\(docs/([^)#\s]+)", README))
    unlinked = [page for page in nav if page != "index.md" and not page.startswith("reference/")
                and page not in linked]  # fmt: skip
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
    assert "reference/api.md" in linked


def test_links_between_the_pages_name_an_existing_page_and_heading() -> None:
    """Cross-page links in docs/*.md (the strict build checks them too; this runs without
    mkdocs)."""
    checked = 0
    for name, text in TEXTS.items():
        if name == "README.md":
            continue
        for target, anchor in re.findall(r"\]\(([\w/-]+\.md)?(?:#([\w-]+))?\)", text):
            page = DOCS / target if target else ROOT / name
            assert page.is_file(), f"{name} links {target}"
            if anchor:
                assert anchor in _anchors(page.read_text()), f"{name} links {target}#{anchor}"
            checked += 1
    assert checked >= 20, checked
