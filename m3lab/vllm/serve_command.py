"""A deployment as the exact ``vllm serve`` and ``vllm bench serve`` command lines a user runs on the GPU box.

What changes which code runs (AITER flags, ``--kv-cache-dtype``, ``--attention-config``, ``--hf-overrides``,
speculative config, ...) is rendered by :meth:`m3lab.spec.serving.Deployment.to_vllm`; this module adds what
only a launch needs:

- the checkpoint to load (the model's Hugging Face id, or the quantised checkpoint that a preset names);
- ``--block-size`` = the model's sparse block (:func:`m3lab.spec.serving.block_size_args`; the resolver builds
  vLLM's model with it too);
- the port, and ``--profiler-config`` with a torch-profiler directory when a profile is wanted
  (``vllm/config/profiler.py:67``; ``vllm bench serve --profile`` then starts and stops it);
- for prefill/decode disaggregation: one instance per replica, each on its own GPUs and ports, the launch's KV
  connector in the ``--kv-transfer-config`` the deployment renders (NixlConnector unless ``Launch.kv_connector``
  names another), NIXL side-channel ports, and the proxy that routes a request to a
  prefill and then a decode instance (vLLM's ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``,
  prefill ports from 8100, decode from 8200, the proxy on 8000, as there).

:func:`check_with_vllm` parses every generated command with the installed vLLM's own argument parsers
(``make_arg_parser`` of ``vllm serve``, ``add_cli_args`` of ``vllm bench serve``) and checks every ``VLLM_*``
variable against ``vllm.envs``.
"""
# long: one launch plan (instances, proxy, benchmark) whose parts share its ports, GPUs and names
from __future__ import annotations

import contextlib
import io
import json
import shlex
import textwrap
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from m3lab.errors import M3LabError
from m3lab.spec.model import checkpoint_id
from m3lab.spec.serving import KV_CONNECTOR, Deployment, block_size_args, load_preset
from m3lab.vllm.plan_checks import check_weights_fit
from m3lab.vllm_src.imports import vllm_module

# Quantised checkpoints whose config.json m3lab does not ship (same architecture): (model, quant) -> the checkpoint
# vLLM loads. The MXFP4 deployment of the write-up serves amd/MiniMax-M3-MXFP4. A shipped config named
# "<model>-<quant>" (minimax-m3-mxfp8: MiniMaxAI/MiniMax-M3-MXFP8) is that quantisation's checkpoint.
PROXY_SCRIPT = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"  # in vLLM's repository, not its wheel
PROXY_PORT, PREFILL_PORT, DECODE_PORT, SERVE_PORT = 8000, 8100, 8200, 8000
NIXL_SIDE_CHANNEL_PORT = 5600  # vLLM's default VLLM_NIXL_SIDE_CHANNEL_PORT (envs.py:1725); one per instance on a node
DEVICE_VARS = {"amd": "HIP_VISIBLE_DEVICES", "nvidia": "CUDA_VISIBLE_DEVICES"}
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"


@dataclass(frozen=True)
class Launch:
    """Launch and benchmark settings that do not change which kernels run.

    ``input_len``/``output_len``/``concurrency`` are the benchmark's random workload (the write-up's 8K/1K);
    ``num_prompts`` defaults to 8 x concurrency (at least 64) so the measured window is mostly steady state.
    """

    model_path: str | None = None       # the checkpoint; None: m3lab.spec.model.checkpoint_id
    port: int = SERVE_PORT
    profile_dir: str | None = None      # torch profiler output folder on the GPU box; None: no profiling
    kv_connector: str = KV_CONNECTOR  # P/D only
    gpus_per_node: int = 8
    input_len: int = 8192
    output_len: int = 1024
    concurrency: int = 32
    num_prompts: int | None = None
    result_dir: str = "vllm-bench"

    def validate(self) -> Launch:
        for name in ("port", "gpus_per_node", "input_len", "output_len", "concurrency"):
            if getattr(self, name) < 1:
                raise M3LabError(f"{name} must be positive, got {getattr(self, name)}", field=name)
        if self.num_prompts is not None and self.num_prompts < 1:
            raise M3LabError(f"num_prompts must be positive, got {self.num_prompts}", field="num_prompts")
        return self

    @property
    def prompts(self) -> int:
        return self.num_prompts or max(64, 8 * self.concurrency)


CONTINUATION = "    "   # indent of a command's continued lines


def _units(env: dict[str, str], argv: Sequence[str]) -> list[list[str]]:
    """A command's shell words in groups that stay on one line where they fit: each ``K=V``, the program with its
    sub-command and first positional (``vllm serve MODEL``), then each flag with its values."""
    words = [shlex.quote(a) for a in argv]
    units = [[f"{k}={shlex.quote(v)}"] for k, v in sorted(env.items())]
    head = next((i for i, a in enumerate(argv) if a.startswith("-")), len(argv))
    units.append(words[:head])
    for word, arg in zip(words[head:], argv[head:]):
        if arg.startswith("-") or not units[-1]:
            units.append([word])
        else:
            units[-1].append(word)
    return [u for u in units if u]


def command_lines(env: dict[str, str], argv: Sequence[str], width: int | None = None) -> list[str]:
    """The one renderer of a command line (``m3lab vllm plan``, ``m3lab fastpaths``, notebook 04): the environment
    and the quoted argv, on one line when ``width`` is None, else continued with ``\\`` so that no line is wider
    than ``width`` and no shell word is split (a flag stays with its value where they fit together). Joined, the
    lines are the same command for a shell."""
    units = _units(env, argv)
    if width is None:
        return [" ".join(w for u in units for w in u)]
    budget = width - 2                    # room for the " \\" that continues a line
    out: list[str] = []
    line = ""
    for unit in units:
        together = " ".join(unit)
        for piece in ([together] if len(CONTINUATION + together) <= budget else unit):
            if line and len(f"{line} {piece}") > budget:
                out.append(line + " \\")
                line = CONTINUATION + piece
            else:
                line = f"{line} {piece}" if line else piece
    return out + [line]


def _comment(text: str, width: int | None) -> list[str]:
    """``# text``, wrapped between words in ``width`` characters when given."""
    if width is None:
        return [f"# {text}"]
    return textwrap.wrap(text, width=max(width, 20), initial_indent="# ", subsequent_indent="#   ",
                         break_long_words=False, break_on_hyphens=False) or ["#"]


@dataclass(frozen=True)
class Instance:
    """One ``vllm serve`` process: its role, where it runs, its environment and its arguments."""

    deployment: str
    role: str                 # "both" | "prefill" | "decode"
    replica: int
    node: int
    devices: tuple[int, ...]
    port: int
    env: dict[str, str]
    argv: list[str]           # ["vllm", "serve", CHECKPOINT, ...]

    def text(self) -> str:
        """The command on one line (``--json``, scripts)."""
        return command_lines(self.env, self.argv)[0]

    def lines(self, width: int | None = None) -> list[str]:
        """The command as :func:`command_lines` renders it in ``width`` characters (None: one line)."""
        return command_lines(self.env, self.argv, width)

    def to_dict(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "role": self.role, "replica": self.replica, "node": self.node,
                "devices": list(self.devices), "port": self.port, "env": dict(self.env), "argv": list(self.argv),
                "command": self.text()}


@dataclass
class ServePlan:
    """Everything to run on the GPU box for one deployment (or one P/D topology), in order."""

    name: str
    description: str
    instances: list[Instance]
    bench_argv: list[str]                    # ["vllm", "bench", "serve", ...]
    proxy_argv: list[str] | None = None      # P/D: the router in front of the instances
    profile_dir: str | None = None
    result_file: str = ""
    notes: list[str] = field(default_factory=list)

    def commands(self) -> list[str]:
        out = [i.text() for i in self.instances]
        if self.proxy_argv:
            out += command_lines({}, self.proxy_argv)
        return out + command_lines({}, self.bench_argv)

    def text(self, width: int | None = None) -> str:
        """A shell-ready block: one comment line, then each command (servers first, then the benchmark); in
        ``width`` characters when given (:func:`command_lines`: the same commands, continued with ``\\``)."""
        def comment(text: str) -> list[str]:
            return _comment(text, width)

        lines = comment(f"{self.name}: {self.description}") + [x for n in self.notes for x in comment(f"note: {n}")]
        for inst in self.instances:
            where = f"node {inst.node}, GPUs {','.join(map(str, inst.devices))}"
            what = "server" if inst.role == "both" else f"{inst.role} instance {inst.replica}"
            lines += comment(f"{what} ({where}, port {inst.port})") + inst.lines(width)
        if self.proxy_argv:
            lines += comment("proxy (from a vLLM source checkout): prefill then decode for each request")
            lines += command_lines({}, self.proxy_argv, width)
        lines += comment("benchmark (once the server answers on /health); writes " + self.result_file)
        return "\n".join(lines + command_lines({}, self.bench_argv, width))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "instances": [i.to_dict() for i in self.instances],
                "proxy": shlex.join(self.proxy_argv) if self.proxy_argv else None,
                "proxy_argv": self.proxy_argv, "bench": shlex.join(self.bench_argv), "bench_argv": self.bench_argv,
                "profile_dir": self.profile_dir, "result_file": self.result_file, "notes": list(self.notes)}


def checkpoint(dep: Deployment, launch: Launch) -> str:
    """The checkpoint ``vllm serve`` loads for ``dep``."""
    if launch.model_path:
        return launch.model_path
    return checkpoint_id(dep.model.name, dep.quant.name)


def _gpus(dep: Deployment) -> int:
    return dep.plan.tp * dep.plan.dp


def _with_connector(args: list[str], connector: str) -> list[str]:
    """``args`` with the launch's KV connector in the ``--kv-transfer-config`` that ``Deployment.to_vllm`` renders
    (:data:`~m3lab.spec.serving.KV_CONNECTOR` unless the launch names another)."""
    out = list(args)
    if "--kv-transfer-config" in out:
        i = out.index("--kv-transfer-config") + 1
        out[i] = json.dumps({**json.loads(out[i]), "kv_connector": connector}, separators=(",", ":"))
    return out


def profiler_config(profile_dir: str) -> str:
    """``--profiler-config`` JSON: the torch profiler into ``profile_dir``, with input shapes recorded (so the
    trace carries the token counts that tell decode from prefill)."""
    return json.dumps({"profiler": "torch", "torch_profiler_dir": profile_dir,
                       "torch_profiler_record_shapes": True}, separators=(",", ":"))


def _serve_args(dep: Deployment, launch: Launch, model: str, port: int, profile_dir: str | None) -> list[str]:
    _env, args = dep.to_vllm()
    head = ["vllm", "serve", model, *block_size_args(dep)]
    args = _with_connector(args, launch.kv_connector)
    tail = ["--port", str(port)]
    if profile_dir:
        tail += ["--profiler-config", profiler_config(profile_dir)]
    return head + args + tail


def _bench_args(name: str, model: str, port: int, launch: Launch, gpus: int,
                profile: bool) -> tuple[list[str], str]:
    result_file = f"{name}-c{launch.concurrency}-i{launch.input_len}-o{launch.output_len}.json"
    argv = ["vllm", "bench", "serve", "--model", model, "--port", str(port),
            "--dataset-name", "random", "--random-input-len", str(launch.input_len),
            "--random-output-len", str(launch.output_len), "--ignore-eos",
            "--max-concurrency", str(launch.concurrency), "--num-prompts", str(launch.prompts),
            "--percentile-metrics", PERCENTILE_METRICS, "--save-result", "--result-dir", launch.result_dir,
            "--result-filename", result_file, "--metadata", f"deployment={name}", f"gpus={gpus}"]
    if profile:
        argv.append("--profile")
    return argv, result_file


def _instance(dep: Deployment, launch: Launch, model: str, *, replica: int, node: int, devices: tuple[int, ...],
              port: int, side_channel: int, disagg: bool) -> Instance:
    """One ``vllm serve`` process of ``dep``: its environment (the devices it sees when it does not take the whole
    node or runs beside other P/D instances; its NIXL side-channel port) and its argv."""
    env = dict(dep.to_vllm()[0])
    if disagg or len(devices) < launch.gpus_per_node:
        env[DEVICE_VARS.get(dep.hardware.vendor or "amd", "CUDA_VISIBLE_DEVICES")] = ",".join(map(str, devices))
    if disagg and launch.kv_connector.startswith("Nixl"):
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(NIXL_SIDE_CHANNEL_PORT + side_channel)
    profile = launch.profile_dir
    if profile and disagg:  # one folder per instance: their traces would mix
        profile = f"{profile}/{dep.plan.role}-{replica}"
    return Instance(deployment=dep.name, role=dep.plan.role, replica=replica, node=node, devices=devices, port=port,
                    env=env, argv=_serve_args(dep, launch, model, port, profile))


def serve_instance(dep: Deployment, launch: Launch | None = None) -> Instance:
    """The ``vllm serve`` process of ``dep`` exactly as ``m3lab vllm plan`` renders it: the whole plan's server
    for an aggregated deployment; for a P/D role, its first instance of that role on GPUs from 0. What
    ``m3lab fastpaths`` and notebook 04 print (no weights check: they show any deployment's paths)."""
    launch = (launch or Launch()).validate()
    port = {"prefill": PREFILL_PORT, "decode": DECODE_PORT}.get(dep.plan.role, launch.port)
    return _instance(dep, launch, checkpoint(dep, launch), replica=0, node=0, devices=tuple(range(_gpus(dep))),
                     port=port, side_channel=0, disagg=dep.plan.role != "both")


def launch_line(dep: Deployment, launch: Launch | None = None) -> str:
    """:func:`serve_instance`'s command on one line (``ENV=.. vllm serve CHECKPOINT --block-size 128 ...``)."""
    return serve_instance(dep, launch).text()


def plan_commands(parts: Sequence[tuple[Deployment, int]], launch: Launch | None = None,
                  name: str | None = None) -> ServePlan:
    """The commands for ``parts``: ``[(deployment, replicas), ...]`` (one entry for a plain deployment; a
    prefill and a decode entry for P/D). GPUs are packed onto nodes of ``launch.gpus_per_node``."""
    launch = (launch or Launch()).validate()
    if not parts:
        raise M3LabError("a plan needs at least one deployment", field="--preset")
    roles = {d.plan.role for d, _ in parts}
    disagg = roles != {"both"}
    if disagg and roles != {"prefill", "decode"}:
        raise M3LabError(f"a disaggregated plan needs prefill and decode deployments, got roles {sorted(roles)}",
                         field="--preset", hint="e.g. --preset pd-mxfp8-prefill-tp4:2 --preset pd-mxfp8-decode-tp4:1")
    if not disagg and (len(parts) > 1 or parts[0][1] != 1):
        raise M3LabError("several aggregated deployments are separate plans", field="--preset",
                         hint="plan them one at a time (replicas are for prefill/decode instances)")
    models = {checkpoint(d, launch) for d, _ in parts}
    if len(models) > 1:
        raise M3LabError(f"P/D instances must serve one checkpoint, got {sorted(models)}", field="--preset")
    model = models.pop()
    instances: list[Instance] = []
    notes: list[str] = []
    node, used = 0, 0
    next_port = {"prefill": PREFILL_PORT, "decode": DECODE_PORT, "both": launch.port}
    for dep, replicas in parts:
        if replicas < 1:
            raise M3LabError(f"{dep.name or 'deployment'}: replicas must be >= 1", field="--preset")
        check_weights_fit(dep)   # a server whose weights do not fit one GPU cannot start: no command for it
        n = _gpus(dep)
        if n > launch.gpus_per_node:
            raise M3LabError(f"{dep.name}: {n} GPUs per instance do not fit a node of {launch.gpus_per_node}",
                             field="gpus_per_node")
        s = dep.serving
        if s.spec_method in ("eagle", "eagle3") and not s.spec_model:
            notes.append(f"{s.spec_method} needs its draft checkpoint: add --set spec_model=PATH")
        for r in range(replicas):
            if used + n > launch.gpus_per_node:
                node, used = node + 1, 0
            port = next_port[dep.plan.role]
            next_port[dep.plan.role] += 1
            instances.append(_instance(dep, launch, model, replica=r, node=node, devices=tuple(range(used, used + n)),
                                       port=port, side_channel=len(instances), disagg=disagg))
            used += n
    proxy = _proxy_argv(instances) if disagg else None
    if disagg:
        if any(i.node for i in instances):
            notes.append("instances span nodes: replace NODE<n> with that node's address, and set "
                         "VLLM_NIXL_SIDE_CHANNEL_HOST on each instance to its node's address")
        name = name or _pd_name(parts)
    else:
        name = name or parts[0][0].name or "deployment"
    gpus = sum(_gpus(d) * r for d, r in parts)
    # bench --profile calls /start_profile on the server it talks to; vLLM's P/D proxy has no such route
    bench, result_file = _bench_args(name, model, PROXY_PORT if disagg else launch.port, launch, gpus,
                                     profile=bool(launch.profile_dir) and not disagg)
    if disagg and launch.profile_dir:
        notes.append("profile each instance around the benchmark: curl -X POST http://HOST:PORT/start_profile, "
                     "then /stop_profile (the proxy does not forward them)")
    desc = "; ".join(f"{r} x {d.description or d.name}" if disagg else (d.description or d.name) for d, r in parts)
    return ServePlan(name=name, description=desc, instances=instances, bench_argv=bench, proxy_argv=proxy,
                     profile_dir=launch.profile_dir, result_file=f"{launch.result_dir}/{result_file}", notes=notes)


def _proxy_argv(instances: Sequence[Instance]) -> list[str]:
    """vLLM's disaggregated proxy in front of the prefill and decode instances (hosts: NODE<n> off node 0)."""
    pre = [i for i in instances if i.role == "prefill"]
    dec = [i for i in instances if i.role == "decode"]
    host = lambda i: "localhost" if i.node == 0 else f"NODE{i.node}"  # noqa: E731
    return ["python", PROXY_SCRIPT, "--port", str(PROXY_PORT), "--prefiller-hosts", *map(host, pre),
            "--prefiller-ports", *(str(i.port) for i in pre), "--decoder-hosts", *map(host, dec),
            "--decoder-ports", *(str(i.port) for i in dec)]


def _pd_name(parts: Sequence[tuple[Deployment, int]]) -> str:
    counts = {d.plan.role: r for d, r in parts}
    base = parts[0][0].name.replace("-prefill", "").replace("-decode", "")
    return f"{base}-{counts.get('prefill', 0)}p{counts.get('decode', 0)}d"


def parse_preset_spec(text: str) -> tuple[str, int]:
    """``NAME`` or ``NAME:REPLICAS`` (``pd-mxfp8-prefill-tp4:2``)."""
    name, sep, count = text.partition(":")
    if not sep:
        return name, 1
    try:
        n = int(count)
    except ValueError:
        n = 0
    if n < 1:
        raise M3LabError(f"--preset {text!r}: replicas must be a positive integer", field="--preset",
                         hint="NAME or NAME:REPLICAS, e.g. pd-mxfp8-prefill-tp4:2")
    return name, n


def plan_presets(specs: Sequence[str], launch: Launch | None = None) -> ServePlan:
    """:func:`plan_commands` for ``--preset NAME[:REPLICAS]`` strings."""
    return plan_commands([(load_preset(n), r) for n, r in map(parse_preset_spec, specs)], launch)


# ---- checks against the installed vLLM ----------------------------------------------------------------
@contextlib.contextmanager
def _cpu_platform_if_unspecified() -> Iterator[None]:
    """vLLM builds its serve parser from config defaults that ask the platform for a device type; on a machine
    without a GPU the platform is "unspecified" and that fails. ``vllm bench`` swaps in the CPU platform for
    the same reason (``vllm/entrypoints/cli/main.py:78-85``); do that for the duration, then restore."""
    import sys

    platforms = vllm_module("vllm.platforms", "checking commands with vLLM's parser")
    before = platforms.current_platform
    if not before.is_unspecified():
        yield
        return
    cpu = vllm_module("vllm.platforms.cpu").CpuPlatform()
    loaded = set(sys.modules)
    platforms.current_platform = cpu
    try:
        yield
    finally:
        platforms.current_platform = before
        # modules first imported meanwhile bound the stand-in by name (``from vllm.platforms import
        # current_platform``): give them the real platform, so nothing else in this process sees a CPU platform
        for name in set(sys.modules) - loaded:
            namespace = getattr(sys.modules[name], "__dict__", {})  # not getattr: lazy modules import on it
            if namespace.get("current_platform") is cpu:
                namespace["current_platform"] = before


_PARSERS: dict[str, Any] = {}


def vllm_parser(command: str) -> Any:
    """The installed vLLM's argument parser of ``"serve"`` (``vllm/entrypoints/common/cli_args.py:make_arg_parser``,
    as ``vllm/entrypoints/cli/serve.py:172`` builds it) or ``"bench serve"``
    (``vllm/benchmarks/serve.py:add_cli_args``)."""
    if command not in _PARSERS:
        argparse_utils = vllm_module("vllm.utils.argparse_utils", "checking commands with vLLM's parser")
        parser = argparse_utils.FlexibleArgumentParser(prog=f"vllm {command}")
        with _cpu_platform_if_unspecified():
            if command == "serve":
                parser = vllm_module("vllm.entrypoints.common.cli_args").make_arg_parser(parser)
            elif command == "bench serve":
                vllm_module("vllm.benchmarks.serve").add_cli_args(parser)
            else:
                raise M3LabError(f"no vLLM parser for {command!r}", field="command", hint="serve or bench serve")
        _PARSERS[command] = parser
    return _PARSERS[command]


def parse_with_vllm(argv: Sequence[str]) -> Any:
    """Parse ``["vllm", "serve", ...]`` or ``["vllm", "bench", "serve", ...]`` with vLLM's own parser; returns its
    namespace. An argument vLLM rejects raises M3LabError with vLLM's message."""
    argv = list(argv)
    if argv[:2] == ["vllm", "serve"]:
        command, rest = "serve", argv[2:]
    elif argv[:3] == ["vllm", "bench", "serve"]:
        command, rest = "bench serve", argv[3:]
    else:
        raise M3LabError(f"not a vllm serve / vllm bench serve command: {shlex.join(argv[:3])}", field="argv")
    parser = vllm_parser(command)
    err = io.StringIO()
    with _cpu_platform_if_unspecified():
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(rest)
            if command == "serve":
                vllm_module("vllm.entrypoints.common.cli_args").validate_parsed_serve_args(ns)
        except SystemExit:
            msg = err.getvalue().strip().splitlines()
            raise M3LabError(f"vllm {command} rejects the command: {msg[-1] if msg else 'exit'}",
                             field="argv") from None
        except (TypeError, ValueError) as exc:
            raise M3LabError(f"vllm {command} rejects the command: {exc}", field="argv") from None
    return ns


def unknown_env(env: dict[str, str]) -> list[str]:
    """The variables of ``env`` vLLM does not declare (``VLLM_*`` missing from ``vllm.envs``; anything else
    except the device-visibility variables)."""
    known = set(vllm_module("vllm.envs").environment_variables)
    return sorted(k for k in env if k not in known and k not in DEVICE_VARS.values())


def check_with_vllm(plan: ServePlan) -> list[str]:
    """Problems vLLM finds with ``plan`` (empty when every command parses and every variable is vLLM's)."""
    problems = []
    for inst in plan.instances:
        try:
            parse_with_vllm(inst.argv)
        except M3LabError as err:
            problems.append(f"{inst.role} {inst.replica}: {err}")
        for var in unknown_env(inst.env):
            problems.append(f"{inst.role} {inst.replica}: vLLM declares no environment variable {var}")
    try:
        parse_with_vllm(plan.bench_argv)
    except M3LabError as err:
        problems.append(f"bench: {err}")
    return problems
