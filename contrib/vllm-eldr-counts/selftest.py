#!/usr/bin/env python3
"""Self-test of eldr_counts_plugin without vLLM (stdlib only).

1. The plugin hooks a stand-in of vllm.v1.core.sched.scheduler.Scheduler
   with the two methods it wraps, their signatures as in vLLM's source
   (_get_routed_experts(request) -> rows (num_tokens - 1, num_hidden_layers,
   top_k); _free_request(request, ...) -> the connector's kv_transfer_params):
   a prefill handed to a remote decoder gets the counts, a plain request
   does not, ELDR_COUNTS_ONLY=1 withholds the rows.
2. With an output directory, writes for Llama-4 Maverick's and DeepSeek-V3's
   layouts a prefill reply carrying both forms of the same prompt: the
   routed_experts npy (every hidden layer, dense rows 0, as vLLM's capturer)
   and the plugin's kv_transfer_params.eldr_expert_counts; eldr's
   tests/format/test_compact_plugin.c reads both and compares the counts.

    python3 contrib/vllm-eldr-counts/selftest.py [OUTDIR]
"""
import base64
import json
import os
import struct
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MODELS = {  # name: (hf config fields, hidden layers, experts, top-k)
    "llama4-maverick": ({"interleave_moe_layer_step": 2, "num_local_experts": 128, "num_experts_per_tok": 1}, 48, 128, 1),
    "deepseek-v3": ({"first_k_dense_replace": 3, "moe_layer_freq": 1, "n_routed_experts": 256,
                     "num_experts_per_tok": 8}, 61, 256, 8),
}
P = 23  # prompt tokens


def routes_for(hidden, moe, experts, k):
    """P rows of every hidden layer: MoE rows distinct top-k ids, dense rows 0."""
    rows = []
    for t in range(P):
        row = []
        for layer in range(hidden):
            row.append([(5 * t + 11 * layer + 17 * j) % experts for j in range(k)] if layer in moe else [0] * k)
        rows.append(row)
    return rows


def npy_b64(rows, hidden, k):
    d = "{'descr': '|u1', 'fortran_order': False, 'shape': (%d, %d, %d), }" % (len(rows), hidden, k)
    pad = (64 - (10 + len(d) + 1) % 64) % 64
    header = d + " " * pad + "\n"
    flat = bytes(e for r in rows for layer in r for e in layer)
    return base64.b64encode(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + flat).decode()


def install_stand_in():
    """A module tree vllm.v1.core.sched.scheduler with a Scheduler like vLLM's."""
    class Scheduler:
        def __init__(self, hf, routes):
            self.vllm_config = types.SimpleNamespace(model_config=types.SimpleNamespace(hf_text_config=hf))
            self._routes = routes
            self.freed = False

        def _get_routed_experts(self, request):
            assert not self.freed, "rows read after the blocks were freed"
            return self._routes

        def _free_request(self, request, delay_free_blocks=False):
            self.freed = True
            return {"do_remote_prefill": True, "remote_engine_id": "e0"} if request.kv_transfer_params else None

    for name in ("vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched"):
        sys.modules.setdefault(name, types.ModuleType(name))
    mod = types.ModuleType("vllm.v1.core.sched.scheduler")
    mod.Scheduler = Scheduler
    sys.modules["vllm.v1.core.sched.scheduler"] = mod
    sys.modules["vllm.v1.core.sched"].scheduler = mod
    return Scheduler


def main():
    os.environ["ELDR_COUNTS_ONLY"] = "1"
    Scheduler = install_stand_in()
    import eldr_counts_plugin as plugin

    plugin.register()
    plugin.register()  # twice: installed once
    out = sys.argv[1] if len(sys.argv) > 1 else None
    for name, (fields, hidden, experts, k) in sorted(MODELS.items()):
        hf = types.SimpleNamespace(num_hidden_layers=hidden, **fields)
        moe = plugin.moe_layers(hf, hidden)
        routes = routes_for(hidden, set(moe), experts, k)
        s = Scheduler(hf, routes + [routes[-1]])  # the first generated token's row too: cut at the prompt
        pd = types.SimpleNamespace(kv_transfer_params={"do_remote_decode": True}, num_prompt_tokens=P)
        plain = types.SimpleNamespace(kv_transfer_params=None, num_prompt_tokens=P)
        assert s._get_routed_experts(pd) is None, "ELDR_COUNTS_ONLY: rows withheld"
        assert s._get_routed_experts(plain) == routes + [routes[-1]], "a plain request keeps its rows"
        params = s._free_request(pd)
        obj = params[plugin.KEY]
        assert obj["shape"] == [len(moe), experts] and obj["layers"] == moe and obj["tokens"] == P, obj["shape"]
        assert Scheduler(hf, routes)._free_request(plain) is None
        print("%s: %d MoE layers %d..%d, %d bytes of counts in kv_transfer_params" %
              (name, len(moe), moe[0], moe[-1], len(json.dumps(obj))))
        if out:
            reply = {"id": "cmpl-1", "object": "text_completion", "model": name,
                     "choices": [{"index": 0, "text": "x", "finish_reason": "length",
                                  "routed_experts": npy_b64(routes, hidden, k)}],
                     "usage": {"prompt_tokens": P, "completion_tokens": 1, "total_tokens": P + 1},
                     "kv_transfer_params": params}
            with open(os.path.join(out, "plugin_%s.json" % name), "w") as f:
                json.dump(reply, f)
    print("ok")


if __name__ == "__main__":
    main()
