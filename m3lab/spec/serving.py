"""Deployments: one record of everything that decides what vLLM runs and what it is asked to serve.

:class:`Deployment` is the record every m3lab entry point takes (estimates, shapes, fast paths, memory figures,
``vllm plan``, the pipelines' parameter checks, the notebooks). Its parts, each a small typed record with
vLLM 0.33.0's defaults (tests compare them with vLLM's own code):

- ``model`` (:class:`~m3lab.spec.model.ModelSpec`; index sharing: ``sparse.index_topk_freq``, rendered as
  ``--hf-overrides '{"text_config": {"use_index_cache": true, "index_topk_freq": 4}}'``) and ``hardware``;
- ``plan`` (:class:`~m3lab.spec.plan.ParallelPlan`: ``-tp``, ``--enable-expert-parallel``, ``-dp``, indexer
  context parallelism, shared-expert fusion ``VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS``; every local width);
- ``quant`` (:class:`~m3lab.spec.quant.QuantScheme`: weights, ``--kv-cache-dtype``, the index-key cache dtype
  ``--attention-config '{"indexer_kv_dtype": ...}'``);
- ``serving`` (:class:`~m3lab.spec.switches.ServingConfig`: the AITER flags, shuffled KV layout, monokernel,
  MoE backend, speculative config, CUDA-graph mode, ``--max-model-len``);
- ``workload`` (:class:`~m3lab.spec.traffic.WorkloadSpec`), ``limits``
  (:class:`~m3lab.spec.limits.SchedulerLimits`), ``acceptance`` (:class:`~m3lab.spec.speculation.SpecAcceptance`)
  and ``pd`` (:class:`~m3lab.spec.roles.PDRoles`).

``Deployment.to_vllm()`` gives the environment and ``vllm serve`` arguments; :func:`parse_vllm` reads them back
(round-trip tested). :func:`make_deployment` builds one from a preset (:data:`PRESETS`, the write-up's MI355X
deployments and the checklist's default) and settings in any spelling of :mod:`m3lab.spec.settings`.
"""
# long: the Deployment record and both directions of its vLLM mapping (to_vllm, parse_vllm), kept inverse
from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from m3lab.errors import M3LabError
from m3lab.spec.hardware import Hardware, load_hardware
from m3lab.spec.limits import SchedulerLimits
from m3lab.spec.model import ModelSpec, load_model
from m3lab.spec.plan import ParallelPlan
from m3lab.spec.presets import DEFAULT_PRESET, PRESETS, Preset  # noqa: F401  (the presets' public home)
from m3lab.spec.quant import QuantScheme, load_quant
from m3lab.spec.record_key import stable_key
from m3lab.spec.roles import ROLE_NAMES, PDRoles
from m3lab.spec.settings import NULL_WORDS, apply, changes, flat
from m3lab.spec.speculation import SpecAcceptance
from m3lab.spec.switches import (CUDAGRAPH_MODES, ENV_FLAGS, FSE_ENV, MOE_BACKENDS, SPEC_METHODS,  # noqa: F401
                                 V2_RUNNER_ENV, ServingConfig, env_bool)
from m3lab.spec.traffic import WorkloadSpec, check_context

# SchedulerLimits switch -> vllm serve flag (--FLAG on, --no-FLAG off)
LIMIT_SWITCHES = {"chunked_prefill": "enable-chunked-prefill", "prefix_caching": "enable-prefix-caching",
                  "async_scheduling": "async-scheduling"}
SWITCH_FIELDS = {flag: name for name, flag in LIMIT_SWITCHES.items()}


# ---- deployments ----------------------------------------------------------------------------------
# The record's parts besides model and hardware; their fields are the keys of m3lab.spec.settings.
RECORD_FIELDS = ("model", "hardware", "plan", "quant", "serving", "workload", "limits", "acceptance", "pd")
# keys that describe the traffic rather than the served deployment: they stay out of derived names
_TRAFFIC_KEYS = ("workload", "isl", "osl", "concurrency", "num_prompts", "request_rate", "sessions", "trace", "seed",
                 "accept_len", "accept_dataset", "draft_cost")


# The P/D KV connector (vLLM refuses a kv_role without one: "Connector name is not set in KVTransferConfig"), with
# vLLM's roles for NixlConnector: kv_producer on prefill instances, kv_consumer on decode instances (kv_both is
# deprecated there: vllm/distributed/kv_transfer/kv_connector/v1/nixl/connector.py NixlConnector.__init__)
KV_CONNECTOR = "NixlConnector"
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}


def kv_transfer_config(role: str, connector: str = KV_CONNECTOR) -> dict[str, str]:
    """``--kv-transfer-config`` of a P/D role (``prefill`` or ``decode``), as vLLM accepts it."""
    return {"kv_connector": connector, "kv_role": KV_ROLES[role]}


def block_size_args(d: Deployment) -> list[str]:
    """``--block-size`` of every launch of ``d``: the model's sparse block (M3's sparse and indexer backends accept
    only 128, ``vllm/models/minimax_m3/common/sparse_attention.py``, ``common/indexer.py``; vLLM checks the
    monokernel's config against it at model construction). Not part of ``to_vllm``: it selects no code path."""
    return ["--block-size", str(d.model.block_size)] if d.model.sparse is not None else []


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return "none" if value is None else format(value, "g") if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Deployment:
    """One vLLM deployment and the traffic it serves: the record every m3lab entry point takes.

    ``model``, ``hardware``, ``plan`` (TP/EP/DP, indexer CP, shared-expert fusion, local widths), ``quant``
    (weights, KV and index-key cache dtypes), ``serving`` (every vLLM switch that changes which code runs,
    incl. the speculative config), ``workload`` (what the clients send), ``limits`` (vLLM's scheduler and memory
    limits), ``acceptance`` (speculative decoding's acceptance and its source) and ``pd`` (P/D roles and the KV
    link). ``preset``: the preset it was built from; ``name`` is the preset's name, or the preset's name plus what
    changed (``mxfp4-tp2+tp=8``)."""

    model: ModelSpec
    hardware: Hardware
    plan: ParallelPlan
    quant: QuantScheme
    serving: ServingConfig = field(default_factory=ServingConfig)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    limits: SchedulerLimits = field(default_factory=SchedulerLimits)
    acceptance: SpecAcceptance = field(default_factory=SpecAcceptance)
    pd: PDRoles = field(default_factory=PDRoles)
    name: str = ""
    description: str = ""
    preset: str = ""

    def validate(self) -> Deployment:
        """Check every part (raise M3LabError naming the field); return self."""
        self.plan.validate(self.model)
        self.serving.validate()
        self.workload.validate()
        self.limits.validate()
        self.acceptance.validate(self.serving.spec_tokens, self.workload.kind)
        self.pd.validate()
        if self.workload.kind == "fixed":   # a request longer than the context vLLM serves is refused
            check_context(self.model, self.workload.isl, self.workload.osl, self.serving.max_model_len)
        if self.pd.enabled:
            for role in ROLE_NAMES:
                self.role_plan(role).validate(self.model)
                self.role_limits(role).validate(f"{role}_")
        return self

    def key(self) -> str:
        """Stable hash of every field of the record (not the name or description): the cache key."""
        return stable_key(*(getattr(self, f) for f in RECORD_FIELDS))

    def settings(self) -> dict[str, Any]:
        """The record as ``{m3lab key: value}`` (:func:`m3lab.spec.settings.flat`), limits as vLLM resolves them."""
        limits = self.scheduler_limits()
        return {**flat(self), "max_num_seqs": limits.max_num_seqs,
                "max_num_batched_tokens": limits.max_num_batched_tokens}

    # ---- resolved views ------------------------------------------------------------------------------
    def scheduler_limits(self) -> SchedulerLimits:
        """``limits`` with vLLM's defaults for this hardware filled in."""
        return self.limits.resolved(self.hardware)

    def role_plan(self, role: str) -> ParallelPlan:
        """The plan of a P/D role (``prefill`` or ``decode``): the role's tp/ep where given, else the deployment's."""
        r = getattr(self.pd, role)
        return dataclasses.replace(self.plan, tp=r.tp or self.plan.tp, ep=r.ep or self.plan.ep, role=role)

    def role_limits(self, role: str) -> SchedulerLimits:
        """The scheduler limits of a P/D role, resolved (the role's own where given)."""
        r = getattr(self.pd, role)
        over = {k: getattr(r, k) for k in ("max_num_seqs", "max_num_batched_tokens") if getattr(r, k) is not None}
        return dataclasses.replace(self.limits, **over).resolved(self.hardware)

    @property
    def gpus(self) -> int:
        """GPUs the deployment occupies: tp x dp, or every instance of both P/D roles."""
        if not self.pd.enabled:
            return self.plan.world
        return sum(getattr(self.pd, r).instances * self.role_plan(r).world for r in ROLE_NAMES)

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
        args += self._limit_args()
        if p.role != "both":
            args += ["--kv-transfer-config", json.dumps(kv_transfer_config(p.role), separators=(",", ":"))]
        return env, args

    def _limit_args(self) -> list[str]:
        """``vllm serve`` flags of the scheduler limits that differ from vLLM's defaults."""
        lim, default = self.limits, SchedulerLimits()
        args: list[str] = []
        for name in ("max_num_seqs", "max_num_batched_tokens"):   # None: vLLM picks by the GPU
            if getattr(lim, name) is not None:
                args += [f"--{name.replace('_', '-')}", str(getattr(lim, name))]
        if lim.gpu_memory_utilization != default.gpu_memory_utilization:
            args += ["--gpu-memory-utilization", format(lim.gpu_memory_utilization, "g")]
        for name, flag in LIMIT_SWITCHES.items():
            if getattr(lim, name) != getattr(default, name):
                args.append(f"--{'' if getattr(lim, name) else 'no-'}{flag}")
        return args

    def with_settings(self, settings: Mapping[str, Any]) -> Deployment:
        """This deployment with ``settings`` applied (any key of :mod:`m3lab.spec.settings`: m3lab field names,
        vLLM environment variables, ``vllm serve`` / ``vllm bench serve`` flags), validated. A deployment that
        now differs from its preset is named after it plus what changed (``mxfp4-tp2+tp=8``)."""
        d = apply(self, settings)
        s = d.serving   # a method alone drafts one token; draft tokens alone mean EAGLE3 (the write-up's); 0: off
        if s.spec_method and not s.spec_tokens and "spec_tokens" not in settings:
            s = dataclasses.replace(s, spec_tokens=1)
        elif s.spec_tokens and not s.spec_method:
            s = dataclasses.replace(s, spec_method="eagle3")
        elif not s.spec_tokens and s.spec_method and "spec_tokens" in settings:
            s = dataclasses.replace(s, spec_method=None, spec_model=None)
        d = dataclasses.replace(d, serving=s)
        if self.preset:
            base = load_preset(self.preset)
            changed = {k: v for k, v in changes(base, d).items() if k not in _TRAFFIC_KEYS}
            tail = "".join(f"+{k}={_shown(v)}" for k, v in changed.items())
            d = dataclasses.replace(d, name=base.name + tail, description=base.description + (
                f" (changed: {', '.join(f'{k}={_shown(v)}' for k, v in changed.items())})" if changed else ""))
        return d.validate()


def _json_arg(flag: str, text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise M3LabError(f"{flag} is not JSON ({err.msg})", field=flag) from None
    if not isinstance(value, dict):
        raise M3LabError(f"{flag} must be a JSON object", field=flag)
    return value


def _limit_flag(flag: str, value: str | None, limits: dict) -> int:
    """Record a scheduler-limit flag of ``vllm serve`` in ``limits``; the arguments it took (0: not one)."""
    name = flag.lstrip("-").replace("-", "_")
    if name in ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization"):
        limits[name] = float(value) if name == "gpu_memory_utilization" else int(value)
        return 2
    switch = flag.lstrip("-").removeprefix("no-")
    if switch in SWITCH_FIELDS:
        limits[SWITCH_FIELDS[switch]] = not flag.startswith("--no-")
        return 1
    return 0


def _json_flag(flag: str, value: str | None, serving: dict, plan: dict, cache: dict, defaults: ServingConfig) -> bool:
    """Record a JSON-valued flag of ``vllm serve`` (attention, model overrides, speculation, compilation, KV
    transfer) in ``serving`` / ``plan`` / ``cache`` (KV and index dtypes, index-cache sharing); False: not one."""
    if flag in ("--attention-config", "-ac"):
        ac = _json_arg(flag, value)
        cache["index_dtype"] = ac.pop("indexer_kv_dtype", "bf16")
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
            cache["freq"] = int(text.get("index_topk_freq", 1))
            cache["offset"] = int(text.get("index_skip_topk_offset", 0))
    elif flag in ("--speculative-config", "-sc"):
        sc = _json_arg(flag, value)
        serving["spec_method"] = sc.get("method")
        serving["spec_tokens"] = int(sc.get("num_speculative_tokens", 0))
        serving["spec_model"] = sc.get("model")
    elif flag in ("--compilation-config", "-cc"):
        serving["cudagraph_mode"] = str(_json_arg(flag, value).get("cudagraph_mode", defaults.cudagraph_mode))
    elif flag == "--kv-transfer-config":
        kv_role = _json_arg(flag, value).get("kv_role")
        plan["role"] = {v: k for k, v in KV_ROLES.items()}.get(kv_role, "both")
    else:
        return False
    return True


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
    plan: dict[str, Any] = {"fused_shared_expert": env_bool(env.get(FSE_ENV), False),  # vLLM: off unless set
                            "role": "both"}
    cache = {"kv_dtype": "bf16", "index_dtype": "bf16", "freq": 1, "offset": 0}
    enable_ep = False
    limits: dict[str, Any] = {}
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
            cache["kv_dtype"] = value
        elif _json_flag(flag, value, serving, plan, cache, defaults):
            pass
        elif flag == "--monokernel":
            serving["monokernel"], step = True, 1
        elif flag == "--moe-backend":
            serving["moe_backend"] = value
        elif flag == "--max-model-len":
            serving["max_model_len"] = int(value)
        elif (taken := _limit_flag(flag, value, limits)):
            step = taken
        else:
            raise M3LabError(f"vllm argument {flag!r} is not modelled by m3lab", field=flag)
        i += step
    p = ParallelPlan(**plan)
    if enable_ep:  # vLLM's EP group spans TP x DP
        p = dataclasses.replace(p, ep=p.tp * p.dp)
    spec = load_model(model)
    if cache["freq"] > 1:
        spec = spec.with_index_sharing(cache["freq"], cache["offset"])
    return Deployment(model=spec, hardware=load_hardware(hardware), plan=p,
                      quant=load_quant(quant).with_cache(kv_dtype=cache["kv_dtype"], index_dtype=cache["index_dtype"]),
                      serving=ServingConfig(**serving), limits=SchedulerLimits(**limits)).validate()


# ---- presets and builders -------------------------------------------------------------------------
def list_presets() -> list[str]:
    return sorted(PRESETS)


def load_preset(name: str) -> Deployment:
    """The Deployment of a named preset (see :data:`PRESETS`); every field it does not name keeps its default."""
    if name not in PRESETS:
        close = difflib.get_close_matches(str(name), list_presets(), n=3, cutoff=0.5)
        raise M3LabError(f"unknown preset {name!r}", field="preset",
                         hint=("did you mean " + ", ".join(close) + "? " if close else "") + "one of: "
                              + ", ".join(list_presets()))
    p = PRESETS[name]
    model = load_model(p.model)
    if p.index_topk_freq > 1:
        model = model.with_index_sharing(p.index_topk_freq)
    return Deployment(model=model, hardware=load_hardware(p.hardware), plan=ParallelPlan(**p.plan),
                      quant=load_quant(p.quant).with_cache(kv_dtype=p.kv_dtype, index_dtype=p.index_dtype),
                      serving=ServingConfig(**p.serving), name=p.name, description=p.description,
                      preset=p.name).validate()


def default_deployment() -> Deployment:
    """The checklist's deployment (:data:`~m3lab.spec.presets.DEFAULT_PRESET`): MiniMax M3, MXFP8, TP4, vLLM's
    default switches and limits, 8192 in / 1024 out at concurrency 32."""
    return load_preset(DEFAULT_PRESET)


def make_deployment(preset: str | None = None, settings: Mapping[str, Any] | None = None,
                    **values: Any) -> Deployment:
    """The one way to build a deployment from names: ``preset`` (None: the default deployment), then
    ``settings`` and ``values`` (keys of :mod:`m3lab.spec.settings`; a value of None keeps the preset's),
    validated. What every CLI command, pipeline and notebook calls::

        make_deployment("mxfp4-tp2", tp=8, isl=4096)
        make_deployment(None, {"VLLM_ROCM_USE_AITER": "1", "--max-num-seqs": "128"})
    """
    base = default_deployment() if preset is None or str(preset).strip().lower() in NULL_WORDS else \
        load_preset(str(preset).strip())
    given = {**(settings or {}), **{k: v for k, v in values.items() if v is not None}}
    return base.with_settings(given) if given else base


def deployment(model: str | ModelSpec, hardware: str | Hardware, quant: str | QuantScheme, *, tp: int = 1,
               ep: int = 1, dp: int = 1, fused_shared_expert: bool | None = None,
               serving: ServingConfig | None = None) -> Deployment:
    """A Deployment from names (vLLM defaults for everything the launch line would not say)."""
    plan = ParallelPlan(tp=tp, ep=ep, dp=dp)
    if fused_shared_expert is not None:
        plan = dataclasses.replace(plan, fused_shared_expert=fused_shared_expert)
    return Deployment(model=load_model(model), hardware=load_hardware(hardware), plan=plan,
                      quant=load_quant(quant), serving=serving or ServingConfig()).validate()
