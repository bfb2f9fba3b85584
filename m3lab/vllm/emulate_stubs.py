"""The stand-ins :mod:`m3lab.vllm.emulate` installs so that vLLM's own code runs as on a target GPU.

None of them computes anything of vLLM's: each answers an environment probe (a device query, a package
lookup, a collective's world size) the way the target machine and its image would.

- :func:`amdsmi_module`: the ``amdsmi`` queries ``vllm/platforms/rocm.py`` makes at import and later
  (gfx name, market name, memory, XGMI links), answered for a :class:`~m3lab.vllm.emulate.Target`.
- :class:`StubPackages`: a meta-path finder serving the optional packages of the declared image
  (``aiter``, ``quark``, ``flashinfer``; :mod:`m3lab.vllm.target_image`): ``find_spec`` sees them, every
  attribute is a callable that raises :class:`StubCalled` (nothing runs), inspected signatures and
  constants come from the image profile, names the profile lacks are recorded in ``misses``.
- :func:`torchvision_module`: ``torchvision.transforms.InterpolationMode``, the one torchvision name vLLM's
  M3 processor imports at module level.
- :class:`FakeGroup`: a process group of the deployment's size (rank 0) whose collectives raise.
- :class:`AiterCustomAllreduceStandIn`: AITER's ``CustomAllreduce`` (the object vLLM's
  ``AiterCustomAllreduce`` wraps), answering ``should_custom_ar`` with the image's size rule.
- :class:`DeviceProperties`: what ``torch.cuda.get_device_properties`` reports on the target.
"""
from __future__ import annotations

import contextlib
import enum
import importlib.abc
import importlib.machinery
import inspect
import sys
import types
from dataclasses import dataclass
from typing import Any, Iterator

from m3lab.vllm.target_image import TargetImage, aiter_should_custom_ag, aiter_should_custom_ar


class StubCalled(RuntimeError):
    """A stand-in of the target image's libraries was called: the emulation decides, it never runs kernels."""

    def __init__(self, name: str):
        super().__init__(f"{name} is a stand-in of the target image's library (nothing runs here)")
        self.name = name


class StandIn:
    """A name of the target image's library: calling it raises :class:`StubCalled`; attributes are
    stand-ins too (``aiter.tuned_gemm.tgemm.mm``); ``params``: the signature vLLM inspects."""

    def __init__(self, name: str, params: tuple[str, ...] | None = None):
        self.__name__ = self.__qualname__ = name.rsplit(".", 1)[-1]
        self._name = name
        if params is not None:
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
            self.__signature__ = inspect.Signature([inspect.Parameter(p, kind) for p in params])

    def __call__(self, *args, **kwargs):
        raise StubCalled(self._name)

    def __getattr__(self, attr: str) -> StandIn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return StandIn(f"{self._name}.{attr}")

    def __or__(self, other):  # used in annotations: ``StandIn | None``
        return self

    def __getitem__(self, key):  # generic types and DSL indexing (``cute.Tensor[...]``)
        return StandIn(f"{self._name}[]")

    def __mro_entries__(self, bases):  # a class deriving from a library class
        return (object,)

    __ror__ = __or__

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


class _StubModule(types.ModuleType):
    """A module of a stub package: unknown attributes become stand-ins (or AttributeError when absent)."""

    _owner: StubPackages

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        full = f"{self.__name__}.{attr}"
        if full in self._owner.image.aiter_absent:
            self._owner.misses.add(full)
            raise AttributeError(f"{full} is not in the declared target image")
        self._owner.used.add(full)
        value = StandIn(full, self._owner.image.aiter_signatures.get(full))
        setattr(self, attr, value)
        return value


class StubPackages(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serve the declared image's optional packages (see the module docstring)."""

    def __init__(self, image: TargetImage):
        self.image = image
        self.misses: set[str] = set()   # modules or names vLLM looked for that the image lacks
        self.used: set[str] = set()     # names vLLM looked up (all stand-ins)
        self.roots = tuple(image.packages)

    def _serves(self, name: str) -> bool:
        root = name.split(".")[0]
        if root not in self.roots:
            return False
        if root != "aiter" or name == "aiter":
            return True
        return name in self.image.aiter_modules

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in self.roots:
            return None
        if not self._serves(name):
            self.misses.add(name)
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module._owner = self
        module.__path__ = []
        module.__file__ = f"<target image {spec.name}>"
        return module

    def exec_module(self, module) -> None:
        prefix = module.__name__ + "."
        for full, value in self.image.library_values.items():
            if full.startswith(prefix) and "." not in full[len(prefix):]:
                setattr(module, full[len(prefix):], value)
        if module.__name__ == "aiter.dist.device_communicators.custom_all_reduce":
            module.CustomAllreduce = AiterCustomAllreduceStandIn

    def install(self) -> None:
        sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for name in [n for n in sys.modules if n.split(".")[0] in self.roots]:
            if isinstance(sys.modules[name], _StubModule):
                del sys.modules[name]


# Collectives during a recorded step: the recorder sets this to log "<group>.<collective>" (None otherwise).
COLLECTIVE_LOG: list = []


def _collective(name: str) -> None:
    if COLLECTIVE_LOG:
        COLLECTIVE_LOG[-1](name)


def _gathered(x, world: int, dim: int = 0):
    """An (empty) result of the all-gather of ``x`` over ``world`` ranks along ``dim``."""
    import torch
    shape = list(x.shape)
    shape[dim] *= world
    return torch.empty(shape, dtype=x.dtype).as_subclass(type(x))


class AiterCustomAllreduceStandIn:
    """AITER's ``CustomAllreduce`` as vLLM's ``AiterCustomAllreduce`` uses it: sizes, the size rules
    (:func:`m3lab.vllm.target_image.aiter_should_custom_ar`, ``should_custom_ag``) and shaped results."""

    fully_connected = True  # set per context from the image profile

    def __init__(self, group, device, max_size: int = 8192 * 1024 * 8 * 2, **kwargs):
        self.world_size = group.world_size
        self.max_size = max_size
        self.disabled = False

    def should_custom_ar(self, inp, prefill_support: bool = False) -> bool:
        return aiter_should_custom_ar(inp.numel() * inp.element_size(), self.world_size, self.fully_connected)

    def should_custom_ag(self, inp) -> bool:
        return aiter_should_custom_ag(inp.numel() * inp.element_size(), self.world_size, self.fully_connected,
                                      self.max_size)

    def custom_all_gather(self, inp, dim: int = 0):
        _collective("aiter.custom_all_gather")
        return _gathered(inp, self.world_size, dim)

    def custom_all_reduce(self, inp):
        _collective("aiter.custom_all_reduce")
        return inp


def amdsmi_module(arch: str, market_name: str, memory_bytes: int, devices: int = 8) -> types.ModuleType:
    """A stand-in ``amdsmi`` that reports ``devices`` GPUs of the given gfx arch."""
    mod = types.ModuleType("amdsmi")
    mod.__spec__ = importlib.machinery.ModuleSpec("amdsmi", None)

    class AmdSmiException(Exception):
        pass

    class AmdSmiMemoryType:
        VRAM = 0

    def asic_info(handle):
        return {"target_graphics_version": arch, "device_id": "m3lab-emulated", "market_name": market_name}

    mod.AmdSmiException, mod.AmdSmiMemoryType = AmdSmiException, AmdSmiMemoryType
    mod.amdsmi_init = mod.amdsmi_shut_down = lambda *args, **kwargs: None
    mod.amdsmi_get_processor_handles = lambda: list(range(devices))
    mod.amdsmi_get_gpu_asic_info = asic_info
    mod.amdsmi_get_gpu_device_uuid = lambda handle: f"emulated-{handle}"
    mod.amdsmi_get_gpu_memory_total = lambda handle, kind: memory_bytes
    mod.amdsmi_topo_get_link_type = lambda a, b: {"hops": 1, "type": 2}  # XGMI, one hop
    mod.amdsmi_topo_get_numa_node_number = lambda handle: 0
    return mod


def torchvision_module() -> dict[str, types.ModuleType]:
    """``torchvision`` + ``torchvision.transforms`` with ``InterpolationMode`` (PIL resampling names)."""
    tv, tvt = types.ModuleType("torchvision"), types.ModuleType("torchvision.transforms")
    tv.__path__ = []
    tvt.InterpolationMode = enum.Enum("InterpolationMode", {
        "NEAREST": "nearest", "NEAREST_EXACT": "nearest-exact", "BILINEAR": "bilinear", "BICUBIC": "bicubic",
        "BOX": "box", "HAMMING": "hamming", "LANCZOS": "lanczos"})
    tv.transforms = tvt
    return {"torchvision": tv, "torchvision.transforms": tvt}


class CollectiveCalled(RuntimeError):
    """A collective ran on an emulated process group (nothing communicates here)."""


class FakeGroup:
    """A ``GroupCoordinator`` of ``world_size`` ranks seen from rank 0; collectives raise."""

    def __init__(self, name: str, world_size: int, device_communicator: Any = None):
        self.unique_name, self.world_size = f"{name}:emulated", world_size
        self.rank = self.rank_in_group = self.local_rank = self.device_index = 0
        self.ranks = list(range(world_size))
        self.is_first_rank = self.is_last_rank = True
        self.device_communicator = device_communicator
        self.cpu_group = self.device_group = None
        self.use_custom_op_call = False
        self.mq_broadcaster = None

    def all_gather(self, input_, dim: int = -1):
        _collective(f"{self.unique_name.split(':')[0]}.all_gather")
        return _gathered(input_, self.world_size, dim)

    def all_reduce(self, input_):
        _collective(f"{self.unique_name.split(':')[0]}.all_reduce")
        return input_

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)

        def collective(*args, **kwargs):
            raise CollectiveCalled(f"{self.unique_name}.{attr}")
        return collective


@dataclass
class DeviceProperties:
    """``torch.cuda.get_device_properties`` of the target (the fields vLLM reads)."""

    name: str
    major: int
    minor: int
    multi_processor_count: int
    total_memory: int
    gcnArchName: str = ""
    warp_size: int = 64
    L2_cache_size: int = 0


_FLASH_ATTN = "vllm.vllm_flash_attn"


@contextlib.contextmanager
def cuda_stand_ins(image: TargetImage) -> Iterator[None]:
    """What vLLM's CUDA code imports from its compiled extensions, answered as on the CUDA image.

    ``vllm.vllm_flash_attn`` reports the image's FlashAttention versions; the CUTLASS capability queries of
    ``vllm._custom_ops`` answer False (m3lab does not resolve CUTLASS paths: M3's linears are MXFP8 / BF16).
    """
    import vllm._custom_ops as ops
    fa = types.ModuleType(_FLASH_ATTN)
    fa.__path__ = []
    versions = image.flash_attn_versions
    fa.FA2_AVAILABLE, fa.FA3_AVAILABLE = 2 in versions, 3 in versions
    fa.is_fa_version_supported = lambda version, *a, **k: version in versions
    fa.fa_version_unsupported_reason = lambda version, *a, **k: (None if version in versions
                                                                   else f"FA{version} is not in the image")
    for name in ("flash_attn_varlen_func", "get_scheduler_metadata", "compile_flash_attn_varlen_func_from_specs"):
        setattr(fa, name, StandIn(f"{_FLASH_ATTN}.{name}"))
    old_fa = sys.modules.get(_FLASH_ATTN)
    sys.modules[_FLASH_ATTN] = fa
    queries = ("cutlass_scaled_mm_supports_fp8", "cutlass_scaled_mm_supports_block_fp8",
               "cutlass_group_gemm_supported")
    old_q = {q: getattr(ops, q, None) for q in queries}
    for q in queries:
        setattr(ops, q, lambda *a, **k: False)
    _compiled_ops(image.compiled_ops)
    try:
        yield
    finally:
        for q, v in old_q.items():
            if v is not None:
                setattr(ops, q, v)
        if old_fa is None:
            sys.modules.pop(_FLASH_ATTN, None)
        else:
            sys.modules[_FLASH_ATTN] = old_fa


_LIBRARIES: dict[str, Any] = {}


def _compiled_ops(names: tuple[str, ...]) -> None:
    """Stand-ins for the image's compiled ops (``torch.ops._C.rotary_embedding``): they exist, and calling
    one raises :class:`StubCalled`. Registered once per process: modules bind them at import."""
    import torch
    for full in names:
        namespace, op = full.split(".")
        if hasattr(getattr(torch.ops, namespace), op):
            continue
        lib = _LIBRARIES.setdefault(namespace, torch.library.Library(namespace, "FRAGMENT"))
        lib.define(f"{op}(" + ", ".join(f"Any? a{i}=None" for i in range(12)) + ") -> Tensor")

        def impl(*args, _name=f"torch.ops.{full}", **kwargs):
            raise StubCalled(_name)
        lib.impl(op, impl, "CompositeExplicitAutograd")
