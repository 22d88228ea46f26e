"""SceneTestCase parameters are free-form: a registered scene's come from what the scene
registry declares, and a hand-written case names its own (issue 12)."""
import dataclasses

import numpy as np
import pytest
import torch

import pinstage
from pinstage.scene import ParamsBase, RegisteredSceneCase, SceneTestCase, params_class


def test_registered_case_takes_what_the_registry_declares():
    for name in pinstage.scene_names():
        case = RegisteredSceneCase(name)
        declared = pinstage.scene_params(name)
        fields = dataclasses.fields(case.params_class)
        assert [f.name for f in fields] == [p["name"] for p in declared]
        assert [f.default for f in fields] == [p["default"] for p in declared]
        first = declared[0]["name"]
        parsed = case.parse_params(f"{first}={declared[0]['default']}")
        assert getattr(parsed, first) == declared[0]["default"]
        with pytest.raises(pinstage.InvalidArgumentError,
                           match=r"unknown scene parameter 'nosuch' \(valid: "):
            case.parse_params("nosuch=1")


@dataclasses.dataclass(frozen=True)
class GridParams(ParamsBase):
    rows: int = 4
    cols: int = 3


class GridCase(SceneTestCase):
    """A hand-written case whose parameters are neither seed, seq_len nor layers."""

    name = "grid"
    params_class = GridParams

    def generate_args(self, params):
        args = pinstage.TaskArgs()
        args.add("x", torch.ones(params.rows, params.cols))
        return args


def test_hand_written_case_declares_its_own_parameters():
    case = GridCase()
    assert case.parse_params() == GridParams(4, 3)
    assert case.parse_params("rows=7", cols=np.int64(2)) == GridParams(7, 2)
    assert case.make_args({"rows": 2}).describe()[0]["shape"] == (2, 3)
    with pytest.raises(pinstage.InvalidArgumentError, match=r"valid: rows, cols"):
        case.parse_params("layers=1")


def test_params_class_is_a_frozen_dataclass_of_the_scene():
    cls = params_class("qwen3-decode")
    assert cls.__name__ == "Qwen3DecodeParams" and issubclass(cls, ParamsBase)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cls().layers = 2
