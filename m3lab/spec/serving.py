"""The vLLM serving knobs that change which code runs, as data, and whole deployments built from them.

:class:`ServingConfig` holds the switches that only vLLM's launch line sets: the ROCm AITER environment
flags (``vllm/envs.py:138-162,1267-1403``), the shuffled KV-cache layout, indexer context parallelism
``--monokernel``, speculative decoding, the CUDA-graph mode, ``--moe-backend``
and ``--max-model-len``. Its defaults are vLLM 0.33.0's (a test compares each with ``vllm.envs``).

Facts that already have an owner stay there and are rendered through it (one fact, one place):

- shared-expert fusion asked for: ``ParallelPlan.fused_shared_expert``
  (``VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS``);
- index sharing: ``ModelSpec.sparse.index_topk_freq`` / ``index_skip_topk_offset``
  (``--hf-overrides '{"text_config": {"use_index_cache": true, "index_topk_freq": 4}}'``);
- KV and index-key cache dtypes: ``QuantScheme.kv_dtype`` / ``index_dtype``
  (``--kv-cache-dtype``, ``--attention-config '{"indexer_kv_dtype": ...}'``);
- TP / EP / DP and indexer context parallelism: ``ParallelPlan`` (``-tp``, ``--enable-expert-parallel``, ``-dp``,
  ``--attention-config '{"minimax_m3_indexer_cp": true}'``).

:class:`Deployment` = model + hardware + plan + quant + serving. ``Deployment.to_vllm()`` gives the
environment and ``vllm serve`` arguments; :func:`parse_vllm` reads them back (round-trip tested).
:data:`PRESETS` reproduce the write-up's MI355X deployments.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

from m3lab.errors import M3LabError
from m3lab.spec.hardware import Hardware, load_hardware
from m3lab.spec.model import ModelSpec, load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.quant import QuantScheme, load_quant

# ServingConfig field -> vLLM environment variable (boolean flags, parsed as vLLM does: "1"/"true" is on).
ENV_FLAGS: Mapping[str, str] = {
    "aiter": "VLLM_ROCM_USE_AITER",
    "aiter_linear": "VLLM_ROCM_USE_AITER_LINEAR",
    "aiter_moe": "VLLM_ROCM_USE_AITER_MOE",
    "aiter_custom_ar": "VLLM_ROCM_USE_AITER_CUSTOM_AR",
    "aiter_mha": "VLLM_ROCM_USE_AITER_MHA",
    "aiter_unified_attention": "VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION",
    "aiter_triton_gemm": "VLLM_ROCM_USE_AITER_TRITON_GEMM",
    "skinny_gemm": "VLLM_ROCM_USE_SKINNY_GEMM",
    "shuffle_kv_cache": "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT",
}
FSE_ENV = "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS"  # rendered from ParallelPlan.fused_shared_expert
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"  # tri-state in vLLM: unset lets VllmConfig decide
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
SPEC_METHODS = ("eagle3", "eagle", "mtp", "ngram", "minimax_m3_mtp")
MOE_BACKENDS = ("auto", "aiter", "triton")  # the values that change M3's expert kernels (config/kernel.py:122)


def env_bool(value: str | None, default: bool) -> bool:
    """vLLM's rule for its boolean flags (``envs.py:1267``): unset -> default, else "1"/"true" (any case)."""
    return default if value is None else value.strip().lower() in ("true", "1")


@dataclass(frozen=True)
class ServingConfig:
    """vLLM launch switches owned by no other m3lab spec; defaults are vLLM 0.33.0's."""

    aiter: bool = False                   # VLLM_ROCM_USE_AITER (envs.py:1267)
    aiter_linear: bool = True             # VLLM_ROCM_USE_AITER_LINEAR (envs.py:1288)
    aiter_moe: bool = True                # VLLM_ROCM_USE_AITER_MOE (envs.py:1296)
    aiter_custom_ar: bool = True          # VLLM_ROCM_USE_AITER_CUSTOM_AR (envs.py:1272)
    aiter_mha: bool = True                # VLLM_ROCM_USE_AITER_MHA (envs.py:1350)
    aiter_unified_attention: bool = False  # VLLM_ROCM_USE_AITER_UNIFIED_ATTENTION (envs.py:1378)
    aiter_triton_gemm: bool = True        # VLLM_ROCM_USE_AITER_TRITON_GEMM (envs.py:1390)
    skinny_gemm: bool = True              # VLLM_ROCM_USE_SKINNY_GEMM (envs.py:1394)
    shuffle_kv_cache: bool = False        # VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT (envs.py:1402)
    model_runner_v2: bool | None = None   # VLLM_USE_V2_MODEL_RUNNER; None: VllmConfig.use_v2_model_runner decides
    monokernel: bool = False              # --monokernel (config/kernel.py:299)
    moe_backend: str = "auto"             # --moe-backend (config/kernel.py:305)
    spec_method: str | None = None        # --speculative-config method
    spec_tokens: int = 0                  # --speculative-config num_speculative_tokens
    spec_model: str | None = None         # --speculative-config model (the draft checkpoint)
    cudagraph_mode: str = "FULL_AND_PIECEWISE"  # -cc cudagraph_mode; the V1 default (config/compilation.py:618)
    max_model_len: int | None = None      # --max-model-len; None: the model's max_position_embeddings

    def validate(self) -> ServingConfig:
        """Raise M3LabError naming the field when a value is not one vLLM accepts; return self."""
        for name in ENV_FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise M3LabError(f"{name} must be true or false, got {getattr(self, name)!r}", field=name)
        if self.moe_backend not in MOE_BACKENDS:
            raise M3LabError(f"moe_backend {self.moe_backend!r} is not one m3lab resolves", field="moe_backend",
                             hint=f"use one of {', '.join(MOE_BACKENDS)}")
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise M3LabError(f"cudagraph_mode {self.cudagraph_mode!r} is unknown", field="cudagraph_mode",
                             hint=f"use one of {', '.join(CUDAGRAPH_MODES)}")
        if self.spec_method is not None and self.spec_method not in SPEC_METHODS:
            raise M3LabError(f"spec_method {self.spec_method!r} is unknown", field="spec_method",
                             hint=f"use one of {', '.join(SPEC_METHODS)}")
        if (self.spec_method is None) != (self.spec_tokens == 0) or self.spec_tokens < 0:
            raise M3LabError("spec_method and spec_tokens go together (a method needs spec_tokens >= 1)",
                             field="spec_tokens", hint="e.g. spec_method=eagle3 spec_tokens=3")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise M3LabError(f"max_model_len must be positive, got {self.max_model_len}", field="max_model_len")
        return self

    @property
    def decode_query_len(self) -> int:
        """Query rows per request in a decode step: 1 + speculative tokens (the verify rows)."""
        return 1 + self.spec_tokens

    def env(self) -> dict[str, str]:
        """The environment variables that differ from vLLM's defaults ("1"/"0")."""
        default = ServingConfig()
        out = {var: "1" if getattr(self, f) else "0" for f, var in ENV_FLAGS.items()
               if getattr(self, f) != getattr(default, f)}
        if self.model_runner_v2 is not None:
            out[V2_RUNNER_ENV] = "1" if self.model_runner_v2 else "0"
        return out


def _field_value(cls: type, name: str, text: str) -> Any:
    """Convert ``--set name=text`` for a dataclass field of ``cls``, by the field's default type."""
    default = {f.name: f.default for f in dataclasses.fields(cls)}[name]
    low = text.strip().lower()
    if isinstance(default, bool) or name == "model_runner_v2":
        if low in ("none", "") and name == "model_runner_v2":
            return None
        if low not in ("1", "0", "true", "false", "on", "off"):
            raise M3LabError(f"{name}={text!r} is not a boolean", field=name, hint="use 1/0 or true/false")
        return low in ("1", "true", "on")
    if isinstance(default, int) or name == "max_model_len":
        if low in ("none", "") and default is None:
            return None
        try:
            return int(text)
        except ValueError:
            raise M3LabError(f"{name}={text!r} is not an integer", field=name) from None
    return None if low in ("none", "") and default is None else text.strip()


# ---- deployments ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Deployment:
    """One vLLM deployment of a model: model + hardware + plan + quant + serving."""

    model: ModelSpec
    hardware: Hardware
    plan: ParallelPlan
    quant: QuantScheme
    serving: ServingConfig = field(default_factory=ServingConfig)
    name: str = ""
    description: str = ""

    def validate(self) -> Deployment:
        self.plan.validate(self.model)
        self.serving.validate()
        return self

    @property
    def index_sharing_freq(self) -> int:
        return self.model.sparse.index_topk_freq if self.model.sparse is not None else 1

    def hf_overrides(self) -> dict[str, Any]:
        """``--hf-overrides`` for index sharing, under text_config (top-level keys raise on ROCm,
        ``vllm/model_executor/models/config.py:790-808``)."""
        sp = self.model.sparse
        if sp is None or sp.index_topk_freq <= 1:
            return {}
        text = {"use_index_cache": True, "index_topk_freq": sp.index_topk_freq}
        if sp.index_skip_topk_offset:
            text["index_skip_topk_offset"] = sp.index_skip_topk_offset
        return {"text_config": text}

    def attention_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.quant.index_dtype != "bf16":
            out["indexer_kv_dtype"] = self.quant.index_dtype
        if self.plan.indexer_cp:
            out["minimax_m3_indexer_cp"] = True
        return out

    def to_vllm(self) -> tuple[dict[str, str], list[str]]:
        """(environment, ``vllm serve`` arguments after the model path) that select this deployment."""
        s, p = self.serving, self.plan
        env = s.env()
        if p.fused_shared_expert:
            env[FSE_ENV] = "1"
        args = ["--tensor-parallel-size", str(p.tp)]
        if p.dp > 1:
            args += ["--data-parallel-size", str(p.dp)]
        if p.ep > 1:
            args += ["--enable-expert-parallel"]
        if self.quant.kv_dtype != "bf16":
            args += ["--kv-cache-dtype", self.quant.kv_dtype]
        if (ac := self.attention_config()):
            args += ["--attention-config", json.dumps(ac, separators=(",", ":"))]
        if (hf := self.hf_overrides()):
            args += ["--hf-overrides", json.dumps(hf, separators=(",", ":"))]
        if s.monokernel:
            args += ["--monokernel"]
        if s.moe_backend != "auto":
            args += ["--moe-backend", s.moe_backend]
        if s.spec_method:
            spec = {"method": s.spec_method, "num_speculative_tokens": s.spec_tokens}
            if s.spec_model:
                spec["model"] = s.spec_model
            args += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
        if s.cudagraph_mode != ServingConfig().cudagraph_mode:
            args += ["--compilation-config", json.dumps({"cudagraph_mode": s.cudagraph_mode}, separators=(",", ":"))]
        if s.max_model_len is not None:
            args += ["--max-model-len", str(s.max_model_len)]
        if p.role != "both":
            args += ["--kv-transfer-config", json.dumps({"kv_role": {"prefill": "kv_producer", "decode":
                                                                      "kv_consumer"}[p.role]}, separators=(",", ":"))]
        return env, args

    def command(self, model_path: str = "") -> str:
        """The launch line: ``ENV=.. vllm serve MODEL args``."""
        env, args = self.to_vllm()
        head = " ".join(f"{k}={v}" for k, v in sorted(env.items()))
        return " ".join(x for x in (head, "vllm serve", shlex.quote(model_path or self.model.name),
                                     " ".join(shlex.quote(a) for a in args)) if x)

    def with_settings(self, settings: Mapping[str, str]) -> Deployment:
        """Apply ``--set KEY=VALUE`` pairs: ServingConfig fields, plan fields (tp, ep, dp, role,
        fused_shared_expert), ``kv_dtype``, ``index_dtype``, ``index_topk_freq``."""
        serving, plan, quant, model = {}, {}, {}, self.model
        plan_fields = {f.name for f in dataclasses.fields(ParallelPlan)}
        serving_fields = {f.name for f in dataclasses.fields(ServingConfig)}
        for key, text in settings.items():
            if key in serving_fields:
                serving[key] = _field_value(ServingConfig, key, text)
            elif key in plan_fields:
                plan[key] = _field_value(ParallelPlan, key, text)
            elif key in ("kv_dtype", "index_dtype"):
                quant[key] = text
            elif key == "index_topk_freq":
                model = model.with_index_sharing(int(_field_value(ServingConfig, "spec_tokens", text)))
            else:
                raise M3LabError(f"--set {key}: unknown setting", field=key,
                                 hint="one of: " + ", ".join(sorted(serving_fields | plan_fields |
                                                                    {"kv_dtype", "index_dtype", "index_topk_freq"})))
        if serving.get("spec_method") and "spec_tokens" not in serving and not self.serving.spec_tokens:
            serving["spec_tokens"] = 1
        return dataclasses.replace(self, model=model, plan=dataclasses.replace(self.plan, **plan),
                                   quant=self.quant.with_cache(**quant) if quant else self.quant,
                                   serving=dataclasses.replace(self.serving, **serving)).validate()


def _json_arg(flag: str, text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise M3LabError(f"{flag} is not JSON ({err.msg})", field=flag) from None
    if not isinstance(value, dict):
        raise M3LabError(f"{flag} must be a JSON object", field=flag)
    return value


def parse_vllm(env: Mapping[str, str], args: list[str], *, model: str | ModelSpec, hardware: str | Hardware,
               quant: str | QuantScheme) -> Deployment:
    """A Deployment from vLLM's environment and ``vllm serve`` arguments (the inverse of ``to_vllm``).

    ``model``, ``hardware`` and ``quant`` name what the launch line does not carry (the checkpoint's
    architecture and quantisation, the GPU). Unknown arguments are an error, so nothing is silently dropped.
    """
    defaults = ServingConfig()
    serving: dict[str, Any] = {f: env_bool(env.get(var), getattr(defaults, f)) for f, var in ENV_FLAGS.items()}
    if env.get(V2_RUNNER_ENV) is not None:
        serving["model_runner_v2"] = bool(int(env[V2_RUNNER_ENV]))
    plan: dict[str, Any] = {"fused_shared_expert": env_bool(env.get(FSE_ENV), False)}  # vLLM: off unless set
    kv_dtype, index_dtype, freq, offset, enable_ep = "bf16", "bf16", 1, 0, False
    role = "both"
    i = 0
    while i < len(args):
        flag = args[i]
        value = args[i + 1] if i + 1 < len(args) else None
        step = 2
        if flag in ("--tensor-parallel-size", "-tp"):
            plan["tp"] = int(value)
        elif flag in ("--data-parallel-size", "-dp"):
            plan["dp"] = int(value)
        elif flag == "--enable-expert-parallel":
            enable_ep, step = True, 1
        elif flag == "--kv-cache-dtype":
            kv_dtype = value
        elif flag in ("--attention-config", "-ac"):
            ac = _json_arg(flag, value)
            index_dtype = ac.pop("indexer_kv_dtype", "bf16")
            plan["indexer_cp"] = bool(ac.pop("minimax_m3_indexer_cp", False))
            if ac:
                raise M3LabError(f"--attention-config keys {sorted(ac)} are not modelled", field=flag)
        elif flag == "--hf-overrides":
            hf = _json_arg(flag, value)
            top = sorted(set(hf) - {"text_config"})
            if top:
                raise M3LabError(f"--hf-overrides top-level keys {top} raise on ROCm "
                                 "(vllm/model_executor/models/config.py:790-808)", field=flag,
                                 hint='put them under {"text_config": {...}}')
            text = hf.get("text_config", {})
            if text.get("use_index_cache"):
                freq = int(text.get("index_topk_freq", 1))
                offset = int(text.get("index_skip_topk_offset", 0))
        elif flag == "--monokernel":
            serving["monokernel"], step = True, 1
        elif flag == "--moe-backend":
            serving["moe_backend"] = value
        elif flag in ("--speculative-config", "-sc"):
            sc = _json_arg(flag, value)
            serving["spec_method"] = sc.get("method")
            serving["spec_tokens"] = int(sc.get("num_speculative_tokens", 0))
            serving["spec_model"] = sc.get("model")
        elif flag in ("--compilation-config", "-cc"):
            serving["cudagraph_mode"] = str(_json_arg(flag, value).get("cudagraph_mode", defaults.cudagraph_mode))
        elif flag == "--max-model-len":
            serving["max_model_len"] = int(value)
        elif flag == "--kv-transfer-config":
            kv_role = _json_arg(flag, value).get("kv_role")
            role = {"kv_producer": "prefill", "kv_consumer": "decode"}.get(kv_role, "both")
        else:
            raise M3LabError(f"vllm argument {flag!r} is not modelled by m3lab", field=flag)
        i += step
    plan["role"] = role
    p = ParallelPlan(**plan)
    if enable_ep:  # vLLM's EP group spans TP x DP
        p = dataclasses.replace(p, ep=p.tp * p.dp)
    spec = load_model(model)
    if freq > 1:
        spec = spec.with_index_sharing(freq, offset)
    return Deployment(model=spec, hardware=load_hardware(hardware), plan=p,
                      quant=load_quant(quant).with_cache(kv_dtype=kv_dtype, index_dtype=index_dtype),
                      serving=ServingConfig(**serving)).validate()


# ---- presets --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Preset:
    """A named deployment, as plain data (built into a :class:`Deployment` by :func:`load_preset`)."""

    name: str
    description: str
    model: str
    hardware: str
    quant: str
    plan: Mapping[str, Any]
    serving: Mapping[str, Any] = field(default_factory=dict)
    kv_dtype: str = "bf16"
    index_dtype: str = "bf16"
    index_topk_freq: int = 1


_OPTIMISED = {"aiter": True, "shuffle_kv_cache": True}
PRESETS: Mapping[str, Preset] = {p.name: p for p in (
    Preset("mxfp8-tp4-baseline", "write-up MXFP8 TP4 before its optimisations: vLLM defaults (AITER off, "
           "Triton sparse attention, no shared-expert fusion, every sparse layer computes its top-k)",
           "minimax-m3-mxfp8", "mi355x", "mxfp8", {"tp": 4, "fused_shared_expert": False}),
    Preset("mxfp8-tp4-optimised", "write-up MXFP8 TP4 after its optimisations: AITER on, shuffled KV layout "
           "(AITER paged sparse attention through the page-16 adapter), shared-expert fusion, index sharing "
           "every 4th sparse layer", "minimax-m3-mxfp8", "mi355x", "mxfp8",
           {"tp": 4, "fused_shared_expert": True}, _OPTIMISED, index_topk_freq=4),
    Preset("mxfp4-tp2", "write-up MXFP4 (amd/MiniMax-M3-MXFP4) at TP2: 2 KV heads per rank, so AITER paged "
           "sparse attention needs the fp8 MSA indexer to emit its page table", "minimax-m3", "mi355x", "mxfp4",
           {"tp": 2, "fused_shared_expert": True}, _OPTIMISED, index_dtype="fp8"),
    Preset("eagle3-mxfp8-tp4", "write-up EAGLE3 speculative decoding on the optimised MXFP8 TP4 deployment, "
           "3 draft tokens (multi-token verify through the indexer and paged sparse attention)",
           "minimax-m3-mxfp8", "mi355x", "mxfp8", {"tp": 4, "fused_shared_expert": True},
           {**_OPTIMISED, "spec_method": "eagle3", "spec_tokens": 3}, index_topk_freq=4),
    Preset("pd-mxfp8-prefill-tp4", "write-up P/D disaggregation, prefill worker: optimised MXFP8 at TP4",
           "minimax-m3-mxfp8", "mi355x", "mxfp8", {"tp": 4, "fused_shared_expert": True, "role": "prefill"},
           _OPTIMISED, index_topk_freq=4),
    Preset("pd-mxfp8-decode-tp4", "write-up P/D disaggregation, decode worker: optimised MXFP8 at TP4",
           "minimax-m3-mxfp8", "mi355x", "mxfp8", {"tp": 4, "fused_shared_expert": True, "role": "decode"},
           _OPTIMISED, index_topk_freq=4),
    Preset("h200-bf16-tp4", "MiniMax M3 BF16 at TP4 on an H200 (SM90): vLLM's NVIDIA model with the common "
           "Triton indexer and sparse attention (the H200 trace's plan)", "minimax-m3", "h200", "bf16",
           {"tp": 4, "fused_shared_expert": False}),
)}


def list_presets() -> list[str]:
    return sorted(PRESETS)


def load_preset(name: str) -> Deployment:
    """The Deployment of a named preset (see :data:`PRESETS`)."""
    if name not in PRESETS:
        raise M3LabError(f"unknown preset {name!r}", field="--preset", hint="one of: " + ", ".join(list_presets()))
    p = PRESETS[name]
    model = load_model(p.model)
    if p.index_topk_freq > 1:
        model = model.with_index_sharing(p.index_topk_freq)
    return Deployment(model=model, hardware=load_hardware(p.hardware), plan=ParallelPlan(**p.plan),
                      quant=load_quant(p.quant).with_cache(kv_dtype=p.kv_dtype, index_dtype=p.index_dtype),
                      serving=ServingConfig(**p.serving), name=p.name, description=p.description).validate()


def deployment(model: str | ModelSpec, hardware: str | Hardware, quant: str | QuantScheme, *, tp: int = 1,
               ep: int = 1, dp: int = 1, fused_shared_expert: bool | None = None,
               serving: ServingConfig | None = None) -> Deployment:
    """A Deployment from names (vLLM defaults for everything the launch line would not say)."""
    plan = ParallelPlan(tp=tp, ep=ep, dp=dp)
    if fused_shared_expert is not None:
        plan = dataclasses.replace(plan, fused_shared_expert=fused_shared_expert)
    return Deployment(model=load_model(model), hardware=load_hardware(hardware), plan=plan,
                      quant=load_quant(quant), serving=serving or ServingConfig()).validate()
