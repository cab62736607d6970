"""Workloads (``traffic/*.yaml``) in real units -> a frozen ``Workload``.

A scenario names a workload file with ``traffic: NAME``; its content lands under
``workload:`` in the resolved scenario, where the scenario may override any field
(``workload: {iterations: 2}``, or ``--set workload.collective.bytes=4MB``). Problems
are reported with the file and YAML path like every other scenario field.

What it describes: data parallelism (a gradient collective per bucket: ring,
halving-doubling, hierarchical, all-to-all, or reduce-scatter / all-gather alone),
pipeline parallelism (GPipe or 1F1B over micro-batches, activations between stages),
tensor parallelism (AllReduce of activations on the server's NVLink). ``tree`` is
refused with a pointer to halving-doubling, its log-depth counterpart here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed import units
from testbed.config.source import NAME_RE

ALGORITHMS = ("ring", "halving-doubling", "hierarchical", "all-to-all", "reduce-scatter", "all-gather")
ALGORITHMS_LATER = ("tree",)
MAPPINGS = ("sequential", "rail")
PRECISION_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
RDMA_MTUS = (256, 512, 1024, 2048, 4096)  # the InfiniBand path MTUs RoCE uses
DEFAULT_MTU_BYTES = 4096
KEYS = ("name", "description", "iterations", "model", "parallelism", "mapping", "compute", "collective",
        "pipeline_schedule", "micro_batches", "activations", "transport", "chakra")
CHAKRA_KEYS = ("name", "description", "iterations", "mapping", "transport", "chakra")  # what a replay reads


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    iterations: int
    data: int  # DP degree
    pipeline: int
    tensor: int
    mapping: object  # "sequential", "rail" or a tuple of GPU names in rank order
    forward_ns: int  # compute per iteration, real time
    backward_ns: int
    algorithm: str
    allreduce_bytes: tuple  # one entry per gradient bucket, in order
    mtu_bytes: int  # RoCE payload per packet
    dcqcn: bool
    gradient_bytes: int  # all buckets together
    gradient_source: str  # "model" or "bytes"
    pipeline_schedule: str = "1f1b"
    micro_batches: int = 1
    pipeline_bytes: int = 0  # activations sent between pipeline stages per micro-batch
    tensor_bytes: int = 0  # bytes of each tensor-parallel AllReduce (NVLink)
    dcqcn_params: tuple = ()  # ((agent.dcqcn.Params field, value), ...) overriding NVIDIA's defaults
    qps_per_connection: int = 1  # queue pairs a connection's messages are split over (ECMP entropy)
    load_balancing: str = "flow"  # flow | spray | flowlet: how a QP chooses its UDP source port
    spray_packets: int = 1  # spray: a new source port every this many packets
    flowlet_gap_ns: int = 10_000  # flowlet: a new source port after an idle gap this long (real time)
    kind: str = "roce"  # roce (RC, go-back-N, DCQCN) | uet (reliable unordered, SACK, NSCC)
    # (the five defaults above are BALANCE_DEFAULTS: a test checks they agree)
    chakra: object = None  # config.traces.Trace: the schedule is this trace's replay (model.replay)

    @property
    def compute_ns(self) -> int:
        return self.forward_ns + self.backward_ns


def _show(value) -> str:
    if isinstance(value, (dict, list)):
        return type(value).__name__  # never a whole (possibly aliased, huge) structure
    return repr(value) if not isinstance(value, str) else f"'{value[:80]}'"


def validate_workload(c, doc, path: tuple, gpus: int | None, names=None) -> Workload | None:
    """``c`` is the scenario's problem collector; ``gpus`` the GPU count it runs on (None if
    the fabric itself is invalid); ``names`` those GPUs when they are a job's, not all."""
    doc = c.mapping(doc, path, KEYS)
    if isinstance(doc, dict) and doc.get("chakra") is not None:
        return _chakra(c, doc, path, gpus, names)
    name = doc.get("name", "workload")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        c.problem(path + ("name",), f"expected 1-32 characters of a-z, 0-9, - and _, got {_show(name)}")
    description = doc.get("description") or ""
    if not isinstance(description, str):
        c.problem(path + ("description",), f"expected text, got {_show(description)}")
        description = ""
    iterations = c.integer(doc, "iterations", path, default=3, minimum=1, maximum=10_000)
    data, pipeline, tensor = _parallelism(c, doc, path, gpus)
    mapping = _mapping(c, doc, path, gpus, names)
    comp_path = path + ("compute",)
    comp = c.mapping(doc.get("compute"), comp_path, ("forward", "backward"))
    forward = c.unit(comp, "forward", comp_path, units.parse_duration_ns, default="20us")
    backward = c.unit(comp, "backward", comp_path, units.parse_duration_ns, default="40us")
    algorithm, bucket, gradient, source = _collective(c, doc, path, data, pipeline, tensor)
    if gradient is not None and data and gradient < 4 * data:
        where = path + (("model",) if source == "model" else ("collective", "bytes"))
        c.problem(where, f"{gradient} gradient bytes cannot be reduced over {data} ranks: each rank's share must be "
                         f"at least one 4-byte word ({4 * data} bytes)")
    if bucket is not None and bucket < 4 * (data or 1):
        c.problem(path + ("collective", "bucket"), f"expected a bucket of at least {4 * (data or 1)} bytes (a 4-byte "
                                                   f"word per rank), got {bucket}")
    mtu, dcqcn, dcqcn_params, balance = _transport(c, doc, path)
    schedule, micro_batches, activations, per_stage_layers = _pipeline(c, doc, path, pipeline)
    if c.problems or None in (iterations, data, mapping, forward, backward, algorithm, gradient) or mtu not in RDMA_MTUS:
        return None
    buckets = split_buckets(gradient, bucket)
    return Workload(name=str(name), description=str(description).strip(), iterations=iterations, data=data,
                    pipeline=pipeline, tensor=tensor, mapping=mapping, forward_ns=forward, backward_ns=backward,
                    algorithm=algorithm, allreduce_bytes=buckets, mtu_bytes=mtu, dcqcn=dcqcn in (True, "on"),
                    gradient_bytes=gradient, gradient_source=source, pipeline_schedule=schedule,
                    micro_batches=micro_batches, pipeline_bytes=activations,
                    # Megatron: 2 AllReduces per layer forward (attention, MLP) and 2 backward;
                    # modelled as one AllReduce of their total after each forward/backward
                    tensor_bytes=2 * per_stage_layers * activations, dcqcn_params=dcqcn_params, **balance)


def _chakra(c, doc, path: tuple, gpus: int | None, names=None) -> Workload | None:
    """A Chakra trace replayed (``chakra: {prefix, comm_groups}``): one rank per GPU, ranks
    on GPUs by ``mapping``; the trace says what each does, so the native schedule's fields
    are refused rather than silently ignored."""
    from testbed.config import traces  # the trace reader (protobuf) only when one is asked for
    for key in doc:
        if key not in CHAKRA_KEYS and key in KEYS:
            c.problem(path + (key,), "not used with chakra: the trace says what every rank does")
    name = doc.get("name", "chakra")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        c.problem(path + ("name",), f"expected 1-32 characters of a-z, 0-9, - and _, got {_show(name)}")
    description = doc.get("description") or ""
    iterations = c.integer(doc, "iterations", path, default=1, minimum=1, maximum=10_000)
    ch_path = path + ("chakra",)
    ch = c.mapping(doc["chakra"], ch_path, ("prefix", "comm_groups"))
    prefix, groups = ch.get("prefix"), ch.get("comm_groups")
    if not isinstance(prefix, str) or not prefix:
        c.problem(ch_path + ("prefix",), f"expected the trace's path prefix (PREFIX.<rank>.et), got {_show(prefix)}")
        prefix = None
    if groups is not None and not isinstance(groups, str):
        c.problem(ch_path + ("comm_groups",), f"expected the path of a communicator-group JSON file, got {_show(groups)}")
        groups = None
    trace = None
    if prefix is not None:
        try:
            trace = traces.load(prefix, groups)
            traces.check(trace)
        except traces.TraceError as exc:
            c.problems.extend(exc.problems)  # they name the file and node themselves
            trace = None
    if trace is not None and gpus is not None and len(trace.ranks) != gpus:
        c.problem(ch_path + ("prefix",), f"the trace has {len(trace.ranks)} ranks and the fabric {gpus} GPUs "
                                         f"(one rank per GPU)")
    mapping = _mapping(c, doc, path, gpus, names)
    mtu, dcqcn, dcqcn_params, balance = _transport(c, doc, path)
    if c.problems or trace is None or None in (iterations, mapping) or mtu not in RDMA_MTUS:
        return None
    return Workload(name=str(name), description=str(description).strip(), iterations=iterations,
                    data=len(trace.ranks), pipeline=1, tensor=1, mapping=mapping, forward_ns=0, backward_ns=0,
                    algorithm="chakra", allreduce_bytes=(), mtu_bytes=mtu, dcqcn=dcqcn in (True, "on"),
                    gradient_bytes=0, gradient_source="chakra", dcqcn_params=dcqcn_params, chakra=trace, **balance)


def _parallelism(c, doc, path: tuple, gpus: int | None) -> tuple:
    """(data, pipeline, tensor) degrees; data defaults to what the GPUs leave."""
    par_path = path + ("parallelism",)
    par = c.mapping(doc.get("parallelism"), par_path, ("data", "pipeline", "tensor"))
    pipeline = c.integer(par, "pipeline", par_path, default=1, minimum=1, maximum=1024)
    tensor = c.integer(par, "tensor", par_path, default=1, minimum=1, maximum=16)
    data = c.integer(par, "data", par_path, default=None, minimum=1, maximum=1024) if "data" in par else None
    if gpus is not None and pipeline and tensor:
        if data is None:
            data = gpus // (pipeline * tensor) or 1
        if data * pipeline * tensor != gpus:
            c.problem(par_path, f"data x pipeline x tensor = {data * (pipeline or 1) * (tensor or 1)} must equal "
                                f"the fabric's {gpus} GPUs")
    if data is not None and data * (pipeline or 1) * (tensor or 1) < 2:
        c.problem(par_path, "at least 2 GPUs must work together (data x pipeline x tensor >= 2)")
    return data, pipeline, tensor


def _mapping(c, doc, path: tuple, gpus: int | None, names=None):
    mapping = doc.get("mapping", "sequential")
    if isinstance(mapping, list):
        every = f"h1 .. h{gpus}" if names is None else ", ".join(names)
        names = list(names) if names is not None else [f"h{i}" for i in range(1, (gpus or 0) + 1)]
        if gpus is not None and sorted(mapping, key=str) != sorted(names):
            c.problem(path + ("mapping",), f"expected every GPU ({every}) exactly once, in rank order")
            return None
        return tuple(mapping)
    if mapping not in MAPPINGS:
        c.problem(path + ("mapping",), f"expected one of {', '.join(MAPPINGS)} or a list of GPUs in rank order, "
                                       f"got {_show(mapping)}")
        return None
    return mapping


def _collective(c, doc, path: tuple, data, pipeline, tensor) -> tuple:
    """(algorithm, bucket bytes, gradient bytes, where the gradient size came from)."""
    col_path = path + ("collective",)
    col = c.mapping(doc.get("collective"), col_path, ("algorithm", "bytes", "bucket"))
    algorithm = col.get("algorithm", "ring")
    if algorithm in ALGORITHMS_LATER:
        c.problem(col_path + ("algorithm",), f"{algorithm} is not emulated; halving-doubling is its log-depth "
                                             f"counterpart here (this version has: {', '.join(ALGORITHMS)})")
        algorithm = None
    elif algorithm == "halving-doubling" and data and data & (data - 1):
        c.problem(col_path + ("algorithm",), f"halving-doubling needs a power-of-two data degree, got {data}")
        algorithm = None
    elif algorithm == "hierarchical" and tensor not in (None, 1):
        c.problem(col_path + ("algorithm",), "hierarchical uses NVLink inside each server for the gradients; "
                                             "with tensor > 1 NVLink is taken: use ring")
        algorithm = None
    elif algorithm not in ALGORITHMS:
        c.problem(col_path + ("algorithm",), f"expected one of {', '.join(ALGORITHMS + ALGORITHMS_LATER)}, "
                                             f"got {_show(algorithm)}")
        algorithm = None
    bucket = c.unit(col, "bucket", col_path, units.parse_size_bytes, required=False)
    model = doc.get("model")
    if model is None:
        return algorithm, bucket, c.unit(col, "bytes", col_path, units.parse_size_bytes, default="2MB"), "bytes"
    gradient = _model_gradient_bytes(c, model, path + ("model",), tensor, pipeline)
    if col.get("bytes") is not None:
        c.problem(col_path + ("bytes",), "give either model (bytes derived from it) or collective.bytes, "
                                         "not both (--set workload.collective.bytes=null drops a file's bytes)")
    return algorithm, bucket, gradient, "model"


def _transport(c, doc, path: tuple) -> tuple:
    """(RoCE MTU, DCQCN on/off, DCQCN parameters, load-balancing fields of ``Workload``)."""
    tr_path = path + ("transport",)
    tr = c.mapping(doc.get("transport"), tr_path, ("mtu", "dcqcn") + BALANCE_KEYS)
    mtu = tr.get("mtu", DEFAULT_MTU_BYTES)
    if mtu not in RDMA_MTUS:
        c.problem(tr_path + ("mtu",), f"expected an RDMA path MTU ({', '.join(map(str, RDMA_MTUS))}), "
                                      f"got {_show(mtu)}")
    dcqcn = tr.get("dcqcn", "on")
    dcqcn_params = ()
    if isinstance(dcqcn, dict):
        dcqcn_params = _dcqcn_params(c, dcqcn, tr_path + ("dcqcn",))
        dcqcn = "on"
    elif dcqcn not in (True, False, "on", "off"):
        c.problem(tr_path + ("dcqcn",), f"expected on, off or a mapping of DCQCN parameters, got {_show(dcqcn)}")
    return mtu, dcqcn, dcqcn_params, _balance(c, tr, tr_path)


BALANCE_KEYS = ("kind", "qps_per_connection", "load_balancing", "spray_packets", "flowlet_gap")
# how a connection spreads when the traffic file does not say: the one place of these defaults
# (the Workload fields' and model.training.Transport's are checked against it)
BALANCE_DEFAULTS = {"kind": "roce", "qps_per_connection": 1, "load_balancing": "flow", "spray_packets": 1,
                    "flowlet_gap_ns": 10_000}
TRANSPORTS = ("roce", "uet")
LOAD_BALANCING = ("flow", "spray", "flowlet")
MAX_QPS_PER_CONNECTION = 8  # the QP number has 3 bits for it (wire.roce.qpn)


def _balance(c, tr: dict, path: tuple) -> dict:
    """How a connection spreads over the fabric's paths: ``qps_per_connection`` (NCCL's
    NCCL_IB_QPS_PER_CONNECTION, each QP its own UDP source port) and ``load_balancing``
    (flow: one source port per QP; spray: a new one every ``spray_packets`` packets;
    flowlet: a new one after an idle gap of ``flowlet_gap``, real time)."""
    d = BALANCE_DEFAULTS
    kind = c.choice(tr, "kind", path, TRANSPORTS, d["kind"])
    qps = c.integer(tr, "qps_per_connection", path, default=d["qps_per_connection"], minimum=1,
                    maximum=MAX_QPS_PER_CONNECTION)
    mode = c.choice(tr, "load_balancing", path, LOAD_BALANCING, d["load_balancing"])
    spray = c.integer(tr, "spray_packets", path, default=d["spray_packets"], minimum=1, maximum=1_000_000)
    gap = c.unit(tr, "flowlet_gap", path, units.parse_duration_ns, required=False)
    if gap is not None and gap <= 0:
        c.problem(path + ("flowlet_gap",), f"expected a duration > 0, got {_show(tr['flowlet_gap'])}")
    for key, needs in (("spray_packets", "spray"), ("flowlet_gap", "flowlet")):
        if key in tr and mode is not None and mode != needs:
            c.problem(path + (key,), f"only used with load_balancing: {needs} (this one is {mode})")
    got = {"kind": kind, "qps_per_connection": qps, "load_balancing": mode, "spray_packets": spray,
           "flowlet_gap_ns": gap}
    return {k: d[k] if v is None else v for k, v in got.items()}  # unset or refused (the run stops): the default


def _pipeline(c, doc, path: tuple, pipeline) -> tuple:
    """(schedule, micro-batches, activation bytes per hop, layers per stage)."""
    schedule = doc.get("pipeline_schedule", "1f1b")
    if schedule not in ("gpipe", "1f1b"):
        c.problem(path + ("pipeline_schedule",), f"expected gpipe or 1f1b, got {_show(schedule)}")
    micro_batches = c.integer(doc, "micro_batches", path, default=4 if (pipeline or 1) > 1 else 1, minimum=1,
                              maximum=1024)
    model = doc.get("model")
    activations = model_activations = None
    if model is not None and isinstance(model, dict) and all(k in model for k in ("hidden", "sequence")):
        model_activations = _activation_bytes(c, model, path + ("model",))
    if doc.get("activations") is not None:
        activations = c.unit(doc, "activations", path, units.parse_size_bytes)
        if activations is not None and activations < 4:
            c.problem(path + ("activations",), f"expected at least 4 bytes of activations, got {activations}")
    activations = activations or model_activations or 1_000_000
    layers = model.get("layers") if isinstance(model, dict) else None
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        c.problem(path + ("model", "layers"), f"expected a positive integer, got {_show(layers)}")
        layers = None
    return schedule, micro_batches, activations, max(1, layers // (pipeline or 1)) if layers else 1


# transport.dcqcn as a mapping: DCQCN on with these parameters (real units) instead of the
# NVIDIA firmware defaults (agent/dcqcn.py); name -> (Params field, parser)
DCQCN_KEYS = {
    "time_reset": ("time_reset_ns", units.parse_duration_ns),  # rate-increase timer
    "byte_reset": ("byte_reset", units.parse_size_bytes),  # rate-increase byte counter
    "ai_rate": ("ai_bps", units.parse_rate_bps),
    "hai_rate": ("hai_bps", units.parse_rate_bps),
    "reduce_period": ("reduce_period_ns", units.parse_duration_ns),  # at most one cut per period
    "cnp_interval": ("cnp_interval_ns", units.parse_duration_ns),  # at most one CNP per QP per interval
}


def _dcqcn_params(c, doc: dict, path: tuple) -> tuple:
    c.mapping(doc, path, tuple(DCQCN_KEYS) + ("min_dec_factor",))
    out = []
    for key, (field, parser) in DCQCN_KEYS.items():
        if key in doc:
            value = c.unit(doc, key, path, parser)
            if value is not None:
                if value <= 0:
                    c.problem(path + (key,), f"expected a value > 0, got {_show(doc[key])}")
                else:
                    out.append((field, value))
    if "min_dec_factor" in doc:
        f = doc["min_dec_factor"]
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
            c.problem(path + ("min_dec_factor",), f"expected a number in (0, 1], got {_show(f)}")
        else:
            out.append(("min_dec_factor", float(f)))
    return tuple(out)


def split_buckets(total_bytes: int, bucket_bytes: int | None) -> tuple:
    """Gradients are AllReduced in buckets (PyTorch DDP: 25 MB by default): full buckets
    and one remainder."""
    if not bucket_bytes or bucket_bytes >= total_bytes:
        return (total_bytes,)
    full, rest = divmod(total_bytes, bucket_bytes)
    return (bucket_bytes,) * full + ((rest,) if rest else ())


def _model_gradient_bytes(c, model, path: tuple, tensor: int | None, pipeline: int | None) -> int | None:
    """Gradient bytes one DP rank AllReduces per iteration: its shard of the parameters
    (1 / (tensor x pipeline)) x bytes per gradient element."""
    model = c.mapping(model, path, ("parameters", "precision", "layers", "hidden", "micro_batch", "sequence"))
    params = model.get("parameters")
    count = _count(params)
    if count is None:
        c.problem(path + ("parameters",), f"expected a parameter count like 125M or 8B, got {_show(params)}")
    precision = c.choice(model, "precision", path, tuple(PRECISION_BYTES), "bf16")
    if count is None or precision is None or not tensor or not pipeline:
        return None
    return math.ceil(count * PRECISION_BYTES[precision] / (tensor * pipeline))


def _activation_bytes(c, model: dict, path: tuple) -> int | None:
    """One micro-batch's activations between layers: micro_batch x sequence x hidden x
    bytes per element (what a pipeline stage sends on, and what a tensor-parallel
    AllReduce carries)."""
    vals = {}
    for key, default in (("micro_batch", 1), ("sequence", None), ("hidden", None)):
        v = model.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            c.problem(path + (key,), f"expected a positive integer, got {_show(v)}")
            return None
        vals[key] = v
    return vals["micro_batch"] * vals["sequence"] * vals["hidden"] * PRECISION_BYTES.get(model.get("precision", "bf16"), 2)


def _count(value) -> int | None:
    """``125M``, ``8B``, ``1.5K`` or a plain integer."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if not isinstance(value, str):
        return None
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
    text = value.strip()
    try:
        n = float(text[:-1]) * scale[text[-1]] if text[-1:] in scale else float(text)
    except ValueError:
        return None
    return int(n) if n >= 1 and math.isfinite(n) else None
