"""vLLM's own MiniMax M3 model, built for a deployment on the emulated platform (CPU tensors, no weights).

Several of vLLM's M3 decisions are taken only while its model is constructed: whether the shared expert is
fused (``MiniMaxM3MoE.__init__``), which router and expert class the MoE layer gets, which indexer and
sparse-attention implementation a layer binds, the qkv projection's local width (index q replicated under
indexer context parallelism), the dense layers' attention backend, and every start-up refusal. So
:func:`build` does what ``vllm serve`` does up to the weights: the deployment's launch line
(``Deployment.to_vllm()`` and the ``--block-size`` every launch carries) goes through vLLM's own argument
parser and ``EngineArgs.create_engine_config``, then ``MiniMaxM3SparseForConditionalGeneration(vllm_config=...)``
is constructed, all under :func:`m3lab.vllm.emulate.emulate`. The decisions are then read off the modules
(:mod:`m3lab.vllm.decide`).

The checkpoint is the deployment's model config cut to its first dense layers plus the sparse layers up to
one that reuses its top-k under index sharing (five layers for M3), with the quantization config of the
deployment's scheme (:data:`QUANT_CONFIGS`). Weights are uninitialised CPU tensors (never touched).

What is not vLLM's: the EAGLE draft checkpoint. m3lab has none, so an EAGLE / EAGLE3 deployment names a
declared one (:func:`draft_config`: a one-layer Llama EAGLE3 head over the target's hidden size and
vocabulary); vLLM builds its ``SpeculativeConfig`` from it as from a real one. The target model's decisions
read only the method and the token count from it.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from m3lab.atomic import write_text
from m3lab.errors import M3LabError
from m3lab.spec.model import CONFIG_DIR, ModelSpec, raw_config
from m3lab.spec.serving import Deployment, block_size_args
from m3lab.vllm.cite import cite_line

ARCH = "MiniMaxM3SparseForConditionalGeneration"
# quantization_config of each m3lab scheme as the checkpoint carries it; None: unquantised (BF16) weights.
MXFP8_CHECKPOINT = "minimax-m3-mxfp8.json"  # MiniMaxAI/MiniMax-M3-MXFP8 (shipped in m3lab/spec/configs)
_MX_SPEC = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32, "ch_axis": -1, "scale_format": "e8m0",
            "scale_type": "float", "scale_calculation_mode": "even", "round_method": "half_even",
            "observer_cls": "PerBlockMXObserver", "symmetric": None}
# amd/MiniMax-M3-MXFP4 (Quark OCP MX W4A4: MXFP4 weights, dynamic MXFP4 activations, experts only; attention,
# dense MLP, router and LM head excluded). Written in Quark's export format; the checkpoint's own file is not
# in this repository, so this is the declared equivalent.
MXFP4_QUARK = {
    "quant_method": "quark", "quant_mode": "eager_mode", "version": "0.10",
    "export": {"kv_cache_group": [], "pack_method": "reorder", "weight_format": "real_quantized",
               "weight_merge_groups": None},
    "global_quant_config": {"weight": {**_MX_SPEC, "is_dynamic": False},
                            "input_tensors": {**_MX_SPEC, "is_dynamic": True}, "output_tensors": None,
                            "bias": None, "target_device": None},
    "layer_quant_config": {}, "layer_type_quant_config": {}, "algo_config": None,
    "exclude": ["lm_head", "re:.*self_attn.*", r"re:.*\.mlp\..*", r"re:.*block_sparse_moe\.gate$",
                "re:.*vision_tower.*", "re:.*multi_modal_projector.*", "re:.*patch_merge_mlp.*"],
}


@lru_cache(maxsize=1)
def _mxfp8_quant_config() -> dict:
    return json.loads((CONFIG_DIR / MXFP8_CHECKPOINT).read_text())["quantization_config"]


CHECKPOINT_SCHEMES = ("bf16", "mxfp8", "mxfp4")  # the MiniMax M3 checkpoints' weight formats


def quant_config(scheme: str) -> dict | None:
    """The checkpoint quantization_config vLLM reads for an m3lab quant scheme (None: BF16 weights)."""
    if scheme == "bf16":
        return None
    if scheme == "mxfp8":
        return copy.deepcopy(_mxfp8_quant_config())
    if scheme == "mxfp4":
        return copy.deepcopy(MXFP4_QUARK)
    raise M3LabError(f"quant {scheme!r} has no M3 checkpoint vLLM can be built with", field="--quant",
                     hint="use bf16, mxfp8 or mxfp4 (the MiniMax M3 checkpoints)")


def checkpoint_config(model: ModelSpec, scheme: str) -> dict:
    """The config.json vLLM loads: ``model``'s own, cut to the layers :func:`kept_layers` keeps."""
    cfg = raw_config(model)
    text = cfg.setdefault("text_config", {}) if "text_config" in cfg else cfg
    n = kept_layers(model)
    text["num_hidden_layers"] = n
    for key in ("moe_layer_freq", "layer_types", "mlp_layer_types"):
        if isinstance(text.get(key), list):
            text[key] = text[key][:n]
    sparse = text.get("sparse_attention_config") or {}
    for key in ("sparse_attention_freq", "sparse_disable_index_value"):
        if isinstance(sparse.get(key), list):
            sparse[key] = sparse[key][:n]
    for key in ("use_index_cache", "index_topk_freq", "index_skip_topk_offset"):
        text.pop(key, None)  # index sharing comes from the launch line's --hf-overrides, as in vLLM
    cfg.pop("quantization_config", None)
    text.pop("quantization_config", None)
    if (q := quant_config(scheme)) is not None:
        cfg["quantization_config"] = q
    cfg["architectures"] = [ARCH]
    return cfg


def kept_layers(model: ModelSpec) -> int:
    """Layers kept: through the first sparse layer that reuses its top-k (index sharing), else two sparse."""
    sparse = list(model.sparse_layers)
    offset = model.sparse.index_skip_topk_offset if model.sparse is not None else 0
    want = min(len(sparse) - 1, max(1, offset + 1))
    return sparse[want] + 1 if sparse else min(model.layers, 4)


BUILD_DIR = "m3lab-vllm-build"   # under the system's temporary folder: one folder per distinct config


def _model_dir(cfg: dict) -> str:
    """A directory holding ``cfg`` as config.json, named by its content: shared by every process, so repeated
    resolutions reuse it instead of leaving a folder each behind."""
    text = json.dumps(cfg, sort_keys=True)
    d = Path(tempfile.gettempdir()) / BUILD_DIR / hashlib.sha1(text.encode()).hexdigest()[:16]
    config = d / "config.json"
    if not config.is_file():
        d.mkdir(parents=True, exist_ok=True)
        write_text(config, text)   # atomic: a process reading it meanwhile sees none or all of it
    return str(d)


@dataclass
class Refusal:
    """vLLM raised while starting this deployment: its message, the vLLM line that raised, the way there."""

    error: str               # exception type and message, as vLLM wrote them
    cite: Any                # the vLLM line that raised (a Cite)
    frames: tuple[str, ...]  # the vLLM functions on the way (outermost first), to attribute it to an op


@dataclass
class Built:
    """One deployment as vLLM builds it: its config, the model (None when vLLM refused) and the refusal."""

    vllm_config: Any
    model: Any
    refusal: Refusal | None
    topk_meta: Any = None    # the AITER top-k buffers this build's fused shared expert registered (process-global)

    def layers(self) -> dict[str, Any]:
        """Decoder layer per kind: "dense", "sparse" (computes its top-k), "sparse_reuse" (index sharing)."""
        out: dict[str, Any] = {}
        for layer in self.model.language_model.model.layers:
            attn = layer.self_attn
            kind = ("dense" if not hasattr(attn, "indexer") else
                    "sparse_reuse" if getattr(attn, "skip_index_topk", False) else "sparse")
            out.setdefault(kind, layer)
        return out


def refusal_of(err: BaseException) -> Refusal:
    """Where in vLLM ``err`` was raised (the innermost vLLM frame), with the vLLM functions on the way."""
    sites, tb = [], err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        site = cite_line(code.co_filename, code.co_qualname, tb.tb_lineno)
        if site is not None:
            sites.append(site)
        tb = tb.tb_next
    if not sites:
        raise err
    return Refusal(error=f"{type(err).__name__}: {_one_line(err)}", cite=sites[-1],
                   frames=tuple(s.function for s in sites))


def _one_line(err: BaseException) -> str:
    """vLLM's message on one line (a pydantic ValidationError: its errors' messages, not its input dump)."""
    text = str(err)
    if type(err).__name__ == "ValidationError" and callable(getattr(err, "errors", None)):
        text = "; ".join(str(e.get("msg", "")) for e in err.errors()) or text
    return " ".join(text.split())


REFUSALS = (ValueError, NotImplementedError)  # what vLLM raises to refuse a configuration at start-up
CUTE_DSL = ("cutlass", "quack", "cuda")  # SM100's fmha_sm100 kernels (compiled at construction, not emulated)
BUILT_ARCHS = ("gfx950", "gfx942", "sm_90")  # where vLLM's M3 builds on the emulated platform (not SM100: CuteDSL)
_BUILDS: dict[str, Built] = {}
_MAX_BUILDS = 6


def build_key(dep: Deployment) -> str:
    """Everything of a deployment that changes what vLLM builds (the launch line and the checkpoint)."""
    env, args = dep.to_vllm()
    args = [*block_size_args(dep), *args]
    return json.dumps([dep.hardware.name, dep.quant.name, checkpoint_config(dep.model, dep.quant.name), env, args],
                      sort_keys=True)


def _engine_config(dep: Deployment, model_dir: str) -> Any:
    """``vllm serve``'s own path from the launch line to a VllmConfig (argument parser, EngineArgs)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    _, args = dep.to_vllm()
    args = [*block_size_args(dep), *args]   # as every launch of the deployment has it (m3lab/vllm/serve_command.py)
    if dep.serving.spec_method in DRAFT_METHODS and not dep.serving.spec_model:
        i = args.index("--speculative-config")
        spec = {**json.loads(args[i + 1]), "model": _model_dir(draft_config(dep.model))}
        args = [*args[:i + 1], json.dumps(spec), *args[i + 2:]]
        _register_draft()
    from vllm.usage.usage_lib import UsageContext
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    ns = parser.parse_args(["--model", model_dir, "--skip-tokenizer-init", *args])
    return EngineArgs.from_cli_args(ns).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


DRAFT_METHODS = ("eagle", "eagle3")
DRAFT_ARCH = "LlamaForCausalLMEagle3"


def draft_config(model: ModelSpec) -> dict:
    """The declared EAGLE3 draft checkpoint of a target (a one-layer Llama head at its hidden size)."""
    return {"architectures": [DRAFT_ARCH], "model_type": "llama", "hidden_size": model.hidden,
            "intermediate_size": 2 * model.hidden, "num_hidden_layers": 1, "num_attention_heads": model.heads_q,
            "num_key_value_heads": model.heads_kv, "head_dim": model.head_dim, "vocab_size": model.vocab,
            "max_position_embeddings": model.max_position, "rms_norm_eps": model.norm_eps,
            "rope_theta": model.rope_theta, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def _register_draft() -> None:
    from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM
    from vllm.model_executor.models.registry import ModelRegistry
    ModelRegistry.register_model(DRAFT_ARCH, Eagle3LlamaForCausalLM)  # inspected in-process


_LARGE_ZEROS = 1 << 26  # bytes: a zero-filled weight this large is allocated without writing it


@contextlib.contextmanager
def _cpu_device():
    """vLLM's M3 code allocates a few buffers with ``device="cuda"``: put them on the CPU. Large
    zero-initialised weights (MXFP4 expert scales and packed weights) are left unwritten: no decision reads
    a weight value, and writing gigabytes would cost seconds and memory."""
    import torch
    from torch.overrides import TorchFunctionMode

    class CpuDevice(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if "cuda" in str(kwargs.get("device", "")):
                kwargs["device"] = "cpu"
            if func is torch.zeros:
                out = torch.empty(*args, **kwargs)
                return out if out.numel() * out.element_size() >= _LARGE_ZEROS else out.zero_()
            return func(*args, **kwargs)

    with CpuDevice():
        yield


@contextlib.contextmanager
def _no_ipc():
    """The MSA-CP indexer maps peer buffers over IPC at construction: here every peer is address 0."""
    import sys

    import torch
    module = sys.modules.get("vllm.models.minimax_m3.amd.indexer_cp")
    if module is None:
        yield
        return
    saved = module._ipc_alloc
    module._ipc_alloc = lambda nbytes, group: torch.zeros(group.world_size, dtype=torch.int64)
    try:
        yield
    finally:
        module._ipc_alloc = saved


def _aiter_moe():
    import sys
    return sys.modules.get("vllm.model_executor.layers.fused_moe.experts.rocm_aiter_moe")


def _model_class():
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.models import minimax_m3
    cls = minimax_m3.MiniMaxM3SparseForConditionalGeneration
    ModelRegistry.register_model(ARCH, cls)  # inspected in-process, as the class the platform picked
    return cls


def build(dep: Deployment) -> Built:
    """vLLM's config and model for ``dep`` (call inside ``emulate`` with the deployment's env and sizes)."""
    key = build_key(dep)
    moe = _aiter_moe()
    if key in _BUILDS:
        if moe is not None:  # the process-global buffers vLLM's layers of this build use
            moe.aiter_topK_meta_data = _BUILDS[key].topk_meta
        return _BUILDS[key]
    if moe is not None:
        moe.aiter_topK_meta_data = None  # vLLM registers them once per process; this build registers its own
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.utils.torch_utils import set_default_torch_dtype
    cls = _model_class()
    model_dir = _model_dir(checkpoint_config(dep.model, dep.quant.name))
    vc, model, refusal = None, None, None
    try:
        vc = _engine_config(dep, model_dir)
        with set_current_vllm_config(vc), set_default_torch_dtype(torch.bfloat16), _cpu_device(), _no_ipc():
            model = cls(vllm_config=vc, prefix="")
            from vllm.platforms import current_platform
            current_platform.update_block_size_for_backend(vc)  # as vLLM's executor does after loading
    except M3LabError:
        raise
    except REFUSALS as err:
        refusal = refusal_of(err)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in CUTE_DSL:
            raise M3LabError(f"vLLM's kernels for {dep.hardware.name} import the CuteDSL stack ({err.name}) and "
                             "compile at model construction: they cannot be built on an emulated platform",
                             field="hardware", hint="the emulation covers MI355X, MI300X and H200") from None
        raise
    moe = _aiter_moe()
    out = Built(vllm_config=vc, model=model, refusal=refusal,
                topk_meta=moe.aiter_topK_meta_data if moe is not None else None)
    if len(_BUILDS) >= _MAX_BUILDS:
        _BUILDS.pop(next(iter(_BUILDS)))
    _BUILDS[key] = out
    return out
