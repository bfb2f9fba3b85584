"""Run one of vLLM's runtime dispatch bodies on fake tensors and record what it would launch.

Some decisions vLLM takes per step, from the token count: which GEMM (skinny ``wvSplitK``, AITER ``tgemm``,
hipBLASLt), which router GEMM tier, which decode indexer kernel, which MXFP8 tile. :func:`record` calls the
body itself (``vllm/model_executor/layers/utils.py::rocm_unquantized_gemm_impl``, ...) on meta or fake
tensors of the step's shapes, under :func:`m3lab.vllm.emulate.emulate`, and returns a :class:`Trace`:

- Triton kernels it launches, with their launch constexprs (``JITFunction.run`` and ``Autotuner.run`` are
  replaced by a logger while recording; no kernel runs);
- the custom and ATen ops it calls (a ``TorchDispatchMode`` logs every op outside a small list of tensor
  plumbing ops);
- where it stopped: a compiled op absent from this box (``torch.ops._rocm_C.wvSplitK``) or a library call
  of the target image (AITER ``tgemm.mm``), which is the path the body took.
"""
from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from m3lab.vllm.cite import cite_line
from m3lab.vllm.emulate_stubs import COLLECTIVE_LOG, StubCalled

# ATen ops that move, view or allocate: not decisions, not recorded
_PLUMBING = re.compile(r"^aten\.(empty|empty_like|new_empty|empty_strided|view|_unsafe_view|reshape|as_strided|"
                       r"contiguous|clone|copy_|detach|t|transpose|permute|expand|slice|select|unsqueeze|squeeze|"
                       r"split|split_with_sizes|unbind|_to_copy|to|lift_fresh|alias|zeros|zeros_like|fill_|zero_|"
                       r"new_zeros|full|arange|stride|size|sym_size|is_contiguous|flatten|unflatten|"
                       r"_local_scalar_dense|resize_|set_|ones|ones_like)(\.|$)")
_MISSING_OP = re.compile(r"'_OpNamespace' '(\w+)' object has no attribute '(\w+)'")


@dataclass(frozen=True)
class Launch:
    """A Triton kernel launch: the kernel's name and its integer / boolean launch constants."""

    kernel: str
    meta: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.meta).get(key, default)


@dataclass
class Trace:
    """What one dispatch body did on fake tensors (see the module docstring)."""

    launches: list[Launch] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)   # kernels and ops, in call order
    stopped_at: str | None = None   # the compiled op or library call the body reached and could not run
    stop_site: Any = None           # the vLLM line that made that call (a Cite)
    sites: dict = field(default_factory=dict)  # kernel or op -> the vLLM line that launched or called it
    result: Any = None
    indexer_stop: str | None = None   # attention steps: where the indexer stopped when the attend ran apart
    attend: Any = None                # ... and the attend's own trace
    metadata: Any = None              # attention steps: the main metadata vLLM's builder made

    @property
    def kernels(self) -> tuple[str, ...]:
        """Triton kernels, ops and the stop, in call order of kind (for a decision's kernel list)."""
        names = list(self.events)
        if self.stopped_at:
            names.append(self.stopped_at)
        return tuple(dict.fromkeys(names))

    def launch(self, kernel: str) -> Launch | None:
        return next((x for x in self.launches if x.kernel == kernel), None)


_ACTIVE: list[Trace] = []


def _constants(fn: Any, args: tuple, kwargs: dict) -> tuple[tuple[str, Any], ...]:
    names = list(getattr(fn, "arg_names", ()))
    values = dict(zip(names, args))
    values.update(kwargs)
    return tuple((k, v) for k, v in values.items() if isinstance(v, (bool, int, str)) and k != "grid")


def _vllm_site(frame: Any) -> Any:
    """The innermost frame of vLLM's code at or above ``frame``, as a Cite (None when there is none); vLLM's
    communicator wrappers are passed over (the call site that asked for the collective decides)."""
    while frame is not None:
        site = cite_line(frame.f_code.co_filename, frame.f_code.co_qualname, frame.f_lineno)
        if site is not None and not site.file.startswith("distributed/"):
            return site
        frame = frame.f_back
    return None


def _event(name: str) -> None:
    trace = _ACTIVE[-1]
    trace.events.append(name)
    if name not in trace.sites:
        trace.sites[name] = _vllm_site(sys._getframe(2))


def _jit_run(self, *args, grid=None, warmup=False, **kwargs):
    _ACTIVE[-1].launches.append(Launch(self.fn.__name__, _constants(self, args, kwargs)))
    _event(self.fn.__name__)


def _autotuned_run(self, *args, **kwargs):
    base = self.fn
    while not hasattr(base, "arg_names") and hasattr(base, "fn"):
        base = base.fn
    _ACTIVE[-1].launches.append(Launch(base.fn.__name__, (("autotuned", True), *_constants(base, args, kwargs))))
    _event(base.fn.__name__)


@contextlib.contextmanager
def _triton_logged() -> Iterator[None]:
    from triton.runtime import autotuner, jit
    saved = (jit.JITFunction.run, autotuner.Autotuner.run)
    jit.JITFunction.run, autotuner.Autotuner.run = _jit_run, _autotuned_run
    try:
        yield
    finally:
        jit.JITFunction.run, autotuner.Autotuner.run = saved


def _dispatch_logger():
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpLogger(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
            name = name.replace("::", ".")
            if name.startswith("_"):  # a compiled op of vLLM (_C, _rocm_C, _moe_C): named as vLLM calls it
                name = "torch.ops." + name
            logged = not _PLUMBING.match(name) and not name.startswith("prim.")
            if logged:
                _ACTIVE[-1].ops.append(name)
                _event(name)
            try:
                return func(*args, **(kwargs or {}))
            except NotImplementedError:  # a custom op with no meta kernel: it is where the body went
                if name.startswith("aten.") or not logged:
                    raise
                _ACTIVE[-1].ops.pop()
                _ACTIVE[-1].events.pop()
                raise StubCalled(name) from None

    return OpLogger()


def record(body: Callable[..., Any], *args: Any, **kwargs: Any) -> Trace:
    """Call ``body(*args, **kwargs)`` with Triton launches and torch ops logged; see :class:`Trace`."""
    trace = Trace()
    _ACTIVE.append(trace)
    modes = {id(m): m for m in (getattr(a, "fake_mode", None) for a in (*args, *kwargs.values())) if m is not None}
    try:
        with contextlib.ExitStack() as stack:
            for mode in modes.values():  # fake CUDA tensors: their allocations stay fake too
                stack.enter_context(mode)
            stack.enter_context(_triton_logged())
            COLLECTIVE_LOG.append(_event)
            stack.callback(COLLECTIVE_LOG.pop)
            stack.enter_context(_dispatch_logger())
            trace.result = body(*args, **kwargs)
    except StubCalled as stop:
        trace.stopped_at, trace.stop_site = stop.name, _raised_at(stop)
        if trace.events and trace.events[-1] == stop.name:  # logged on the way in, then stopped there
            trace.events.pop()
    except AttributeError as err:
        missing = _MISSING_OP.search(str(err))
        if missing is None:
            raise
        trace.stopped_at = f"torch.ops.{missing.group(1)}.{missing.group(2)}"
        trace.stop_site = _raised_at(err)
    finally:
        _ACTIVE.pop()
    return trace


def _raised_at(err: BaseException) -> Any:
    """The innermost vLLM line in ``err``'s traceback (a Cite)."""
    tb, site = err.__traceback__, None
    while tb is not None:
        found = _vllm_site_of(tb.tb_frame, tb.tb_lineno)
        site = found or site
        tb = tb.tb_next
    return site


def _vllm_site_of(frame: Any, lineno: int) -> Any:
    return cite_line(frame.f_code.co_filename, frame.f_code.co_qualname, lineno)


def fake_cuda(*tensors: tuple[tuple[int, ...], Any]) -> tuple[Any, ...]:
    """Fake CUDA tensors of the given (shape, dtype)s: device checks pass; shapes and dtypes propagate."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        return tuple(torch.empty(shape, dtype=dtype, device="cuda") for shape, dtype in tensors)


def meta(*tensors: tuple[tuple[int, ...], Any]) -> tuple[Any, ...]:
    """Meta tensors of the given (shape, dtype)s."""
    import torch
    return tuple(torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in tensors)
