"""One ``SamplingOptions`` value: declared once, checked once, refused alike at every front door.

A sampling option is a field of ``sedd.defaults.SamplingOptions`` (the Python keyword and the CLI
flag follow from it) and a field of the HTTP body; nothing else declares it. An invalid value is
refused naming the same field through the Python API, ``sedd generate`` and HTTP.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from devices import DEVICE
from server_client import make_settings, served
from server_models import PERTURBATIONS, save_tiny_model

import sedd
from sedd.checkpoints import load_checkpoint
from sedd.cli import _parse
from sedd.cli import main as sedd_main
from sedd.commands.output import request_from_args
from sedd.defaults import OPTION_NAMES, OptionError, SamplingOptions
from server.errors import FieldError
from server.intake import plan_body
from server.schemas import GenerateRequest, ImputeRequest, PredictRequest

# (field, a value every front door can carry but the option refuses)
BAD = [("steps", 0), ("temperature", 0.0), ("seed", -1), ("sampler", "ddpm"), ("time_grid", "log")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("options") / "tiny")


def test_the_value_checks_itself_and_names_the_field():
    for name, value in BAD:
        with pytest.raises(OptionError, match=f"^`{name}` must be .*, got {value!r}\\.$") as err:
            SamplingOptions(**{name: value})
        assert err.value.field == name
    with pytest.raises(OptionError, match="`temperature` must be finite and > 0, got nan"):
        SamplingOptions(temperature=math.nan)
    with pytest.raises(OptionError, match=r"`stepz` is not a sampling option \(steps, "):
        SamplingOptions.resolve(stepz=3)
    # numpy scalars and ints are taken as the plain numbers they are: records match
    assert SamplingOptions(temperature=1).record() == SamplingOptions(temperature=1.0).record()


def test_every_option_is_a_flag_a_keyword_and_a_body_field(model_dir: Path):
    """The two declarations: the value's fields are the HTTP bodies' fields; the CLI builds its
    flags from the value, and the API takes them as keywords (``Model.generate(**options)``)."""
    for body in (GenerateRequest, PredictRequest, ImputeRequest):
        assert set(OPTION_NAMES) <= set(body.model_fields), body
    args = _parse(["generate", "--model", str(model_dir), "--out", "x.h5ad",
                   "--steps", "3", "--time-grid", "cosine", "--sampler", "analytic",
                   "--temperature", "0.5", "--seed", "9"])  # fmt: skip
    request = request_from_args(args, cells_per_condition=1, conditions=None)
    assert request.sampling == SamplingOptions(3, "cosine", "analytic", 0.5, 9)
    # the fields' own names, nothing renamed on the way
    assert [f.name for f in dataclasses.fields(SamplingOptions)] == list(OPTION_NAMES)


@pytest.mark.anyio
@pytest.mark.parametrize(("name", "value"), BAD)
async def test_an_invalid_option_is_refused_naming_its_field_at_every_front_door(
    model_dir: Path, capsys: pytest.CaptureFixture[str], name: str, value: object
):
    condition = PERTURBATIONS[0]
    # the Python API
    model = sedd.load(model_dir, device=str(DEVICE), precision="fp32")
    with pytest.raises(OptionError, match=f"`{name}`") as err:
        model.generate(1, condition=condition, **{name: value})
    assert err.value.field == name
    # the CLI: one line on stderr naming the field, exit 2
    flag = "--" + name.replace("_", "-")
    argv = ["generate", "--model", str(model_dir), "--conditions", condition, "--cells", "1",
            "--out", "never.h5ad", flag, str(value)]  # fmt: skip
    try:
        code = sedd_main(argv)
    except SystemExit as exit_:  # argparse's own refusal of a choice: its usage line + error
        code = exit_.code
    err_text = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and (f"`{name}`" in err_text or f"argument {flag}" in err_text), err_text
    # HTTP: a 422 whose loc is the body's field of the same name
    async with served(make_settings(model_dir)) as (client, _):
        r = await client.post("/generate", json={"condition": condition, name: value})
    assert r.status_code == 422, r.text
    assert [item["loc"] for item in r.json()["detail"]] == [["body", name]]


def test_the_server_maps_the_values_own_error_to_the_body_field(model_dir: Path):
    """A body that got past the schema's bounds still meets the value's check, and its error
    takes the body's field as ``loc`` (in ``plan_body``, the one place)."""
    loaded = load_checkpoint(model_dir)
    body = GenerateRequest.model_construct(
        **{**GenerateRequest().model_dump(), "condition": PERTURBATIONS[0],
           "temperature": math.inf}
    )  # fmt: skip
    with pytest.raises(FieldError) as err:
        plan_body(loaded, make_settings(model_dir), body)
    assert err.value.loc == ["body", "temperature"]
    assert "`temperature` must be finite and > 0, got inf" in err.value.msg


def _another_value(options: SamplingOptions, name: str) -> object:
    """A valid value of option ``name`` other than its value in ``options``, found from the
    value's own type (numbers moved; words: the first other choice the value accepts)."""
    value = getattr(options, name)
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise AssertionError(f"no test value for option {name!r} of type {type(value)}")
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 + 0.25
    from sedd.defaults import PREDICTORS, TIME_GRIDS

    for word in (*PREDICTORS, *TIME_GRIDS):
        if word != value:
            try:
                return dataclasses.replace(options, **{name: word}).__getattribute__(name)
            except OptionError:
                continue
    raise AssertionError(f"no other valid value of option {name!r}")


def test_every_sampling_option_changes_the_run_id(model_dir: Path):
    """The record (run ids, shard identities, provenance) comes from the options' fields, so a
    new option can never leave two requests with different values under one run id (a shard
    resume with another value would not be refused). An option recorded only where it acts is
    changed where it acts (entropy_bound: under the entropy sampler)."""
    from sedd.request.plan import GenerationRequest, run_id

    loaded = load_checkpoint(model_dir)
    settings = (SamplingOptions(), SamplingOptions(sampler="entropy"),
                SamplingOptions(time_grid="cosine"))  # fmt: skip
    for name in OPTION_NAMES:
        when = dataclasses.fields(SamplingOptions)[OPTION_NAMES.index(name)].metadata.get(
            "recorded_when"
        )
        # the first setting where the option acts (is recorded)
        options = next(o for o in settings if when is None or when(o))
        changed = dataclasses.replace(options, **{name: _another_value(options, name)})
        ids = {run_id(loaded, GenerationRequest(conditions=(PERTURBATIONS[0],),
                                                cells_per_condition=1, sampling=o))
               for o in (options, changed)}  # fmt: skip
        assert len(ids) == 2, f"changing {name} left the run id as it was"
    # and the records of earlier requests are as they were (their run ids hold)
    assert SamplingOptions(steps=5, seed=3).record() == {
        "steps": 5, "sampler": "euler", "temperature": 1.0, "seed": 3}  # fmt: skip


def test_a_new_option_is_recorded_without_a_list_to_update():
    """What failed before the record was derived: a field added to the options was missing
    from the record, so two values of it shared a run id and a shard identity."""

    @dataclasses.dataclass(frozen=True)
    class WithNewOption(SamplingOptions):
        guidance: float = 1.0

    assert WithNewOption(guidance=2.0).record()["guidance"] == 2.0
    assert WithNewOption(guidance=2.0).record() != WithNewOption(guidance=3.0).record()
