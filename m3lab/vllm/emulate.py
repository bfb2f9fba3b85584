"""An emulated GPU platform: the installed vLLM takes its own decisions as on an MI355X, MI300X, H200 or B200.

``with emulate(Target.of(load_hardware("mi355x")), env={"VLLM_ROCM_USE_AITER": "1"}, tp=4):`` makes vLLM 0.33.0
believe it runs on rank 0 of a 4-GPU gfx950 node with that environment, without a GPU and without AITER, so
its selection code (MoE backend oracles, routers, linear kernels, all-reduce fusion checks, indexer and
attention selection, its own M3 model constructor) runs unchanged and answers for that deployment.

What is faked, and how (everything is restored on exit):

- ``vllm.platforms.current_platform``: a real ``RocmPlatform`` / ``CudaPlatform`` instance, also rebound in
  every ``vllm.*`` module that imported the name. On ROCm the arch comes from a stand-in ``amdsmi``
  (:mod:`m3lab.vllm.emulate_stubs`) and the module flags ``_GCN_ARCH``, ``_ON_GFX950`` ... are re-derived by
  running ``vllm/platforms/rocm.py``'s own block that sets them. ``torch.cuda`` device queries report the
  target (:class:`Target`, from the hardware profile: arch, CU count, memory).
- the environment: ``os.environ`` gets the deployment's variables, ``vllm.envs``' cache is dropped and
  ``rocm_aiter_ops.refresh_env_variables()`` re-reads the class flags it copies at import.
- the libraries of the serving image: stub packages from the declared profile
  (:mod:`m3lab.vllm.target_image`): ``find_spec("aiter")`` finds AITER, its inspected signatures and
  constants are the image's, calling anything raises.
- parallel state: TP / PP / DP / EP / DCP / PCP groups of the deployment's sizes (rank 0, collectives raise);
  when vLLM's communicator would hold an AITER custom all-reduce (``cuda_communicator.py``: custom AR on,
  not batch-invariant, ``rocm_aiter_ops.is_custom_all_reduce_enabled()``) the TP group holds vLLM's own
  ``AiterCustomAllreduce`` over AITER's stand-in.
- caches: every ``functools`` cache in ``vllm.*`` is cleared on entry and exit (device capability, device
  name, the AITER signature probes, ``has_<package>``).

Import-time constants (``rocm_native._BK256_STAGES``, ``amd/ops/sparse_attn._SPARSE_ATTN_SUB_K``, which model
package ``vllm.models.minimax_m3`` binds, ``FP8_DTYPE`` of many modules) are fixed by the platform current
at a module's first import. So a process serves ONE target: its first emulation binds it, the modules of
:data:`ARCH_BOUND_MODULES` imported before it are re-imported inside it, and a later emulation of another
target raises. :mod:`m3lab.vllm.workers` runs one worker process per target for callers that need several.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from m3lab.errors import M3LabError
from m3lab.vllm import emulate_patch as patch
from m3lab.vllm import emulate_stubs as stubs
from m3lab.vllm.target_image import TargetImage, image_for
from m3lab.vllm_src.imports import prepare

# Modules whose import-time constants depend on the platform (re-imported on the first emulation when a
# process imported them before it).
ARCH_BOUND_MODULES = ("vllm.model_executor.kernels.linear.mxfp8.rocm_native",
                      "vllm.models.minimax_m3.amd.ops.sparse_attn")
M3_PACKAGE = "vllm.models.minimax_m3"
_ROCM_FLAGS_FIRST, _ROCM_FLAGS_LAST = "_GCN_ARCH = _get_gcn_arch()", "_ON_RDNA4 ="


@dataclass(frozen=True)
class Target:
    """The GPU vLLM is made to see: platform kind, arch, market name, compute units, memory (bytes)."""

    kind: str            # "rocm" | "cuda"
    arch: str            # "gfx950", "gfx942", "sm_90", "sm_100"
    name: str
    compute_units: int
    memory_bytes: int

    @classmethod
    def of(cls, hardware) -> Target:
        """The target of a hardware profile (``m3lab.spec.hardware``: vendor, arch, compute_units, hbm_bytes)."""
        vendor = (hardware.vendor or "").lower()
        if vendor not in ("amd", "nvidia") or not hardware.arch:
            raise M3LabError(f"hardware {hardware.name!r} has no vendor/arch vLLM can be emulated on",
                             field="hardware", hint="profiles need vendor: amd|nvidia and arch: gfx950|gfx942|sm_90|sm_100")
        return cls("rocm" if vendor == "amd" else "cuda", hardware.arch, hardware.name,
                   int(hardware.compute_units or 0), int(hardware.hbm_bytes or 0))

    @property
    def capability(self) -> tuple[int, int]:
        """(major, minor) as torch reports it (gfx950 -> 9.5, sm_90 -> 9.0)."""
        digits = self.arch.removeprefix("gfx").removeprefix("sm_")
        return (int(digits[0]), int(digits[1])) if self.kind == "rocm" else (int(digits[:-1]), int(digits[-1]))

    @property
    def image(self) -> TargetImage:
        return image_for(self.kind)

    def device_properties(self) -> stubs.DeviceProperties:
        major, minor = self.capability
        return stubs.DeviceProperties(name=self.name, major=major, minor=minor,
                                      multi_processor_count=self.compute_units, total_memory=self.memory_bytes,
                                      gcnArchName=f"{self.arch}:sramecc+:xnack-" if self.kind == "rocm" else "",
                                      warp_size=64 if self.kind == "rocm" else 32)


@dataclass
class _Process:
    """What this process has bound (see the module docstring)."""

    prepared: bool = False
    bound: Target | None = None
    original_platform: Any = None
    cache_fns: list = dataclasses.field(default_factory=list)
    scanned: int = 0


_PROCESS = _Process()


def _prepare_process() -> None:
    """Import vLLM as m3lab does, with the pieces that must resolve before any emulation (idempotent)."""
    if _PROCESS.prepared:
        return
    prepare("emulating a GPU platform for vLLM")
    os.environ.setdefault("HIP_VISIBLE_DEVICES", "")
    import transformers  # noqa: F401  (probes find_spec("torchvision") before the stand-in exists)
    import vllm.platforms
    import vllm.triton_utils  # noqa: F401  (HAS_TRITON is decided here, against this box's drivers)
    import vllm.v1.structured_output  # noqa: F401  (xgrammar's FFI probes cuda-python at import: the real one)
    _PROCESS.original_platform = vllm.platforms.current_platform
    _PROCESS.prepared = True


def bind(target: Target) -> str:
    """Bind this process to ``target`` (a worker's first call): vLLM imported, the platform modules and
    vLLM's M3 package imported under the emulation. -> the target's arch."""
    with emulate(target):
        pass
    return target.arch


def _bind(target: Target) -> bool:
    """Bind the process to ``target``; True the first time. Raises for a second target."""
    if _PROCESS.bound is None:
        _PROCESS.bound = target
        return True
    if (_PROCESS.bound.kind, _PROCESS.bound.arch) != (target.kind, target.arch):
        raise M3LabError(f"this process emulates {_PROCESS.bound.arch}; vLLM fixes platform constants at import, "
                         f"so {target.arch} needs its own process", field="hardware",
                         hint="use m3lab.vllm.workers (one worker process per target)")
    return False


_vllm_modules = patch.vllm_modules


_FUNCTION_TYPES = (types.FunctionType, functools._lru_cache_wrapper)


def _caches_in(obj: Any, out: list, seen: set[int]) -> None:
    for value in list(vars(obj).values()):
        fn = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        while isinstance(fn, _FUNCTION_TYPES) and id(fn) not in seen:
            seen.add(id(fn))
            if isinstance(fn, functools._lru_cache_wrapper):
                out.append(fn)
            fn = fn.__dict__.get("__wrapped__")
        if isinstance(value, type) and value.__module__.startswith("vllm") and id(value) not in seen:
            seen.add(id(value))
            _caches_in(value, out, seen)


def clear_caches() -> int:
    """Clear every functools cache of vLLM's modules and classes (rescanned as modules appear); -> count."""
    mods = _vllm_modules()
    if len(mods) != _PROCESS.scanned:
        found: list = []
        seen: set[int] = set()
        for mod in mods:
            _caches_in(mod, found, seen)
        _PROCESS.cache_fns, _PROCESS.scanned = found, len(mods)
    for fn in _PROCESS.cache_fns:
        fn.cache_clear()
    return len(_PROCESS.cache_fns)


def rederive_rocm_flags(arch: str) -> None:
    """Re-run ``vllm/platforms/rocm.py``'s own ``_GCN_ARCH`` / ``_ON_*`` block for ``arch``."""
    rocm = sys.modules["vllm.platforms.rocm"]
    lines = inspect.getsource(rocm).splitlines()
    first = next(i for i, text in enumerate(lines) if text.startswith(_ROCM_FLAGS_FIRST))
    last = next(i for i, text in enumerate(lines) if text.startswith(_ROCM_FLAGS_LAST))
    block = "\n".join([f"_GCN_ARCH = {arch!r}", *lines[first + 1:last + 1]])
    exec(compile(block, rocm.__file__, "exec"), rocm.__dict__)  # noqa: S102  (vLLM's own source)


def _rebind_platform(platform: Any) -> None:
    import vllm.platforms
    vllm.platforms._current_platform = platform
    for mod in _vllm_modules():
        if mod.__name__ != "vllm.platforms" and "current_platform" in mod.__dict__:
            mod.__dict__["current_platform"] = platform


def stale_bindings(platform: Any) -> list[str]:
    """The ``vllm.*`` modules whose ``current_platform`` is still ``platform`` (a leak check)."""
    return [m.__name__ for m in _vllm_modules() if m.__dict__.get("current_platform") is platform]


class _FakeStream:
    """``torch.cuda.Stream`` / ``Event`` stand-in (vLLM creates an auxiliary stream while building)."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, attr):
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def _torch_cuda(target: Target) -> Iterator[None]:
    import torch
    props = target.device_properties()
    with patch.patched(torch.cuda, get_device_properties=lambda *a, **k: props,
                  get_device_capability=lambda *a, **k: target.capability,
                  get_device_name=lambda *a, **k: target.name, Stream=_FakeStream, Event=_FakeStream,
                  graph_pool_handle=lambda: ("emulated graph pool",)), \
            patch.patched(torch.accelerator, current_device_index=lambda: 0):  # rank 0's GPU
        yield


def _platform_for(target: Target) -> Any:
    """A real vLLM platform instance for ``target`` (its module imported under the stand-ins)."""
    if target.kind == "rocm":
        rocm = importlib.import_module("vllm.platforms.rocm")
        rederive_rocm_flags(target.arch)
        platform = rocm.RocmPlatform()
    else:
        cuda = importlib.import_module("vllm.platforms.cuda")
        platform = cuda.CudaPlatform()
    platform.device_count = lambda: 8  # a node of eight GPUs, whatever the deployment uses
    return platform


def _aiter_ar_communicator(tp: int) -> Any:
    """The TP communicator's AITER custom all-reduce when vLLM's communicator would build one, else None.

    The condition is ``CudaCommunicator.__init__``'s (``use_aiter_allreduce``), evaluated with vLLM's own
    flags; the object is vLLM's ``AiterCustomAllreduce`` over AITER's stand-in ``CustomAllreduce``.
    """
    import vllm.envs as envs
    from vllm._aiter_ops import rocm_aiter_ops
    from vllm.distributed import parallel_state
    from vllm.platforms import current_platform
    if tp < 2 or not current_platform.is_rocm():
        return None
    if not (parallel_state._ENABLE_CUSTOM_ALL_REDUCE and not envs.VLLM_BATCH_INVARIANT
            and rocm_aiter_ops.is_custom_all_reduce_enabled()):
        return None
    from vllm.distributed.device_communicators.aiter_custom_all_reduce import AiterCustomAllreduce
    return AiterCustomAllreduce(group=stubs.FakeGroup("tp-cpu", tp), device="cuda:0")


_GROUPS = ("_WORLD", "_TP", "_PP", "_DP", "_EP", "_EPLB", "_DCP", "_PCP", "_ETP")


@contextlib.contextmanager
def _parallel_state(tp: int, pp: int, dp: int, dcp: int, pcp: int, enable_ep: bool) -> Iterator[None]:
    from vllm.distributed import parallel_state as ps
    ep = tp * dp * pcp if enable_ep else 1
    sizes = {"_WORLD": tp * pp * dp * pcp, "_TP": tp, "_PP": pp, "_DP": dp, "_EP": ep, "_EPLB": ep,
             "_DCP": dcp, "_PCP": pcp, "_ETP": 1}
    old = {g: getattr(ps, g, None) for g in _GROUPS}
    for g in _GROUPS:
        setattr(ps, g, stubs.FakeGroup(g.strip("_").lower(), sizes[g]))
    comm = _aiter_ar_communicator(tp)
    ps._TP.device_communicator = types.SimpleNamespace(aiter_ar_comm=comm)
    try:
        yield
    finally:
        for g, v in old.items():
            setattr(ps, g, v)


def _ray_initialized() -> bool:
    """``vllm.ray.lazy_utils.is_ray_initialized`` / ``is_in_ray_actor`` without importing ray (seconds)
    when nothing imported it (then neither can be true)."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def _reset_process_globals() -> None:
    """State vLLM keeps per process that must not outlive the context: the auxiliary stream it creates
    while building (a stand-in here). (The AITER top-k buffers belong to a built model:
    :mod:`m3lab.vllm.vllm_build` keeps them with it.)"""
    import vllm.utils.torch_utils as torch_utils
    torch_utils._aux_stream = None


@contextlib.contextmanager
def _aiter_constants(platform: Any) -> Iterator[None]:
    """``vllm._aiter_ops``' import-time answers (AITER found, the fp8 dtype) for the emulated platform."""
    import importlib.util

    import vllm._aiter_ops as aiter_ops
    try:
        with patch.patched(aiter_ops, IS_AITER_FOUND=importlib.util.find_spec("aiter") is not None,
                      FP8_DTYPE=platform.fp8_dtype()):
            aiter_ops.rocm_aiter_ops.refresh_env_variables()
            yield
    finally:
        aiter_ops.rocm_aiter_ops.refresh_env_variables()


def _first_binding(target: Target) -> None:
    """On the process's first emulation: the real M3 package and fresh arch-bound modules."""
    if isinstance(sys.modules.get(M3_PACKAGE), types.ModuleType) and not hasattr(sys.modules[M3_PACKAGE], "__file__"):
        del sys.modules[M3_PACKAGE]  # m3lab.vllm_src.imports' bare package: import vLLM's own under the target
    for name in ARCH_BOUND_MODULES:
        if name in sys.modules:
            importlib.reload(sys.modules[name])
    importlib.import_module(M3_PACKAGE)


@contextlib.contextmanager
def emulate(target: Target, *, env: Mapping[str, str | None] | None = None, tp: int = 1, pp: int = 1,
            dp: int = 1, dcp: int = 1, pcp: int = 1, enable_ep: bool = False, vllm_config: Any = None,
            image: TargetImage | None = None) -> Iterator[Any]:
    """vLLM sees ``target`` with ``env`` and these group sizes (rank 0) until the block exits; -> the platform.

    ``vllm_config``: made current (``set_current_vllm_config``) inside the block. ``image``: the serving
    image's libraries (default: the declared one for the target's kind).
    """
    _prepare_process()
    image = image or target.image
    first = _bind(target)
    packages = stubs.StubPackages(image)
    stubs.AiterCustomAllreduceStandIn.fully_connected = image.fully_connected
    entries = stubs.torchvision_module()
    if target.kind == "rocm":
        entries["amdsmi"] = stubs.amdsmi_module(target.arch, target.name, target.memory_bytes)
    with contextlib.ExitStack() as stack:
        stack.enter_context(patch.modules(entries))
        packages.install()
        stack.callback(packages.uninstall)
        if target.kind == "cuda":
            stack.enter_context(stubs.cuda_stand_ins(image))
        stack.enter_context(_torch_cuda(target))
        lazy = importlib.import_module("vllm.ray.lazy_utils")
        stack.enter_context(patch.rebound(lazy.is_ray_initialized, _ray_initialized))
        stack.enter_context(patch.rebound(lazy.is_in_ray_actor, _ray_initialized))
        stack.enter_context(patch.environment(dict(env or {})))
        platform = _platform_for(target)
        _rebind_platform(platform)
        stack.callback(_restore_platform)
        stack.enter_context(patch.patched(type(platform), _global_graph_pool=None))  # the graph pool it caches
        clear_caches()
        stack.callback(clear_caches)
        stack.enter_context(_aiter_constants(platform))
        if first:
            _first_binding(target)
        _reset_process_globals()
        stack.callback(_reset_process_globals)
        stack.enter_context(_parallel_state(tp, pp, dp, dcp, pcp, enable_ep))
        if vllm_config is not None:
            from vllm.config import set_current_vllm_config
            stack.enter_context(set_current_vllm_config(vllm_config))
        yield platform


def _restore_platform() -> None:
    if "vllm.platforms.rocm" in sys.modules:
        rederive_rocm_flags("")
    _rebind_platform(_PROCESS.original_platform)
