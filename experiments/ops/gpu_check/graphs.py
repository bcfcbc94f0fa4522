"""The GPU check's ``cuda_graphs`` stage: the compiled path (``eagle2.core.compiled``, ``engine.compile=true``)
with CUDA graphs at the Vicuna-7B shape, in its config's dtype.

Plain decoding and EAGLE-2 (the model config's budget), greedy, decode the same planted prompts first on the
eager path, then on the compiled one (the target's forward captured as CUDA graphs by inductor, one per query
bucket and cache span). Each row gives both outputs' agreement, tokens per second both ways (after a warm-up
that compiles and records, ``compile_s``), the implicit host-device syncs per round both ways, and inductor's
count of graphs it declined to capture (``cudagraph_skips``). On a CPU (the CPU half) there are no CUDA graphs:
the static path's lean forward runs uncompiled against eager on the narrow proxy, so the stage's plumbing and
the static path's identity are still checked, and the row says the graphs were skipped.
"""

from __future__ import annotations

import torch

from eagle2.core.clock import device_clock
from eagle2.core.engine import generate
from eagle2.core.sampling import SamplingParams
from experiments.ops.gpu_check import models as gm
from experiments.ops.gpu_check.models import config_dtype, drafter, eagle2_budget
from experiments.ops.gpu_check.verify_timing import count_syncs

CRITERION = ("CUDA: compiled tokens == eager tokens, 0 cudagraph skips, implicit syncs per round <= eager's; "
             "CPU: the uncompiled static path's tokens == eager's")


def _timed(run, device) -> tuple[object, float]:
    start = device_clock(device)
    out = run()
    return out, device_clock(device) - start


def cuda_graphs(scale, emit) -> None:
    from eagle2.core.compiled import attach
    from eagle2.drafters.plain import PlainDrafter

    name = "vicuna7b"
    cuda = torch.device(scale.device).type == "cuda"
    dtype, budget = config_dtype(name), eagle2_budget(name, scale)
    target = gm.half_copy(gm.peaked_target(gm.target_config(name, scale.layers, scale.head_dim), scale.device), dtype)
    head = gm.planted_head(target)
    prompts = [gm.planted_prompt(target, scale.prompt_len, seed=500 + i) for i in range(scale.prompts)]
    methods = {"plain": PlainDrafter, "eagle2": lambda: drafter(head, target, budget)}

    def decode(make) -> list:
        return [generate(target, make(), prompt, SamplingParams(), scale.new_tokens, set()) for prompt in prompts]

    eager = {}
    for method, make in methods.items():
        decode(make)  # warm-up
        eager[method] = _timed(lambda m=make: decode(m), target.device)
    decoder = attach(target, compile=cuda)
    compile_s = decoder.warm_up(context=scale.prompt_len)
    if cuda:
        from torch._dynamo.utils import counters

        counters["inductor"].clear()
    for method, make in methods.items():
        decode(make)  # records the graphs of this method's shapes
        out, seconds = _timed(lambda m=make: decode(m), target.device)
        ref, ref_s = eager[method]
        tokens, rounds = sum(len(o.output_ids) for o in out), sum(len(o.rounds) for o in out)
        row = {"stage": "cuda_graphs", "case": f"{method}, {name} shape, {str(dtype)[6:]}, "
               f"{'compiled with CUDA graphs' if cuda else 'static path uncompiled (CPU)'}",
               "criterion": CRITERION, "compile_s": compile_s, "prompts": len(prompts), "new_tokens": tokens,
               "identical": [o.output_ids for o in out] == [r.output_ids for r in ref],
               "tokens_per_s": tokens / seconds, "eager_tokens_per_s": sum(len(r.output_ids) for r in ref) / ref_s,
               "rounds": rounds, "eager_rounds": sum(len(r.rounds) for r in ref)}
        ok = row["identical"]
        if cuda:
            graph_syncs = count_syncs(lambda m=make: decode(m))[1] / max(1, rounds)
            decoder.model.static_decoder = None  # the eager path again, for its sync count
            eager_syncs = count_syncs(lambda m=make: decode(m))[1] / max(1, row["eager_rounds"])
            decoder.model.static_decoder = decoder
            skips = int(counters["inductor"].get("cudagraph_skips", 0))
            row.update(implicit_syncs_per_round=graph_syncs, eager_implicit_syncs_per_round=eager_syncs,
                       cudagraph_skips=skips)
            ok = ok and skips == 0 and graph_syncs <= eager_syncs
        else:
            row["graphs"] = "skipped: CUDA graphs need CUDA"
        emit({**row, "status": "ok" if ok else "failed"})
