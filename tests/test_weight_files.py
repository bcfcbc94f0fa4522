"""A weight file that cannot be read safely is one line naming the file and saying what to do: a
safetensors file cut short or full of random bytes, a truncated pickle, and a pickle that would run code
(refused in our words, never with a hint to turn the safety off), through every drafter-weight loader."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

from eagle2.heads.checkpoint import WeightFileError, load_weight_file
from eagle2.heads.eagle_head import load_head, save_head
from tests.conftest import tiny_head, tiny_llama


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pickled code ran",))


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=16, layers=1)


def damaged(tmp_path, how: str):
    path = tmp_path / ("w.safetensors" if "safetensors" in how else "w.bin")
    state = {"a": torch.randn(64, 64)}
    if "safetensors" in how:
        save_file(state, str(path))
    else:
        torch.save(state, path)
    data = path.read_bytes()
    path.write_bytes({"truncated safetensors": data[:40], "cut safetensors": data[: len(data) // 2],
                      "random bytes safetensors": os.urandom(4096), "truncated bin": data[: len(data) // 2],
                      "empty bin": b""}[how])
    return path


@pytest.mark.parametrize("how", ["truncated safetensors", "cut safetensors", "random bytes safetensors",
                                 "truncated bin", "empty bin"])
def test_a_damaged_file_is_named_with_what_to_do(tmp_path, how):
    path = damaged(tmp_path, how)
    with pytest.raises(WeightFileError) as err:
        load_weight_file(path)
    message = str(err.value)
    assert str(path) in message and "download or save it again" in message and "\n" not in message


def test_code_in_a_pickle_is_refused_in_our_words(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({"a": torch.ones(2), "b": Payload()}, path)
    with pytest.raises(WeightFileError) as err:
        load_weight_file(path)
    message = str(err.value)
    assert message.startswith(f"refused: {path} is a pickle, which can run code (it calls")
    assert "convert it to safetensors" in message
    assert "weights_only" not in message and "\n" not in message and err.value.__cause__ is None


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_a_loader_names_the_damaged_file(target, tmp_path, name):
    folder = save_head(tiny_head(target), tmp_path / "head")
    if name == "pytorch_model.bin":
        torch.save(load_weight_file(folder / "model.safetensors"), folder / name)
        (folder / "model.safetensors").unlink()
    (folder / name).write_bytes((folder / name).read_bytes()[:100])
    with pytest.raises(WeightFileError, match=f"cannot read {folder / name}: "):
        load_head(folder, target)
