"""YAML configs are read within bounds (``sedd.io.yaml_files``): what ``yaml.safe_load`` reads
reads the same, while a "billion laughs" alias bomb, an oversized file, a device and a recursive
document are refused at once with one line naming the file, through the library and through the
two entry points that read YAML (st3's ``--config`` and ``sedd info`` on a reference run)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

from sedd.cli import main
from sedd.commands.st3_config import ConfigError, yaml_value
from sedd.commands.st3_scripts import inference_generation
from sedd.commands.st3_words import script_main
from sedd.io.yaml_files import MAX_BYTES, MAX_NODES, YamlFileError, read_yaml

CONFIG = """\
defaults: &defaults
  seed: 42
  lr: 3.0e-4
  tags: [a, b, null, true]
data:
  data_path: /data/cells.h5ad
inference:
  <<: *defaults
  num_generate: 10
  perturbations: [GENE_A, GENE_B]
other: {note: "quoted: text", empty: ~}
"""


def _bomb(path: Path, levels: int = 9) -> Path:
    """The billion laughs: each level a list of nine aliases to the level below, so nine levels
    expand to 9**9 (387,420,489) scalars from under 500 bytes."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for level in range(1, levels):
        aliases = ", ".join([f"*l{level - 1}"] * 9)
        lines.append(f"l{level}: &l{level} [{aliases}]")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_normal_config_reads_as_safe_load_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    data = read_yaml(path, what="--config")
    assert data == yaml.safe_load(CONFIG)
    assert data["inference"]["seed"] == 42 and data["inference"]["tags"] == ["a", "b", None, True]
    (tmp_path / "empty.yaml").write_text("")
    assert read_yaml(tmp_path / "empty.yaml", what="--config") is None


def test_shared_aliases_within_the_limit_are_read(tmp_path: Path) -> None:
    """Four levels of the bomb (9**4 = 6,561 scalars) are a legitimate, if odd, document."""
    data = read_yaml(_bomb(tmp_path / "small.yaml", levels=4), what="--config")
    assert data == yaml.safe_load((tmp_path / "small.yaml").read_text())
    assert len(data["l3"]) == 9 and data["l3"][8][8][8] == ["x"] * 9


def test_the_nine_level_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    path = _bomb(tmp_path / "bomb.yaml")
    assert path.stat().st_size < 500
    start = time.monotonic()
    with pytest.raises(YamlFileError) as err:
        read_yaml(path, what="--config")
    assert time.monotonic() - start < 5  # generous: it takes milliseconds
    assert str(err.value) == (
        f"--config {path}: expands to more than {MAX_NODES:,} YAML nodes (each alias counted "
        "as the whole node it names), far more than a config holds; write the values out once "
        "or use fewer aliases."
    )


def test_an_oversized_file_is_refused_by_its_size(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("# padding\n" * (MAX_BYTES // 10 + 1))  # a comment only: valid YAML
    with pytest.raises(YamlFileError) as err:
        read_yaml(path, what="reference SEDD run config")
    size = path.stat().st_size
    assert str(err.value) == (
        f"reference SEDD run config {path}: {size:,} bytes, over the 1 MiB a YAML config may "
        "have; pass the config file itself, not a data file."
    )


def test_an_endless_device_is_read_no_further_than_the_limit() -> None:
    with pytest.raises(YamlFileError, match=r"^--config /dev/zero: more than 1,048,576 bytes"):
        read_yaml("/dev/zero", what="--config")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a: &a [1, *a]\n", "the node at line 1 holds an alias to itself"),
        ("[" * 5000 + "]" * 5000, "nested too deeply to be a config"),
        ("a: [1, 2\n", "not valid YAML (while parsing a flow sequence); fix or replace it."),
    ],
    ids=["recursive", "deep", "invalid"],
)
def test_documents_that_cannot_be_a_config_are_one_line_errors(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(YamlFileError) as err:
        read_yaml(path, what="--config")
    assert str(err.value).startswith(f"--config {path}: {problem}")
    assert "\n" not in str(err.value)


def test_the_node_limit_counts_nodes_as_written_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long flat list is refused like a bomb (here under a limit of 100 nodes: the list and
    its items), and composing stops at the limit: the syntax error after it is never reached."""
    monkeypatch.setattr("sedd.io.yaml_files.MAX_NODES", 100)
    path = tmp_path / "c.yaml"
    path.write_text("[" + "1, " * 98 + "1]")  # 99 items
    assert read_yaml(path, what="--config") == [1] * 99
    path.write_text("[" + "1, " * 99 + "1]")  # 100 items
    with pytest.raises(YamlFileError, match=r"expands to more than 100 YAML nodes"):
        read_yaml(path, what="--config")
    path.write_text("[" + "1, " * 200 + "1]]")  # the stray "]" is past the limit
    with pytest.raises(YamlFileError, match=r"expands to more than 100 YAML nodes"):
        read_yaml(path, what="--config")


def test_the_st3_config_reader_reports_a_bomb_as_its_config_error(tmp_path: Path) -> None:
    path = _bomb(tmp_path / "bomb.yaml")
    with pytest.raises(ConfigError, match=rf"^--config {path}: expands to more than"):
        yaml_value(str(path), "inference", "output_path")


def test_the_st3_generation_script_refuses_a_bomb_in_one_line_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``scripts/inference_generation.py --config BOMB``, in process: the YAML is read before
    any model, so the missing experiment directory is never reached."""
    path = _bomb(tmp_path / "bomb.yaml")
    argv = ["inference_generation.py", "--experiment_dir", str(tmp_path / "exp"),
            "--config", str(path)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    start = time.monotonic()
    with pytest.raises(SystemExit) as done:
        script_main(inference_generation)
    assert time.monotonic() - start < 5
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"inference_generation.py: error: --config {path}: expands to more")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_sedd_info_refuses_a_reference_run_whose_config_is_a_bomb(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "checkpoints-meta").mkdir()
    (run / "checkpoints-meta" / "checkpoint.pth").write_bytes(b"")  # never read: config first
    config = _bomb(run / ".hydra" / "config.yaml")
    start = time.monotonic()
    assert main(["info", str(run)]) == 2
    assert time.monotonic() - start < 5
    err = capsys.readouterr().err
    assert err.startswith(
        f"sedd info: error: reference SEDD run config {config}: expands to more than "
    )
    assert err.count("\n") == 1 and "Traceback" not in err
