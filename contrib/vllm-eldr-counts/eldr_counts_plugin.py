# SPDX-License-Identifier: Apache-2.0
"""eldr_counts_plugin: a vLLM general plugin that puts eldr's compact
signature form into a prefill reply's kv_transfer_params.

A prefill instance (a request with kv_transfer_params.do_remote_decode) that
runs with --enable-return-routed-experts counts, at the request's end, how
many prompt tokens chose each expert at each MoE layer, and attaches the
counts under kv_transfer_params["eldr_expert_counts"] (the format is in
eldr's include/eldr/reply_compact.h and docs/vllm.md, "The compact form").
Every vLLM P/D proxy forwards kv_transfer_params; eldr reads the counts and
never sends them on to the decoder. With ELDR_COUNTS_ONLY=1 the prefill
reply carries no routed_experts array at all: the megabytes never leave the
engine.

How it hooks in (read from vLLM's source; see README.md for the files):
vLLM loads every entry point of the "vllm.general_plugins" group in each of
its processes (vllm/plugins/__init__.py); in the engine-core process this
module wraps two methods of vllm.v1.core.sched.scheduler.Scheduler:
  _get_routed_experts(request)  the request's (num_tokens - 1, num_hidden_layers,
                                top_k) rows, read by update_from_output when a
                                request stops; with ELDR_COUNTS_ONLY=1 it returns
                                None for a prefill handed to a remote decoder;
  _free_request(request, ...)   returns the connector's kv_transfer_params (NIXL:
                                request_finished); the wrapper reads the rows
                                before the original frees anything and adds the
                                counts to what it returns.
A vLLM without these methods is left alone (logged once).
"""

from __future__ import annotations

import base64
import logging
import os
import struct

KEY = "eldr_expert_counts"
SATURATE = 65535

logger = logging.getLogger(__name__)


def moe_layers(hf_config, num_layers: int) -> list[int]:
    """Decoder layers that have a MoE block, by the model config's fields (as
    vLLM's model files decide: llama4.py interleave_moe_layer_step,
    deepseek_v2.py first_k_dense_replace / moe_layer_freq, qwen3_moe.py
    mlp_only_layers / decoder_sparse_step); every layer otherwise."""
    step = getattr(hf_config, "interleave_moe_layer_step", None)
    if step:
        return [l for l in range(num_layers) if (l + 1) % step == 0]
    first_dense = getattr(hf_config, "first_k_dense_replace", None)
    if first_dense is not None:
        freq = getattr(hf_config, "moe_layer_freq", 1) or 1
        return [l for l in range(num_layers) if l >= first_dense and l % freq == 0]
    mlp_only = set(getattr(hf_config, "mlp_only_layers", None) or [])
    sparse = getattr(hf_config, "decoder_sparse_step", 1) or 1
    return [l for l in range(num_layers) if l not in mlp_only and (l + 1) % sparse == 0]


def num_experts(hf_config) -> int:
    """The global expert count, under the names vLLM's capturer reads."""
    for key in ("num_experts", "n_routed_experts", "num_local_experts"):
        value = getattr(hf_config, key, None)
        if value is not None:
            return int(value)
    raise ValueError("no num_experts / n_routed_experts / num_local_experts in the model config")


def counts_object(routes, layers: list[int], experts: int, top_k: int, first_token: int = 0) -> dict:
    """The compact object for routes (rows x num_hidden_layers x top_k ids: a
    numpy array, or nested lists), counted at the given layers."""
    rows = len(routes)
    try:  # vLLM's rows are a numpy array
        import numpy as np

        arr = np.asarray(routes)
        table = np.zeros((len(layers), experts), dtype=np.int64)
        for i, layer in enumerate(layers):
            ids = arr[:, layer, :].reshape(-1).astype(np.int64)
            ids = ids[(ids >= 0) & (ids < experts)]
            table[i] = np.bincount(ids, minlength=experts)[:experts]
        payload = np.minimum(table, SATURATE).astype("<u2").tobytes()
    except ImportError:  # the same, without numpy
        flat = []
        for layer in layers:
            row = [0] * experts
            for t in range(rows):
                for e in routes[t][layer]:
                    if 0 <= e < experts:
                        row[e] += 1
            flat.extend(min(c, SATURATE) for c in row)
        payload = struct.pack("<%dH" % len(flat), *flat)
    return {
        "encoding": "base64",
        "dtype": "uint16",
        "shape": [len(layers), experts],
        "layers": list(layers),
        "top_k": int(top_k),
        "tokens": rows,
        "first_token": int(first_token),
        "data": base64.b64encode(payload).decode("ascii"),
    }


def _remote_decode(request) -> bool:
    params = getattr(request, "kv_transfer_params", None)
    return isinstance(params, dict) and bool(params.get("do_remote_decode"))


def register() -> None:
    """The vllm.general_plugins entry point."""
    try:
        from vllm.v1.core.sched import scheduler as sched
    except ImportError:
        return  # not a vLLM with the V1 scheduler
    cls = sched.Scheduler
    if getattr(cls, "_eldr_counts_installed", False):
        return
    if not hasattr(cls, "_get_routed_experts") or not hasattr(cls, "_free_request"):
        logger.warning("eldr_counts_plugin: this vLLM has no Scheduler._get_routed_experts; not installed")
        return
    orig_get = cls._get_routed_experts
    orig_free = cls._free_request
    counts_only = os.environ.get("ELDR_COUNTS_ONLY", "0") == "1"

    def _get_routed_experts(self, request):
        if counts_only and _remote_decode(request):
            return None  # the counts go in kv_transfer_params instead
        return orig_get(self, request)

    def _free_request(self, request, *args, **kwargs):
        extra = None
        if _remote_decode(request):
            try:
                routes = orig_get(self, request)  # before anything is freed
                if routes is not None:
                    hf = self.vllm_config.model_config.hf_text_config
                    layers = moe_layers(hf, int(hf.num_hidden_layers))
                    k = getattr(hf, "num_experts_per_tok", None) or getattr(hf, "top_k_experts", None)
                    extra = counts_object(routes[: request.num_prompt_tokens], layers, num_experts(hf), int(k))
            except Exception:  # never fail a request for the counts
                logger.exception("eldr_counts_plugin: counts not attached")
        params = orig_free(self, request, *args, **kwargs)
        if extra is not None and isinstance(params, dict):
            params[KEY] = extra
        return params

    cls._get_routed_experts = _get_routed_experts
    cls._free_request = _free_request
    cls._eldr_counts_installed = True
    logger.info("eldr_counts_plugin: prefill replies carry %s%s", KEY,
                " (and no routed_experts)" if counts_only else "")
