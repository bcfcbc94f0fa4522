"""A target spread over two GPUs, on a CPU: every tensor meets its consumer's device.

``tests.virtual_devices`` gives tensors a virtual device (computing on the CPU) and raises torch's
device-mismatch error when an operation mixes two. The target is split as ``device_map: auto`` splits
it (embedding and layer 0 on cuda:0; the last layer, the final norm and the LM head on cuda:1), with
pre-hooks that move each placed module's inputs to its device, as accelerate's hooks do; the draft head
sits on ``target.device`` (cuda:0). Each test decodes (or commits) on that split and checks the output
equals the same run on the host; the negative controls are the crossings done the old way.

This exercises who meets whom, not GPUs: no asynchrony, no peer-to-peer copies, no memory limits.
"""

from __future__ import annotations

import pytest
import torch

from eagle2.core.cache import forward_target, keep_tree_path, new_cache
from eagle2.core.engine import generate
from eagle2.core.features import LayerTap
from eagle2.core.sampling import SamplingParams
from eagle2.drafters.eagle2_dynamic import Eagle2Drafter
from tests.conftest import tiny_eagle3_head, tiny_head, tiny_llama
from tests.virtual_devices import VirtualDevices

FIRST, LAST = torch.device("cuda", 0), torch.device("cuda", 1)
PROMPT = [3, 4, 5, 6, 7]


@pytest.fixture(autouse=True)
def host_clock(monkeypatch):
    """Timing on the host clock: CUDA events need CUDA (timing is not what these tests check)."""
    monkeypatch.setattr("eagle2.core.clock.uses_events", lambda device: False)


def move_inputs(vd: VirtualDevices, device):
    """A forward pre-hook moving every tensor argument to ``device`` (what accelerate's hooks do)."""

    def to(obj):
        if torch.is_tensor(obj):
            return obj.to(device)
        if isinstance(obj, tuple):
            return tuple(to(o) for o in obj)
        return obj

    def hook(module, args, kwargs):
        return to(args), {k: to(v) for k, v in kwargs.items()}

    return hook


def split(vd: VirtualDevices, target, cut: int | None = None):
    """Place ``target`` over cuda:0 (embedding, layers before ``cut``) and cuda:1 (the rest, norm, LM head)."""
    layers = target.model.layers
    cut = len(layers) // 2 if cut is None else cut
    vd.place(target, FIRST)
    for module in [*layers[cut:], target.model.norm, target.lm_head]:
        vd.place(module, LAST)
    for i, module in enumerate([*layers, target.model.norm, target.lm_head]):
        device = FIRST if i < cut else LAST
        module.register_forward_pre_hook(move_inputs(vd, device), with_kwargs=True)
    return target


def decode(target, head, **drafting):
    """(the output, the drafter) of one greedy EAGLE-2 decoding."""
    drafter = Eagle2Drafter(head, target.lm_head, target.device, depth=3, top_k=3, total_tokens=8, **drafting)
    return generate(target, drafter, PROMPT, SamplingParams(), 24, set()), drafter


def on_two_devices(make_head, layers=2, **drafting):
    """(output on the host, output on the split target, the device of the split run's drafting LM head) for a
    head built by ``make_head(target)``. The host run goes first: a drafting LM head copy it made must not
    be reused on the split target (a copy lives on the device of the head it copies)."""
    target = tiny_llama(vocab=64, layers=layers, seed=0, scale=3.0)
    head = make_head(target)
    with torch.no_grad():
        host = decode(target, head, **drafting)[0].output_ids
        with VirtualDevices() as vd:
            split(vd, target)
            vd.place(head, FIRST)
            head.attach_embedding(target.get_input_embeddings())  # the head reads the target's (cuda:0)
            assert target.device == FIRST and target.lm_head.weight.device == LAST
            spread, drafter = decode(target, head, **drafting)
            lm_head_device = next(drafter.lm_head.parameters()).device
    return host, spread.output_ids, lm_head_device


def test_virtual_devices_raise_torchs_mismatch_error():
    """The harness itself: a mix raises, a moved tensor does not (else every test below is vacuous)."""
    with VirtualDevices() as vd:
        a, b = torch.ones(2, device=FIRST), torch.ones(2).to(LAST)
        with pytest.raises(RuntimeError, match="same device"):
            a + b
        assert (a + b.to(a.device)).device == FIRST and b.device == LAST
        linear = vd.place(torch.nn.Linear(2, 2), LAST)
        with pytest.raises(RuntimeError, match="same device"):
            linear(a)
        assert a.sum().tolist() == 2.0 and (vd.reads, vd.writes) == (1, 1)  # b's copy, a read: two syncs
        made = torch.nn.Linear(2, 2, device=LAST)  # parameters made inside the mode keep their device
        assert made.weight.device == LAST and made.bias.device == LAST
        with pytest.raises(RuntimeError, match="same device"):
            made(a)
        torch.ones(2).to(LAST)  # a blocking host-to-device copy: a sync too
        torch.ones(2).to(LAST, non_blocking=True)  # not this one
        torch.tensor([1, 2], device=LAST)  # data from the host: a copy
        torch.zeros(2, device=LAST)  # made on the device: no copy
        assert (vd.reads, vd.writes, vd.syncs) == (1, 3, 4)


def test_eagle2_on_a_target_over_two_devices():
    host, spread, _ = on_two_devices(lambda t: tiny_head(t, seed=1))
    assert spread == host


def test_reduced_vocabulary_and_bf16_drafting_head_over_two_devices():
    """The drafting LM head's copy (bf16, a reduced vocabulary) lives with the target's, on cuda:1."""
    vocab = torch.arange(0, 64, 2)
    host, spread, lm_head_device = on_two_devices(lambda t: tiny_head(t, seed=1), lm_head_dtype=torch.bfloat16,
                                                  vocab=vocab)
    assert spread == host and lm_head_device == LAST


def test_a_drafting_copy_on_the_wrong_device_is_caught(monkeypatch):
    """The control of the test above: a copy made on the head's device (cuda:0) instead of the target LM
    head's is seen (the decoding itself still agrees: every crossing moves its input)."""
    import eagle2.drafters.eagle_common as common

    made = common.drafting_lm_head

    def on_first(lm_head, dtype=None, vocab=None):
        copy = made(lm_head, dtype, vocab)
        if lm_head.weight.device.type == "cpu":  # the host run
            return copy
        moved = torch.nn.Linear(copy.in_features, copy.out_features, bias=copy.bias is not None, device=FIRST,
                                dtype=copy.weight.dtype)
        moved.weight.copy_(copy.weight.to(FIRST))
        return moved

    monkeypatch.setattr(common, "drafting_lm_head", on_first)
    _, _, lm_head_device = on_two_devices(lambda t: tiny_head(t, seed=1), lm_head_dtype=torch.bfloat16,
                                          vocab=torch.arange(0, 64, 2))
    assert lm_head_device == FIRST


def test_eagle3_taps_over_two_devices():
    """EAGLE-3 fuses inputs of layers on both devices: the tap brings them to the head's."""
    host, spread, _ = on_two_devices(lambda t: tiny_eagle3_head(t, seed=2), layers=4)
    assert spread == host


def test_layer_tap_reads_onto_its_device():
    target = tiny_llama(vocab=64, layers=4, seed=0)
    with torch.no_grad(), VirtualDevices() as vd:
        split(vd, target)
        with LayerTap(target, (0, 3), device=FIRST) as tap:
            forward_target(target, torch.tensor([PROMPT], device=FIRST), new_cache(target))
            assert tap.captured[0].device == FIRST and tap.captured[3].device == LAST
            assert tap.read().device == FIRST


@pytest.mark.parametrize("in_place", [True, False])
def test_keep_tree_path_indexes_each_layer_on_its_device(in_place):
    """A verify forward over a 6-node tree, then keep nodes 0, 2, 5: each layer's cache is on its GPU."""
    target = tiny_llama(vocab=64, layers=2, seed=0)
    tree_ids = torch.tensor([[9, 10, 11, 12, 13, 14]])

    def commit(device):
        cache = new_cache(target, in_place)
        forward_target(target, torch.tensor([PROMPT], device=device), cache)
        forward_target(target, tree_ids.to(device), cache)  # a chain stands for a tree: the commit is the same
        keep_tree_path(cache, len(PROMPT), [0, 2, 5])
        return [(layer.keys.cpu(), layer.values.cpu()) for layer in cache.layers]

    with torch.no_grad():
        host = commit("cpu")
        with VirtualDevices() as vd:
            split(vd, target)
            spread = commit(FIRST)
    for (k, v), (k2, v2) in zip(host, spread):
        assert torch.equal(k, k2) and torch.equal(v, v2)
